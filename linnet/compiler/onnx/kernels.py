"""Which ONNX op types an ONNX Runtime execution provider runs in a given float dtype: a static table,
so that the lowering and its passes (`upcast`) need no onnxruntime.

How it was measured: for each op type the lowering emits (`PROBED`), a one-node model at the lowering's opset
(23; the table read the same at 21) with its float inputs and outputs in the dtype (`probe_model` in
`tests/compiler/test_onnx_upcast.py`), made into an `InferenceSession` with graph optimisations off and run on
that provider. An op type is listed when the session is made and runs; it is missing when ONNX Runtime answers
NOT_IMPLEMENTED ("Could not find an implementation for MatMul(13)"), as for Sin and Cos in bf16 (at opset 21
their ONNX schema had no bf16; at 23 it has, but the CPU provider has no bf16 kernel). A function op without a
kernel (Softmax, Gelu, LayerNormalization) runs when ONNX Runtime can run its expanded body:
LayerNormalization with `stash_type=1` computes in f32 by definition and runs; Softmax's body needs ReduceMax,
Gelu's Sqrt, and they do not. That test re-probes the installed onnxruntime and checks the table is still
true, and that `PROBED` covers every op type the examples lower to in bf16.

Measured: onnxruntime 1.32.0, CPUExecutionProvider, bf16. Its CPU kernels move, gather and convert
bf16 tensors but compute nothing in it: every arithmetic, comparison and reduction op lacks a bf16
kernel (MatMul, Add, Mul, Softmax, Where, Expand, ...). Other providers are not measured here;
`lacking` answers None for them.
"""

from __future__ import annotations

# Every op type the lowering emits with float operands (the probes cover each; integer-only
# lowerings such as Mod, Range, And, Or and Not never carry a float dtype).
PROBED: tuple[str, ...] = (
    # element-wise
    "Abs",
    "Cos",
    "Erf",
    "Exp",
    "Log",
    "Neg",
    "Reciprocal",
    "Sigmoid",
    "Sin",
    "Sqrt",
    "Tanh",
    "Add",
    "Sub",
    "Mul",
    "Div",
    "Pow",
    "Max",
    "Min",
    "Equal",
    "Less",
    "LessOrEqual",
    "Greater",
    "GreaterOrEqual",
    "Where",
    # reductions and products
    "ReduceSum",
    "ReduceMean",
    "ReduceMax",
    "ReduceMin",
    "ArgMax",
    "MatMul",
    "Softmax",
    "Gelu",
    "LayerNormalization",
    # data movement and conversion
    "Identity",
    "Reshape",
    "Transpose",
    "Unsqueeze",
    "Squeeze",
    "Expand",
    "Concat",
    "Split",
    "Gather",
    "Slice",
    "ScatterND",
    "Shape",
    "Cast",
    "Constant",
    "ConstantOfShape",
    "If",
)

# provider -> dtype -> the op types of PROBED that run in that dtype (measured; see above).
KERNELS: dict[str, dict[str, frozenset[str]]] = {
    "CPUExecutionProvider": {
        "bf16": frozenset(
            {
                "Cast",
                "Concat",
                "Constant",
                "ConstantOfShape",
                "Gather",
                "Identity",
                "If",
                "LayerNormalization",
                "Reshape",
                "ScatterND",
                "Shape",
                "Slice",
                "Split",
                "Squeeze",
                "Transpose",
                "Unsqueeze",
            }
        ),
    },
}
MEASURED_WITH = "onnxruntime 1.32.0"


def has_table(provider: str, dtype: str) -> bool:
    return dtype in KERNELS.get(provider, {})


def lacking(provider: str, dtype: str, op_type: str, domain: str = "") -> bool | None:
    """Whether `provider` lacks a `dtype` kernel for `op_type`: True or False where measured, None
    where the provider or dtype was not (an op type outside PROBED counts as lacking)."""
    table = KERNELS.get(provider, {}).get(dtype)
    if table is None:
        return None
    return domain not in ("", "ai.onnx") or op_type not in table
