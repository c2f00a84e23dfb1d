"""The output folder of a training run, claimed for the run, and the signals that stop a run cleanly.

Claiming (`claim_output`): `OUT` is created (or taken when it exists empty, or holds an earlier run's checkpoints
and the run resumes) and locked before anything loads or trains: the lock is `OUT/.linnet-train.lock`, held with
`fcntl.flock` (exclusive, non-blocking) for the whole run and holding the holder's pid, host and start time. The
kernel drops a flock when its process dies, so a lock file left by a killed run is stale: the next run sees it
unlocked and takes it over. A second run with the same `OUT` finds the lock held and is refused with the holder's
pid (`TrainError`: exit 2) before it loads anything. On release the lock file is removed; a run that ends without
a checkpoint or a result (an error, or a signal before the first step) also removes the files it made, and `OUT`
itself when it made it, so `OUT` is as it was. Nothing else is ever deleted: a run deletes only what it made.

Signals (`StopSignals`): while a run trains, SIGTERM, SIGHUP and SIGINT are taken by a handler that only notes the
signal; the trainer's step hook sees it after the step in progress, saves a checkpoint and stops
(`errors.TrainInterrupted`). Before the training loop (loading), or on a second signal, the handler stops the run
at once (`Interrupt`, a `BaseException`, so no `except Exception` swallows it): the temporary folders being
written are removed on the way out.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import signal
import socket
import threading
import time
from pathlib import Path

from linnet.errors import TrainError

__all__ = ["LOCK_NAME", "OutputClaim", "claim_output", "StopSignals", "Interrupt", "checkpoint_dirs", "is_partial"]

LOCK_NAME = ".linnet-train.lock"
CHECKPOINT_PREFIX = "checkpoint-"


def checkpoint_dirs(folder: Path) -> list[Path]:
    """The complete `checkpoint-N` folders of `folder` (holding `trainer_state.json`), by N ascending
    (transformers' `get_last_checkpoint` takes the largest N)."""
    found = []
    with contextlib.suppress(OSError):
        for p in folder.iterdir():
            n = p.name.removeprefix(CHECKPOINT_PREFIX)
            if p.name.startswith(CHECKPOINT_PREFIX) and n.isdigit() and (p / "trainer_state.json").is_file():
                found.append((int(n), p))
    return [p for _, p in sorted(found)]


def is_partial(name: str) -> bool:
    """Whether `name` is one of the temporary folders a run writes into `OUT` (`.checkpoint-N.*.partial`,
    `.result.*.partial`), renamed into place when complete."""
    return name.startswith((".checkpoint-", ".result.")) and name.endswith(".partial")


class OutputClaim:
    """`path` (the run's `OUT`) claimed by this process: `fd` the locked lock file, `created` whether the run made
    the folder, `before` the names it held when claimed, `notes` what the claim found (a stale lock)."""

    def __init__(self, path: Path, fd: int, created: bool, before: set[str], notes: list[str]):
        self.path, self.fd, self.created, self.before, self.notes = path, fd, created, before, notes

    def release(self, keep: bool) -> None:
        """Remove the lock file and unlock. Unless `keep` (the run left a checkpoint or its result), also remove
        what the run made in `OUT` (names it did not hold when claimed), and `OUT` when the run created it and it
        is empty then."""
        lock = self.path / LOCK_NAME
        with contextlib.suppress(OSError):
            lock.unlink()  # unlink while holding the lock: a run that opened it before checks the inode it locked
        os.close(self.fd)
        if keep:
            return
        for name in ("metrics.jsonl",):
            if name not in self.before:
                with contextlib.suppress(FileNotFoundError):
                    (self.path / name).unlink()
        if self.created:
            with contextlib.suppress(OSError):
                self.path.rmdir()  # only when empty: never a file the run did not make


def _holder(lock: Path, fd: int | None = None) -> str:
    """What the lock file says of its holder: `pid 123 on host, since 2026-01-01 04:31:02 UTC`."""
    try:
        text = os.pread(fd, 4096, 0).decode() if fd is not None else lock.read_text(encoding="utf-8")
        info = json.loads(text)
        return f"pid {info['pid']} on {info['host']}, since {info['started']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "a process that left no pid"


def _is_locked(lock: Path) -> bool:
    """Whether a live process holds `lock` (a lock file whose process died is not locked)."""
    try:
        fd = os.open(lock, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def _in_use(target: Path, who: str) -> TrainError:
    return TrainError(f"{target}: in use by another `linnet train` ({who}); wait for it to end, or pick another -o")


def _lock(target: Path) -> tuple[int, str | None]:
    """Take `target`'s lock: (the locked fd, the stale holder it replaced or None). Raises TrainError when a live
    process holds it."""
    lock = target / LOCK_NAME
    for _ in range(5):
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            who = _holder(lock, fd)
            os.close(fd)
            raise _in_use(target, who) from None
        try:
            same = os.fstat(fd).st_ino == os.stat(lock).st_ino
        except FileNotFoundError:
            same = False
        if not same:  # its holder removed it between our open and our flock: take the new one
            os.close(fd)
            continue
        stale = _holder(lock, fd) if os.fstat(fd).st_size else None
        started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
        record = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": started})
        os.ftruncate(fd, 0)
        os.pwrite(fd, (record + "\n").encode(), 0)
        return fd, stale
    raise TrainError(f"{target}: its lock file keeps changing under this run; is another run starting there?")


def claim_output(output: str | Path, *, resuming: bool) -> OutputClaim:
    """Claim `output` for one run (see the module docstring). Raises TrainError (exit 2), touching nothing, when
    `output` is a file, is in use by a live run, or holds files and the run does not resume (naming the
    checkpoint to resume from when it holds some), or holds files that are not a run's (no `checkpoint-N`, no
    `metrics.jsonl`) though it resumes."""
    target = Path(output)
    if target.exists() and not target.is_dir():
        raise TrainError(f"{target}: exists and is not a folder; pick another -o")
    lock = target / LOCK_NAME
    if target.is_dir():
        if _is_locked(lock):
            raise _in_use(target, _holder(lock))
        held = [p for p in target.iterdir() if p.name != LOCK_NAME and not is_partial(p.name)]
        ckpts = checkpoint_dirs(target)
        if held and not resuming and ckpts:
            raise TrainError(f"{target}: holds {ckpts[-1].name} of an earlier run: continue it with --resume, "
                             "or pick another -o")  # fmt: skip
        a_run = ckpts or (target / "metrics.jsonl").is_file()  # what a run leaves: resuming writes over it
        if held and not (resuming and a_run):
            what = " and holds no run's checkpoints" if resuming else ""
            raise TrainError(f"{target}: already exists and is not an empty folder{what}; remove it or pick another")
    created = not target.exists()
    try:
        target.mkdir(parents=True, exist_ok=True)
        before = {p.name for p in target.iterdir()}
        fd, stale = _lock(target)
    except OSError as err:
        raise TrainError(f"{target}: cannot claim it as the output folder ({err.strerror or err})") from None
    claim = OutputClaim(target, fd, created, before - {LOCK_NAME}, [])
    try:
        if stale is not None:
            claim.notes.append(f"{target}: took over the lock of a run that ended without releasing it ({stale})")
        for p in target.iterdir():  # what a killed run was writing: ours by name, and no live run writes here
            if is_partial(p.name) and p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
                claim.notes.append(f"{target}: removed {p.name}, left half-written by a run that was killed")
    except BaseException:
        claim.release(keep=True)
        raise
    return claim


class Interrupt(BaseException):
    """A signal that stops the run at once (before the training loop, or a second one): `signum`."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class StopSignals:
    """Within, SIGTERM, SIGHUP and SIGINT stop the run (see the module docstring): at once (`Interrupt`) until
    `deferring` is set, then the first one is noted in `signum` for the step hook and a second stops at once.
    Installed only in the main thread (Python delivers signals there) and when `enabled`; the previous
    handlers come back on exit."""

    SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)

    def __init__(self, enabled: bool = True):
        self.enabled = enabled and threading.current_thread() is threading.main_thread()
        self.deferring = False
        self.signum: int | None = None
        self._previous: dict[int, object] = {}

    def _handle(self, signum: int, frame) -> None:
        if self.deferring and self.signum is None:
            self.signum = signum
            note = f"\nlinnet train: {self.name()}: saving a checkpoint after the step in progress (again: stop now)\n"
            with contextlib.suppress(OSError):  # os.write: no buffered stream to re-enter; a hung-up terminal
                os.write(2, note.encode())
            return
        self.deferring = False
        raise Interrupt(signum)

    def __enter__(self) -> StopSignals:
        if self.enabled:
            for s in self.SIGNALS:
                self._previous[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc) -> bool:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        return False

    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum else ""


def fsync_tree(folder: Path) -> None:
    """fsync every file under `folder` and the folders themselves, so a rename of `folder` publishes data that is
    on disk (a machine that loses power keeps either the whole checkpoint or none of it)."""
    for root, dirs, files in os.walk(folder):
        for name in files + dirs + ["."]:
            path = os.path.join(root, name)
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError:
                continue
            try:
                os.fsync(fd)
            except OSError as err:
                if err.errno not in (errno.EINVAL, errno.EBADF):  # a filesystem without fsync on folders
                    raise
            finally:
                os.close(fd)
