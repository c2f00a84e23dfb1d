"""Standard streams whose reader may leave early: `linnet check FILE | head -1`.

Python ignores SIGPIPE, so a write to a pipe whose reader has gone raises BrokenPipeError, which used to end the
command with exit 0: a check with errors succeeded in a pipeline. `grep` dies of SIGPIPE (the shell's status 141)
and ruff (0.17.6) exits 0, the misleading success this replaces; Linnet keeps its own verdict instead: once the
reader has gone the rest of the output is dropped (the stream's descriptor pointed at the null device, as Python's
documentation on SIGPIPE suggests, so that later flushes succeed) and the command ends with the status it
computed (`check`: 1 on errors), which `set -o pipefail` reports.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from typing import Iterator, TextIO

__all__ = ["ReaderMayLeave", "readers_may_leave"]


class ReaderMayLeave:
    """A text stream (`sys.stdout`) that drops what is written once its reader has gone (`reader_left`), instead of
    raising BrokenPipeError; everything else is the wrapped stream's."""

    def __init__(self, stream: TextIO):
        self.stream = stream
        self.reader_left = False

    def write(self, text: str) -> int:
        if not self.reader_left:
            try:
                return self.stream.write(text)
            except BrokenPipeError:
                self._drop()
        return len(text)

    def flush(self) -> None:
        if not self.reader_left:
            try:
                self.stream.flush()
            except BrokenPipeError:
                self._drop()

    def _drop(self) -> None:
        """Drop the rest: the descriptor goes to the null device, so the buffered text left in the stream and the
        interpreter's last flush write there instead of raising again."""
        self.reader_left = True
        with contextlib.suppress(OSError, ValueError, io.UnsupportedOperation):  # no descriptor (a test's capture)
            devnull = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(devnull, self.stream.fileno())
            finally:
                os.close(devnull)

    def __getattr__(self, name: str):
        return getattr(self.stream, name)


@contextlib.contextmanager
def readers_may_leave() -> Iterator[None]:
    """Within the block, `sys.stdout` and `sys.stderr` are `ReaderMayLeave` wrappers of what they were (restored
    after; a missing stream, None, stays None)."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = (ReaderMayLeave(s) if s is not None else s for s in saved)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved
