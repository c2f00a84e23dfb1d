"""The spatial primitives: convolutions over `[B, C, L]` and `[B, C, H, W]`, channels first as
PyTorch lays them out. One `register(OpDef(...))` per op (see `OpDef`); the rules shared by
the ops of this family (window arguments, padding, output sizes) are the functions at the top.

Output sizes are dims: `(H + 2 * p - d * (k - 1) - 1) // s + 1` (PyTorch's Conv2d docs,
"Shape") with symbolic floor division, so `conv2d` on `[B, 3, 224, 224]` with a 16x16 kernel
and stride 16 gives `[B, 768, 14, 14]` under a preset and `(H - 16) // 16 + 1` for a dim
variable `H`. A window larger than its (padded) input is an error naming both sizes (L214);
input channels that do not match the weight's name the dim (L215).
"""

from __future__ import annotations

from ..types.core import Shape, TensorT, format_shape
from ..types.dims import Dim, DivisionError, floor_divide, format_dim, product
from . import cases as case_draws
from .registry import OpDef, OpError, OpParam, join_dtypes, register, require_float, same_dim

T = OpParam
SPATIAL_NAMES = {1: ("length",), 2: ("height", "width"), 3: ("depth", "height", "width")}


def _np():
    import numpy

    return numpy


# ----------------------------------------------------------------------------- shared rules


def per_dim(value, n: int, arg: str, op: str, minimum: int = 1) -> list[Dim]:
    """A `window` argument (an int or a list of ints) as `n` dims, one per spatial dim: `2` is
    `[2, 2]` for a 2-d op. Raises OpError (L208) for a list of another length, L213 for a value
    below `minimum` where one is known (a stride or dilation of 0, a negative padding)."""
    dims = list(value) if isinstance(value, (list, tuple)) else [value] * n
    if len(dims) != n:
        raise OpError("L208", f"`{op}` takes {n} value(s) for `{arg}` (one per spatial dim), got {len(dims)}", arg)
    dims = [Dim.of(d) if isinstance(d, int) else d for d in dims]
    for d in dims:
        v = d.as_int() if d is not None else None
        if v is not None and v < minimum:
            raise OpError("L213", f"`{op}` requires `{arg}` of {minimum} or more, got {v}", arg)
    return dims


def resolve_padding(padding, kernel: list[Dim], dilation: list[Dim], stride: list[Dim], op: str):
    """Explicit padding, a (before, after) pair of dims per spatial dim, for a `padding`
    argument: an int or list of ints pads both sides alike; "valid" is no padding; "same" pads
    `d * (k - 1)` in all, the odd one after (PyTorch's `_conv_forward` with padding="same":
    `left = total // 2`, `right = total - left`), and like PyTorch refuses strides above 1."""
    n = len(kernel)
    if padding == "valid":
        return [(Dim.of(0), Dim.of(0))] * n
    if padding == "same":
        strided = [s for s in stride if s is None or s.as_int() != 1]
        if strided:
            raise OpError(
                "L208",
                f'`{op}` with padding="same" requires stride 1, got {format_dim(strided[0])}',
                "padding",
                notes=['PyTorch refuses padding="same" for strided convolutions; give the padding as ints'],
            )
        out = []
        for k, d in zip(kernel, dilation):
            if k is None or d is None:
                out.append((None, None))
                continue
            total = d * (k - Dim.of(1))
            left = floor_divide(total, Dim.of(2))
            out.append((left, total - left))
        return out
    return [(p, p) for p in per_dim(padding, n, "padding", op, minimum=0)]


def window_output(size, before, after, kernel, stride, dilation, op: str, axis: str, x: Shape, arg: str = "x"):
    """`(size + before + after - dilation * (kernel - 1) - 1) // stride + 1`: the number of
    positions a dilated window of `kernel` fits at, `stride` apart, in `size` padded by
    `before` and `after` (PyTorch's Conv2d and MaxPool2d docs, "Shape"). Raises L214 when the
    window is larger than the padded input, naming both sizes. None (unknown) in, None out."""
    if None in (size, before, after, kernel, stride, dilation):
        return None
    padded = size + before + after
    span = dilation * (kernel - Dim.of(1)) + Dim.of(1)
    p, w = padded.as_int(), span.as_int()
    if p is not None and w is not None and w > p:
        padding = "" if padded.same(size) else f" ({_valued(size)} padded to {p})"
        dilated = "" if span.same(kernel) else f" (kernel {_valued(kernel)} dilated by {_valued(dilation)})"
        raise OpError(
            "L214",
            f"`{op}`: a window of {w}{dilated} is larger than the input's {axis} of {_valued(size)}{padding}",
            arg,
            arg_labels={"x": format_shape(x)},
            notes=["consider a smaller kernel, padding, or a larger input"],
        )
    q = floor_divide(padded - span, stride)
    if isinstance(q, DivisionError):  # a zero stride: refused by `per_dim` where it is known
        raise OpError("L206", f"`{op}`: {q.reason}", "stride")
    return q + Dim.of(1)


