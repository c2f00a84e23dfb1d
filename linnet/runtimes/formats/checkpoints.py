"""Checkpoint reading: Hugging Face folders (safetensors), GGUF files and embedded checkpoints, behind one API.

    with open_checkpoint("smollm2-135m-instruct") as ckpt:
        ckpt.config["hidden_size"]                          # 576, Hugging Face field names
        ckpt.shape("model.layers.0.self_attn.k_proj.weight")  # (192, 576), PyTorch order, nothing read
        w = ckpt.load("model.layers.0.self_attn.k_proj.weight", "f32")  # one numpy array, dequantized
        tok = ckpt.tokenizer()

Opening reads only headers and metadata (safetensors headers, the GGUF metadata and tensor table), not the tensor
data. `load` returns numpy arrays, never torch tensors: a safetensors tensor is a read-only view of the
memory-mapped file (the header gives its offset; nothing is read until it is used), a GGUF tensor a view of the
memory-mapped file or its dequantization by `gguf.quants`. bf16 is `ml_dtypes.bfloat16`. Each runtime converts
the arrays once (`torch.from_numpy`, `jax.device_put`, ONNX initializers), so reading checkpoints needs numpy,
ml_dtypes and gguf, never torch. Nothing is ever unpickled: `.bin`/`.pt` weights are refused.

Names and layouts are Hugging Face's in every format: a GGUF `blk.3.attn_k.weight` is served as
`model.layers.3.self_attn.k_proj.weight`, with llama.cpp's rotary row permutation undone.

This module holds what every format shares (`Checkpoint`, `open_checkpoint`, the config normalisation, dtypes,
casts and finiteness checks); each format's reader lives beside it: `hf_folder` (Hugging Face folders,
safetensors) and `gguf` (GGUF files, over the low-level `gguf_reader`).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from linnet.errors import CheckpointError
from linnet.runtimes.formats.embedded import EMBEDDED, EmbeddedError, resolve_embedded
from linnet.runtimes.formats.tokenizer import Tokenizer

__all__ = [
    "Checkpoint",
    "CheckpointError",
    "open_checkpoint",
    "normalize_config",
    "numpy_dtype",
    "cast_floating",
    "EMBEDDED_IDS",
    "INTEGER_DTYPES",
    "check_finite",
    "check_cast_fits",
]

EMBEDDED_IDS = tuple(EMBEDDED)

_EXPECTED = (
    "expected a Hugging Face folder (config.json + model.safetensors or model.safetensors.index.json; a diffusers "
    "model's: diffusion_pytorch_model.safetensors), "
    f"a .gguf file, or an embedded id ({', '.join(EMBEDDED_IDS)})"
)


# --------------------------------------------------------------------------------------------------------------
# Config normalisation


def _scaling_spelling(scaling: object) -> object:
    """A rope scaling dict as `normalize_config` spells it (`type` -> `rope_type`, "default" -> None), without
    `rope_theta` and `partial_rotary_factor`: what two spellings must agree on."""
    if not isinstance(scaling, dict):
        return scaling
    scaling = {k: v for k, v in scaling.items() if k not in ("rope_theta", "partial_rotary_factor")}
    if "rope_type" not in scaling and "type" in scaling:
        scaling["rope_type"] = scaling.pop("type")
    else:
        scaling.pop("type", None)
    return None if scaling.get("rope_type", "default") == "default" else scaling


def _check_rope_spellings(cfg: dict[str, Any], params: dict[str, Any], where: str) -> None:
    """Refuse a config that has both `rope_scaling` (not null) and a flat `rope_parameters` saying different things.

    transformers 5 reads `rope_scaling` when it is set and ignores `rope_parameters` (its rope_theta then comes
    from `rope_scaling.rope_theta` or the flat `rope_theta`), so Linnet, which reads `rope_parameters`, would
    compute something else. Raises CheckpointError naming both keys and `where`.
    """
    scaling = cfg.get("rope_scaling")
    if scaling is None:
        return  # transformers falls back to rope_parameters, as Linnet does
    if not isinstance(scaling, dict):
        raise CheckpointError(f"{where}: `rope_scaling` is {scaling!r}, expected an object or null")
    problems = []
    if _scaling_spelling(scaling) != _scaling_spelling(params):
        problems.append(f"`rope_scaling` is {scaling!r} but `rope_parameters` is {params!r}")
    if "rope_theta" in params:
        theta = scaling.get("rope_theta", cfg.get("rope_theta"))
        if theta is None:
            problems.append(
                f"`rope_parameters.rope_theta` is {params['rope_theta']!r} but neither `rope_scaling.rope_theta` "
                "nor `rope_theta` is set (transformers would use its default)"
            )
        elif theta != params["rope_theta"]:
            problems.append(
                f"`rope_parameters.rope_theta` is {params['rope_theta']!r} but transformers reads {theta!r}"
            )
    if problems:
        raise CheckpointError(
            f"{where}: `rope_scaling` and `rope_parameters` disagree ({'; '.join(problems)}); transformers reads "
            "`rope_scaling`, so keep one of them (or make them agree)"
        )


def _is_flat_rope_parameters(params: Any) -> bool:
    """transformers 5's `rope_parameters` for one attention type (not a dict of them per layer type)."""
    return isinstance(params, dict) and not any(isinstance(v, dict) for v in params.values())


