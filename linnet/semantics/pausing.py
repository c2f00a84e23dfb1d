"""Pause points of a long check: where a check run in the background lets more urgent work go first.

The language server checks a document in a worker thread while its event loop answers requests, and both need
Python's GIL: a completion that arrived while a keystroke's check ran was answered in slices of the switch
interval, taking turns with the check (traced on the 3,000-line file: 4 ms from its arrival to its handler, 9 ms
from its answer to the write). So a check calls `pause_point()` between its steps (an item's check under one
binding, each pass after the checks: a few ms at most), and the thread that runs it may lend it a `wait`
(`pausing_with`) that blocks while requests are answered (`linnet.lsp.priority`). Anywhere else (`linnet check`,
a keystroke's first stage, which requests wait for, tests) a pause point does nothing."""

from __future__ import annotations

import contextlib
import threading
from typing import Callable, Iterator

_local = threading.local()


@contextlib.contextmanager
def pausing_with(wait: Callable[[], None] | None) -> Iterator[None]:
    """Within the block, this thread's pause points call `wait()` (which returns when the check may go on); None:
    they do nothing."""
    previous = getattr(_local, "wait", None)
    _local.wait = wait
    try:
        yield
    finally:
        _local.wait = previous


def not_pausing() -> contextlib.AbstractContextManager[None]:
    """Within the block, this thread's pause points do nothing: it holds a lock that what a pause lets go first may
    take (a `wait` that closes the buffer, or blocks until requests whose handlers take it are answered)."""
    return pausing_with(None)


def pause_point() -> None:
    """Let more urgent work go first, when this thread's check was lent a `wait` (`pausing_with`)."""
    wait = getattr(_local, "wait", None)
    if wait is not None:
        wait()
