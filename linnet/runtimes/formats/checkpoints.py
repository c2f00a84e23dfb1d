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
`model.layers.3.self_attn.k_proj.weight`, with llama.cpp's rotary row permutation undone (see `_unpermute_rows`).
"""

from __future__ import annotations

import json
import math
import mmap
import os
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from linnet.errors import CheckpointError
from linnet.runtimes.formats.embedded import EMBEDDED, EmbeddedError, resolve_embedded
from linnet.runtimes.formats.gguf_quants import STORED, GroupQuantized, group_quantized
from linnet.runtimes.formats.gguf_reader import GGUFError, GGUFFile
from linnet.runtimes.formats.gguf_rope import llama3_scaling_from_rope_freqs
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
    if isinstance(params, dict) and not any(isinstance(v, dict) for v in params.values()):
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
            the metadata, see `_gguf_config`).
        tensor_names: Hugging Face names, in the order the files list them.
        buffer_names: the names that are non-parameter buffers (e.g. "embeddings.position_ids"); a subset of
            tensor_names.
        path: the folder or .gguf file actually read (for an embedded id: inside the package or the cache).
    """

    source: str
    format: str
    config: dict[str, Any] = field(repr=False)
    tensor_names: list[str] = field(repr=False)
    buffer_names: set[str] = field(default_factory=set, repr=False)
    path: Path | None = None

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


# --------------------------------------------------------------------------------------------------------------
# Hugging Face folders (safetensors)

# safetensors dtype names (safetensors/src/tensor.rs `Dtype`) -> our short names
_ST_DTYPES = {
    "F64": "f64",
    "F32": "f32",
    "F16": "f16",
    "BF16": "bf16",
    "I64": "i64",
    "I32": "i32",
    "I16": "i16",
    "I8": "i8",
    "U64": "u64",
    "U32": "u32",
    "U16": "u16",
    "U8": "u8",
    "BOOL": "bool",
    "F8_E4M3": "f8_e4m3",
    "F8_E5M2": "f8_e5m2",
}
INTEGER_DTYPES = {"i64", "i32", "i16", "i8", "u64", "u32", "u16", "u8", "bool"}

# Names transformers registers as buffers, not parameters: BERT-style `position_ids`/`token_type_ids`, rotary
# `inv_freq`, GPT-2's legacy causal mask `attn.bias`/`attn.masked_bias`, BatchNorm's training counter
# `num_batches_tracked` (in every PyTorch checkpoint with a BatchNorm; inference does not read it).
_BUFFER_PATTERNS = re.compile(
    r"(^|\.)(position_ids|token_type_ids|inv_freq|masked_bias|num_batches_tracked)$|(^|\.)attn\.bias$",
)


def _is_buffer(name: str, dtype: str) -> bool:
    """Known buffer names, and any integer or bool tensor (a parameter is always floating point)."""
    return bool(_BUFFER_PATTERNS.search(name)) or dtype in INTEGER_DTYPES


@dataclass(frozen=True)
class _Stored:
    """Where a safetensors tensor lives: its file, dtype (our short name), shape and byte offset in the file."""

    file: Path
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int


def _read_safetensors_header(path: Path) -> dict[str, _Stored]:
    """`{name: _Stored}` from a .safetensors header (8-byte little-endian length + JSON, then the data; offsets in
    the JSON count from the end of the header), validated as the `safetensors` library does before anything is
    read: every entry has a string dtype, a shape of non-negative integers and two data offsets in order, inside
    the file; a dtype Linnet knows spans exactly shape x itemsize bytes (an F16 header over F32-sized data is
    refused here, naming the tensor, its declared dtype and shape, and the bytes found). A dtype Linnet cannot
    read is refused only when that tensor is loaded. Raises CheckpointError for a missing, truncated or corrupt
    file."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise CheckpointError(f"{path}: {size} bytes, too short for a safetensors header")
            (n,) = struct.unpack("<Q", head)
            if n > size - 8 or n > 100_000_000:
                raise CheckpointError(f"{path}: truncated or corrupt safetensors file (header of {n} bytes)")
            header = json.loads(f.read(n))
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read ({e.strerror or e})") from None
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise CheckpointError(f"{path}: corrupt safetensors header ({e})") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: corrupt safetensors header (not a JSON object)")
    out: dict[str, _Stored] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        out[name] = _stored_entry(path, name, entry, 8 + n, size)
    _check_contiguous(path, out, 8 + n, size)
    return out


def _check_contiguous(path: Path, stored: dict[str, _Stored], data_start: int, size: int) -> None:
    """The tensors' byte ranges tile the data section (from `data_start` to the end of the file) exactly, in offset
    order, as the format requires (the `safetensors` library refuses the same files): an overlap or a gap means a
    corrupt offset, which would otherwise read another tensor's bytes. Raises CheckpointError naming the tensor."""
    at = 0
    for name, s in sorted(stored.items(), key=lambda item: (item[1].offset, item[1].nbytes)):
        begin = s.offset - data_start
        if begin != at:
            problem = "overlaps the tensor before it" if begin < at else f"leaves a gap of {begin - at} bytes before it"
            raise CheckpointError(f"{path}: corrupt safetensors header: tensor {name!r} at data byte {begin} {problem}")
        at = begin + s.nbytes
    if data_start + at != size:
        raise CheckpointError(
            f"{path}: corrupt safetensors file: its tensors cover {at} bytes of data, "
            f"the file holds {size - data_start}"
        )


