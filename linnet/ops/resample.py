"""The spatial primitives that resample without weights: `pad`, max and average pooling,
adaptive average pooling and `interpolate`, over channels-first `[B, C, H, W]` as PyTorch lays
it out. One `register(OpDef(...))` per op, each defined by the torch.nn.functional call of the
same name (arguments and defaults included); window sizes follow the rules in `spatial.py`.

The references are numpy transcriptions of PyTorch's CPU kernels (aten/src/ATen/native:
AdaptiveAveragePooling.cpp, AveragePool2d.cpp, UpSample.h), the source of every index
formula below.
"""

from __future__ import annotations

from ..types.core import Shape, format_shape
from ..types.dims import Dim, ceil_divide, format_dim
from . import cases as case_draws
from .registry import OpDef, OpError, OpParam, exact, register, require_float
from .spatial import SPATIAL_NAMES, channels_first, ints, per_dim, window_output

T = OpParam
PAD_MODES = {"constant": "constant", "reflect": "reflect", "replicate": "edge"}  # PyTorch's name -> numpy's


def _np():
    import numpy

    return numpy


def _float_dtype(op: str):
    return lambda a: require_float(a["x"].dtype, op)


# ----------------------------------------------------------------------------- pad


def _pad_shape(a: dict) -> Shape:
    x: Shape = a["x"].shape
    pad, mode = list(a["pad"]), a["mode"]
    if mode not in PAD_MODES:
        raise OpError("L107", f"`pad` mode is one of {', '.join(map(repr, PAD_MODES))}, got {mode!r}", "mode")
    if len(pad) % 2:
        raise OpError("L208", f"`pad` takes (before, after) pairs from the last dim back, got {len(pad)} values", "pad")
    n = len(pad) // 2
    if x.prefix is None and n > len(x.dims):
        raise OpError("L208", f"`pad` pads {n} dims of {format_shape(x)} (rank {len(x.dims)})", "pad")
    if mode != "constant" and (x.prefix is not None or len(x.dims) not in (n + 1, n + 2) or n > 3):
        raise OpError(
            "L208",
            f"`pad` mode {mode!r} pads the last 1 to 3 dims of a [B, C, ...] or [C, ...] input: "
            f"{n} dims of {format_shape(x)}",
            "pad",
            notes=["PyTorch's reflect and replicate padding take one or two leading dims"],
        )
    dims = list(x.dims)
    for i in range(n):
        before, after, k = pad[2 * i], pad[2 * i + 1], len(dims) - 1 - i
        for p in (before, after):
            v = p.as_int() if p is not None else None
            if v is not None and v < 0:
                raise OpError("L213", f"`pad` requires paddings of 0 or more, got {v}", "pad")
        size = dims[k]
        if mode == "reflect" and size is not None and size.as_int() is not None:
            widest = max((p.as_int() or 0) for p in (before, after) if p is not None)
            if widest >= size.as_int():
                raise OpError(
                    "L214",
                    f"`pad`: reflect padding of {widest} needs a dim larger than it, got {size.as_int()} "
                    f"(dim {k} of {format_shape(x)})",
                    "pad",
                )
        dims[k] = None if None in (size, before, after) else size + before + after
    return Shape(tuple(dims), x.prefix)


