"""JAX emitters of the spatial ops (`linnet/ops/spatial.py`), over `lax`'s windowed primitives
with PyTorch's channels-first layout named in `dimension_numbers` (no transposes). Window
arguments are known ints once a program is lowered; padding is made explicit per side
(`spatial.explicit_padding`), as XLA takes it. `codegen.EMITTERS` takes this table in."""

from __future__ import annotations

from linnet.ir.core import Op
from linnet.ops.resample import pool_window
from linnet.ops.spatial import explicit_padding, ints

from .dims import dim_text

EMITTERS: dict = {}

# lax's dimension numbers for a channels-first input, an OI... weight and a channels-first result
_LAYOUTS = {1: '("NCH", "OIH", "NCH")', 2: '("NCHW", "OIHW", "NCHW")'}


def _conv(e, op: Op) -> str:
    x, w, b = op.args["x"], op.args["weight"], op.args["bias"]
    n = x.rank - 2
    kernel = tuple(d.as_int() for d in w.dims[2:])
    stride, dilation = ints(op.args["stride"], n), ints(op.args["dilation"], n)
    pads = explicit_padding(op.args["padding"], kernel, dilation, stride)
    text = (
        f"lax.conv_general_dilated({e.r(x)}, {e.r(w)}, window_strides={stride}, padding={pads}, "
        f"rhs_dilation={dilation}, dimension_numbers={_LAYOUTS[n]}, "
        f"feature_group_count={ints(op.args['groups'], 1)[0]}{e.precision(x)})"
    )
    if b is not None:
        text += f" + {e.r(b)}.reshape({(-1,) + (1,) * n})"
    return text


EMITTERS["conv1d"] = _conv
EMITTERS["conv2d"] = _conv


def _conv_transpose(e, op: Op) -> str:
    """A transposed convolution as XLA writes one: the input dilated by the stride, padded by
    `dilation * (kernel - 1) - padding` (plus output_padding after), convolved with the kernel
    flipped and its in/out channels swapped within each group ([in, out / g, kH, kW] to
    [out, in / g, kH, kW])."""
    x, w, b = op.args["x"], op.args["weight"], op.args["bias"]
    stride, dilation = ints(op.args["stride"], 2), ints(op.args["dilation"], 2)
    padding, extra = ints(op.args["padding"], 2), ints(op.args["output_padding"], 2)
    groups = ints(op.args["groups"], 1)[0]
    c_in, out_per_group, kh, kw = (d.as_int() for d in w.dims)
    kernel = (kh, kw)
    pads = [(d * (k - 1) - p, d * (k - 1) - p + o) for k, d, p, o in zip(kernel, dilation, padding, extra)]
    flipped = (
        f"jnp.flip({e.r(w)}.reshape({groups}, {c_in // groups}, {out_per_group}, {kh}, {kw}).swapaxes(1, 2)"
        f".reshape({groups * out_per_group}, {c_in // groups}, {kh}, {kw}), (2, 3))"
    )
    text = (
        f"lax.conv_general_dilated({e.r(x)}, {flipped}, window_strides=(1, 1), padding={pads}, "
        f"lhs_dilation={stride}, rhs_dilation={dilation}, dimension_numbers={_LAYOUTS[2]}, "
        f"feature_group_count={groups}{e.precision(x)})"
    )
    if b is not None:
        text += f" + {e.r(b)}.reshape((-1, 1, 1))"
    return text


EMITTERS["conv_transpose2d"] = _conv_transpose


