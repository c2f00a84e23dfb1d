"""When the language server's garbage collector may run: in pauses, never inside a request or a check.

CPython runs a full (generation 2) collection whenever enough objects have survived the younger collections, and a
full collection scans every tracked object. The analysis of a 5,000-line file holds about 800,000 of them: a full
collection took 0.6-0.9 s (traced in the server: one every 75-80 edits), paid by whichever edit or request happened
to allocate, and 1.5 s of the first check of such a file went to full collections. So the server:

- freezes what startup loaded (`gc.freeze()`: modules, tables; no collection scans frozen objects again);
- keeps the automatic young collections (generations 0 and 1: what was allocated since; about a millisecond), and
  puts the automatic full collection out of the way (generation 2's threshold 100 times CPython's, a backstop for a
  session that never pauses);
- once the server has been idle for `IDLE_S` (no message from the client, no check running) after it did something,
  freezes what survived until then (a list splice, no scan), and runs the full collection that CPython would have
  run: when the objects frozen since the last full collection reach a quarter of those that survived it (CPython's
  own rule for generation 2: Modules/gcmodule.c, `long_lived_pending > long_lived_total / 4`). That one scans
  everything (`gc.unfreeze()` first) and frees the cycles that edits left among frozen objects (replaced items);
  the survivors are frozen again.

Memory: cyclic garbage waits for a pause in which a full collection is due, so it stays under about a quarter of
what the analyses hold (measured in bench/lsp_latency.py).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from typing import Callable

log = logging.getLogger("linnet.lsp")

IDLE_S = 2.0  # a pause in typing this long is where collections go
FULL_THRESHOLD_FACTOR = 100  # generation 2's automatic threshold, times CPython's (the backstop)
GROWTH_FOR_FULL = 0.25  # frozen since the last full collection, as a share of its survivors (CPython's rule)


class IdleCollector:
    """Moves the server's full garbage collections into its idle pauses (see the module docstring).

    `busy()` says whether a check is running or due (then it is not a pause). `activity()` on every message and
    at the end of every check; `start()` once, after startup's imports and before serving."""

    def __init__(self, busy: Callable[[], bool], idle_s: float = IDLE_S):
        self.busy = busy
        self.idle_s = idle_s
        self.survivors = 0  # objects frozen by the last full collection
        self.full_collections = 0
        self._timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        """Collect and freeze what startup loaded, and move the automatic full collection out of the way."""
        gc.collect()
        gc.freeze()
        self.survivors = gc.get_freeze_count()
        young, middle, full = gc.get_threshold()
        gc.set_threshold(young, middle, full * FULL_THRESHOLD_FACTOR)

    def activity(self) -> None:
        """Something happened (a message arrived, a check ended): the pause starts again from now."""
        if self._timer is not None:
            self._timer.cancel()
        try:
            self._timer = asyncio.get_running_loop().call_later(self.idle_s, self._idle)
        except RuntimeError:  # no event loop (a handler called outside the server): nothing to schedule
            self._timer = None

    def _idle(self) -> None:
        self._timer = None
        if self.busy():
            self.activity()  # a check still runs in a worker thread: not a pause yet
            return
        gc.freeze()
        frozen = gc.get_freeze_count()
        if frozen - self.survivors > GROWTH_FOR_FULL * max(self.survivors, 1):
            self.collect_all()

    def collect_all(self) -> float:
        """A full collection over every object, frozen or not; the survivors are frozen again. Returns the
        seconds it took."""
        t0 = time.perf_counter()
        gc.unfreeze()
        gc.collect()
        gc.freeze()
        self.survivors = gc.get_freeze_count()
        self.full_collections += 1
        pause_s = time.perf_counter() - t0
        log.debug("idle full collection: %.0f ms, %d objects survive", 1000 * pause_s, self.survivors)
        return pause_s
