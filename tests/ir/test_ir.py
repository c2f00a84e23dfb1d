"""Core IR: golden text of lowered examples and their generated PyTorch, the verifier, the
passes, and config binding. Runs without torch (the code generator imports none)."""

from __future__ import annotations

from pathlib import Path

import pytest

from linnet.ir import ProgramError, build, format_program
from linnet.ir.build import bind_config, check_source
from linnet.ir.core import Graph, Op, Value, tensor_type
from linnet.ir.passes import eliminate_common_subexpressions, eliminate_dead_code, fold_constants
from linnet.ir.verify import VerifyError, verify
from linnet.types.core import F32, I64
from tests.conftest import EXAMPLES, check_golden

GOLDEN = Path(__file__).parent / "golden"
SMALL_LLAMA = {
    "vocab_size": 96,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}
CASES = {
    "mlp": ("mlp.linnet", "tiny", {}),
    "llama_small": ("llama.linnet", None, SMALL_LLAMA),
    "gpt2_small": ("gpt2.linnet", None, {"n_layer": 1, "n_embd": 16, "n_head": 2, "vocab_size": 64}),
    "bert_small": (
        "bert.linnet",
        None,
        {"num_hidden_layers": 1, "hidden_size": 16, "num_attention_heads": 2, "intermediate_size": 32},
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_ir_golden(name):
    file, preset, config = CASES[name]
    program = build(EXAMPLES / file, preset=preset, config=config, max_positions=16)
    text = format_program(program).replace(str(EXAMPLES), "examples")
    check_golden(GOLDEN / f"{name}.ir", text)


@pytest.mark.parametrize("name", sorted(CASES))
def test_generated_torch_golden(name):
    from linnet.compiler.torch.codegen import generate

    file, preset, config = CASES[name]
    program = build(EXAMPLES / file, preset=preset, config=config, max_positions=16)
    text = generate(program).replace(str(EXAMPLES), "examples")
    compile(text, name, "exec")  # valid Python
    check_golden(GOLDEN / f"{name}.py", text)


def test_codegen_imports_no_framework():
    import subprocess
    import sys

    code = (
        "import sys\nfrom linnet.ir import build\nfrom linnet.compiler.torch.codegen import generate\n"
        "generate(build('examples/mlp.linnet', preset='tiny'))\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'jax', 'onnx', 'onnxruntime')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=EXAMPLES.parent)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_smollm2_preset_lowers_with_real_sizes():
    program = build(EXAMPLES / "llama.linnet", preset="smollm2_135m")
    assert sum(p.type.shape.dims[0].as_int() * (p.shape[1] if len(p.shape) > 1 else 1) for p in program.params) == (
        134_515_008
    )
    step = program.entries["step"]
    assert [str(d) for d in step.outputs[0].dims] == ["B", "49152"]
    assert len(program.state) == 60 and program.state[0].shape == (1, 3, 768, 64)
    assert program.state_written("step") == [s.path for s in program.state]
    assert program.entries["forward"].state_updates == {}


def test_config_precedence_checkpoint_over_preset_and_flags_over_both():
    info = check_source(str(EXAMPLES / "llama.linnet"), (EXAMPLES / "llama.linnet").read_text(), "smollm2_135m")
    bound = bind_config(info, {"num_hidden_layers": 4, "rope_theta": 10000}, {"num_hidden_layers": 2})
    program = build_bound(bound)
    assert program.config["num_hidden_layers"] == 2  # --config wins
    assert program.config["rope_theta"] == 10000.0  # the checkpoint's, an int read as a float
    assert program.config["hidden_size"] == 576  # the preset's


def build_bound(info):
    from linnet.ir.build import lower_program

    return lower_program(info, max_positions=8)


def test_checkpoint_config_that_breaks_a_shape_is_reported_on_the_field():
    with pytest.raises(ProgramError) as err:
        build(EXAMPLES / "llama.linnet", preset="smollm2_135m", config={"num_attention_heads": 7})
    assert "576" in str(err.value) and "7" in str(err.value)


def test_unknown_keys_and_bad_types_are_errors_bookkeeping_and_inert_keys_skipped():
    info = check_source(str(EXAMPLES / "llama.linnet"), (EXAMPLES / "llama.linnet").read_text(), None)
    with pytest.raises(ProgramError, match=r"error\[L503\]: `not_a_field` in ckpt is not a field of `Llama`"):
        bind_config(info, {"not_a_field": 1, "model_type": "llama"}, labels=("ckpt",))
    bound = bind_config(info, {"model_type": "llama", "use_cache": False, "num_hidden_layers": 1}, labels=("ckpt",))
    assert bound.notes == [] and build_bound(bound).config["num_hidden_layers"] == 1
    with pytest.raises(ProgramError, match="`model_type` in --config is not a field"):  # flags must be fields
        bind_config(info, {"model_type": "llama"}, labels=("--config",))
    with pytest.raises(ProgramError, match="`hidden_size` is an int"):
        bind_config(info, {"hidden_size": "big"})
    # `--config tie_word_embeddings=no` reads as the string "no": refused, not taken as true
    for value in ("no", "maybe", 2):
        with pytest.raises(ProgramError, match="`tie_word_embeddings` is a bool"):
            bind_config(info, {"tie_word_embeddings": value})
    for value, tied in ((False, False), (0, False), (True, True), (1, True)):
        program = build_bound(bind_config(info, {"tie_word_embeddings": value, "num_hidden_layers": 1}))
        assert program.config["tie_word_embeddings"] is tied


def test_unknown_entry_and_preset():
    with pytest.raises(ProgramError, match="no entry `decode`"):
        build(EXAMPLES / "mlp.linnet", preset="tiny", entries=["decode"])
    with pytest.raises(ProgramError, match="no preset `huge`"):
        build(EXAMPLES / "mlp.linnet", preset="huge")


def test_source_with_errors_is_refused_with_diagnostics():
    bad = (EXAMPLES / "mlp.linnet").read_text().replace("fc2(h)", "fc1(h)")
    with pytest.raises(ProgramError, match=r"error\[L20"):
        build(bad)


# ----------------------------------------------------------------------------- verifier and passes


def _graph() -> tuple[Graph, Value]:
    x = Value(tensor_type(F32, [4]), "x")
    g = Graph("f", [x])
    return g, x


def _op(g: Graph, name: str, args: dict, dtype=F32, dims=(4,)) -> Value:
    op = Op(name, args, [])
    op.results = [Value(tensor_type(dtype, dims), name, op)]
    g.ops.append(op)
    return op.result


def test_verifier_rejects_use_before_definition_and_stale_state():
    g, x = _graph()
    orphan = Value(tensor_type(F32, [4]), "orphan")
    y = _op(g, "exp", {"x": orphan})
    g.outputs = [y]
    with pytest.raises(VerifyError, match="before it is defined"):
        verify(g)

    g, x = _graph()
    cache_op = Op("state", {}, [], {"path": "k_cache"})
    cache = Value(tensor_type(F32, [1, 1, 4, 1]), "k_cache", cache_op)
    cache_op.results = [cache]
    g.ops.append(cache_op)
    rows = _op(g, "arange", {"start": 1, "stop": None, "step": 1}, I64, (1,))
    new = _op(g, "reshape", {"x": x, "shape": [1, 1, 4, 1]}, F32, (1, 1, 4, 1))
    written = _op(g, "cache_write", {"cache": cache, "rows": rows, "positions": rows, "new": new}, F32, (1, 1, 4, 1))
    stale = _op(g, "exp", {"x": cache}, F32, (1, 1, 4, 1))
    g.outputs = [stale]
    g.state_updates = {"k_cache": written}
    with pytest.raises(VerifyError, match="old value of state `k_cache`"):
        verify(g)


def test_cse_dce_and_exact_folding():
    g, x = _graph()
    a = _op(g, "exp", {"x": x})
    b = _op(g, "exp", {"x": x})
    _op(g, "sin", {"x": x})  # dead
    r = _op(g, "arange", {"start": 4, "stop": None, "step": 1}, I64, (4,))
    f = _op(g, "cast", {"x": r, "dtype": F32})
    scaled = _op(g, "div", {"x": f, "y": 8})
    powed = _op(g, "pow", {"x": 2.0, "y": scaled})  # not exact: never folded
    s = _op(g, "add", {"x": a, "y": b})
    out = _op(g, "mul", {"x": s, "y": powed})
    g.outputs = [out]
    assert fold_constants(g) == 2  # the cast and the division; the pow stays
    assert [op.name for op in g.ops].count("pow") == 1
    assert eliminate_common_subexpressions(g) == 1
    assert eliminate_dead_code(g) == 3  # sin, and what the folded division replaced: arange and cast
    const = next(op for op in g.ops if op.name == "const")
    assert const.attrs["value"].tolist() == [0.0, 0.125, 0.25, 0.375]
    verify(g)
