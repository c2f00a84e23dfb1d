"""Every registry op the ONNX backend lowers (test_op_coverage.py: every op, or a reason): the
lowered graph passes `onnx.checker` and strict shape inference; on ONNX Runtime the output
shape equals the registry's shape rule and the values equal the op's numpy reference and the
PyTorch backend's output (bit for bit where the op is `exact`), on the op's own random cases.
Also: lowering imports no onnxruntime, and the examples' entries lower to checked graphs with
symbolic batch and sequence dims."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from linnet.ir import build
from linnet.ir.core import Program
from linnet.ops import REGISTRY
from linnet.types.core import F32
from linnet.types.dims import Dim
from tests.compiler.op_cases import assert_matches, case, reference, single_op_graph
from tests.conftest import EXAMPLES

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnx_ir")

from linnet.compiler.onnx.lower import UNSUPPORTED, cache_names, lower_entry, to_proto  # noqa: E402

HAVE_TORCH = importlib.util.find_spec("torch") is not None


def test_onnx_lowering_imports_no_runtime():
    code = (
        "import sys\nfrom linnet.ir import build\nfrom linnet.compiler.onnx.lower import lower_entry\n"
        "lower_entry(build('examples/llama.linnet', preset='smollm2_135m', config={'num_hidden_layers': 1}), 'step')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'jax', 'onnxruntime')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=EXAMPLES.parent)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def checked(model):
    proto = to_proto(model)
    onnx.checker.check_model(proto, full_check=True)
    onnx.shape_inference.infer_shapes(proto, strict_mode=True)
    return proto


def dims(value_info) -> list:
    return [d.dim_param or d.dim_value for d in value_info.type.tensor_type.shape.dim]


@pytest.mark.parametrize(
    "file, preset, config",
    [
        ("llama.linnet", "smollm2_135m", {"num_hidden_layers": 2}),
        ("gpt2.linnet", None, {"n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 100}),
        ("bert.linnet", "all_minilm_l6_v2", {"num_hidden_layers": 1}),
    ],
)
def test_examples_lower_to_checked_graphs(file, preset, config):
    program = build(EXAMPLES / file, preset=preset, config=config, max_positions=16)
    for name, g in program.entries.items():
        proto = checked(lower_entry(program, name))
        ins = {i.name: dims(i) for i in proto.graph.input}
        assert [v.name for v in g.inputs] == list(ins)[: len(g.inputs)]
        assert ins["input_ids"] == ["B", "S"]
        assert {i.name for i in proto.graph.initializer} <= {p.path for p in program.params}
        if g.state_updates:
            names = cache_names(program)
            outs = [o.name for o in proto.graph.output]
            assert outs[0] == "logits" and dims(proto.graph.output[0])[0] == "B"
            assert outs[1:] == [names[p][1] for p in g.state_updates]
            assert outs[1:3] == ["present.0.key", "present.0.value"]
            assert "past_key_values.1.value" in ins


def test_parameters_as_graph_inputs():
    program = build(EXAMPLES / "llama.linnet", preset="smollm2_135m", config={"num_hidden_layers": 1}, max_positions=8)
    proto = checked(lower_entry(program, "forward", params="inputs"))
    assert not proto.graph.initializer
    assert "model.embed_tokens.weight" in {i.name for i in proto.graph.input}


# ----------------------------------------------------------------------------- running (needs onnxruntime)


@pytest.fixture(scope="module")
def ort():
    return pytest.importorskip("onnxruntime")


def run_onnx(ort, g, inputs):
    program = Program("<test>", "f", None, F32, 1, 1, entries={"f": g})
    proto = checked(lower_entry(program, "f"))
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(proto.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    return sess.run(None, dict(zip(names, inputs)))


def run_torch(g, inputs):
    import torch

    from linnet.compiler.torch.codegen import graph_function as torch_source

    ns: dict = {}
    exec("import torch\nimport torch.nn.functional as F\n" + torch_source(g), ns)
    out = ns["f"]({}, *[torch.from_numpy(np.array(a)) for a in inputs])
    return [o.numpy() for o in (out if isinstance(out, (tuple, list)) else [out])]


@pytest.mark.onnxruntime
@pytest.mark.parametrize("name", sorted(set(REGISTRY) - set(UNSUPPORTED)))
@settings(max_examples=5, deadline=None)
@given(shape=st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple), seed=st.integers(0, 2**16))
def test_op_matches_registry_reference_and_torch(ort, name, shape, seed):
    rng = np.random.default_rng(seed)
    tensors, const = case(name, rng, shape)
    expected = reference(name, tensors, const)
    g, types, inputs = single_op_graph(name, tensors, const)
    outs = run_onnx(ort, g, inputs)
    refs = list(expected) if isinstance(expected, (tuple, list)) else [np.asarray(expected)]
    theirs = run_torch(g, inputs) if HAVE_TORCH else refs
    assert len(outs) == len(types) == len(refs) == len(theirs)
    for o, t, ref, tor in zip(outs, types, refs, theirs):
        assert o.shape == tuple(d.as_int() for d in t.shape.dims), (name, o.shape, t)
        assert o.shape == np.asarray(ref).shape
        assert o.dtype == np.asarray(ref).dtype, (name, o.dtype, np.asarray(ref).dtype)
        assert_matches(name, o, ref, "onnx")
        assert_matches(name, o, tor, "onnx")


@pytest.mark.parametrize("max_batch", [1, 2])
def test_attention_over_the_cache_is_grouped_and_reads_the_cache_in_place(max_batch):
    """Attention batches the query heads of a KV head (no repeated keys or values); over a cache of at least
    TRIM_MIN_KEYS positions an `If` on S picks decode (K @ q^T; a second `If` reads the cache in place, or only
    the keys up to the last attended position while that is at most DECODE_TRIM_FILL of it) or prefill (keys
    after the last attended position skipped), and in prefill a second `If` splits PREFILL_BLOCK_MIN_ROWS rows or more
    into PREFILL_BLOCKS blocks of query rows, each over its own keys; a one-row cache is read without a
    Gather."""
    from linnet.compiler.onnx.lower import PREFILL_BLOCKS, TRIM_MIN_KEYS

    program = build(
        EXAMPLES / "llama.linnet",
        preset="smollm2_135m",
        config={"num_hidden_layers": 1},
        max_batch=max_batch,
        max_positions=TRIM_MIN_KEYS + 16,
    )
    proto = checked(lower_entry(program, "step"))
    ops = [n.op_type for n in proto.graph.node]
    assert ops.count("Expand") == 3  # the cache index triples only: no repeated keys or values
    assert ops.count("If") == 1
    # the embedding and the last token; with several cache rows, also the two row reads
    assert ops.count("Gather") == (4 if max_batch > 1 else 2)
    branches = {a.name: a.g for n in proto.graph.node if n.op_type == "If" for a in n.attribute}
    decode = [n.op_type for n in branches["then_branch"].node]
    (by_length,) = branches["else_branch"].node
    assert by_length.op_type == "If"
    prefills = {a.name: [n.op_type for n in a.g.node] for a in by_length.attribute}
    (by_fill,) = [n for n in branches["then_branch"].node if n.op_type == "If"]
    decodes = {a.name: [n.op_type for n in a.g.node] for a in by_fill.attribute}
    assert "LessOrEqual" in decode and decode.count("If") == 1 and "MatMul" not in decode
    # a cache at most DECODE_TRIM_FILL attended: its keys and values up to there; else read in place
    assert decodes["then_branch"].count("Slice") == 2 and decodes["then_branch"].count("MatMul") == 2
    assert "Slice" not in decodes["else_branch"] and decodes["else_branch"].count("MatMul") == 2
    assert prefills["else_branch"].count("Slice") == 2 and prefills["else_branch"].count("MatMul") == 2
    blocks = prefills["then_branch"]
    # per block: its queries, its mask rows, that mask's keys, and the keys and values
    assert blocks.count("Slice") == 5 * PREFILL_BLOCKS and blocks.count("MatMul") == 2 * PREFILL_BLOCKS
    assert blocks.count("Concat") == 2 * PREFILL_BLOCKS + 1  # each mask window's starts and ends, the output


def test_projections_of_one_input_are_one_matmul():
    """q/k/v and gate/up (weights of one input) are one MatMul by the concatenated weights and a Split; with the
    parameters as graph inputs nothing is concatenated (it would run every step)."""
    program = build(EXAMPLES / "llama.linnet", preset="smollm2_135m", config={"num_hidden_layers": 1}, max_positions=8)
    ops = [n.op_type for n in checked(lower_entry(program, "step")).graph.node]
    # qkv, o, gate/up, down, the head, and attention's two
    assert ops.count("MatMul") == 7 and ops.count("Split") == 2
    ops = [n.op_type for n in checked(lower_entry(program, "step", params="inputs")).graph.node]
    assert ops.count("MatMul") == 10 and "Split" not in ops


@pytest.mark.onnxruntime
@pytest.mark.parametrize("name", ["max_pool2d"])  # avg_pool2d's own cases stay below the kernel
def test_pooling_whose_ceil_mode_overhang_reaches_the_kernel_runs(ort, name):
    """ONNX Runtime refuses pooling pads not below the kernel; a ceil_mode window's overhang makes them (kernel 1,
    stride 3): the lowering pads the input itself. Every such draw among the op's first cases equals the reference."""
    from linnet.ops.resample import pool_window

    hits = 0
    for seed in range(300):
        rng = np.random.default_rng(seed)
        tensors, const = case(name, rng, (1 + seed % 4, 1 + seed // 4 % 4))
        g, types, inputs = single_op_graph(name, tensors, const)
        op = next(op for op in g.ops if op.name == name)
        kernel, _, _, pads = pool_window(op.args, op.args["x"].dims[2:], op.result.dims[2:])
        if all(hi < k for (_, hi), k in zip(pads, kernel)):
            continue
        hits += 1
        assert_matches(name, run_onnx(ort, g, inputs)[0], np.asarray(reference(name, tensors, const)), "onnx")
    assert hits > 0, "no draw reached the kernel: the test no longer tests the padded path"


@pytest.mark.onnxruntime
def test_a_reshape_to_a_zero_sized_dim_keeps_its_zero(ort):
    """ONNX's Reshape reads a 0 in its shape as "copy the input's dim" unless `allowzero` is set: a reshape of
    [0, 3] to [3, 0] came out [0, 3] where the checker and PyTorch give [3, 0] (and `repeat_interleave(x, 0, dim=1)`
    on [B, 4], whose lowering reshapes to [B, 0], gave [0, 4])."""
    x = np.zeros((0, 3), dtype=np.float32)
    g, types, inputs = single_op_graph("reshape", {"x": x}, {"shape": [Dim.of(3), Dim.of(0)]})
    (out,) = run_onnx(ort, g, inputs)
    assert out.shape == (3, 0) == tuple(d.as_int() for d in types[0].shape.dims)