def flattened_keys(config: dict[str, Any]) -> frozenset[str]:
    """The keys of a raw config.json that `normalize_config` spreads over others and removes: a flat
    `rope_parameters` (read as `rope_theta`, `rope_scaling` and `partial_rotary_factor`). A source field of such a
    name would never be set from the checkpoint and keep its default: loading refuses it (L507)."""
    return frozenset({"rope_parameters"}) if _is_flat_rope_parameters(config.get("rope_parameters")) else frozenset()


def normalize_config(config: dict[str, Any], where: str = "config.json") -> dict[str, Any]:
    """A config.json dict with rotary settings in one spelling: flat `rope_theta` and `rope_scaling`.

    - transformers 5 writes `rope_parameters = {"rope_type", "rope_theta", <scaling fields>}`: it becomes
      `rope_theta` plus `rope_scaling = {"rope_type", <scaling fields>}` (None when rope_type is "default"), and
      `rope_parameters` is removed. A `partial_rotary_factor` inside it moves to the top level. A per-layer-type
      `rope_parameters` (a dict of such dicts, e.g. Gemma 3's full/sliding attention) is left as is.
    - transformers 4's `rope_scaling` with `type` instead of `rope_type` is renamed; `{"type": "default"}` -> None.
    - both `rope_scaling` (not null) and a flat `rope_parameters`: they must agree (the same scaling, the same
      rope_theta as transformers reads), else CheckpointError naming both keys and `where` (the file, for
      messages): transformers reads `rope_scaling`, Linnet would read `rope_parameters`.
    - `id2label` without `num_labels` (transformers 5 writes only `id2label`): `num_labels` is added as
      `len(id2label)`, what transformers' `PretrainedConfig.num_labels` reads, so a source with a classifier
      declares `num_labels` as a field and its size comes from the checkpoint.
    Every other key is kept untouched; the input is not modified.
    """
    cfg = dict(config)
    if isinstance(cfg.get("id2label"), dict) and "num_labels" not in cfg:
        cfg["num_labels"] = len(cfg["id2label"])
    params = cfg.get("rope_parameters")
    if _is_flat_rope_parameters(params):
        if "rope_scaling" in cfg:
            _check_rope_spellings(cfg, params, where)
        params = dict(params)
        del cfg["rope_parameters"]
        if "rope_theta" in params:
            cfg["rope_theta"] = params.pop("rope_theta")
        if "partial_rotary_factor" in params:
            cfg.setdefault("partial_rotary_factor", params.pop("partial_rotary_factor"))
        if params:
            cfg["rope_scaling"] = params
        else:
            cfg.setdefault("rope_scaling", None)
    scaling = cfg.get("rope_scaling")
    if isinstance(scaling, dict):
        scaling = dict(scaling)
        if "rope_type" not in scaling and "type" in scaling:
            scaling["rope_type"] = scaling.pop("type")
        else:
            scaling.pop("type", None)
        cfg["rope_scaling"] = None if scaling.get("rope_type", "default") == "default" else scaling
    return cfg


