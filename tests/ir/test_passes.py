"""Core IR structure and passes: functions and loops, inlining and flattening, linear layers and
weight fusion, attention variants, and that no pass or emitter changes the program it is given.
Runs without torch, jax or onnx."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from linnet.ir import build, format_program
from linnet.ir.core import walk_ops
from linnet.ir.fusion import concat_weight_groups, fused_names, linear_weights
from linnet.ir.inline import copy_program, flatten, inline_calls, layer_calls
from linnet.ir.pipeline import PassOptions, prepare
from linnet.ir.verify import VerifyError, verify_program
from tests.conftest import EXAMPLES
from tests.ir.test_ir import SMALL_LLAMA

SMALL_SIGLIP = {
    "text_config": {"vocab_size": 64, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
                    "num_attention_heads": 2, "max_position_embeddings": 8},
    "vision_config": {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
                      "image_size": 32, "patch_size": 8},
}  # fmt: skip


def llama(layers: int = 2, **config):
    return build(
        EXAMPLES / "llama.linnet", config={**SMALL_LLAMA, "num_hidden_layers": layers, **config}, max_positions=16
    )


def test_layers_are_one_loop_and_functions_do_not_grow_with_depth():
    two, thirty = llama(2), llama(30)
    assert sorted(two.functions) == sorted(thirty.functions)
    loops = [op for op in walk_ops(thirty.entries["step"]) if op.name == "loop"]
    assert [(op.attrs["list"], op.attrs["count"]) for op in loops] == [("layers", 30)]
    body_calls = [op.attrs["fn"] for op in loops[0].body.ops if op.name == "call"]
    assert body_calls == ["LlamaDecoderLayer.step"]
    assert loops[0].attrs["writes"] == ["layers.{i0}.self_attn.k_cache", "layers.{i0}.self_attn.v_cache"]


def test_module_classes_and_relative_paths():
    p = llama()
    attention = p.modules["LlamaAttention"]
    assert set(attention.state) == {"k_cache", "v_cache"}
    assert attention.children["q_proj"][1] is None
    assert p.modules["LlamaModel"].children["layers"] == ("LlamaDecoderLayer", 2)
    paths = {op.attrs["path"] for op in p.functions["LlamaAttention.step"].ops if op.name == "state"}
    assert paths == {"k_cache", "v_cache"}


def test_state_written_follows_calls_and_loops():
    p = llama(3)
    assert p.state_written("step") == [t.path for t in p.state]
    assert p.state_written("forward") == []
    assert p.entries["step"].uses_state and not p.entries["forward"].uses_state


def test_flatten_gives_flat_entries_with_absolute_paths():
    p = llama(3)
    flat = flatten(p)
    verify_program(flat)
    assert flat.functions == {}
    for g in flat.entries.values():
        assert not [op for op in walk_ops(g) if op.name in ("call", "loop")]
    names = {t.path for t in p.params}
    read = {op.attrs["path"] for op in walk_ops(flat.entries["step"]) if op.name == "param"}
    assert read <= names and "model.layers.2.mlp.down_proj.weight" in read
    assert set(flat.entries["step"].state_updates) == {t.path for t in p.state}


def test_layers_are_inlined_where_they_are_used():
    p = inline_calls(llama(), layer_calls(llama()))
    assert not [k for k in p.functions if k.split(".")[0] in ("Linear", "RMSNorm", "Embedding")]
    project = p.functions["LlamaAttention.project"]
    assert [op.attrs["path"] for op in project.ops if op.name == "param"] == [
        "q_proj.weight",
        "k_proj.weight",
        "v_proj.weight",
    ]


def test_gpt2_conv1d_is_a_layer_inlined_and_its_matmul_kept():
    p = build(EXAMPLES / "gpt2.linnet", config={"n_layer": 1, "n_embd": 16, "n_head": 2, "vocab_size": 64})
    prepared = prepare(p, PassOptions())
    assert not [k for k in prepared.functions if k.startswith("Conv1D")]
    # Conv1D's weight is [in, out]: `x @ weight`, no transpose, so no linear op
    attn = prepared.functions["GPT2Attention.project"]
    assert [op.name for op in attn.ops if op.name in ("matmul", "linear")] == ["matmul"]


def test_linear_layers_sharing_an_input_are_fused_per_class():
    p = prepare(llama(3), PassOptions(fuse_linear_weights=True))
    keys = [t.key for t in p.param_transforms]
    assert "model.layers.2.self_attn.{q,k,v}_proj.weight" in keys
    assert "model.layers.0.mlp.{gate,up}_proj.weight" in keys and len(keys) == 6
    for t in p.param_transforms:
        assert fused_names(t.key) == t.sources
    shapes = p.code_params()
    assert shapes["model.layers.0.self_attn.{q,k,v}_proj.weight"] == (64, 32)
    assert "model.layers.0.self_attn.q_proj.weight" not in shapes
    assert p.modules["LlamaAttention"].fused == {
        "{q,k,v}_proj.weight": ["q_proj.weight", "k_proj.weight", "v_proj.weight"]
    }


def test_a_tied_embedding_is_not_fused():
    p = build(EXAMPLES / "gpt2.linnet", config={"n_layer": 1, "n_embd": 16, "n_head": 2, "vocab_size": 64})
    prepared = prepare(p, PassOptions(fuse_linear_weights=True))
    assert not [t for t in prepared.param_transforms if "wte" in t.key]


def test_linear_weights_are_the_parameters_only_linear_layers_and_row_lookups_read():
    """What a backend may hold in another layout (the PyTorch module stores the wide ones transposed): every
    instance's linear weights and the head, never a norm's weight, nor an untied embedding (only looked up)."""
    layers = [f"model.layers.{i}.{m}.weight" for i in range(3) for m in (
        "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
        "mlp.up_proj", "mlp.down_proj")]  # fmt: skip
    assert linear_weights(prepare(llama(3), PassOptions())) == {*layers, "lm_head.weight"}


def test_weights_a_matmul_reads_are_not_linear_weights():
    """GPT-2's Conv1D multiplies `x @ weight` ([in, out], a matmul, not a linear layer): none of its weights is
    one, while the tied token embedding (a lookup and the head) is; the position embedding is only looked up."""
    p = build(EXAMPLES / "gpt2.linnet", config={"n_layer": 1, "n_embd": 16, "n_head": 2, "vocab_size": 64})
    assert linear_weights(prepare(p, PassOptions())) == {"transformer.wte.weight"}


def test_linear_layers_sharing_an_input_read_their_weights_joined_under_their_names():
    """`concat_linear_weights` (the PyTorch module under `fast`): one linear over the `concat` of q, k and v (gate
    and up), each parameter keeping its checkpoint name; the joined weights are still linear weights."""
    p = prepare(llama(3), PassOptions(concat_linear_weights=True))
    attn = [f"model.layers.{i}.self_attn.{m}_proj.weight" for i in range(3) for m in "qkv"]
    mlp = [f"model.layers.{i}.mlp.{m}_proj.weight" for i in range(3) for m in ("gate", "up")]
    assert sorted(concat_weight_groups(p)) == sorted(
        [tuple(attn[3 * i : 3 * i + 3]) for i in range(3)] + [tuple(mlp[2 * i : 2 * i + 2]) for i in range(3)]
    )
    assert p.param_transforms == [] and {*attn, *mlp} <= set(p.code_params())
    assert linear_weights(p) == linear_weights(prepare(llama(3), PassOptions()))
    project = p.functions["LlamaAttention.project"]
    assert [op.name for op in project.ops if op.name in ("concat", "linear", "split")] == ["concat", "linear", "split"]
    verify_program(p)


def test_a_weight_two_graphs_would_join_differently_is_read_alone(tmp_path):
    """`forward` would join q, k and v, `keys` only q and k: one buffer cannot lay out both, so neither joins."""
    path = tmp_path / "two.linnet"
    path.write_text(TWO_GROUPINGS, encoding="utf-8")
    p = prepare(build(path), PassOptions(concat_linear_weights=True))
    assert concat_weight_groups(p) == []
    assert not [op for g in p.graphs() for op in walk_ops(g) if op.name == "concat"]


def test_a_concat_of_parameters_the_model_writes_is_not_a_group(tmp_path):
    """SAM joins its output tokens' embeddings itself (`concat([iou_token.weight, mask_tokens.weight], dim=0)`): a
    concat of parameters that no linear layer reads as its weight is the model's, not a group to lay out."""
    path = tmp_path / "tokens.linnet"
    path.write_text(MODEL_CONCAT, encoding="utf-8")
    p = prepare(build(path), PassOptions(concat_linear_weights=True))
    assert [op for g in p.graphs() for op in walk_ops(g) if op.name == "concat"]
    assert concat_weight_groups(p) == []
    assert concat_weight_groups(prepare(build(path), PassOptions())) == []


