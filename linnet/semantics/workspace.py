"""The files one session can reach, by path: the project layer under imports.

A `Workspace` holds one `Document` per file. Some have their text given (the files a CLI
command names, the buffers an editor has open: `open`); the others are read from disk when
an import names them (`get`), and read again when their modification time changes. Every
analysis of a document in the workspace sees the others' current text, so an importer's
diagnostics follow an edit of the file it imports, and each file's incremental caches are
kept across analyses.

Documents are keyed by their absolute path; a document keeps the path it was first given
(relative paths stay relative, so diagnostics print them as the user wrote them).

Analyses of documents that share a workspace must not run at the same time (the language
server analyses in worker threads): hold `lock` around `open`, `get`, `Document.update` and
`analyze`. `file_changed`, `stamp`, `loaded`, `opening` and `close` may be called without it.

An editor closes a buffer on the language server's event loop while a check of it may still be due, in a worker
thread (and may open the file again, and type in it, before that check runs): `open(path, text, since=...)` with
the token `opening` gave when the buffer was opened makes a closed buffer's late check read a document of its own,
so that it never writes the text the workspace holds for the path (the buffer opened since, or the file on disk).

What an analysis holds leads to other documents' items (an importer's names of what it imports), which an
analysis of those documents changes in place (`Document.update`: the text, the items' offsets, a module's
edited body). A reader on another thread than the analyses (the language server's requests, on its event loop)
holds `editing` while it reads: each update makes its change under it, after parsing, so the reader sees every
document as of one text, and waits at most for one update's change, never for an analysis.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING

from ..syntax.sources import NotUtf8, read_source_text
from .pausing import not_pausing

if TYPE_CHECKING:
    from .program import Document

MAX_SOURCE_BYTES = 16 * 2**20  # an import of anything larger is refused, not read (a checkpoint, say)


class Workspace:
    """Documents by path; see the module docstring."""

    def __init__(self, texts: dict[str, str] | None = None) -> None:
        """`texts`: the texts of files to read instead of the disk's, by path (an editor's unsaved buffers, for
        what the language server lowers and runs), each taken as given when an import first names it."""
        self._texts = {self.key(path): text for path, text in (texts or {}).items()}
        self._given: dict[str, Document] = {}
        self._disk: dict[str, tuple[tuple[int, int], Document]] = {}
        self._problems: dict[str, str] = {}
        self._stale: set[str] = set()  # files reported changed on disk: read again
        self._changes: dict[str, int] = {}  # per file, how often it was reported changed
        self._closes: dict[str, int] = {}  # per file, how often its given text was closed (`opening`)
        self._registry = threading.Lock()  # `open`'s registration of a given text, against `close` on another thread
        self.lock = threading.RLock()
        self.editing = threading.RLock()  # held while a document's text and items change (see the module docstring)

    @staticmethod
    def key(path: str) -> str:
        """The key of a path: absolute and normalised (`a/../b.linnet` is `b.linnet`)."""
        return os.path.normcase(os.path.abspath(path))

    # ----- documents whose text is given
    def open(self, path: str, text: str, since: int | None = None) -> Document:
        """The document at `path` with `text` (an editor's buffer, a file the CLI was given);
        it wins over the file on disk until `close`. Creates it, or updates its text.

        `since`: the token `opening(path)` gave when the buffer whose text this is was opened. When `path` was
        closed after that (the buffer's check was due when the editor closed it), `text` is not the workspace's: the
        document returned is one of its own, which no other document reads, and the workspace's stays as it is."""
        from .program import Document  # program imports this module

        key = self.key(path)
        # a `close` meanwhile comes before the check below, or after the registration; no pause point under the lock
        # (a document made empty parses one empty item): a pause lets the editor's didClose, which takes it, go first
        with self._registry, not_pausing():
            closed = since is not None and self._closes.get(key, 0) != since
            doc = None if closed else self._given.get(key)
            if doc is None and not closed:
                cached = self._disk.pop(key, None)
                # (made empty, not parsed under the lock: its text is set below, as for a document that had one)
                doc = cached[1] if cached is not None else Document(path, "", workspace=self, given=False)
                self._given[key] = doc
        if doc is None:
            return Document(path, text, workspace=self, given=False)
        if doc.text != text:
            doc.update(text)
        return doc

    def opening(self, path: str) -> int:
        """A token for `open(path, text, since=...)`: the buffer of `path` opened now gives its text until `close`."""
        return self._closes.get(self.key(path), 0)

    def add(self, doc: Document) -> None:
        """Register a document made with this workspace as one whose text is given."""
        self._given[self.key(doc.source.path)] = doc

    def close(self, path: str) -> None:
        """Forget the given text of `path`: from now on the file on disk is what others see."""
        key = self.key(path)
        with self._registry:
            self._closes[key] = self._closes.get(key, 0) + 1  # (also when its first check has not registered it yet)
            if self._given.pop(key, None) is not None:
                self._changes[key] = self._changes.get(key, 0) + 1

    def is_open(self, path: str) -> bool:
        return self.key(path) in self._given

    # ----- any document
    def get(self, path: str) -> Document | None:
        """The document at `path`: given text first, else the file on disk (read again when it
        changed). None when there is neither; `problem(path)` then says why."""
        key = self.key(path)
        doc = self._given.get(key)
        if doc is not None:
            return doc
        if key in self._texts:
            return self.open(path, self._texts.pop(key))
        return self._read(path, key)

    def loaded(self, path: str) -> Document | None:
        """The document at `path` as an analysis last saw it (given text first, else the file as last read), or None:
        `get` without reading anything."""
        key = self.key(path)
        doc = self._given.get(key)
        if doc is None:
            cached = self._disk.get(key)
            doc = cached[1] if cached is not None else None
        return doc

    def problem(self, path: str) -> str | None:
        """Why the last `get(path)` found nothing: "no such file", "not UTF-8 text", ..."""
        return self._problems.get(self.key(path))

    def file_changed(self, path: str) -> None:
        """A file changed on disk (or was created or deleted): read it again when next needed
        (a file is also read again when its modification time or size changes)."""
        key = self.key(path)
        self._stale.add(key)
        self._changes[key] = self._changes.get(key, 0) + 1

    def stamp(self, paths: list[str]) -> tuple:
        """What changes when one of `paths` changes (its text, or a report that it changed on
        disk), without reading anything: a cache of analyses keys on it."""
        out = []
        for path in paths:
            key = self.key(path)
            doc = self._given.get(key)
            cached = self._disk.get(key) if doc is None else None
            if cached is not None:
                doc = cached[1]
            out.append(
                (key, doc is not None and key in self._given, doc.version if doc else -1, self._changes.get(key))
            )
        return tuple(out)

    def read_stamp(self, path: str) -> tuple[int, int] | None:
        """(size, modification time in ns) the file at `path` had when the text its document holds was read from
        disk (taken before reading it: a change while it was read shows as another stamp); None when its text is
        given (open) or it was not read."""
        cached = self._disk.get(self.key(path))
        return (cached[0][1], cached[0][0]) if cached is not None else None

    def documents(self) -> list[Document]:
        """Every document loaded: given ones first, then those read from disk."""
        return list(self._given.values()) + [doc for _, doc in self._disk.values()]

    def _read(self, path: str, key: str) -> Document | None:
        from .program import Document  # program imports this module

        try:
            st = os.stat(key)
        except OSError as err:
            return self._missing(key, "no such file" if isinstance(err, FileNotFoundError) else err.strerror)
        if not os.path.isfile(key):
            return self._missing(key, "not a file")
        if st.st_size > MAX_SOURCE_BYTES:
            limit = f"{MAX_SOURCE_BYTES:,} at most"
            return self._missing(key, f"{st.st_size:,} bytes is more than a Linnet source ({limit})")
        stamp = (st.st_mtime_ns, st.st_size)
        cached = self._disk.get(key)
        if cached is not None and cached[0] == stamp and key not in self._stale:
            return cached[1]
        self._stale.discard(key)
        try:
            text = read_source_text(key)
        except NotUtf8 as err:
            return self._missing(key, str(err))
        except OSError as err:
            return self._missing(key, err.strerror or str(err))
        self._problems.pop(key, None)
        if cached is not None:
            doc = cached[1]
            doc.update(text)
        else:
            doc = Document(path, text, workspace=self, given=False)
        self._disk[key] = (stamp, doc)
        return doc

    def _missing(self, key: str, problem: str) -> None:
        self._disk.pop(key, None)
        self._stale.discard(key)
        self._problems[key] = problem
        return None
