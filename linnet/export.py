"""`linnet.export`: a loaded (or fine-tuned) model written in the formats other engines read, one function per
format, each importing its writer lazily (nothing heavy at `import linnet.export`).

    import linnet.torch, linnet.export
    model = linnet.torch.load("examples/llama.linnet", weights="smollm2-135m-instruct")
    linnet.export.hf(model, "smollm2-hf", dtype="bf16")  # transformers, vLLM, SGLang, TGI load the folder
    linnet.export.gguf(model, "smollm2.gguf", type="q8_0")  # llama.cpp, Ollama, LM Studio load the file
    linnet.export.triton("examples/llama.linnet", "models", instances=2)  # Triton Inference Server serves it
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

__all__ = ["hf", "gguf", "triton"]


def hf(
    model: Any,
    out_dir: str | os.PathLike[str],
    dtype: str | None = None,
    max_shard_size: int | str = "5GB",
) -> list[Path]:
    """Write `model` (what `linnet.torch.load` / `linnet.jax.load` / `linnet.onnx.load` return) as a Hugging Face
    folder: config.json, safetensors (sharded above `max_shard_size`), generation_config.json and the tokenizer
    files. `dtype` "f32", "bf16" or "f16" casts the floating-point weights (None keeps the model's). Returns the
    files written. Raises `linnet.errors.ExportError` for a family or config Hugging Face cannot express and for an
    `out_dir` that exists and is not empty; nothing is left on disk after an error. See
    `linnet.runtimes.export.hf.export_hf` and docs/exports.md."""
    from linnet.runtimes.export.hf import export_hf

    return export_hf(model, out_dir, dtype=dtype, max_shard_size=max_shard_size)


def gguf(model: Any, out_path: str | os.PathLike[str], type: str = "f32") -> Path:  # noqa: A002 (the CLI's --type)
    """Write `model` (what `linnet.torch.load` / `linnet.jax.load` / `linnet.onnx.load` return; its current
    parameters) as a GGUF file that llama.cpp runs: the Llama family's `llama.*` keys, llama.cpp's tensor names and
    Q/K layout, `tokenizer.ggml.*` metadata and the chat template. `type` is the type of the 2-D weights: "f32",
    "f16", "bf16", "q8_0", "q4_0" or "q4_1" (norms and other 1-D tensors stay f32). Returns the path written.
    Raises `linnet.errors.ExportError` for a family, rope type or tokenizer GGUF cannot express, naming it; an
    existing file is replaced only once the new one is complete, and nothing is left on disk after an error. See
    `linnet.runtimes.export.gguf.export_gguf` and docs/exports.md."""
    from linnet.runtimes.export.gguf import export_gguf

    return export_gguf(model, out_path, file_type=type)


def triton(
    source: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    weights: str | os.PathLike[str] | None = None,
    preset: str | None = None,
    backend: str = "torch",
    dtype: str = "f32",
    max_batch: int = 8,
    max_positions: int = 768,
    instances: int = 1,
    name: str | None = None,
    python_path: list[str] | None = None,
) -> list[Path]:
    """Write a Triton Inference Server model repository `out_dir` serving `source` with `weights` (a path or an
    embedded id; the server loads them, nothing is read here) on `backend` through Linnet's serving engine:
    config.pbtxt (Python backend, decoupled for streaming, `instances` CPU instances of `max_batch` cache rows of
    `max_positions` positions each) and 1/model.py. `python_path`: folders put first on the stub's sys.path
    (default: tools/tritonserver.sh's numpy < 2 folder, which the stubs of Triton <= 2.51 need). Unlike `hf` and
    `gguf` it takes the source, not a loaded model: each server process loads its own. Returns the files written.
    Raises `linnet.errors.ExportError` for an `out_dir` that exists and is not empty, an unknown backend, a source
    without a `step` entry, or no `python_path` and no tools/tritonserver.sh install; nothing is left on disk
    after an error. See `linnet.runtimes.export.triton.export_triton` and docs/triton.md."""
    from linnet.runtimes.export.triton import export_triton

    return export_triton(
        source,
        out_dir,
        weights=weights,
        preset=preset,
        backend=backend,
        dtype=dtype,
        max_batch=max_batch,
        max_positions=max_positions,
        instances=instances,
        name=name,
        python_path=python_path,
    )