MODEL_CONCAT = """
config Small {
    width: int = 8
}

model Tokens(c: Small) {
    first: Embedding(1, c.width)
    rest: Embedding(3, c.width)
    proj: Linear(c.width, c.width)

    entry fn forward(h: [B, c.width]) -> [B, 4] {
        let tokens = concat([first.weight, rest.weight], dim=0)
        proj(h) @ transpose(tokens, 0, 1)
    }
}
"""


TWO_GROUPINGS = """
config Small {
    width: int = 8
}

model Two(c: Small) {
    q_proj: Linear(c.width, c.width)
    k_proj: Linear(c.width, c.width)
    v_proj: Linear(c.width, c.width)

    entry fn forward(h: [B, c.width]) -> [B, c.width] {
        q_proj(h) * k_proj(h) + v_proj(h)
    }

    entry fn keys(h: [B, c.width]) -> [B, c.width] {
        q_proj(h) + k_proj(h) + v_proj(h * 2.0)
    }
}
"""


def test_attention_variants_recorded_where_they_apply():
    p = prepare(llama(1, head_dim=16), PassOptions(attention=("scale_queries", "trim_keys", "keys_first", "kv_flat")))
    attention_ops = {
        g.name: [op for op in walk_ops(g) if op.name == "composite" and op.attrs["name"] == "attention"]
        for g in p.functions.values()
    }
    (forward,) = attention_ops["LlamaAttention.forward"]
    (step,) = attention_ops["LlamaAttention.step"]
    assert forward.attrs["variant"] == {"scale_queries": True}  # no cache: nothing to trim
    assert step.attrs["variant"] == {"scale_queries": True, "trim_keys": True, "keys_first": True}
    flat = prepare(llama(1), PassOptions(cache_layout="flat", attention=("kv_flat",)))
    (step,) = [op for op in walk_ops(flat.functions["LlamaAttention.step"]) if op.attrs.get("name") == "attention"]
    assert step.attrs["variant"] == {"kv_flat": "flat"}  # the layout the caches are held in
    assert flat.state_layouts["model.layers.0.self_attn.k_cache"] == (2, 16, 8)


