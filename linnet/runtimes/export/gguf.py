"""`linnet export gguf`: a loaded model as a GGUF file that llama.cpp (and Ollama, LM Studio) run.

    from linnet.runtimes.export.gguf import export_gguf
    export_gguf(model, "out/smollm2.gguf", file_type="q8_0")

Written with the `gguf` package's `GGUFWriter`, the way llama.cpp's convert_hf_to_gguf.py writes the family
(`ARCHITECTURES`: Llama and Mistral as its `LlamaModel`, Qwen2, Qwen3): the architecture keys (`llama.*`),
tensors under llama.cpp's names (gguf-py tensor_mapping.py), for the llama architecture the rows of Q and K
permuted for llama.cpp's rotary layout (`LlamaModel.permute`; K with the KV head count), Llama 3's rope scaling
as the tensor `rope_freqs.weight` (`LlamaModel.generate_extra_tensors`), no `output.weight` when the head is tied
to the embeddings, and the tokenizer as `tokenizer.ggml.*` metadata (byte-level BPE: tokens, token types,
merges, an explicit pre-tokenizer type llama.cpp knows, special ids, add_bos/add_eos, the chat template).

Tensor types (`--type`), as convert_hf_to_gguf.py and llama-quantize choose them: 1-D tensors (norms, biases,
`rope_freqs.weight`) stay f32; 2-D weights take the file type; a row not a multiple of the quantization block
falls back to f16; with q4_0/q4_1 the output projection (the embeddings when tied) is q8_0, as llama-quantize
does for a width that k-quants cannot take (SmolLM2's original Q4_1 file). Quantization is `gguf.quants`'s numpy
port of ggml's reference quantizers.

The file is written under a temporary name beside the target and renamed at the end: an error leaves nothing
behind. Needs numpy and gguf; never torch.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from linnet.errors import ExportError
from linnet.runtimes.export.values import check_exportable
from linnet.runtimes.formats.checkpoints import cast_floating
from linnet.runtimes.formats.gguf import GGUF_TENSOR_MAPS, GGUF_TRANSFORMS
from linnet.runtimes.formats.gguf_rope import default_inv_freq, llama3_rope_freqs
from linnet.runtimes.formats.tokenizer import GGUF_PRE_TOKENIZERS, Tokenizer
from linnet.runtimes.model_weights import model_weights

__all__ = ["export_gguf", "FILE_TYPES", "ARCHITECTURES", "gguf_tensors", "tokenizer_metadata"]

# --type -> (ggml type of the 2-D weights, general.file_type: gguf-py LlamaFileType)
FILE_TYPES = {
    "f32": ("F32", "ALL_F32"),
    "f16": ("F16", "MOSTLY_F16"),
    "bf16": ("BF16", "MOSTLY_BF16"),
    "q8_0": ("Q8_0", "MOSTLY_Q8_0"),
    "q4_0": ("Q4_0", "MOSTLY_Q4_0"),
    "q4_1": ("Q4_1", "MOSTLY_Q4_1"),
}


# Hugging Face Llama names -> llama.cpp's: the reader's llama table (gguf-py tensor_mapping.py, LLAMA entries)
# inverted, so that what is written is what `GGUFCheckpoint` reads back
_TOP = {hf: name for name, hf in GGUF_TENSOR_MAPS["llama"].top.items()}
_BLOCK = {hf: name for name, hf in GGUF_TENSOR_MAPS["llama"].block.items()} | {
    "self_attn.q_norm": "attn_q_norm",  # Qwen3 (gguf-py MODEL_TENSOR.ATTN_Q_NORM)
    "self_attn.k_norm": "attn_k_norm",
}
# GPT-2 (gguf-py tensor_mapping.py, the GPT2 entries); its Conv1D weights are stored [in, out] and written
# transposed, as convert_hf_to_gguf.py's `GPT2Model.modify_tensors` does
_GPT2_TOP = {
    "transformer.wte": "token_embd",
    "transformer.wpe": "position_embd",
    "transformer.ln_f": "output_norm",
    "lm_head": "output",
}
_GPT2_BLOCK = {
    "ln_1": "attn_norm",
    "attn.c_attn": "attn_qkv",
    "attn.c_proj": "attn_output",
    "ln_2": "ffn_norm",
    "mlp.c_fc": "ffn_up",
    "mlp.c_proj": "ffn_down",
}


@dataclass(frozen=True)
class Architecture:
    """How one family is written: llama.cpp's architecture name (general.architecture, the prefix of its keys);
    the rope scaling types the file can hold; the tensor names (`layers` prefix, top-level and per-block tables,
    HF -> llama.cpp); and the block members stored transposed (GPT-2's Conv1D). Which tensors are permuted comes
    from the reader's table for `name` (see `transforms`)."""

    name: str
    rope_scaling: tuple[str | None, ...] = (None, "default", "linear")
    layers: str = "model.layers"
    top: Mapping[str, str] = field(default_factory=lambda: _TOP)
    block: Mapping[str, str] = field(default_factory=lambda: _BLOCK)
    transposed: tuple[str, ...] = ()

    @property
    def transforms(self) -> Mapping[str, str]:
        """llama.cpp tensor name -> the named transform (`GGUF_TRANSFORMS`) the reader undoes, which the export
        applies: the reader's table for llama.cpp's architecture `name` (`GGUF_TENSOR_MAPS`), so the two directions
        agree. llama (LLM_ARCH_LLAMA rotates adjacent pairs) permutes Q and K rows; the others have no table and
        nothing permuted (qwen2 and qwen3 use NEOX rotation, Hugging Face's halves, and are written as they are)."""
        tensor_map = GGUF_TENSOR_MAPS.get(self.name)
        return tensor_map.transforms if tensor_map is not None else {}


# The source's root model (the transformers class) -> how llama.cpp's convert_hf_to_gguf.py writes it: Mistral is
# its `LlamaModel` too (llama.cpp's llama architecture), Qwen2, Qwen3 and GPT-2 their own architectures.
ARCHITECTURES = {
    "LlamaForCausalLM": Architecture("llama", rope_scaling=(None, "default", "linear", "llama3")),
    "MistralForCausalLM": Architecture("llama"),
    "Qwen2ForCausalLM": Architecture("qwen2"),
    "Qwen3ForCausalLM": Architecture("qwen3"),
    # fused projections, written fused (gguf-py: qkv_proj -> attn_qkv, gate_up_proj -> ffn_up, gate rows first as
    # llama.cpp's swiglu splits them); LongRoPE (rope_factors_long/short) is not written yet
    "Phi3ForCausalLM": Architecture(
        "phi3",
        rope_scaling=(None, "default"),
        block=_BLOCK | {"self_attn.qkv_proj": "attn_qkv", "mlp.gate_up_proj": "ffn_up"},
    ),
    "GPT2LMHeadModel": Architecture(
        "gpt2",
        rope_scaling=(),
        layers="transformer.h",
        top=_GPT2_TOP,
        block=_GPT2_BLOCK,
        transposed=("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight"),
    ),
}
# llama.cpp `llama_token_type`: what tokenizer.ggml.token_type holds per token
_NORMAL, _CONTROL, _USER_DEFINED, _UNUSED = 1, 3, 4, 5


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor as written: its llama.cpp name, its values (f32, in llama.cpp's layout) and its ggml type."""

    name: str
    data: np.ndarray
    ggml_type: str


def export_gguf(model: Any, out_path: str | os.PathLike[str], file_type: str = "f32") -> Path:
    """Write `model` (a `LoadedModel` of any backend; its current parameters) as the GGUF file `out_path`.

    Args:
        model: what `linnet.torch.load` / `linnet.jax.load` / `linnet.onnx.load` return.
        out_path: the .gguf file to write; an existing file is replaced (atomically, at the end).
        file_type: "f32", "f16", "bf16", "q8_0", "q4_0" or "q4_1" (the 2-D weights; see the module docstring).

    Returns the path written.
    Raises ExportError for a family llama.cpp has no architecture for here (naming the supported ones), a config
    the format cannot express (a rope type llama.cpp does not read for it, rope_interleaved, an activation other
    than silu), a tokenizer GGUF cannot hold (naming its pre-tokenizer), a weight that holds NaN or Inf or would be
    written as Inf or NaN in its type (f16 beyond 65504, a q8_0 block scale beyond f16's range; export/values.py),
    or a bad `file_type`; OSError when the file cannot be written. Nothing is left on disk after an error.
    """
    if file_type not in FILE_TYPES:
        raise ExportError(f"GGUF type must be one of {', '.join(FILE_TYPES)}, got {file_type!r}")
    program = model.program
    if program is None:
        raise ExportError(f"the {model.backend} model has no program (an artifact loaded without its source)")
    arch = check_family(program.model)
    config = dict(program.config)
    metadata = gpt2_metadata(config) if arch.name == "gpt2" else llama_metadata(config, program.model)
    tokenizer = model.tokenizer()
    vocab_size = int(config["vocab_size"])
    tok_metadata = tokenizer_metadata(tokenizer, vocab_size) if tokenizer is not None else {}
    pad_id = _pad_token_id(model, config)
    if tok_metadata and pad_id is not None:
        tok_metadata["tokenizer.ggml.padding_token_id"] = pad_id
    tensors = gguf_tensors(model_weights(model), config, file_type, arch)
    target = Path(out_path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        _write(tmp, arch.name, file_type, _model_name(model), metadata, tok_metadata, tensors)
        umask = os.umask(0)
        os.umask(umask)
        tmp.chmod(0o666 & ~umask)  # mkstemp's 0600 -> what open() would have created
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return target


def check_family(architecture: str) -> Architecture:
    """llama.cpp's architecture for a source whose root model is `architecture`. Raises ExportError naming it and
    the supported families when Linnet's GGUF export has none for it."""
    arch = ARCHITECTURES.get(architecture)
    if arch is None:
        raise ExportError(
            f"{architecture} has no GGUF architecture in Linnet's export (supported: "
            f"{', '.join(f'{k} as {v.name}' for k, v in ARCHITECTURES.items())})"
        )
    return arch


def check_target(out_path: str | os.PathLike[str], replace: bool = False) -> Path:
    """`out_path` as a Path when the CLI may write the GGUF file there: not empty, not a folder, in a folder that
    exists, and not an existing file unless `replace` (`--force`). Raises ExportError otherwise, before any
    weights are read."""
    if not str(out_path):
        raise ExportError("the output path is empty: give -o OUT.gguf")
    target = Path(out_path)
    if target.is_dir():
        raise ExportError(f"{target}: is a folder; give the path of the .gguf file to write")
    if not target.parent.is_dir():
        raise ExportError(f"{target.parent}: no such folder to write {target.name} into")
    if target.exists() and not replace:
        raise ExportError(f"{target}: already exists; remove it, pick another path, or give --force to replace it")
    return target


def _model_name(model: Any) -> str:
    """general.name: the checkpoint's name (a folder's or file's, or the embedded id), else the source's model.
    llama.cpp reads it: a name with "phi3" in it turns on Phi-3's special-token handling, as for the original."""
    weights = getattr(model, "weights", None)
    return Path(weights).name.removesuffix(".gguf") if weights else model.program.model


def _pad_token_id(model: Any, config: dict[str, Any]) -> int | None:
    """The pad id of the model's config, else of the checkpoint it was loaded from (GGUF's padding_token_id)."""
    checkpoint = getattr(getattr(model, "prepared", None), "checkpoint", None)
    for source in (config, getattr(checkpoint, "config", None) or {}):
        pad = source.get("pad_token_id")
        if isinstance(pad, int) and not isinstance(pad, bool):
            return pad
    return None


def llama_metadata(config: dict[str, Any], family: str) -> dict[str, Any]:
    """The `{arch}.*` keys of `config` (Hugging Face field names) for `family` (a key of ARCHITECTURES), as
    `LlamaModel.set_gguf_parameters` writes them (key -> value; ints are written as uint32, floats as float32).
    A Mistral or Phi-3 sliding window shorter than the context becomes the context length: llama.cpp's llama and
    phi3 (whose sliding window it switches off) attend over the whole cache, which equals the window up to that
    length. Phi-3 rotates `rotary_dim` dims (`rope.dimension_count`). Raises ExportError for a config the
    architecture cannot express, naming the field."""
    arch = ARCHITECTURES[family]
    act = config.get("hidden_act", "silu")
    if act != "silu":
        raise ExportError(f"{family}: hidden_act {act!r} cannot be written to GGUF (llama.cpp's llama runs silu)")
    if config.get("rope_interleaved"):
        raise ExportError(f"{family}: rope_interleaved = true is not exported to GGUF (written: the halves layout)")
    heads = int(config["num_attention_heads"])
    head_dim = int(config.get("head_dim") or config["hidden_size"] // heads)
    md: dict[str, Any] = {
        "vocab_size": int(config["vocab_size"]),
        "context_length": int(config["max_position_embeddings"]),
        "embedding_length": int(config["hidden_size"]),
        "feed_forward_length": int(config["intermediate_size"]),
        "block_count": int(config["num_hidden_layers"]),
        "attention.head_count": heads,
        "attention.head_count_kv": int(config.get("num_key_value_heads") or heads),
        "rope.freq_base": float(config.get("rope_theta", 10000.0)),
        "attention.layer_norm_rms_epsilon": float(config["rms_norm_eps"]),
        "rope.dimension_count": int(config.get("rotary_dim") or head_dim),
        "attention.key_length": head_dim,
        "attention.value_length": head_dim,
    }
    scaling = config.get("rope_scaling") or {}
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind not in arch.rope_scaling:
        written = ", ".join(str(k or "none") for k in arch.rope_scaling)
        raise ExportError(
            f"{family}: rope_scaling rope_type {kind!r} has no GGUF form in Linnet's export (llama.cpp's "
            f"{arch.name} architecture is written with rope_type {written})"
        )
    window = config.get("sliding_window")
    if config.get("use_sliding_window"):
        raise ExportError(f"{family}: use_sliding_window = true has no GGUF form for llama.cpp's {arch.name}")
    if family in ("MistralForCausalLM", "Phi3ForCausalLM") and isinstance(window, int):
        md["context_length"] = min(window, md["context_length"])
    if family == "MistralForCausalLM" and isinstance(window, int):
        # llama.cpp's llama architecture ignores this key; Linnet's reader maps it to `sliding_window`, so the file
        # loads exactly in examples/mistral.linnet and is refused (L503) by a source without a window, instead of
        # running as plain causal attention past `context_length`
        md["attention.sliding_window"] = int(window)
    if family == "Phi3ForCausalLM":  # Phi3MiniModel.set_gguf_parameters writes both
        md["attention.sliding_window"] = 0
        md["rope.scaling.original_context_length"] = int(config.get("original_max_position_embeddings") or 0)
    if kind == "linear" and float(scaling.get("factor", 1.0)) != 1.0:
        md["rope.scaling.type"] = "linear"
        md["rope.scaling.factor"] = float(scaling["factor"])
    return md


def gpt2_metadata(config: dict[str, Any]) -> dict[str, Any]:
    """The `gpt2.*` keys of a GPT-2 `config`, as convert_hf_to_gguf.py's `GPT2Model.set_gguf_parameters` writes
    them. Raises ExportError for a config llama.cpp's gpt2 does not compute (an activation other than gelu_new,
    attention scaled by layer index)."""
    act = config.get("activation_function", "gelu_new")
    if act not in ("gelu_new", "gelu_pytorch_tanh"):
        raise ExportError(f"GPT2LMHeadModel: activation_function {act!r} cannot be written to GGUF (llama.cpp's gpt2 "
                          "runs the tanh GELU, gelu_new)")  # fmt: skip
    for key in ("scale_attn_by_inverse_layer_idx", "add_cross_attention"):
        if config.get(key):
            raise ExportError(f"GPT2LMHeadModel: {key} = true cannot be written to GGUF (llama.cpp's gpt2 has none)")
    if config.get("scale_attn_weights") is False:
        raise ExportError("GPT2LMHeadModel: scale_attn_weights = false cannot be written to GGUF")
    return {
        "vocab_size": int(config["vocab_size"]),
        "context_length": int(config["n_positions"]),
        "embedding_length": int(config["n_embd"]),
        "feed_forward_length": int(config.get("n_inner") or 4 * config["n_embd"]),
        "block_count": int(config["n_layer"]),
        "attention.head_count": int(config["n_head"]),
        "attention.layer_norm_epsilon": float(config["layer_norm_epsilon"]),
    }


def rope_freqs(config: dict[str, Any]) -> np.ndarray | None:
    """`rope_freqs.weight` (f32[head_dim / 2]) for a llama3 `rope_scaling`, else None: per frequency the divisor
    llama.cpp applies (`LlamaModel.generate_extra_tensors`; see `gguf_rope`)."""
    scaling = config.get("rope_scaling") or {}
    if scaling.get("rope_type", scaling.get("type")) != "llama3":
        return None
    head_dim = int(config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"])
    inv_freq = default_inv_freq(float(config.get("rope_theta", 10000.0)), head_dim)
    return llama3_rope_freqs(inv_freq, scaling).astype(np.float32)


def llamacpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py `LlamaModel.permute`: rows of head h from Hugging Face's two rotary halves
    to llama.cpp's interleaved pairs, `w.reshape(n_head, 2, d/2, ...).swapaxes(1, 2)`. n_head is
    num_attention_heads for Q and num_key_value_heads for K. Inverse: `formats.gguf._unpermute_rows`, what the
    reader's transforms unpermute_rope_q and unpermute_rope_k do."""
    if w.shape[0] % (2 * n_head):
        raise ExportError(f"a Q/K projection with {w.shape[0]} rows is not {n_head} heads of an even size")
    half = w.shape[0] // n_head // 2
    return np.ascontiguousarray(w.reshape(n_head, 2, half, *w.shape[1:]).swapaxes(1, 2)).reshape(w.shape)


def gguf_name(hf_name: str, arch: Architecture = ARCHITECTURES["LlamaForCausalLM"]) -> str | None:
    """The llama.cpp name of a Hugging Face tensor name of `arch` (`model.layers.3.self_attn.k_proj.weight` ->
    `blk.3.attn_k.weight`), or None for a name the architecture has no tensor for."""
    found = _gguf_name_and_base(hf_name, arch)
    return found[0] if found is not None else None


def _gguf_name_and_base(hf_name: str, arch: Architecture) -> tuple[str, str] | None:
    """`gguf_name`, with the llama.cpp name of the table entry it matched (`attn_k`), the key of `arch.transforms`."""
    stem, _, suffix = hf_name.rpartition(".")
    if stem in arch.top:
        return f"{arch.top[stem]}.{suffix}", arch.top[stem]
    prefix = arch.layers + "."
    layer, _, member = stem[len(prefix) :].partition(".") if stem.startswith(prefix) else ("", "", "")
    base = arch.block.get(member)
    return (f"blk.{int(layer)}.{base}.{suffix}", base) if layer.isdigit() and base else None


def gguf_tensors(
    weights: dict[str, np.ndarray], config: dict[str, Any], file_type: str, arch: Architecture
) -> list[GGUFTensor]:
    """The tensors of a model's `weights` ({Hugging Face name: array}) as llama.cpp's `arch` lays them out, each
    with its ggml type for `file_type` (see the module docstring): Q/K rows permuted where `arch.transforms`
    names a rotary un-permutation (the reader undoes it), Conv1D weights transposed. A tied head is not written
    (llama.cpp reuses `token_embd.weight`). Raises ExportError naming a weight the architecture has no tensor for."""
    heads = config.get("num_attention_heads")
    tied = bool(config.get("tie_word_embeddings"))
    out: list[GGUFTensor] = []
    for hf_name, array in weights.items():
        if hf_name == "lm_head.weight" and tied:
            continue
        found = _gguf_name_and_base(hf_name, arch)
        if found is None:
            raise ExportError(f"weight {hf_name!r} has no tensor in llama.cpp's {arch.name} architecture")
        name, base = found
        data = np.asarray(cast_floating(array, "f32"), dtype=np.float32)
        transform = arch.transforms.get(base)
        if transform is not None:  # unpermute_rope_q / _k: the head count of GGUF_TRANSFORMS, else the query heads
            data = llamacpp_permute(data, int(config.get(GGUF_TRANSFORMS[transform]) or heads))
        elif hf_name.endswith(arch.transposed) and arch.transposed:
            data = np.ascontiguousarray(data.T)
        is_output = name == "output.weight" or (tied and name == "token_embd.weight")
        ggml_type = _tensor_type(data, file_type, is_output, name == "position_embd.weight")
        check_exportable(data, f"{hf_name} ({name})", ggml_type.lower(), lambda a, t=ggml_type: _read_back(a, t))
        out.append(GGUFTensor(name, data, ggml_type))
    freqs = rope_freqs(config)
    if freqs is not None:
        out.append(GGUFTensor("rope_freqs.weight", freqs, "F32"))
    return out


def _tensor_type(data: np.ndarray, file_type: str, is_output: bool, is_position: bool = False) -> str:
    """The ggml type of one tensor in a `file_type` file: 1-D stays F32; a quantized type whose block does not
    divide the row falls back to F16 (convert_hf_to_gguf.py); the output projection of a q4 file is Q8_0."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    want = FILE_TYPES[file_type][0]
    if data.ndim < 2 or is_position:  # convert_hf_to_gguf.py keeps position embeddings f32 too
        return "F32"
    if is_output and want in ("Q4_0", "Q4_1"):
        want = "Q8_0"
    block = GGML_QUANT_SIZES[GGMLQuantizationType[want]][0]
    return want if data.shape[-1] % block == 0 else "F16"


def _read_back(data: np.ndarray, ggml_type: str) -> np.ndarray:
    """`data` (f32) as a reader of the file gets it back once written as `ggml_type` (gguf.quants' ggml port)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize, quantize

    if ggml_type == "F32":
        return data
    if ggml_type == "F16":
        return data.astype(np.float16).astype(np.float32)
    qtype = GGMLQuantizationType[ggml_type]
    return dequantize(quantize(data, qtype), qtype)


def tokenizer_metadata(tokenizer: Tokenizer, vocab_size: int) -> dict[str, Any]:
    """`tokenizer.ggml.*` and `tokenizer.chat_template` for a byte-level BPE `tokenizer` (key -> value), as
    convert_hf_to_gguf.py's `_set_vocab_gpt2` writes them: every id's token (ids past the tokenizer up to the
    model's `vocab_size` as `[PAD{id}]`, type unused), token types (special added tokens control, other added
    tokens user-defined), merges as "left right", the `tokenizer.ggml.pre` whose splitting equals the tokenizer's
    (`GGUF_PRE_TOKENIZERS`, read back by `Tokenizer.from_gguf`), special ids, add_bos/add_eos as it behaves.

    Raises ExportError for a tokenizer that is not byte-level BPE (SentencePiece, WordPiece), one whose
    pre-tokenizer matches no type llama.cpp knows (naming it), or more tokens than the model has rows."""
    state = json.loads(tokenizer.backend.to_str())
    bpe = state.get("model") or {}
    if bpe.get("type") != "BPE" or bpe.get("byte_fallback") or (state.get("decoder") or {}).get("type") != "ByteLevel":
        raise ExportError(
            f"{tokenizer.source}: only byte-level BPE tokenizers are written to GGUF (tokenizer.ggml.model gpt2); "
            f"this one is {bpe.get('type')} with a {(state.get('decoder') or {}).get('type')} decoder"
        )
    pre = _pre_type(state, bool(bpe.get("ignore_merges")), tokenizer.source)
    n_tokens = tokenizer.vocab_size
    if n_tokens > vocab_size:
        raise ExportError(f"{tokenizer.source}: the tokenizer has {n_tokens} tokens, the model only {vocab_size} rows")
    added = tokenizer.backend.get_added_tokens_decoder()
    tokens, types = [], []
    for token_id in range(vocab_size):
        text = tokenizer.id_to_token(token_id) if token_id < n_tokens else None
        if text is None:
            tokens.append(f"[PAD{token_id}]")
            types.append(_UNUSED)
        else:
            tokens.append(text)
            types.append(_NORMAL if token_id not in added else _CONTROL if added[token_id].special else _USER_DEFINED)
    merges = [m if isinstance(m, str) else " ".join(m) for m in bpe.get("merges", [])]
    probe = tokenizer.backend.encode("a", add_special_tokens=True).ids
    md: dict[str, Any] = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.add_bos_token": tokenizer.add_bos_token,
        "tokenizer.ggml.add_eos_token": bool(
            tokenizer.eos_token_id is not None and probe and probe[-1] == tokenizer.eos_token_id
        ),
    }
    for key, token_id in (("bos_token_id", tokenizer.bos_token_id), ("eos_token_id", tokenizer.eos_token_id)):
        if token_id is not None:
            md[f"tokenizer.ggml.{key}"] = token_id
    if tokenizer.chat_template:
        md["tokenizer.chat_template"] = tokenizer.chat_template
    return md


# pre-tokenizer JSON fields that change ids (`trim_offsets` only moves offsets)
_PRE_FIELDS = ("type", "pattern", "behavior", "invert", "individual_digits", "add_prefix_space", "use_regex")


def _pre_type(state: dict[str, Any], ignore_merges: bool, where: str) -> str:
    """The first `tokenizer.ggml.pre` of `GGUF_PRE_TOKENIZERS` (their canonical names come first) whose normalizer,
    pre-tokenizer and ignore_merges are the tokenizer's (`state`: tokenizer.json as a dict). Raises ExportError
    naming the pre-tokenizer when none is: a guessed type changes ids silently (llama.cpp #7881)."""
    mine = (_canonical(state.get("normalizer")), _canonical(state.get("pre_tokenizer")), ignore_merges)
    for name, kind in GGUF_PRE_TOKENIZERS.items():
        normalizer = {"type": "NFC"} if kind.nfc else None
        theirs = (_canonical(normalizer), _canonical(json.loads(kind.pre_tokenizer().__getstate__())))
        if mine == (*theirs, kind.ignore_merges):
            return name
    raise ExportError(
        f"{where}: the tokenizer's normalizer {json.dumps(state.get('normalizer'))} and pre-tokenizer "
        f"{json.dumps(state.get('pre_tokenizer'))} (ignore_merges {ignore_merges}) match no tokenizer.ggml.pre "
        f"Linnet writes ({', '.join(GGUF_PRE_TOKENIZERS)})"
    )


def _canonical(node: Any) -> Any:
    """A normalizer / pre-tokenizer JSON node with only the fields that change ids; a one-step Sequence is its
    step."""
    if not isinstance(node, dict):
        return node
    steps = node.get("pretokenizers") or node.get("normalizers")
    if node.get("type") == "Sequence" and isinstance(steps, list):
        return _canonical(steps[0]) if len(steps) == 1 else [_canonical(s) for s in steps]
    return {k: node[k] for k in _PRE_FIELDS if k in node}


def _write(
    path: Path,
    arch: str,
    file_type: str,
    name: str | None,
    metadata: dict[str, Any],
    tok_metadata: dict[str, Any],
    tensors: list[GGUFTensor],
) -> None:
    """Write the GGUF file at `path` with the `gguf` package's writer, quantizing each tensor to its type."""
    import gguf
    from gguf.quants import quantize

    writer = gguf.GGUFWriter(str(path), arch)
    try:
        if name:
            writer.add_name(name)
        writer.add_file_type(int(gguf.LlamaFileType[FILE_TYPES[file_type][1]]))
        if file_type.startswith("q"):
            writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
        for key, value in metadata.items():
            _add(writer, f"{arch}.{key}", value)
        for key, value in tok_metadata.items():
            _add(writer, key, value)
        for t in tensors:
            qtype = gguf.GGMLQuantizationType[t.ggml_type]
            if t.ggml_type == "F32":
                writer.add_tensor(t.name, t.data)
            elif t.ggml_type == "F16":
                writer.add_tensor(t.name, t.data.astype(np.float16))
            else:  # (a denormal block's 1 / scale overflows in ggml's quantizer as here: its f16 scale is 0)
                with np.errstate(over="ignore", invalid="ignore"):
                    writer.add_tensor(t.name, quantize(t.data, qtype), raw_dtype=qtype)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    finally:
        writer.close()


def _add(writer: Any, key: str, value: Any) -> None:
    """One metadata pair, typed as llama.cpp reads it: bool, uint32, float32, string, or an array of one."""
    if isinstance(value, bool):
        writer.add_bool(key, value)
    elif isinstance(value, int):
        writer.add_uint32(key, value)
    elif isinstance(value, float):
        writer.add_float32(key, value)
    elif isinstance(value, list):
        writer.add_array(key, value)  # ints as int32 (token types), strings as strings
    else:
        writer.add_string(key, value)
