"""Item checks split over forked worker processes, for `linnet check` on a big file (issue 45).

The parse, the namespaces and the config scenarios are done once, in the parent; then `fork()` gives each worker a
copy of all of it (copy-on-write) and a share of the items to check: contiguous runs of the file's items, of about
equal text. Each worker checks its share as the parent would and sends back what the rest of the analysis needs
of each item (its findings merged across bindings, its calls for the recursion check), pickled through a pipe;
`Item`s travel as their place in a table both sides built before the fork, so a finding's anchors are the
parent's own items again. The parent checks the first share meanwhile and merges the shares in the items' order,
so the diagnostics are those one process finds, in the same order. A worker that fails (killed, out of memory)
costs nothing but time: the parent then checks every share itself, in order.

One process's checks share caches, and a check's findings do not depend on what was checked before it: an
instance's members and a callee's signature are cached by their arguments as written (`Embedding(c.vocab_size,
c.hidden_size)` of one config value: its dim atoms), so an entry is the same whichever check made it; a config
field's dim atom is made per way of writing it (`c.d`, `cfg.d`: each use prints what it wrote) with the id of the
first of the equal config values evaluated, and every config's defaults are evaluated before the checks, so the
atoms' ids (which order a product's factors when it is printed) are those of the evaluation, not of the checks; a
written division's atom (`c.head_dim / 2`) orders after its operands by its text (`dims.derived_key`), not by when it
was first written. So a worker's share finds what one process finds, whichever shares came before it (tests:
tests/cli/test_check_jobs.py, a file for each of those effects). The parent first checks a head of the file alone
(`WARM_SHARE`), so that the entries every part of a file shares (the standard library's layers at literal sizes,
functions without compile-time arguments) are made once, before the fork, not once per worker.

Only where `os.fork` exists (POSIX) and only for `linnet check`: the language server checks in one process (its
edits touch one item; a fork of a process with threads and an open editor connection is not safe).
"""

from __future__ import annotations

import io
import os
import pickle
import re
import signal
import sys
from typing import Any, Callable, Sequence

from ..syntax.items import Item

__all__ = [
    "MIN_ITEMS_PER_JOB",
    "WARM_SHARE",
    "DEFAULT_JOBS_MIN_CHARS",
    "Forked",
    "can_fork",
    "default_jobs",
    "independent_cuts",
    "shares",
    "usable_cpus",
]

# Below this many items for each process the fork, the pickling and the pipe cost more than they save (a module
# of llama.linnet under its five configs is ~10 ms to check: 16 of them outweigh a fork and its pipe).
MIN_ITEMS_PER_JOB = 16
# `linnet check` without `--jobs` checks a file of at least this many characters in as many processes as it has usable
# CPUs (`default_jobs`), a smaller one in one process: 8 copies of llama.linnet (77 kB, 40 modules under five configs)
# took 0.48 s of analysis in one process and 0.36 s in two on 2 shared cores, 16 copies 0.65 and 0.43 s
# (bench/results/check_phases_s7_threshold.md); 4 copies (39 kB, 20 modules) are too few items for two shares
# (MIN_ITEMS_PER_JOB). The threshold keeps a file of many small items (a gain of a few ms against a fork, pickled
# results and the standard library's entries made again in each worker) in one process. Every example is under 26 kB.
DEFAULT_JOBS_MIN_CHARS = 64_000
# The share of the items the parent checks before the fork, rounded up to where a share may start (see the module
# docstring): the 5 MB document's first copy. Since a check prints the same whatever came before it, the head only
# saves work the workers would each do again (the standard library's entries): 5 % of the items (28 copies) ran
# ~1.2 CPU s alone before the fork (a one-off measurement, 2 shared cores), one copy leaves 0.69 s before the fork
# (bench/results/check_shares.md) and each of 8 shares ~0.1 s more to do
WARM_SHARE = 0.002


def can_fork() -> bool:
    """Whether this platform can fork worker processes (POSIX)."""
    return hasattr(os, "fork")