# --------------------------------------------------------------------------------------------------------------
# The common interface


@dataclass(eq=False)
class Checkpoint:
    """An opened checkpoint. Construct with `open_checkpoint`.

    Fields:
        source: the path or embedded id given, for messages.
        format: "hf" or "gguf".
        config: Hugging Face config.json field names (normalised, see `normalize_config`; for GGUF built from
            the metadata, see `gguf._gguf_config`).
        tensor_names: Hugging Face names, in the order the files list them.
        buffer_names: the names that are non-parameter buffers (e.g. "embeddings.position_ids"); a subset of
            tensor_names.
        path: the folder or .gguf file actually read (for an embedded id: inside the package or the cache).
        flattened: keys of the file's config that `config` holds under other names (`flattened_keys`).
    """

    source: str
    format: str
    config: dict[str, Any] = field(repr=False)
    tensor_names: list[str] = field(repr=False)
    buffer_names: set[str] = field(default_factory=set, repr=False)
    path: Path | None = None
    flattened: frozenset[str] = frozenset()

    def shape(self, name: str) -> tuple[int, ...]:
        """The shape of tensor `name` in PyTorch order, read from the header. Raises CheckpointError for an
        unknown name."""
        raise NotImplementedError

    def dtype(self, name: str) -> str:
        """The stored element type: "f32", "f16", "bf16", "i64", "bool", ...; for quantized GGUF tensors the
        quantization, e.g. "q4_1", "q8_0". Raises CheckpointError for an unknown name."""
        raise NotImplementedError

    def load(self, name: str, dtype: str | np.dtype | None = None) -> np.ndarray:
        """Read one tensor as a numpy array: dequantized, Hugging Face layout, PyTorch order. An array read as
        stored is a read-only view of the memory-mapped file (copy it to write to it); a dequantized, permuted
        or cast one is a fresh array. Quantized GGUF tensors come back as float32; others keep their stored
        dtype (bf16 as `ml_dtypes.bfloat16`) unless `dtype` is given (a Linnet dtype name such as "f32",
        "bf16", "f16", or a numpy dtype), which casts floating-point tensors only (integer buffers keep
        theirs), rounding to nearest even. Raises CheckpointError for an unknown name or unreadable data."""
        raise NotImplementedError

    def tokenizer(self) -> Tokenizer | None:
        """The checkpoint's tokenizer (built once, then cached), or None when it has none (a Hugging Face folder
        without tokenizer.json). Raises CheckpointError for malformed or unsupported tokenizer data."""
        raise NotImplementedError

    def close(self) -> None:
        """Release open files and memory maps. Tensors already loaded stay valid."""

    def release_pages(self) -> None:
        """Drop the resident pages of memory maps whose tensors were copied out (a GGUF file's after `--dtype
        stored` repacked them); files stay open and tensors valid. A no-op where there is nothing to drop."""

    def __contains__(self, name: object) -> bool:
        return name in self.tensor_names

    def _unknown(self, name: str) -> CheckpointError:
        return CheckpointError(f"{self.source}: no tensor named {name!r} in this checkpoint")

    def __enter__(self) -> Checkpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# numpy has no bf16 nor f8: ml_dtypes' types stand in (what JAX uses too)
_ML_DTYPES = {"bf16": "bfloat16", "f8_e4m3": "float8_e4m3fn", "f8_e5m2": "float8_e5m2"}