def pad_reference(x, pad, mode="constant", value=0.0):
    """numpy.pad with `pad` in PyTorch's order: (before, after) pairs from the last dim back."""
    np = _np()
    widths = [(0, 0)] * x.ndim
    for i in range(len(pad) // 2):
        widths[x.ndim - 1 - i] = (int(pad[2 * i]), int(pad[2 * i + 1]))
    if mode == "constant":
        return np.pad(x, widths, constant_values=np.asarray(value, dtype=x.dtype))
    return np.pad(x, widths, mode=PAD_MODES[mode])


def _pad_cases(rng, shape):
    """A [B, C, H(, W)] input; constant, reflect or replicate padding of its last one or two dims."""
    mode = str(rng.choice(list(PAD_MODES)))
    n = int(rng.integers(1, 3))
    sizes = tuple(2 + s for s in (shape + shape)[:n])
    x = case_draws.array(rng, (2, 3) + sizes)
    pad = []
    for size in reversed(sizes):
        top = size - 1 if mode == "reflect" else 3
        pad += [Dim.of(int(rng.integers(0, top + 1))) for _ in range(2)]
    return {"x": x}, {"pad": pad, "mode": mode, "value": float(rng.choice([0.0, -1.5]))}


register(
    OpDef(
        "pad",
        [T("x", "tensor"), T("pad", "ints"), T("mode", "str", "constant"), T("value", "float", 0.0)],
        "Pads `x` (torch.nn.functional.pad): `pad` is (before, after) pairs from the last dim back, "
        '`[left, right, top, bottom]` for the last two; `mode` "constant" (with `value`), "reflect" (the edge '
        'not repeated; each padding below its dim\'s size) or "replicate" (the edge repeated).',
        _pad_shape,
        lambda a: a["x"].dtype,
        reference=pad_reference,
        category="spatial",
        exact=True,
        cases=_pad_cases,
    )
)

# ----------------------------------------------------------------------------- pooling


def pool_output(size, kernel, stride, padding, dilation, ceil_mode: bool, op: str, axis: str, x: Shape):
    """The number of windows along one dim (PyTorch's `pooling_output_shape`): the convolution's
    `(size + 2p - d(k - 1) - 1) // s + 1`, or with `ceil_mode` rounded up, less one where the
    last window would start in the right padding. The padding may be at most half the kernel
    (PyTorch's rule). None (unknown) in, None out."""
    k, p = kernel.as_int(), padding.as_int()
    if k is not None and p is not None and 2 * p > k:
        raise OpError(
            "L214",
            f"`{op}`: padding {p} is more than half the kernel {k} (PyTorch's pooling requires it at most half)",
            "padding",
        )
    if not ceil_mode:
        return window_output(size, padding, padding, kernel, stride, dilation, op, axis, x)
    floor = window_output(size, padding, padding, kernel, stride, dilation, op, axis, x)
    if floor is None:
        return None
    span = dilation * (kernel - Dim.of(1)) + Dim.of(1)
    out = ceil_divide(size + padding + padding - span, stride) + Dim.of(1)
    n, s, h, q = out.as_int(), stride.as_int(), size.as_int(), padding.as_int()
    if None in (n, s, h, q):
        raise OpError("L208", f"`{op}` with ceil_mode needs known sizes, got {axis} {format_dim(size)}", "ceil_mode")
    return Dim.of(n - 1 if (n - 1) * s >= h + q else n)


def _pool_shape(op: str):
    def rule(a: dict) -> Shape:
        x = a["x"].shape
        b, c, spatial = channels_first(x, 2, op)
        kernel = per_dim(a["kernel_size"], 2, "kernel_size", op)
        stride = per_dim(a["stride"] if a["stride"] is not None else a["kernel_size"], 2, "stride", op)
        padding = per_dim(a["padding"], 2, "padding", op, minimum=0)
        dilation = per_dim(a.get("dilation", 1), 2, "dilation", op)
        out = [
            pool_output(*args, a["ceil_mode"], op, axis, x)
            for *args, axis in zip(spatial, kernel, stride, padding, dilation, SPATIAL_NAMES[2])
        ]
        return Shape((b, c, *out))

    return rule


def pool_geometry(x_shape, kernel_size, stride, padding, dilation, ceil_mode):
    """(kernel, stride, padding, dilation, output sizes) of a 2-d pooling as Python ints, for
    the references and the backends."""
    k = ints(kernel_size, 2)
    s = ints(stride if stride is not None else kernel_size, 2)
    p, d = ints(padding, 2), ints(dilation, 2)
    out = []
    for size, ki, si, pi, di in zip(x_shape[-2:], k, s, p, d):
        span = di * (ki - 1) + 1
        n = (size + 2 * pi - span + (si - 1 if ceil_mode else 0)) // si + 1
        if ceil_mode and (n - 1) * si >= size + pi:
            n -= 1
        out.append(n)
    return k, s, p, d, tuple(out)


def pool_window(args: dict, in_dims, out_dims):
    """(kernel, stride, dilation, pads) of a 2-d pooling's arguments as the backends take them:
    ints, and per spatial dim the padding (before, after), after it what a ceil_mode window runs
    past the padded input (`in_dims`, `out_dims` the input's and result's spatial dims; known
    under ceil_mode, as the shape rule requires)."""
    k = ints(args["kernel_size"], 2)
    s = ints(args["stride"] if args["stride"] is not None else args["kernel_size"], 2)
    p, d = ints(args["padding"], 2), ints(args.get("dilation", 1), 2)
    pads = []
    for i in range(2):
        extra = 0
        if args["ceil_mode"]:
            size, out = in_dims[i].as_int(), out_dims[i].as_int()
            extra = max(0, (out - 1) * s[i] + d[i] * (k[i] - 1) + 1 - (size + 2 * p[i]))
        pads.append((p[i], p[i] + extra))
    return k, s, d, pads


def _windows(xp, k, s, d, out):
    """The pooling windows of a padded `xp` [..., H, W]: [..., out_h, out_w, kh, kw]."""
    np = _np()
    rows = np.arange(out[0])[:, None] * s[0] + np.arange(k[0])[None, :] * d[0]
    cols = np.arange(out[1])[:, None] * s[1] + np.arange(k[1])[None, :] * d[1]
    return xp[..., rows[:, None, :, None], cols[None, :, None, :]]


def _padded_for(x, p, k, s, d, out, fill):
    """`x` padded by `p` on both sides and, for ceil_mode windows running past it, with `fill`
    after that, so that every window of `out` is inside."""
    np = _np()
    widths = [(0, 0)] * (x.ndim - 2)
    for i in range(2):
        need = (out[i] - 1) * s[i] + d[i] * (k[i] - 1) + 1 - (x.shape[-2 + i] + 2 * p[i])
        widths.append((p[i], p[i] + max(0, need)))
    return np.pad(x, widths, constant_values=fill)


def max_pool2d_reference(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False):
    """The maximum of each window; padding never wins (it is -inf)."""
    np = _np()
    k, s, p, d, out = pool_geometry(x.shape, kernel_size, stride, padding, dilation, ceil_mode)
    xp = _padded_for(x, p, k, s, d, out, -np.inf)
    return _windows(xp, k, s, d, out).max(axis=(-2, -1)).astype(x.dtype)


def avg_pool_divisors(size_h, size_w, k, s, p, out, count_include_pad):
    """[out_h, out_w] the divisor of each window (PyTorch's avg_pool2d CPU kernel): with
    `count_include_pad` the window clipped to the padded input (`hend = min(hstart + k, size
    + p)`), else to the input itself."""
    np = _np()
    divisors = []
    for size, ki, si, pi, n in zip((size_h, size_w), k, s, p, out):
        start = np.arange(n) * si - pi
        end = np.minimum(start + ki, size + pi)
        if not count_include_pad:
            start, end = np.maximum(start, 0), np.minimum(end, size)
        divisors.append(end - start)
    return np.outer(divisors[0], divisors[1])


def avg_pool2d_reference(x, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True):
    """The mean of each window, padding counted as zeros (`count_include_pad`) or left out."""
    np = _np()
    k, s, p, d, out = pool_geometry(x.shape, kernel_size, stride, padding, 1, ceil_mode)
    xp = _padded_for(x.astype(np.float64), p, k, s, d, out, 0.0)
    sums = _windows(xp, k, s, d, out).sum(axis=(-2, -1))
    return (sums / avg_pool_divisors(*x.shape[-2:], k, s, p, out, count_include_pad)).astype(x.dtype)


def _pool_cases(with_dilation: bool):
    def draw(rng, shape):
        """A [B, C, H, W] input, a window of 1 to 3 (a pair or one int), stride 1 to 3 or the
        default (the kernel), padding up to half the kernel, ceil_mode either way."""
        kernel = [int(rng.integers(1, 4)) for _ in range(2)]
        dilation = [int(rng.integers(1, 3)) for _ in range(2)] if with_dilation else [1, 1]
        sizes = tuple(d * (k - 1) + 1 + (shape + shape)[i] for i, (k, d) in enumerate(zip(kernel, dilation)))
        const = {
            "kernel_size": [Dim.of(k) for k in kernel],
            "stride": None if rng.integers(0, 3) == 0 else Dim.of(int(rng.integers(1, 4))),
            "padding": [Dim.of(int(rng.integers(0, k // 2 + 1))) for k in kernel],
            "ceil_mode": bool(rng.integers(0, 2)),
        }
        if with_dilation:
            const["dilation"] = [Dim.of(d) for d in dilation]
        else:
            const["count_include_pad"] = bool(rng.integers(0, 2))
        return {"x": case_draws.array(rng, (2, 3) + sizes) - 1.0}, const

    return draw


_POOL_PARAMS = [T("x", "tensor"), T("kernel_size", "window"), T("stride", "window", None), T("padding", "window", 0)]
register(
    OpDef(
        "max_pool2d",
        _POOL_PARAMS + [T("dilation", "window", 1), T("ceil_mode", "bool", False)],
        "2-d max pooling (torch.nn.functional.max_pool2d) of `x` [B, C, H, W]: `stride` defaults to the kernel; "
        "padding (at most half the kernel) never wins; with `ceil_mode` a last partial window counts.",
        _pool_shape("max_pool2d"),
        _float_dtype("max_pool2d"),
        reference=max_pool2d_reference,
        category="spatial",
        exact=True,
        cases=_pool_cases(True),
    )
)
register(
    OpDef(
        "avg_pool2d",
        _POOL_PARAMS + [T("ceil_mode", "bool", False), T("count_include_pad", "bool", True)],
        "2-d average pooling (torch.nn.functional.avg_pool2d) of `x` [B, C, H, W]: `stride` defaults to the "
        "kernel; with `count_include_pad` (PyTorch's default) padding counts as zeros in each window's mean.",
        _pool_shape("avg_pool2d"),
        _float_dtype("avg_pool2d"),
        reference=avg_pool2d_reference,
        category="spatial",
        cases=_pool_cases(False),
    )
)


def _adaptive_shape(a: dict) -> Shape:
    x = a["x"].shape
    b, c, spatial = channels_first(x, 2, "adaptive_avg_pool2d")
    out = per_dim(a["output_size"], 2, "output_size", "adaptive_avg_pool2d")
    for size, o, axis in zip(spatial, out, SPATIAL_NAMES[2]):
        if size is not None and o is not None:
            exact(size, o, f"adaptive_avg_pool2d to {format_dim(o)} needs an output size dividing the {axis}", "x")
    return Shape((b, c, *out))


def adaptive_avg_pool2d_reference(x, output_size):
    """PyTorch's adaptive average pooling: output cell i of n over a dim of size h averages
    inputs `h * i // n` to `ceil(h * (i + 1) / n)` (AdaptiveAveragePooling.cpp)."""
    np = _np()
    oh, ow = ints(output_size, 2)
    h, w = x.shape[-2:]
    out = np.empty(x.shape[:-2] + (oh, ow), dtype=np.float64)
    for i in range(oh):
        for j in range(ow):
            rows = slice(h * i // oh, -(-h * (i + 1) // oh))
            cols = slice(w * j // ow, -(-w * (j + 1) // ow))
            out[..., i, j] = x[..., rows, cols].astype(np.float64).mean(axis=(-2, -1))
    return out.astype(x.dtype)


def _adaptive_cases(rng, shape):
    """Output 1x1 (global pooling) or sizes that divide the input's."""
    out = [int(rng.integers(1, 4)) for _ in range(2)] if rng.integers(0, 2) else [1, 1]
    sizes = tuple(o * (shape + shape)[i] for i, o in enumerate(out))
    size = Dim.of(out[0]) if out[0] == out[1] and rng.integers(0, 2) else [Dim.of(o) for o in out]
    return {"x": case_draws.array(rng, (2, 3) + sizes)}, {"output_size": size}


register(
    OpDef(
        "adaptive_avg_pool2d",
        [T("x", "tensor"), T("output_size", "window")],
        "Adaptive 2-d average pooling (torch.nn.functional.adaptive_avg_pool2d) of `x` [B, C, H, W] to "
        "[B, C, *output_size]: `1` is global average pooling; other sizes must divide the input's (each cell "
        "then averages an equal block; PyTorch's overlapping cells for sizes that do not divide are not supported).",
        _adaptive_shape,
        _float_dtype("adaptive_avg_pool2d"),
        reference=adaptive_avg_pool2d_reference,
        category="spatial",
        cases=_adaptive_cases,
    )
)

# ----------------------------------------------------------------------------- interpolate

INTERPOLATE_MODES = ("nearest", "bilinear", "bicubic")
CUBIC_A = -0.75  # PyTorch's bicubic convolution coefficient (UpSample.h, `get_cubic_upsample_coefficients`)


def _interpolate_shape(a: dict) -> Shape:
    x = a["x"].shape
    op = "interpolate"
    b, c, spatial = channels_first(x, 2, op)
    mode, size, scale = a["mode"], a["size"], a["scale_factor"]
    if mode not in INTERPOLATE_MODES:
        raise OpError("L107", f"`interpolate` mode is one of {', '.join(map(repr, INTERPOLATE_MODES))}, got {mode!r}")
    if a["align_corners"] and mode == "nearest":
        raise OpError("L208", "`interpolate` takes `align_corners` for bilinear and bicubic only", "align_corners")
    if (size is None) == (scale is None):
        given = "size" if size is not None else None
        raise OpError("L208", "`interpolate` takes one of `size` and `scale_factor`", given)
    if size is not None:
        return Shape((b, c, *per_dim(size, 2, "size", op)))
    if scale <= 0:
        raise OpError("L213", f"`interpolate` requires a positive `scale_factor`, got {scale}", "scale_factor")
    out = []
    for d in spatial:
        if d is None:
            out.append(None)
        elif float(scale).is_integer():
            out.append(d * Dim.of(int(scale)))
        elif d.as_int() is not None:
            out.append(Dim.of(int(d.as_int() * scale)))  # floor(size * scale), as PyTorch
        else:
            raise OpError(
                "L208",
                f"`interpolate` by {scale} needs known sizes (or an integer factor), got {format_dim(d)}",
                "scale_factor",
            )
    return Shape((b, c, *out))


def source_scale(in_size: int, out_size: int, align_corners: bool, scale_factor: float | None) -> float:
    """The step between output positions in input coordinates (PyTorch's `area_pixel_compute_scale`):
    `(in - 1) / (out - 1)` with `align_corners`, else `1 / scale_factor` where one is given,
    else `in / out`; f32, as the kernel computes it for f32 inputs."""
    np = _np()
    if align_corners:
        return float(np.float32((in_size - 1) / (out_size - 1))) if out_size > 1 else 0.0
    if scale_factor is not None:
        return float(np.float32(1.0 / scale_factor))
    return float(np.float32(in_size / out_size))


def source_index(out_size: int, scale: float, align_corners: bool, mode: str):
    """f32 [out_size] the input coordinate of each output position (`area_pixel_compute_source_index`):
    `scale * i` with `align_corners`, else `scale * (i + 0.5) - 0.5` (clamped at 0 for bilinear;
    bicubic reads past the edge, clamped per tap)."""
    np = _np()
    i = np.arange(out_size, dtype=np.float32)
    s = np.float32(scale)
    if align_corners:
        return s * i
    src = s * (i + np.float32(0.5)) - np.float32(0.5)
    return np.maximum(src, np.float32(0)) if mode == "bilinear" else src


def interpolation_weights(in_size: int, out_size: int, mode: str, align_corners: bool, scale_factor):
    """(indices [out, taps] int64, weights [out, taps] f32) of one dim: output position i is
    `sum_t weights[i, t] * input[indices[i, t]]` (nearest: 1 tap, bilinear: 2, bicubic: 4),
    PyTorch's UpSample kernels' indices and weights."""
    np = _np()
    scale = source_scale(in_size, out_size, align_corners, scale_factor)
    if mode == "nearest":
        src = np.floor(np.arange(out_size, dtype=np.float32) * np.float32(scale)).astype(np.int64)
        return np.minimum(src, in_size - 1)[:, None], np.ones((out_size, 1), np.float32)
    src = source_index(out_size, scale, align_corners, mode)
    # `guard_index_and_lambda`: the index at most the last, the fraction within [0, 1]
    base = np.minimum(np.floor(src).astype(np.int64), in_size - 1)
    t = np.clip(src - base.astype(np.float32), np.float32(0), np.float32(1)).astype(np.float32)
    if mode == "bilinear":
        upper = np.minimum(base + 1, in_size - 1)
        return np.stack([base, upper], 1), np.stack([np.float32(1) - t, t], 1).astype(np.float32)
    a = np.float32(CUBIC_A)

    def near(u):  # |u| <= 1: ((A + 2) u - (A + 3)) u^2 + 1
        return ((a + 2) * u - (a + 3)) * u * u + 1

    def far(u):  # 1 < |u| < 2: ((A u - 5 A) u + 8 A) u - 4 A
        return ((a * u - 5 * a) * u + 8 * a) * u - 4 * a

    weights = np.stack([far(t + 1), near(t), near(1 - t), far(2 - t)], 1).astype(np.float32)
    taps = np.clip(base[:, None] + np.arange(-1, 3)[None, :], 0, in_size - 1)
    return taps, weights


def interpolate_reference(x, size=None, scale_factor=None, mode="nearest", align_corners=False):
    """Resampling of `x` [B, C, H, W] one dim at a time (rows, then columns), each output the
    weighted sum of its taps (`interpolation_weights`), in f64."""
    np = _np()
    h, w = x.shape[-2:]
    if size is not None:
        oh, ow = ints(size, 2)
    else:
        oh, ow = int(h * scale_factor), int(w * scale_factor)
    out = x.astype(np.float64)
    for axis, (n_in, n_out) in ((-2, (h, oh)), (-1, (w, ow))):
        idx, wts = interpolation_weights(n_in, n_out, mode, align_corners, scale_factor)
        taps = np.take(out, idx, axis=axis)  # [..., n_out, taps(, W)] along `axis`
        if axis == -2:
            out = np.einsum("bcotw,ot->bcow", taps, wts.astype(np.float64))
        else:
            out = np.einsum("bchot,ot->bcho", taps, wts.astype(np.float64))
    return out.astype(x.dtype)


def _interpolate_cases(rng, shape):
    """Nearest, bilinear or bicubic, by `size` (up or down) or by an integer or fractional
    `scale_factor`, with and without `align_corners`."""
    mode = str(rng.choice(INTERPOLATE_MODES))
    sizes = tuple(1 + (shape + shape)[i] for i in range(2))
    const = {"mode": mode, "align_corners": mode != "nearest" and bool(rng.integers(0, 2))}
    if rng.integers(0, 2):
        const["size"] = [Dim.of(int(rng.integers(1, 8))) for _ in range(2)]
    else:
        const["scale_factor"] = float(rng.choice([2.0, 3.0, 0.5, 1.5]))
    return {"x": case_draws.array(rng, (2, 3) + sizes) - 1.0}, const


register(
    OpDef(
        "interpolate",
        [
            T("x", "tensor"),
            T("size", "window", None),
            T("scale_factor", "float", None),
            T("mode", "str", "nearest"),
            T("align_corners", "bool", False),
        ],
        "Resizes `x` [B, C, H, W] (torch.nn.functional.interpolate, antialias off) to `size` (an int or a pair) "
        'or by `scale_factor` (each size floored); `mode` "nearest" (PyTorch\'s floor rule), "bilinear" or '
        '"bicubic" (coefficient -0.75), `align_corners` as PyTorch defines it.',
        _interpolate_shape,
        _float_dtype("interpolate"),
        reference=interpolate_reference,
        category="spatial",
        cases=_interpolate_cases,
    )
)
