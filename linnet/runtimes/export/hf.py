"""`linnet export hf`: a loaded model as a Hugging Face folder that transformers (and vLLM, SGLang, TGI) load.

    from linnet.runtimes.export.hf import export_hf
    export_hf(model, "out/smollm2-hf", dtype="bf16")

What is written, in transformers 5's schema (checked against what `save_pretrained` writes):
- `config.json`: `model_type` and `architectures` of the family (the source's root model is the transformers class,
  `LlamaForCausalLM`), every config field of the model, rotary settings as `rope_parameters = {"rope_type",
  "rope_theta", <scaling fields>}`, `tie_word_embeddings`, `dtype`, and the token ids: `bos_token_id`, every eos id
  (an int, or a list when there are several), `pad_token_id`. A model loaded from a Hugging Face folder keeps that
  config.json's other keys (`initializer_range`, ...: keys the source marks `@inert`), so HF -> Linnet -> HF gives
  the same config.
- `model.safetensors`, or shards `model-00001-of-0000N.safetensors` with `model.safetensors.index.json` when the
  weights pass `max_shard_size` (transformers' default, 5 GB); written by the `safetensors` library from numpy. A
  tied head is not a parameter of the source, so it is written once (as the embeddings). A `@takes_part` model (an
  encoder without its pooler) also carries the checkpoint tensors of its class it did not take, as stored.
- `generation_config.json`: the source folder's, if it has one, with the token ids above.
- `tokenizer.json` (the tokenizer Linnet uses, so the ids are Linnet's; from a GGUF file, the one rebuilt from its
  metadata) and `tokenizer_config.json` (`TokenizersBackend`, bos/eos/pad/unk tokens, `add_bos_token` and
  `add_eos_token` as the tokenizer behaves when it has a BOS token, the chat template).

Everything is written into a temporary folder beside the target, which is renamed to the target at the end: a
failure leaves nothing behind. Needs numpy, safetensors and tokenizers; never torch or transformers (a PyTorch
model's weights come to the host through `torch_backend.to_numpy`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from linnet.errors import ExportError
from linnet.runtimes.export.values import check_exportable
from linnet.runtimes.formats.checkpoints import cast_floating, is_floating, numpy_dtype
from linnet.runtimes.model_weights import model_weights

__all__ = ["export_hf", "FAMILIES", "check_family", "check_target", "hf_config", "parse_size", "DEFAULT_MAX_SHARD_SIZE"]

# The source's root model (the transformers class, config.json's `architectures`) -> config.json's `model_type`:
# the families of examples/ whose names and config fields are transformers' own.
FAMILIES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Phi3ForCausalLM": "phi3",
    "GPT2LMHeadModel": "gpt2",
    "GptOssForCausalLM": "gpt_oss",
    "BertModel": "bert",
    "RobertaModel": "roberta",
}


# Config fields of the zoo's sources that transformers' config class has no key for, by model_type: each with the
# value transformers computes in its place (from the other fields). They are not written; a model whose value differs
# (a `--config` override) cannot be written: `hf_config` refuses it, naming the field.
def _heads(c: dict[str, Any]) -> int:
    return c["hidden_size"] // c["num_attention_heads"]


IMPLIED_FIELDS: dict[str, dict[str, Any]] = {
    "llama": {"rope_interleaved": lambda c: False},
    "qwen2": {"head_dim": _heads, "mlp_bias": lambda c: False},
    "qwen3": {"mlp_bias": lambda c: False},
    "mistral": {"attention_bias": lambda c: False, "mlp_bias": lambda c: False},
    "phi3": {
        "head_dim": _heads,
        "rotary_dim": lambda c: int(_heads(c) * c.get("partial_rotary_factor", 1.0)),
        "attention_bias": lambda c: False,
    },
    "gpt2": {"head_dim": lambda c: c["n_embd"] // c["n_head"]},
    "bert": {"head_dim": _heads, "position_embedding_type": lambda c: "absolute"},
    "roberta": {"head_dim": _heads, "position_embedding_type": lambda c: "absolute"},
}
# Fields transformers writes as null when they take the value it derives (GPT-2's `n_inner`: 4 * n_embd), by
# model_type: written as null at that value, as `save_pretrained` writes them.
NULL_MEANS: dict[str, dict[str, Any]] = {"gpt2": {"n_inner": lambda c: 4 * c["n_embd"]}}
_ROPE_FIELDS = ("rope_theta", "rope_scaling", "partial_rotary_factor")
# config.json keys the export writes itself (from the model, not from the source folder's config.json).
_REWRITTEN = {"rope_theta", "rope_scaling", "rope_parameters", "torch_dtype", "dtype", "transformers_version"}
# How a checkpoint stores quantized parameters (GPT-OSS's MXFP4 experts): the export writes every parameter as the
# model holds it, dequantized, so the key is never written (transformers would look for the quantized tensors).
_NOT_EXPORTED = {"quantization_config"}
_TORCH_DTYPES = {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}
DEFAULT_MAX_SHARD_SIZE = "5GB"  # transformers' `save_pretrained` default


def export_hf(
    model: Any,
    out_dir: str | os.PathLike[str],
    dtype: str | None = None,
    max_shard_size: int | str = DEFAULT_MAX_SHARD_SIZE,
) -> list[Path]:
    """Write `model` (a `LoadedModel` of any backend) as a Hugging Face folder `out_dir` (see the module docstring).

    Args:
        model: what `linnet.torch.load` / `linnet.jax.load` / `linnet.onnx.load` return; its current parameters
            are written (a model fine-tuned in memory leaves as it is now).
        out_dir: the folder to create; it must not exist, or be empty.
        dtype: "f32", "bf16" or "f16" for the floating-point weights (rounded to nearest even); None keeps the
            model's working dtype.
        max_shard_size: bytes per safetensors file (an int, or "5GB", "500MB", "2GiB" as transformers spells it);
            above it the weights are sharded with an index.

    Returns the files written, inside `out_dir`.
    Raises ExportError for a family or config Hugging Face cannot express (naming the family or field), a weight
    that holds NaN or Inf or overflows `dtype` (f32 beyond 65504 to f16, naming the tensor; export/values.py), an
    `out_dir` that exists and is not empty, or a bad dtype / max_shard_size; OSError when the folder cannot be
    written. Nothing is left on disk after an error.
    """
    if dtype is not None and dtype not in _TORCH_DTYPES:
        raise ExportError(f"dtype must be one of {', '.join(_TORCH_DTYPES)}, got {dtype!r}")
    limit = parse_size(max_shard_size)
    target = check_target(out_dir)
    program = model.program
    if program is None:
        raise ExportError(f"the {model.backend} model has no program (an artifact loaded without its source)")
    checkpoint = getattr(getattr(model, "prepared", None), "checkpoint", None)
    source_dir = Path(checkpoint.path) if checkpoint is not None and checkpoint.format == "hf" else None
    tokenizer = model.tokenizer()
    weight_dtype = dtype or program.dtype.name
    config = hf_config(
        program.model,
        program.config,
        weight_dtype,
        base=_read_json(source_dir / "config.json") if source_dir else {},
        token_ids=_token_ids(checkpoint.config if checkpoint is not None else {}, tokenizer),
    )
    weights = model_weights(model) | _untaken(model)  # as held (views where the backend allows), cast per shard
    for name, a in weights.items():  # NaN, Inf, or a value the dtype turns into Inf: refused (export/values.py)
        check_exportable(a, name, weight_dtype, lambda a: cast_floating(a, weight_dtype).astype(np.float32))

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent))
    try:
        _write_json(tmp / "config.json", config)
        generation = _read_json(source_dir / "generation_config.json") if source_dir else {}
        generation.pop("transformers_version", None)
        _write_json(tmp / "generation_config.json", generation | _generation_ids(config))
        _write_weights(tmp, weights, weight_dtype, limit)
        if tokenizer is not None:
            _write_tokenizer(tmp, tokenizer, config)
        _usual_permissions(tmp)
        if target.exists():
            target.rmdir()  # empty, checked above
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return sorted(target.iterdir())


def hf_config(
    architecture: str,
    fields: dict[str, Any],
    dtype: str,
    base: dict[str, Any] | None = None,
    token_ids: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """config.json of a model whose root model is `architecture` with config `fields` (Hugging Face names, as
    `Program.config` holds them: flat `rope_theta` and `rope_scaling`), weights in `dtype` ("f32", "bf16", "f16").

    `base` (a source folder's config.json) supplies the keys the model does not hold (`@inert` ones); `fields` win
    over it. Rotary settings are written as transformers 5 does: `rope_parameters = {"rope_type": "default" or the
    scaling's, "rope_theta", <scaling fields>}`, with no `rope_theta` nor `rope_scaling` beside it. `token_ids`
    (`bos_token_id`, `eos_token_id`, `pad_token_id`) are set last. Keys are sorted, as transformers writes them.

    A config.json `base` whose `rope_parameters` says what `fields` do is kept as it spells them (transformers 5
    writes Phi-3's with `partial_rotary_factor` inside too), so HF -> Linnet -> HF gives the same file.

    Raises ExportError naming the architecture for a family transformers' config.json cannot name, and naming the
    field for a field transformers has no key for, at a value other than the one it computes (`IMPLIED_FIELDS`)."""
    model_type = check_family(architecture)
    base = base or {}
    cfg = {k: v for k, v in base.items() if k not in _REWRITTEN | _NOT_EXPORTED}
    implied = IMPLIED_FIELDS.get(model_type, {})
    for key, value in fields.items():
        if key in implied:
            if value != implied[key](fields):
                raise ExportError(
                    f"cannot export {architecture} with `{key} = {json.dumps(value)}` as a Hugging Face checkpoint: "
                    f"transformers' {model_type} config has no `{key}` and computes {json.dumps(implied[key](fields))}"
                )
            # not written (a source folder's config.json that spells it keeps it: transformers ignores it)
        elif key in NULL_MEANS.get(model_type, {}) and value == NULL_MEANS[model_type][key](fields):
            cfg[key] = None
        elif key not in ("rope_theta", "rope_scaling") and key not in _NOT_EXPORTED:
            cfg[key] = value
    if "rope_theta" in fields:
        if "rope_parameters" in base and _same_rope(base, fields):
            cfg["rope_parameters"] = base["rope_parameters"]  # as the source folder spells it (transformers 5's)
        else:
            scaling = _set(fields.get("rope_scaling") or {})
            cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": fields["rope_theta"], **scaling}
    elif fields.get("rope_scaling") is not None:
        cfg["rope_scaling"] = fields["rope_scaling"]
    cfg |= {"model_type": model_type, "architectures": [architecture], "dtype": _TORCH_DTYPES[dtype]}
    cfg |= token_ids or {}
    return dict(sorted(cfg.items()))


def _same_rope(base: dict[str, Any], fields: dict[str, Any]) -> bool:
    """Whether a source folder's config.json `base` says what `fields` hold about rotary embeddings."""
    from linnet.runtimes.formats.checkpoints import normalize_config

    read = normalize_config(base)
    return all(_set(read.get(k)) == _set(fields[k]) for k in _ROPE_FIELDS if k in fields)


def _set(value: Any) -> Any:
    """A rope scaling dict without its unset (None) fields: the source's `RopeScaling` lists every optional one."""
    return {k: v for k, v in value.items() if v is not None} if isinstance(value, dict) else value


def check_family(architecture: str) -> str:
    """The `model_type` of a source whose root model is `architecture`. Raises ExportError naming it and the
    exportable families when transformers has no model_type for it."""
    if architecture not in FAMILIES:
        raise ExportError(
            f"cannot export {architecture} as a Hugging Face checkpoint: no transformers model_type for it (the "
            f"exportable families are {', '.join(f'{a} ({t})' for a, t in FAMILIES.items())})"
        )
    return FAMILIES[architecture]


def check_target(out_dir: str | os.PathLike[str]) -> Path:
    """`out_dir` as a Path when it can become the export folder: missing, or an empty folder. Raises ExportError
    otherwise (an export never overwrites)."""
    target = Path(out_dir)
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise ExportError(f"{target}: already exists and is not an empty folder; remove it or pick another")
    return target


def parse_size(size: int | str) -> int:
    """Bytes of `size`: an int, or a number with a unit as transformers' `convert_file_size_to_int` reads it
    ("5GB" = 5 * 10**9, "2GiB" = 2 * 2**30, "500MB", "100KB"). Raises ExportError for anything else."""
    if isinstance(size, int) and not isinstance(size, bool) and size > 0:
        return size
    units = {"KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]I?B)\s*", str(size).upper()) if isinstance(size, str) else None
    if m is None or m[2] not in units or float(m[1]) <= 0:
        raise ExportError(f"max shard size must be a positive number of bytes or like '5GB', '2GiB', got {size!r}")
    return int(float(m[1]) * units[m[2]])


# --------------------------------------------------------------------------------------------------------------


def _untaken(model: Any) -> dict[str, np.ndarray]:
    """The checkpoint tensors a `@takes_part` model did not take but its transformers class holds, as stored: those
    under the prefix its parameters were found at, named without it (RoBERTa's `pooler.dense.*`, which the source
    does not compute but `RobertaModel` loads; without them transformers would initialise them at random). Tensors
    outside the prefix belong to another head (a masked-LM head beside `roberta.`) and are left out, as
    transformers leaves them out loading the base model."""
    prepared = getattr(model, "prepared", None)
    checkpoint = getattr(prepared, "checkpoint", None)
    if checkpoint is None or not model.program.takes_part or not prepared.plan:
        return {}
    path, name = next(iter(prepared.plan.items()))
    prefix = name[: len(name) - len(path)] if name.endswith(path) else ""
    taken = set(prepared.plan.values())
    return {
        n[len(prefix) :]: checkpoint.load(n)
        for n in checkpoint.tensor_names
        if n.startswith(prefix) and n not in taken and n not in checkpoint.buffer_names
    }


def _token_ids(checkpoint_config: dict[str, Any], tokenizer: Any) -> dict[str, Any]:
    """bos/eos/pad ids for config.json: the checkpoint config's, completed by the tokenizer's (every eos id it stops
    at; a GGUF file's eot/eom ids among them). eos is an int when there is one, a list when there are several."""
    eos = checkpoint_config.get("eos_token_id")
    eos_ids = list(eos) if isinstance(eos, list) else ([eos] if isinstance(eos, int) else [])
    bos = checkpoint_config.get("bos_token_id")
    if tokenizer is not None:
        eos_ids += sorted(i for i in tokenizer.eos_token_ids if i not in eos_ids)
        bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else bos
    ids: dict[str, Any] = {"bos_token_id": bos, "eos_token_id": eos_ids[0] if len(eos_ids) == 1 else eos_ids or None}
    ids["pad_token_id"] = checkpoint_config.get("pad_token_id")
    return ids


def _generation_ids(config: dict[str, Any]) -> dict[str, Any]:
    return {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if config.get(k) is not None}


def _write_weights(folder: Path, weights: dict[str, np.ndarray], dtype: str, limit: int) -> None:
    """`model.safetensors`, or shards of at most `limit` bytes (a tensor bigger than that gets a shard of its own)
    in parameter order, with `model.safetensors.index.json` mapping each name to its shard. Floating-point tensors
    are cast to `dtype` one shard at a time, so an export holds at most one shard's copies beside the model."""
    from safetensors.numpy import save_file

    def nbytes(a: np.ndarray) -> int:
        return a.size * numpy_dtype(dtype).itemsize if is_floating(a) else a.nbytes

    shards: list[list[str]] = [[]]
    size = total = 0
    for name, a in weights.items():
        if shards[-1] and size + nbytes(a) > limit:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += nbytes(a)
        total += nbytes(a)
    metadata = {"format": "pt"}  # what transformers writes and checks
    weight_map = {}
    for i, names in enumerate(shards, 1):
        file = "model.safetensors" if len(shards) == 1 else f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        shard = {n: np.ascontiguousarray(cast_floating(weights[n], dtype)) for n in names}
        save_file(shard, folder / file, metadata=metadata)
        weight_map |= dict.fromkeys(names, file)
    if len(shards) > 1:
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        _write_json(folder / "model.safetensors.index.json", index)


def _write_tokenizer(folder: Path, tokenizer: Any, config: dict[str, Any]) -> None:
    """tokenizer.json from the tokenizer's `tokenizers` backend, and tokenizer_config.json naming the bos/eos/pad/unk
    tokens and the chat template.

    transformers 5 (`TokenizersBackend`) replaces the post-processor with `[bos] $A [eos]` when tokenizer_config.json
    has `add_bos_token` or `add_eos_token`: a tokenizer with a BOS token (the decoders') gets both, saying what
    encoding does (observed on a probe); one without (BERT's `[CLS] $A [SEP]`) gets neither, so its own
    post-processor stands."""
    backend = tokenizer.backend
    backend.save(str(folder / "tokenizer.json"))
    pad_id = config.get("pad_token_id")
    tc: dict[str, Any] = {
        "backend": "tokenizers",
        "bos_token": tokenizer.bos_token,
        "clean_up_tokenization_spaces": False,
        "eos_token": tokenizer.eos_token,
        "model_max_length": config.get("max_position_embeddings", config.get("n_positions")),
        "pad_token": tokenizer.id_to_token(pad_id) if isinstance(pad_id, int) else None,
        "tokenizer_class": "TokenizersBackend",
        "unk_token": getattr(backend.model, "unk_token", None),
        "chat_template": tokenizer.chat_template,
    }
    if tokenizer.bos_token_id is not None:
        probe = backend.encode("a", add_special_tokens=True).ids
        eos_id = tokenizer.eos_token_id
        tc["add_bos_token"] = tokenizer.add_bos_token
        tc["add_eos_token"] = bool(eos_id is not None and probe and probe[-1] == eos_id)
    _write_json(folder / "tokenizer_config.json", {k: v for k, v in sorted(tc.items()) if v is not None})


def _usual_permissions(folder: Path) -> None:
    """Give `folder` and its files the modes the user's umask gives new ones (`mkdtemp` makes the folder 0700 and
    the safetensors writer its files 0600), so that the export is as shareable as `save_pretrained`'s."""
    umask = os.umask(0)
    os.umask(umask)
    folder.chmod(0o777 & ~umask)
    for file in folder.iterdir():
        file.chmod(0o666 & ~umask)


def _read_json(path: Path) -> dict[str, Any]:
    """A JSON object from `path` ({} when the file is missing): the source folder's, read once already at load."""
    if not path.is_file():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    return dict(data) if isinstance(data, dict) else {}


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