def _is_count(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _stored_entry(path: Path, name: str, entry: object, data_start: int, size: int) -> _Stored:
    """One validated header entry (see `_read_safetensors_header`). Raises CheckpointError naming the tensor."""
    what = f"{path}: corrupt safetensors header entry for {name!r}"
    if not isinstance(entry, dict):
        raise CheckpointError(f"{what} (not a JSON object)")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not isinstance(dtype, str):
        raise CheckpointError(f"{what} (dtype {dtype!r} is not a string)")
    if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
        raise CheckpointError(f"{what} (shape {shape!r} is not a list of non-negative integers)")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_count(o) for o in offsets):
        raise CheckpointError(f"{what} (data_offsets {offsets!r} is not two non-negative integers)")
    begin, end = offsets
    if begin > end:
        raise CheckpointError(f"{what} (data_offsets [{begin}, {end}] run backwards)")
    if data_start + end > size:
        raise CheckpointError(
            f"{path}: truncated safetensors file: tensor {name!r} ends at byte {data_start + end}, "
            f"the file has {size} bytes"
        )
    ours = _ST_DTYPES.get(dtype, dtype.lower())
    try:
        itemsize = numpy_dtype(ours).itemsize
    except ValueError:
        itemsize = None  # refused when loaded (see HFCheckpoint.load): the tensor may never be needed
    if itemsize is not None:
        count = 1
        for d in shape:
            count *= d
        if count * itemsize != end - begin:
            raise CheckpointError(
                f"{path}: tensor {name!r} is declared {dtype} {shape}, which takes {count * itemsize} bytes, "
                f"but its data_offsets hold {end - begin} bytes"
            )
    return _Stored(path, ours, tuple(shape), data_start + begin, end - begin)


def load_json_without_duplicate_keys(text: str, path: Path) -> Any:
    """`text` parsed as JSON, refusing an object that spells a key twice: Python's `json` (and transformers) keep
    the last silently, while a reader's eye, and Linnet's located messages, find the first. Raises
    CheckpointError naming `path`, the key and both lines; json.JSONDecodeError for text that is not JSON."""
    from json.decoder import JSONObject
    from json.scanner import py_make_scanner

    spans: list[tuple[int, int]] = []  # every object parsed so far, (start, end): an object's children come first

    def parse_object(s_and_end, strict, scan_once, object_hook, object_pairs_hook, memo=None, _w=None):
        start = s_and_end[1]
        pairs, end = JSONObject(s_and_end, strict, scan_once, None, list, memo)
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                children = [span for span in spans if start <= span[0] and span[1] <= end]
                lines = [
                    text.count("\n", 0, m.start()) + 1
                    for m in re.finditer(r'"%s"\s*:' % re.escape(json.dumps(key)[1:-1]), text[:end])
                    if m.start() >= start and not any(a <= m.start() < b for a, b in children)
                ]
                at = f" (lines {lines[0]} and {lines[1]})" if len(lines) >= 2 else ""
                raise CheckpointError(
                    f"{path}: key {key!r} is given twice{at}; JSON readers keep one or the other: give it once"
                )
            seen.add(key)
        spans.append((start, end))
        return dict(pairs), end

    decoder = json.JSONDecoder()
    decoder.parse_object = parse_object
    decoder.scan_once = py_make_scanner(decoder)  # the pure-Python scanner, which calls parse_object
    return decoder.decode(text)


