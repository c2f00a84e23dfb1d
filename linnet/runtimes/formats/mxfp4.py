"""MXFP4 weights as GPT-OSS checkpoints store them, dequantized at load.

The OCP Microscaling format (MX v1.0, `MXFP4`): blocks of 32 FP4 E2M1 values sharing one E8M0 scale. openai/gpt-oss
stores each expert weight `W` (GptOssExperts' `gate_up_proj` [E, hidden, 2 * intermediate], `down_proj`
[E, intermediate, hidden]) as two uint8 tensors, laid out as transformers' `integrations/mxfp4.py`
(`_convert_moe_packed_tensors`) reads them:

- `W_blocks` u8[E, R, G, 16]: for expert e and output row r (R = W's last dim), the G * 32 input values of that row
  in blocks of 32, two FP4 codes per byte, the low nibble first;
- `W_scales` u8[E, R, G]: each block's scale, an exponent with bias 127 (value 2 ** (s - 127)).

A code's value is `FP4_VALUES[code]` (sign bit 3, then E2M1: 0, 0.5, 1, 1.5, 2, 3, 4, 6) times the scale, so
`W[e] = dequantized rows [R, G * 32]`, transposed to [G * 32, R]. Every dequantized value is a power of two times at
most 3 significant bits, exact in f32 and bf16 (a scale of 2 ** 128 overflows to Inf and is refused as any
non-finite weight is). Needs numpy only.
"""

from __future__ import annotations

import numpy as np

from linnet.errors import CheckpointError
from linnet.runtimes.formats.checkpoints import Checkpoint, cast_floating, check_finite

__all__ = ["FP4_VALUES", "dequantize_mxfp4", "mxfp4_shape", "QuantizedView", "quantized_view"]

# FP4 E2M1 by 4-bit code: transformers' `FP4_VALUES` (integrations/mxfp4.py), OCP MX v1.0 table 5.
FP4_VALUES = np.array(
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], dtype=np.float32
)
BLOCK = 32  # values per scale
SCALE_BIAS = 127


def mxfp4_shape(blocks: tuple[int, ...], scales: tuple[int, ...]) -> tuple[int, ...] | None:
    """The dequantized shape [E, G * 32, R] of blocks u8[E, R, G, 16] and scales u8[E, R, G], or None when the two do
    not fit that layout."""
    if len(blocks) != 4 or blocks[-1] != BLOCK // 2 or tuple(blocks[:-1]) != tuple(scales):
        return None
    e, r, g, _ = blocks
    return (e, g * BLOCK, r)


def dequantize_mxfp4(blocks: np.ndarray, scales: np.ndarray, dtype: str | np.dtype = "f32") -> np.ndarray:
    """The weight that MXFP4 `blocks` u8[E, R, G, 16] and `scales` u8[E, R, G] store: [E, G * 32, R] in `dtype`
    (a Linnet dtype name or a numpy dtype), as transformers' `convert_moe_packed_tensors` computes it: each byte's
    low nibble then high nibble looked up in `FP4_VALUES`, times `2 ** (scale - 127)` (`ldexp`, exact), rows of
    G * 32 values, then the last two axes swapped. Computed in f32 and rounded once to `dtype` (the same values as
    transformers' lookup in the target dtype: every product is exact in f32). Raises ValueError for shapes that do
    not fit the layout."""
    if mxfp4_shape(blocks.shape, scales.shape) is None or blocks.dtype != np.uint8 or scales.dtype != np.uint8:
        raise ValueError(
            f"MXFP4 takes blocks u8[E, R, G, 16] and scales u8[E, R, G], got {blocks.dtype}{list(blocks.shape)} and "
            f"{scales.dtype}{list(scales.shape)}"
        )
    e, r, g, half = blocks.shape
    values = np.empty((e, r, g, 2 * half), dtype=np.float32)
    values[..., 0::2] = FP4_VALUES[blocks & 0x0F]
    values[..., 1::2] = FP4_VALUES[blocks >> 4]
    exponents = scales.astype(np.int32) - SCALE_BIAS
    with np.errstate(over="ignore"):  # a scale of 2 ** 128 is Inf in f32 (and bf16): the loader refuses it
        np.ldexp(values, exponents[..., None], out=values)
    rows = values.reshape(e, r, g * 2 * half)
    return np.ascontiguousarray(cast_floating(rows.transpose(0, 2, 1), dtype))


