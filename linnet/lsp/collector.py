"""When the language server's garbage collector may run: in pauses, never inside a request or a check.

CPython runs a full (generation 2) collection whenever enough objects have survived the younger collections, and a
full collection scans every tracked object. The analysis of a 5,000-line file holds about 800,000 of them: a full
collection took 0.6-0.9 s (traced in the server: one every 75-80 edits), paid by whichever edit or request happened
to allocate, and 1.5 s of the first check of such a file went to full collections. So the server:

- freezes what startup loaded (`gc.freeze()`: modules, tables; no collection scans frozen objects again; imported
  with fewer young collections, `startup.py`), counted once the first check's diagnostics are out (counting walks
  them: ~10 ms of a cold start), and makes the young collections rarer until then (the first check builds a live
  analysis they would only scan);
- keeps the automatic young collections (generations 0 and 1: what was allocated since; about a millisecond), and
  turns the automatic full collection off (generation 2's threshold out of reach): it scans every object not frozen,
  and while a 5 MB file's first check runs that is its whole growing analysis (up to 13 million objects: a full
  collection over them took 4.8 s). What it was a backstop for is collected anyway: a session that types without
  pausing has what each check left collected at its end (below), and one that only sends requests, which do not
  start a pause again, has a pause scheduled by them when none is (`request_seen`);
- after every check (its diagnostics published) collects what is not frozen: one edit's worth, the analysis it
  replaced and what it allocated (milliseconds; a big file just opened is frozen instead: its analysis is live),
  once the requests that waited on the check are answered (`check_ended`: a completion sent with a keystroke
  waited for that check, then for this collection, 2.5 ms at the median and 7-19 ms at p90-p99 on a 3,000-line
  file on 2 shared cores);
- once the text has been still for `IDLE_S` (no didOpen, didChange, didSave or didClose; no check running; requests
  do not count: a client asking for hovers every 250 ms postponed every collection and garbage grew with each edit),
  collects what is not frozen (what the last burst of edits allocated: the analyses it replaced are garbage now,
  and freezing them would keep them until a full collection; skipped above `YOUNG_LIMIT` objects, which only a
  big file just opened reaches), then freezes what survived (a list splice, no scan);
- runs a full collection (`gc.unfreeze()` first: it scans everything and frees the analyses that were live at an
  earlier pause and replaced since) only when the objects frozen since the last one have doubled those that survived
  it (a big file's analysis frozen as it is opened counts as surviving: it is live, and the first pause after
  opening a 3,000-line file scanned its 800,000 objects for nothing, 1-2.4 s). Garbage is collected before it is
  frozen, so what freezing leaks is bounded by what each pause held live and an edit then replaced; the full
  collection, which costs a blocking ~0.5 s per 700,000 objects (a 3,000-line file), is rare. Checkpoint checks run
  in another process (`weights.py`) and leave nothing here. What is frozen is counted as it is frozen (the survivors
  of the collection just before), not with `gc.get_freeze_count()`: that walks every frozen object's list link, 0.1 s
  at 800,000 objects (a 3,000-line file), and every pause paid it. Frozen objects that refcounting frees since are
  still counted, so the next full collection comes a little early; it counts exactly. What is not frozen is counted
  exactly only when it may be small: `gc.get_objects` walks it (0.95 s at the 13 million objects a 5 MB file's
  check leaves), so the growth of the allocator's blocks (`sys.getallocatedblocks()`, a counter; about 1.5 blocks
  an object in an analysis) says first when it is far above `YOUNG_LIMIT`, and it is then frozen uncounted.

Not solved: a big file's analysis, frozen as live at the end of its first check, stays frozen after the editor closes
the file, until enough growth makes a full collection due; RSS grows by it with every open and close of such a file
(520 MB for a 200-copy file). Counting it as garbage at the close was tried: the next pause's full collection freed
1.1 GB of the 5 MB file's 1.5 GB, and a hover sent during it waited 13.9 s (bench/results/lsp_bigdoc_s12_close_*,
`close_pause`). No collection of 13 million objects is short; freeing them without one needs analyses without
reference cycles (an `Instance` and its `Scope`, a method's `FnTarget` and its instance, a document and its
analysis), released in steps that let requests go first.

Memory: measured by `bench/lsp_latency.py --burst-pause` (RSS after every burst of edits).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
import time
from typing import Callable

log = logging.getLogger("linnet.lsp")

IDLE_S = 2.0  # a pause in typing this long is where collections go
# generation 2's automatic threshold: more young collections than a session makes (off; see the module docstring)
FULL_THRESHOLD_OFF = 1 << 30
GROWTH_FOR_FULL = 1.0  # frozen since the last full collection, as a share of its survivors
YOUNG_LIMIT = 150_000  # unfrozen objects a collection after a check or in a pause scans at most (about 0.1 s)
# growth of the allocator's blocks past which what is not frozen is estimated rather than counted: about 2 million
# objects of an analysis (1.45 blocks an object in examples/llama.linnet's and in 40 copies' of it; counting them
# would take ~0.15 s), and more than YOUNG_LIMIT objects even at 20 blocks an object
UNCOUNTED_BLOCKS = 3_000_000
BLOCKS_PER_OBJECT = 1.45
# generation 0's threshold until the first check ends (CPython's: 700): that check builds a live analysis, which the
# young collections only scanned (~10 ms of 65 in the first check of examples/llama.linnet); `after_check` restores it
FIRST_CHECK_YOUNG_THRESHOLD = 10_000
# how long the collection after a check waits for the requests in flight to be answered (a request that runs longer,
# a run or comparison command, does not hold it further)
AFTER_CHECK_WAIT_S = 0.05
AFTER_CHECK_POLL_S = 0.001


class IdleCollector:
    """Moves the server's full garbage collections into its idle pauses (see the module docstring).

    `busy()` says whether a check is running or due (then it is not a pause); `answering()` whether a request is
    in flight. `activity()` on every message, `check_ended()` at the end of every check; `start()` once, after
    startup's imports and before serving."""

    def __init__(self, busy: Callable[[], bool], idle_s: float = IDLE_S, answering: Callable[[], bool] = lambda: False):
        self.busy = busy
        self.answering = answering
        self.idle_s = idle_s
        self.survivors = 0  # objects frozen by the last full collection
        self.frozen = 0  # objects frozen since startup (those refcounting freed since are not subtracted)
        self.unfrozen = 0  # objects the last young collection left (frozen by the next pause)
        self._blocks_counted = 0  # the allocator's blocks when `unfrozen` was last counted or made 0
        self.full_collections = 0
        self.young_collections = 0
        self._timer: asyncio.TimerHandle | None = None
        self._young_threshold: int | None = None  # generation 0's threshold after the first check (`start`)
        self._count_due = False  # what `start` froze is not counted yet
        self._after_check_due = False  # a check ended and its `after_check` has not run yet

    def start(self) -> None:
        """Freeze what startup loaded, and turn the automatic full collection off. What startup loaded
        is frozen without a full collection first: that cost ~60 ms of every cold start, and the young collections
        while it imported (`linnet.lsp.startup`) left little garbage (what is left, the next full collection
        frees). Until the first check ends, the young collections are rarer (`FIRST_CHECK_YOUNG_THRESHOLD`)."""
        gc.freeze()
        self._count_due = True  # counted after the first check (`_count_startup`): ~10 ms of the first diagnostics
        young, middle, full = gc.get_threshold()
        self._young_threshold = young
        gc.set_threshold(max(young, FIRST_CHECK_YOUNG_THRESHOLD), middle, FULL_THRESHOLD_OFF)
        self._blocks_counted = sys.getallocatedblocks()

    def activity(self) -> None:
        """Something happened (a message arrived, a check ended): the pause starts again from now."""
        if self._timer is not None:
            self._timer.cancel()
        try:
            self._timer = asyncio.get_running_loop().call_later(self.idle_s, self._idle)
        except RuntimeError:  # no event loop (a handler called outside the server): nothing to schedule
            self._timer = None

    def request_seen(self) -> None:
        """A request arrived: a pause is scheduled when none is, and one that is is not postponed. A client that only
        asks (hovers, completions, no typing) still gets its garbage collected every `idle_s`; with the automatic
        full collection off nothing else would."""
        if self._timer is None:
            self.activity()

    def check_ended(self) -> None:
        """A check ended: `after_check` once no request is in flight (those that waited on the check are answered
        first; at most `AFTER_CHECK_WAIT_S`), on the event loop. When another check has begun by then, its end
        collects instead. Outside an event loop, at once."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.after_check()
            return
        deadline = loop.time() + AFTER_CHECK_WAIT_S
        self._after_check_due = True

        def when_answered() -> None:
            if self.answering() and loop.time() < deadline:
                loop.call_later(AFTER_CHECK_POLL_S, when_answered)
            elif not self.busy():
                self.after_check()
            else:
                self._after_check_due = False  # the next check's end collects instead

        loop.call_soon(when_answered)

    def after_check(self) -> None:
        """A check ended (its diagnostics are out): collect what is not frozen now, while it is one edit's worth
        (the analysis it replaced, and what the check allocated; a few milliseconds), rather than a whole burst's
        in the pause, where a request waited on it (0.1-0.3 s). Above `YOUNG_LIMIT` objects (a big file just
        opened: its whole analysis, live) freeze them instead of scanning them. The pause starts again from now.
        After the first check, the young collections run at their usual threshold again."""
        self._after_check_due = False
        if self._young_threshold is not None:
            gc.set_threshold(self._young_threshold, *gc.get_threshold()[1:])
            self._young_threshold = None
        self._count_startup()
        self.collect_young(freeze_above_limit=True)
        self.activity()

    def _count_startup(self) -> None:
        """Count what `start` froze (`gc.get_freeze_count()` walks them: ~10 ms for a start's 56,000 objects), once,
        before anything else is frozen: after the first check's diagnostics are out, or at a pause before any."""
        if self._count_due:
            self._count_due = False
            self.survivors = self.frozen = gc.get_freeze_count()

    def _idle(self) -> None:
        self._timer = None
        if self.busy() or self._after_check_due:
            # a check still runs in a worker thread, or one has just ended and its `after_check` is to freeze what it
            # made: not a pause yet. (A pause in that gap took a 5 MB file's new analysis, 13 million objects, for
            # growth, and ran a full collection over it: 4.8 s that a hover sent then waited on, in 2 of 5 runs of
            # bench/lsp_bigdoc.py; before, the cause of `hover_after_close_s`'s 7.4-8.4 s in bench/results/
            # lsp_bigdoc_s11_*, not the automatic full collection.)
            self.activity()
            return
        self._count_startup()
        self.collect_young()
        gc.freeze()
        self.frozen += self.unfrozen
        self.unfrozen = 0
        self._blocks_counted = sys.getallocatedblocks()
        if self.frozen - self.survivors > GROWTH_FOR_FULL * max(self.survivors, 1):
            self.collect_all()

    def collect_young(self, freeze_above_limit: bool = False) -> float:
        """Collect what is not frozen (what was allocated since the last pause: the analyses of the last burst of
        edits and their garbage), so the freeze that follows keeps no garbage; skipped when that is more than
        `YOUNG_LIMIT` objects (a big file just opened: its whole analysis, scanned for nothing). Returns the seconds
        it took."""
        t0 = time.perf_counter()
        unfrozen = self._unfrozen_above_limit()
        if unfrozen is None:
            unfrozen = sum(len(gc.get_objects(generation)) for generation in range(3))
        if unfrozen <= YOUNG_LIMIT:
            self.unfrozen = max(unfrozen - gc.collect(), 0)  # frozen objects are not scanned
            self.young_collections += 1
        elif freeze_above_limit:
            gc.freeze()
            self.frozen += unfrozen
            self.survivors += unfrozen  # live (a file just opened): no full collection is due for freezing it
            self.unfrozen = 0
        else:
            self.unfrozen = unfrozen
        self._blocks_counted = sys.getallocatedblocks()
        return time.perf_counter() - t0

    def _unfrozen_above_limit(self) -> int | None:
        """About how many objects are not frozen, when the allocator's blocks grew by more than `UNCOUNTED_BLOCKS`
        since they were last counted: far more than `YOUNG_LIMIT`, not worth a walk that counts them. None when
        they grew less (what is frozen may also have been freed meanwhile: the growth then undercounts), and the
        objects are to be counted."""
        grown = sys.getallocatedblocks() - self._blocks_counted
        return self.unfrozen + int(grown / BLOCKS_PER_OBJECT) if grown > UNCOUNTED_BLOCKS else None

    def collect_all(self) -> float:
        """A full collection over every object, frozen or not; the survivors are frozen again. Returns the
        seconds it took."""
        t0 = time.perf_counter()
        gc.unfreeze()
        gc.collect()
        gc.freeze()
        self.survivors = self.frozen = gc.get_freeze_count()  # exact again (rare; a tenth of the collection)
        self.unfrozen = 0
        self._blocks_counted = sys.getallocatedblocks()
        self.full_collections += 1
        pause_s = time.perf_counter() - t0
        log.debug("idle full collection: %.0f ms, %d objects survive", 1000 * pause_s, self.survivors)
        return pause_s
