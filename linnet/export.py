"""`linnet.export`: a loaded (or fine-tuned) model written in the formats other engines read, one function per
format, each importing its writer lazily (nothing heavy at `import linnet.export`).

    import linnet.torch, linnet.export
    model = linnet.torch.load("examples/llama.linnet", weights="smollm2-135m-instruct")
    linnet.export.hf(model, "smollm2-hf", dtype="bf16")  # transformers, vLLM, SGLang, TGI load the folder
    linnet.export.gguf(model, "smollm2.gguf", type="q8_0")  # llama.cpp, Ollama, LM Studio load the file
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

__all__ = ["hf", "gguf"]


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
    `linnet.runtimes.export_hf.export_hf` and docs/exports.md."""
    from linnet.runtimes.export_hf import export_hf

    return export_hf(model, out_dir, dtype=dtype, max_shard_size=max_shard_size)


def gguf(model: Any, out_path: str | os.PathLike[str], type: str = "f32") -> Path:  # noqa: A002 (the CLI's --type)
    """Write `model` (what `linnet.torch.load` / `linnet.jax.load` / `linnet.onnx.load` return; its current
    parameters) as a GGUF file that llama.cpp runs: the Llama family's `llama.*` keys, llama.cpp's tensor names and
    Q/K layout, `tokenizer.ggml.*` metadata and the chat template. `type` is the type of the 2-D weights: "f32",
    "f16", "bf16", "q8_0", "q4_0" or "q4_1" (norms and other 1-D tensors stay f32). Returns the path written.
    Raises `linnet.errors.ExportError` for a family, rope type or tokenizer GGUF cannot express, naming it; an
    existing file is replaced only once the new one is complete, and nothing is left on disk after an error. See
    `linnet.runtimes.export_gguf.export_gguf` and docs/exports.md."""
    from linnet.runtimes.export_gguf import export_gguf

    return export_gguf(model, out_path, file_type=type)