@dataclass(eq=False)
class HFCheckpoint(Checkpoint):
    """A Hugging Face folder: config.json plus model.safetensors, or shards listed by
    model.safetensors.index.json (or, lacking both, every *.safetensors in the folder). A diffusers model's folder
    (its config.json names a `_class_name`) is read alike, its files named as diffusers writes them:
    diffusion_pytorch_model.safetensors or diffusion_pytorch_model.safetensors.index.json (the file diffusers'
    `from_pretrained` reads; a variant such as diffusion_pytorch_model.fp16.safetensors beside it is not read)."""

    _where: dict[str, _Stored] = field(default_factory=dict, repr=False)
    _maps: dict[Path, mmap.mmap] = field(default_factory=dict, repr=False)
    _tokenizer: Any = field(default=None, repr=False)

    @classmethod
    def open(cls, folder: Path, source: str) -> HFCheckpoint:
        cfg_path = folder / "config.json"
        if not cfg_path.is_file():
            raise CheckpointError(f"{folder}: no config.json in this folder; {_EXPECTED}")
        try:
            config = load_json_without_duplicate_keys(cfg_path.read_text(encoding="utf-8"), cfg_path)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise CheckpointError(f"{cfg_path}: cannot read JSON ({e})") from None
        except RecursionError:
            raise CheckpointError(f"{cfg_path}: cannot read JSON (arrays or objects nested too deeply)") from None
        if not isinstance(config, dict):
            raise CheckpointError(f"{cfg_path}: expected a JSON object")

        stem = weights_stem(config)
        files = _safetensors_files(folder, stem)
        where: dict[str, _Stored] = {}
        index = folder / f"{stem}.safetensors.index.json"
        headers = {file: _read_safetensors_header(file) for file in dict.fromkeys(files.values())}
        if files:  # from the index: keep its order and check that every listed tensor is where it says
            for name, file in files.items():
                if name not in headers[file]:
                    raise CheckpointError(f"{index}: lists {name!r} in {file.name}, which does not hold it")
                where[name] = headers[file][name]
        else:
            singles = [folder / f"{stem}.safetensors"] if (folder / f"{stem}.safetensors").is_file() else []
            singles = singles or sorted(folder.glob("*.safetensors"))
            if not singles:
                pickles = sorted(p.name for p in folder.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".ckpt"))
                if pickles:
                    raise CheckpointError(
                        f"{folder}: weights only in pickle files ({', '.join(pickles)}); Linnet reads safetensors "
                        "only (convert with transformers: model.save_pretrained(dir, safe_serialization=True))"
                    )
                raise CheckpointError(f"{folder}: no *.safetensors weights; {_EXPECTED}")
            for file in singles:
                for name, stored in _read_safetensors_header(file).items():
                    if name in where:
                        raise CheckpointError(
                            f"{folder}: tensor {name!r} is in both {where[name].file.name} and {file}"
                        )
                    where[name] = stored
        names = list(where)
        return cls(
            source=source,
            format="hf",
            config=normalize_config(config, str(cfg_path)),
            tensor_names=names,
            buffer_names={n for n in names if _is_buffer(n, where[n].dtype)},
            path=folder,
            _where=where,
        )

    def shape(self, name: str) -> tuple[int, ...]:
        if name not in self._where:
            raise self._unknown(name)
        return self._where[name].shape

    def dtype(self, name: str) -> str:
        if name not in self._where:
            raise self._unknown(name)
        return self._where[name].dtype

    def load(self, name: str, dtype: str | np.dtype | None = None) -> np.ndarray:
        if name not in self._where:
            raise self._unknown(name)
        stored = self._where[name]
        try:
            stored_dtype = numpy_dtype(stored.dtype)
        except ValueError:
            raise CheckpointError(
                f"{stored.file}: tensor {name!r} has dtype {stored.dtype}, which Linnet cannot read"
            ) from None
        count = stored.nbytes // stored_dtype.itemsize  # the header's sizes were checked when it was read
        mapped = self._maps.get(stored.file)
        if mapped is None:
            try:
                with open(stored.file, "rb") as f:
                    mapped = self._maps[stored.file] = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            except (OSError, ValueError) as e:
                raise CheckpointError(f"{stored.file}: cannot open ({e})") from None
        a = np.frombuffer(mapped, dtype=stored_dtype, count=count, offset=stored.offset).reshape(stored.shape)
        return check_finite(cast_floating(a, dtype), name, stored.file, a, name in self.buffer_names)

    def tokenizer(self) -> Tokenizer | None:
        if self._tokenizer is None:
            self._tokenizer = Tokenizer.from_hf_dir(self.path) or False  # a TokenizerError names the file
        return self._tokenizer or None

    def close(self) -> None:
        maps, self._maps = self._maps, {}
        for mapped in maps.values():
            try:
                mapped.close()
            except BufferError:  # an array from `load` is still alive; the mapping goes when it does
                pass


def weights_stem(config: dict[str, Any]) -> str:
    """The name of a folder's weights file without `.safetensors`: "diffusion_pytorch_model" for a diffusers model
    (config.json names its `_class_name`; diffusers' SAFETENSORS_WEIGHTS_NAME), else "model" (transformers')."""
    return "diffusion_pytorch_model" if "_class_name" in config else "model"