def test_attention_over_a_fixed_number_of_keys_without_a_cache_is_not_trimmed():
    """An encoder over a fixed-size image attends a fixed number of keys (SigLIP: (32 / 8)² patches here) that are
    all attended and come from no cache: no cache variant applies (trimming would cost a host synchronisation)."""
    p = build(EXAMPLES / "siglip.linnet", config=SMALL_SIGLIP)
    prepared = prepare(p, PassOptions(attention=("scale_queries", "trim_keys", "keys_first", "prefill_blocks")))
    ops = [op for g in prepared.graphs() for op in walk_ops(g) if op.attrs.get("name") == "attention"]
    fixed = [op for op in ops if op.args["k"].dims[2].as_int() == 16]
    assert fixed and all(not set(op.attrs["variant"]) - {"scale_queries"} for op in ops)


def test_passes_and_emitters_do_not_change_the_program():
    p = llama()
    before = format_program(p)
    prepare(p, PassOptions(fuse_linear_weights=True, cache_layout="flat", attention=("kv_flat",)))
    prepare(p, PassOptions(flatten=True, fuse_linear_weights=True))
    copy_program(p)
    from linnet.compiler.jax.codegen import generate as jax_generate
    from linnet.compiler.torch.codegen import generate as torch_generate

    assert torch_generate(p) == torch_generate(p)
    assert jax_generate(p) == jax_generate(p)
    assert format_program(p) == before
    assert not p.param_transforms and not p.state_layouts


