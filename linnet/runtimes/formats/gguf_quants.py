"""GGUF quantized matrices in one affine group form that every backend packs from (`--dtype stored`).

A GGUF block type stores a matrix W[N, K] ([out_features, in_features], Hugging Face layout) in blocks of 32 or
256 values along K. Every type Linnet keeps quantized reads, per group of `group` consecutive values of a row,

    W[n, k] = codes[n, k] * scales[n, k // group] + offsets[n, k // group]

with unsigned integer codes, so one representation (`GroupQuantized`) serves ONNX Runtime's `MatMulNBits`
(codes + scales + zero points), torch's weight-only int8/int4 kernels and any later backend. From ggml-quants.c
`dequantize_row_*` (the same formulas as gguf-py's `gguf.quants`, the reference the tests compare against):

| ggml type | bits | group | code            | scale     | offset          |
|-----------|------|-------|-----------------|-----------|-----------------|
| q4_0      | 4    | 32    | q               | d         | -8 d            |
| q4_1      | 4    | 32    | q               | d         | m               |
| q5_0      | 5    | 32    | q               | d         | -16 d           |
| q5_1      | 5    | 32    | q               | d         | m               |
| q8_0      | 8    | 32    | q + 128 (q: i8) | d         | -128 d          |
| q4_k      | 4    | 32    | q               | d * sc    | -dmin * m       |
| q5_k      | 5    | 32    | q               | d * sc    | -dmin * m       |
| q6_k      | 6    | 16    | q               | d * sc    | -32 d * sc      |

(d, m, dmin f16; sc, m of the K-quants 6-bit, unpacked as ggml's `get_scale_min_k4`; sc of q6_k i8.)

Exactness: `dequantize()` equals `gguf.quants.dequantize` bit for bit (tested per type on random blocks). The
scale is an f16 times an integer of at most 7 bits (<= 18 significant bits), the code at most 8 bits, so
`codes * scales` is exact in f32 (<= 24 bits), and so are the offsets. For the symmetric types (q4_0, q5_0, q8_0,
q6_k) `codes * scale + offset` is `(code - zero) * scale`, an integer of <= 8 bits times the scale, exact in f32,
which is the reference's value; for q4_1/q5_1 and the K-quants the reference rounds the same single addition.

The `stored` dtype contract (what `--dtype stored` means to every layer):
- `linnet.runtimes.loading.prepare(..., dtype="stored")` lowers the program with f32 as its working dtype
  (activations, norms, KV cache, every unquantized parameter) and records `Prepared.stored = True`; it refuses a
  checkpoint that is not GGUF, and a GGUF file with no quantized tensor, with a LoadError saying nothing would
  stay quantized.
- `planned_tensors(prepared, progress, dtype)` then yields, for each parameter, `GGUFCheckpoint.load(name,
  "stored")`: a `GroupQuantized` for a quantized tensor (rows of Q/K un-permuted), the stored array for the
  others (f32 of the file; f16/bf16 tensors are cast to f32, the working dtype). A backend binds a
  `GroupQuantized` to the matmul (`linear`) or embedding lookup that reads it, and may call `dequantize()` for
  any other use.
- `Backend.load(..., dtype="stored")` is accepted by the backends whose `Backend.stored` is True (onnxruntime,
  torch, torch-compile; jax and xla, which hold q8_0 only and refuse the other types, naming the tensors:
  `linnet.runtimes.backends.jax_quantized`; each sets it in `linnet/runtimes/backends/__init__.py` with the
  binding that runs it;
  `check_options` refuses the others, saying so, and maps "stored" to "f32" for the dtype check). The runtime's `load`
  passes `dtype="stored"` to `prepare` and then works in `prepared.program.dtype` (f32).
- The CLI offers `--dtype stored` on run, generate and serve (`add_common(stored=True)`); the front end builds
  in `working_dtype("stored")`, f32.

Needs numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from linnet.errors import CheckpointError

__all__ = ["GroupQuantized", "group_quantized", "STORED", "STORED_TYPES", "BLOCK_BYTES", "working_dtype"]

STORED = "stored"  # the `--dtype` that keeps GGUF weights quantized

QK_K = 256  # values per K-quant super-block
# ggml type -> (values per block, bytes per block, code bits, values per scale); gguf-py's GGML_QUANT_SIZES.
_LAYOUT = {
    "q4_0": (32, 18, 4, 32),
    "q4_1": (32, 20, 4, 32),
    "q5_0": (32, 22, 5, 32),
    "q5_1": (32, 24, 5, 32),
    "q8_0": (32, 34, 8, 32),
    "q4_k": (QK_K, 144, 4, 32),
    "q5_k": (QK_K, 176, 5, 32),
    "q6_k": (QK_K, 210, 6, 16),
}
STORED_TYPES = tuple(_LAYOUT)
BLOCK_BYTES = {t: (v[0], v[1]) for t, v in _LAYOUT.items()}


@dataclass(frozen=True, eq=False)
class GroupQuantized:
    """A GGUF-quantized matrix in affine group form:
    w[n, k] = codes[n, k] * scales[n, k // group] + offsets[n, k // group].

    Fields:
        ggml_type: "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q4_k", "q5_k" or "q6_k" (gguf's names, lower case).
        shape: [N, K] = [out_features, in_features], Hugging Face layout.
        bits: the code width, 4, 5, 6 or 8.
        group: values per scale, 32 (16 for q6_k).
        codes: u8[N, K], each in [0, 2**bits).
        scales: f32[N, K // group].
        offsets: f32[N, K // group].
    """

    ggml_type: str
    shape: tuple[int, int]
    bits: int
    group: int
    codes: np.ndarray
    scales: np.ndarray
    offsets: np.ndarray

    def dequantize(self) -> np.ndarray:
        """The matrix f32[N, K] the groups store, exact (equal to `gguf.quants.dequantize`)."""
        n, k = self.shape
        w = self.codes.reshape(n, k // self.group, self.group).astype(np.float32)
        w *= self.scales[..., None]
        w += self.offsets[..., None]
        return w.reshape(n, k)

    @property
    def zero_points(self) -> np.ndarray | None:
        """u8[N, K // group] with offsets == -zero_points * scales, for the types whose offset is an integer
        multiple of the scale (q4_0: 8, q5_0: 16, q8_0: 128, q6_k: 32); None for the others (q4_1, q5_1, q4_k,
        q5_k), whose offsets are independent of their scales."""
        zero = {"q4_0": 8, "q5_0": 16, "q8_0": 128, "q6_k": 32}.get(self.ggml_type)
        return None if zero is None else np.full(self.scales.shape, zero, dtype=np.uint8)

    @property
    def nbytes(self) -> int:
        """Bytes held in memory (codes one per byte, f32 scales and offsets)."""
        return self.codes.nbytes + self.scales.nbytes + self.offsets.nbytes

    def take_rows(self, order: np.ndarray) -> GroupQuantized:
        """The same matrix with its rows reordered (`order`: i64[N], a permutation): row i of the result is row
        `order[i]` (whole rows of blocks move, so nothing is requantized)."""
        return GroupQuantized(
            self.ggml_type,
            self.shape,
            self.bits,
            self.group,
            np.ascontiguousarray(self.codes[order]),
            np.ascontiguousarray(self.scales[order]),
            np.ascontiguousarray(self.offsets[order]),
        )


def group_quantized(raw: np.ndarray, ggml_type: str, shape: tuple[int, int], name: str = "tensor") -> GroupQuantized:
    """Unpack GGUF blocks into `GroupQuantized` form.

    Args:
        raw: u8[..., bytes] the stored blocks of the matrix, in file order (`GGUFFile.raw`'s layout: a row of
            blocks per output row).
        ggml_type: gguf's lower-case type name (`GGUFTensorInfo.type_name`).
        shape: [N, K] the matrix's shape, PyTorch order.
        name: the tensor's name, for messages.
    Returns: GroupQuantized with codes u8[N, K], scales and offsets f32[N, K // group].
    Raises: CheckpointError naming the tensor for a type outside `STORED_TYPES`, a shape that is not 2-D with K a
        multiple of the block size, or a byte count that does not fit it.
    """
    layout = _LAYOUT.get(ggml_type)
    if layout is None:
        raise CheckpointError(
            f"{name}: GGUF type {ggml_type} cannot be kept quantized (--dtype stored supports "
            f"{', '.join(STORED_TYPES)}); load it dequantized (--dtype f32)"
        )
    block, block_bytes, bits, group = layout
    if len(shape) != 2 or shape[1] % block:
        raise CheckpointError(
            f"{name}: a {ggml_type} matrix needs 2 dims with the last a multiple of {block}, got {list(shape)}"
        )
    n, k = shape
    data = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1)
    expected = n * (k // block) * block_bytes
    if data.size != expected:
        raise CheckpointError(f"{name}: {data.size} bytes of {ggml_type} data, expected {expected} for {list(shape)}")
    blocks = data.reshape(-1, block_bytes)
    codes, scales, offsets = _UNPACK[ggml_type](blocks)
    return GroupQuantized(
        ggml_type,
        (n, k),
        bits,
        group,
        codes.reshape(n, k),
        scales.reshape(n, k // group),
        offsets.reshape(n, k // group),
    )


def working_dtype(dtype: str) -> str:
    """The dtype a program is lowered in: f32 under `--dtype stored` (activations, norms, KV cache), else `dtype`."""
    return "f32" if dtype == STORED else dtype


# --------------------------------------------------------------------------------------------------------------
# Per type: blocks u8[B, bytes] -> codes u8[B, values], scales and offsets f32[B, values // group].
# Layouts from ggml-common.h (block_q4_0 ...); nibble and bit orders as gguf-py's dequantize_blocks read them.


def _f16(b: np.ndarray) -> np.ndarray:
    """f32[B, 1] from two bytes per row (a little-endian f16)."""
    return np.ascontiguousarray(b).view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray, chunk: int) -> np.ndarray:
    """u8[B, 2 * bytes]: per chunk of `chunk` bytes, the low nibbles (values 0..chunk-1) then the high ones."""
    q = qs.reshape(qs.shape[0], -1, 1, chunk) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    return (q & np.uint8(0x0F)).reshape(qs.shape[0], -1)


def _high_bits(qh: np.ndarray, count: int) -> np.ndarray:
    """u8[B, 32]: bit i of the u32 `qh` for value i (q5_0/q5_1's fifth bits)."""
    bits = qh.view("<u4").reshape(-1, 1) >> np.arange(count, dtype=np.uint32).reshape(1, count)
    return (bits & np.uint32(1)).astype(np.uint8)


def _q4_0(blocks):
    d = _f16(blocks[:, :2])
    return _nibbles(blocks[:, 2:], 16), d, -8 * d


def _q4_1(blocks):
    d, m = _f16(blocks[:, :2]), _f16(blocks[:, 2:4])
    return _nibbles(blocks[:, 4:], 16), d, m


def _q5_0(blocks):
    d = _f16(blocks[:, :2])
    codes = _nibbles(blocks[:, 6:], 16) | (_high_bits(blocks[:, 2:6], 32) << np.uint8(4))
    return codes, d, -16 * d


def _q5_1(blocks):
    d, m = _f16(blocks[:, :2]), _f16(blocks[:, 2:4])
    codes = _nibbles(blocks[:, 8:], 16) | (_high_bits(blocks[:, 4:8], 32) << np.uint8(4))
    return codes, d, m


def _q8_0(blocks):
    d = _f16(blocks[:, :2])
    codes = np.bitwise_xor(blocks[:, 2:], np.uint8(0x80))  # q + 128 as u8, q the i8 byte (one pass: 8B-scale files)
    return codes, d, -128 * d


def _scale_min_k4(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ggml's `get_scale_min_k4` for all 8 sub-blocks: 12 bytes -> 6-bit scales and mins, u8[B, 8] each."""
    s = scales.reshape(-1, 3, 4)
    d, m, m_d = s[:, 0], s[:, 1], s[:, 2]
    sc = np.concatenate([d & 0x3F, (m_d & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([m & 0x3F, (m_d >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return sc, mn


def _k_scales(blocks) -> tuple[np.ndarray, np.ndarray]:
    d, dmin = _f16(blocks[:, :2]), _f16(blocks[:, 2:4])
    sc, mn = _scale_min_k4(blocks[:, 4:16])
    return d * sc.astype(np.float32), -(dmin * mn.astype(np.float32))


def _q4_k(blocks):
    scales, offsets = _k_scales(blocks)
    return _nibbles(blocks[:, 16:], 32), scales, offsets


def _q5_k(blocks):
    scales, offsets = _k_scales(blocks)
    qh = blocks[:, 16:48].reshape(-1, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)  # bit j: sub-block j
    codes = _nibbles(blocks[:, 48:], 32) | ((qh & np.uint8(1)).reshape(-1, QK_K) << np.uint8(4))
    return codes, scales, offsets


def _q6_k(blocks):
    ql, qh, sc, d = blocks[:, :128], blocks[:, 128:192], blocks[:, 192:208], _f16(blocks[:, 208:210])
    low = _nibbles(ql, 64)
    high = qh.reshape(-1, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)
    codes = low | ((high & np.uint8(3)).reshape(-1, QK_K) << np.uint8(4))
    scales = d * np.ascontiguousarray(sc).view(np.int8).astype(np.float32)
    return codes, scales, -32 * scales


_UNPACK = {
    "q4_0": _q4_0,
    "q4_1": _q4_1,
    "q5_0": _q5_0,
    "q5_1": _q5_1,
    "q8_0": _q8_0,
    "q4_k": _q4_k,
    "q5_k": _q5_k,
    "q6_k": _q6_k,
}
