"""How many threads a CLI process gives the framework it runs: the cores this process may actually use.

`os.cpu_count()` counts the machine's cores, not the ones a container, `taskset` or a batch scheduler lets this
process run on (its CPU affinity, `os.sched_getaffinity`); PyTorch's default intra-op thread count comes from the
machine (its physical cores), so a process pinned to 2 of 64 cores would run 32 threads on 2 cores, each waiting
for the others. `OMP_NUM_THREADS`, when set, is the user's choice and is kept (PyTorch reads it at start).
"""

from __future__ import annotations

import os

__all__ = ["usable_cores", "set_torch_threads"]


def usable_cores() -> int:
    """The number of cores this process may run on: its CPU affinity where the platform has one (Linux), else
    `os.cpu_count()`; at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # macOS and Windows have no sched_getaffinity
        return max(1, os.cpu_count() or 1)


def set_torch_threads() -> str:
    """Set PyTorch's intra-op threads to `usable_cores()` unless `OMP_NUM_THREADS` is set; returns what was chosen
    and why, for the load line ("torch threads 2 (the cores this process may use)")."""
    import torch

    if os.environ.get("OMP_NUM_THREADS"):
        return f"torch threads {torch.get_num_threads()} (OMP_NUM_THREADS)"
    n = usable_cores()
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    return f"torch threads {n} (the cores this process may use)"
