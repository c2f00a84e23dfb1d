"""How many threads a CLI process gives PyTorch: the cores this process may use, less those other processes keep busy.

`os.cpu_count()` counts the machine's cores, not the ones a container, `taskset` or a batch scheduler lets this
process run on (its CPU affinity, `os.sched_getaffinity`). PyTorch's default intra-op thread count comes from the
machine (its physical cores), so a process pinned to 2 of 64 cores would run 32 threads on 2 cores, each waiting
for the others. And a core that another process keeps busy is not one this process can use either: OpenMP's
threads wait for each other at every op, so one thread that shares its core runs the whole op at that core's
share. Measured on SmolLM2-135M, eager PyTorch on 2 cores that other jobs kept busy (load average 5.5): 2 threads
gave 1.3 tokens/s and a 4.9 s first token, 1 thread 8.6 tokens/s and 0.24 s.

So `choose_torch_threads` counts the cores of the affinity that sat idle over a short sample (`idle_cores`, from
the per-CPU counters of `/proc/stat`, which name the same CPUs as the affinity, in a container too) and runs that
many threads, at least 1, at most the affinity's size. Where `/proc/stat` cannot be read (macOS, Windows) it runs
one thread per core of the affinity. `OMP_NUM_THREADS`, when set to a positive integer, is the user's choice and is
kept (PyTorch reads it at start, and caps it at the cores it sees); another value is ignored, with a warning.

A backend whose compiled kernels are specialised to the thread count (torch.compile: inductor's CPU kernels, and
its FX graph cache key, depend on it) gets the affinity's size, idle or not: a count that followed the load would
differ between runs and miss the persistent cache, recompiling for tens of seconds to save a share of a core.
"""

from __future__ import annotations

import os
import time

from linnet.semantics.parallel import usable_cpus

__all__ = ["usable_cores", "idle_cores", "choose_torch_threads", "set_torch_threads"]

SAMPLE_S = 0.1  # long enough for 10 clock ticks (USER_HZ is 100) per core


def usable_cores() -> set[int]:
    """The CPUs this process may run on: its CPU affinity where the platform has one (Linux), else all of
    `os.cpu_count()`'s; never empty (`linnet.semantics.parallel.usable_cpus`)."""
    return usable_cpus()


def _cpu_times(stat: str = "/proc/stat") -> dict[int, tuple[int, int]]:
    """(idle jiffies, total jiffies) per CPU number, from /proc/stat's `cpuN` lines (idle counts idle and iowait;
    total counts user, nice, system, idle, iowait, irq, softirq and steal: guest time is inside user already)."""
    out = {}
    with open(stat, encoding="ascii") as f:
        for line in f:
            name, *fields = line.split()
            if name.startswith("cpu") and name[3:].isdigit():
                ticks = [int(x) for x in fields[:8]]
                out[int(name[3:])] = (ticks[3] + ticks[4], sum(ticks))
    return out


def idle_cores(cpus: set[int], sample_s: float = SAMPLE_S) -> float | None:
    """How many of `cpus` sat idle over the next `sample_s` seconds (0.0 to len(cpus)), or None where the per-CPU
    counters cannot be read."""
    try:
        before = _cpu_times()
        time.sleep(sample_s)
        after = _cpu_times()
    except (OSError, ValueError, IndexError):
        return None
    idle = 0.0
    for cpu in cpus:
        if cpu not in before or cpu not in after:
            return None
        d_idle, d_total = (a - b for a, b in zip(after[cpu], before[cpu]))
        idle += d_idle / d_total if d_total > 0 else 1.0
    return idle


def choose_torch_threads(follow_load: bool = True) -> tuple[int, str]:
    """(threads, why): the idle cores of this process's affinity, rounded to the nearest, at least 1; the
    affinity's size where idleness cannot be measured or `follow_load` is false. Does not read `OMP_NUM_THREADS`
    (see `set_torch_threads`)."""
    cpus = usable_cores()
    idle = idle_cores(cpus) if follow_load else None
    if idle is None:
        return len(cpus), "the cores this process may use"
    n = max(1, min(len(cpus), round(idle)))
    if n == len(cpus):
        return n, "the cores this process may use"
    return n, f"{idle:.1f} of the {len(cpus)} cores this process may use are idle"


def set_torch_threads(follow_load: bool = True) -> str:
    """Set PyTorch's intra-op threads (`choose_torch_threads(follow_load)`; false for a backend whose compiled
    kernels are specialised to the thread count) unless `OMP_NUM_THREADS` is set to a positive integer; returns what
    was chosen and why, for the load line ("torch threads 2 (the cores this process may use)"). With
    `OMP_NUM_THREADS` the count is the one PyTorch took from it, said to be capped where PyTorch lowered it
    ("torch threads 2 (OMP_NUM_THREADS=7, capped by PyTorch at 2)"); a value that is not a positive integer
    ("abc", "0") is ignored with a warning in the line, and Linnet's own choice applies."""
    import torch

    raw = os.environ.get("OMP_NUM_THREADS", "")
    ignored = ""
    if raw.strip():
        value = raw.strip()
        if value.isdigit() and int(value) > 0:
            n = torch.get_num_threads()  # what PyTorch made of it: it caps the count at the cores it sees
            if n == int(value):
                return f"torch threads {n} (OMP_NUM_THREADS)"
            return f"torch threads {n} (OMP_NUM_THREADS={value}, capped by PyTorch at {n})"
        ignored = f"; warning: OMP_NUM_THREADS={raw!r} is not a positive integer, ignored"
    n, why = choose_torch_threads(follow_load)
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    return f"torch threads {n} ({why}{ignored})"
