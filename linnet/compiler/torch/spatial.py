"""PyTorch emitters of the spatial ops (`linnet/ops/spatial.py`): each the torch.nn.functional
call the op is defined by, with its arguments as Python literals (window arguments are known
ints once a program is lowered). `codegen.EMITTERS` takes this table in."""

from __future__ import annotations

from linnet.ir.core import Op
from linnet.ir.render import dim_text
from linnet.ops.spatial import ints

EMITTERS: dict = {}


def _window(op: Op, arg: str) -> str:
    n = op.args["x"].rank - 2
    values = ints(op.args[arg], n)
    return str(values[0]) if len(set(values)) == 1 else str(values)


def _padding(op: Op) -> str:
    padding = op.args["padding"]
    return repr(padding) if isinstance(padding, str) else _window(op, "padding")


def _conv(fn: str):
    def emit(e, op: Op) -> str:
        x, w, b = (e.r(op.args[k]) for k in ("x", "weight", "bias"))
        return (
            f"F.{fn}({x}, {w}, {b}, stride={_window(op, 'stride')}, padding={_padding(op)}, "
            f"dilation={_window(op, 'dilation')}, groups={ints(op.args['groups'], 1)[0]})"
        )

    return emit


EMITTERS["conv1d"] = _conv("conv1d")
EMITTERS["conv2d"] = _conv("conv2d")
EMITTERS["conv_transpose2d"] = lambda e, op: (
    f"F.conv_transpose2d({e.r(op.args['x'])}, {e.r(op.args['weight'])}, {e.r(op.args['bias'])}, "
    f"stride={_window(op, 'stride')}, padding={_window(op, 'padding')}, "
    f"output_padding={_window(op, 'output_padding')}, groups={ints(op.args['groups'], 1)[0]}, "
    f"dilation={_window(op, 'dilation')})"
)


def _pad(e, op: Op) -> str:
    pad = ", ".join(str(p) for p in ints(op.args["pad"], len(op.args["pad"])))
    mode = op.args["mode"]
    value = f", value={e.r(float(op.args['value']))}" if mode == "constant" else ""
    return f"F.pad({e.r(op.args['x'])}, [{pad}], mode={mode!r}{value})"


def _pool(fn: str, windows: tuple[str, ...], flags: tuple[str, ...]):
    """F.<fn>(x, kernel_size, stride, padding[, dilation], flag=...): stride None is the kernel."""

    def emit(e, op: Op) -> str:
        stride = "None" if op.args["stride"] is None else _window(op, "stride")
        sizes = [_window(op, "kernel_size"), stride] + [_window(op, w) for w in windows]
        options = [f"{flag}={e.r(op.args[flag])}" for flag in flags]
        return f"F.{fn}({', '.join([e.r(op.args['x'])] + sizes + options)})"

    return emit


EMITTERS["pad"] = _pad
EMITTERS["max_pool2d"] = _pool("max_pool2d", ("padding", "dilation"), ("ceil_mode",))
EMITTERS["avg_pool2d"] = _pool("avg_pool2d", ("padding",), ("ceil_mode", "count_include_pad"))
EMITTERS["adaptive_avg_pool2d"] = lambda e, op: (
    f"F.adaptive_avg_pool2d({e.r(op.args['x'])}, {ints(op.args['output_size'], 2)})"
)


def _interpolate(e, op: Op) -> str:
    mode = op.args["mode"]
    if op.args["size"] is not None:  # the result's sizes, which may be the input's dims (`H // 14`) as well as ints
        how = f"size=({dim_text(op.result.dims[2])}, {dim_text(op.result.dims[3])})"
    else:
        how = f"scale_factor={e.r(float(op.args['scale_factor']))}"
    corners = "" if mode == "nearest" else f", align_corners={e.r(op.args['align_corners'])}"
    return f"F.interpolate({e.r(op.args['x'])}, {how}, mode={mode!r}{corners})"


EMITTERS["interpolate"] = _interpolate