def _valued(d: Dim) -> str:
    """A dim as written, with its value where that is not the same text (`c.image_size = 7`): the sizes a
    caller's preset gives a layer checked for every size."""
    text, n = format_dim(d), d.as_int()
    return text if n is None or text == str(n) else f"{text} = {n}"


def channels_first(x: Shape, n: int, op: str, arg: str = "x") -> tuple[Dim | None, Dim | None, list]:
    """(batch, channels, spatial dims) of a `[B, C, *spatial]` input of `n` spatial dims."""
    if x.prefix is not None or len(x.dims) != n + 2:
        layout = "[B, C, " + ", ".join(s[0].upper() for s in SPATIAL_NAMES[n]) + "]"
        raise OpError("L208", f"`{op}` requires `{arg}` of rank {n + 2}, {layout}, got {format_shape(x)}", arg)
    return x.dims[0], x.dims[1], list(x.dims[2:])


def _weights_dtype(a: dict, op: str):
    """The dtype of an op over `x` and its `weight` (and `bias`, when given): floats, all one dtype."""
    d = require_float(a["x"].dtype, op, "x")
    for arg in ("weight", "bias"):
        t = a.get(arg)
        if isinstance(t, TensorT):
            try:
                d = join_dtypes(d, t.dtype, op)
            except OpError as err:
                err.arg = arg
                raise
    return d


# ----------------------------------------------------------------------------- convolution


def _conv_shape(n: int, op: str):
    def rule(a: dict) -> Shape:
        x, w = a["x"].shape, a["weight"].shape
        b, c, spatial = channels_first(x, n, op)
        if w.prefix is not None or len(w.dims) != n + 2:
            raise OpError(
                "L208",
                f"`{op}` requires a weight [out_channels, in_channels / groups, "
                + ", ".join(f"k{s[0]}" for s in SPATIAL_NAMES[n])
                + f"], got {format_shape(w)}",
                "weight",
            )
        out_c, in_per_group, kernel = w.dims[0], w.dims[1], list(w.dims[2:])
        groups, _ = _groups(a, op)
        _check_channels(c, in_per_group, out_c, groups, x, w, op)
        _check_bias(a.get("bias"), out_c, op)
        stride = per_dim(a["stride"], n, "stride", op)
        dilation = per_dim(a["dilation"], n, "dilation", op)
        pads = resolve_padding(a["padding"], kernel, dilation, stride, op)
        out = [
            window_output(size, lo, hi, k, s, d, op, axis, x)
            for size, (lo, hi), k, s, d, axis in zip(spatial, pads, kernel, stride, dilation, SPATIAL_NAMES[n])
        ]
        return Shape((b, out_c, *out))

    return rule


def _groups(a: dict, op: str) -> tuple[Dim | None, int | None]:
    """(`groups` as a dim, its value where known); L213 below 1."""
    groups = Dim.of(a["groups"]) if isinstance(a["groups"], int) else a["groups"]  # the default is an int
    g = groups.as_int() if groups is not None else None
    if g is not None and g < 1:
        raise OpError("L213", f"`{op}` requires `groups` of 1 or more, got {g}", "groups")
    return groups, g


def _check_channels(c, in_per_group, out_c, groups, x: Shape, w: Shape, op: str) -> None:
    """The input's channels (dim 1) are the weight's in_channels / groups times groups, and
    groups divide the weight's out_channels (PyTorch's Conv2d)."""
    g = groups.as_int() if groups is not None else None
    if groups is not None and in_per_group is not None and c is not None:
        grouped = "" if g == 1 else f" (in_channels / groups = {format_dim(in_per_group)}, groups = {g})"
        channel_mismatch(c, in_per_group * groups, x, w, op, grouped)
    _check_divides(out_c, g, "out_channels", op)


def _check_divides(channels, g: int | None, what: str, op: str) -> None:
    if g is not None and channels is not None and channels.as_int() is not None and channels.as_int() % g:
        raise OpError("L206", f"`{op}`: groups = {g} does not divide the weight's {what} {channels.as_int()}", "groups")


