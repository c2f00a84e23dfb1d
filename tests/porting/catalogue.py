"""The porting-mistake catalogue: realistic mistakes made while porting a model, each a textual edit of a shipped
source (examples/<family>.linnet) and the layer expected to catch it. Data only; tests/porting/test_mutations.py
applies and checks them, `python -m tests.porting.tally` counts what each layer catches (docs/zoo.md).

Each row: `id`; `family` (the example's stem, whose shrunk checkpoint tests/porting/checkpoints.py builds); `find`,
`replace`: the edit, `find` occurring exactly `count` times in the source (every occurrence replaced; `only`: that
occurrence alone, counted from 0, when the same line sits in `forward` and `step`); `layer`: the first layer
expected to catch it, in the order a user runs them:

- "check": `linnet check` and `linnet check --weights` (no tensor data): an error, or a warning the unmutated source
  does not have (the unused-parameter warning of issue 40's layer 1: a norm or embedding declared, loaded, never
  read);
- "verify": `linnet verify` (the source against itself: forward against cached steps, batched against one row,
  padded against unpadded);
- "diff": `linnet diff` (module by module against the reference);
- "none": no layer can catch it; `why` says why.

`needs` names what the row depends on beyond this branch: "unused-warning" (the checker's unused-parameter warning)
or "verify" (the `linnet verify` command); such a row is skipped with that reason until it exists. `slow` rows run
under the `slow` marker only.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mutation:
    id: str
    family: str
    find: str
    replace: str
    layer: str
    why: str
    count: int = 1
    only: int | None = None
    needs: str = ""
    slow: bool = False


ATTN_MERGE = 'o_proj(rearrange(out, "b h s d -> b s (h d)"))'
LLAMA_POST_NORM = "x + mlp(post_attention_layernorm(x))"

MUTATIONS: tuple[Mutation, ...] = (
    # --- llama: heads, rotary, norms, residuals, activation, fields -------------------------------------------
    Mutation("llama-head-merge-order", "llama", ATTN_MERGE, 'o_proj(rearrange(out, "b h s d -> b s (d h)"))',
             "diff", "heads merged dims-first in forward and step alike: shapes and both entries agree", count=2),
    Mutation("llama-head-merge-order-forward-only", "llama", ATTN_MERGE,
             'o_proj(rearrange(out, "b h s d -> b s (d h)"))', "verify",
             "the wrong merge in `forward` alone: forward and cached steps part", count=2, only=0, needs="verify",
             slow=True),
    Mutation("llama-head-split-order", "llama", 'rearrange(q_proj(x), "b s (h d) -> b h s d"',
             'rearrange(q_proj(x), "b s (d h) -> b h s d"', "diff",
             "queries split dims-first: every shape holds, the heads hold the wrong features"),
    Mutation("llama-norm-dropped", "llama", LLAMA_POST_NORM, "x + mlp(x)", "check",
             "post_attention_layernorm dropped from every entry: its weight is loaded and never read", count=2,
             needs="unused-warning"),
    Mutation("llama-norm-dropped-forward-only", "llama", LLAMA_POST_NORM, "x + mlp(x)", "verify",
             "the norm dropped from `forward` alone: the weight is still read (by `step`)", count=2, only=0,
             needs="verify"),
    Mutation("llama-attention-scale", "llama", "c.head_dim ** -0.5", "c.hidden_size ** -0.5", "diff",
             "softmax scale from the wrong field", count=2),
    Mutation("llama-rope-missing-on-keys", "llama", "(apply_rope(q, cos, sin), apply_rope(k, cos, sin), v)",
             "(apply_rope(q, cos, sin), k, v)", "diff", "rotary embeddings on queries only", slow=True),
    Mutation("llama-residual-from-wrong-tensor", "llama", LLAMA_POST_NORM, "h + mlp(post_attention_layernorm(x))",
             "diff", "the MLP's residual taken from the block's input instead of the attention's output", count=2),
    Mutation("llama-activation", "llama", "        down_proj(silu(gate_proj(x)) * up_proj(x))",
             "        down_proj(gelu(gate_proj(x)) * up_proj(x))", "diff", "GELU where the config says SiLU",
             slow=True),
    Mutation("llama-gate-up-swapped", "llama", "        down_proj(silu(gate_proj(x)) * up_proj(x))",
             "        down_proj(silu(up_proj(x)) * gate_proj(x))", "diff", "gate and up projections swapped",
             slow=True),
    Mutation("llama-rope-theta-constant", "llama", "rope_inv_freq(c.head_dim / 2, c.rope_theta, c.rope_scaling)",
             "rope_inv_freq(c.head_dim / 2, 10000.0, c.rope_scaling)", "diff",
             "Llama 2's rope_theta written as a constant: the checkpoint's 100 is ignored", slow=True),
    Mutation("llama-eps-constant", "llama", "RMSNorm(c.hidden_size, c.rms_norm_eps)", "RMSNorm(c.hidden_size, 1e-6)",
             "diff", "eps 1e-6 for the config's 1e-5 in the layers' norms: about 1e-3 on the MLP's output, 10 times "
             "diff's tolerance (the final norm still reads rms_norm_eps, so the field is not unused)", count=3,
             slow=True),
    Mutation("llama-rope-scaling-ignored", "llama",
             "rope_inv_freq(c.head_dim / 2, c.rope_theta, c.rope_scaling)",
             "rope_inv_freq(c.head_dim / 2, c.rope_theta, none)", "none",
             "rope_scaling dropped: the shrunk checkpoint has none, so every layer sees the same numbers; only a "
             "checkpoint with scaling (Llama 3.1's llama3) shows it, to `diff` (a config field no computation reads "
             "is not a parameter, so the unused-parameter warning does not cover it)"),
    # --- gpt2: fused qkv, Conv1D, positions, activation -------------------------------------------------------
    Mutation("gpt2-qkv-order", "gpt2", "let (q, k, v) = split(c_attn(x)", "let (k, q, v) = split(c_attn(x)", "diff",
             "the fused projection read as k, q, v: equal widths, so every shape holds"),
    Mutation("gpt2-attention-scale", "gpt2", "1.0 / sqrt(c.head_dim)", "1.0 / c.head_dim", "diff",
             "scale 1/d instead of 1/sqrt(d)", count=2, slow=True),
    Mutation("gpt2-positions-dropped", "gpt2", "let x = wte(input_ids) + wpe(position_ids)",
             "let x = wte(input_ids)", "check", "learned positions never added: wpe is loaded and never read",
             count=2, needs="unused-warning"),
    Mutation("gpt2-activation", "gpt2", "c_proj(gelu_tanh(h))", "c_proj(gelu(h))", "diff",
             "exact GELU where gelu_new (tanh) belongs", slow=True),
    Mutation("gpt2-ln2-dropped-step-only", "gpt2", "        x + mlp(ln_2(x))", "        x + mlp(x)", "verify",
             "the second norm dropped from the cached path (`step`) only", count=2, only=1, needs="verify",
             slow=True),
    # --- qwen2 / qwen3 / mistral / phi3 -----------------------------------------------------------------------
    Mutation("qwen2-q-bias-dropped", "qwen2",
             "q_proj: Linear(c.hidden_size, c.num_attention_heads * c.head_dim, use_bias=true)",
             "q_proj: Linear(c.hidden_size, c.num_attention_heads * c.head_dim, use_bias=false)", "check",
             "the checkpoint's q_proj.bias has no parameter: `check --weights` names the extra tensor"),
    Mutation("qwen3-qk-norm-dropped", "qwen3", "(apply_rope(q_norm(q), cos, sin), apply_rope(k_norm(k), cos, sin), v)",
             "(apply_rope(q, cos, sin), apply_rope(k, cos, sin), v)", "check",
             "Qwen3's per-head q/k norms dropped: their weights are loaded and never read", needs="unused-warning"),
    Mutation("qwen3-qk-norm-after-rope", "qwen3",
             "(apply_rope(q_norm(q), cos, sin), apply_rope(k_norm(k), cos, sin), v)",
             "(q_norm(apply_rope(q, cos, sin)), k_norm(apply_rope(k, cos, sin)), v)", "diff",
             "the q/k norms applied after the rotary embeddings instead of before", slow=True),
    Mutation("mistral-window-ignored", "mistral", "sliding_window_mask(position_ids, key_positions, c.sliding_window)",
             "causal_mask(position_ids, key_positions)", "diff",
             "full causal attention where the config has a window (8 tokens over a window of 6)"),
    Mutation("phi3-gate-up-swapped", "phi3", "        down_proj(up * silu(gate))", "        down_proj(gate * silu(up))",
             "diff",
             "the fused gate_up projection read up-then-gate"),
    Mutation("phi3-rotary-fraction-ignored", "phi3", "rotary_dim: int = int(head_dim * partial_rotary_factor)",
             "rotary_dim: int = head_dim", "check",
             "partial_rotary_factor not read: the LongRoPE factors (one per rotated pair) no longer fit, L201",
             slow=True),
    # --- encoders ---------------------------------------------------------------------------------------------
    Mutation("bert-token-types-dropped", "bert", "LayerNorm(word_embeddings(input_ids) + token_types + positions)",
             "LayerNorm(word_embeddings(input_ids) + positions)", "check",
             "token type embeddings never added: the `token_types` it looks up is left unused (L9xx warning today; "
             "the table is loaded and never read, the unused-parameter warning's)"),
    Mutation("bert-mask-ignored", "bert", "padding_mask(attention_mask)", "padding_mask(attention_mask * 0 + 1)",
             "verify", "attention_mask ignored: equal to the reference on unpadded input, wrong once a row is padded",
             needs="verify"),
    Mutation("bert-post-norm-as-pre-norm", "bert", "        LayerNorm(dense(h) + residual)",
             "        dense(h) + LayerNorm(residual)", "diff",
             "BERT's post-norm feed-forward output written as a pre-norm block", count=2, only=1, slow=True),
    Mutation("roberta-position-offset", "roberta", "counts * cast(real, i64) + pad_token_id",
             "counts * cast(real, i64)", "diff", "RoBERTa's positions counted from 0, not from padding_idx + 1"),
    Mutation("modernbert-geglu-halves-swapped", "modernbert", "let (input, gate) = split(Wi(x)",
             "let (gate, input) = split(Wi(x)", "diff", "GeGLU's input and gate halves swapped"),
    Mutation("modernbert-rope-theta-swapped", "modernbert", "            c.local_rope_theta",
             "            c.global_rope_theta", "none",
             "the local layers' rope_theta read from the global field on the path for a config.json without "
             "`rope_parameters` (transformers 4's): transformers 5 writes `rope_parameters`, so the shrunk "
             "checkpoint never takes that path; `diff` on a transformers-4 checkpoint would show it", slow=True),
    # --- vision -----------------------------------------------------------------------------------------------
    Mutation("vit-patch-order", "vit", 'rearrange(projection(pixel_values), "b d h w -> b (h w) d")',
             'rearrange(projection(pixel_values), "b d h w -> b (w h) d")', "diff",
             "patches flattened column by column: positions added to the wrong patches"),
    Mutation("vit-norms-swapped", "vit", "let h = x + attention(layernorm_before(x))",
             "let h = x + attention(layernorm_after(x))", "check",
             "layernorm_after used twice: layernorm_before is loaded and never read", needs="unused-warning",
             slow=True),
    Mutation("dinov2-layer-scale-dropped", "dinov2", "let h = x + layer_scale1(attention(norm1(x)))",
             "let h = x + attention(norm1(x))", "check", "layer scale dropped: lambda1 is loaded and never read",
             needs="unused-warning"),
    Mutation("resnet-residual-after-relu", "resnet", "        relu(h + residual)", "        relu(h) + residual", "diff",
             "the residual added after the block's ReLU instead of before it"),
    Mutation("siglip-text-pooled-first-token", "siglip", "head(h[:, -1])", "head(h[:, 0])", "diff",
             "the text tower pooled at the first token (CLIP's habit) where SigLIP pools the last"),
    Mutation("sam-qkv-split-order", "sam", '"b h w (three a d) -> three b a (h w) d"',
             '"b h w (a three d) -> three b a (h w) d"', "diff",
             "the fused qkv split per head first, where SAM stores q, k, v first (equal sizes: shapes hold)"),
    Mutation("sam-rel-pos-dropped", "sam",
             "let biased = if c.use_rel_pos { scores + relative_positions(q) } else { scores }",
             "let biased = scores", "check",
             "the decomposed relative positions never added: rel_pos_h and rel_pos_w are loaded and never read",
             needs="unused-warning", slow=True),
    Mutation("sam-rel-pos-bias-transposed", "sam", "unsqueeze(by_row, -1) + unsqueeze(by_col, -2)",
             "unsqueeze(by_row, -2) + unsqueeze(by_col, -1)", "diff",
             "the decomposed relative-position bias transposed (key rows and columns swapped): a square grid keeps "
             "every shape", slow=True),
    Mutation("gpt-oss-swiglu-pairs-halves", "gpt_oss", '"... (i two) -> ... i two", two=2',
             '"... (two i) -> ... i two", two=2', "diff",
             "gate and up read as halves where GPT-OSS interleaves them (NeoX-style pairs)"),
    # --- encoder-decoder, diffusers ---------------------------------------------------------------------------
    Mutation("whisper-query-scale-dropped", "whisper", "heads(q_proj(x) * (embed_dim / num_heads) ** -0.5)",
             "heads(q_proj(x))", "diff", "queries not scaled (the scale lives in the projection, not the softmax)"),
    Mutation("whisper-encoder-positions-dropped", "whisper",
             'let h = rearrange(frames, "b d n -> b n d") + embed_positions.weight',
             'let h = rearrange(frames, "b d n -> b n d")', "check",
             "the encoder's sinusoidal positions never added: embed_positions is loaded and never read",
             needs="unused-warning", slow=True),
    Mutation("autoencoder-kl-post-quant-conv-skipped", "autoencoder_kl",
             "let z = if c.use_post_quant_conv { post_quant_conv(latents) } else { latents }", "let z = latents",
             "check", "post_quant_conv skipped: its weights are loaded and never read", needs="unused-warning"),
    Mutation("unet-flip-sin-to-cos-ignored", "unet_2d_condition",
             "if flip_sin_to_cos { concat([cos(args), sin(args)], dim=-1) }",
             "if flip_sin_to_cos { concat([sin(args), cos(args)], dim=-1) }", "diff",
             "SDXL's flip_sin_to_cos ignored: the timestep embedding's halves in the wrong order", slow=True),
)  # fmt: skip
