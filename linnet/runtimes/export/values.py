"""One rule for the values every export writes, whatever the format (Hugging Face safetensors, GGUF) and type
(f32, bf16, f16, q8_0, q4_0, q4_1): a weight that holds NaN or Inf in memory is refused, and so is a finite weight
whose written form would read back as Inf or NaN (f16 beyond 65504 rounds to Inf; a quantized block stores its
scale as f16, so a q8_0 block whose largest value is beyond 127 * 65504 reads back as 32 Infs or NaNs; bf16 beyond
3.39e38 rounds to Inf). A reader of the file would otherwise get NaN logits and an exit 0.

    check_exportable(a, "model.norm.weight", "f16", lambda a: a.astype(np.float16))

Cost: one f64 sum and a max/min over each tensor; the written form is decoded only for a tensor whose largest
magnitude reaches f16's range (no type here can overflow below it).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from linnet.errors import ExportError
from linnet.runtimes.formats.checkpoints import CheckpointError, check_finite, is_floating

__all__ = ["check_exportable"]

F16_MAX = 65504.0  # below it every type written here is finite: f16 itself; block scales (<= 2 * max / 15) as f16
BF16_MAX = 3.3895313892515355e38


def check_exportable(
    a: np.ndarray, name: str, type_name: str, decode_written: Callable[[np.ndarray], np.ndarray]
) -> None:
    """Raise ExportError when the weight `a` (named `name`, as the message should name it) holds NaN or Inf, or when
    `decode_written(a)` (what a reader of the file gets back for `a` written as `type_name`, as an array of `a`'s
    shape) is not finite everywhere; the message gives the count, the first index and value, and a type that holds
    the weight. Integer arrays pass."""
    if not is_floating(a) or a.size == 0:
        return
    try:
        check_finite(a, name, "the model")
    except CheckpointError as err:
        detail = err.message.replace("the checkpoint is corrupt or was saved", "the model is corrupt or was changed")
        raise ExportError(f"cannot export as {type_name}: {detail}") from None
    largest = max(abs(float(a.max())), abs(float(a.min())))
    if largest < F16_MAX:
        return
    with np.errstate(over="ignore", invalid="ignore"):
        back = np.asarray(decode_written(a), dtype=np.float32).reshape(a.shape)
    bad = ~np.isfinite(back)
    if not bad.any():
        return
    first = tuple(int(i) for i in np.argwhere(bad)[0])
    wider = "f32" if largest >= BF16_MAX or type_name == "bf16" else "f32 or bf16"
    raise ExportError(
        f"cannot export as {type_name}: tensor {name!r} overflows {type_name} ({int(bad.sum())} of {a.size} values "
        f"would read back as Inf or NaN, the first at index {list(first)}, which is {float(a[first])}); "
        f"export in a wider type ({wider})"
    )
