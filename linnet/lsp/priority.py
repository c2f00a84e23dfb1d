"""Requests first: while the client waits for an answer, the document checks running in worker threads wait.

A keystroke's check runs in a worker thread and the event loop answers requests; both need Python's GIL, and
without this they took turns by the switch interval, each answer written at half speed or worse (a completion
sent while the rest of a keystroke's check ran waited 4 ms for its handler and 9 ms more for its write, on the
3,000-line file: bench/lsp_latency.py --burst-pause). So:

- the stdin thread closes the gate as soon as it reads a chunk holding a request (`arrived`), before the loop
  has even parsed it, and each request handler of a document holds it closed while it runs (`begin`/`end`);
- a check lent `wait` (`linnet.semantics.pausing`) stops at its next pause point while the gate is closed;
- the gate opens when every request in flight has been answered (`ANSWER_READ_S` after the last answer is
  written, so that the client reads it before a check takes the CPU back), or is itself waiting for an analysis
  (`waiting`: a hover the first stage cannot answer waits for the check it would hold up), and in any case
  `MAX_PAUSE_S` after it closed: a request nobody counts (a custom one, a response to us) holds up a check by
  that much at most.

Only the event loop calls `begin`, `end`, `waiting` and `settle`; `arrived` is the stdin thread's, `wait` the
checks'."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
import time
from typing import Iterator

# the longest a check waits for requests after the gate closed (a request that no handler counts, one whose
# answer is slow): checks go on after it whatever is in flight
MAX_PAUSE_S = 0.02
# how long the checks still wait after the last answer is written: the client, woken by the answer on the CPU a
# check would take back, read it a median 4 ms late when the check went on at once (traced on the 3,000-line file,
# quiet), 0.9 ms with this wait
ANSWER_READ_S = 0.002
# turns of the event loop after a chunk is handed to the loop before `settle` looks: the reader parses its
# messages and pygls starts their handlers within them
SETTLE_TURNS = 3

# set in a request handler's task (`RequestsFirst.handling`): its waits for an analysis are counted
_in_request: contextvars.ContextVar[bool] = contextvars.ContextVar("linnet_in_request", default=False)


class RequestsFirst:
    """The gate between requests being answered and the checks in worker threads (see the module docstring)."""

    def __init__(self) -> None:
        self._open = threading.Event()
        self._open.set()
        self._closed_at = 0.0
        self.in_flight = 0  # request handlers running (`begin` .. `end`)
        self.waiting_count = 0  # of those, the ones waiting for an analysis

    def arrived(self) -> None:
        """(The stdin thread.) A chunk holding a request was read: close the gate now."""
        self._closed_at = time.monotonic()
        self._open.clear()

    def begin(self) -> None:
        """A request handler starts (in its own task: what it waits for in it is counted, `waiting`)."""
        _in_request.set(True)
        self.in_flight += 1
        self.arrived()

    def end(self) -> None:
        """A request handler's answer is written: the gate opens `ANSWER_READ_S` later, when no other request
        is being answered then."""
        self.in_flight -= 1
        if self.in_flight <= self.waiting_count:
            asyncio.get_running_loop().call_later(ANSWER_READ_S, self._update)

    @contextlib.contextmanager
    def waiting(self) -> Iterator[None]:
        """A request handler waits for an analysis within the block: the checks go on meanwhile. (Outside a
        request handler's task, nothing: a check waiting for another holds up no answer.)"""
        if not _in_request.get():
            yield
            return
        self.waiting_count += 1
        self._update()
        try:
            yield
        finally:
            self.waiting_count -= 1

    def settle(self, turns: int = SETTLE_TURNS) -> None:
        """(After a chunk holding a request was handed to the loop.) Open the gate when no handler took it
        (a response to one of our requests, a request answered at once)."""
        if turns > 0:
            asyncio.get_running_loop().call_soon(self.settle, turns - 1)
        else:
            self._update()

    def _update(self) -> None:
        if self.in_flight <= self.waiting_count:
            self._open.set()

    def wait(self) -> None:
        """(A check's pause point.) Return when the gate is open, or `MAX_PAUSE_S` after it closed."""
        if self._open.is_set():
            return
        left = self._closed_at + MAX_PAUSE_S - time.monotonic()
        if left > 0:
            self._open.wait(left)
