"""`--dtype stored` on the JAX backends (`jax`, `xla`): a GGUF file's Q8_0 matrices held on the device as stored,
int8 codes and their f16 scales (one per block of 32 values of a row), about 1.06 bytes a weight, so that an
8B-parameter Llama fits a 16 GB accelerator (8.5 GB) where bf16 (16 GB) does not.

What the loader hands over (`linnet.runtimes.formats.gguf_quants`): each quantized matrix as a `GroupQuantized`
(u8 codes c = q + 128, f32 scales d, offsets -128 d, so W = (c - 128) d). `held_pair` turns it back into what the
file holds, i8 codes q and f16 scales d (both exact: d was an f16), and `linnet.compiler.jax` reads the pair
(`codegen`'s docstring): a linear layer dequantizes it as its dot's operand, inside the jitted step, a row lookup
dequantizes the rows it reads, so neither the embeddings nor lm_head are ever held dequantized.

Only Q8_0 is kept so: `stored_matrices` refuses any other quantized type before a tensor is read, naming the
tensors and their types (dequantizing them to f32 or bf16 would need the memory `--dtype stored` is there to save;
`--dtype f32` dequantizes them on purpose, and the torch and onnxruntime backends keep every type of
`gguf_quants.STORED_TYPES`). Activations, norms and the KV cache are f32, as on every backend under
`--dtype stored`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from linnet.errors import LoadError
from linnet.runtimes.formats.gguf_quants import GroupQuantized
from linnet.runtimes.formats.gguf_reader import PLAIN_TYPES

if TYPE_CHECKING:
    from linnet.runtimes.loading import Prepared

__all__ = ["JAX_STORED_TYPES", "stored_matrices", "held_pair", "concat_pairs"]

JAX_STORED_TYPES = {"q8_0": 32}  # the GGUF types the JAX backends hold quantized -> values per scale


def stored_matrices(prepared: Prepared) -> dict[str, int]:
    """The parameters of `prepared` (a `--dtype stored` load: `prepared.stored`) whose tensors are quantized, by
    parameter path -> values per scale; {} when it is not a stored load. Reads the checkpoint's headers only.

    Raises LoadError naming each tensor (up to 4, and how many) of a quantized type the JAX backends do not hold
    quantized, with its type."""
    if not prepared.stored:
        return {}
    ckpt = prepared.checkpoint
    types = {path: ckpt.dtype(name) for path, name in prepared.plan.items()}
    quantized = {path: t for path, t in types.items() if t not in PLAIN_TYPES}
    other = {path: t for path, t in quantized.items() if t not in JAX_STORED_TYPES}
    if other:
        few = ", ".join(f"`{prepared.plan[path]}` ({t})" for path, t in list(other.items())[:4])
        more = f" and {len(other) - 4} more" if len(other) > 4 else ""
        raise LoadError(
            f"--dtype stored on the JAX backends holds {', '.join(JAX_STORED_TYPES)} matrices quantized, but "
            f"{ckpt.source} has {few}{more}; load it dequantized (--dtype f32 or bf16), or keep those types "
            "quantized on --backend torch or onnxruntime"
        )
    return {path: JAX_STORED_TYPES[t] for path, t in quantized.items()}


def held_pair(q: GroupQuantized, name: str = "tensor") -> tuple[np.ndarray, np.ndarray]:
    """A Q8_0 matrix as the device holds it: (codes i8[N, K], scales f16[N, K / 32]), W = codes * scales, exactly
    what `q.dequantize()` was. Consumes `q` (the loader's own arrays): its writeable codes become the i8 codes in
    place, so an 8B model's 8 GB of codes are not copied once more on the host. Raises LoadError naming `name`
    for another type (`stored_matrices` refuses those first)."""
    if q.ggml_type not in JAX_STORED_TYPES or q.group != JAX_STORED_TYPES[q.ggml_type]:
        held = ", ".join(JAX_STORED_TYPES)
        raise LoadError(f"`{name}`: {q.ggml_type} is not held quantized on JAX (it holds {held})")
    out = q.codes if q.codes.flags.writeable and q.codes.flags.c_contiguous else None
    codes = np.bitwise_xor(q.codes, np.uint8(0x80), out=out).view(np.int8)  # c - 128 in two's complement: q
    return codes, q.scales.astype(np.float16)


def concat_pairs(pairs: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Quantized matrices stacked along their rows (a fused group's members: q/k/v, gate/up), codes and scales
    each concatenated: the pair of the stacked matrix (the blocks run along each row)."""
    return np.concatenate([c for c, _ in pairs]), np.concatenate([s for _, s in pairs])