def test_verifier_refuses_a_call_that_does_not_match_its_callee():
    p = llama()
    g = p.functions["LlamaDecoderLayer.step"]
    call = next(op for op in g.ops if op.name == "call" and op.attrs["fn"] == "LlamaAttention.step")
    call.args.pop(next(iter(call.args)))
    with pytest.raises(VerifyError, match="arguments do not match"):
        verify_program(p)


def test_verifier_refuses_an_unknown_member():
    p = llama()
    op = next(op for op in p.functions["LlamaAttention.step"].ops if op.name == "state")
    op.attrs["path"] = "no_cache"
    with pytest.raises(VerifyError, match="unknown state `no_cache`"):
        verify_program(p)


def test_decompose_runs_a_composite_as_its_body():
    p = prepare(
        llama(), replace(PassOptions(native={"attention": ("equivalent",)}), decompose=frozenset({"attention"}))
    )
    ops = [op for g in p.graphs() for op in walk_ops(g) if op.attrs.get("name") == "attention"]
    assert ops and not any(op.attrs["native"] for op in ops)


CROSS_LAYERS = """
config Small {
    width: int = 8
    n_layers: int = 2
}

module Cross(c: Small) {
    k_proj: Linear(c.width, c.width)
    v_proj: Linear(c.width, c.width)

    fn forward(h: [B, S, c.width], memory: [B, S, c.width]) -> [B, S, c.width] {
        h + k_proj(memory) * v_proj(memory)
    }
}

model Stack(c: Small) {
    layers: [Cross(c); c.n_layers]

    entry fn forward(h: [B, S, c.width], memory: [B, S, c.width]) -> [B, S, c.width] {
        let x = h
        for layer in layers {
            x = layer(x, memory)
        }
        x
    }
}
"""


@pytest.mark.parametrize("flat", [False, True], ids=["loop", "flattened"])
def test_layers_reading_one_input_fuse_within_each_layer_only(tmp_path, flat):
    """Every layer's `k_proj` and `v_proj` read the same input (an encoder's output, as in Whisper's cross-
    attention): each layer's pair fuses, never the layers' weights together (the fused weight would belong to no
    module class, and the verifier refused the program)."""
    path = tmp_path / "cross.linnet"
    path.write_text(CROSS_LAYERS, encoding="utf-8")
    p = prepare(build(path), PassOptions(flatten=flat, fuse_linear_weights=True))
    keys = sorted(t.key for t in p.param_transforms)
    assert keys == ["layers.0.{k,v}_proj.weight", "layers.1.{k,v}_proj.weight"]
    verify_program(p)


# SAM's two-way blocks: the first block's attention reads one input for q, k and v, the second adds a position
# embedding to q's and k's input only. The blocks' calls are lowered in their caller (their argument's dim `B * S` is
# the caller's), so each block's linears are grouped where they are used, but the fused weight is recorded on the
# attention's class, which every instance shares.
UNEVEN_BLOCKS = """
config Small {
    width: int = 8
    n_layers: int = 2
}

module Attn(c: Small) {
    q_proj: Linear(c.width, c.width)
    k_proj: Linear(c.width, c.width)
    v_proj: Linear(c.width, c.width)

    fn forward(q: [N, c.width], k: [N, c.width], v: [N, c.width]) -> [N, c.width] {
        q_proj(q) * k_proj(k) + v_proj(v)
    }
}

module Block(c: Small, layer_idx: int) {
    attn: Attn(c)

    fn forward(h: [N, c.width], pe: [N, c.width]) -> [N, c.width] {
        if layer_idx == 0 {
            attn(h, h, h)
        } else {
            h + attn(h + pe, h + pe, h)
        }
    }
}

model Blocks(c: Small) {
    layers: [Block(c, layer_idx) for layer_idx in range(c.n_layers)]

    entry fn forward(h: [B, S, c.width], pe: [B, S, c.width]) -> [B, S, c.width] {
        let x = rearrange(h, "b s d -> (b s) d")
        let flat_pe = rearrange(pe, "b s d -> (b s) d")
        for layer in layers {
            x = layer(x, flat_pe)
        }
        rearrange(x, "(b s) d -> b s d", b=B)
    }
}
"""


