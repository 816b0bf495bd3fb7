"""What every request of one crawl shares (`Context`), and `call`: one hub call, retried past
429s, 5xx answers and timeouts, its failure classified into a RepoProblem."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from huggingface_hub import HfApi
from huggingface_hub.errors import NotASafetensorsRepoError, SafetensorsParsingError

from atlas import AtlasError
from atlas.hub.client import DEFAULT_BOUNDS, Bounds, HubUnreachable, Silence
from atlas.hub.errors import ErrorKind, RepoProblem, classify, response_of
from atlas.hub.pacing import GaveUp, Pacer, retry_after

MAX_ATTEMPTS = 4
_ASK_AGAIN = frozenset({ErrorKind.RETRY, ErrorKind.UNREACHABLE})

T = TypeVar("T")


@dataclass
class Context:
    api: HfApi
    endpoint: str
    token: str | bool
    cache_dir: Path
    pacer: Pacer
    silence: Silence
    bounds: Bounds = DEFAULT_BOUNDS


def call(ctx: Context, fn: Callable[[], T], backoff_s: float = 1.0) -> T:
    """Run one hub call; retry 429/5xx/timeouts honouring the server's pause, else raise RepoProblem
    (or HubUnreachable when the hub has stopped answering altogether)."""
    for attempt in range(1, MAX_ATTEMPTS + 1):
        if ctx.silence.gone.is_set():
            raise HubUnreachable(f"{ctx.endpoint} stopped answering")
        try:
            return fn()
        except (RepoProblem, HubUnreachable):
            raise
        except GaveUp as exc:  # asking again would reach the same bound
            raise RepoProblem(ErrorKind.ERROR, str(exc), gave_up=True) from None
        except AtlasError as exc:
            raise RepoProblem(ErrorKind.ERROR, str(exc)) from None
        except Exception as exc:  # the hub client raises many types; classify sorts them
            kind, message = classify(exc)
            if ctx.silence.gone.is_set():
                raise HubUnreachable(f"{ctx.endpoint} stopped answering: {message}") from None
            if kind not in _ASK_AGAIN:
                unreadable = isinstance(exc, (SafetensorsParsingError, NotASafetensorsRepoError))
                raise RepoProblem(kind, message, permanent=unreadable) from None
            if attempt == MAX_ATTEMPTS:
                raise RepoProblem(ErrorKind.ERROR, f"{message} (gave up after {MAX_ATTEMPTS} attempts)") from None
            pause = retry_after(getattr(response_of(exc), "headers", None))
            try:
                ctx.pacer.pause(pause if pause is not None else min(30.0, backoff_s * 2 ** (attempt - 1)))
            except GaveUp as too_long:
                raise RepoProblem(ErrorKind.ERROR, str(too_long), gave_up=True) from None
    raise AssertionError("unreachable")