def _safetensors_files(folder: Path, stem: str = "model") -> dict[str, Path]:
    """`{name: shard}` from `<stem>.safetensors.index.json` (see `weights_stem`), or {} when there is no index.

    Raises CheckpointError when the folder also has a `<stem>`.safetensors (transformers reads that file, the
    index's shards may hold other weights: which one is meant cannot be told), when a shard path is absolute or
    leaves the folder (`../outside.safetensors`; compared as written, so a symlinked shard, as in the Hugging
    Face cache, is fine), or when a listed shard is missing."""
    index = folder / f"{stem}.safetensors.index.json"
    if not index.is_file():
        return {}
    single = folder / f"{stem}.safetensors"
    if single.is_file():
        raise CheckpointError(
            f"{folder}: both {single.name} and {index.name} are here; transformers reads {single.name}, and the "
            f"shards {index.name} lists may hold other weights: remove the one not meant"
        )
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        files = {str(k): folder / str(v) for k, v in weight_map.items()}
    except (
        OSError,
        UnicodeDecodeError,
        json.JSONDecodeError,
        KeyError,
        TypeError,
        AttributeError,
        RecursionError,
    ) as e:
        raise CheckpointError(f"{index}: cannot read the weight map ({e!r})") from None
    for name in files:
        rel = os.path.normpath(str(weight_map[name]))
        if os.path.isabs(rel) or rel == os.pardir or rel.startswith(os.pardir + os.sep):
            raise CheckpointError(
                f"{index}: lists {name!r} in {weight_map[name]!r}, a path outside the checkpoint folder {folder}"
            )
    for file in set(files.values()):
        if not file.is_file():
            raise CheckpointError(f"{index}: lists shard {file.name}, which is missing from {folder}")
    return files


# --------------------------------------------------------------------------------------------------------------
# GGUF files

# GGUF tensor names -> Hugging Face (llama.cpp gguf-py/gguf/tensor_mapping.py, LLAMA entries, read backwards)
GGUF_TOP = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
GGUF_BLOCK = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
# Kept under their GGUF names as buffers: llama.cpp's precomputed Llama 3 rope frequency factors.
_GGUF_BUFFERS = {"rope_freqs.weight"}
_GGUF_ARCHS = {"llama"}
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


def _gguf_hf_name(name: str) -> str | None:
    """The Hugging Face name of a GGUF tensor name, or None if it is not one we know."""
    if name in _GGUF_BUFFERS:
        return name
    m = _GGUF_NAME.match(name)
    if m is None:
        return None
    block, base, suffix = m.groups()
    if block is None:
        return f"{GGUF_TOP[base]}.{suffix}" if base in GGUF_TOP else None
    return f"model.layers.{int(block)}.{GGUF_BLOCK[base]}.{suffix}" if base in GGUF_BLOCK else None


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
    """A .gguf file (llama architecture), read through `GGUFFile`."""

    _file: GGUFFile | None = field(default=None, repr=False)
    _gguf_name: dict[str, str] = field(default_factory=dict, repr=False)
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
            if arch not in _GGUF_ARCHS:
                raise CheckpointError(
                    f"{path}: GGUF architecture {arch!r} is not supported (supported: {', '.join(sorted(_GGUF_ARCHS))})"
                )
            hf_to_gguf: dict[str, str] = {}
            for gname in f.tensors:
                hf = _gguf_hf_name(gname)
                if hf is None:
                    raise CheckpointError(f"{path}: unknown GGUF tensor {gname!r} (no Hugging Face name for it)")
                hf_to_gguf[hf] = gname
            config = _gguf_config(f, arch)
        except CheckpointError:
            f.close()
            raise
        return cls(
            source=source,
            format="gguf",
            config=config,
            tensor_names=list(hf_to_gguf),
            buffer_names={n for n in hf_to_gguf if n in _GGUF_BUFFERS},
            path=path,
            _file=f,
            _gguf_name=hf_to_gguf,
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
        """The head count whose rotary row permutation llama.cpp applied to `name` (Q: num_attention_heads, K:
        num_key_value_heads), or None for any other tensor. Raises CheckpointError for metadata that does not fit."""
        if ".self_attn.q_proj." not in name and ".self_attn.k_proj." not in name:
            return None
        heads = self.config["num_attention_heads"]
        if ".k_proj." in name:
            heads = self.config.get("num_key_value_heads", heads)
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


# --------------------------------------------------------------------------------------------------------------
# Entry point


def open_checkpoint(spec: str | os.PathLike[str]) -> Checkpoint:
    """Open a checkpoint without reading tensor data.

    `spec`: a Hugging Face folder (config.json + model.safetensors, or shards with model.safetensors.index.json),
    a .gguf file (recognised by its magic bytes), or an embedded id (`EMBEDDED_IDS`: "smollm2-135m-instruct",
    "all-minilm-l6-v2"; see `linnet.runtimes.formats.embedded`). Returns an `HFCheckpoint` or `GGUFCheckpoint`.
    Raises CheckpointError naming the path and what was expected; never a traceback from inside a parser.
    """
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
