"""Which weights a tensor-parallel run splits, and along which dim, by checkpoint name.

The plan is transformers' `base_model_tp_plan` (models/llama/configuration_llama.py, `LlamaConfig`; the same
for Mistral, Qwen2 and Qwen3): Megatron-LM's split (Shoeybi et al. 2019, section 3). In each attention
block q_proj, k_proj and v_proj are column-parallel (each rank holds whole heads' rows of the weight, so
attention runs on its own heads) and o_proj is row-parallel (each rank multiplies its heads' slice of the
input; the partial sums are all-reduced); in each MLP gate_proj and up_proj are column-parallel and
down_proj row-parallel. So each decoder layer costs two all-reduces of [B, S, hidden_size] and nothing
else; embeddings, norms and the head are replicated. KV caches ([max_batch, num_key_value_heads,
max_positions, head_dim]) are split on their heads dim like the k_proj/v_proj outputs that fill them.
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import Any

from linnet.errors import BackendError

COLWISE = "colwise"
ROWWISE = "rowwise"

# transformers' LlamaConfig.base_model_tp_plan, with the `model.` prefix of the checkpoint names.
LLAMA_TP_PLAN: dict[str, str] = {
    "model.layers.*.self_attn.q_proj": COLWISE,
    "model.layers.*.self_attn.k_proj": COLWISE,
    "model.layers.*.self_attn.v_proj": COLWISE,
    "model.layers.*.self_attn.o_proj": ROWWISE,
    "model.layers.*.mlp.gate_proj": COLWISE,
    "model.layers.*.mlp.up_proj": COLWISE,
    "model.layers.*.mlp.down_proj": ROWWISE,
}
# State split on dim 1 (the heads of [max_batch, num_key_value_heads, max_positions, head_dim]).
HEAD_SHARDED_STATE = ("*.k_cache", "*.v_cache")
# The config fields that must divide by the number of ranks for each rank to hold whole heads and rows.
DIVIDED_FIELDS = ("num_attention_heads", "num_key_value_heads", "intermediate_size")


def split_dim(path: str, plan: dict[str, str] = LLAMA_TP_PLAN) -> int | None:
    """The dim along which the tensor `path` (a checkpoint name, or a state path) is split, or None when it
    is replicated: dim 0 of a column-parallel layer's weight and bias ([out, in], [out]), dim 1 of a
    row-parallel layer's weight (its bias, added once after the all-reduce, is replicated), dim 1 of a KV
    cache (its heads)."""
    module, _, leaf = path.rpartition(".")
    for pattern, style in plan.items():
        if fnmatchcase(module, pattern):
            if style == COLWISE:
                return 0
            if style == ROWWISE:
                return 1 if leaf == "weight" else None
            raise BackendError(f"tensor-parallel plan: `{pattern}` has style {style!r} (colwise or rowwise)")
    if any(fnmatchcase(path, p) for p in HEAD_SHARDED_STATE):
        return 1
    return None


def check_plan(paths: list[str], config: dict[str, Any], ranks: int, plan: dict[str, str] = LLAMA_TP_PLAN) -> None:
    """Raise BackendError unless the plan splits some of `paths` (the model's parameters by checkpoint
    name) and each of `DIVIDED_FIELDS` the config has divides by `ranks`, so that every rank holds whole
    heads (a head cut in two would be exact under DTensor or GSPMD, but would move data every layer)."""
    if ranks < 1:
        raise BackendError(f"tensor parallelism needs at least one rank, got {ranks}")
    if not any(split_dim(p, plan) is not None for p in paths):
        raise BackendError(
            "tensor-parallel plan matches no parameter of this model (it splits "
            f"{', '.join(plan)}); tensor parallelism supports Llama-like decoders (llama, mistral, qwen2, qwen3)"
        )
    for name in DIVIDED_FIELDS:
        value = config.get(name)
        if isinstance(value, int) and value % ranks:
            raise BackendError(
                f"tensor parallelism over {ranks} ranks: config `{name}` = {value} does not divide by {ranks}"
            )
