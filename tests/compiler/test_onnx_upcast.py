"""bf16 on ONNX Runtime's CPU: the kernel table (`linnet.compiler.onnx.kernels`) re-probed on the
installed onnxruntime, and the upcast pass (`linnet.compiler.onnx.upcast`): `equivalent` refuses
ops without bf16 kernels, naming them; `fast` computes them in f32, keeps the model's interface,
and agrees with the f32 model to bf16 precision on small Llama, GPT-2 and BERT models."""

from __future__ import annotations

import numpy as np
import pytest

from linnet.ir import build
from tests.conftest import EXAMPLES
from tests.runtimes.conftest import report

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnx_ir")
ml_dtypes = pytest.importorskip("ml_dtypes")

import onnx_ir as ir  # noqa: E402
from onnx import TensorProto  # noqa: E402
from onnx import helper as h  # noqa: E402

from linnet.compiler.onnx.kernels import KERNELS, PROBED, lacking  # noqa: E402
from linnet.compiler.onnx.lower import IR_VERSION, OPSET, lower_entry, to_proto  # noqa: E402
from linnet.compiler.onnx.upcast import MissingKernels, nodes_computing_in, upcast  # noqa: E402

CPU = "CPUExecutionProvider"
BF16 = TensorProto.BFLOAT16
F32 = TensorProto.FLOAT

