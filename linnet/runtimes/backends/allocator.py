"""glibc malloc settings for eager PyTorch on the CPU: freed activations stay in the heap for the next op.

PyTorch has no caching allocator on the CPU: every intermediate tensor is a `malloc` and, once its last use has
passed (the generated module `del`s it there), a `free`. glibc returns the top of its heap to the kernel whenever
more than M_TRIM_THRESHOLD is free there, and serves large blocks with `mmap` (M_MMAP_THRESHOLD, which it raises
as such blocks are freed, at most to 32 MiB), so the next op's tensor lands on pages the kernel must fault in and
zero again. A 512-token prefill of SmolLM2-135M took 90,000 minor faults in f32 (350 MB of fresh pages) and
15,000-23,000 in bf16. Measured here (2 threads, an Intel Xeon with AVX-512, `linnet` generated, `equivalent`,
one process a setting, prefill after two warm-ups):

    setting                                            f32 prefill ms (faults)   bf16 prefill ms (faults)
    glibc's defaults                                   696 (90,490)              251 (15,037)
    mmap threshold 32 MiB, trim threshold 128 MiB      581 (192)                 210 (0)
    mmap threshold 32 MiB, trim threshold 256 MiB      570 (0)                   213 (22)

(transformers eager on the same machine and prompt, which keeps more of its activations alive: 603 ms f32 with
32,000 faults and 560 ms with these settings; 185 ms bf16 with 373 faults and 195 ms with them).

Fixing the thresholds also stops glibc adjusting them: blocks of 32 MiB or more are still mapped and unmapped (a
whole-prompt logits tensor), and up to TRIM_THRESHOLD of freed heap stays resident between prompts in each malloc
arena that ran a prefill (the thread that runs the model: one arena for `linnet generate` and for `linnet serve`'s
engine thread; a program running models on several threads keeps up to that much for each). Peak RSS is unchanged
(the pages were touched by the prefill anyway: 974 against 970 MB f32, 680 against 684 bf16). `mallopt` (glibc's
malloc.h, mallopt(3)) sets them for the process: so `keep_freed_heap` does nothing where the user chose malloc
settings (any `MALLOC_*` environment variable, glibc's own tunables for them, or `LINNET_MALLOC=default`), nor where
the C library is not glibc.

`release_freed_heap` is the other direction, for a one-off: after a model's weights were built and handed over (an
ONNX Runtime session made), it returns the heap pages freed since to the kernel (`malloc_trim`), which glibc would
otherwise keep where they lie below memory still in use.
"""

from __future__ import annotations

import ctypes
import os
import sys

__all__ = ["keep_freed_heap", "release_freed_heap", "MMAP_THRESHOLD", "TRIM_THRESHOLD"]

M_TRIM_THRESHOLD = -1  # glibc's malloc.h
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # bytes: glibc's own ceiling for its dynamic threshold (64-bit)
TRIM_THRESHOLD = 256 << 20  # bytes: more than a 512-token f32 prefill of SmolLM2 frees between its ops

_applied: bool | None = None


def keep_freed_heap() -> bool:
    """Sets glibc's M_MMAP_THRESHOLD to `MMAP_THRESHOLD` and M_TRIM_THRESHOLD to `TRIM_THRESHOLD` bytes for this
    process (see the module docstring), once; returns whether they are set. False, changing nothing, off Linux,
    without glibc, or where the user chose malloc settings (`MALLOC_*` variables, `GLIBC_TUNABLES`, or
    `LINNET_MALLOC=default`)."""
    global _applied
    if _applied is None:
        _applied = _set()
    return _applied


def release_freed_heap() -> bool:
    """Returns the free pages of this process's malloc heaps to the kernel (glibc's `malloc_trim(0)`, malloc_trim(3):
    every arena, free pages inside the heap as well as at its top); whether any were. 10 ms for 250 MiB freed in
    blocks of 64 KiB here. False, changing nothing, off Linux, without glibc, or under `LINNET_MALLOC=default`."""
    libc = _glibc()
    if libc is None or os.environ.get("LINNET_MALLOC") == "default":
        return False
    trim = libc.malloc_trim
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim(0) == 1


def _glibc():
    """The process's C library when it is glibc on Linux, else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 (glibc only: musl's mallopt does nothing)
    except (OSError, AttributeError):
        return None
    return libc


def _set() -> bool:
    if os.environ.get("LINNET_MALLOC") == "default":
        return False
    if "GLIBC_TUNABLES" in os.environ or any(k.startswith("MALLOC_") for k in os.environ):
        return False
    libc = _glibc()
    if libc is None:
        return False
    mallopt = libc.mallopt
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