def _pad(e, op: Op) -> str:
    x = op.args["x"]
    pad = ints(op.args["pad"], len(op.args["pad"]))
    widths = [(0, 0)] * x.rank
    for i in range(len(pad) // 2):
        widths[x.rank - 1 - i] = (pad[2 * i], pad[2 * i + 1])
    mode = op.args["mode"]
    if mode == "constant":
        return f"jnp.pad({e.r(x)}, {widths}, constant_values={e.r(float(op.args['value']))})"
    return f"jnp.pad({e.r(x)}, {widths}, mode={'reflect' if mode == 'reflect' else 'edge'!r})"


def _pool_window(op: Op):
    """(kernel, stride, dilation, lax's padding over all four dims) of a 2-d pooling."""
    k, s, d, pads = pool_window(op.args, op.args["x"].dims[2:], op.result.dims[2:])
    return k, s, d, [(0, 0), (0, 0)] + pads


def _max_pool(e, op: Op) -> str:
    x = e.r(op.args["x"])
    k, s, d, pads = _pool_window(op)
    return (
        f"lax.reduce_window({x}, jnp.array(-jnp.inf, {x}.dtype), lax.max, (1, 1, *{k}), (1, 1, *{s}), "
        f"{pads}, window_dilation=(1, 1, *{d}))"
    )


def _avg_pool(e, op: Op) -> str:
    """The window sums over zero padding, divided by each window's count: `k * k` where every
    window is whole, else the sum of a ones mask over the same windows (ones in the padding
    where `count_include_pad`, as PyTorch's divisor counts it)."""
    x = e.r(op.args["x"])
    k, s, _, pads = _pool_window(op)
    p = ints(op.args["padding"], 2)
    total = f"lax.reduce_window({x}, jnp.array(0, {x}.dtype), lax.add, (1, 1, *{k}), (1, 1, *{s}), {pads})"
    whole = op.args["count_include_pad"] and all(lo == hi for lo, hi in pads[2:])
    if whole:
        return f"{total} / {k[0] * k[1]}"
    inside = 1 if op.args["count_include_pad"] else 0
    mask = f"jnp.pad(jnp.ones({x}.shape[2:], {x}.dtype), {[(q, q) for q in p]}, constant_values={inside})"
    extra = [(0, hi - lo) for lo, hi in pads[2:]]
    count = f"lax.reduce_window({mask}, jnp.array(0, {x}.dtype), lax.add, {k}, {s}, {extra})"
    return f"{total} / {count}"


def _adaptive_avg_pool(e, op: Op) -> str:
    """Each output cell the mean of an equal block (the shape rule requires sizes that divide)."""
    x = e.r(op.args["x"])
    oh, ow = ints(op.args["output_size"], 2)
    if (oh, ow) == (1, 1):
        return f"jnp.mean({x}, axis=(2, 3), keepdims=True)"
    blocks = f"{x}.shape[0], {x}.shape[1], {oh}, {x}.shape[2] // {oh}, {ow}, {x}.shape[3] // {ow}"
    return f"jnp.mean({x}.reshape({blocks}), axis=(3, 5))"


EMITTERS["pad"] = _pad
EMITTERS["max_pool2d"] = _max_pool
EMITTERS["avg_pool2d"] = _avg_pool
EMITTERS["adaptive_avg_pool2d"] = _adaptive_avg_pool

# Defined once in each function that interpolates: one dim of `x` resampled, each output the
# weighted sum of its input taps, with PyTorch's indices and weights (UpSample.h:
# `area_pixel_compute_scale`, `area_pixel_compute_source_index`, `guard_index_and_lambda`,
# `get_cubic_upsample_coefficients`; the reference is linnet/ops/resample.py's).
RESIZE_AXIS = """def resize_axis(x, axis, n_out, mode, align_corners, scale_factor):
    n_in = x.shape[axis]
    if align_corners:
        scale = (n_in - 1) / (n_out - 1) if n_out > 1 else 0.0
    else:
        scale = 1.0 / scale_factor if scale_factor is not None else n_in / n_out
    scale = jnp.float32(scale)
    i = jnp.arange(n_out, dtype=jnp.float32)
    if mode == "nearest":
        return jnp.take(x, jnp.minimum(jnp.floor(i * scale).astype(jnp.int32), n_in - 1), axis=axis)
    src = scale * i if align_corners else scale * (i + 0.5) - 0.5
    if mode == "bilinear":
        src = jnp.maximum(src, 0.0)
    base = jnp.minimum(jnp.floor(src).astype(jnp.int32), n_in - 1)
    t = jnp.clip(src - base, 0.0, 1.0)
    if mode == "bilinear":
        taps, weights = [base, jnp.minimum(base + 1, n_in - 1)], [1.0 - t, t]
    else:
        a = -0.75
        near = lambda u: ((a + 2) * u - (a + 3)) * u * u + 1
        far = lambda u: ((a * u - 5 * a) * u + 8 * a) * u - 4 * a
        taps = [jnp.clip(base + j, 0, n_in - 1) for j in (-1, 0, 1, 2)]
        weights = [far(t + 1), near(t), near(1.0 - t), far(2.0 - t)]
    shape = [1] * x.ndim
    shape[axis] = n_out
    return sum(jnp.take(x, j, axis=axis) * w.astype(x.dtype).reshape(shape) for j, w in zip(taps, weights))"""


def _interpolate(e, op: Op):
    x = e.r(op.args["x"])
    stmts = []
    if "resize_axis" not in e.names:
        stmts += RESIZE_AXIS.split("\n")
        e.names["resize_axis"] = "resize_axis"
    scale = op.args["scale_factor"]
    mode, corners = op.args["mode"], op.args["align_corners"]
    text = x
    for axis in (2, 3):
        n_out = dim_text(op.result.dims[axis])
        text = f"resize_axis({text}, {axis}, {n_out}, {mode!r}, {corners}, {scale!r})"
    return stmts, text


EMITTERS["interpolate"] = _interpolate
