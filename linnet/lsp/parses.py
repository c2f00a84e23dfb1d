"""The language server's parse cache: the parses of the items a start reads, kept between starts.

Every start parses the standard library (4 files, 29 items) and the file the editor opens. With lark that was
~30 ms and ~17 ms for examples/llama.linnet, and lark's import and tables ~45 ms more; the fast parser
(`linnet.syntax.descent`: no lark for an item without syntax errors) takes about a fifth of lark's parse, and
reading a kept parse back about as much or less. The parse of an item depends only on its text
(`linnet.syntax.parser.parse_item`), so a start keeps each parse it makes (pickled, ~1 KB an item) and writes them
to a per-user file once the documents it opened are checked; the next start reads each item it meets from there and,
when every item is there, imports neither parser.

The file is `lsp/parses-<python>.pickle` in Linnet's cache folder (the generated-code cache's folder:
`linnet.lsp.startup.cache_path`), holding a digest of the syntax package's sources (CRC-32s) (`linnet/syntax/*.py` and
`grammar.lark`): a file written by another version of the parser is ignored, and overwritten by the next save. A
file that cannot be read or written only means parsing, as without it. Like a `.pyc` file, it is the user's own and
is trusted (pickle runs what it holds).
"""

from __future__ import annotations

import contextlib
import pickle
import zlib
from pathlib import Path

import linnet.syntax
from linnet.syntax.parser import ParsedItem

from .cachefile import read_table, write_table

MAX_BYTES = 8 << 20  # what the file (and the parses kept meanwhile) may hold: a 3,000-line file's items are ~1 MB


def syntax_digest() -> str:
    """A digest of the syntax package's sources (`linnet/syntax/*.py`, `grammar.lark`): what a parse depends on
    besides the item's text. CRC-32 and sizes, not a cryptographic hash: it tells versions of our own files apart,
    and hashlib's import alone costs a start ~5 ms."""
    parts = []
    folder = Path(linnet.syntax.__file__).parent
    for path in sorted([*folder.glob("*.py"), folder / "grammar.lark"]):
        data = path.read_bytes()
        parts.append(f"{path.name}:{len(data)}:{zlib.crc32(data):08x}")
    return ";".join(parts)


class ParseCache:
    """Parses by item text (`linnet.syntax.parser.ItemCache`), read from and written to `path` (None: kept in
    memory only). `hits` and `misses` count lookups; `get` hands out a fresh copy each time (a checker may annotate
    the tree it is given)."""

    def __init__(self, path: Path | None, key: str | None = None):
        self.path = path
        self.key = key if key is not None else syntax_digest()
        self.stored: dict[str, bytes] = {}  # what the file held
        self.kept: dict[str, bytes] = {}  # what this process met: written first by `save`
        self.kept_bytes = 0
        self.hits = self.misses = 0
        self._saved_misses = 0
        if path is None:
            return
        # an intact file (`cachefile`) of another parser: only text keys to bytes under this digest are kept
        stored = read_table(path, "key", self.key, "items")
        self.stored = {k: v for k, v in stored.items() if isinstance(k, str) and isinstance(v, bytes)}

    def get(self, text: str) -> ParsedItem | None:
        """The parse of `text` from the file (a fresh copy), else None (a miss)."""
        data = self.kept.get(text) or self.stored.get(text)
        if data is None:
            self.misses += 1
            return None
        try:
            parsed = pickle.loads(data)
        except Exception:  # noqa: BLE001 - a damaged entry is a miss: parsed again
            parsed = None
        if not isinstance(parsed, ParsedItem):
            self.misses += 1
            return None
        self.hits += 1
        self._keep(text, data)
        return parsed

    def put(self, text: str, parsed: ParsedItem) -> None:
        """Keep the parse of `text` for `save` (until `MAX_BYTES` are kept: a 5 MB document's are not)."""
        if self.kept_bytes < MAX_BYTES and text not in self.kept:
            with contextlib.suppress(Exception):  # a tree pickle cannot take (too deep) is parsed again next time
                self._keep(text, pickle.dumps(parsed, protocol=pickle.HIGHEST_PROTOCOL))

    def _keep(self, text: str, data: bytes) -> None:
        if text not in self.kept:
            self.kept[text] = data
            self.kept_bytes += len(text) + len(data)

    def save(self) -> None:
        """Write what this process met, then what the file held besides, up to `MAX_BYTES`; only when a parse was
        missed since the last save. Atomic: a server starting meanwhile reads the old file or the new one."""
        if self.path is None or self.misses == self._saved_misses:
            return
        self._saved_misses = self.misses
        items, size = {}, 0
        for text, data in [*self.kept.copy().items(), *self.stored.items()]:  # kept may grow in a worker thread
            if text not in items and size + len(text) + len(data) <= MAX_BYTES:
                items[text] = data
                size += len(text) + len(data)
        write_table(self.path, "key", self.key, "items", items)
