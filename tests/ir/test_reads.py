"""`linnet.ir.reads`: the parameters and state an entry reads, through calls, loops (one path per layer) and
composites, against what the source says: a decoder's `forward` and `step` read the same parameters, `step` alone
reads the KV cache, a norm dropped from one entry is missing from its reads, and Whisper's `step` reads the
cross-attention caches that only `prefill_encoder` writes."""

from __future__ import annotations

from linnet.ir import build
from linnet.ir.reads import state_needed_first, tensors_read
from tests.conftest import EXAMPLES

LLAMA = {"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4}
LLAMA |= {"num_key_value_heads": 2, "head_dim": 16, "vocab_size": 256}


def test_forward_and_step_read_the_same_parameters_and_only_step_the_cache():
    program = build(EXAMPLES / "llama.linnet", preset="smollm2_135m", config=LLAMA)
    forward, step = tensors_read(program, "forward"), tensors_read(program, "step")
    assert forward == step == {p.path for p in program.params}
    assert "model.layers.1.input_layernorm.weight" in forward  # the loop's second layer, by its own path
    assert tensors_read(program, "forward", "state") == set()
    assert tensors_read(program, "step", "state") == {
        f"model.layers.{i}.self_attn.{c}" for i in (0, 1) for c in ("k_cache", "v_cache")
    }
    assert state_needed_first(program, "step") == []  # it writes every cache it reads


def test_a_norm_dropped_from_forward_is_missing_from_its_reads(tmp_path):
    text = (EXAMPLES / "llama.linnet").read_text()
    mutated = tmp_path / "llama.linnet"
    mutated.write_text(text.replace("self_attn(input_layernorm(h), cos, sin, mask)", "self_attn(h, cos, sin, mask)"))
    program = build(mutated, preset="smollm2_135m", config=LLAMA)
    assert tensors_read(program, "step") - tensors_read(program, "forward") == {
        "model.layers.0.input_layernorm.weight",
        "model.layers.1.input_layernorm.weight",
    }


def test_whisper_step_needs_the_cross_caches_prefill_encoder_writes():
    program = build(EXAMPLES / "whisper.linnet", preset="whisper_tiny", config={"decoder_layers": 2})
    needed = state_needed_first(program, "step")
    assert needed == [f"model.decoder.layers.{i}.cross_{c}_cache" for i in (0, 1) for c in ("k", "v")]
    assert set(needed) <= set(program.state_written("prefill_encoder"))