def usable_cpus() -> set[int]:
    """The CPUs this process may run on: its CPU affinity where the platform has one (Linux), else all of
    `os.cpu_count()`'s; never empty."""
    try:
        cpus = set(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS and Windows have no sched_getaffinity
        cpus = set(range(os.cpu_count() or 1))
    return cpus or {0}


def default_jobs(text: str) -> int:
    """How many processes `linnet check` checks a file of `text` in when `--jobs` is not given: one per usable CPU
    for a file of at least DEFAULT_JOBS_MIN_CHARS characters where processes can be forked, else 1."""
    if len(text) < DEFAULT_JOBS_MIN_CHARS or not can_fork():
        return 1
    return len(usable_cpus())


def shares(items: Sequence[Item], jobs: int, cuts: Sequence[bool] | None = None) -> list[list[Item]]:
    """`items` split into at most `jobs` contiguous runs of about equal text (the check's cost grows with it),
    none empty; one run when there are fewer than `MIN_ITEMS_PER_JOB` items for each. `cuts[p]`: whether a run
    may start at `items[p]` (`independent_cuts`); a run ends at the first such place after its share of text."""
    jobs = max(1, min(jobs, len(items) // MIN_ITEMS_PER_JOB))
    total = sum(len(i.text) for i in items) or 1
    out: list[list[Item]] = [[]]
    done = 0
    for p, item in enumerate(items):
        if done * jobs >= total * len(out) and out[-1] and (cuts is None or cuts[p]):
            out.append([])
        out[-1].append(item)
        done += len(item.text)
    return out


def independent_cuts(items: Sequence[Item], by_name: dict[str, Item]) -> list[bool]:
    """For each of `items` (in the file's order), whether no item before it and no item from it on name a common
    item of the file (`by_name`: the file's own items by name, not the standard library's), directly or through
    others: where a share may start without its checks wanting the cache entries of the share before (a module's
    instance, a config's atoms). A syntactic guess (the identifiers of each item's text, comments left out: an
    item's text ends with the comments above the next one); a wrong one only costs time (two shares then make the
    same entries)."""
    names = set(by_name)
    parent: dict[Item, Item] = {}

    def root(item: Item) -> Item:
        while parent.get(item, item) is not item:
            item = parent[item]
        return item

    for item in items:
        for name in names.intersection(_IDENTIFIER.findall(_COMMENT.sub("", item.text))):
            a, b = root(item), root(by_name[name])
            if a is not b:
                parent[a] = b
    first: dict[Item, int] = {}
    last: dict[Item, int] = {}
    for p, item in enumerate(items):
        r = root(item)
        first.setdefault(r, p)
        last[r] = p
    crossed = [0] * (len(items) + 1)  # +1 where a component's span starts past its first item, -1 after it ends
    for r, p in first.items():
        if last[r] > p:
            crossed[p + 1] += 1
            crossed[last[r] + 1] -= 1
    out, open_spans = [], 0
    for p in range(len(items)):
        open_spans += crossed[p]
        out.append(open_spans == 0)
    return out


_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_COMMENT = re.compile(r"#[^\n\r]*")


class _Pickler(pickle.Pickler):
    def __init__(self, file, ids: dict[int, int]):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.ids = ids

    def persistent_id(self, obj):
        if isinstance(obj, Item):
            return self.ids.get(id(obj))  # None (an item made after the fork): pickled as a value
        return None


class _Unpickler(pickle.Unpickler):
    def __init__(self, file, table: list[Item]):
        super().__init__(file)
        self.table = table

    def persistent_load(self, pid):
        return self.table[pid]


class Forked:
    """Worker processes, one per share, each running `work(share)` (a picklable value, which may hold the items
    of `table`) in a fork of this process. `collect()` waits for them and gives each share's value, or None for
    a share whose worker failed or could not be started (`os.fork` or `os.pipe` raising OSError: the process
    limit, memory; the workers already started are then ended). Used as a context manager: leaving the block by
    an exception (Ctrl-C's KeyboardInterrupt while the parent checks its own share or waits) ends the workers
    not yet collected, so none runs on as an orphan."""

    def __init__(self, share_list: list[list[Item]], work: Callable[[list[Item]], Any], table: list[Item]):
        self.table = table
        self.n_shares = len(share_list)
        ids = {id(item): n for n, item in enumerate(table)}
        self.workers: list[tuple[int, int]] = []  # (pid, read end of its pipe), those not collected yet
        prctl = _prctl()  # looked up before the fork: each worker asks for its parent-death signal with it
        parent = os.getpid()
        try:
            for share in share_list:
                read_fd, write_fd = os.pipe()
                try:
                    pid = os.fork()
                except OSError:
                    os.close(read_fd)
                    os.close(write_fd)
                    raise
                if pid == 0:  # the worker: never returns
                    os.close(read_fd)
                    _end_with(parent, prctl)
                    _worker(share, work, ids, write_fd)
                os.close(write_fd)
                self.workers.append((pid, read_fd))
        except OSError:  # no more processes or memory: the parent checks every share (`collect` gives None)
            self.end()
            self.n_shares = -1

    def __enter__(self) -> "Forked":
        return self

    def __exit__(self, *exc) -> None:
        self.end()

    def end(self) -> None:
        """End (SIGKILL) and reap the workers not collected, and close their pipes."""
        workers, self.workers = self.workers, []
        for pid, read_fd in workers:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:  # gone already
                pass
            os.close(read_fd)
        for pid, _ in workers:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass

    def collect(self) -> list[Any]:
        """Each share's value, in the order of the shares (None where its worker failed or was not started)."""
        if self.n_shares < 0:
            return [None]
        out = []
        while self.workers:
            pid, read_fd = self.workers[0]
            with os.fdopen(read_fd, "rb", closefd=False) as pipe:
                data = pipe.read()
            _, status = os.waitpid(pid, 0)
            self.workers.pop(0)
            os.close(read_fd)
            value = None
            if os.waitstatus_to_exitcode(status) == 0 and data:
                try:
                    value = _Unpickler(io.BytesIO(data), self.table).load()
                except Exception:  # noqa: BLE001 - a torn message: the parent checks the share itself
                    value = None
            out.append(value)
        return out


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _prctl() -> Callable[..., int] | None:
    """libc's `prctl` (Linux), else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def _end_with(parent: int, prctl: Callable[..., int] | None) -> None:
    """In a worker: have the kernel SIGKILL it when the parent (the thread that forked it) dies (Linux's parent-death
    signal, prctl(2)), so that a parent killed outright (SIGTERM, SIGKILL: no `Forked.end`) leaves no worker running
    its share as an orphan; and exit at once if the parent died before this was asked for. Elsewhere a no-op."""
    if prctl is None:
        return
    prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)


def _worker(share: list[Item], work: Callable[[list[Item]], Any], ids: dict[int, int], write_fd: int) -> None:
    """The worker process: `work(share)` pickled into the pipe, then an exit without the interpreter's teardown
    (the parent's objects are not this process's to finalise: no atexit handlers, no flushing of inherited
    buffers). Exit status 1 on any error."""
    status = 1
    try:
        buffer = io.BytesIO()
        _Pickler(buffer, ids).dump(work(share))
        with os.fdopen(write_fd, "wb") as pipe:
            pipe.write(buffer.getbuffer())
        status = 0
    except BaseException:  # noqa: BLE001 - whatever happened, the parent checks the share itself
        status = 1
    finally:
        os._exit(status)
