"""ONNX lowerings of the spatial ops (`linnet/ops/spatial.py`), onto the operators of the
same meaning (Conv, ...), with padding made explicit per side (`spatial.explicit_padding`):
ONNX's `pads` are all the befores, then all the afters. `lower.LOWERINGS` takes this table in."""

from __future__ import annotations

import numpy as np

from linnet.errors import CodegenError
from linnet.ir.core import Op
from linnet.ops.resample import avg_pool_divisors, pool_window
from linnet.ops.spatial import explicit_padding, ints
from linnet.types.dims import Dim

LOWERINGS: dict = {}


def _conv(L, op: Op):
    x, w, b = op.args["x"], op.args["weight"], op.args["bias"]
    n = x.rank - 2
    kernel = tuple(d.as_int() for d in w.dims[2:])
    stride, dilation = ints(op.args["stride"], n), ints(op.args["dilation"], n)
    pads = explicit_padding(op.args["padding"], kernel, dilation, stride)
    attributes = {
        "kernel_shape": list(kernel),
        "strides": list(stride),
        "dilations": list(dilation),
        "pads": [lo for lo, _ in pads] + [hi for _, hi in pads],
        "group": ints(op.args["groups"], 1)[0],
    }
    inputs = [L.get(x), L.get(w)] + ([L.get(b)] if b is not None else [])
    return L.op("Conv", inputs, attributes, hint=op.result.name)


LOWERINGS["conv1d"] = _conv
LOWERINGS["conv2d"] = _conv


def _conv_transpose(L, op: Op):
    """ConvTranspose. ONNX Runtime refuses an output_padding that is not below the stride
    (PyTorch takes one below the stride or the dilation); there the output is made without it
    and without the end padding, then cut or zero-padded at the end to PyTorch's size (what
    output_padding adds lies past every kernel tap: zeros), and the bias added after."""
    x, w, b = op.args["x"], op.args["weight"], op.args["bias"]
    padding, extra = ints(op.args["padding"], 2), ints(op.args["output_padding"], 2)
    stride = ints(op.args["stride"], 2)
    attributes = {
        "kernel_shape": [d.as_int() for d in w.dims[2:]],
        "strides": list(stride),
        "dilations": list(ints(op.args["dilation"], 2)),
        "pads": list(padding) * 2,
        "output_padding": list(extra),
        "group": ints(op.args["groups"], 1)[0],
    }
    bias = [L.get(b)] if b is not None else []
    if all(e < s for e, s in zip(extra, stride)):
        return L.op("ConvTranspose", [L.get(x), L.get(w)] + bias, attributes, hint=op.result.name)
    attributes |= {"pads": list(padding) + [0, 0], "output_padding": [0, 0]}
    y = L.op("ConvTranspose", [L.get(x), L.get(w)], attributes, hint="conv_transpose")
    for axis, (p, e) in zip((2, 3), zip(padding, extra)):
        if e > p:
            widths = np.zeros(8, dtype=np.int64)
            widths[4 + axis] = e - p
            y = L.op("Pad", [y, L.const(widths, "pads")], {"mode": "constant"}, hint="output_padding")
        elif e < p:
            ends = L.const(np.array([e - p], dtype=np.int64), "ends")
            starts, axes = L.const(np.array([0], dtype=np.int64), "starts"), L.const(np.array([axis], np.int64), "axes")
            y = L.op("Slice", [y, starts, ends, axes], hint="padding")
    if b is None:
        return y
    shift = L.op("Reshape", [L.get(b), L.const(np.array([-1, 1, 1], dtype=np.int64), "shape")], hint="bias")
    return L.op("Add", [y, shift], hint=op.result.name)


LOWERINGS["conv_transpose2d"] = _conv_transpose


