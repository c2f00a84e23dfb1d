"""The 5 MB document of issue 45: examples/llama.linnet (its `@weights` lines dropped) repeated, each copy's config,
presets and modules renamed with the copy's number and the copies after the first made `module`s (a file has one
root `model`), with the same ten mistakes in every copy (six unknown names, a wrong argument count, two shape errors,
an unread `let`). Standard library only: bench/lsp_bigdoc.py and bench/check_phases.py time it, and
tests/semantics/test_bigdoc.py holds the checker's diagnostics of a few copies to a golden file.
"""

from __future__ import annotations

import re
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "llama.linnet"

# (what a copy says, the mistake put in its place): each replaces its first occurrence in the copy
MISTAKES = [
    ("        down_proj(silu(", "        down_proj(siluu("),  # unknown name: did you mean `silu`
    (
        'o_proj(rearrange(out, "b h s d -> b s (h d)"))\n    }\n\n    ## Attention with',
        "o_proj(out)\n    }\n\n    ## Attention with",
    ),  # a shape error quoting where each dim came from
    ("x + mlp(post_attention_layernorm(x))", "x + mlp(post_attention_layrnorm(x))"),
    ("let h = embed_tokens(input_ids)", "let h = embed_tokenz(input_ids)"),
    ("norm(h)\n    }\n\n    fn step", "norm(hh)\n    }\n\n    fn step"),
    ("logits(h[:, -1])", "logits(h[:, -1], 3)"),  # one argument too many
    ("rope_cos_sin(inv_freq, position_ids)", "rope_cos_sin(inv_freqs, position_ids)"),  # and `inv_freq` unread
    ("h @ transpose(model.embed_tokens.weight)", "h @ model.embed_tokens.weight"),  # cannot matmul
    ("let k = rearrange(k_proj(x)", "let k = rearrange(kk_proj(x)"),
    ("causal_mask(position_ids, arange(S))", "causal_mask(position_id, arange(S))"),
]
RENAMED = [
    "LlamaForCausalLM",
    "LlamaDecoderLayer",
    "LlamaAttention",
    "LlamaModel",
    "LlamaMLP",
    "Llama",
    "smollm2_135m",
    "smollm2_1_7b_instruct",
    "tinyllama_1_1b",
    "llama_3_1_8b",
]


def big_source(copies: int = 570) -> str:
    """The big document: `copies` renamed copies of examples/llama.linnet with MISTAKES in each (see above)."""
    base = re.sub(r"@weights\([^)]*\)\n", "", EXAMPLE.read_text(encoding="utf-8"))
    parts = []
    for i in range(copies):
        text = base
        for name in RENAMED:
            text = re.sub(rf"\b{name}\b", f"{name}_{i}", text)
        if i > 0:
            text = text.replace("model LlamaForCausalLM", "module LlamaForCausalLM").replace("entry fn", "fn")
        for was, mistake in MISTAKES:
            if was not in text:
                raise SystemExit(f"examples/llama.linnet changed: `{was.splitlines()[0]}` is not in it")
            text = text.replace(was, mistake, 1)
        parts.append(text)
    return "".join(parts)
