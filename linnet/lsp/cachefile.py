"""The files a start's caches keep between starts (`linnet.lsp.startup`, `.parses`, `.published`), read back only
when intact.

marshal and pickle do not check what they read: bytes altered on disk may load as other code or other diagnostics,
or fail in ways no list of exceptions foresees (a code object's SystemError, an AttributeError from an opcode
calling `append` on a str, an OverflowError from a frame's length), and the start with them. So each file is its
payload after a header of a magic and the payload's CRC-32 (as a gzip member's trailer holds; ~0.6 ms for the 2 MB
of generated code), and one whose CRC-32 differs reads as no file: its cache does the work again. The CRC-32 guards
against damage, not against someone who writes the file (pickle runs what it holds; the file is the user's own).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import zlib
from pathlib import Path

MAGIC = b"LNC1"
HEADER_BYTES = len(MAGIC) + 4


def read_intact(path: Path) -> memoryview | None:
    """The payload of the cache file at `path` (a view of the bytes read: copying the 2 MB of generated code would
    cost more than its CRC-32, and marshal and pickle read views), or None when it cannot be read or its CRC-32 does
    not match (a file cut short, altered, or of a format before this header)."""
    try:
        data = path.read_bytes()
    except (OSError, ValueError):
        return None
    payload = memoryview(data)[HEADER_BYTES:]
    if data[: len(MAGIC)] != MAGIC or int.from_bytes(data[len(MAGIC) : HEADER_BYTES], "little") != zlib.crc32(payload):
        return None
    return payload


def write_atomic(path: Path, payload: bytes) -> None:
    """Write `payload` with its header to `path` through a file of this process renamed over it, so that a server
    starting meanwhile reads the old file or the new one; a folder that cannot be made or written only means
    nothing is kept (the next start does the work again)."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(MAGIC + zlib.crc32(payload).to_bytes(4, "little") + payload)
        os.replace(tmp, path)
    except (OSError, ValueError):
        with contextlib.suppress(OSError):
            tmp.unlink()


def read_table(path: Path, stamp_field: str, stamp: str, table_field: str) -> dict:
    """The dict `table_field` of the pickled dict that the intact cache file at `path` holds (`read_intact`), when
    its `stamp_field` is `stamp` (what its entries were made under: a parser's digest, the checker's sources); {}
    for a missing, damaged or other-stamped file. Its entries are the caller's to check."""
    data = read_intact(path)
    with contextlib.suppress(EOFError, ValueError, TypeError, pickle.UnpicklingError, MemoryError):
        loaded = pickle.loads(data) if data is not None else None
        if isinstance(loaded, dict) and loaded.get(stamp_field) == stamp and isinstance(loaded.get(table_field), dict):
            return loaded[table_field]
    return {}


def write_table(path: Path, stamp_field: str, stamp: str, table_field: str, table: dict) -> None:
    """`read_table`'s file: `{stamp_field: stamp, table_field: table}` pickled, written by `write_atomic`."""
    write_atomic(path, pickle.dumps({stamp_field: stamp, table_field: table}, protocol=pickle.HIGHEST_PROTOCOL))
