"""Item checks split over forked worker processes, for `linnet check` on a big file (issue 45).

The parse, the namespaces and the config scenarios are done once, in the parent; then `fork()` gives each worker a
copy of all of it (copy-on-write) and a share of the items to check: contiguous runs of the file's items, of about
equal text. Each worker checks its share as the parent would and sends back what the rest of the analysis needs
of each item (its findings merged across bindings, its calls for the recursion check), pickled through a pipe;
`Item`s travel as their place in a table both sides built before the fork, so a finding's anchors are the
parent's own items again. The parent checks the first share meanwhile and merges the shares in the items' order,
so the diagnostics are those one process finds, in the same order. A worker that fails (killed, out of memory)
costs nothing but time: the parent then checks every share itself, in order.

One process's checks share caches. An instance's members and a callee's signature are cached by their arguments
as written (`Embedding(c.vocab_size, c.hidden_size)` of one config value: its dim atoms), so an entry is the same
whichever check made it. Some details still come from a first maker: a config value's dim atoms are made by their
first use and shared by equal config values (two presets that agree on every field: the first one's line labels
both), a quotient's atom (`c.head_dim / 2`) is made once per process with a number that orders a product's factors
when it is printed, and a config's defaults are evaluated on first use. So each process tells which entries it made
(`Made`): a worker whose share made an entry that an earlier share also made would have seen the earlier one in a
single process, and then every worker's share is checked again in the parent, in order (as one process does).
Since the caches are keyed by the sizes as written, two shares make the same entry only where they use the same
config value or literal sizes (rare: `independent_cuts` keeps a config's users in one share). The parent first
checks a head of the file alone (`WARM_SHARE`), so that the entries every part of a file shares (the standard
library's layers at literal sizes, functions without compile-time arguments) are made before the fork.

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
    "Forked",
    "Made",
    "can_fork",
    "config_values",
    "independent_cuts",
    "shares",
]

# Below this many items for each process the fork, the pickling and the pipe cost more than they save (a module
# of llama.linnet under its five configs is ~10 ms to check: 16 of them outweigh a fork and its pipe).
MIN_ITEMS_PER_JOB = 16
# The share of the items the parent checks before the fork, rounded up to where a share may start (see the module
# docstring)
WARM_SHARE = 0.05


class Made:
    """Which cache entries a process made since this was taken: of `ctx`'s members and signatures, of
    `config_values`' dim atoms, of `evaluator`'s config defaults. `since()` gives them as hashes (a fork keeps
    the hash seed and the objects' ids of what existed before it, so equal keys hash equal in every process; the
    dim atoms in the keys, which may be made after it, are hashed by `_portable`; a collision only costs a
    needless check in the parent)."""

    def __init__(self, ctx, config_values: list):
        self.ctx = ctx
        self.config_values = config_values
        self.members = dict(ctx.members_cache)  # a module's own check makes its entry again (`members(report=True)`)
        self.signatures = len(ctx.signatures)
        self.defaults = len(ctx.evaluator._defaults)
        self.atoms = [len(cv._atoms) for cv in config_values]

    def since(self) -> set[int]:
        """Hashes of the entries made since (each cache is a dict, in the order its entries were made)."""
        ctx = self.ctx
        seen: dict[int, Any] = {}  # the parts of the keys (an instance's key is in its methods' keys too) by id
        made = {hash(_portable(k, seen)) for k, v in ctx.members_cache.items() if self.members.get(k) is not v}
        made |= {hash(("signature", _portable(k, seen))) for k in list(ctx.signatures)[self.signatures :]}
        made |= {hash(("defaults", id(k))) for k in list(ctx.evaluator._defaults)[self.defaults :]}
        for cv, n in zip(self.config_values, self.atoms):
            if len(cv._atoms) > n:
                made |= {hash(("atom", id(cv), name)) for name in list(cv._atoms)[n:]}
        return made


def _portable(key, seen: dict[int, Any]):
    """`key` (of the members or signatures cache) with each dim atom as its uid and name: the keys hold the atoms of
    the arguments as written (`c.hidden_size` of one config, `c.head_dim / 2`), and these atoms are made by their
    first use, so after the fork each process makes its own objects at the same addresses (ids, hence hashes, that
    name another config's atom in another process); the uid a config value gave the field before the fork names it
    in every process, and a quotient is named by its operands. Only an int argument's dim holds atoms
    (`scope.type_key`: `("int", Dim.key())`, a frozenset of terms; a config's is its fields' values), so only those
    are rewritten; `seen` holds the rewritten tuples by id (alive while the caches hold them: an instance's key is in
    its methods' keys too)."""
    if type(key) is not tuple:
        return key
    out = seen.get(id(key))
    if out is None:
        if len(key) == 2 and key[0] == "int" and type(key[1]) is frozenset:
            out = ("int", _portable_dim(key[1], seen))
        elif len(key) == 3 and key[0] == "config":
            out = key  # a config value's key: its fields' values and their origins (symbol anchors), no atoms
        else:
            out = tuple([_portable(x, seen) if type(x) is tuple else x for x in key])
        seen[id(key)] = out
    return out


def _portable_dim(terms: frozenset, seen: dict[int, Any]) -> frozenset:
    """A dim's key (`Dim.key()`: (monomial, coefficient) pairs, a monomial (atom, power) pairs) with each atom as
    `_portable` says."""
    out = []
    for mono, coeff in terms:
        factors = []
        for atom, power in mono:
            operands = atom.quot or atom.args  # a quotient's atom is made per written quotient: named by its operands
            if operands is not None:
                name = (atom.kind, atom.name, *(_portable_dim(d.key(), seen) for d in operands))
            else:
                name = ("atom", atom.uid, atom.name)
            factors.append((name, power))
        out.append((tuple(factors), coeff))
    return frozenset(out)


def config_values(roots) -> list:
    """Every config value reachable from `roots` (those of the scenarios: nested values too), each once."""
    from .configs import ConfigValue

    seen: dict[int, object] = {}
    todo = [v for v in roots if isinstance(v, ConfigValue)]
    while todo:
        v = todo.pop()
        if id(v) in seen:
            continue
        seen[id(v)] = v
        todo.extend(x for x in v.values.values() if isinstance(x, ConfigValue))
    return list(seen.values())


def can_fork() -> bool:
    """Whether this platform can fork worker processes (POSIX)."""
    return hasattr(os, "fork")


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
    item's text ends with the comments above the next one); a wrong one only costs time (`Made`)."""
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
