"""Writing GGUF files the way llama.cpp's convert_hf_to_gguf.py does, for tests: a transformers Llama's state
dict under GGUF names with the rotary row permutation of Q/K (`LlamaModel.permute`), the metadata keys llama.cpp
writes, and Llama 3's `rope_freqs.weight` (`LlamaModel.generate_extra_tensors`). Imports torch/gguf lazily."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

TO_GGUF = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}


def llamacpp_permute(w, n_head, n_head_kv):
    """llama.cpp convert_hf_to_gguf.py `LlamaModel.permute`, verbatim in numpy."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_name(hf_name: str) -> str:
    """The GGUF name llama.cpp gives a Hugging Face Llama tensor name."""
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
    if hf_name in top or hf_name == "lm_head.weight":
        return top.get(hf_name, "output.weight")
    _, _, layer, *rest = hf_name.split(".")
    return f"blk.{layer}.{TO_GGUF['.'.join(rest[:-1])]}.{rest[-1]}"


def llamacpp_rope_freqs(config: Any) -> np.ndarray:
    """`rope_freqs.weight` as llama.cpp's `LlamaModel.generate_extra_tensors` computes it for a llama3
    `rope_scaling`, in torch f32, term for term. One difference: llama.cpp reads
    `original_max_position_embeddings` from the top level of config.json (absent in Llama 3.x's, so it uses 8192,
    their real value); here it comes from the rope parameters, which is what the model uses."""
    import torch

    rope = dict(config.rope_parameters)
    base = rope["rope_theta"]
    dim = config.head_dim
    freqs = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    factor = rope.get("factor", 8.0)
    low_freq_factor = rope.get("low_freq_factor", 1.0)
    high_freq_factor = rope.get("high_freq_factor", 4.0)
    old_context_len = rope.get("original_max_position_embeddings", 8192)
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    rope_factors = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_freq_wavelen:
            rope_factors.append(1)
        elif wavelen > low_freq_wavelen:
            rope_factors.append(factor)
        else:
            smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
            rope_factors.append(1 / ((1 - smooth) / factor + smooth))
    return torch.tensor(rope_factors, dtype=torch.float32).numpy()


def write_llama_gguf(
    path: Path,
    model: Any,
    *,
    rope_freqs: np.ndarray | None = None,
    extra_metadata: dict[str, Any] | None = None,
    quantize: dict[str, str] | None = None,
) -> None:
    """`model` (a transformers LlamaForCausalLM) as an all-f32 GGUF in llama.cpp's layout, with the metadata
    `LlamaModel.set_gguf_parameters` writes (no rope-scaling keys) and, when given, `rope_freqs.weight`.
    `extra_metadata`: more `key: value` pairs, or other values for those keys (ints as uint32, floats as float32,
    strings, bools, lists as arrays). `quantize`: GGUF tensor name -> gguf type name ("q4_1", "q8_0"; types
    `gguf.quants.quantize` writes), "*" for every other 2-D tensor, as llama.cpp's quantize tool would."""
    import gguf

    c = model.config
    w = gguf.GGUFWriter(str(path), "llama")
    metadata: dict[str, Any] = {
        f"llama.{key}": value
        for key, value in {
            "vocab_size": c.vocab_size,
            "context_length": c.max_position_embeddings,
            "embedding_length": c.hidden_size,
            "feed_forward_length": c.intermediate_size,
            "block_count": c.num_hidden_layers,
            "attention.head_count": c.num_attention_heads,
            "attention.head_count_kv": c.num_key_value_heads,
            "rope.dimension_count": c.head_dim,
            "attention.key_length": c.head_dim,
            "attention.value_length": c.head_dim,
            "rope.freq_base": float(c.rope_parameters["rope_theta"]),
            "attention.layer_norm_rms_epsilon": float(c.rms_norm_eps),
        }.items()
    }
    metadata["general.file_type"] = 0
    metadata.update(extra_metadata or {})
    for key, value in metadata.items():
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        elif isinstance(value, list):
            w.add_array(key, value)
        else:
            w.add_string(key, value)
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and c.tie_word_embeddings:
            continue
        data = tensor.detach().float().numpy()
        gname = gguf_name(name)
        if ".attn_q." in gname:
            data = llamacpp_permute(data, c.num_attention_heads, c.num_attention_heads)
        elif ".attn_k." in gname:
            data = llamacpp_permute(data, c.num_attention_heads, c.num_key_value_heads)
        qtype = (quantize or {}).get(gname, (quantize or {}).get("*") if data.ndim == 2 else None)
        if qtype is not None:
            qtype = gguf.GGMLQuantizationType[qtype.upper()]
            w.add_tensor(gname, gguf.quants.quantize(np.ascontiguousarray(data), qtype), raw_dtype=qtype)
        else:
            w.add_tensor(gname, np.ascontiguousarray(data))
    if rope_freqs is not None:
        w.add_tensor("rope_freqs.weight", np.ascontiguousarray(rope_freqs, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