EXAMPLE_MODELS = {
    "llama": ("llama.linnet", "smollm2_135m", {"num_hidden_layers": 2}),
    "gpt2": ("gpt2.linnet", None, {"n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 100}),
    "bert": ("bert.linnet", "all_minilm_l6_v2", {"num_hidden_layers": 1}),
}


# ----------------------------------------------------------------------------- the probes


def probe_model(op: str, t: int) -> onnx.ModelProto:
    """A one-node model of `op` at the lowering's opset whose float operands are of type `t`
    (integer operands, such as shapes, axes and indices, are int64 initializers)."""

    def i64(name, values):
        return onnx.numpy_helper.from_array(np.array(values, np.int64), name)

    def vi(name, elem, shape=None):
        return h.make_tensor_value_info(name, elem, shape)

    x, z = vi("x", t, [2, 3]), vi("z", t, [2, 3])
    ins, outs, inits, attrs, names = [x], [vi("y", t)], [], {}, None
    if op in ("Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Concat"):
        ins = [x, z]
        attrs = {"axis": 0} if op == "Concat" else {}
    elif op in ("Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual"):
        ins, outs = [x, z], [vi("y", TensorProto.BOOL)]
    elif op in ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin"):
        inits, attrs = [i64("axes", [-1])], {"keepdims": 1}
    elif op == "ArgMax":
        outs, attrs = [vi("y", TensorProto.INT64)], {"axis": -1}
    elif op == "MatMul":
        ins = [x, vi("z", t, [3, 2])]
    elif op == "Softmax":
        attrs = {"axis": -1}
    elif op == "LayerNormalization":
        ins, attrs = [x, vi("w", t, [3])], {"axis": -1, "epsilon": 1e-5, "stash_type": 1}
    elif op == "Reshape":
        inits = [i64("shape", [3, 2])]
    elif op == "Transpose":
        attrs = {"perm": [1, 0]}
    elif op in ("Unsqueeze", "Squeeze"):
        ins = [vi("x", t, [1, 3])]
        inits = [i64("axes", [0])]
    elif op == "Expand":
        ins, inits = [vi("x", t, [1, 3])], [i64("shape", [2, 3])]
    elif op == "Split":
        outs, inits, attrs = [vi("y", t), vi("y2", t)], [i64("sizes", [1, 2])], {"axis": -1}
    elif op == "Gather":
        inits, attrs = [i64("indices", [1, 0])], {"axis": 0}
    elif op == "Slice":
        inits = [i64("starts", [1]), i64("ends", [3]), i64("axes", [1])]
    elif op == "Where":
        ins = [vi("c", TensorProto.BOOL, [2, 3]), x, z]
    elif op == "ScatterND":
        ins, inits, names = [x, vi("u", t, [1, 3])], [i64("indices", [[1]])], ["x", "indices", "u"]
    elif op == "Shape":
        outs = [vi("y", TensorProto.INT64)]
    elif op == "Cast":  # both directions: in t, out f32 and back
        cast = [h.make_node("Cast", ["x"], ["w"], to=F32), h.make_node("Cast", ["w"], ["y"], to=t)]
        return _model(cast, ins, outs, [])
    elif op == "Constant":
        value = h.make_tensor("v", t, [2], np.array([1.0, -2.0], np.float32).astype(np.float32).tolist())
        return _model([h.make_node("Constant", [], ["y"], value=value)], [], outs, [])
    elif op == "ConstantOfShape":
        ins, attrs = [vi("s", TensorProto.INT64, [2])], {"value": h.make_tensor("v", t, [1], [1.5])}
    elif op == "If":  # an If whose branches hand out the outer `x` (the kernel; branch ops are probed alone)
        branch = [h.make_node("Identity", ["x"], ["b"])]
        g = h.make_graph(branch, "branch", [], [vi("b", t)])
        ins, attrs = [vi("c", TensorProto.BOOL, []), x], {"then_branch": g, "else_branch": g}
        names = ["c"]
    if names is None:
        names = [i.name for i in ins] + [i.name for i in inits]
    node = h.make_node(op, names, [o.name for o in outs], **attrs)
    return _model([node], ins, outs, inits)


def _model(nodes, ins, outs, inits) -> onnx.ModelProto:
    g = h.make_graph(nodes, "probe", ins, outs, initializer=inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", OPSET)], ir_version=IR_VERSION)


def run_probe(ort, model: onnx.ModelProto, seed: int = 0) -> list[np.ndarray]:
    """Run `model` on CPU with graph optimisations off (no fusion, no inserted casts); bf16 inputs
    and outputs pass as OrtValues and come back as f32 arrays."""
    from linnet.runtimes.backends.onnx_backend import _numpy, _ortvalue

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.intra_op_num_threads = 1
    opts.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=[CPU])
    rng = np.random.default_rng(seed)
    feeds = {}
    for i in sess.get_inputs():
        if i.type == "tensor(bool)":
            a = np.array(True) if not i.shape else rng.random(i.shape) > 0.5
        elif i.type == "tensor(int64)":
            a = np.array([2, 3], np.int64)
        else:  # values exact in bf16, away from 0 (Log, Sqrt, Div, Pow)
            a = (rng.random(i.shape) + 0.5).astype(ml_dtypes.bfloat16)
            a = a if i.type == "tensor(bfloat16)" else a.astype(np.float32)
        feeds[i.name] = _ortvalue(np.ascontiguousarray(a))
    return [np.asarray(_numpy(v)).astype(np.float32) for v in sess.run_with_ort_values(None, feeds)]


@pytest.mark.onnxruntime
def test_cpu_bf16_kernel_table_is_still_true():
    """Each probed op type's one-node model runs in f32 (so the probe is a valid model); in bf16 it
    runs exactly when the table lists it, and then agrees with the f32 run to bf16 precision. A
    failure names the op types whose answer changed (update `KERNELS` and its docstring)."""
    ort = pytest.importorskip("onnxruntime")
    runs, errors = set(), {}
    for op in PROBED:
        want = run_probe(ort, probe_model(op, F32))
        try:
            got = run_probe(ort, probe_model(op, BF16))
        except Exception as err:  # noqa: BLE001 (ORT raises its own NotImplemented / InvalidGraph)
            errors[op] = str(err)
            continue
        runs.add(op)
        for a, b in zip(got, want):
            assert np.allclose(a, b, rtol=2**-7, atol=2**-7), (op, a, b)
    for op, msg in errors.items():
        assert "NOT_IMPLEMENTED" in msg or "Type Error" in msg, (op, msg)
    print(f"onnxruntime {ort.__version__} CPU bf16 kernels: {sorted(runs)}; none for: {sorted(errors)}")
    table = KERNELS[CPU]["bf16"]
    assert runs == table, {"new kernels": sorted(runs - table), "gone": sorted(table - runs)}


def lowered(name: str, dtype: str = "bf16", numerics: str = "equivalent", entry: str | None = None):
    file, preset, config = EXAMPLE_MODELS[name]
    program = build(EXAMPLES / file, preset=preset, config=config, dtype=dtype, max_positions=16)
    entries = [entry] if entry else list(program.entries)
    return program, {e: lower_entry(program, e, "inputs", numerics) for e in entries}


@pytest.mark.parametrize("name", sorted(EXAMPLE_MODELS))
def test_the_examples_bf16_op_types_are_probed(name):
    """Every op type that computes on bf16 values in the examples' lowered entries (If branches
    included, both numerics) is in the table's probes, so the table answers for it."""
    for numerics in ("equivalent", "fast"):
        _, models = lowered(name, numerics=numerics)
        for entry, model in models.items():
            ops = {n.op_type for _, n in nodes_computing_in(model, "bf16")}
            assert ops and ops <= set(PROBED), (entry, sorted(ops - set(PROBED)))


def test_equivalent_refuses_naming_each_op_type_and_a_node():
    program, models = lowered("llama", entry="step")
    model = models["step"]
    before = len(list(model.graph))
    with pytest.raises(MissingKernels) as info:
        upcast(model, "bf16", CPU, "equivalent", entry="step")
    msg = str(info.value)
    print(msg)
    assert {"MatMul", "Add", "Mul", "Where", "Sigmoid"} <= set(info.value.ops)
    assert "--numerics fast" in msg and "entry `step`" in msg
    nodes = {n.name for _, n in nodes_computing_in(model, "bf16")} | {
        n.outputs[0].name for _, n in nodes_computing_in(model, "bf16")
    }
    for op, node in info.value.ops.items():
        assert f"{op} (e.g. {node})" in msg and node in nodes
        assert lacking(CPU, "bf16", op)
    assert len(list(model.graph)) == before  # refused, untouched


def test_nothing_to_do_in_f32_or_on_an_unmeasured_provider():
    _, models = lowered("gpt2", dtype="f32", entry="forward")
    assert upcast(models["forward"], "f32", CPU, "equivalent") == []
    _, models = lowered("gpt2", entry="forward")
    assert upcast(models["forward"], "bf16", "CUDAExecutionProvider", "equivalent") == []
    assert lacking("CUDAExecutionProvider", "bf16", "MatMul") is None


def io_signature(model: ir.Model):
    g = model.graph
    return (
        [(v.name, v.dtype) for v in g.inputs],
        [(v.name, v.dtype) for v in g.outputs],
        {k: v.dtype for k, v in g.initializers.items()},
    )


@pytest.mark.parametrize("name", sorted(EXAMPLE_MODELS))
def test_fast_leaves_no_bf16_op_without_a_kernel_and_keeps_the_interface(name):
    _, models = lowered(name, numerics="fast")
    for entry, model in models.items():
        before = io_signature(model)
        lacking_before = [n for _, n in nodes_computing_in(model, "bf16") if lacking(CPU, "bf16", n.op_type)]
        (note,) = upcast(model, "bf16", CPU, "fast", entry=entry)
        print(note)
        assert note.startswith(f"numerics fast: {len(lacking_before)} ops of entry `{entry}`") and "(upcast)" in note
        assert "MatMul" in note
        left = [n.op_type for _, n in nodes_computing_in(model, "bf16") if lacking(CPU, "bf16", n.op_type)]
        assert left == []
        assert io_signature(model) == before
        assert upcast(model, "bf16", CPU, "equivalent") == []  # nothing left to refuse
        onnx.checker.check_model(to_proto(model), full_check=True)


# ----------------------------------------------------------------------------- running (ORT)


def small_params(program, seed: int) -> dict[str, np.ndarray]:
    """f32 weights exact in bf16 (N(0, 0.05); norm scales near 1, biases near 0), so the bf16 and
    f32 models multiply the same numbers."""
    rng = np.random.default_rng(seed)
    out = {}
    for spec in program.params:
        base = 1.0 if len(spec.shape) == 1 and not spec.path.endswith("bias") else 0.0
        a = base + rng.standard_normal(spec.shape) * 0.05
        out[spec.path] = a.astype(ml_dtypes.bfloat16).astype(np.float32)
    return out


@pytest.mark.onnxruntime
@pytest.mark.parametrize("name", sorted(EXAMPLE_MODELS))
def test_fast_bf16_runs_and_agrees_with_f32(name):
    """The same bf16-exact weights in f32 and in bf16 under `fast`: every output to bf16 precision;
    the note says what runs upcast; a decoder's cache stays bf16 and its steps agree with f32."""
    lo = pytest.importorskip("linnet.onnx")
    file, preset, config = EXAMPLE_MODELS[name]
    kwargs = dict(preset=preset, config=config, max_positions=16, threads=1, progress=False)
    f32 = lo.load(EXAMPLES / file, params=small_params(build(EXAMPLES / file, preset, config), 0), **kwargs)
    bf16 = lo.load(EXAMPLES / file, params=f32.params, dtype="bf16", numerics="fast", **kwargs)
    assert any("run in f32 (upcast)" in n for n in bf16.notes), bf16.notes
    rng = np.random.default_rng(1)
    vocab = f32.program.config.get("vocab_size")
    ids = rng.integers(0, vocab, (2, 7))
    inputs = (
        [ids]
        if "attention_mask" not in [v.name for v in f32.program.entries["forward"].inputs]
        else [
            ids,
            np.array([[1] * 7, [1] * 4 + [0] * 3]),
        ]
    )
    ours, ref = bf16.forward(*inputs), f32.forward(*inputs)
    assert ours.dtype == ml_dtypes.bfloat16 and ours.shape == ref.shape
    ours = ours.astype(np.float32)
    delta = float(np.abs(ours - ref).max())
    scale = float(np.abs(ref).max())
    report(f"small {name} (random bf16-exact weights) bf16 fast vs f32 forward, |ref| ≤ {scale:.2f}", delta)
    assert delta < 0.05 * max(scale, 1.0)
    if "step" not in f32.program.entries:
        return
    f32.reset_state(), bf16.reset_state()
    assert {v.data_type() for v in bf16.state.values()} == {"tensor(bfloat16)"}
    for step_ids, pos in ((ids[:1, :5], 0), (ids[:1, 5:6], 5), (ids[:1, 6:7], 6)):
        args = (step_ids, np.array([pos]), np.array([0]))
        a, b = bf16.step_model().step(*args), f32.step_model().step(*args)
        delta = float(np.abs(a - b).max())
        report(f"{name} bf16 fast vs f32 step at position {pos}", delta)
        assert delta < 0.05 * max(float(np.abs(b).max()), 1.0)
    np.testing.assert_allclose(a[0], ours[0, 6], atol=0.05 * max(scale, 1.0))  # the last step is forward's
