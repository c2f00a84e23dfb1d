"""Hugging Face folders: config.json plus safetensors weights (one file, or shards listed by an index), and
diffusers folders alike. Open one with `checkpoints.open_checkpoint`.

A safetensors file is an 8-byte little-endian header length, a JSON header (`{name: {dtype, shape, data_offsets}}`,
offsets counting from the end of the header) and the data. The header is validated as the `safetensors` library
does before anything is read; `load` returns a read-only view of the memory-mapped file (nothing is read until it
is used). The safetensors package is not needed. Nothing is ever unpickled: `.bin`/`.pt` weights are refused.
"""

from __future__ import annotations

import json
import mmap
import os
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from linnet.errors import CheckpointError
from linnet.runtimes.formats.checkpoints import (
    _EXPECTED,
    INTEGER_DTYPES,
    Checkpoint,
    cast_floating,
    check_finite,
    flattened_keys,
    normalize_config,
    numpy_dtype,
)
from linnet.runtimes.formats.tokenizer import Tokenizer

__all__ = ["HFCheckpoint", "load_json_without_duplicate_keys", "weights_stem"]

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
            flattened=flattened_keys(config),
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
