"""Weights kept quantized on PyTorch (`--dtype stored`): `QuantizedWeight`, a tensor that `F.linear` and
`F.embedding` read through weight-only quantized kernels, never dequantizing the whole matrix in memory.

A GGUF matrix arrives in affine group form (`linnet.runtimes.formats.gguf_quants.GroupQuantized`; this module reads its
fields, it does not import runtimes): W[n, k] = codes[n, k] * scales[n, g] + offsets[n, g], g = k // group, with
u8 codes of `bits` bits. It is packed once, at bind time, for torch's CPU int4 kernel
`aten._weight_int4pack_mm_for_cpu(x: bf16[M, K], packed, group, scales_and_zeros: bf16[K / group, N, 2])`, which
computes x @ W'.T with W'[n, k] = (c[n, k] - 8) * scale[g, n] + zero[g, n] (aten/src/ATen/native/cpu/
int4mm_kernel.cpp), so for 4-bit codes scale = scales.T and zero = offsets.T + 8 * scales.T. Codes of 5 to 8 bits
(q5_*, q8_0) are split as c = 16 * hi + lo into two 4-bit planes side by side along K, [hi | lo] of [N, 2K], run
as one kernel on [x | x]: hi with scale 16 s and zero 128 s, lo with scale s and zero offset + 8 s (a symmetric
type's hi plane centred instead: see `pack`). One call, not two: each call is a parallel region, and on a busy
machine a region waits for a descheduled thread (two calls measured 2x one on the 49152 x 576 lm_head there).
The kernel takes bf16 activations, scales and zeros and returns bf16 (its f32-activation path is a slow reference
loop), so a `linear` rounds x, the scales and zeros to bf16 and returns the model's dtype: a relative error of a few
2^-9 against x @ dequantize().T (the tests bound it as 3 * 2^-8 * |x| @ |W|.T), still finer than llama.cpp's own
8-bit quantized activations.

What does not fit the kernel (q6_k's groups of 16, a row count that is not a multiple of 16) keeps its u8 codes
and, per call, dequantizes and runs a dense matmul: memory stays at one byte per value, speed is not the kernel's.
Prefill (more than `DENSE_ROWS` rows of x) also dequantizes the matrix, exactly, in x's dtype (f32: one matrix at
a time, freed after its matmul) and runs the dense matmul: the int4 kernel is a GEMV kernel (7x slower than dense
bf16 at 512 rows here), and f32 keeps the prompt's logits those of the dequantized model (the bf16 kernel's
rounding flipped SmolLM2's first answer token, a near tie, where f32 and bf16 dense models did not).

`F.embedding` reads rows exactly: the codes of the rows asked for (unpacked from the int4 planes; their layout,
blocks of 64 rows on AVX-512, is checked once per process against the packer, and a matrix whose layout is not
recognised keeps its u8 codes), times the f32 scales plus the f32 offsets: bit for bit `dequantize()[ids]`.
So a tied table (SmolLM2's token_embd, q8_0, also its lm_head) is held once.

Any other function that reads a `QuantizedWeight` (a transpose, a norm of it) gets the dequantized f32 matrix:
correct, and slow; no model Linnet ships does that. CPU only (`QuantizedWeight.pack` raises BackendError on
another device).
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from linnet.errors import BackendError

__all__ = ["QuantizedWeight", "DENSE_ROWS"]

# Rows of x (tokens) above which a linear multiplies the exactly dequantized matrix densely instead of running the
# int4 GEMV kernel. Not tuned (this machine was saturated while it was written): the kernel takes 56 us for one
# row of a 1536 x 576 matrix and 5.7 ms for 512 rows, against 0.8 ms dense bf16 (lead's measurement, r7/int4.py).
DENSE_ROWS = 16
_KERNEL_GROUPS = (32, 64, 128, 256)  # the group sizes `_weight_int4pack_mm_for_cpu` accepts
_ROW_BLOCK: list[int | None] = []  # the packer's row block, found once (`_row_block`)


class QuantizedWeight(torch.Tensor):
    """A matrix [N, K] (Hugging Face layout) kept quantized: `F.linear(x, w)` and `F.embedding(ids, w)` read it
    through quantized kernels; any other function gets `dequantize()`. Its own storage is one broadcast zero
    (shape [N, K], stride 0): nothing reads it. Made by `pack`.

    Attributes:
        ggml_type, bits, group: as `GroupQuantized`'s.
        planes: the int4-packed codes ([N, K] for <= 4 bits, [hi | lo] of [N, 2K] otherwise), a list of one;
            empty when the matrix does not fit the kernel.
        scales_zeros: bf16[width / group, N, 2] for the plane, the kernel's scales and zeros.
        halves: 1, or 2 when the plane is [hi | lo].
        scales, offsets: f32[N, K / group], exact (embedding rows, `dequantize`).
        codes: u8[N, K] when the matrix does not fit the kernel or its rows cannot be read from the planes,
            else None.
        hi_shift: what the hi plane's codes were shifted by (a symmetric type's centring: see `pack`).
    """

    ggml_type: str
    bits: int
    group: int
    planes: list[torch.Tensor]
    scales_zeros: list[torch.Tensor]
    scales: torch.Tensor
    offsets: torch.Tensor
    codes: torch.Tensor | None
    hi_shift: int
    halves: int

    @staticmethod
    def __new__(cls, shape: tuple[int, int]) -> "QuantizedWeight":
        return torch.Tensor._make_subclass(cls, torch.empty_strided(shape, (0, 0)).zero_(), False)

    def __deepcopy__(self, memo: dict) -> "QuantizedWeight":
        """A copy that stays quantized (`Tensor.__deepcopy__` would reach `__torch_function__`, which dequantizes
        for any function but the two kernels: a copied `--dtype stored` model became a dense f32 one)."""
        if id(self) in memo:
            return memo[id(self)]
        new = type(self)(tuple(self.shape))
        memo[id(self)] = new
        for name, value in self.__dict__.items():
            setattr(new, name, copy.deepcopy(value, memo))
        return new

    @classmethod
    def pack(
        cls,
        codes: torch.Tensor,
        scales: torch.Tensor,
        offsets: torch.Tensor,
        group: int,
        bits: int,
        ggml_type: str = "",
        device: str | torch.device = "cpu",
    ) -> "QuantizedWeight":
        """Pack a group-quantized matrix for the CPU kernels.

        Args:
            codes: u8[N, K], each below 2**bits.
            scales, offsets: f32[N, K / group]: W[n, k] = codes[n, k] * scales[n, k // group] + offsets[...].
            group: values per scale; bits: the code width (<= 8); ggml_type: the GGUF type, for messages.
        Raises: BackendError for a device other than the CPU, ValueError for shapes that disagree.
        """
        if torch.device(device).type != "cpu":
            raise BackendError(
                f"--dtype stored runs GGUF's quantized weights with torch's CPU kernels only, not on {device}; "
                "use --dtype f32 or bf16 (dequantized) there"
            )
        n, k = codes.shape
        if scales.shape != (n, k // group) or offsets.shape != scales.shape or k % group:
            raise ValueError(
                f"a {ggml_type} matrix [{n}, {k}] in groups of {group} needs scales and offsets of "
                f"[{n}, {k // group}], got {list(scales.shape)} and {list(offsets.shape)}"
            )
        w = cls((n, k))
        w.ggml_type, w.bits, w.group = ggml_type, bits, group
        w.scales, w.offsets = scales.float().contiguous(), offsets.float().contiguous()
        w.planes, w.scales_zeros, w.codes, w.hi_shift, w.halves = [], [], None, 0, 1
        if group not in _KERNEL_GROUPS or n % 16 or bits > 8:
            w.codes = codes.contiguous()
            return w
        s, o = w.scales.t(), w.offsets.t()  # [K / group, N]
        if bits <= 4:
            pairs = [(codes, s, o + 8 * s)]
        elif torch.equal(o, s * -(2 ** (bits - 1))):  # symmetric (q5_0, q8_0): w = (c - z) s, z = 2^(bits-1)
            # w = 16 s (hi - z / 16) + s lo: the hi plane's codes shifted by 8 - z / 16 make the kernel's
            # (code - 8) exactly (hi - z / 16), so its zero is 0 (exact in bf16) and the lo plane's is 8 s
            w.hi_shift = 8 - 2 ** (bits - 5)
            pairs = [((codes >> 4) + w.hi_shift, 16 * s, torch.zeros_like(s)), (codes & 15, s, 8 * s)]
        else:  # the offset in the lo plane, as a 4-bit type's; the hi plane's zero 128 s stays exact in bf16
            pairs = [(codes >> 4, 16 * s, 128 * s), (codes & 15, s, o + 8 * s)]
        w.halves = len(pairs)
        w.planes = [_int4pack(torch.cat([plane for plane, _, _ in pairs], dim=1))]
        scales_zeros = [torch.stack([scale, zero], dim=-1) for _, scale, zero in pairs]
        w.scales_zeros = [torch.cat(scales_zeros).to(torch.bfloat16).contiguous()]
        block = _row_block()
        if block is None or n % block:
            w.codes = codes.contiguous()  # rows cannot be read from the planes: keep them for `embedding`
        return w

    @classmethod
    def from_groups(cls, q: Any, device: str | torch.device = "cpu") -> "QuantizedWeight":
        """`pack` a `GroupQuantized` (read by its fields: numpy `codes`, `scales`, `offsets`; `group`, `bits`,
        `ggml_type`), sharing the numpy arrays' memory where torch keeps them as they are."""
        codes, scales, offsets = (torch.from_numpy(a) for a in (q.codes, q.scales, q.offsets))
        return cls.pack(codes, scales, offsets, q.group, q.bits, q.ggml_type, device)

    # ----- what F.linear and F.embedding run
    def linear(self, x: torch.Tensor) -> torch.Tensor:
        """x @ W.T: [..., K] -> [..., N] in x's dtype: through the int4 kernel in bf16 for up to `DENSE_ROWS` rows
        of x, else (and for a matrix without planes) dense on the matrix dequantized in x's dtype (exact)."""
        n, k = self._dims()
        x2 = x.reshape(-1, k)
        if not self.planes or x2.shape[0] > DENSE_ROWS:  # the exact matrix, in x's dtype, for this call only
            return F.linear(x2, self.dequantize(x.dtype)).reshape(*x.shape[:-1], n)
        xb = x2.to(torch.bfloat16)
        xb = torch.cat([xb, xb], dim=-1) if self.halves == 2 else xb  # [x | x] against [hi | lo]
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(xb, self.planes[0], self.group, self.scales_zeros[0])
        return y.to(x.dtype).reshape(*x.shape[:-1], n)

    def embedding(self, ids: torch.Tensor) -> torch.Tensor:
        """W[ids]: i64[...] -> f32[..., K], exactly the dequantized rows."""
        n, k = self._dims()
        flat = ids.reshape(-1)
        codes = self.codes[flat] if self.codes is not None else self._plane_codes(flat)
        rows = codes.reshape(-1, k // self.group, self.group).float()
        rows = rows * self.scales[flat].unsqueeze(-1) + self.offsets[flat].unsqueeze(-1)
        return rows.reshape(*ids.shape, k)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The whole matrix [N, K] in `dtype` (f32: bit for bit `GroupQuantized.dequantize()`)."""
        n, k = self._dims()
        codes = self.codes if self.codes is not None else self._plane_codes(None)
        w = codes.reshape(n, k // self.group, self.group).to(dtype)
        # in place: the same two roundings as `w * s + o` without two more fresh [N, K] buffers, whose first-touch
        # page faults cost more than the arithmetic (1536 x 576 q4_1: 13.6 ms -> 1.3 ms, one thread, contended)
        w.mul_(self.scales.to(dtype).unsqueeze(-1)).add_(self.offsets.to(dtype).unsqueeze(-1))
        return w.reshape(n, k)

    def _dims(self) -> tuple[int, int]:
        """(N, K) as ints from the packed fields, not from `self.shape`: under torch.compile with dynamic shapes
        the stand-in's shape is symbolic while the fields are constants of fixed size, and a view of a constant
        with symbolic sizes is refused (`Please convert all Tensors to FakeTensors first`)."""
        n, groups = self.scales.shape
        return int(n), int(groups) * self.group

    def _plane_codes(self, rows: torch.Tensor | None) -> torch.Tensor:
        """u8[R, K] the codes of `rows` (all rows for None), read back from the int4 planes (`_row_block`)."""
        n, k = self._dims()
        codes = _unpack_rows(self.planes[0], n, k * self.halves, rows, _row_block())
        return codes if self.halves == 1 else (codes[:, :k] - self.hi_shift) * 16 + codes[:, k:]

    # ----- dispatch
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear and isinstance(args[1], QuantizedWeight) and not isinstance(args[0], QuantizedWeight):
            x, w, bias = args[0], args[1], args[2] if len(args) > 2 else kwargs.get("bias")
            y = w.linear(x)
            return y if bias is None else y + bias
        if func is F.embedding and isinstance(args[1], QuantizedWeight) and _plain_lookup(args, kwargs):
            return args[1].embedding(args[0])
        if _metadata_only(func):
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **kwargs)
        args, kwargs = _dequantized(args), _dequantized(kwargs)
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)

    def __repr__(self, *, tensor_contents: Any = None) -> str:
        n, k = self.shape
        return f"QuantizedWeight({self.ggml_type or f'{self.bits}-bit'}, [{n}, {k}], group {self.group})"


# What reads only a tensor's metadata (nothing of its values) is answered from the stand-in's (dtype, device,
# shape, `_is_view`, which torch.compile asks); anything else reads values, so it gets the dequantized matrix.
_METADATA_METHODS = {"size", "dim", "stride", "numel", "nelement", "ndimension", "is_contiguous", "storage_offset"}
_METADATA_METHODS |= {"data_ptr", "untyped_storage", "element_size", "is_floating_point", "is_complex", "get_device"}
_VALUE_PROPERTIES = {"T", "mT", "H", "mH", "real", "imag", "data", "grad"}  # properties that are tensors of values


def _metadata_only(func: Any) -> bool:
    """Whether `func` (a `__torch_function__` target) reads a tensor's metadata only: a property other than
    `_VALUE_PROPERTIES`, a method in `_METADATA_METHODS`, or a private (`_is_view`, not dunder) Tensor method."""
    name = getattr(func, "__name__", "")
    if name == "__get__":
        return getattr(getattr(func, "__self__", None), "__name__", "") not in _VALUE_PROPERTIES
    is_method = func is getattr(torch.Tensor, name, None) or func is getattr(torch._C.TensorBase, name, None)
    return is_method and (name in _METADATA_METHODS or (name.startswith("_") and not name.startswith("__")))


def _plain_lookup(args: tuple, kwargs: dict) -> bool:
    """Whether an `F.embedding` call is a plain row lookup (no padding_idx, max_norm...: those rewrite rows)."""
    names = ("padding_idx", "max_norm", "norm_type", "scale_grad_by_freq", "sparse")
    defaults = (None, None, 2.0, False, False)
    given = dict(zip(names, args[2:])) | kwargs
    return all(given.get(name, d) == d for name, d in zip(names, defaults))


def _dequantized(value: Any) -> Any:
    """`value` with every QuantizedWeight in it (in tuples, lists, dicts) replaced by its f32 matrix."""
    if isinstance(value, QuantizedWeight):
        return value.dequantize()
    if isinstance(value, (tuple, list)):
        return type(value)(_dequantized(v) for v in value)
    if isinstance(value, dict):
        return {key: _dequantized(v) for key, v in value.items()}
    return value


def _int4pack(codes: torch.Tensor) -> torch.Tensor:
    """`_convert_weight_to_int4pack_for_cpu(codes, 1)` of u8 codes [N, K] (each < 16). Where the packer's row
    block (`_row_block`) divides N, the same bytes are written here from the u8 codes (the inverse of
    `_unpack_rows`): the packer itself takes an i32 copy, 4 bytes a value, and is slower."""
    n, k = codes.shape
    b = _row_block()
    if not b or n % b:
        return torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32), 1)
    halves = codes.numpy().reshape(n // b, 2, b // 2, k)  # per block: rows 0..b/2-1 (low nibbles), b/2.. (high)
    packed = np.empty((n // b, k, b // 2), np.uint8)  # numpy: 2x faster than torch's u8 ops on strided views
    np.left_shift(halves[:, 1].transpose(0, 2, 1), 4, out=packed)
    np.bitwise_or(packed, halves[:, 0].transpose(0, 2, 1), out=packed)
    return torch.from_numpy(packed.reshape(n, k // 2))  # not a view: torch.compile traces it as a constant


def _unpack_rows(packed: torch.Tensor, n: int, k: int, rows: torch.Tensor | None, b: int) -> torch.Tensor:
    """u8[R, K]: the 4-bit codes of `rows` (None: all N) from `_convert_weight_to_int4pack_for_cpu`'s output,
    packed in row blocks of `b`.

    Its CPU layout (int4mm_kernel.cpp, `weight_to_int4pack_kernel`): rows in blocks of B (64 with AVX-512, 32
    otherwise), each block [K, B / 2] bytes, byte j holding row j of the block in its low nibble and row j + B/2
    in its high one. `_row_block` checks that on a probe; `pack` keeps u8 codes where it does not hold."""
    blocks = packed.reshape(n // b, k, b // 2)
    if rows is None:
        both = torch.cat([blocks & 15, blocks >> 4], dim=-1)  # [N / B, K, B]
        return both.transpose(1, 2).reshape(n, k)
    j = rows % b
    picked = blocks[rows // b, :, j % (b // 2)]  # [R, K]
    return (picked >> (4 * (j // (b // 2))).unsqueeze(-1).to(torch.uint8)) & 15


def _row_block() -> int | None:
    """The row block of torch's int4 packer on this CPU (64 or 32), checked once against a probe; None if the
    packer's layout is neither (then every quantized table keeps its u8 codes for row lookups)."""
    if not _ROW_BLOCK:
        probe = torch.randint(0, 16, (128, 64), generator=torch.Generator().manual_seed(0), dtype=torch.int32)
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(probe, 1)
        fits = [b for b in (64, 32) if torch.equal(_unpack_rows(packed, 128, 64, None, b).to(torch.int32), probe)]
        _ROW_BLOCK[:] = fits[:1] or [None]
    return _ROW_BLOCK[0]
