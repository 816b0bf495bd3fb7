"""Ctrl-C (SIGINT) handled by a handler of the caller's choosing for the length of one block."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def sigint_handler(handler: Callable[[int, Any], Any]) -> Iterator[None]:
    """SIGINT goes to `handler` inside the block; the handler from before is given back after, even
    one that was SIG_IGN (a job started in the background inherits that). Python lets only the main
    thread set a handler: elsewhere the block runs with the process's handler as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
