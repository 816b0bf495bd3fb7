"""What a user watching a live crawl sees (stderr, rich): the phase, models done / left, and per
rate-limit bucket the requests sent and what is left of its window, plus each pause and why."""

from __future__ import annotations

import threading
from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from atlas.hub.pacing import Pacer, Pause


class CrawlProgress:
    def __init__(self, pacer: Pacer, enabled: bool = True) -> None:
        self._pacer = pacer
        self._console = Console(stderr=True)
        self._bar = Progress(
            TextColumn("{task.fields[phase]}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TextColumn("{task.description}"), console=self._console, disable=not enabled, transient=False,
        )
        self._enabled = enabled
        self._task: TaskID | None = None
        self._lock = threading.Lock()
        self._last_pause = ""
        pacer.on_pause = self._paused

    def __enter__(self) -> CrawlProgress:
        self._bar.__enter__()
        self._task = self._bar.add_task("", total=None, phase="crawl")
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._pacer.on_pause = None
        self._bar.__exit__(kind, exc, tb)

    def phase(self, text: str, total: int | None = None) -> None:
        if self._task is not None:
            self._bar.update(self._task, phase=text, total=total, completed=0, description=self._buckets())

    def advance(self, repo_id: str) -> None:
        if self._task is not None:
            self._bar.update(self._task, advance=1, description=f"{self._buckets()}  {repo_id[:48]}")

    def _buckets(self) -> str:
        parts = []
        for name, (sent, left, quota) in self._pacer.snapshot().items():
            if sent or quota:
                window = f", {max(0, left)}/{quota} left" if left is not None and quota else ""
                parts.append(f"{name} {sent}{window}")
        return " | ".join(parts) + (f" | {self._last_pause}" if self._last_pause else "")

    def _paused(self, pause: Pause) -> None:
        text = f"paused {pause.seconds:.0f} s ({pause.bucket}: {pause.reason})"
        with self._lock:
            self._last_pause = text
        if self._enabled and pause.seconds >= 1:
            self._bar.console.log(text)
