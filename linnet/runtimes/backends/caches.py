"""The persistent compile caches: one folder, one subfolder per framework, and what a compile found there.

    from linnet.runtimes.backends import caches

    caches.enable("jax")                 # JAX's compilation cache in <root>/jax (before the first compile)
    with caches.watch("jax") as report:  # what the block compiled, and whether the cache had it
        model.step_model().warm_up([21], [1])
    print(report.describe())             # "compile 0.41 s (cache hit: 3 programs from ~/.cache/linnet/jax)"

The folder (`cache_root`): `$LINNET_CACHE_DIR` when set, else `$XDG_CACHE_HOME/linnet`, else `~/.cache/linnet`;
`LINNET_NO_CACHE=1` turns every persistent cache off. Its subfolders:
- `jax/`: JAX's persistent compilation cache (`jax_compilation_cache_dir`, with the thresholds at zero so that the
  small programs of a CPU run are cached too: by default JAX writes only programs that took over a second). Keyed
  by JAX from the StableHLO module, the jaxlib version, the device and the compile options.
- `inductor/`: TorchInductor's caches (`TORCHINDUCTOR_CACHE_DIR`: the FX graph cache, AOTAutograd's cache and the
  compiled kernels) unless `TORCHINDUCTOR_CACHE_DIR` is already set, which is then kept. Dynamo still traces the
  Python code in every process; what the cache saves is inductor's code generation and the C++ compile.
- `onnxruntime/`: ONNX Runtime's optimized models (`SessionOptions.optimized_model_filepath`), one folder per key, a
  SHA-256 of the serialized graph, the weights' bytes, the ORT version, the provider and the optimization level
  (`ort_key`), so a model whose graph or weights changed never finds a stale file. Only the CPU provider's
  sessions are cached: other providers' optimized graphs can hold nodes assigned to that provider, and only the
  CPU's were tried.

`embedded/` (not a compile cache) holds the extracted copies of embedded checkpoints
(`linnet.runtimes.formats.embedded`); `lsp/` the code objects of the methods the language server's start generates
(`linnet.lsp.startup`).
`linnet cache info` shows the folders and their sizes, `linnet cache clear` removes them (deleting the folder by
hand is as good: every cache is rebuilt on the next run).

Nothing here imports a framework at import time; `enable` and `watch` import the one they are asked about.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "CompileReport",
    "FRAMEWORKS",
    "FOLDERS",
    "cache_root",
    "cache_dir",
    "enable",
    "watch",
    "record",
    "info",
    "clear",
    "unusable",
    "ort_key",
]

FRAMEWORKS = ("jax", "inductor", "onnxruntime")
# the folders `linnet cache` lists and clears: the compile caches, and `embedded/`, the extracted copies of embedded
# checkpoints (`linnet.runtimes.formats.embedded`; one per package install, so reinstalls leave stale ones),
# re-extracted
# on next use
# and `lsp/`, the code the language server's start compiles (`linnet.lsp.startup`: attrs', dataclasses' and
# cattrs's generated methods, rebuilt by the next start)
FOLDERS = (*FRAMEWORKS, "embedded", "lsp")
# a backend family (`Backend.family`) -> the framework whose cache it uses
FAMILY_CACHE = {"jax": "jax", "torch": "inductor", "onnx": "onnxruntime"}
ENV_DIR, ENV_OFF = "LINNET_CACHE_DIR", "LINNET_NO_CACHE"
# what one cache entry of each framework is, as the compile line counts them, and what making one is
ENTRY_NOUN = {"jax": "program", "inductor": "FX graph", "onnxruntime": "optimized model"}
ENTRY_VERB = {"program": "compiled", "FX graph": "compiled", "optimized model": "made"}

# compiles seen in this process, per framework: [cache hits, cache misses, compiles that skip the cache] (ORT's
# are recorded by the ONNX Runtime backend through `record`; JAX's by a monitoring listener; inductor's are read
# from its counters)
_COUNTS: dict[str, list[int]] = {"jax": [0, 0, 0], "onnxruntime": [0, 0, 0]}
_ENABLED: dict[str, Path] = {}
_JAX_LISTENING = False


def cache_root() -> Path | None:
    """The cache folder: `$LINNET_CACHE_DIR`, else `$XDG_CACHE_HOME/linnet`, else `~/.cache/linnet` (the XDG base
    directory default); None when `LINNET_NO_CACHE` is set to anything but "" or "0"."""
    if os.environ.get(ENV_OFF, "") not in ("", "0"):
        return None
    if os.environ.get(ENV_DIR):
        return Path(os.environ[ENV_DIR]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "linnet"


def cache_dir(framework: str) -> Path | None:
    """The folder of `framework`'s cache ("jax", "inductor", "onnxruntime"; or "embedded", the extracted embedded
    checkpoints, or "lsp", the language server's generated code) under `cache_root`, None when caching is off.
    Raises ValueError for another name."""
    if framework not in FOLDERS:
        raise ValueError(f"no cache for {framework!r} (caches: {', '.join(FOLDERS)})")
    root = cache_root()
    return None if root is None else root / framework


_UNUSABLE: dict[Path, str | None] = {}


def unusable(root: Path | None = None) -> str | None:
    """Why the cache folder `root` (default `cache_root()`) cannot hold a cache, or None when it can (or caching is
    off): it, or the nearest folder above it that exists, must be a folder this process may write in (a missing
    folder is made by the first compile). Checked once per folder per process, creating nothing. The reason reads
    "<folder> is not a writable folder"."""
    root = cache_root() if root is None else root
    if root is None:
        return None
    if root not in _UNUSABLE:
        probe = root
        while not os.path.lexists(probe) and probe.parent != probe:
            probe = probe.parent
        ok = probe.is_dir()
        if ok:  # a real try, not os.access: root may write where permission bits say no, yet not in /proc
            try:
                os.rmdir(tempfile.mkdtemp(prefix=".linnet-probe-", dir=probe))
            except OSError:
                ok = False
        _UNUSABLE[root] = None if ok else f"{_short(root)} is not a writable folder"
    return _UNUSABLE[root]


def enable(family: str) -> Path | None:
    """Turn on the persistent cache of backend family `family` ("jax", "torch", "onnx") for this process, in
    `cache_dir`; returns the folder, or None when caching is off (`LINNET_NO_CACHE`). For JAX call it before the
    first compile you want cached (it resets JAX's cache state, so earlier compiles are simply not cached); for
    inductor it sets `TORCHINDUCTOR_CACHE_DIR` (read by inductor at each compile; a value the user set is kept, and
    returned) and turns the FX graph cache on; ONNX Runtime's is used by the backend's `make_session` when enabled
    here. A cache folder that cannot be written (`unusable`: a regular file, a folder without write permission)
    leaves caching off, as `LINNET_NO_CACHE` does, and returns None; the compile line says why. Idempotent."""
    framework = FAMILY_CACHE[family]
    folder = cache_dir(framework)
    if folder is None or unusable() is not None:
        _ENABLED.pop(framework, None)
        return None
    if framework == "inductor" and _ENABLED.get(framework) is None and os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
        folder = Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])  # the user's choice
    if _ENABLED.get(framework) == folder:
        return folder
    if framework == "jax":
        _enable_jax(folder)
    elif framework == "inductor":
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(folder)
        # inductor's FX graph cache on; through its variable while inductor is not imported yet, since importing its
        # config imports torch._dynamo (~2 s), which a model compiles with only at its first call
        config = sys.modules.get("torch._inductor.config")
        if config is not None:
            config.fx_graph_cache = True
        else:
            os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "1")
    _ENABLED[framework] = folder
    return folder


def _enable_jax(folder: Path) -> None:
    import jax
    from jax.experimental.compilation_cache import compilation_cache

    jax.config.update("jax_compilation_cache_dir", str(folder))
    # JAX writes only programs that compiled for over 1 s by default; a CPU decode step takes less
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)  # -1: no size threshold
    compilation_cache.reset_cache()  # re-read the folder at the next compile
    global _JAX_LISTENING
    if not _JAX_LISTENING:
        from jax import monitoring

        monitoring.register_event_listener(_on_jax_event)
        _JAX_LISTENING = True


def _on_jax_event(event: str, **_: object) -> None:
    # every compile that asks the persistent cache records "compile_requests_use_cache", then a hit or not
    if event == "/jax/compilation_cache/compile_requests_use_cache":
        _COUNTS["jax"][1] += 1
    elif event == "/jax/compilation_cache/cache_hits":
        _COUNTS["jax"][0] += 1
        _COUNTS["jax"][1] -= 1


def enabled(framework: str) -> Path | None:
    """The folder of `framework`'s cache when `enable` turned it on in this process, else None."""
    return _ENABLED.get(framework)


def record(framework: str, hit: bool | None) -> None:
    """Count one compile of `framework` (the ONNX Runtime backend's sessions): a persistent-cache hit (True), a
    miss (False), or a compile that does not use the cache (None)."""
    _COUNTS[framework][{True: 0, False: 1, None: 2}[hit]] += 1


def _counts(framework: str) -> tuple[int, int, int]:
    """(hits, misses, uncached compiles) of `framework` so far in this process."""
    if framework == "inductor":
        import sys

        if "torch._dynamo.utils" not in sys.modules:
            return 0, 0, 0
        from torch._dynamo.utils import counters

        return counters["inductor"]["fxgraph_cache_hit"], counters["inductor"]["fxgraph_cache_miss"], 0
    hits, misses, uncached = _COUNTS[framework]
    return hits, misses, uncached


@dataclass
class CompileReport:
    """What one block compiled (`watch`): `what` ("compile", "session build", or "" when nothing compiles, as in
    eager PyTorch), `seconds` (wall time of the block), `hits`/`misses` (persistent-cache lookups: programs found
    in the cache, programs compiled and written to it), `uncached` (compiles that skip the cache: ONNX Runtime
    sessions of other providers than the CPU's), `folder` (the cache folder; None when caching is off), `noun`
    (what one entry is: "program", "FX graph", "optimized model")."""

    what: str
    seconds: float = 0.0
    hits: int = 0
    misses: int = 0
    uncached: int = 0
    folder: Path | None = None
    noun: str = "program"

    @property
    def cache(self) -> str:
        """ "hit" (everything came from the cache), "miss" (everything compiled), "partial" (some of each), "off"
        (no persistent cache), or "none" (nothing was compiled)."""
        if self.folder is None or (self.uncached and not self.hits and not self.misses):
            return "off"
        if self.hits and self.misses:
            return "partial"
        if self.hits:
            return "hit"
        if self.misses:
            return "miss"
        return "none"

    def describe(self) -> str:
        """The report as it is printed: "compile 0.41 s (cache hit: 3 programs from ~/.cache/linnet/jax)"."""
        if not self.what:
            return "no compile (eager)"
        folder = _short(self.folder) if self.folder is not None else ""
        why = {
            "hit": f"cache hit: {self._count(self.hits)} from {folder}",
            "miss": f"cache miss: {self._count(self.misses)} {ENTRY_VERB[self.noun]} and written to {folder}",
            "partial": f"partial cache hit: {self._count(self.hits)} from {folder}, {self.misses} "
            f"{ENTRY_VERB[self.noun]} and written there",
            "off": "compiled, not cached" + self._why_off(),
            "none": "nothing compiled: already compiled in this process",
        }[self.cache]
        return f"{self.what} {self.seconds:.2f} s ({why})"

    def _why_off(self) -> str:
        if cache_root() is None:
            return f" ({ENV_OFF} is set)"
        reason = unusable() if self.folder is None else None
        return f"; cache off: {reason}" if reason else ""

    def _count(self, n: int) -> str:
        return f"{n} {self.noun}{'s' if n != 1 else ''}"


def _short(path: Path) -> str:
    """`path` with the home folder as `~`."""
    home = str(Path.home())
    text = str(path)
    return "~" + text[len(home) :] if text == home or text.startswith(home + os.sep) else text


@contextmanager
def watch(family: str, what: str = "compile") -> Iterator[CompileReport]:
    """Time the block and count the persistent-cache lookups of family `family`'s framework in it; the report is
    filled in when the block ends. `what` names the work ("compile", "session build"; "" for none)."""
    framework = FAMILY_CACHE[family]
    report = CompileReport(what, folder=enabled(framework), noun=ENTRY_NOUN[framework])
    before = _counts(framework)
    start = time.perf_counter()
    try:
        yield report
    finally:
        report.seconds = time.perf_counter() - start
        report.hits, report.misses, report.uncached = (b - a for a, b in zip(before, _counts(framework)))


def ort_key(graph: bytes, weights: list, provider: str, optimization: str) -> str:
    """The cache key of an ONNX Runtime optimized model: SHA-256 over the serialized graph (its large weights
    left out as external data), each weight's name, dtype, shape and bytes (`weights`: (name, numpy array)
    pairs, in order), the onnxruntime version, the provider and the optimization level."""
    import onnxruntime

    digest = hashlib.sha256()
    for part in (onnxruntime.__version__, provider, optimization):
        digest.update(part.encode() + b"\0")
    digest.update(graph)
    for name, array in weights:
        digest.update(f"{name}\0{array.dtype.str}\0{array.shape}\0".encode())
        digest.update(array.reshape(-1).view("u1"))  # the bytes (bf16 included, which memoryview cannot take)
    return digest.hexdigest()[:32]


def info() -> list[tuple[str, Path | None, int]]:
    """(framework, folder, bytes used) per cache folder of `FOLDERS` (the compile caches, then "embedded"; the
    folder None when caching is off)."""
    out = []
    for framework in FOLDERS:
        folder = cache_dir(framework)
        size = 0
        if folder is not None and folder.is_dir():
            size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file() and not f.is_symlink())
        out.append((framework, folder, size))
    return out


def clear(frameworks: tuple[str, ...] = FOLDERS) -> list[Path]:
    """Remove the cache folders of `frameworks` (each is rebuilt by the next run that compiles, the embedded
    checkpoints' copies by their next use). Returns the folders removed. Raises OSError when one cannot be
    removed."""
    removed = []
    for framework in frameworks:
        folder = cache_dir(framework)
        if folder is not None and folder.is_dir():
            shutil.rmtree(folder)
            removed.append(folder)
    return removed
