"""The cost model (`linnet.ir.cost`) on a small Llama against a hand derivation from its config:
parameters, FLOPs of `forward` and `step` (prefill and decode), KV-cache bytes, and per-layer
parameter counts. Runs without torch; tests/ir/test_cost_reference.py compares the same numbers
with transformers and with what PyTorch counts and allocates."""

from __future__ import annotations

import functools
from collections import Counter

import pytest

from linnet.ir import build
from linnet.ir.cost import module_param_counts, program_cost
from linnet.types.core import DTYPES
from tests.conftest import EXAMPLES
from tests.ir.test_ir import SMALL_LLAMA

MAX_POSITIONS, MAX_BATCH = 16, 3
V, H, FF, L = 96, 32, 64, 2  # vocab, hidden, intermediate (feed-forward), layers (SMALL_LLAMA)
NH, KV, D = 4, 2, 8  # query heads, key/value heads, head_dim
LAYER_PARAMS = H * NH * D + 2 * H * KV * D + NH * D * H + 3 * H * FF + 2 * H  # q, k, v, o, the MLP, 2 RMSNorms


@functools.cache
def small(dtype: str = "f32"):
    return build(
        EXAMPLES / "llama.linnet", config=SMALL_LLAMA, dtype=dtype, max_batch=MAX_BATCH, max_positions=MAX_POSITIONS
    )


# Hand derivation (2 x multiply-adds per matmul; Llama's modeling code): per token and layer the projections
# q, k, v, o and the gated MLP's three matmuls; attention QK^T and AV each 2 * NH * keys * D per query token.
LAYER_FLOPS_PER_TOKEN = 2 * H * (NH * D + 2 * KV * D) + 2 * NH * D * H + 3 * 2 * H * FF
HEAD_FLOPS = 2 * H * V  # the LM head, per token it is applied to


def attention_flops(queries: int, keys: int) -> int:
    return L * 2 * (2 * NH * queries * keys * D)


def test_parameters_by_hand():
    cost = program_cost(small())
    assert cost.param_count == V * H + L * LAYER_PARAMS + H + V * H  # embedding, layers, final norm, lm_head
    assert cost.param_bytes == {"f32": 4 * cost.param_count, "bf16": 2 * cost.param_count, "f16": 2 * cost.param_count}
    tied = build(EXAMPLES / "llama.linnet", config={**SMALL_LLAMA, "tie_word_embeddings": True})
    assert program_cost(tied).param_count == cost.param_count - V * H  # the head reads the embedding: counted once


@pytest.mark.parametrize("seq_len", [1, 5, 16])
def test_forward_flops_by_hand(seq_len):
    """forward: every position through every layer and the head; attention over its own S tokens (the causal mask
    hides half, the IR computes all of it)."""
    cost = program_cost(small(), seq_len=seq_len, batch=2)
    forward = next(e for e in cost.entries if e.entry == "forward")
    assert (forward.batch, forward.seq_len) == (2, seq_len)
    assert forward.matmul_flops == 2 * seq_len * (L * LAYER_FLOPS_PER_TOKEN + HEAD_FLOPS)
    assert forward.attention_flops == 2 * attention_flops(seq_len, seq_len)
    assert forward.flops_per_token == forward.flops / (2 * seq_len)


def test_step_flops_by_hand():
    """step: the head on each sequence's last token only; attention over the whole cache (max_positions keys,
    masked), so decode (S = 1) is reported besides the prefill at the stated length."""
    cost = program_cost(small(), seq_len=8, batch=1)
    prefill, decode = [e for e in cost.entries if e.entry == "step"]
    assert (prefill.seq_len, decode.seq_len) == (8, 1)
    assert prefill.matmul_flops == 8 * L * LAYER_FLOPS_PER_TOKEN + HEAD_FLOPS
    assert prefill.attention_flops == attention_flops(8, MAX_POSITIONS)
    assert decode.flops == L * LAYER_FLOPS_PER_TOKEN + HEAD_FLOPS + attention_flops(1, MAX_POSITIONS)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_kv_cache_by_hand(dtype):
    """Keys and values of every layer: 2 * L * KV * D elements per position of a row."""
    cost = program_cost(small(dtype))
    per_token = 2 * L * KV * D * DTYPES[dtype].itemsize
    assert cost.kv_bytes_per_token == per_token
    assert cost.kv_bytes == per_token * MAX_BATCH * MAX_POSITIONS
    assert cost.state_fixed_bytes == 0
    assert cost.context_positions == 2048  # the config default of max_position_embeddings
    assert cost.kv_bytes_at_context == per_token * 2048


def test_peak_activations_grow_with_the_batch_and_hold_the_logits():
    """An estimate: at least the largest value alive (the forward's f32 logits [B, S, V]), and linear in B."""
    one = next(e for e in program_cost(small(), seq_len=16, batch=1).entries if e.entry == "forward")
    two = next(e for e in program_cost(small(), seq_len=16, batch=2).entries if e.entry == "forward")
    assert one.peak_activation_bytes >= 16 * V * 4
    assert two.peak_activation_bytes == 2 * one.peak_activation_bytes


def test_per_layer_parameter_counts():
    program = small()
    counts = module_param_counts(program)
    assert counts["LlamaDecoderLayer"] == LAYER_PARAMS
    assert counts["LlamaMLP"] == 3 * H * FF
    assert counts[program.root] == program_cost(program).param_count


def test_json_names_its_units():
    data = program_cost(small(), seq_len=4).as_json()
    assert data["parameters"] == program_cost(small()).param_count
    assert {"kv_cache_bytes_per_token", "kv_cache_bytes", "parameter_bytes"} <= data.keys()
    assert {e["entry"] for e in data["entries"]} == {"forward", "step"}
    assert all("flops_per_token" in e and "peak_activation_bytes" in e for e in data["entries"])


def test_sizes_below_one_are_refused():
    with pytest.raises(ValueError, match="at least 1"):
        program_cost(small(), seq_len=0)


def test_a_graph_called_many_times_is_measured_once(monkeypatch):
    """Hovering a module's parameters lowers and costs the model after each edit: GPT-OSS's graphs are called 1,848
    times in its entries, and measuring each call's callee again took 0.1-0.17 s of such a hover. A callee is
    measured once per entry run, and the cost is the same (a value was measured up to 6 times in 4 runs before)."""
    from linnet.ir import cost

    shrunk = {"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 32, "num_attention_heads": 4}
    shrunk |= {"num_key_value_heads": 2, "head_dim": 16, "num_local_experts": 4, "num_experts_per_tok": 2}
    program = build(EXAMPLES / "gpt_oss.linnet", config=shrunk | {"vocab_size": 128}, max_batch=2, max_positions=16)
    expected = program_cost(program, seq_len=4, batch=2)
    measured: list[int] = []
    real = cost.value_bytes
    monkeypatch.setattr(cost, "value_bytes", lambda v, sizes: measured.append(id(v)) or real(v, sizes))
    assert program_cost(program, seq_len=4, batch=2) == expected
    # each value of each graph once per entry run (`entry_cost`): a callee's values are not measured per call
    runs = len(expected.entries)
    assert max(Counter(measured).values()) <= runs
