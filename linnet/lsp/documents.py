"""Open documents and their analyses, and the server's settings.

The client's text (`OpenDocument.text`, `.version`) changes on the event loop as
notifications arrive. The front end's incremental `Document`s live in one `Workspace` (open
documents with the text of their last analysis, and the files they import, read from disk).
A document's `Document` is touched only by its own `OpenDocument.analyzed()`, in a worker
thread, under the document's lock and the workspace's: while one analysis runs, the server
keeps reading, and every edit that arrives meanwhile is folded into the next analysis (bursts
coalesce with no fixed delay). A result whose version is no longer the client's, or that read
an imported file that has changed since, is never published.

A request reads its document's analysis on the event loop, and through it the items of the files it imports,
which their own analyses change in place in a worker thread (an imported file open in the editor, typed in).
`analyzed` and `reading` hold the workspace's `editing` lock while the request reads (semantics/workspace.py):
an update of an imported file waits for the read, and the read waits at most for one update's change (its parse
is done before), never for an analysis; an analysis whose imported files changed meanwhile is made again first,
as for a request that came after the change.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable

from lsprotocol import types as T

from linnet.semantics.pausing import pausing_with
from linnet.semantics.program import Analysis, Workspace, std_library
from linnet.syntax.positions import LineIndex

from .convert import offset_at, path_of
from .priority import RequestsFirst

# how often a read asks again for the workspace's `editing` lock while an update's change holds it (a few ms at most)
READ_WAIT_S = 0.001


@dataclass
class Settings:
    """`linnet.*` settings (docs/editors.md).

    preset: the preset whose numbers hover, hints and diagnostics quote (None: the first).
    inlay_shapes: show shapes after `let` bindings and call results.
    inlay_max_length: the longest hint in characters; longer ones end in `…`.
    inlay_parameters: show the parameters each submodule member holds (off by default: the first
        hints after an edit lower the model).
    interpreter: the Python that runs entries (None: the server's own).
    weights: preset name -> the checkpoint its headers are checked against (a folder, a .gguf file or an
        embedded id; a relative path is taken from the first workspace folder); it wins over `@weights(...)`.
    """

    preset: str | None = None
    inlay_shapes: bool = True
    inlay_max_length: int = 40
    inlay_parameters: bool = False
    interpreter: str | None = None
    weights: dict[str, str] = field(default_factory=dict)

    def update(self, values: Any) -> None:
        """Apply a `linnet` settings object (initializationOptions, workspace/configuration or
        didChangeConfiguration); unknown or ill-typed values are ignored."""
        if not isinstance(values, dict):
            return
        if "linnet" in values and isinstance(values["linnet"], dict):
            values = values["linnet"]
        if "preset" in values:
            self.preset = values["preset"] if isinstance(values["preset"], str) and values["preset"] else None
        hints = values.get("inlayHints")
        if isinstance(hints, dict):
            if isinstance(hints.get("shapes"), bool):
                self.inlay_shapes = hints["shapes"]
            if isinstance(hints.get("maxLength"), int) and hints["maxLength"] > 0:
                self.inlay_max_length = hints["maxLength"]
            if isinstance(hints.get("parameters"), bool):
                self.inlay_parameters = hints["parameters"]
        if "interpreter" in values:
            value = values["interpreter"]
            self.interpreter = value if isinstance(value, str) and value else None
        if "weights" in values:
            value = values["weights"]
            pairs = value.items() if isinstance(value, dict) else ()
            self.weights = {k: v for k, v in pairs if isinstance(k, str) and isinstance(v, str) and v}


class StagedAnswers:
    """The requests about a document being answered from the first stage of its check (`OpenDocument.analyzed(staged=
    True)`) whose answers are not written yet. The rest of the check waits for them (`wait`): started first, its
    thread took the GIL from the event loop while the loop wrote those answers (traced during bursts on the 3,000-line
    file, busy machine: a median 5 ms between a completion's answer and its write, 0.3 ms in pauses)."""

    def __init__(self) -> None:
        self.count = 0
        self._idle: asyncio.Event | None = None

    def begin(self) -> Callable[[], None]:
        """Count one request; returns what ends it (call it once)."""
        self.count += 1

        def end() -> None:
            self.count -= 1
            if self.count == 0 and self._idle is not None:
                self._idle.set()

        return end

    async def wait(self) -> bool:
        """Until no request is counted; whether one was."""
        waited = False
        while self.count:
            waited = True
            self._idle = self._idle or asyncio.Event()
            self._idle.clear()
            await self._idle.wait()
        return waited


class DocumentClosed(Exception):
    """A request about a buffer the editor closed while the request waited (`OpenDocument.analyzed`): its answer is
    the request's default, made without checking the closed text, which no editor shows (from nothing, under the
    workspace's lock: seconds of every other document's requests on a 5 MB file)."""


@dataclass
class OpenDocument:
    """A document the client has open: its latest text and the analysis of some version."""

    uri: str
    text: str
    version: int
    workspace: Workspace = field(default_factory=Workspace)
    path: str = ""
    files: list[str] = field(default_factory=list)  # what its last analysis read: itself, then its imports
    absent: list[str] = field(default_factory=list)  # where its imports found no file (L120): one may appear
    notified_version: int = 0  # the text version its importers were last re-checked for
    _analysis: Analysis | None = None
    _analysis_key: tuple | None = None  # (revision, preset, stamp of the imported files)
    _first: tuple | None = None  # (key as above, the first stage of a staged analysis: `check_first`)
    revision: int = 0  # counts text changes: a save with text, or a client reusing a version, still re-analyses
    # the workspace's token for its path when it was opened (`Workspace.opening`)
    opened: int = field(default=0, init=False)
    # the editor closed this buffer (its URI: `Documents.close`); `closed` is of its path, which another buffer of the
    # same file, open under another URI (`sub/../x.linnet`), shares and keeps open
    dropped: bool = field(default=False, init=False)
    _index: LineIndex | None = None
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    diagnose_task: asyncio.Task | None = None
    staged_answers: StagedAnswers = field(default_factory=StagedAnswers)
    requests: RequestsFirst = field(default_factory=RequestsFirst)  # the server's: its checks wait for requests

    def __post_init__(self) -> None:
        self.path = path_of(self.uri)
        # once the editor closes it, a check of its text still due reads a document of its own, not the workspace's
        # (the file's buffer opened since, or the file on disk: what other files import)
        self.opened = self.workspace.opening(self.path)

    @property
    def index(self) -> LineIndex:
        """The line index of the client's current text (for positions in requests)."""
        if self._index is None or self._index.text is not self.text:
            self._index = LineIndex(self.text)
        return self._index

    def apply_changes(self, changes: list, version: int) -> None:
        """Apply didChange content changes in order (ranged or whole-text)."""
        text, index = self.text, self.index
        for change in changes:
            if isinstance(change, T.TextDocumentContentChangePartial) and change.range is not None:
                index = index if index is not None else LineIndex(text)
                start = offset_at(index, change.range.start)
                end = offset_at(index, change.range.end)
                if end < start:
                    start, end = end, start
                text = text[:start] + change.text + text[end:]
                index = index.edited(text, start, end, start + len(change.text))  # (a new one took 0.6 ms of 3k lines)
            else:
                text, index = change.text, None
        self.text = text
        self._index = index
        self.version = version
        self.revision += 1

    def replace_text(self, text: str) -> None:
        """The whole text, as a didSave with `includeText` sends it, keeping the version."""
        if text != self.text:
            self.text = text
            self.revision += 1

    def _analyze(self, text: str, preset: str | None) -> tuple[Analysis, tuple]:
        with self.workspace.lock, pausing_with(self._pause):
            analysis = self.workspace.open(self.path, text, since=self.opened).analyze(preset)
            return analysis, self.workspace.stamp(analysis.files[1:] + analysis.absent_files)

    def _pause(self) -> None:
        """(The full check's pause points, in its worker thread.) Stop the check of a buffer the editor closed
        (`dropped`; DocumentClosed: its check holds the workspace's lock, which every other document's check waits
        for: up to the rest of a 5 MB file's 20 s), else let requests go first (`priority.RequestsFirst.wait`). A
        check stopped so leaves nothing that another reads: its document is no longer the workspace's
        (`Workspace.close`), or was one of its own (`Workspace.open(since=...)`), and its context is lent to no other
        document."""
        if self.dropped:
            raise DocumentClosed(self.path)
        self.requests.wait()

    def _analyze_first(self, text: str, preset: str | None) -> tuple[Analysis | None, tuple]:
        with self.workspace.lock:
            analysis = self.workspace.open(self.path, text, since=self.opened).analyze_first(preset)
            if analysis is None:
                return None, ()
            return analysis, self.workspace.stamp(analysis.files[1:] + analysis.absent_files)

    async def check_first(self, preset: str | None) -> None:
        """The first stage of the current text's analysis (`Document.analyze_first`: after an edit inside one
        function body, that module checked under `preset`'s binding only, the rest taken from the last analysis),
        kept for `analyzed(staged=True)`: a request reads it while the rest is checked. Nothing when the analysis
        of the current text is there, or when the change since the last analysis is not such an edit."""
        async with self._lock:
            if self.closed:
                return  # (its check would start from nothing, in a document of its own: `Workspace.open`'s `since`)
            key = (self.revision, preset, self.workspace.stamp(self.depends_on))
            last = self._analysis_key
            if last is None or last == key or last[1:] != key[1:] or (self._first and self._first[0] == key):
                return  # (no analysis to start from, the current one is there, or imports or preset changed)
            revision = self.revision
            analysis, stamp = await asyncio.to_thread(self._analyze_first, self.text, preset)
            self._first = ((revision, preset, stamp), analysis) if analysis is not None else None

    @property
    def closed(self) -> bool:
        """Whether the editor closed this buffer: the workspace's text of its path is another's since (the buffer of
        the file opened again, or the file on disk)."""
        return self.workspace.opening(self.path) != self.opened

    @property
    def text_version(self) -> int:
        """The version of the text the workspace holds for this document (its last analysis)."""
        doc = self._analysis.document if self._analysis is not None else None
        return doc.version if doc is not None else 0

    @contextlib.asynccontextmanager
    async def analyzed(self, preset: str | None, staged: bool = False) -> AsyncIterator[Analysis]:
        """The analysis of the current text (and of the current text of what it imports) under
        `preset`, held for the `async with` block: offsets and items stay valid until it ends
        (the next analysis moves items). `staged`: the first stage of the current text's analysis will do while
        the full one is not there (`check_first`), read without waiting for the rest of the check: that reads the
        same text (the document's items stay as they are) and writes other objects. Its `partial` item has one
        binding's check: a query that needs more raises PartialAnalysis, and asks again without `staged`.
        Raises DocumentClosed when the editor closed the buffer and its current text has no analysis."""
        if staged:
            view = self._staged_view(preset)
            if view is None and self._lock.locked():
                with self.requests.waiting():
                    async with self._lock:  # the first stage may be running: wait for it, not for the whole check
                        pass
                view = self._staged_view(preset)
            if view is not None:
                async with self.reading():
                    # (else an imported file changed, or the document moved on: the full analysis)
                    if self._staged_view(preset) is view and view.holds_text():
                        yield view
                        return
        with self.requests.waiting():  # (the checks this waits for go on)
            await self._lock.acquire()
        try:
            while True:
                key = (self.revision, preset, self.workspace.stamp(self.depends_on))
                if self._analysis is None or self._analysis_key != key:
                    if self.dropped:
                        raise DocumentClosed(self.path)
                    revision, text = self.revision, self.text
                    with self.requests.waiting():
                        self._analysis, stamp = await asyncio.to_thread(self._analyze, text, preset)
                    self.files, self.absent = self._analysis.files, self._analysis.absent_files
                    self._analysis_key = (revision, preset, stamp)
                    self._first = None
                async with self.reading():
                    # the files it read as it read them (one it imports may have changed while it was made, or
                    # while this waited for the lock: then it is made again); the client's text may be newer
                    if self._analysis_key[2] == self.workspace.stamp(self.depends_on) and self._analysis.holds_text():
                        yield self._analysis
                        return
                    if not self._analysis.holds_text():
                        # the workspace's document was updated to another text after this analysis: another buffer
                        # of the same file, open under another URI (`sub/../x.linnet`), was checked meanwhile; its
                        # items moved, so it is made again (tests/lsp/test_closed_buffer.py)
                        self._analysis = None
        finally:
            self._lock.release()

    @contextlib.asynccontextmanager
    async def reading(self) -> AsyncIterator[None]:
        """Hold the workspace's `editing` lock for a read of analyses on the event loop (see the module docstring):
        no document's text or items change until the block ends, which must not await (an update waiting for the
        lock holds the workspace's analysis lock). Waits for the lock without blocking the event loop."""
        editing = self.workspace.editing
        while not editing.acquire(blocking=False):
            await asyncio.sleep(READ_WAIT_S)
        try:
            yield
        finally:
            editing.release()

    def _staged_view(self, preset: str | None) -> Analysis | None:
        """The first stage of the current text's analysis under `preset` (`check_first`) when it is there and the
        full analysis is not."""
        first = self._first
        if first is None or self._analysis_key == first[0]:
            return None
        return first[1] if first[0] == (self.revision, preset, self.workspace.stamp(self.depends_on)) else None

    def is_current(self, analysis: Analysis) -> bool:
        """Whether `analysis` is of the client's current text and of the current text of what
        it imports."""
        key = self._analysis_key
        return (
            analysis is self._analysis
            and key is not None
            and key[0] == self.revision
            and key[2] == self.workspace.stamp(self.depends_on)
        )

    @property
    def depends_on(self) -> list[str]:
        """The paths besides its own whose change changes its last analysis: the files it read, and those its
        imports looked for and did not find."""
        return self.files[1:] + self.absent


class Documents:
    """The open documents by URI, and the workspace their analyses share."""

    def __init__(self) -> None:
        self.by_uri: dict[str, OpenDocument] = {}
        self.workspace = Workspace()
        self.requests = RequestsFirst()  # every document's checks wait for the requests being answered

    def open(self, uri: str, text: str, version: int) -> OpenDocument:
        if uri in self.by_uri:  # opened again without a close: the first buffer's checks still due are its own
            self.close(uri)
        doc = OpenDocument(uri, text, version, self.workspace, requests=self.requests)
        self.by_uri[uri] = doc
        return doc

    def get(self, uri: str) -> OpenDocument | None:
        return self.by_uri.get(uri)

    def is_std(self, path: str) -> bool:
        """Whether `path` is a standard-library file, the one installed with Linnet that every
        file reads (an edit there would change every model, and is never what an import sees)."""
        key = self.workspace.key(path)
        return any(self.workspace.key(p) == key for p in std_library().paths())

    def close(self, uri: str) -> OpenDocument | None:
        """Forget a document; the files that import it now read it from disk."""
        doc = self.by_uri.pop(uri, None)
        if doc is not None:
            doc.dropped = True  # (its check still under way stops at its next pause point: `OpenDocument._pause`)
            self.workspace.close(doc.path)
        return doc

    def importers(self, path: str) -> list[OpenDocument]:
        """Open documents whose last analysis read the file at `path` (they import it,
        directly or through other files) or looked for it and found none."""
        key = self.workspace.key(path)
        return [
            d
            for d in self.by_uri.values()
            if d.path != path and any(self.workspace.key(f) == key for f in d.depends_on)
        ]

    def __iter__(self):
        return iter(list(self.by_uri.values()))
