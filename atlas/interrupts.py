"""Ctrl-C (SIGINT) handled by a handler of the caller's choosing for the length of one block, and
SIGTERM raised as an interrupt, so that `kill` or timeout(1) ends a command through Ctrl-C's cleanup."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any


@contextmanager
def _handling(signum: int, handler: Callable[[int, Any], Any]) -> Iterator[None]:
    """`signum` goes to `handler` inside the block; the handler from before is given back after, even
    one that was SIG_IGN (a job started in the background inherits that). Python lets only the main
    thread set a handler: elsewhere the block runs with the process's handler as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signum, handler)
    try:
        yield
    finally:
        signal.signal(signum, previous)


def sigint_handler(handler: Callable[[int, Any], Any]) -> AbstractContextManager[None]:
    """SIGINT goes to `handler` inside the block (see _handling)."""
    return _handling(signal.SIGINT, handler)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C's KeyboardInterrupt would be."""


def _terminated(signum: int, frame: Any) -> None:
    raise Terminated


def sigterm_as_interrupt() -> AbstractContextManager[None]:
    """Inside the block SIGTERM raises Terminated, so a command stopped by `kill` or timeout(1) ends
    through the same `finally` blocks as Ctrl-C: servers it started stopped, staging folders gone,
    no half record. Python's default would end the process at once, leaving a measurement's
    llama-server children running and their logs behind."""
    return _handling(signal.SIGTERM, _terminated)