def channel_mismatch(c: Dim, want: Dim, x: Shape, w: Shape, op: str, detail: str = "") -> None:
    """L215 when the input's channels (dim 1) `c` are not the `want` the weight takes; a note
    says so where the input looks channels-last (its last dim is `want`)."""
    if same_dim(c, want):
        return
    last = x.dims[-1] if x.dims else None
    notes = ["`x` is [B, C, ...] with channels at dim 1, as PyTorch lays it out"]
    if last is not None and same_dim(last, want) and not same_dim(c, last):
        notes = [f"the input's last dim is {format_dim(last)}: it looks channels-last; consider "
                 '`rearrange(x, "b ... c -> b c ...")` first']  # fmt: skip
    raise OpError(
        "L215",
        f"`{op}`: the input {format_shape(x)} has {format_dim(c)} channels (dim 1), the weight "
        f"{format_shape(w)} takes {format_dim(want)}{detail}",
        "x",
        arg_labels={"x": format_shape(x), "weight": format_shape(w)},
        dims=(c, want),
        notes=notes,
    )


def _check_bias(bias, out_c, op: str) -> None:
    if isinstance(bias, TensorT):
        bs = bias.shape
        if bs.prefix is not None or len(bs.dims) != 1 or not same_dim(bs.dims[0], out_c):
            raise OpError(
                "L203", f"`{op}` requires a bias [out_channels] = [{format_dim(out_c)}], got {format_shape(bs)}", "bias"
            )


def _conv_flops(a: dict, results: list):
    """2 x multiply-adds: each output element sums in_channels / groups x the kernel's elements."""
    return Dim.of(2) * product(results[0].shape.dims) * product(a["weight"].shape.dims[1:])


def explicit_padding(padding, kernel: tuple[int, ...], dilation, stride) -> list[tuple[int, int]]:
    """`resolve_padding` on known ints, as the references and backends need it: (before,
    after) per spatial dim."""
    n = len(kernel)
    pads = resolve_padding(
        padding if isinstance(padding, str) else _dims(padding, n),
        [Dim.of(k) for k in kernel],
        _dims(dilation, n),
        _dims(stride, n),
        "conv",
    )
    return [(lo.as_int(), hi.as_int()) for lo, hi in pads]


def ints(value, n: int) -> tuple[int, ...]:
    """A window argument (an int, a `Dim`, or a list of them) as `n` Python ints."""
    items = list(value) if isinstance(value, (list, tuple)) else [value] * n
    out = tuple(int(v.as_int()) if isinstance(v, Dim) else int(v) for v in items)
    assert len(out) == n, (value, n)
    return out


def _dims(value, n: int) -> list[Dim]:
    return [Dim.of(v) for v in ints(value, n)]