def _pad(L, op: Op):
    x = op.args["x"]
    pad = ints(op.args["pad"], len(op.args["pad"]))
    begins, ends = [0] * x.rank, [0] * x.rank
    for i in range(len(pad) // 2):
        begins[x.rank - 1 - i], ends[x.rank - 1 - i] = pad[2 * i], pad[2 * i + 1]
    mode = {"constant": "constant", "reflect": "reflect", "replicate": "edge"}[op.args["mode"]]
    inputs = [L.get(x), L.const(np.array(begins + ends, dtype=np.int64), "pads")]
    if mode == "constant":
        inputs.append(L.operand(float(op.args["value"]), op.result.dtype))
    return L.op("Pad", inputs, {"mode": mode}, hint=op.result.name)


def _pool_attributes(op: Op) -> dict:
    """A 2-d pooling's attributes with the padding explicit, a ceil_mode window's overhang
    included (`pool_window`): ONNX's ceil_mode keeps a last window that starts in the right
    padding, PyTorch's drops it."""
    k, s, d, pads = pool_window(op.args, op.args["x"].dims[2:], op.result.dims[2:])
    return {"kernel_shape": list(k), "strides": list(s), "pads": [lo for lo, _ in pads] + [hi for _, hi in pads]}


def _pads_below_kernel(L, op: Op, x, attributes: dict, fill: float):
    """(input, attributes) with every pad below the kernel, as ONNX Runtime's pooling kernels require ("Pad should
    be smaller than kernel"): a ceil_mode window's overhang can push the right pad to the kernel's size or past
    it (kernel 1, stride 3), so then the input is padded by a `Pad` op with `fill` (-inf for max pooling, 0 for
    the average over whole windows of zeros) and the pooling takes no pads."""
    from .lower import np_dtype  # lower.py imports this module

    k, pads = attributes["kernel_shape"], attributes["pads"]
    if all(p < k[i % 2] for i, p in enumerate(pads)):
        return x, attributes
    top, left, bottom, right = pads
    widths = L.const(np.array([0, 0, top, left, 0, 0, bottom, right], dtype=np.int64), "pads")
    value = L.const(np.array(fill, dtype=np_dtype(op.args["x"].dtype)), "fill")
    padded = L.op("Pad", [x, widths, value], {"mode": "constant"}, hint="padded")
    return padded, {**attributes, "pads": [0, 0, 0, 0]}


def _max_pool(L, op: Op):
    attributes = {**_pool_attributes(op), "dilations": list(ints(op.args["dilation"], 2))}
    x, attributes = _pads_below_kernel(L, op, L.get(op.args["x"]), attributes, -np.inf)
    return L.op("MaxPool", [x], attributes, hint=op.result.name)


def _avg_pool(L, op: Op):
    """AveragePool; under ceil_mode (known sizes) the mean over whole windows of zeros, rescaled
    to PyTorch's divisor for each window (`avg_pool_divisors`: clipped to the padded input, or
    to the input without `count_include_pad`)."""
    from .lower import np_dtype  # lower.py imports this module

    x = op.args["x"]
    attributes = _pool_attributes(op)
    if not op.args["ceil_mode"]:
        attributes["count_include_pad"] = int(op.args["count_include_pad"])
        return L.op("AveragePool", [L.get(x)], attributes, hint=op.result.name)
    padded, pooling = _pads_below_kernel(L, op, L.get(x), {**attributes, "count_include_pad": 1}, 0.0)
    mean = L.op("AveragePool", [padded], pooling, hint="window_mean")
    k, s = attributes["kernel_shape"], attributes["strides"]
    sizes = [d.as_int() for d in x.dims[2:]]
    out = [d.as_int() for d in op.result.dims[2:]]
    divisors = avg_pool_divisors(*sizes, k, s, ints(op.args["padding"], 2), out, op.args["count_include_pad"])
    rescale = L.const((k[0] * k[1] / divisors).astype(np_dtype(op.result.dtype)), "divisor")
    return L.op("Mul", [mean, rescale], hint=op.result.name)


def _adaptive_avg_pool(L, op: Op):
    """GlobalAveragePool for 1x1; else an AveragePool whose window and stride are the block
    each cell averages (the shape rule requires sizes that divide)."""
    x = op.args["x"]
    out = ints(op.args["output_size"], 2)
    if out == (1, 1):
        return L.op("GlobalAveragePool", [L.get(x)], hint=op.result.name)
    sizes = [d.as_int() for d in x.dims[2:]]
    if None in sizes:
        raise CodegenError(f"adaptive_avg_pool2d to {out} needs the input's spatial sizes known for ONNX")
    block = [size // o for size, o in zip(sizes, out)]
    attributes = {"kernel_shape": block, "strides": block}
    return L.op("AveragePool", [L.get(x)], attributes, hint=op.result.name)


def _interpolate(L, op: Op):
    """Resize with PyTorch's coordinates: nearest is `floor(i * in / out)` ("asymmetric",
    "floor"); bilinear and bicubic are half-pixel, or "align_corners"; bicubic with PyTorch's
    coefficient -0.75 and the edge repeated (exclude_outside 0). A `scale_factor` is passed as
    the scales, which is what PyTorch maps coordinates with."""
    mode, corners = op.args["mode"], op.args["align_corners"]
    attributes = {"mode": {"nearest": "nearest", "bilinear": "linear", "bicubic": "cubic"}[mode]}
    if mode == "nearest":
        attributes |= {"coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}
    else:
        attributes["coordinate_transformation_mode"] = "align_corners" if corners else "half_pixel"
    if mode == "bicubic":
        attributes |= {"cubic_coeff_a": -0.75, "exclude_outside": 0}
    x, dims = L.get(op.args["x"]), op.result.dims
    scale = op.args["scale_factor"]
    if mode == "bicubic":
        # one image per channel, [B * C, 1, H, W]: ONNX Runtime's cubic Resize takes 4-d inputs only
        # with scales of 1 on the outer two dims, and its transpose optimizer would otherwise move a
        # channels-last producer's Transpose past the Resize (scales [1, h, w, 1]), which it refuses
        planes = [op.args["x"].dims[0] * op.args["x"].dims[1], Dim.of(1)]
        x = L.op("Reshape", [x, L.shape(planes + list(op.args["x"].dims[2:]))], hint="planes")
        dims = planes + list(dims[2:])
    if scale is not None:
        scales = L.const(np.array([1.0, 1.0, scale, scale], dtype=np.float32), "scales")
        out = L.op("Resize", [x, None, scales], attributes, hint=op.result.name)
    else:
        out = L.op("Resize", [x, None, None, L.shape(dims)], attributes, hint=op.result.name)
    if mode == "bicubic":
        out = L.op("Reshape", [out, L.shape(op.result.dims)], hint=op.result.name)
    return out


LOWERINGS["pad"] = _pad
LOWERINGS["max_pool2d"] = _max_pool
LOWERINGS["avg_pool2d"] = _avg_pool
LOWERINGS["adaptive_avg_pool2d"] = _adaptive_avg_pool
LOWERINGS["interpolate"] = _interpolate