def test_instances_of_a_class_join_their_own_groups(tmp_path):
    """Joining keeps the names, so nothing is recorded on the class: each block joins what it reads from one input
    (the first q, k and v; the second q and k)."""
    path = tmp_path / "blocks.linnet"
    path.write_text(UNEVEN_BLOCKS, encoding="utf-8")
    p = prepare(build(path), PassOptions(concat_linear_weights=True))
    assert sorted(concat_weight_groups(p)) == [
        ("layers.0.attn.q_proj.weight", "layers.0.attn.k_proj.weight", "layers.0.attn.v_proj.weight"),
        ("layers.1.attn.q_proj.weight", "layers.1.attn.k_proj.weight"),
    ]
    assert p.modules["Attn"].fused == {}
    verify_program(p)


@pytest.mark.parametrize("flat", [False, True], ids=["calls", "flattened"])
def test_a_class_whose_instances_would_fuse_differently_is_not_fused(tmp_path, flat):
    """The first block would fuse its attention's `{q,k,v}_proj`, the second only `{q,k}_proj`: one class records
    one set of fused weights for all its instances (and drops their members), so neither fuses (the second block's
    `v_proj.weight` was dropped and the JAX module failed to read it)."""
    path = tmp_path / "blocks.linnet"
    path.write_text(UNEVEN_BLOCKS, encoding="utf-8")
    p = prepare(build(path), PassOptions(flatten=flat, fuse_linear_weights=True))
    assert p.param_transforms == []
    assert p.modules["Attn"].fused == {}
    verify_program(p)


def test_a_class_whose_instances_would_fuse_differently_runs_on_jax(tmp_path):
    """The program above on JAX (fusing where it can) against the interpreter, on one checkpoint."""
    pytest.importorskip("jax")
    pytest.importorskip("torch")
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    import linnet.jax
    import linnet.torch as lt

    path = tmp_path / "blocks.linnet"
    path.write_text(UNEVEN_BLOCKS, encoding="utf-8")
    rng = np.random.default_rng(0)
    weights = {p.path: rng.standard_normal(p.shape).astype(np.float32) for p in build(path).params}
    safetensors_numpy.save_file(weights, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text("{}", encoding="utf-8")
    h, pe = rng.standard_normal((2, 3, 8)).astype(np.float32), rng.standard_normal((2, 3, 8)).astype(np.float32)
    expected = lt.load(path, weights=tmp_path, mode="interpret", progress=False).forward(h, pe)
    got = linnet.jax.load(path, weights=tmp_path, progress=False).forward(h, pe)
    # f32 through unscaled N(0, 1) weights, summed in another order by XLA's dots than by torch's: on an AVX2 CPU one
    # of 48 values (1.25) is 7.2e-5 away, so the bound is 1e-4; a dropped or misplaced member is off by O(1)
    np.testing.assert_allclose(np.asarray(got), np.asarray(expected), rtol=1e-4, atol=1e-4)


def test_the_wide_weights_held_transposed_are_recorded_on_the_program():
    """`transpose_wide_weights` records the layout in `Program.param_layouts` (the PyTorch module binds by it): the
    f32 linear weights with more rows than columns, a joined group as a whole, in a decoder of at most 2 rows; an
    encoder, a wider batch or no option leaves the checkpoint's layout."""
    options = PassOptions(concat_linear_weights=True, transpose_wide_weights=True)
    p = prepare(llama(2), options)
    shapes = {s.path: s.shape for s in p.params}
    groups = concat_weight_groups(p)
    assert set(p.param_layouts.values()) == {"transposed"}
    for group in groups:  # q, k and v; gate and up: each joined group is wider than it is long
        assert all(path in p.param_layouts for path in group)
    assert all(shapes[path][0] > shapes[path][1] for path in p.param_layouts if not any(path in g for g in groups))
    assert not any("o_proj" in path or "down_proj" in path for path in p.param_layouts)  # N <= K
    assert prepare(llama(2), replace(options, transpose_wide_weights=False)).param_layouts == {}
    wider = build(EXAMPLES / "llama.linnet", config={**SMALL_LLAMA, "num_hidden_layers": 2}, max_batch=4)
    assert prepare(wider, options).param_layouts == {}
