"""GGUF files as checkpoints: the metadata as config.json fields, llama.cpp's tensor names as Hugging Face's,
and llama.cpp's rotary row permutation undone. Open one with `checkpoints.open_checkpoint`.

The file itself (metadata, tensor table, memory-mapped data) is read by `gguf_reader`; quantized tensors are
dequantized by `gguf.quants`, or kept as stored (`gguf_quants`); Llama 3's rope scaling is recovered from the
tensor `rope_freqs.weight` by `gguf_rope`. GGUF files are read strictly: every metadata key is read, known to
leave the computation unchanged, or refused by name.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from linnet.errors import CheckpointError
from linnet.runtimes.formats.checkpoints import Checkpoint, cast_floating, check_finite, numpy_dtype
from linnet.runtimes.formats.gguf_quants import STORED, GroupQuantized, group_quantized
from linnet.runtimes.formats.gguf_reader import GGUFError, GGUFFile
from linnet.runtimes.formats.gguf_rope import llama3_scaling_from_rope_freqs
from linnet.runtimes.formats.tokenizer import Tokenizer

__all__ = [
    "GGUFCheckpoint",
    "GGUFTensorMap",
    "GGUF_TENSOR_MAPS",
    "GGUF_TRANSFORMS",
    "GGUF_KEYS_WITHOUT_EFFECT",
    "GGUF_KEYS_NEUTRAL_VALUE",
]

# The named transforms a `GGUFTensorMap` may give a tensor: what the reader does to it, going from llama.cpp's
# layout to Hugging Face's, with the config field of the head count it takes. The export (`export/gguf.py`) applies
# the inverse, llama.cpp convert_hf_to_gguf.py's `LlamaModel.permute` (see `_unpermute_rows`).
GGUF_TRANSFORMS = {
    "unpermute_rope_q": "num_attention_heads",  # Q rows: interleaved rotary pairs -> the two halves, per query head
    "unpermute_rope_k": "num_key_value_heads",  # K rows: the same, per key/value head
}


@dataclass(frozen=True)
class GGUFTensorMap:
    """The tensors of one llama.cpp architecture (`general.architecture`) under Hugging Face's names, read from
    llama.cpp gguf-py/gguf/tensor_mapping.py backwards. Names are without their `.weight`/`.bias` suffix.

    Fields:
        top: llama.cpp name of a tensor outside the blocks -> Hugging Face name (`output_norm` -> `model.norm`).
        block: llama.cpp name of a block member (`blk.N.<name>`) -> Hugging Face member of `model.layers.N`.
        transforms: llama.cpp name (of `top` or `block`) -> the named transform (`GGUF_TRANSFORMS`) that turns
            its tensors into Hugging Face's layout; tensors not listed are read as stored.
        buffers: full tensor names kept under their GGUF names, as buffers.
    """

    top: Mapping[str, str]
    block: Mapping[str, str]
    transforms: Mapping[str, str] = field(default_factory=dict)
    buffers: frozenset[str] = frozenset()


# general.architecture -> its tensors. Every architecture read is listed; others are refused.
GGUF_TENSOR_MAPS = {
    "llama": GGUFTensorMap(
        top={"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"},
        block={
            "attn_q": "self_attn.q_proj",
            "attn_k": "self_attn.k_proj",
            "attn_v": "self_attn.v_proj",
            "attn_output": "self_attn.o_proj",
            "ffn_gate": "mlp.gate_proj",
            "ffn_up": "mlp.up_proj",
            "ffn_down": "mlp.down_proj",
            "attn_norm": "input_layernorm",
            "ffn_norm": "post_attention_layernorm",
        },
        # LLM_ARCH_LLAMA rotates adjacent pairs: convert_hf_to_gguf.py's LlamaModel permuted Q and K rows
        transforms={"attn_q": "unpermute_rope_q", "attn_k": "unpermute_rope_k"},
        # llama.cpp's precomputed Llama 3 rope frequency factors (see `gguf_rope`)
        buffers=frozenset({"rope_freqs.weight"}),
    ),
}
# Qwen3 (LLM_ARCH_QWEN3): Llama's tensors plus an RMSNorm per query and key head (gguf-py MODEL_TENSOR.ATTN_Q_NORM,
# ATTN_K_NORM). Its rotation is NEOX's, Hugging Face's halves, so convert_hf_to_gguf.py's `Qwen3Model` writes Q and K
# rows as they are: nothing to undo (what `linnet export gguf` writes for Qwen3ForCausalLM, read back).
GGUF_TENSOR_MAPS["qwen3"] = GGUFTensorMap(
    top=GGUF_TENSOR_MAPS["llama"].top,
    block={**GGUF_TENSOR_MAPS["llama"].block, "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"},
)
_GGUF_NAME = re.compile(r"^(?:blk\.(\d+)\.)?(\w+)\.(weight|bias)$")

# `{arch}.<key>` -> config.json field (transformers' GGUF_CONFIG_MAPPING for llama). head_dim, vocab_size and rope
# scaling are read by `_gguf_config` itself, with the checks they need.
_GGUF_CONFIG = {
    "context_length": "max_position_embeddings",
    "embedding_length": "hidden_size",
    "feed_forward_length": "intermediate_size",
    "block_count": "num_hidden_layers",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "rope.freq_base": "rope_theta",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps",
    "attention.sliding_window": "sliding_window",  # what Linnet's export writes for Mistral (export_gguf.py)
}
_GGUF_READ = {
    "vocab_size",
    "attention.key_length",
    "attention.value_length",
    "rope.dimension_count",
    "rope.scaling.type",
    "rope.scaling.factor",
    "rope.scale_linear",
}
# `{arch}.<key>`s that do not change what the model computes, and why. Every other `{arch}.*` key is refused:
# a key nobody reads may change the maths (llama.cpp reads it, we would not).
GGUF_KEYS_WITHOUT_EFFECT = {
    "rope.scaling.original_context_length": "read by YaRN only; linear scaling does not use it",
    "rope.scaling.finetuned": "records whether the model was fine-tuned at the scaled length",
    "rope.scaling.yarn_log_multiplier": "read by YaRN only (refused)",
    "rope.scaling.yarn_ext_factor": "read by YaRN only (refused)",
    "rope.scaling.yarn_beta_fast": "read by YaRN only (refused)",
    "rope.scaling.yarn_beta_slow": "read by YaRN only (refused)",
}
# `{arch}.<key>`s accepted only with the one value that leaves the computation unchanged.
GGUF_KEYS_NEUTRAL_VALUE = {
    "rope.scaling.attn_factor": 1.0,  # llama.cpp multiplies cos and sin by it
    "expert_count": 0,  # a dense model; Mixture-of-Experts GGUFs are not read
    "expert_used_count": 0,
}
# Namespaces outside `{arch}.`: general.* is provenance (name, license, file type; general.alignment is read by
# the reader), tokenizer.* is read by `Tokenizer.from_gguf`, quantize.* records llama-quantize's importance
# matrix, split.* describes a model split over files (refused unless split.count is 1).
_GGUF_OTHER_NAMESPACES = ("general.", "tokenizer.", "quantize.", "split.")


def _gguf_hf_name(name: str, tensors: GGUFTensorMap) -> tuple[str, str | None] | None:
    """The Hugging Face name of a GGUF tensor name under `tensors`, with the named transform (`GGUF_TRANSFORMS`)
    its entry lists (None: read as stored); None if the architecture has no such tensor."""
    if name in tensors.buffers:
        return name, None
    m = _GGUF_NAME.match(name)
    if m is None:
        return None
    block, base, suffix = m.groups()
    if block is None:
        hf = f"{tensors.top[base]}.{suffix}" if base in tensors.top else None
    else:
        hf = f"model.layers.{int(block)}.{tensors.block[base]}.{suffix}" if base in tensors.block else None
    return None if hf is None else (hf, tensors.transforms.get(base))


def _gguf_config(f: GGUFFile, arch: str) -> dict[str, Any]:
    """config.json fields from GGUF metadata.

    Read: the `{arch}.*` keys of `_GGUF_CONFIG`; head_dim from `attention.key_length`, else
    `rope.dimension_count` (both, and `attention.value_length`, must agree: the source rotates and attends over
    the whole head); vocab_size from the token list (`{arch}.vocab_size` must agree); tie_word_embeddings = no
    `output.weight`; attention_bias / mlp_bias = the file has attention / feed-forward biases; model_type = arch;
    bos/eos/pad ids; rope_scaling from `rope.scaling.type` ("none", or "linear" with `rope.scaling.factor` or the
    older `rope.scale_linear`; llama.cpp's default type is linear) and from the tensor `rope_freqs.weight`
    (llama3, see `gguf_rope`). Values are type-checked (`_gguf_value`).

    Every metadata key is accounted for (`_check_gguf_keys`). Raises CheckpointError naming the file and the key
    for a key that is neither read nor listed as without effect, a value that contradicts another, a rope
    scaling type other than none/linear, and rope factors no llama3 parameters reproduce.
    """
    md = f.metadata
    _check_gguf_keys(f, arch)

    def key(name: str) -> str:
        return f"{arch}.{name}"

    md = {k: _gguf_value(f, k, arch) for k in md}
    cfg: dict[str, Any] = {"model_type": arch}
    for name, hf in _GGUF_CONFIG.items():
        if key(name) in md:
            cfg[hf] = md[key(name)]
    head_keys = ("attention.key_length", "rope.dimension_count", "attention.value_length")
    dims = {n: md[key(n)] for n in head_keys if key(n) in md}
    if dims:
        head_dim = next(iter(dims.values()))  # in head_keys' order: the key length first
        for n, v in dims.items():
            if v != head_dim:
                raise CheckpointError(
                    f"{f.path}: GGUF metadata {key(n)} = {v} differs from the head size {head_dim}; the source "
                    "attends and rotates over whole heads of one size (partial rotary or other value heads are "
                    "not read from GGUF)"
                )
        cfg["head_dim"] = head_dim
    tokens = md.get("tokenizer.ggml.tokens")
    if isinstance(tokens, list):
        cfg["vocab_size"] = len(tokens)
        if key("vocab_size") in md and md[key("vocab_size")] != len(tokens):
            raise CheckpointError(
                f"{f.path}: GGUF metadata {key('vocab_size')} = {md[key('vocab_size')]} but tokenizer.ggml.tokens "
                f"lists {len(tokens)} tokens"
            )
    elif key("vocab_size") in md:
        cfg["vocab_size"] = md[key("vocab_size")]
    for hf in ("hidden_size", "num_attention_heads", "num_hidden_layers"):
        if hf not in cfg:
            raise CheckpointError(f"{f.path}: GGUF metadata lacks {key(_key_of(hf))}")
    cfg["tie_word_embeddings"] = "output.weight" not in f.tensors
    # llama.cpp loads these biases when the file has them (LLM_ARCH_LLAMA, TENSOR_NOT_REQUIRED); a file with only
    # some of them fails to load with the names missing. Set only when present: a source without the field (Mistral)
    # then reads a file without biases, and one with biases is refused (L503) by a source that cannot take them.
    for hf, suffixes in (
        ("attention_bias", (".attn_q.bias", ".attn_output.bias")),
        ("mlp_bias", (".ffn_gate.bias", ".ffn_down.bias")),
    ):
        if any(n.endswith(suffixes) for n in f.tensors):
            cfg[hf] = True
    cfg["rope_scaling"] = _gguf_rope_scaling(f, arch, cfg)
    for name, hf in (
        ("bos_token_id", "bos_token_id"),
        ("eos_token_id", "eos_token_id"),
        ("padding_token_id", "pad_token_id"),
    ):
        if f"tokenizer.ggml.{name}" in md:
            cfg[hf] = md[f"tokenizer.ggml.{name}"]
    return cfg


# Value types of the `{arch}.*` keys read: a positive int, or a finite float (an f32 widened, as transformers reads
# it: SmolLM2's rms_norm_eps is 9.999999747378752e-06, not 1e-05), or a string.
_GGUF_FLOAT_KEYS = {"rope.freq_base", "attention.layer_norm_rms_epsilon", "rope.scaling.factor", "rope.scale_linear"}
_GGUF_STRING_KEYS = {"rope.scaling.type"}


def _gguf_value(f: GGUFFile, k: str, arch: str) -> Any:
    """Metadata value `k`, checked against the type the reader expects for the `{arch}.*` keys it reads. A
    per-layer array (llama.cpp allows one for head counts and feed-forward sizes) is read when every layer has the
    same value. Raises CheckpointError naming the key and the file otherwise."""
    v = f.metadata[k]
    name = k[len(arch) + 1 :] if k.startswith(f"{arch}.") else None
    if name not in _GGUF_CONFIG and name not in _GGUF_READ:
        return v
    if isinstance(v, list) and v and all(x == v[0] for x in v) and name not in _GGUF_STRING_KEYS:
        v = v[0]
    if name in _GGUF_STRING_KEYS:
        ok, expected = isinstance(v, str), "a string"
    elif name in _GGUF_FLOAT_KEYS:
        ok, expected = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v), "a finite number"
        v = float(v) if ok else v
    else:
        ok = isinstance(v, int) and not isinstance(v, bool) and v >= 1
        expected = "a positive integer (the same for every layer)"
    if not ok:
        shown = f"a list of {len(v)} values" if isinstance(v, list) else repr(v)
        raise CheckpointError(f"{f.path}: GGUF metadata {k} is {shown}, expected {expected}")
    return v


def _check_gguf_keys(f: GGUFFile, arch: str) -> None:
    """Refuse any metadata key that is neither read nor known to leave the computation unchanged (the lists
    above `_gguf_hf_name`), naming the key, its value and the file."""
    prefix = f"{arch}."
    for k, v in f.metadata.items():
        if k.startswith(prefix):
            name = k[len(prefix) :]
            if name in _GGUF_CONFIG or name in _GGUF_READ or name in GGUF_KEYS_WITHOUT_EFFECT:
                continue
            if name in GGUF_KEYS_NEUTRAL_VALUE:
                if v == GGUF_KEYS_NEUTRAL_VALUE[name]:
                    continue
                raise CheckpointError(
                    f"{f.path}: GGUF metadata {k} = {v!r} changes the computation and is not supported (Linnet "
                    f"reads {arch} files with {k} = {GGUF_KEYS_NEUTRAL_VALUE[name]!r} or without it)"
                )
        elif k.startswith(_GGUF_OTHER_NAMESPACES):
            if k == "split.count" and v not in (0, 1):
                raise CheckpointError(
                    f"{f.path}: GGUF metadata split.count = {v!r}: the model is split over several files; merge "
                    "them first (llama-gguf-split --merge)"
                )
            continue
        shown = repr(v) if not isinstance(v, list) else f"a list of {len(v)}"
        raise CheckpointError(
            f"{f.path}: GGUF metadata key {k!r} ({shown}) is not read by Linnet and may change the computation; "
            f"the {arch} keys read are {', '.join(prefix + n for n in sorted({*_GGUF_CONFIG, *_GGUF_READ}))}, "
            f"and these are known to have no effect: {', '.join(prefix + n for n in sorted(GGUF_KEYS_WITHOUT_EFFECT))}"
        )


def _gguf_rope_scaling(f: GGUFFile, arch: str, cfg: dict[str, Any]) -> dict[str, Any] | None:
    """rope_scaling from `{arch}.rope.scaling.*` / `rope.scale_linear` and the tensor `rope_freqs.weight`.

    llama.cpp (llama-model.cpp) takes the scaling type from `rope.scaling.type`, linear when absent, and the
    factor from `rope.scaling.factor`, else `rope.scale_linear`; a factor of 0 or 1 scales nothing. Llama 3.x
    files carry their llama3 scaling only as `rope_freqs.weight` (see `gguf_rope`)."""
    md = {k: _gguf_value(f, k, arch) for k in f.metadata if k.startswith(f"{arch}.rope.")}
    kind = md.get(f"{arch}.rope.scaling.type", "linear")
    factor = md.get(f"{arch}.rope.scaling.factor", md.get(f"{arch}.rope.scale_linear"))
    if kind not in ("none", "linear"):
        raise CheckpointError(
            f"{f.path}: GGUF metadata {arch}.rope.scaling.type = {kind!r} is not supported (Linnet reads 'none' "
            "and 'linear'; Llama 3's llama3 scaling comes from the tensor rope_freqs.weight)"
        )
    scaling = None
    if kind == "linear" and factor not in (None, 0, 1):
        scaling = {"rope_type": "linear", "factor": float(factor)}
    if "rope_freqs.weight" not in f.tensors:
        return scaling
    if scaling is not None:
        raise CheckpointError(
            f"{f.path}: both linear rope scaling ({arch}.rope.scaling.factor {factor}) and per-frequency factors "
            "(tensor rope_freqs.weight); Linnet reads one or the other"
        )
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // max(1, cfg["num_attention_heads"])
    info = f.tensors["rope_freqs.weight"]
    if info.type_name not in ("f32", "f16"):
        raise CheckpointError(f"{f.path}: tensor 'rope_freqs.weight' is {info.type_name}, expected f32")
    stored = np.array(f.raw(info.name), dtype=np.float32)  # a copy: the mapping may close on error
    theta = cfg.get("rope_theta", 10000.0)  # llama.cpp's and the source's default
    return llama3_scaling_from_rope_freqs(stored, rope_theta=theta, head_dim=head_dim, where=str(f.path))


def _unpermute_rows(t: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's rotary permutation of Q/K projection rows (weights or biases).

    llama.cpp convert_hf_to_gguf.py `LlamaModel.permute` writes rows of head h as
    `w.reshape(n_head, 2, d/2, ...).swapaxes(1, 2)` (interleaved rotary pairs, GPT-J style); Hugging Face's
    `rotate_half` wants the two halves apart. Inverse: `reshape(n_head, d/2, 2, ...).swapaxes(1, 2)`, the same as
    transformers' `LlamaTensorProcessor._reverse_permute_weights`. Use num_attention_heads for Q and
    num_key_value_heads for K.
    """
    rows = t.shape[0]
    half = rows // n_head // 2
    return np.ascontiguousarray(t.reshape(n_head, half, 2, *t.shape[1:]).swapaxes(1, 2)).reshape(t.shape)


@dataclass(eq=False)
class GGUFCheckpoint(Checkpoint):
    """A .gguf file of an architecture `GGUF_TENSOR_MAPS` lists (llama, qwen3), read through `GGUFFile`."""

    _file: GGUFFile | None = field(default=None, repr=False)
    _gguf_name: dict[str, str] = field(default_factory=dict, repr=False)
    _transforms: dict[str, str] = field(default_factory=dict, repr=False)  # Hugging Face name -> GGUF_TRANSFORMS
    _tokenizer: Any = field(default=None, repr=False)

    @classmethod
    def open(cls, path: Path, source: str) -> GGUFCheckpoint:
        try:
            f = GGUFFile(path)
        except GGUFError as e:
            raise CheckpointError(f"{e}") from None
        except OSError as e:
            raise CheckpointError(f"{path}: cannot read ({e.strerror or e})") from None
        try:
            arch = f.get("general.architecture")
            if arch not in GGUF_TENSOR_MAPS:
                raise CheckpointError(
                    f"{path}: GGUF architecture {arch!r} is not supported "
                    f"(supported: {', '.join(sorted(GGUF_TENSOR_MAPS))})"
                )
            hf_to_gguf: dict[str, str] = {}
            transforms: dict[str, str] = {}
            for gname in f.tensors:
                found = _gguf_hf_name(gname, GGUF_TENSOR_MAPS[arch])
                if found is None:
                    raise CheckpointError(f"{path}: unknown GGUF tensor {gname!r} (no Hugging Face name for it)")
                hf, transform = found
                hf_to_gguf[hf] = gname
                if transform is not None:
                    transforms[hf] = transform
            config = _gguf_config(f, arch)
        except CheckpointError:
            f.close()
            raise
        return cls(
            source=source,
            format="gguf",
            config=config,
            tensor_names=list(hf_to_gguf),
            buffer_names={n for n in hf_to_gguf if n in GGUF_TENSOR_MAPS[arch].buffers},
            path=path,
            _file=f,
            _gguf_name=hf_to_gguf,
            _transforms=transforms,
        )

    def _info(self, name: str):
        gname = self._gguf_name.get(name)
        if gname is None:
            raise self._unknown(name)
        if self._file is None:
            raise CheckpointError(f"{self.source}: checkpoint is closed")
        return self._file.tensors[gname]

    def shape(self, name: str) -> tuple[int, ...]:
        return self._info(name).shape

    def dtype(self, name: str) -> str:
        return self._info(name).type_name

    def load(self, name: str, dtype: str | np.dtype | None = None) -> np.ndarray | GroupQuantized:
        """As `Checkpoint.load`; `dtype="stored"` (`--dtype stored`) keeps the file's values: a quantized matrix
        comes back as a `GroupQuantized` (rows of Q/K un-permuted as whole rows of blocks), any other tensor as
        stored (a read-only view; bf16 as `ml_dtypes.bfloat16`). Raises CheckpointError naming the tensor for a
        quantized type `gguf_quants` cannot keep (see `STORED_TYPES`)."""
        info = self._info(name)
        raw = self._file.raw(info.name)
        if isinstance(dtype, str) and dtype == STORED and info.quantized:
            stored = group_quantized(raw, info.type_name, info.shape, name=f"{self.path}: {info.name!r}")
            heads = self._rotary_heads(name, info)
            return stored if heads is None else stored.take_rows(_unpermute_rows(np.arange(info.shape[0]), heads))
        if isinstance(dtype, str) and dtype == STORED:
            dtype = None
        try:
            if info.quantized:
                from gguf import GGMLQuantizationType
                from gguf.quants import dequantize

                t = np.ascontiguousarray(dequantize(raw, GGMLQuantizationType(info.ggml_type)))
            elif info.type_name == "bf16":
                t = raw.view(numpy_dtype("bf16"))
            else:
                t = raw
        except (NotImplementedError, ValueError) as e:
            raise CheckpointError(f"{self.path}: cannot dequantize {info.name!r} ({info.type_name}): {e}") from None
        if tuple(t.shape) != info.shape:
            raise CheckpointError(f"{self.path}: {info.name!r} decoded to {tuple(t.shape)}, expected {info.shape}")
        heads = self._rotary_heads(name, info)
        if heads is not None:
            t = _unpermute_rows(t, heads)
        return check_finite(cast_floating(t, dtype), info.name, self.path, t, name in self.buffer_names)

    def _rotary_heads(self, name: str, info) -> int | None:
        """The head count whose rotary row permutation llama.cpp applied to `name`, for a tensor whose table entry
        names a transform (`GGUF_TRANSFORMS`: unpermute_rope_q takes num_attention_heads, unpermute_rope_k
        num_key_value_heads, defaulting to the former), or None for a tensor read as stored. Raises
        CheckpointError for metadata that does not fit."""
        transform = self._transforms.get(name)
        if transform is None:
            return None
        heads = self.config["num_attention_heads"]
        heads = self.config.get(GGUF_TRANSFORMS[transform], heads)
        if not isinstance(heads, int) or isinstance(heads, bool) or heads < 1:
            raise CheckpointError(f"{self.path}: the GGUF metadata gives {heads!r} heads for {info.name!r}")
        if info.shape[0] % (2 * heads):
            raise CheckpointError(f"{self.path}: {info.name!r} has {info.shape[0]} rows, not 2 x {heads} heads")
        return heads

    def tokenizer(self) -> Tokenizer | None:
        """The tokenizer of the metadata; None for a file with no `tokenizer.ggml.*` model nor tokens at all
        (a random-init export: generate takes token ids), a TokenizerError naming the file for a partial one."""
        if self._tokenizer is None:
            if self._file is None:
                raise CheckpointError(f"{self.source}: checkpoint is closed")
            if not {"tokenizer.ggml.model", "tokenizer.ggml.tokens"} & set(self._file.metadata):
                return None
            self._tokenizer = Tokenizer.from_gguf(self._file)
        return self._tokenizer

    def release_pages(self) -> None:
        if self._file is not None:
            self._file.release_pages()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _key_of(hf: str) -> str:
    return next(k for k, v in _GGUF_CONFIG.items() if v == hf)
