"""Linnet: a statically checked language for neural-network models.

The front end (syntax, semantics, ops, the std library) is importable without torch, jax or
onnx. Public entry points:

- `linnet.check(source, path=None)`: diagnostics of a source text or file;
- `linnet.load(source, weights=None, backend="torch", ...)`: a model on any backend of the
  registry (`linnet.runtimes.backends`), numpy in and out (`LoadedModel`);
- `linnet.train(source, weights, data=..., output=..., method="sft")`: train a model from the same source
  (`linnet.runtimes.train.run.train`);
- `linnet.semantics.program.Document`: the incremental document model (language server);
- the `linnet` command line (`linnet.cli`).
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["check", "load", "train", "__version__"]


def check(source: str, path: str | None = None):
    """Check a Linnet source: `source` is the text, or a path when `path` is None and a file
    of that name exists. Returns the list of `Diagnostic`s (errors and warnings), each naming
    the configs it occurs under. Raises OSError when a path cannot be read."""
    from pathlib import Path

    from .semantics.program import Document

    if path is None and "\n" not in source and source.endswith(".linnet") and Path(source).is_file():
        path, source = source, Path(source).read_text(encoding="utf-8")
    return Document(path or "<source>", source).analyze().diagnostics


def load(source, weights=None, backend: str = "torch", **kwargs):
    """Load `source` with `weights` on `backend` (a name of `linnet.runtimes.backends.BACKENDS`:
    `torch-interpret`, `torch`, `torch-compile`, `cuda-graphs`, `jax`, `xla`, `onnxruntime`), with
    the common options of `Backend.load` (`preset`, `config`, `dtype`, `numerics`, `device`,
    `max_batch`, `max_positions`, `random_weights`, `seed`, ...). Returns a `LoadedModel`: numpy in,
    numpy out. Raises `linnet.errors.LinnetError` (BackendError, LoadError) or OSError."""
    from .runtimes.backends import get_backend

    return get_backend(backend).load(source, weights, **kwargs)


def train(source, weights=None, **kwargs):
    """Train `source` with `weights` (`data=` a JSONL file, `output=` the folder to write, `method=` "sft" (LoRA),
    "full", "dpo" or "grpo", `lora=LoraSettings(...)`, `resume=True` or a checkpoint folder, and `TrainConfig`
    fields such as `max_steps`, `learning_rate`, `save_steps`). Returns a `TrainResult` (per-step metrics, the
    trained model, the output folder). Raises `linnet.errors.LinnetError` (TrainError, LoadError, BackendError;
    TrainInterrupted when a signal stopped it). See `linnet.runtimes.train.run.train`."""
    from .runtimes.train.run import train as _train

    return _train(source, weights, **kwargs)