class QuantizedView(Checkpoint):
    """A checkpoint whose MXFP4 pairs `W_blocks` / `W_scales` read as the one tensor `W` they store (dtype
    "mxfp4", dequantized by `load`); every other tensor as the wrapped checkpoint has it. Made by
    `quantized_view` for the parameters a source declares `@quantized("mxfp4")`."""

    def __init__(self, inner: Checkpoint, pairs: dict[str, tuple[str, str]], dtype: str = "f32"):
        stored = {n for pair in pairs.values() for n in pair}
        first = {pair[0]: name for name, pair in pairs.items()}
        names = [first.get(n, n) for n in inner.tensor_names if n not in stored or n in first]
        super().__init__(inner.source, inner.format, inner.config, names, set(inner.buffer_names), inner.path)
        self.inner = inner
        self.pairs = pairs
        self.default_dtype = dtype

    def shape(self, name: str) -> tuple[int, ...]:
        if name in self.pairs:
            blocks, scales = self.pairs[name]
            return mxfp4_shape(self.inner.shape(blocks), self.inner.shape(scales))
        return self.inner.shape(name)

    def dtype(self, name: str) -> str:
        return "mxfp4" if name in self.pairs else self.inner.dtype(name)

    def load(self, name: str, dtype: str | np.dtype | None = None) -> np.ndarray:
        """`name` as the wrapped checkpoint reads it, or an MXFP4 pair dequantized to `dtype` (when None, to the
        source's working dtype, as transformers dequantizes to its parameters' dtype). Raises CheckpointError for a
        non-finite result (a scale byte of 255)."""
        if name not in self.pairs:
            return self.inner.load(name, dtype)
        blocks, scales = (self.inner.load(n) for n in self.pairs[name])
        out = dequantize_mxfp4(np.asarray(blocks), np.asarray(scales), dtype or self.default_dtype)
        return check_finite(out, name, f"{self.source} (MXFP4 `{self.pairs[name][0]}`, `{self.pairs[name][1]}`)")

    def tokenizer(self):
        return self.inner.tokenizer()

    def close(self) -> None:
        self.inner.close()


def quantized_view(
    ckpt: Checkpoint, quantized: dict[str, str], quant_method: str | None, dtype: str = "f32"
) -> Checkpoint:
    """`ckpt`, seen through `QuantizedView` when the checkpoint's config says `quant_method` "mxfp4" and holds
    `W_blocks` / `W_scales` u8 pairs, of the right layout, for parameters the source declares `@quantized("mxfp4")`
    (`quantized`: parameter path -> format; a checkpoint name matches a path it equals or ends with after a `.`,
    the prefixes `loading` matches), dequantized to `dtype` (the source's working dtype) unless `load` names
    another. Otherwise `ckpt` itself: a pair the source does not declare stays two tensors
    no parameter takes (L502), and a pair of another layout a shape error naming both tensors.

    Raises CheckpointError for a declared pair whose shapes do not fit MXFP4 or whose dtype is not u8."""
    paths = [p for p, method in quantized.items() if method == quant_method == "mxfp4"]
    if not paths:
        return ckpt
    names = set(ckpt.tensor_names)
    pairs: dict[str, tuple[str, str]] = {}
    for n in ckpt.tensor_names:
        if not n.endswith("_blocks"):
            continue
        base = n.removesuffix("_blocks")
        if base + "_scales" not in names or base in names:
            continue
        if not any(base == p or base.endswith("." + p) or p.endswith("." + base) for p in paths):
            continue
        blocks, scales = n, base + "_scales"
        dtypes = (ckpt.dtype(blocks), ckpt.dtype(scales))
        if dtypes != ("u8", "u8") or mxfp4_shape(ckpt.shape(blocks), ckpt.shape(scales)) is None:
            raise CheckpointError(
                f"{ckpt.source}: `{blocks}` {dtypes[0]}{list(ckpt.shape(blocks))} and `{scales}` "
                f"{dtypes[1]}{list(ckpt.shape(scales))} are not MXFP4 blocks u8[E, R, G, 16] and scales u8[E, R, G], "
                "the layout of a checkpoint whose quantization_config says `mxfp4`"
            )
        pairs[base] = (blocks, scales)
    return QuantizedView(ckpt, pairs, dtype) if pairs else ckpt