def conv_reference(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """The numpy definition of an n-d convolution (cross-correlation, as PyTorch's): `x`
    [B, C, *spatial], `weight` [O, C / groups, *kernel], `bias` [O] or None. Sums in f64, one
    kernel offset at a time, and returns `x`'s dtype."""
    np = _np()
    n = weight.ndim - 2
    kernel = weight.shape[2:]
    s, d = ints(stride, n), ints(dilation, n)
    pads = explicit_padding(padding, kernel, d, s)
    groups = int(groups.as_int() if isinstance(groups, Dim) else groups)
    xp = np.pad(x.astype(np.float64), [(0, 0), (0, 0)] + pads)
    b, c = xp.shape[:2]
    o = weight.shape[0]
    out_sizes = [(xp.shape[2 + i] - d[i] * (kernel[i] - 1) - 1) // s[i] + 1 for i in range(n)]
    xg = xp.reshape(b, groups, c // groups, *xp.shape[2:])
    wg = weight.astype(np.float64).reshape(groups, o // groups, c // groups, *kernel)
    out = np.zeros((b, groups, o // groups, *out_sizes))
    for k in np.ndindex(*kernel):
        window = tuple(slice(k[i] * d[i], k[i] * d[i] + s[i] * (out_sizes[i] - 1) + 1, s[i]) for i in range(n))
        patch = xg[(slice(None), slice(None), slice(None), *window)]
        out += np.einsum("bgc...,goc->bgo...", patch, wg[(..., *k)])
    out = out.reshape(b, o, *out_sizes)
    if bias is not None:
        out += bias.astype(np.float64).reshape(1, o, *[1] * n)
    return out.astype(x.dtype)


def _conv_cases(n: int):
    def draw(rng, shape):
        """A grouped, strided, dilated, padded convolution around `shape`: odd and even sizes,
        padding as an int, a list, "same" (stride 1) or "valid", with or without a bias."""
        groups = int(rng.choice([1, 2]))
        c_in, c_out = groups * int(rng.integers(1, 3)), groups * int(rng.integers(1, 3))
        kernel = tuple(int(rng.integers(1, 4)) for _ in range(n))
        stride = [int(rng.integers(1, 3)) for _ in range(n)]
        dilation = [int(rng.integers(1, 3)) for _ in range(n)]
        style = int(rng.integers(0, 4))
        if style == 0:
            padding = Dim.of(int(rng.integers(0, 2)))
        elif style == 1:
            padding = [Dim.of(int(rng.integers(0, 3))) for _ in range(n)]
        else:
            padding = "same" if style == 2 else "valid"
            stride = [1] * n if padding == "same" else stride
        sizes = tuple(
            dilation[i] * (kernel[i] - 1) + 1 + shape[i % len(shape)] + int(rng.integers(0, 2)) for i in range(n)
        )
        tensors = {
            "x": case_draws.array(rng, (shape[0], c_in, *sizes)),
            "weight": case_draws.array(rng, (c_out, c_in // groups, *kernel)) - 1.0,
        }
        if rng.integers(0, 2):
            tensors["bias"] = case_draws.array(rng, (c_out,))
        window = lambda v: Dim.of(v[0]) if len(set(v)) == 1 and rng.integers(0, 2) else [Dim.of(i) for i in v]  # noqa: E731
        const = {"stride": window(stride), "padding": padding, "dilation": window(dilation), "groups": Dim.of(groups)}
        return tensors, const

    return draw


# the leading parameters of the convolutions, as torch.nn.functional orders them
_WEIGHTED = [T("x", "tensor"), T("weight", "tensor"), T("bias", "tensor", None), T("stride", "window", 1)]


def _conv(n: int) -> None:
    name = f"conv{n}d"
    layout = {1: "[B, C, L]", 2: "[B, C, H, W]"}[n]
    register(
        OpDef(
            name,
            _WEIGHTED + [T("padding", "padding", 0), T("dilation", "window", 1), T("groups", "int", 1)],
            f"{n}-d convolution (torch.nn.functional.{name}): `x` {layout} with `weight` "
            f"[out_channels, in_channels / groups, {', '.join('k' + s[0] for s in SPATIAL_NAMES[n])}] and an optional "
            "`bias` [out_channels]. `stride`, `dilation` and `padding` take an int or one per spatial dim; "
            'padding also "same" (stride 1) or "valid". Each output size is '
            "`(size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1`.",
            _conv_shape(n, name),
            lambda a, _name=name: _weights_dtype(a, _name),
            reference=conv_reference,
            category="spatial",
            cases=_conv_cases(n),
            flops=_conv_flops,
        )
    )


_conv(1)
_conv(2)

# ----------------------------------------------------------------------------- transposed convolution


def _conv_transpose_shape(a: dict) -> Shape:
    """(H - 1) * stride - 2 * padding + dilation * (kernel - 1) + output_padding + 1 per spatial dim
    (PyTorch's ConvTranspose2d docs, "Shape"); weight [in_channels, out_channels / groups, kH, kW]."""
    op = "conv_transpose2d"
    x, w = a["x"].shape, a["weight"].shape
    b, c, spatial = channels_first(x, 2, op)
    if w.prefix is not None or len(w.dims) != 4:
        layout = "[in_channels, out_channels / groups, kH, kW]"
        raise OpError("L208", f"`{op}` requires a weight {layout}, got {format_shape(w)}", "weight")
    in_c, out_per_group, kernel = w.dims[0], w.dims[1], list(w.dims[2:])
    groups, g = _groups(a, op)
    if c is not None and in_c is not None:
        channel_mismatch(c, in_c, x, w, op)
    _check_divides(in_c, g, "in_channels", op)
    out_c = out_per_group * groups if out_per_group is not None and groups is not None else None
    _check_bias(a.get("bias"), out_c, op)
    stride = per_dim(a["stride"], 2, "stride", op)
    dilation = per_dim(a["dilation"], 2, "dilation", op)
    padding = per_dim(a["padding"], 2, "padding", op, minimum=0)
    extra = per_dim(a["output_padding"], 2, "output_padding", op, minimum=0)
    out = []
    for size, k, s, d, p, e in zip(spatial, kernel, stride, dilation, padding, extra):
        if e is not None and e.as_int() is not None and s.as_int() is not None and d.as_int() is not None:
            if e.as_int() >= max(s.as_int(), d.as_int()):
                raise OpError(
                    "L208",
                    f"`{op}`: output_padding {e.as_int()} must be smaller than the stride or the dilation "
                    f"({s.as_int()}, {d.as_int()})",
                    "output_padding",
                )
        if None in (size, k, s, d, p, e):
            out.append(None)
            continue
        size_out = (size - Dim.of(1)) * s - p - p + d * (k - Dim.of(1)) + e + Dim.of(1)
        if size_out.as_int() is not None and size_out.as_int() < 1:
            raise OpError("L214", f"`{op}`: padding {format_dim(p)} leaves no output of an input of {format_dim(size)}")
        out.append(size_out)
    return Shape((b, out_c, *out))


def conv_transpose_reference(x, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    """The numpy definition of a 2-d transposed convolution (the gradient of `conv2d` with respect
    to its input, as PyTorch's): each input element adds `x * weight[c, o]` to the outputs its
    kernel covers, spread by the stride and dilation; `padding` is then cut from each side
    (`output_padding` more kept at the end). Sums in f64; returns `x`'s dtype."""
    np = _np()
    s, p, e, d = ints(stride, 2), ints(padding, 2), ints(output_padding, 2), ints(dilation, 2)
    groups = int(groups.as_int() if isinstance(groups, Dim) else groups)
    b, c, h, w = x.shape
    kernel = weight.shape[2:]
    og = weight.shape[1]
    full = [(n - 1) * s[i] + d[i] * (kernel[i] - 1) + 1 + e[i] for i, n in enumerate((h, w))]
    out = np.zeros((b, groups, og, *full))
    xg = x.astype(np.float64).reshape(b, groups, c // groups, h, w)
    wg = weight.astype(np.float64).reshape(groups, c // groups, og, *kernel)
    for k in np.ndindex(*kernel):
        rows = slice(k[0] * d[0], k[0] * d[0] + (h - 1) * s[0] + 1, s[0])
        cols = slice(k[1] * d[1], k[1] * d[1] + (w - 1) * s[1] + 1, s[1])
        out[:, :, :, rows, cols] += np.einsum("bgchw,gco->bgohw", xg, wg[:, :, :, k[0], k[1]])
    out = out.reshape(b, groups * og, *full)[:, :, p[0] : full[0] - p[0], p[1] : full[1] - p[1]]
    if bias is not None:
        out = out + bias.astype(np.float64).reshape(1, -1, 1, 1)
    return out.astype(x.dtype)


def _conv_transpose_cases(rng, shape):
    """Grouped, strided, dilated transposed convolutions with padding and output_padding (below
    the stride or the dilation), with or without a bias."""
    groups = int(rng.choice([1, 2]))
    c_in, out_per_group = groups * int(rng.integers(1, 3)), int(rng.integers(1, 3))
    kernel = tuple(int(rng.integers(1, 4)) for _ in range(2))
    stride = [int(rng.integers(1, 3)) for _ in range(2)]
    dilation = [int(rng.integers(1, 3)) for _ in range(2)]
    padding = [int(rng.integers(0, d * (k - 1) // 2 + 1)) for k, d in zip(kernel, dilation)]
    extra = [int(rng.integers(0, max(s, d))) for s, d in zip(stride, dilation)]
    sizes = tuple((shape + shape)[i] + 1 for i in range(2))
    tensors = {
        "x": case_draws.array(rng, (shape[0], c_in, *sizes)),
        "weight": case_draws.array(rng, (c_in, out_per_group, *kernel)) - 1.0,
    }
    if rng.integers(0, 2):
        tensors["bias"] = case_draws.array(rng, (groups * out_per_group,))
    as_dims = lambda v: [Dim.of(i) for i in v]  # noqa: E731
    const = {
        "stride": as_dims(stride),
        "padding": as_dims(padding),
        "output_padding": as_dims(extra),
        "groups": Dim.of(groups),
        "dilation": as_dims(dilation),
    }
    return tensors, const


register(
    OpDef(
        "conv_transpose2d",
        _WEIGHTED
        + [T("padding", "window", 0), T("output_padding", "window", 0)]
        + [T("groups", "int", 1), T("dilation", "window", 1)],
        "2-d transposed convolution (torch.nn.functional.conv_transpose2d, its argument order): `x` [B, C, H, W] "
        "with `weight` [in_channels, out_channels / groups, kH, kW] and an optional `bias` [out_channels]. Each "
        "output size is `(size - 1) * stride - 2 * padding + dilation * (kernel - 1) + output_padding + 1`.",
        _conv_transpose_shape,
        lambda a: _weights_dtype(a, "conv_transpose2d"),
        reference=conv_transpose_reference,
        category="spatial",
        cases=_conv_transpose_cases,
        flops=lambda a, results: Dim.of(2) * product(a["x"].shape.dims) * product(a["weight"].shape.dims[1:]),
    )
)
