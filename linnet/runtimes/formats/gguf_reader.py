"""A small, strict reader for GGUF files: metadata, the tensor table and memory-mapped tensor data.

Format (GGUF v2/v3, https://github.com/ggml-org/ggml/blob/master/docs/gguf.md), all little-endian:

    magic "GGUF" | u32 version | u64 tensor_count | u64 kv_count
    kv_count x (string key, u32 value_type, value)
    tensor_count x (string name, u32 n_dims, n_dims x u64 dims (fastest first), u32 ggml_type, u64 offset)
    padding to `general.alignment` (default 32) | tensor data (offsets relative to here)

`gguf.GGUFReader` reads the same thing but builds a numpy view per string of every metadata array, which takes
about 2.5 s for a 49k-token vocabulary; this reader takes about 0.1 s and bounds-checks everything, so a truncated
or corrupt file gives a `GGUFError` that says where it went wrong. Dequantization is left to `gguf.quants`.

Needs numpy (and `gguf` only for dequantizing); never torch.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from math import prod
from pathlib import Path
from typing import Any

import numpy as np

from linnet.errors import CheckpointError

__all__ = ["GGUFError", "GGUFFile", "GGUFTensorInfo", "GGML_TYPES", "PLAIN_TYPES"]


class GGUFError(CheckpointError, ValueError):
    """The file is not a well-formed GGUF file (bad magic, unsupported version, truncated, unknown type)."""


# ggml type id -> (name, elements per block, bytes per block). From ggml.h `enum ggml_type` and
# gguf-py `GGML_QUANT_SIZES`; the ids are fixed by the file format.
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("f32", 1, 4),
    1: ("f16", 1, 2),
    2: ("q4_0", 32, 18),
    3: ("q4_1", 32, 20),
    6: ("q5_0", 32, 22),
    7: ("q5_1", 32, 24),
    8: ("q8_0", 32, 34),
    9: ("q8_1", 32, 40),
    10: ("q2_k", 256, 84),
    11: ("q3_k", 256, 110),
    12: ("q4_k", 256, 144),
    13: ("q5_k", 256, 176),
    14: ("q6_k", 256, 210),
    15: ("q8_k", 256, 292),
    16: ("iq2_xxs", 256, 66),
    17: ("iq2_xs", 256, 74),
    18: ("iq3_xxs", 256, 98),
    19: ("iq1_s", 256, 50),
    20: ("iq4_nl", 32, 18),
    21: ("iq3_s", 256, 110),
    22: ("iq2_s", 256, 82),
    23: ("iq4_xs", 256, 136),
    24: ("i8", 1, 1),
    25: ("i16", 1, 2),
    26: ("i32", 1, 4),
    27: ("i64", 1, 8),
    28: ("f64", 1, 8),
    29: ("iq1_m", 256, 56),
    30: ("bf16", 1, 2),
    34: ("tq1_0", 256, 54),
    35: ("tq2_0", 256, 66),
    39: ("mxfp4", 32, 17),
}

# Types stored as plain values, with the numpy dtype that reads them (bf16 is read as its bit pattern, u16).
PLAIN_NUMPY: dict[int, np.dtype] = {
    0: np.dtype("<f4"),
    1: np.dtype("<f2"),
    24: np.dtype("i1"),
    25: np.dtype("<i2"),
    26: np.dtype("<i4"),
    27: np.dtype("<i8"),
    28: np.dtype("<f8"),
    30: np.dtype("<u2"),
}

# The names of those types: every other type is quantized (blocks of codes and scales).
PLAIN_TYPES = frozenset(GGML_TYPES[t][0] for t in PLAIN_NUMPY)

# Metadata value types (gguf.md "gguf_metadata_value_type"): fixed-size scalars, 8 = string, 9 = array.
_SCALAR = {
    0: struct.Struct("<B"),
    1: struct.Struct("<b"),
    2: struct.Struct("<H"),
    3: struct.Struct("<h"),
    4: struct.Struct("<I"),
    5: struct.Struct("<i"),
    6: struct.Struct("<f"),
    7: struct.Struct("<?"),
    10: struct.Struct("<Q"),
    11: struct.Struct("<q"),
    12: struct.Struct("<d"),
}
_SCALAR_NUMPY = {0: "u1", 1: "i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8", 11: "<i8"}
_SCALAR_NUMPY[12] = "<f8"
_U32, _U64 = struct.Struct("<I"), struct.Struct("<Q")


@dataclass(frozen=True)
class GGUFTensorInfo:
    """One entry of the tensor table. `shape` is in PyTorch order (the file lists dims fastest first);
    `offset` is absolute (from the start of the file); `nbytes` is the stored size."""

    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int
    nbytes: int

    @property
    def type_name(self) -> str:
        """The stored type as a short lower-case name: "f32", "f16", "bf16", "q4_1", "q8_0", ..."""
        return GGML_TYPES[self.ggml_type][0]

    @property
    def quantized(self) -> bool:
        return self.ggml_type not in PLAIN_NUMPY


class GGUFFile:
    """A GGUF file opened read-only with `mmap`; nothing of the tensor data is read until `raw()` is called.

    Attributes: `path`, `version`, `metadata` (key -> Python value: int/float/bool/str or list of them),
    `tensors` (name -> GGUFTensorInfo, in file order), `alignment`, `data_start`.
    Raises `GGUFError` for anything malformed and `OSError` when the file cannot be opened.
    """

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self._mm: mmap.mmap | None = None
        with open(self.path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < 24:
                raise GGUFError(f"{self.path}: {size} bytes, too short for a GGUF header (24 bytes)")
            self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self.size = size
        try:
            self._parse()
        except GGUFError:
            self.close()
            raise
        except (struct.error, IndexError, OverflowError, MemoryError) as e:
            self.close()
            raise GGUFError(f"{self.path}: truncated or corrupt GGUF header ({e})") from None
        except UnicodeDecodeError as e:
            self.close()
            raise GGUFError(f"{self.path}: a metadata string is not UTF-8 ({e})") from None

    # -- parsing ---------------------------------------------------------------------------------------------

    def _need(self, pos: int, n: int, what: str) -> None:
        if n < 0 or pos + n > self.size:
            raise GGUFError(
                f"{self.path}: truncated or corrupt GGUF file: {what} needs bytes {pos}..{pos + n} "
                f"but the file has {self.size} bytes"
            )

    def _string(self, pos: int, what: str) -> tuple[str, int]:
        self._need(pos, 8, what)
        (n,) = _U64.unpack_from(self._mm, pos)
        pos += 8
        self._need(pos, n, what)
        return self._mm[pos : pos + n].decode("utf-8"), pos + n

    def _value(self, pos: int, vtype: int, key: str) -> tuple[Any, int]:
        if vtype in _SCALAR:
            s = _SCALAR[vtype]
            self._need(pos, s.size, f"metadata value {key!r}")
            return s.unpack_from(self._mm, pos)[0], pos + s.size
        if vtype == 8:
            return self._string(pos, f"metadata string {key!r}")
        if vtype == 9:
            self._need(pos, 12, f"metadata array header {key!r}")
            (etype,) = _U32.unpack_from(self._mm, pos)
            (count,) = _U64.unpack_from(self._mm, pos + 4)
            pos += 12
            if etype in _SCALAR_NUMPY:
                dt = np.dtype(_SCALAR_NUMPY[etype])
                self._need(pos, count * dt.itemsize, f"metadata array {key!r}")
                values = np.frombuffer(self._mm, dtype=dt, count=count, offset=pos).tolist()
                return values, pos + count * dt.itemsize
            if etype in (8, 9):
                values = []
                for _ in range(count):
                    v, pos = self._value(pos, etype, key)
                    values.append(v)
                return values, pos
            raise GGUFError(f"{self.path}: metadata array {key!r} has unknown element type {etype}")
        raise GGUFError(f"{self.path}: metadata value {key!r} has unknown type {vtype}")

    def _parse(self) -> None:
        mm = self._mm
        if mm[:4] != b"GGUF":
            raise GGUFError(f"{self.path}: not a GGUF file (magic {bytes(mm[:4])!r}, expected b'GGUF')")
        version, n_tensors, n_kv = struct.unpack_from("<IQQ", mm, 4)
        if version not in (2, 3):
            raise GGUFError(f"{self.path}: GGUF version {version} is not supported (2 and 3 are)")
        self.version = version
        pos = 24
        self.metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key, pos = self._string(pos, "metadata key")
            self._need(pos, 4, f"metadata type of {key!r}")
            (vtype,) = _U32.unpack_from(mm, pos)
            self.metadata[key], pos = self._value(pos + 4, vtype, key)
        table = []
        for _ in range(n_tensors):
            name, pos = self._string(pos, "tensor name")
            self._need(pos, 4, f"tensor {name!r} header")
            (n_dims,) = _U32.unpack_from(mm, pos)
            if n_dims > 8:
                raise GGUFError(f"{self.path}: tensor {name!r} claims {n_dims} dimensions")
            self._need(pos + 4, 8 * n_dims + 12, f"tensor {name!r} header")
            dims = struct.unpack_from(f"<{n_dims}Q", mm, pos + 4)
            ggml_type, offset = struct.unpack_from("<IQ", mm, pos + 4 + 8 * n_dims)
            pos += 4 + 8 * n_dims + 12
            table.append((name, tuple(reversed(dims)), ggml_type, offset))
        alignment = self.metadata.get("general.alignment", 32)
        # llama.cpp gguf.cpp refuses the same: a non-power-of-two alignment, and tensor data not laid out in table
        # order, each at the running offset padded to the alignment (a corrupt offset would read other bytes)
        if (
            not isinstance(alignment, int)
            or isinstance(alignment, bool)
            or alignment <= 0
            or alignment & (alignment - 1)
        ):
            raise GGUFError(f"{self.path}: general.alignment is {alignment!r}, not a power of two")
        self.alignment = alignment
        self.data_start = (pos + self.alignment - 1) // self.alignment * self.alignment
        self.tensors: dict[str, GGUFTensorInfo] = {}
        expected = 0
        for name, shape, ggml_type, offset in table:
            if offset != expected:
                raise GGUFError(f"{self.path}: tensor {name!r} has data offset {offset}, expected {expected}")
            if ggml_type not in GGML_TYPES:
                raise GGUFError(f"{self.path}: tensor {name!r} has unknown ggml type {ggml_type}")
            _, block, block_bytes = GGML_TYPES[ggml_type]
            n = prod(shape)
            if shape and shape[-1] % block:
                raise GGUFError(f"{self.path}: tensor {name!r} row of {shape[-1]} is not a whole number of blocks")
            nbytes = n // block * block_bytes
            expected = (offset + nbytes + self.alignment - 1) // self.alignment * self.alignment
            start = self.data_start + offset
            self._need(start, nbytes, f"tensor {name!r} data")
            if name in self.tensors:
                raise GGUFError(f"{self.path}: tensor {name!r} appears twice")
            self.tensors[name] = GGUFTensorInfo(name, shape, ggml_type, start, nbytes)
        self._check_file_end(table, pos, expected)

    def _check_file_end(self, table: list, header_end: int, padded_end: int) -> None:
        """The tensor data ends where the file ends, but for the padding to the alignment: a tensor count that is
        too small (the table's last entry then read as padding, every tensor's data read from the wrong place and
        the last tensor dropped) or too large, or bytes past the data, is a corrupt file, not a smaller model."""
        if table:
            last = self.tensors[table[-1][0]]
            end, most = last.offset + last.nbytes, self.data_start + padded_end
        else:
            end, most = header_end, self.data_start
        if not end <= self.size <= most:
            n = len(table)
            raise GGUFError(
                f"{self.path}: corrupt GGUF file: the header's {n} tensor{'s' * (n != 1)} end at byte {end} "
                f"(padded to the alignment of {self.alignment}: {most}) but the file has {self.size} bytes; the "
                f"tensor count at byte 8 or a tensor's offset or shape is wrong, or the file was cut or appended to"
            )

    # -- access ----------------------------------------------------------------------------------------------

    def get(self, key: str, default: Any = None) -> Any:
        """A metadata value, or `default`."""
        return self.metadata.get(key, default)

    def raw(self, name: str) -> np.ndarray:
        """The stored data of tensor `name` as a read-only numpy view into the mapped file (no copy).

        Plain types come back with their own dtype and the PyTorch-order shape (bf16 as its u16 bit pattern);
        quantized types as uint8 of shape `(*shape[:-1], bytes_per_row)`, the layout `gguf.quants.dequantize`
        takes. Raises KeyError for an unknown name and GGUFError once closed.
        """
        if self._mm is None:
            raise GGUFError(f"{self.path}: file is closed")
        info = self.tensors[name]
        if info.ggml_type in PLAIN_NUMPY:
            dt = PLAIN_NUMPY[info.ggml_type]
            arr = np.frombuffer(self._mm, dtype=dt, count=info.nbytes // dt.itemsize, offset=info.offset)
            return arr.reshape(info.shape)
        arr = np.frombuffer(self._mm, dtype=np.uint8, count=info.nbytes, offset=info.offset)
        rows = prod(info.shape[:-1]) if len(info.shape) > 1 else 1
        return arr.reshape(*info.shape[:-1], info.nbytes // rows)

    def release_pages(self) -> None:
        """Drop this process's resident pages of the mapping (`MADV_DONTNEED`), once what was read from it was
        copied out: they count in its RSS as long as they are mapped. The mapping and every view of it stay valid
        (a page touched again is read back from the file). A no-op where `madvise` is missing or once closed."""
        if self._mm is not None and hasattr(mmap, "MADV_DONTNEED"):
            self._mm.madvise(mmap.MADV_DONTNEED)

    def close(self) -> None:
        """Drop the mapping. Views handed out by `raw()` keep it alive until they are gone."""
        mm, self._mm = self._mm, None
        if mm is not None:
            try:
                mm.close()
            except BufferError:  # a view from raw() is still alive; the mapping goes when it does
                pass

    def __enter__(self) -> GGUFFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