def numpy_dtype(dtype: str | np.dtype) -> np.dtype:
    """The numpy dtype of a Linnet dtype name ("f32", "bf16": `ml_dtypes.bfloat16`, "i64"...) or of a numpy
    dtype. Raises ValueError for an unknown name."""
    if not isinstance(dtype, str):
        return np.dtype(dtype)
    if dtype in _ML_DTYPES:
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, _ML_DTYPES[dtype]))
    names = {"f64": "<f8", "f32": "<f4", "f16": "<f2", "i64": "<i8", "i32": "<i4", "i16": "<i2", "i8": "i1"}
    names |= {"u64": "<u8", "u32": "<u4", "u16": "<u2", "u8": "u1", "bool": "?"}
    if dtype not in names:
        raise ValueError(f"unknown dtype {dtype!r} (known: {', '.join([*_ML_DTYPES, *names])})")
    return np.dtype(names[dtype])


def is_floating(a: np.ndarray) -> bool:
    """Whether `a` holds floating-point values (numpy's kinds, and the ml_dtypes types such as bfloat16)."""
    return a.dtype.kind == "f" or a.dtype.name in _ML_DTYPES.values()


def cast_floating(a: np.ndarray, dtype: str | np.dtype | None) -> np.ndarray:
    """`a` in `dtype` when `a` is floating point (integer buffers keep theirs). Between an ml_dtypes type (bf16)
    and a numpy one other than f32, the cast goes through f32 (exact) and rounds once, to nearest even, as
    `torch.Tensor.to` does."""
    if dtype is None or not is_floating(a):
        return a
    want = numpy_dtype(dtype)
    if a.dtype == want:
        return a
    if np.float32 not in (a.dtype, want) and "V" in (a.dtype.kind, want.kind):
        a = a.astype(np.float32)
    with np.errstate(over="ignore"):  # values beyond the dtype's range become inf: `check_finite` names them
        return a.astype(want)


# Buffers that legitimately hold -inf/+inf: additive attention masks (e.g. a causal `attn.bias`/`masked_bias`
# written as -inf, or a `*mask*` buffer). Linnet builds its masks itself and binds no such buffer to a parameter;
# NaN is refused in them too.
_MASK_BUFFERS = re.compile(r"(^|\.)(attn\.bias|masked_bias|[\w]*mask[\w]*)$")


def check_finite(
    a: np.ndarray, name: str, where: object, stored: np.ndarray | None = None, buffer: bool = False
) -> np.ndarray:
    """`a` (a tensor `name` read from `where`) when it holds no NaN nor infinity, else CheckpointError naming the
    file, the tensor, how many values are non-finite and the first one's index: NaN or Inf weights give NaN
    logits and empty text, never an error, so they are refused at load. `stored` is the array before a cast: when
    it is finite and `a` is not, the message says the values overflow the cast's dtype (f32 beyond 65504 to f16).
    A mask buffer (`buffer` true and a name `_MASK_BUFFERS` matches) may hold +-inf, as additive masks do; never NaN.
    Integer arrays pass as they are.

    Cost: one f64 sum of the array (NaN and Inf propagate through a sum; an f64 sum of f16, bf16 or f32 values
    cannot overflow), without a boolean temporary the size of the tensor; the element-wise test runs only to word
    the message."""
    if not is_floating(a) or a.size == 0 or np.isfinite(np.sum(a, dtype=np.float64)):
        return a
    wide = a.astype(np.float32, copy=False)
    bad, n_nan = ~np.isfinite(wide), int(np.isnan(wide).sum())
    if not n_nan and buffer and _MASK_BUFFERS.search(name):
        return a
    first = tuple(int(i) for i in np.argwhere(bad)[0])
    value = float(wide[first])
    n_inf = int(bad.sum()) - n_nan
    kinds = "NaN and Inf" if n_nan and n_inf else ("NaN" if n_nan else "Inf")
    if stored is not None and stored is not a and is_floating(stored) and np.isfinite(np.sum(stored, dtype=np.float64)):
        raise CheckpointError(
            f"{where}: tensor {name!r} overflows {a.dtype} when cast ({int(bad.sum())} of {a.size} values become "
            f"infinite, the first at index {list(first)}); load it in a wider dtype (--dtype f32 or bf16)"
        )
    raise CheckpointError(
        f"{where}: tensor {name!r} holds {kinds} ({int(bad.sum())} of {a.size} values, the first {value} at index "
        f"{list(first)}); the checkpoint is corrupt or was saved after training diverged"
    )


