"""What a user watching a live crawl sees (stderr, rich): the phase and models done / left on one
line; per rate-limit bucket the requests sent and what is left of its window on the next; each
pause longer than a second, and why, logged above them."""

from __future__ import annotations

import threading
from types import TracebackType

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.text import Text

from atlas.hub.pacing import Pacer, Pause


class CrawlProgress:
    def __init__(self, pacer: Pacer, enabled: bool = True) -> None:
        self._pacer = pacer
        self._enabled = enabled
        self._console = Console(stderr=True)
        self._bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        self._status = Text("")
        self._live = Live(Group(self._bar, self._status), console=self._console, refresh_per_second=4)
        self._task: TaskID | None = None
        self._lock = threading.Lock()
        self._last_pause = ""
        pacer.on_pause = self._paused

    def __enter__(self) -> CrawlProgress:
        if self._enabled:
            self._live.__enter__()
        self._task = self._bar.add_task("crawl", total=None)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._pacer.on_pause = None
        if self._enabled:
            self._refresh()
            self._live.__exit__(kind, exc, tb)
            if not self._console.is_terminal:
                self._console.print()  # the last frame of a non-terminal ends without a newline

    def phase(self, label: str, note: str = "", total: int | None = None) -> None:
        """A new phase: a short label on the bar, the note printed above it once."""
        if self._task is not None:
            self._bar.update(self._task, description=label, total=total, completed=0)
        if note and self._enabled:
            self._live.console.print(note)
        self._refresh()

    def advance(self, repo_id: str) -> None:
        if self._task is not None:
            self._bar.update(self._task, advance=1)
        self._refresh()

    def _refresh(self) -> None:
        parts = []
        for name, (sent, left, quota) in self._pacer.snapshot().items():
            if sent or quota:
                window = f", {max(0, left)}/{quota} left" if left is not None and quota else ""
                parts.append(f"{name} {sent}{window}")
        with self._lock:
            pause = self._last_pause
        self._status.plain = "requests: " + ("; ".join(parts) or "none yet") + (f"; {pause}" if pause else "")

    def _paused(self, pause: Pause) -> None:
        text = f"paused {pause.seconds:.0f} s: {pause.bucket} {pause.reason}"
        with self._lock:
            self._last_pause = text
        if self._enabled and pause.seconds >= 1:
            self._live.console.print(text)
