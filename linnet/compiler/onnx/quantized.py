"""Weight-only quantized matrices on ONNX Runtime: `com.microsoft` `MatMulNBits` and `GatherBlockQuantized`.

A quantized weight arrives in affine group form (the contract of `linnet.runtimes.formats.gguf_quants.GroupQuantized`,
read
here by its fields so that the compiler imports nothing from the runtimes):

    w[n, k] = codes[n, k] * scales[n, k // group] + offsets[n, k // group]      codes u8[N, K] of `bits` bits

ORT 1.32's contrib ops (schemas from `onnxruntime.capi.onnxruntime_pybind11_state.get_all_operator_schema()`):

- `MatMulNBits(A, B, scales, zero_points?)`: Y = A @ ((code - zero_point) * scale).T, B u8[N, K / block, block *
  bits / 8] packed low bits first, scales [N, K / block] of A's type, block_size a power of two >= 16, bits 2, 4
  or 8, zero points u8 packed like B (default 2 ** (bits - 1)) or float (same type as A).
- `GatherBlockQuantized(data, indices, scales, zero_points?)`: rows of (code - zero_point) * scale, data u8 with
  `bits` 4 or 8 packed along the last axis, quantized along it, gathered along axis 0.

What the CPU provider runs fast decides the packing (measured here, 576 x 1536, one token, 2 threads: dense f32
MatMul 308 us; 4-bit at accuracy_level 0/1 (f32 activations) 130-180 us; 4-bit at level 4 (int8 activations)
53-69 us; 8-bit at level 4 53-90 us, but 8-bit at level 0/1 2.6-5.9 ms (MLAS has no f32-activation 8-bit
kernel, so ORT dequantizes B at every call); float zero points 3.8-4 ms at any level (not prepacked either)):

- Zero points are integers (u8): a type whose offset is `-zero * scale` (q4_0, q5_0, q8_0, q6_k) puts `zero`
  there; the others (q4_1, q5_1, q4_k, q5_k, whose offsets are independent of the scales) run with zero point 0
  and add the offsets' share, `sum over groups g of offsets[n, g] * sum(x[k] for k in g)`, as a second small
  MatMul (x summed per group: [.., K / group] @ offsets.T [K / group, N], 1/group of the main FLOPs).
- Better still, no zero-point input: MLAS's kernels for the default zero point 2 ** (bits - 1) run 1.25-1.45x
  faster (4-bit, int8 activations: 6.9 against 9.9 ms for SmolLM2's 30 layers; f32 activations 19.9 against
  24.8). A plane moves to it when that is exact (`_default_zero`): its codes shift up by default - zero when they
  still fit (q5_0, q5_1, q5_k, q6_k in one 8-bit plane; the high 4-bit planes), or else the offsets gain
  (default - zero) * scale, where that sum is exact in f32 (q4_1 and the K-quants with a real file's scales: all
  of SmolLM2's q4_1 groups; scales and mins decades apart keep their zero points).
- `equivalent` (f32 activations, accuracy_level 1): every code in 4-bit planes, so that MLAS runs its f32 kernel:
  codes of 5-8 bits split into `hi = code >> 4` (scale 16 * scale, zero point zero >> 4) and `lo = code & 15`
  (scale, zero point 0), two MatMulNBits summed. Each plane's weights `(plane - zero) * scale` are exact in f32
  (integers below 256 times an f16 times at most 7 bits), so the result is the dequantized matmul up to f32
  accumulation order.
- `fast` (accuracy_level 4: ORT quantizes the activations to int8 per block, as llama.cpp quantizes them to q8
  for its dot products): codes of 5-8 bits in one 8-bit plane.

An embedding lookup of a quantized table is a GatherBlockQuantized per plane over the same bytes (the MatMulNBits
weight itself where the plane has the default zero point, so a tied head and its embeddings are one initializer),
summed, plus the gathered offsets' share.
Needs numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["Plane", "PackedWeight", "pack_weight", "is_quantized"]

MS_DOMAIN = "com.microsoft"
ACCURACY = {"equivalent": 1, "fast": 4}  # MatMulNBits accuracy_level: 1 f32 activations, 4 int8 activations


@dataclass(frozen=True, eq=False)
class Plane:
    """One MatMulNBits operand: codes (`bits` 4 or 8) of one plane with their scales and integer zero points.

    packed: u8[N, K // group, group * bits // 8] (low bits first); scales: f32[N, K // group];
    zero_points: u8 packed like `packed` ([N, ceil(K // group * bits / 8)]) or None for the default 2 ** (bits - 1)."""

    bits: int
    packed: np.ndarray
    scales: np.ndarray
    zero_points: np.ndarray | None


@dataclass(frozen=True, eq=False)
class PackedWeight:
    """A quantized weight [N, K] packed for ORT: the sum of its planes plus, when the offsets are not integer zero
    points, `offsets` f32[N, K // group] (w[n, k] += offsets[n, k // group])."""

    ggml_type: str
    shape: tuple[int, int]
    group: int
    accuracy_level: int
    planes: tuple[Plane, ...]
    offsets: np.ndarray | None
    _offsets_t: list = field(default_factory=list, repr=False)

    @property
    def nbytes(self) -> int:
        n = sum(p.packed.nbytes + p.scales.nbytes + (p.zero_points.nbytes if p.zero_points is not None else 0)
                for p in self.planes)  # fmt: skip
        return n + (self.offsets.nbytes if self.offsets is not None else 0)

    def offsets_t(self) -> np.ndarray:
        """f32[K // group, N]: the offsets as the right operand of the offsets' MatMul (made once)."""
        if not self._offsets_t:
            self._offsets_t.append(np.ascontiguousarray(self.offsets.T))
        return self._offsets_t[0]


def is_quantized(value) -> bool:
    """Whether a parameter value is a quantized weight (a `GroupQuantized` or a `PackedWeight`)."""
    return isinstance(value, PackedWeight) or (hasattr(value, "codes") and hasattr(value, "group"))


def pack_weight(w, numerics: str = "equivalent") -> PackedWeight:
    """`w` (a `GroupQuantized`: codes u8[N, K], scales/offsets f32[N, K // group], bits, group, zero_points) packed
    for `numerics` (see the module docstring); a `PackedWeight` is returned as is.

    Every plane is given MatMulNBits's default zero point (`_default_zero`) when that is exact: MLAS's kernels
    without a zero-point input run 1.25 to 1.45 times faster (576 x 1536 and the like, one token, 2 threads)."""
    if isinstance(w, PackedWeight):
        return w
    n, k = w.shape
    zero = w.zero_points
    if w.bits <= 4:
        specs = [(w.codes, w.scales, zero if zero is not None else 0, 4, 2**w.bits - 1)]
    elif numerics == "fast":
        specs = [(w.codes, w.scales, zero if zero is not None else 0, 8, 2**w.bits - 1)]
    else:
        if zero is not None and np.any(zero % 16):
            zero = None  # not a multiple of 16: the offsets' MatMul carries it (no stored type does this)
        hi_zero = zero >> 4 if zero is not None else 0
        specs = [
            (w.codes >> 4, w.scales * np.float32(16), hi_zero, 4, (2**w.bits - 1) >> 4),
            (w.codes & np.uint8(15), w.scales, 0, 4, 15),
        ]
    offsets = None if zero is not None else np.asarray(w.offsets, dtype=np.float64)
    rewritten = [_default_zero(codes, scales, plane_zero, bits, top) for codes, scales, plane_zero, bits, top in specs]
    shifts = [shift for *_, shift in rewritten if shift is not None]
    if shifts:
        folded = sum(shifts, offsets if offsets is not None else 0.0)
        if np.array_equal(folded.astype(np.float32), folded):
            offsets = folded  # every weight (code - default) * scale + offset is still the stored value
        else:  # a sum f32 cannot hold: the zero points stay (MLAS's slower kernel, exact)
            rewritten = [(codes, scales, plane_zero, bits, None) for codes, scales, plane_zero, bits, _ in specs]
    planes = [_plane(codes, scales, plane_zero, bits) for codes, scales, plane_zero, bits, _ in rewritten]
    return PackedWeight(
        w.ggml_type,
        (n, k),
        w.group,
        ACCURACY[numerics],
        tuple(planes),
        None if offsets is None else np.ascontiguousarray(offsets, dtype=np.float32),
    )


def _default_zero(codes: np.ndarray, scales: np.ndarray, zero, bits: int, top: int) -> tuple:
    """(codes, scales, zero, bits, shift): a plane of `codes` u8[N, K] (each <= `top`) with zero points `zero`
    (u8[N, K // group] or one int) rewritten to MatMulNBits's default zero point D = 2 ** (bits - 1), so that it
    needs no zero-point input, and the offsets the rewrite adds (f64[N, K // group], None when none).

    (code - zero) * scale is (code + D - zero - D) * scale: when every shifted code still fits in `bits` bits (q6_k
    and q5_0 in one 8-bit plane, the high 4-bit plane of q8_0, q6_k and q5_0) the codes shift and nothing is added;
    otherwise (q4_1 and the K-quants, zero 0, and the low 4-bit planes) the codes stay and the offsets gain
    (D - zero) * scale, which the offsets' MatMul adds."""
    default = 2 ** (bits - 1)
    delta = default - np.asarray(zero, dtype=np.int64)
    if not np.any(delta):
        return codes, scales, default, bits, None
    uniform = int(delta.flat[0]) if np.all(delta == delta.flat[0]) else None
    if uniform is not None and 0 <= uniform and top + uniform < 2**bits:
        return codes + np.uint8(uniform), scales, default, bits, None
    n, blocks = scales.shape
    return codes, scales, default, bits, np.broadcast_to(delta, (n, blocks)) * np.asarray(scales, dtype=np.float64)


def _plane(codes: np.ndarray, scales: np.ndarray, zero, bits: int) -> Plane:
    """A plane of `codes` u8[N, K] (each < 2 ** bits) with `zero` (u8[N, K // group] or one int) as zero points."""
    n, k = codes.shape
    blocks = scales.shape[1]
    group = k // blocks
    packed = _pack_rows(codes, bits).reshape(n, blocks, group * bits // 8)
    if np.isscalar(zero) or np.ndim(zero) == 0:
        zero = np.full((n, blocks), int(zero), dtype=np.uint8)
    default = 2 ** (bits - 1)
    zero_points = None if np.all(zero == default) else _pack_rows(np.asarray(zero, dtype=np.uint8), bits)
    return Plane(bits, packed, np.ascontiguousarray(scales, dtype=np.float32), zero_points)


def _pack_rows(values: np.ndarray, bits: int) -> np.ndarray:
    """u8[N, ceil(M * bits / 8)]: values u8[N, M] (each < 2 ** bits) packed low bits first along each row."""
    values = np.ascontiguousarray(values, dtype=np.uint8)
    if bits == 8:
        return values
    n, m = values.shape
    if m % 2:
        values = np.concatenate([values, np.zeros((n, 1), np.uint8)], axis=1)
    return np.ascontiguousarray(values[:, 0::2] | (values[:, 1::2] << np.uint8(4)))


def concat_rows(named: list[tuple[str, PackedWeight]]) -> list[tuple[str, PackedWeight]]:
    """The members of a fused linear weight (`Program.param_transforms`, rows concatenated) as few parts as
    possible: consecutive members of one type and packing become one weight (their rows concatenated), so that
    q/k/v of one type run as one MatMulNBits; a mixed group (Q4_K q/k with a Q6_K v) stays in parts, whose outputs
    the lowering concatenates."""
    parts: list[list[tuple[str, PackedWeight]]] = []
    for name, w in named:
        last = parts[-1][-1][1] if parts else None
        if last is not None and _same_packing(last, w):
            parts[-1].append((name, w))
        else:
            parts.append([(name, w)])
    return [group[0] if len(group) == 1 else _concat(group) for group in parts]


def _same_packing(a: PackedWeight, b: PackedWeight) -> bool:
    return (
        a.ggml_type == b.ggml_type
        and a.shape[1] == b.shape[1]
        and a.accuracy_level == b.accuracy_level
        and len(a.planes) == len(b.planes)
        and all(
            p.bits == q.bits and (p.zero_points is None) == (q.zero_points is None) for p, q in zip(a.planes, b.planes)
        )
        and (a.offsets is None) == (b.offsets is None)
    )


def _concat(group: list[tuple[str, PackedWeight]]) -> tuple[str, PackedWeight]:
    ws = [w for _, w in group]
    cat = lambda arrays: None if arrays[0] is None else np.concatenate(arrays, axis=0)  # noqa: E731
    planes = tuple(
        Plane(ps[0].bits, cat([p.packed for p in ps]), cat([p.scales for p in ps]), cat([p.zero_points for p in ps]))
        for ps in zip(*(w.planes for w in ws))
    )
    first = ws[0]
    n = sum(w.shape[0] for w in ws)
    name = "+".join(name for name, _ in group)
    weight = PackedWeight(
        first.ggml_type, (n, first.shape[1]), first.group, first.accuracy_level, planes, cat([w.offsets for w in ws])
    )
    return name, weight


# --------------------------------------------------------------------------------------------------------------
# Lowering (`L` is `lower.Lowering`: `op`, `const`, `initializer`)


def matmul_nbits(L, x, rank: int, parts: list[tuple[str, PackedWeight]], hint: str):
    """x [.., K] @ w.T for a quantized w [N, K] given in row parts: one MatMulNBits per plane of each part
    (summed), the offsets' MatMul when the part has offsets, the parts' outputs concatenated. Returns [.., N]."""
    outs = []
    for name, w in parts:
        n, k = w.shape
        y = None
        for i, p in enumerate(w.planes):
            inputs = [x, L.initializer(p.packed, f"{name}.q{i}"), L.initializer(p.scales, f"{name}.scales{i}")]
            if p.zero_points is not None:
                inputs.append(L.initializer(p.zero_points, f"{name}.zero_points{i}"))
            attributes = {"K": k, "N": n, "bits": p.bits, "block_size": w.group, "accuracy_level": w.accuracy_level}
            out = L.op("MatMulNBits", inputs, attributes, hint=hint, domain=MS_DOMAIN)
            y = out if y is None else L.op("Add", [y, out], hint=hint)
        if w.offsets is not None:
            shape = L.const(np.array([0] * (rank - 1) + [k // w.group, w.group], dtype=np.int64), "groups")
            grouped = L.op("Reshape", [x, shape], hint="groups")
            sums = L.op("ReduceSum", [grouped, L.const(np.array([-1], dtype=np.int64), "axes")], {"keepdims": 0})
            shift = L.op("MatMul", [sums, L.initializer(w.offsets_t(), f"{name}.offsets_t")], hint=hint)
            y = L.op("Add", [y, shift], hint=hint)
        outs.append(y)
    return outs[0] if len(outs) == 1 else L.op("Concat", outs, {"axis": -1}, hint=hint)


def gather_block_quantized(L, indices, rank: int, name: str, w: PackedWeight, hint: str):
    """Rows `indices` (i64 of rank `rank`) of a quantized table w [N, K]: a GatherBlockQuantized per plane, summed,
    plus the gathered offsets. Returns [..indices, K] f32.

    A plane with the default zero point is gathered from the MatMulNBits weight itself, u8[N, K / group, group *
    bits / 8] quantized along its last axis, so a tied head and its embeddings are one initializer: ONNX Runtime
    copies each initializer it is handed, and the SmolLM2 session's peak RSS fell from 593 to 567 MB (its Q8_0
    table is 28 MB), the logits bit for bit the same. The scales stay two initializers (3.5 MB there: MatMulNBits
    refuses the gather's [N, K / group, 1]). A plane with zero points (packed along K for MatMulNBits, not per
    block as the gather reads them) is gathered from a [N, K * bits / 8] view of the same bytes, which ORT holds
    as a second copy."""
    n, k = w.shape
    groups = [0] * rank + [k // w.group, w.group]
    y = None
    for i, p in enumerate(w.planes):
        if p.zero_points is None:
            inputs = [L.initializer(p.packed, f"{name}.q{i}"), indices]
            inputs.append(L.initializer(p.scales.reshape(n, -1, 1), f"{name}.block_scales{i}"))
            attributes = {"bits": p.bits, "block_size": w.group, "gather_axis": 0, "quantize_axis": 2}
            out = L.op("GatherBlockQuantized", inputs, attributes, hint=hint, domain=MS_DOMAIN)  # [.., K / g, g]
        else:
            inputs = [L.initializer(p.packed.reshape(n, -1), f"{name}.rows{i}"), indices]
            inputs.append(L.initializer(p.scales, f"{name}.scales{i}"))
            inputs.append(L.initializer(p.zero_points, f"{name}.zero_points{i}"))
            attributes = {"bits": p.bits, "block_size": w.group, "gather_axis": 0, "quantize_axis": 1}
            out = L.op("GatherBlockQuantized", inputs, attributes, hint=hint, domain=MS_DOMAIN)  # [.., K]
            out = L.op("Reshape", [out, L.const(np.array(groups, dtype=np.int64), "groups")], hint=hint)
        y = out if y is None else L.op("Add", [y, out], hint=hint)
    if w.offsets is not None:
        shift = L.op("Gather", [L.initializer(w.offsets, f"{name}.offsets"), indices], {"axis": 0}, hint=hint)
        shift = L.op("Unsqueeze", [shift, L.const(np.array([-1], dtype=np.int64), "axes")], hint=hint)
        y = L.op("Add", [y, shift], hint=hint)
    return L.op("Reshape", [y, L.const(np.array([0] * rank + [k], dtype=np.int64), "shape")], hint=hint)


def dequantized(w: PackedWeight) -> np.ndarray:
    """f32[N, K]: the weight `w` packs (for a use other than a matmul or a lookup)."""
    n, k = w.shape
    total = np.zeros((n, k // w.group, w.group), dtype=np.float32)
    for p in w.planes:
        codes = _unpack_rows(p.packed.reshape(n, -1), p.bits, k).reshape(n, k // w.group, w.group)
        zero = (
            np.full(p.scales.shape, 2 ** (p.bits - 1), np.float32)
            if p.zero_points is None
            else _unpack_rows(p.zero_points, p.bits, p.scales.shape[1]).astype(np.float32)
        )
        total += (codes.astype(np.float32) - zero[..., None]) * p.scales[..., None]
    if w.offsets is not None:
        total += w.offsets[..., None]
    return total.reshape(n, k)


def _unpack_rows(packed: np.ndarray, bits: int, m: int) -> np.ndarray:
    if bits == 8:
        return packed[:, :m]
    out = np.empty((packed.shape[0], packed.shape[1] * 2), dtype=np.uint8)
    out[:, 0::2], out[:, 1::2] = packed & np.uint8(15), packed >> np.uint8(4)
    return out[:, :m]