def check_cast_fits(a: np.ndarray, dtype: str | np.dtype | None, name: str, where: object) -> np.ndarray:
    """`a` unchanged when casting it to `dtype` (as `cast_floating` does) leaves it finite, else CheckpointError
    as `check_finite` words it (the tensor overflows the cast). For runtimes that cast on the device after the
    load check (PyTorch's `to`): an f32 weight of 1e6 read for `--dtype f16` would become Inf there, unseen.
    Cost: a max and a min over `a` (no temporary the size of the tensor), and the cast of those two values."""
    if dtype is None or not is_floating(a) or a.size == 0 or a.dtype == numpy_dtype(dtype):
        return a
    import ml_dtypes

    if float(ml_dtypes.finfo(numpy_dtype(dtype)).max) >= float(ml_dtypes.finfo(a.dtype).max):
        return a  # a widening cast (f16 or bf16 to f32) cannot overflow
    extremes = np.array([a.max(), a.min()], dtype=a.dtype)
    if np.isfinite(cast_floating(extremes, dtype).astype(np.float32)).all():
        return a
    check_finite(cast_floating(a, dtype), name, where, a)
    return a  # not reached: the cast overflowed, so check_finite raised


# Linnet's integer dtype names (a parameter is always floating point)
INTEGER_DTYPES = {"i64", "i32", "i16", "i8", "u64", "u32", "u16", "u8", "bool"}


# --------------------------------------------------------------------------------------------------------------
# Entry point


def open_checkpoint(spec: str | os.PathLike[str]) -> Checkpoint:
    """Open a checkpoint without reading tensor data.

    `spec`: a Hugging Face folder (config.json + model.safetensors, or shards with model.safetensors.index.json),
    a .gguf file (recognised by its magic bytes), or an embedded id (`EMBEDDED_IDS`: "smollm2-135m-instruct",
    "all-minilm-l6-v2"; see `linnet.runtimes.formats.embedded`). Returns an `HFCheckpoint` or `GGUFCheckpoint`.
    Raises CheckpointError naming the path and what was expected; never a traceback from inside a parser.
    """
    # the readers import this module (Checkpoint, casts and checks): imported here, not at the top
    from linnet.runtimes.formats.gguf import GGUFCheckpoint
    from linnet.runtimes.formats.hf_folder import HFCheckpoint

    text = os.fspath(spec)
    source = str(text)
    if isinstance(text, str) and text in EMBEDDED:
        try:
            path, kind = resolve_embedded(text)
        except EmbeddedError as e:
            raise CheckpointError(f"embedded checkpoint {text!r}: {e}") from None
        return HFCheckpoint.open(path, source) if kind == "hf" else GGUFCheckpoint.open(path, source)
    path = Path(text).expanduser()
    if not path.exists():
        raise CheckpointError(f"{path}: no such file or folder; {_EXPECTED}")
    if path.is_dir():
        return HFCheckpoint.open(path, source)
    if path.name == "config.json":
        return HFCheckpoint.open(path.parent, source)
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read ({e.strerror or e})") from None
    if magic == b"GGUF" or path.suffix.lower() == ".gguf":
        return GGUFCheckpoint.open(path, source)
    raise CheckpointError(f"{path}: not a GGUF file nor a folder; {_EXPECTED}")
