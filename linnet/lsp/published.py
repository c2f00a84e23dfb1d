"""The diagnostics a start published for each document as opened, kept between starts.

A start spends ~70 ms of CPU checking examples/llama.linnet before it can publish anything (the check itself:
bench/results/lsp_cold_start_published.md), and an editor most often opens again what it had open, unchanged. As
ruff's and mypy's caches do for a file's findings, a start keeps what it published for each document as it was
opened, with what that depended on; the next start of the same text publishes it at once, then checks as ever and
publishes again only when the check finds otherwise (a stale entry is corrected within one check, never kept).

An entry is used only when all of this is as it was: the document's path and text, the preset and the position
encoding, and the size and modification time of each file its analysis read besides (its imports), and that no
file has appeared where an import found none (L120 "no such file"). The file holds
a stamp of the front end's and the server's sources (`code_stamp`: the standard library's `.linnet` files too),
so a changed checker or converter never reads an older start's diagnostics. It is
`lsp/published-<python>.pickle` in Linnet's cache folder (`linnet.lsp.startup.cache_path`); a file that cannot be
read or written only means checking first, as without it. Like a `.pyc` file, it is the user's own and trusted
(pickle runs what it holds).
"""

from __future__ import annotations

import contextlib
import os
import pickle
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from .cachefile import read_table, write_table

if TYPE_CHECKING:
    from linnet.semantics.workspace import Workspace

# what the entries may hold (the documents' texts and their diagnostics); a start that opens more drops the oldest
MAX_BYTES = 4 << 20
# the folders of the `linnet` package whose sources decide what a document's diagnostics are
CODE_FOLDERS = ("syntax", "semantics", "types", "ops", "std", "lsp")
CODE_SUFFIXES = (".py", ".lark", ".linnet")


def code_stamp() -> str:
    """The size and modification time (ns) of every source in `CODE_FOLDERS` and of the package's own modules:
    what the diagnostics of a text depend on besides it (a `stat` each: ~85 files, ~0.5 ms; the CRC-32s the parse
    cache takes of the syntax package alone would read them all)."""
    root = Path(__file__).resolve().parents[1]
    parts = []
    for folder in (root, *(root / name for name in CODE_FOLDERS)):
        with contextlib.suppress(OSError):
            for entry in sorted(os.scandir(folder), key=lambda e: e.name):
                if entry.name.endswith(CODE_SUFFIXES) and entry.is_file():
                    st = entry.stat()
                    parts.append(f"{entry.path}:{st.st_size}:{st.st_mtime_ns}")
    return ";".join(parts)


def read_stamps(workspace: Workspace, files: list[str]) -> list[tuple[str, tuple[int, int] | None]]:
    """Each of `files` with the (size, modification time in ns) it had when `workspace` read the text an analysis
    checked (`Workspace.read_stamp`; None for a file whose text is given, open in the editor)."""
    return [(file, workspace.read_stamp(file)) for file in files]


def file_stamp(path: str) -> tuple[int, int] | None:
    """(size, modification time in ns) of `path`, or None when it cannot be read."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return st.st_size, st.st_mtime_ns


class PublishedCache:
    """Published diagnostics by document path, read from and written to `path` (None: nothing is read or written).
    `get` answers a start's first publish of a document; `put` records the check's; `save` writes what is new."""

    def __init__(self, path: Path | None, code: str | None = None):
        self.path = path
        self.code = code if code is not None else code_stamp() if path is not None else ""
        # document path -> (text, settings, ((file, stamp), ...), pickled diagnostics), most recent last
        self.entries: dict[str, tuple[str, tuple, tuple, bytes]] = {}
        self.changed = False
        if path is None:
            return
        # an intact file (`cachefile`) of other sources: only well-formed entries under this stamp are kept
        self.entries = {
            k: v
            for k, v in read_table(path, "code", self.code, "entries").items()
            if isinstance(k, str) and isinstance(v, tuple) and len(v) == 4 and isinstance(v[3], bytes)
        }

    def get(self, doc_path: str, text: str, settings: tuple, is_open: Callable[[str], bool]) -> list | None:
        """The diagnostics published for `doc_path` holding `text` under `settings` (preset, position encoding),
        when every file its analysis read besides is as it was then on disk and not open in the editor (`is_open`:
        its text there may not be the file's); else None."""
        entry = self.entries.get(doc_path)
        if entry is None or entry[0] != text or entry[1] != settings:
            return None
        if any(file_stamp(file) != stamp or is_open(file) for file, stamp in entry[2]):
            return None
        try:
            diagnostics = pickle.loads(entry[3])
        except Exception:  # noqa: BLE001 - a damaged entry (or of another lsprotocol) is a miss: checked first
            return None
        return diagnostics if isinstance(diagnostics, list) else None

    def put(self, doc_path: str, text: str, settings: tuple, read: list, diagnostics: list[Any], absent=()) -> None:
        """Record `diagnostics`, published for `doc_path` holding `text` under `settings`, whose analysis read the
        files of `read` besides, as `(path, (size, mtime ns))` when it read them (`read_stamps`: a stamp taken now
        would pass off a file changed since as the one checked), and found no file at the paths `absent` (an
        import's L120: one appearing there changes them). A file read without a stamp leaves nothing recorded."""
        if self.path is None or len(text) > MAX_BYTES:  # LINNET_NO_CACHE (no start reads it), or too big to keep
            return
        stamps = tuple(read)
        if any(stamp is None for _, stamp in stamps):
            self.entries.pop(doc_path, None)
            return
        stamps += tuple((file, None) for file in absent)  # as the analysis found them: no file there
        with contextlib.suppress(Exception):  # what pickle cannot take is checked first next time
            entry = (text, settings, stamps, pickle.dumps(diagnostics, protocol=pickle.HIGHEST_PROTOCOL))
            if self.entries.get(doc_path) != entry:
                self.entries.pop(doc_path, None)
                self.entries[doc_path] = entry
                self.changed = True

    def save(self) -> None:
        """Write the entries, newest first up to `MAX_BYTES`, when one changed. Atomic: a server starting meanwhile
        reads the old file or the new one."""
        if self.path is None or not self.changed:
            return
        self.changed = False
        kept, size = {}, 0
        for doc_path, entry in reversed(list(self.entries.items())):
            if size + len(entry[0]) + len(entry[3]) <= MAX_BYTES:  # a document too big for the file is not kept
                kept[doc_path] = entry
                size += len(entry[0]) + len(entry[3])
        entries = dict(reversed(list(kept.items())))
        write_table(self.path, "code", self.code, "entries", entries)
