"""The Linnet language server (pygls 2 over stdio): `linnet lsp`.

Each feature is a small function in its own module (`hover`, `hints`, `navigation`,
`symbols`, `completion`, `tokens`, `views`); this module wires them to LSP methods. Every
handler runs under `guarded`: an exception in a feature is logged to the client and answered
with nothing, so no request can take the server down. The server never imports torch, jax or
onnxruntime (runs and StableHLO/ONNX views go to a worker process; `views.py`).

Names of custom requests, commands and settings: docs/editors.md (the design's "Language server
contract", plus `linnet/presets`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import inspect
import json
import logging
import os
import sys
import threading
import traceback
import uuid
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from lsprotocol import types as T
from pygls.exceptions import FeatureRequestError, JsonRpcException, JsonRpcInvalidParams
from pygls.io_ import StdoutWriter, run_async
from pygls.lsp.server import LanguageServer
from pygls.protocol import LanguageServerProtocol, default_converter
from pygls.protocol.language_server import lsp_method

from linnet import __version__
from linnet.semantics.pausing import pausing_with
from linnet.semantics.program import Analysis, PartialAnalysis
from linnet.syntax import ast as A
from linnet.syntax.fmt import FormatError, format_source
from linnet.syntax.items import names_after, split_items

from . import compare as compare_
from . import completion as completion_
from . import diff as diff_
from . import hints as hints_
from . import navigation, priority, symbols, views
from .collector import IdleCollector
from .convert import (
    lsp_diagnostic,
    lsp_location,
    lsp_range,
    markup,
    offset_at,
    path_of,
    position_encoding,
    published_diagnostics,
    range_of_offsets,
    set_position_encoding,
    uri_of,
)
from .documents import DocumentClosed, Documents, OpenDocument, Settings
from .hover import hover_markdown
from .import_completion import import_completions
from .published import read_stamps
from .rpc import (
    AnswerEveryRequest,
    FramedReader,
    OneLineReaderErrors,
    PrefetchingStdin,
    raised_by_json_decoder,
    refusal,
    strict_scalars,
    warm_converters,
)
from .tokens import TOKEN_MODIFIERS, TOKEN_TYPES, semantic_tokens
from .weights import WeightChecks

if TYPE_CHECKING:
    from .startup import StartCaches

log = logging.getLogger("linnet.lsp")

SHOW_IR = "linnet/showIR"
SHOW_GENERATED = "linnet/showGenerated"
PRESETS = "linnet/presets"
BACKENDS = "linnet/backends"
RUN_COMMAND = "linnet.run"
COMPARE_COMMAND = "linnet.compare"
SELECT_PRESET_COMMAND = "linnet.selectPreset"
LENS_BACKENDS = ("torch", "xla")  # registry names; a client lists the rest with `linnet/backends`
# A file this long gets its first diagnostics in two steps when it is opened: the items that start in its first
# FIRST_LINES lines (what an editor shows on opening it) are checked and published first, then everything.
PROGRESSIVE_LINES = 1000
# the messages that start a pause in typing again (linnet/lsp/collector.py)
TEXT_CHANGES = frozenset(
    (T.TEXT_DOCUMENT_DID_OPEN, T.TEXT_DOCUMENT_DID_CHANGE, T.TEXT_DOCUMENT_DID_SAVE, T.TEXT_DOCUMENT_DID_CLOSE)
)
FIRST_LINES = 150
# How long a thread holding the GIL keeps it when another wants it (CPython's default: 5 ms). A check runs in a worker
# thread; a request is read by a reader thread, dispatched and answered on the event loop, and each of those steps
# waited up to the whole interval for the check's thread (traced in the server during bursts of typing: a hover sent
# while a keystroke's check ran arrived 15-25 ms later, after the check had ended)
SWITCH_INTERVAL_S = 0.0005


class LinnetProtocol(AnswerEveryRequest, LanguageServerProtocol):
    """pygls's protocol without its own copy of open documents: `LinnetServer.documents` holds
    the text, and keeping pygls's workspace in step too cost ~5 ms per edit of a 5,000-line
    file (and raised on a change to a document never opened). Every request is answered, a
    malformed one with InvalidParams (`rpc.AnswerEveryRequest`)."""

    def handle_message(self, message):
        if getattr(message, "method", None) in TEXT_CHANGES:
            # typing ends a pause; requests do not (a client that asks for hovers or completions every few hundred
            # milliseconds would otherwise postpone every collection, and garbage grew with every edit)
            self._server.collector.activity()
        else:
            self._server.collector.request_seen()  # a pause when none is due: a client that only asks has one too
        return super().handle_message(message)

    def _user_handler(self, method: str, params):
        if (handler := self.fm.features.get(method)) is not None:
            yield handler, (params,), None

    @lsp_method(T.TEXT_DOCUMENT_DID_OPEN)
    def lsp_text_document__did_open(self, params: T.DidOpenTextDocumentParams):
        yield from self._user_handler(T.TEXT_DOCUMENT_DID_OPEN, params)

    @lsp_method(T.TEXT_DOCUMENT_DID_CHANGE)
    def lsp_text_document__did_change(self, params: T.DidChangeTextDocumentParams):
        yield from self._user_handler(T.TEXT_DOCUMENT_DID_CHANGE, params)

    @lsp_method(T.TEXT_DOCUMENT_DID_CLOSE)
    def lsp_text_document__did_close(self, params: T.DidCloseTextDocumentParams):
        yield from self._user_handler(T.TEXT_DOCUMENT_DID_CLOSE, params)

    @lsp_method(T.SHUTDOWN)
    def lsp_shutdown(self, *args):
        """pygls's shutdown, cancelling the requests in flight over a copy of `_request_futures`: a command's future
        (workspace/executeCommand: a run, a comparison, a preset being picked) drops itself from the dict as it is
        cancelled, and pygls's loop over the dict itself raised RuntimeError, answering shutdown with
        InternalError and a traceback (pygls issue #606)."""
        if (handler := self.fm.features.get(T.SHUTDOWN)) is not None:
            yield handler, args, None
        for msg_id, future in list(self._request_futures.items()):
            if msg_id != self.msg_id and not future.done():
                future.cancel()
        self._shutdown = True


class LinnetServer(LanguageServer):
    """The server's state: open documents, settings, workspace roots."""

    def __init__(self) -> None:
        super().__init__(
            "linnet",
            __version__,
            text_document_sync_kind=T.TextDocumentSyncKind.Incremental,
            protocol_cls=LinnetProtocol,
            converter_factory=lambda: strict_scalars(default_converter()),
        )
        self.documents = Documents()
        self.settings = Settings()
        self.roots: list[str] = []
        self.weight_checks = WeightChecks()  # checkpoint headers against the presets' weights (linnet/lsp/weights.py)
        # uri -> (the text it ran on, its diagnostics) of the last `linnet.diff` / `linnet.verify` (linnet/lsp/diff.py)
        self.lens_results: dict[str, dict[str, tuple[str, list[T.Diagnostic]]]] = {}
        self._workspace_items: dict[str, tuple[float, list]] = {}
        # pygls keeps a future per request in flight (both ways) in `_request_futures` until its answer is written
        self.collector = IdleCollector(busy=self.checking, answering=lambda: bool(self.protocol._request_futures))
        # uri -> (revision, the first pass over a big file just opened: `_check_first_items`)
        self.first_items: dict[str, tuple[int, asyncio.Future]] = {}
        self.start_caches: StartCaches | None = None  # the start's caches until typing begins (linnet/lsp/startup.py)
        self.converters_warmed = False  # `rpc.warm_converters`, run once after the first publish

    def _start_io_async(self, stdin=None, stdout=None):
        """pygls's stdio loop (`LanguageServer.start_io`) reading through `rpc.FramedReader`."""
        self._stop_event = threading.Event()
        stdin_reader = PrefetchingStdin(stdin or sys.stdin.buffer, self.documents.requests)
        reader = FramedReader(stdin_reader, self.protocol.answer_unframed)
        self.protocol.set_writer(StdoutWriter(stdout or sys.stdout.buffer))
        try:
            asyncio.run(
                run_async(
                    stop_event=self._stop_event,
                    reader=reader,
                    protocol=self.protocol,
                    logger=logging.getLogger("pygls.server"),
                    error_handler=self.report_server_error,
                )
            )
        except BrokenPipeError:
            log.error("the connection to the client is lost")
        except (KeyboardInterrupt, SystemExit):
            pass
        finally:
            self.shutdown()

    def report_server_error(self, error: Exception, source) -> None:
        """Errors outside our handlers (a notification pygls's own workspace rejects, such as a
        didChange for a document never opened, or params it cannot read) go to the log, not
        to a pop-up. A request's error already went back as its response."""
        if source is FeatureRequestError:
            return
        unreadable = source is JsonRpcException and raised_by_json_decoder(error)  # (the reader loop's json.loads)
        if isinstance(error, (json.JSONDecodeError, UnicodeDecodeError)) or unreadable:
            # a body that is not JSON, or JSON the decoder cannot take (too deep, a number too long for `int`)
            self.protocol.answer_unreadable(error)
            return
        self.log_error(f"pygls ({getattr(source, '__name__', source)})", error)

    # ----- helpers shared by handlers
    def log_error(self, what: str, err: BaseException) -> None:
        text = f"linnet: {what} failed: {type(err).__name__}: {err}\n{''.join(traceback.format_exception(err))}"
        log.error(text)
        try:
            self.window_log_message(T.LogMessageParams(T.MessageType.Error, text))
        except Exception:  # noqa: BLE001 - the connection may be gone
            pass

    def client_supports(self, *path: str) -> bool:
        node: Any = self.client_capabilities
        for name in path:
            node = getattr(node, name, None)
            if node is None:
                return False
        return bool(node)

    def client_format(self, *path: str) -> list | None:
        """The markup kinds the client accepts for a text document feature, most preferred
        first (`client_format("hover", "content_format")`), or None when it does not say."""
        node: Any = getattr(self.client_capabilities, "text_document", None)
        for name in path:
            node = getattr(node, name, None)
        return list(node) if node else None

    def preset_for(self, analysis: Analysis) -> str | None:
        """The selected preset if this document declares it, else None (the first preset)."""
        preset = self.settings.preset
        return preset if preset in analysis.declared_presets else None

    def effective_preset(self, analysis: Analysis) -> str | None:
        """The preset hover and hints quote, named: the selected one if declared here, else the
        file's first (checked) preset, else None (the config defaults). Runs and views use it,
        so what runs is what the editor shows."""
        return self.preset_for(analysis) or (analysis.presets[0] if analysis.presets else None)

    def checking(self) -> bool:
        """Whether a document's check is running or due."""
        return any(d.diagnose_task is not None and not d.diagnose_task.done() for d in self.documents)

    def schedule_diagnostics(self, doc: OpenDocument) -> None:
        if doc.diagnose_task is None or doc.diagnose_task.done():
            doc.diagnose_task = asyncio.ensure_future(self._diagnose(doc))

    async def _diagnose(self, doc: OpenDocument) -> None:
        """Analyse the latest text and publish, until what was analysed is still the client's
        version when done: edits that arrive during an analysis fold into the next one, and a
        stale result is never published."""
        try:
            early = self._publish_as_before(doc)
            if doc.text_version == 0 and len(doc.index.line_starts) >= PROGRESSIVE_LINES:
                first = asyncio.ensure_future(self._check_first_items(doc, publish=early is None))
                self.first_items[doc.uri] = (doc.revision, first)
                await first
            while self.documents.get(doc.uri) is doc:
                preset = self.settings.preset
                try:  # what a completion or hover sent with the keystroke reads, while the rest is checked
                    await doc.check_first(preset)
                except Exception as err:  # noqa: BLE001 - the full check below still runs, and reports
                    self.log_error("the first stage of a check", err)
                # what the first stage answers goes out before the rest takes the GIL, and is read: the client,
                # woken by the answer on this CPU, would wait for the check's time slice
                if await doc.staged_answers.wait():
                    await asyncio.sleep(priority.ANSWER_READ_S)
                if self.documents.get(doc.uri) is not doc:
                    return  # closed while its first stage ran: no check of a buffer no editor shows
                async with doc.analyzed(preset) as analysis:
                    if not doc.is_current(analysis):
                        continue
                    version, revision = doc.version, doc.revision
                    found = published_diagnostics(analysis.diagnostics, doc.path)
                    diagnostics = found + self.weight_checks.diagnostics(self, doc, analysis)
                    for text, lens_found in self.lens_results.get(doc.uri, {}).values():
                        diagnostics += lens_found if text == doc.text else []  # an edit makes a diff's result stale
                    given = any(s[1] for s in doc.workspace.stamp(analysis.files[1:]))  # an import open in the editor
                    absent = analysis.absent_files  # (read under the analysis's lock: items of the files it read)
                    read = read_stamps(doc.workspace, analysis.files[1:])  # as the analysis read them
                    if not doc.is_current(analysis):  # an import read again meanwhile (in a worker thread)
                        read = [(file, None) for file, _ in read]  # (its stamp may be of a newer text): not kept
                if self.documents.get(doc.uri) is not doc or revision != doc.revision:
                    continue
                if early is None or revision != 0 or diagnostics != early:  # else published already (the cache)
                    self.text_document_publish_diagnostics(T.PublishDiagnosticsParams(doc.uri, diagnostics, version))
                if self.start_caches is not None and revision == 0:  # a document as opened: the next start reads it
                    if not given:
                        settings = (preset, position_encoding())
                        self.start_caches.published.put(doc.path, doc.text, settings, read, found, absent)
                    self.start_caches.save()
                if doc.text_version != doc.notified_version:  # its importers read this text now
                    doc.notified_version = doc.text_version
                    self.schedule_importers(doc.path)
                self._warm_converters()
                return
        except DocumentClosed:
            return  # closed while this waited for the document's lock
        except Exception as err:  # noqa: BLE001
            self.log_error("diagnostics", err)
        finally:
            self.first_items.pop(doc.uri, None)
            self.collector.check_ended()  # the analysis this one replaced is garbage now: collected once answered

    def _warm_converters(self) -> None:
        """Once, in a worker thread that gives way to requests: the (un)structuring functions of the messages
        typing sends (`rpc.warm_converters`), which the first completion's request and answer took ~27 ms to
        build."""
        if self.converters_warmed:
            return
        self.converters_warmed = True

        def warm() -> None:
            try:
                with pausing_with(self.documents.requests.wait):
                    warm_converters(self.protocol)
            except Exception as err:  # noqa: BLE001 - only the first requests' speed depends on it
                self.log_error("warming the message converters", err)

        asyncio.get_running_loop().run_in_executor(None, warm)

    def _publish_as_before(self, doc: OpenDocument) -> list[T.Diagnostic] | None:
        """A start's first publish of a document as opened: what a previous start published for the same text and
        settings, read from the start's caches (`linnet.lsp.published`), published now, before the check; None when
        there is none (or the document is not as opened, or one of the files it read is open in the editor)."""
        caches = self.start_caches
        if caches is None or doc.revision != 0 or doc.text_version != 0:
            return None
        ws = doc.workspace
        others = {ws.key(d.path) for d in self.documents if d is not doc}
        settings = (self.settings.preset, position_encoding())
        early = caches.published.get(doc.path, doc.text, settings, lambda path: ws.key(path) in others)
        if early is not None:
            self.text_document_publish_diagnostics(T.PublishDiagnosticsParams(doc.uri, early, doc.version))
        return early

    async def _check_first_items(self, doc: OpenDocument, publish: bool = True) -> Analysis | None:
        """The first pass over a big file just opened: parse and check only the items that start in its first
        FIRST_LINES lines, as if the file ended after them, and publish what that found (unless not `publish`: the
        whole file's diagnostics are out already, from the start's caches), so the editor shows something in well
        under the whole check's time (a 5 MB file's parse alone is seconds); the full check follows
        (`_diagnose`) and reuses these items' parses and results. What names an item further down
        (an unknown name there, as far as the first items know) is left for the full check, as are the later
        items' syntax errors and what is never read. Returns the partial analysis (hover answers from it
        meanwhile: `early_analysis`), or None when the text changed under it."""
        text, version, revision, preset = doc.text, doc.version, doc.revision, self.settings.preset
        starts = doc.index.line_starts
        first_end = starts[FIRST_LINES] if len(starts) > FIRST_LINES else len(text)
        later: set[str] = set()

        def check() -> Analysis:
            """(In a worker thread: splitting 5 MB into items took the event loop a second.)"""
            cut = next((offset for offset, _ in split_items(text) if offset >= first_end), len(text))
            later.update(names_after(text, cut))
            with doc.workspace.lock:  # `only` leaves out the unread checks: a later item may read what these do not
                document = doc.workspace.open(doc.path, text[:cut], since=doc.opened)
                return document.analyze(preset, only=lambda item: True)

        analysis = await asyncio.to_thread(check)
        if self.documents.get(doc.uri) is not doc or doc.revision != revision:
            return None
        found = [
            d
            for d in analysis.diagnostics
            if d.location.path != doc.path or text[d.location.start.offset : d.location.end.offset] not in later
        ]
        if publish:
            diagnostics = published_diagnostics(found, doc.path)
            self.text_document_publish_diagnostics(T.PublishDiagnosticsParams(doc.uri, diagnostics, version))
        return analysis

    async def early_analysis(self, doc: OpenDocument, position: T.Position) -> Analysis | None:
        """While a big file's full check runs after the first pass: that pass's analysis, when it checked the
        item at `position` (a hover there need not wait for the whole check); else None."""
        entry = self.first_items.get(doc.uri)
        if entry is None or entry[0] != doc.revision:
            return None
        analysis = await asyncio.shield(entry[1])
        if analysis is None or doc.revision != entry[0]:
            return None
        async with doc.reading():  # (the full check's update of the text may be under way)
            item = analysis.item_at(offset_at(analysis.document.source.index, position))
        return analysis if item is not None and item in analysis.items else None

    def end_start(self) -> None:
        """Typing began: close the start's caches (`start_caches`): what is typed is new text, and what they kept
        would grow with every edit."""
        if self.start_caches is not None:
            self.start_caches.close()
            self.start_caches = None

    def schedule_importers(self, path: str) -> None:
        """Diagnostics again for the open documents that import the file at `path`."""
        for importer in self.documents.importers(path):
            self.schedule_diagnostics(importer)

    async def across(self, home: str, skip: OpenDocument, collect: Callable[[Analysis], list]) -> list:
        """`collect(analysis)` for every document that can name what file `home` defines: open
        documents (but `skip`) and files under the workspace roots that read `home` (itself,
        or importing it, directly or not), and `home` itself. Open documents are analysed as
        usual; the others in a worker thread, one workspace lock held for all of them."""
        out: list = []
        ws = self.documents.workspace
        home_key = ws.key(home)
        for doc in self.documents:
            if doc is skip:
                continue
            with contextlib.suppress(DocumentClosed):  # (closed since the loop began: its file is read from disk)
                async with doc.analyzed(self.settings.preset) as analysis:
                    if home_key in {ws.key(f) for f in analysis.files}:
                        out.extend(collect(analysis))
        open_keys = {ws.key(d.path) for d in self.documents}
        paths = [str(f) for f in symbols.workspace_files(self.roots)] + [home]
        paths = list(dict.fromkeys(p for p in paths if ws.key(p) not in open_keys))

        def on_disk() -> list:
            found: list = []
            with ws.lock:
                for path in paths:
                    doc = ws.get(path)
                    if doc is None:
                        continue
                    analysis = doc.analyze()
                    if home_key in {ws.key(f) for f in analysis.files}:
                        found.extend(collect(analysis))
            return found

        return out + await asyncio.to_thread(on_disk)

    def refresh(self) -> None:
        """After a setting changed: diagnostics again, and ask the client to re-request hints
        and lenses."""
        for doc in self.documents:
            self.schedule_diagnostics(doc)
        if self.client_supports("workspace", "inlay_hint", "refresh_support"):
            self.workspace_inlay_hint_refresh(None)
        if self.client_supports("workspace", "code_lens", "refresh_support"):
            self.workspace_code_lens_refresh(None)

    def text_of(self, path: str) -> str | None:
        """A file's text: the editor's, when it is open, else the file's (None if unreadable)."""
        key = self.documents.workspace.key(path)
        for doc in self.documents:
            if self.documents.workspace.key(doc.path) == key:
                return doc.text
        try:
            with open(path, encoding="utf-8-sig") as f:
                return f.read()
        except (OSError, UnicodeDecodeError):
            return None

    def buffers(self, but: OpenDocument) -> dict[str, str]:
        """The editor's text of every open document but `but`, by path: what a view or a run of `but` reads for
        the files it imports (unsaved edits included), as its diagnostics and hovers do."""
        return {doc.path: doc.text for doc in self.documents if doc is not but}

    def workspace_items(self) -> list[tuple[str, list]]:
        """(path, items) of every `.linnet` file under the workspace roots (parsed once per
        modification time) and of every open document."""
        out = []
        open_paths = {d.path for d in self.documents}
        for f in symbols.workspace_files(self.roots):
            path = str(f)
            if path in open_paths:
                continue
            try:
                mtime = f.stat().st_mtime
                cached = self._workspace_items.get(path)
                if cached is None or cached[0] != mtime:
                    cached = (mtime, symbols.file_items(path, f.read_text(encoding="utf-8")))
                    self._workspace_items[path] = cached
            except (OSError, UnicodeDecodeError):
                continue
            out.append((path, cached[1]))
        for d in self.documents:
            out.append((d.path, symbols.file_items(d.path, d.text)))
        return out


def guarded(default: Any = None):
    """Run a handler; on an exception log it to the client and return `default`. User-facing
    refusals (a rename that cannot be done, a view that cannot be made) are answered as
    `RequestFailed` errors with their message, and JSON-RPC errors (InvalidParams) as they
    are, without a traceback (`rpc.refusal`)."""

    def wrap(fn):
        def failed(ls: LinnetServer, err: Exception):
            if isinstance(err, JsonRpcException):
                raise err
            if isinstance(err, DocumentClosed):
                return default  # (a request the editor no longer waits for: the LSP leaves its answer to the server)
            if isinstance(err, (navigation.RenameError, views.ViewError)):
                raise refusal(str(err)) from err
            ls.log_error(fn.__name__, err)
            return default

        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def run_async(ls: LinnetServer, params):
                try:
                    return await fn(ls, params)
                except Exception as err:  # noqa: BLE001
                    return failed(ls, err)

            return run_async

        # notifications stay synchronous: didOpen/didChange must apply in arrival order
        @functools.wraps(fn)
        def run(ls: LinnetServer, params):
            try:
                return fn(ls, params)
            except Exception as err:  # noqa: BLE001
                return failed(ls, err)

        return run

    return wrap


def document_feature(
    server: LinnetServer, method: str, options: Any = None, default: Any = None, early=False, staged=False
):
    """Register `fn(ls, params, doc, analysis)` for a request about an open document: it runs,
    guarded, with the analysis of the document's current text held for the call; a document
    that is not open gets `default`. `early`: while a big file just opened is checked, a
    request at a position the first pass checked is answered from that pass
    (`LinnetServer.early_analysis`). `staged`: while a keystroke's check runs, answered from its first stage
    when that can answer it as the full analysis would (`OpenDocument.check_first`; `fn` raises PartialAnalysis
    when it cannot, and is called again with the full analysis)."""

    def wrap(fn):
        async def handler(ls: LinnetServer, params):
            # the checks in worker threads wait while this runs and its answer is written (`priority.py`)
            ls.documents.requests.begin()
            try:
                return await answer(ls, params)
            finally:
                loop = asyncio.get_running_loop()
                loop.call_soon(loop.call_soon, ls.documents.requests.end)  # (as `end` below: once written)

        async def answer(ls: LinnetServer, params):
            doc = ls.documents.get(params.text_document.uri)
            if doc is None:
                return default
            if early and (first := await ls.early_analysis(doc, params.position)) is not None:
                async with doc.reading():
                    return fn(ls, params, doc, first)
            if staged:
                end = doc.staged_answers.begin()  # the rest of the check waits for it to end (`StagedAnswers`)
                try:
                    async with doc.analyzed(ls.settings.preset, staged=True) as analysis:
                        with contextlib.suppress(PartialAnalysis):
                            return fn(ls, params, doc, analysis)
                finally:
                    # two turns of the loop on: pygls's callback that writes the answer is scheduled as this returns
                    loop = asyncio.get_running_loop()
                    loop.call_soon(loop.call_soon, end)
            async with doc.analyzed(ls.settings.preset) as analysis:
                return fn(ls, params, doc, analysis)

        handler.__name__ = fn.__name__
        server.feature(method, options)(guarded(default)(handler))
        return fn

    return wrap


def _field(params: Any, name: str, default: Any = None) -> Any:
    """A field of custom-request params, which arrive as dicts or as attribute objects."""
    if isinstance(params, dict):
        return params.get(name, default)
    return getattr(params, name, default)


def create_server() -> LinnetServer:
    """A server with every feature registered."""
    server = LinnetServer()
    _register_lifecycle(server)
    _register_text_sync(server)
    _register_hover(server)
    _register_navigation(server)
    _register_symbols(server)
    _register_completion(server)
    _register_editing(server)
    _register_views(server)
    return server


def _register_lifecycle(server: LinnetServer) -> None:
    """Initialization and settings: the position encoding, the workspace roots, settings pulled and pushed."""

    @server.feature(T.INITIALIZE)
    @guarded()
    def initialize(ls: LinnetServer, params: T.InitializeParams):
        asyncio.get_running_loop().set_default_executor(NoWaitExecutor(thread_name_prefix="linnet-analysis"))
        # pygls chose the client's first offered encoding it knows (and answers it in the
        # capabilities): count columns in it, in and out
        chosen = ls.workspace.position_encoding
        set_position_encoding(getattr(chosen, "value", chosen))
        ls.settings.update(params.initialization_options)
        if params.workspace_folders:
            ls.roots = [path_of(f.uri) for f in params.workspace_folders]
        elif params.root_uri:
            ls.roots = [path_of(params.root_uri)]

    @server.feature(T.EXIT)
    def exit_now(ls: LinnetServer, *args):
        """`exit`: end the process now, whatever runs (an analysis in a worker thread cannot be interrupted, and
        asyncio would wait for it); the weight worker is killed. LSP: status 0 after `shutdown`, else 1."""
        exit_process(ls)

    @server.feature(T.INITIALIZED)
    @guarded()
    async def initialized(ls: LinnetServer, params: T.InitializedParams):
        await _pull_settings(ls)
        await _watch_files(ls)

    @server.feature(T.WORKSPACE_DID_CHANGE_CONFIGURATION)
    @guarded()
    async def did_change_configuration(ls: LinnetServer, params: T.DidChangeConfigurationParams):
        if isinstance(params.settings, dict) and isinstance(params.settings.get("linnet"), dict):
            ls.settings.update(params.settings["linnet"])
        else:
            await _pull_settings(ls)
        ls.refresh()


def _register_text_sync(server: LinnetServer) -> None:
    """Text sync (open, change, save, close, files changed on disk), each scheduling diagnostics."""

    @server.feature(T.TEXT_DOCUMENT_DID_OPEN)
    @guarded()
    def did_open(ls: LinnetServer, params: T.DidOpenTextDocumentParams):
        d = params.text_document
        doc = ls.documents.open(d.uri, d.text, d.version)
        ls.schedule_diagnostics(doc)
        if ls.documents.is_std(doc.path):  # go to definition opens them; no client locks a file for us
            message = (
                f"linnet: {doc.path} is the standard library installed with Linnet, read-only: every "
                "model reads it (copy what you need into your project)"
            )
            ls.window_show_message(T.ShowMessageParams(T.MessageType.Warning, message))

    @server.feature(T.TEXT_DOCUMENT_DID_CHANGE)
    @guarded()
    def did_change(ls: LinnetServer, params: T.DidChangeTextDocumentParams):
        ls.end_start()
        doc = ls.documents.get(params.text_document.uri)
        if doc is None:
            return
        doc.apply_changes(params.content_changes, params.text_document.version)
        ls.schedule_diagnostics(doc)

    @server.feature(T.TEXT_DOCUMENT_DID_SAVE)
    @guarded()
    def did_save(ls: LinnetServer, params: T.DidSaveTextDocumentParams):
        doc = ls.documents.get(params.text_document.uri)
        if doc is not None:
            if params.text is not None:
                doc.replace_text(params.text)
            ls.schedule_diagnostics(doc)

    @server.feature(T.TEXT_DOCUMENT_DID_CLOSE)
    @guarded()
    def did_close(ls: LinnetServer, params: T.DidCloseTextDocumentParams):
        doc = ls.documents.close(params.text_document.uri)
        ls.weight_checks.cancel(params.text_document.uri)
        if doc is not None:
            ls.text_document_publish_diagnostics(T.PublishDiagnosticsParams(params.text_document.uri, []))
            ls.schedule_importers(doc.path)  # they read the file on disk now

    @server.feature(T.WORKSPACE_DID_CHANGE_WATCHED_FILES)
    @guarded()
    def did_change_watched_files(ls: LinnetServer, params: T.DidChangeWatchedFilesParams):
        """A `.linnet` file changed on disk: the open documents that import it are checked
        again (an open document's own text is the editor's, not the file's). A checkpoint file
        in use changed: every document's weights are checked again."""
        for change in params.changes:
            path = path_of(change.uri)
            ls.documents.workspace.file_changed(path)
            ls.schedule_importers(path)
        if ls.weight_checks.forget([path_of(change.uri) for change in params.changes]):
            ls.refresh()


def _register_hover(server: LinnetServer) -> None:
    """Hover and inlay hints (shapes, parameter names)."""

    @document_feature(server, T.TEXT_DOCUMENT_HOVER, early=True, staged=True)
    def hover(ls: LinnetServer, params: T.HoverParams, doc: OpenDocument, a: Analysis):
        index = a.document.source.index
        found = hover_markdown(a, offset_at(index, params.position), ls.preset_for(a))
        if found is None:
            return None
        markdown, (start, end) = found
        formats = ls.client_format("hover", "content_format")
        return T.Hover(markup(markdown, formats), range_of_offsets(index, start, end))

    @document_feature(server, T.TEXT_DOCUMENT_INLAY_HINT, T.InlayHintOptions(resolve_provider=False), default=[])
    def inlay_hint(ls: LinnetServer, params: T.InlayHintParams, doc: OpenDocument, a: Analysis):
        index = a.document.source.index
        start, end = offset_at(index, params.range.start), offset_at(index, params.range.end)
        found = []
        if ls.settings.inlay_shapes:
            found += hints_.inlay_hints(a, start, end, ls.preset_for(a), ls.settings.inlay_max_length)
        if ls.settings.inlay_parameters:
            found += hints_.parameter_hints(a, start, end, ls.preset_for(a))
        return [
            T.InlayHint(
                position=range_of_offsets(index, h.offset, h.offset).start,
                label=h.label,
                kind=T.InlayHintKind.Type if h.kind != "parameters" else None,
                padding_left=h.kind in ("result", "parameters"),
            )
            for h in found
        ]


def _register_navigation(server: LinnetServer) -> None:
    """Navigation: definition, references, rename, highlights, import links."""

    @document_feature(server, T.TEXT_DOCUMENT_DEFINITION)
    def definition(ls: LinnetServer, params: T.DefinitionParams, doc: OpenDocument, a: Analysis):
        loc = navigation.definition(a, offset_at(a.document.source.index, params.position))
        return lsp_location(loc) if loc is not None else None

    @server.feature(T.TEXT_DOCUMENT_REFERENCES)
    @guarded([])
    async def references(ls: LinnetServer, params: T.ReferenceParams):
        doc = ls.documents.get(params.text_document.uri)
        if doc is None:
            return []
        include = params.context.include_declaration
        async with doc.analyzed(ls.settings.preset) as a:
            target = navigation.target_at(a, offset_at(a.document.source.index, params.position))
            if target is None:
                return []
            found = navigation.references_to(a, target.anchor, include)
        if target.home is not None:  # and in the files that define it and import it
            found += await ls.across(target.home, doc, lambda b: navigation.references_to(b, target.anchor, include))
        return [lsp_location(loc) for loc in navigation.unique(found)]

    @document_feature(server, T.TEXT_DOCUMENT_PREPARE_RENAME)
    def prepare_rename(ls: LinnetServer, params: T.PrepareRenameParams, doc: OpenDocument, a: Analysis):
        index = a.document.source.index
        found = navigation.rename_range(a, offset_at(index, params.position))
        return range_of_offsets(index, *found) if found is not None else None

    @server.feature(T.TEXT_DOCUMENT_RENAME, T.RenameOptions(prepare_provider=True))
    @guarded()
    async def rename(ls: LinnetServer, params: T.RenameParams):
        """Every place spelled as the name that names its definition: in this file, the file
        that defines it and every file that imports it (an importer's alias is kept)."""
        doc = ls.documents.get(params.text_document.uri)
        if doc is None:
            return None
        new_name = params.new_name
        async with doc.analyzed(ls.settings.preset) as a:
            plan = navigation.plan_rename(a, offset_at(a.document.source.index, params.position), new_name)
            locs = navigation.rename_edits([a], plan, new_name)
            note = navigation.checkpoint_rename_note(a, plan, new_name)
        if plan.target.home is not None:
            locs += await ls.across(plan.target.home, doc, lambda b: navigation.rename_edits([b], plan, new_name))
        changes: dict[str, list[T.TextEdit]] = {}
        for loc in navigation.unique(locs):
            changes.setdefault(uri_of(loc.path), []).append(T.TextEdit(lsp_range(loc), new_name))
        if note is not None:  # a member whose name is part of checkpoint names: the rename changes them too
            ls.window_show_message(T.ShowMessageParams(T.MessageType.Warning, f"linnet: {note}"))
        return T.WorkspaceEdit(changes=changes)

    @document_feature(server, T.TEXT_DOCUMENT_DOCUMENT_HIGHLIGHT, default=[])
    def document_highlight(ls: LinnetServer, params: T.DocumentHighlightParams, doc: OpenDocument, a: Analysis):
        found = navigation.highlights(a, offset_at(a.document.source.index, params.position))
        write, read = T.DocumentHighlightKind.Write, T.DocumentHighlightKind.Read
        return [T.DocumentHighlight(lsp_range(loc), write if is_def else read) for loc, is_def in found]

    @document_feature(server, T.TEXT_DOCUMENT_DOCUMENT_LINK, T.DocumentLinkOptions(resolve_provider=False), default=[])
    def document_link(ls: LinnetServer, params: T.DocumentLinkParams, doc: OpenDocument, a: Analysis):
        """Each import's file (or standard-library module) is a link to it."""
        resolved = a.imports.resolved if a.imports is not None else []
        return [
            T.DocumentLink(
                lsp_range(r.item.resolve(r.node.source.span)), uri_of(r.target.source.path), r.target.source.path
            )
            for r in resolved
        ]


def _register_symbols(server: LinnetServer) -> None:
    """Document and workspace symbols, folding ranges."""

    @document_feature(server, T.TEXT_DOCUMENT_DOCUMENT_SYMBOL, default=[])
    def document_symbol(ls: LinnetServer, params: T.DocumentSymbolParams, doc: OpenDocument, a: Analysis):
        def convert(item, s: symbols.Symbol) -> T.DocumentSymbol:
            return T.DocumentSymbol(
                name=s.name,
                kind=s.kind,
                detail=s.detail,
                range=lsp_range(item.resolve(s.span)),
                selection_range=lsp_range(item.resolve(s.name_span)),
                children=[convert(item, c) for c in s.children] or None,
            )

        return [convert(item, s) for item in a.document.items for s in symbols.item_symbols(item)]

    @server.feature(T.WORKSPACE_SYMBOL)
    @guarded([])
    def workspace_symbol(ls: LinnetServer, params: T.WorkspaceSymbolParams):
        out = []
        for path, items in ls.workspace_items():
            for item in items:
                for s, container in symbols.flatten(symbols.item_symbols(item)):
                    if symbols.matches(params.query, s.name):
                        location = T.Location(uri_of(path), lsp_range(item.resolve(s.name_span)))
                        out.append(
                            T.WorkspaceSymbol(name=s.name, kind=s.kind, location=location, container_name=container)
                        )
                if len(out) >= symbols.MAX_WORKSPACE_SYMBOLS:
                    return out
        return out

    @document_feature(server, T.TEXT_DOCUMENT_FOLDING_RANGE, default=[])
    def folding_range(ls: LinnetServer, params: T.FoldingRangeParams, doc: OpenDocument, a: Analysis):
        return [
            T.FoldingRange(start, end, kind=T.FoldingRangeKind.Comment if kind == "comment" else None)
            for start, end, kind in symbols.folding_ranges(a.document.items)
        ]


def _register_completion(server: LinnetServer) -> None:
    """Completion and signature help."""
    completion_options = T.CompletionOptions(trigger_characters=[".", '"', "/"])

    @document_feature(server, T.TEXT_DOCUMENT_COMPLETION, completion_options, staged=True)
    def completion(ls: LinnetServer, params: T.CompletionParams, doc: OpenDocument, a: Analysis):
        index = a.document.source.index
        offset = offset_at(index, params.position)
        found = import_completions(a, offset, ls.text_of)
        if found is None:
            found = completion_.completions(a, offset, ls.preset_for(a))
        formats = ls.client_format("completion", "completion_item", "documentation_format")
        items = [
            T.CompletionItem(
                label=c.label,
                kind=getattr(T.CompletionItemKind, c.kind, T.CompletionItemKind.Text),
                detail=c.detail or None,
                documentation=markup(c.documentation, formats) if c.documentation else None,
                insert_text=c.snippet,
                insert_text_format=T.InsertTextFormat.Snippet if c.snippet else None,
                text_edit=T.TextEdit(range_of_offsets(index, *c.replace), c.label) if c.replace else None,
                sort_text=f"{c.sort}{c.label}",
            )
            for c in found
        ]
        return T.CompletionList(is_incomplete=False, items=items)

    signature_options = T.SignatureHelpOptions(trigger_characters=["(", ","], retrigger_characters=[","])

    @document_feature(server, T.TEXT_DOCUMENT_SIGNATURE_HELP, signature_options)
    def signature_help(ls: LinnetServer, params: T.SignatureHelpParams, doc: OpenDocument, a: Analysis):
        sig = completion_.signature_help(a, offset_at(a.document.source.index, params.position), ls.preset_for(a))
        if sig is None:
            return None
        formats = ls.client_format("signature_help", "signature_information", "documentation_format")
        information = T.SignatureInformation(
            label=sig.label,
            documentation=markup(sig.documentation, formats) if sig.documentation else None,
            parameters=[T.ParameterInformation(label=label, documentation=d or None) for label, d in sig.parameters],
            active_parameter=sig.active,
        )
        return T.SignatureHelp(signatures=[information], active_signature=0, active_parameter=sig.active)


def _register_editing(server: LinnetServer) -> None:
    """Semantic tokens, formatting and quick fixes."""
    legend = T.SemanticTokensLegend(token_types=TOKEN_TYPES, token_modifiers=TOKEN_MODIFIERS)

    @document_feature(server, T.TEXT_DOCUMENT_SEMANTIC_TOKENS_FULL, legend)
    def semantic_tokens_full(ls: LinnetServer, params: T.SemanticTokensParams, doc: OpenDocument, a: Analysis):
        return T.SemanticTokens(data=semantic_tokens(a))

    @server.feature(T.TEXT_DOCUMENT_FORMATTING)
    @guarded()
    def formatting(ls: LinnetServer, params: T.DocumentFormattingParams):
        doc = ls.documents.get(params.text_document.uri)
        if doc is None:
            return None
        text = doc.text
        try:
            formatted = format_source(text)  # keeps the file's line endings
        except FormatError as err:
            message = f"linnet: cannot format {doc.path}:{err.line}:{err.column}: {err}"
            ls.window_show_message(T.ShowMessageParams(T.MessageType.Warning, message))
            return None
        if formatted == text:
            return []
        return [T.TextEdit(range_of_offsets(doc.index, 0, len(text)), formatted)]

    code_action_options = T.CodeActionOptions(code_action_kinds=[T.CodeActionKind.QuickFix])

    @document_feature(server, T.TEXT_DOCUMENT_CODE_ACTION, code_action_options, default=[])
    def code_action(ls: LinnetServer, params: T.CodeActionParams, doc: OpenDocument, a: Analysis):
        index = a.document.source.index
        start, end = offset_at(index, params.range.start), offset_at(index, params.range.end)
        out = []
        for d in a.diagnostics:
            if d.location.path != doc.path or d.location.end.offset < start or d.location.start.offset > end:
                continue
            for fix in d.fixes:
                edits = [
                    T.TextEdit(lsp_range(e.location), e.new_text) for e in fix.edits if e.location.path == doc.path
                ]
                if edits:
                    out.append(
                        T.CodeAction(
                            title=fix.message,
                            kind=T.CodeActionKind.QuickFix,
                            diagnostics=[lsp_diagnostic(d)],
                            edit=T.WorkspaceEdit(changes={doc.uri: edits}),
                            is_preferred=len(d.fixes) == 1,
                        )
                    )
        return out


def _register_views(server: LinnetServer) -> None:
    """The run and compare lenses and commands, preset selection, and the custom requests of the views
    (IR, generated code, presets, backends)."""

    @document_feature(server, T.TEXT_DOCUMENT_CODE_LENS, T.CodeLensOptions(resolve_provider=False), default=[])
    def code_lens(ls: LinnetServer, params: T.CodeLensParams, doc: OpenDocument, a: Analysis):
        model = a.model
        if model is None or model.ast is None:
            return []
        preset = ls.effective_preset(a)
        out = []
        for fn in model.ast.members:
            if isinstance(fn, A.FnDef) and fn.entry:
                rng = lsp_range(model.resolve(fn.name.span))
                for backend in LENS_BACKENDS:
                    args = {"uri": doc.uri, "entry": fn.name.id, "backend": backend, "preset": preset}
                    title = f"Run ▸ {views.backend_label(backend)}"
                    out.append(T.CodeLens(rng, T.Command(title, RUN_COMMAND, arguments=[args])))
                args = {"uri": doc.uri, "entry": fn.name.id, "backends": [*compare_.COMPARE_BACKENDS], "preset": preset}
                out.append(T.CodeLens(rng, T.Command(compare_.lens_title(), COMPARE_COMMAND, arguments=[args])))
        rng = lsp_range(model.resolve(model.ast.name.span))
        args = {"uri": doc.uri, "preset": preset}
        out.append(T.CodeLens(rng, T.Command(diff_.VERIFY_TITLE, diff_.VERIFY_COMMAND, arguments=[args])))
        if diff_.weights_for(ls.weight_checks.targets(ls, doc, a), preset) is not None:
            out.append(T.CodeLens(rng, T.Command(diff_.DIFF_TITLE, diff_.DIFF_COMMAND, arguments=[args])))
        return out

    @server.command(RUN_COMMAND)
    async def run_command(ls: LinnetServer, *args):
        return await _answer(ls, RUN_COMMAND, _run(ls, args))

    @server.command(COMPARE_COMMAND)
    async def compare_command(ls: LinnetServer, *args):
        return await _answer(ls, COMPARE_COMMAND, _compare(ls, args))

    @server.command(diff_.DIFF_COMMAND)
    async def diff_command(ls: LinnetServer, *args):
        return await _answer(ls, diff_.DIFF_COMMAND, _diff(ls, args, "diff"))

    @server.command(diff_.VERIFY_COMMAND)
    async def verify_command(ls: LinnetServer, *args):
        return await _answer(ls, diff_.VERIFY_COMMAND, _diff(ls, args, "verify"))

    @server.command(SELECT_PRESET_COMMAND)
    async def select_preset(ls: LinnetServer, *args):
        try:
            return await _select_preset(ls, args)
        except Exception as err:  # noqa: BLE001
            ls.log_error(SELECT_PRESET_COMMAND, err)
            return None

    @server.feature(SHOW_IR)
    @guarded()
    async def show_ir(ls: LinnetServer, params):
        doc = _document_param(ls, params)
        preset = await _preset_param(ls, doc, _field(params, "preset"))
        return await asyncio.to_thread(views.show_ir, doc.path, doc.text, preset, ls.buffers(doc))

    @server.feature(SHOW_GENERATED)
    @guarded()
    async def show_generated(ls: LinnetServer, params):
        doc = _document_param(ls, params)
        preset = await _preset_param(ls, doc, _field(params, "preset"))
        target = _field(params, "target") or "torch"
        return await views.show_generated(ls.settings.interpreter, doc.path, doc.text, target, preset, ls.buffers(doc))

    @server.feature(PRESETS)
    @guarded([])
    async def presets(ls: LinnetServer, params):
        doc = _document_param(ls, params)
        async with doc.analyzed(ls.settings.preset) as a:
            return a.declared_presets

    @server.feature(BACKENDS)
    @guarded([])
    async def backends(ls: LinnetServer, params):
        return views.backend_list()


def _document_param(ls: LinnetServer, params) -> OpenDocument:
    uri = _field(params, "uri")
    if isinstance(uri, dict):
        uri = uri.get("uri")
    doc = ls.documents.get(uri) if isinstance(uri, str) else None
    if doc is None:
        raise JsonRpcInvalidParams(f"the document {uri!r} is not open")
    return doc


async def _preset_param(ls: LinnetServer, doc: OpenDocument, requested: Any) -> str | None:
    """The preset a view or run of `doc` uses: `requested` when given (it must be declared
    there), else the effective preset (`LinnetServer.effective_preset`). Raises ViewError."""
    if requested is not None and not isinstance(requested, str):
        raise views.ViewError(f"a preset is a name, got {requested!r}")
    async with doc.analyzed(ls.settings.preset) as a:
        if requested:
            if requested not in a.declared_presets:
                known = ", ".join(f"`{p}`" for p in a.declared_presets) or "none"
                raise views.ViewError(f"{doc.path} declares no preset `{requested}` (presets: {known})")
            return requested
        return ls.effective_preset(a)


async def _watch_files(ls: LinnetServer) -> None:
    """Ask the client to report changes of `.linnet` files on disk (dynamic registration of
    workspace/didChangeWatchedFiles), when it can: an import can name a file no editor has
    open."""
    if not ls.client_supports("workspace", "did_change_watched_files", "dynamic_registration"):
        return
    options = T.DidChangeWatchedFilesRegistrationOptions(watchers=[T.FileSystemWatcher(glob_pattern="**/*.linnet")])
    registration = T.Registration(str(uuid.uuid4()), T.WORKSPACE_DID_CHANGE_WATCHED_FILES, options)
    try:
        await ls.client_register_capability_async(T.RegistrationParams([registration]))
    except Exception as err:  # noqa: BLE001 - a client may refuse; disk files are still re-read when they change
        log.warning("registering workspace/didChangeWatchedFiles failed: %s", err)


async def _pull_settings(ls: LinnetServer) -> None:
    if not ls.client_supports("workspace", "configuration"):
        return
    try:
        result = await ls.workspace_configuration_async(T.ConfigurationParams([T.ConfigurationItem(section="linnet")]))
    except Exception as err:  # noqa: BLE001 - a client may refuse; keep the settings we have
        log.warning("workspace/configuration failed: %s", err)
        return
    if result:
        ls.settings.update(result[0])


async def _answer(ls: LinnetServer, command: str, work: Awaitable[dict]) -> dict:
    """The result of a run command; a refusal is shown to the user and answered as an error."""
    try:
        return await work
    except views.ViewError as err:
        text = str(err) if str(err).startswith("linnet") else f"linnet run: {err}"
        ls.window_show_message(T.ShowMessageParams(T.MessageType.Error, text))
        raise refusal(str(err)) from err
    except JsonRpcException:
        raise
    except Exception as err:  # noqa: BLE001
        ls.log_error(command, err)
        raise refusal(f"{type(err).__name__}: {err}") from err


async def _run(ls: LinnetServer, args: tuple) -> dict:
    spec = args[0] if args else {}
    if not isinstance(spec, dict):
        raise views.ViewError("linnet.run takes one argument {uri, entry, backend, preset}")
    doc = _document_param(ls, spec)
    entry = spec.get("entry") or "forward"
    backend = spec.get("backend") or "torch"
    if not isinstance(entry, str) or not entry.isidentifier():
        raise views.ViewError(f"an entry is a function name, got {entry!r}")
    if not isinstance(backend, str):
        raise views.ViewError(f"a backend is a name, got {backend!r}")
    preset = await _preset_param(ls, doc, spec.get("preset"))
    title = f"Running {entry} on {views.backend_label(backend)}"
    async with _progress(ls, title, entry):
        report = await views.run_entry(
            ls.settings.interpreter, doc.path, doc.text, entry, backend, preset, ls.buffers(doc)
        )
    summary = views.summary(report)
    kind = T.MessageType.Warning if report.get("disagreements") else T.MessageType.Info
    ls.window_show_message(T.ShowMessageParams(kind, summary))
    ls.window_log_message(T.LogMessageParams(T.MessageType.Log, f"linnet run: {summary}"))
    return report


@contextlib.asynccontextmanager
async def _progress(ls: LinnetServer, title: str, entry: str):
    """Work-done progress around a run of `entry` in a worker, when the client supports it; its
    cancel button stops the worker. Raises ViewError when the run is cancelled."""
    token = None
    if ls.client_supports("window", "work_done_progress"):
        token = str(uuid.uuid4())
        try:
            await ls.work_done_progress.create_async(token)
            begin = T.WorkDoneProgressBegin(title=title, message="starting a worker", cancellable=True)
            ls.work_done_progress.begin(token, begin)
            # the progress's cancel button stops the worker (pygls runs a command as a nested
            # handler, so `$/cancelRequest` for the command does not reach this task)
            task = asyncio.current_task()
            ls.work_done_progress.tokens[token].add_done_callback(
                lambda f: task.cancel() if f.cancelled() and task is not None else None
            )
        except Exception:  # noqa: BLE001 - progress is a nicety
            token = None
    try:
        yield
    except asyncio.CancelledError:
        raise views.ViewError(f"the run of {entry} was cancelled") from None
    finally:
        if token is not None:
            ls.work_done_progress.end(token, T.WorkDoneProgressEnd(message="done"))
            ls.work_done_progress.tokens.pop(token, None)


async def _compare(ls: LinnetServer, args: tuple) -> dict:
    """`linnet.compare {uri, entry, backends, preset}`: the entry on each backend in a worker
    (`compare.compare_entry`), the report written read-only and shown (`window/showDocument`, else
    a message naming the file). Returns the report with `reportUri`. Raises ViewError."""
    spec = args[0] if args else {}
    if not isinstance(spec, dict):
        raise views.ViewError("linnet.compare takes one argument {uri, entry, backends, preset}")
    doc = _document_param(ls, spec)
    entry = spec.get("entry") or "forward"
    backends = spec.get("backends") or list(compare_.COMPARE_BACKENDS)
    if not isinstance(entry, str) or not entry.isidentifier():
        raise views.ViewError(f"an entry is a function name, got {entry!r}")
    if not isinstance(backends, list) or not all(isinstance(b, str) and b in views.BACKENDS for b in backends):
        raise views.ViewError(f"backends are a list of registry names ({', '.join(views.BACKENDS)}), got {backends!r}")
    preset = await _preset_param(ls, doc, spec.get("preset"))
    count = len({compare_.REFERENCE, *backends})  # the worker adds the reference
    async with _progress(ls, f"Comparing {entry} on {count} backends", entry):
        report = await compare_.compare_entry(
            ls.settings.interpreter, doc.path, doc.text, entry, backends, preset, ls.buffers(doc)
        )
    path = await asyncio.to_thread(compare_.write_report, report, doc.path)
    report["reportUri"] = uri_of(str(path))
    kind = T.MessageType.Warning if report["disagreements"] else T.MessageType.Info
    summary = compare_.summary(report, path)
    shown = False
    if ls.client_supports("window", "show_document", "support"):
        try:
            result = await ls.window_show_document_async(T.ShowDocumentParams(report["reportUri"], take_focus=True))
            shown = bool(result and result.success)
        except Exception as err:  # noqa: BLE001 - the message below still names the file
            log.warning("window/showDocument failed: %s", err)
    if not shown or report["disagreements"]:
        ls.window_show_message(T.ShowMessageParams(kind, summary))
    ls.window_log_message(T.LogMessageParams(T.MessageType.Log, f"linnet compare: {summary}"))
    return report


async def _diff(ls: LinnetServer, args: tuple, kind: str) -> dict:
    """`linnet.diff {uri, preset}` / `linnet.verify {uri, preset}`: `linnet diff` or `linnet verify` on the root model
    in a worker (linnet/lsp/diff.py); the result is a diagnostic on the first diverging member until the text
    changes, and a message. Returns {agree, diagnostic, report (diff's)}. Raises ViewError."""
    spec = args[0] if args else {}
    if not isinstance(spec, dict):
        raise views.ViewError(f"linnet.{kind} takes one argument {{uri, preset}}")
    doc = _document_param(ls, spec)
    preset = await _preset_param(ls, doc, spec.get("preset"))
    text, buffers = doc.text, ls.buffers(doc)
    async with doc.analyzed(ls.settings.preset) as a:
        weights = diff_.weights_for(ls.weight_checks.targets(ls, doc, a), preset)
    if kind == "diff" and weights is None:
        raise views.ViewError(f"linnet diff: preset `{preset}` names no weights (set linnet.weights or @weights)")
    title = "Diffing against transformers" if kind == "diff" else "Verifying"
    async with _progress(ls, f"{title} ({preset or 'defaults'})", kind):
        if kind == "diff":
            report = await diff_.diff_report(ls.settings.interpreter, doc.path, text, weights, preset, buffers)
        else:
            report = await diff_.verify_run(ls.settings.interpreter, doc.path, text, weights, preset, buffers)
    async with doc.analyzed(ls.settings.preset) as a:
        found = (diff_.diff_diagnostic if kind == "diff" else diff_.verify_diagnostic)(report, a, doc.path)
    ls.lens_results.setdefault(doc.uri, {})[kind] = (text, [found] if found else [])
    ls.schedule_diagnostics(doc)
    summary = found.message if found else f"linnet {kind}: all agree"
    kind_ = T.MessageType.Warning if found else T.MessageType.Info
    ls.window_show_message(T.ShowMessageParams(kind_, summary))
    return {"agree": found is None, "diagnostic": found.message if found else None, "report": report}


async def _select_preset(ls: LinnetServer, args: tuple) -> str | None:
    """`linnet.selectPreset [preset]` or `[{uri, preset}]`: select the preset that hover, hints
    and diagnostics quote; without one, ask the user to pick among the open files' presets."""
    spec = args[0] if args else None
    preset = spec.get("preset") if isinstance(spec, dict) else spec
    names: list[str] = []
    for doc in ls.documents:
        async with doc.analyzed(ls.settings.preset) as a:
            names.extend(n for n in a.declared_presets if n not in names)
    if preset and isinstance(preset, str) and preset not in names:
        message = f"linnet: no open file declares preset `{preset}`; the selection stays as it was"
        ls.window_show_message(T.ShowMessageParams(T.MessageType.Warning, message))
        return ls.settings.preset
    if preset is None:
        if not names:
            ls.window_show_message(T.ShowMessageParams(T.MessageType.Info, "linnet: no presets in the open files"))
            return None
        choice = await ls.window_show_message_request_async(
            T.ShowMessageRequestParams(
                T.MessageType.Info, "Linnet: select a preset", [T.MessageActionItem(n) for n in names]
            )
        )
        if choice is None:
            return None
        preset = choice.title
    if not isinstance(preset, str):
        return None
    ls.settings.preset = preset or None
    ls.refresh()
    return ls.settings.preset


class NoWaitExecutor(concurrent.futures.ThreadPoolExecutor):
    """The event loop's executor for analyses (`asyncio.to_thread`): when the loop ends (stdin closed, `exit`) it
    does not wait for an analysis still running (of a 5 MB file: minutes), so the process can exit at once."""

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        super().shutdown(wait=False, cancel_futures=True)


def exit_process(ls: LinnetServer) -> None:
    """Kill the weight worker, flush what was written, and end the process (threads still running are not
    waited for): status 0 after `shutdown`, else 1."""
    ls.weight_checks.worker.kill()
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(0 if ls.protocol.shutdown_requested else 1)


def main(server: LinnetServer | None = None) -> int:
    """`linnet lsp`: serve on stdio until the client exits (`server`, else a new one: `create_server`); the exit
    status (0 after `shutdown`, else 1)."""
    logging.basicConfig(level=logging.WARNING, format="linnet-lsp %(levelname)s %(message)s")
    for handler in logging.getLogger().handlers:  # pygls logs the reader loop's errors through its own loggers
        handler.addFilter(OneLineReaderErrors())
    server = server or create_server()
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    server.collector.start()  # after the imports: they are frozen, never scanned again
    server.start_io()
    exit_process(server)  # the client closed stdin: no thread still analysing holds the process up
    return 0 if server.protocol.shutdown_requested else 1  # LSP: `exit` without `shutdown` exits 1
