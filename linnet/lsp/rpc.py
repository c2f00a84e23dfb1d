"""Every request gets an answer: JSON-RPC hygiene under pygls.

pygls turns a request whose params do not fit the method's type (`position: null`, no
`textDocument`, `line: -1`, `params: null`) into an exception inside its reader loop: it logs
a traceback and never answers, so the client waits forever. And a handler that refuses on
purpose (by raising a `JsonRpcException`, e.g. a rename that cannot be done) is answered but
logged with a traceback as if the server had crashed. `AnswerEveryRequest`, mixed into the
server's protocol, answers the first with `InvalidParams` (-32602, naming the field, as
`cattrs.transform_error` words it, in the protocol's camelCase), drops a malformed
notification with a one-line warning (a notification has no answer), and sends deliberate
errors back without a traceback. A body that is not JSON gets ParseError (-32700) and one that is
not a JSON-RPC 2.0 message (a batch array, `null`, `"jsonrpc": "1.0"`) InvalidRequest (-32600),
with id null as JSON-RPC 2.0 says (LSP has no batches), each with a one-line log entry instead of
pygls's traceback. A request (with an id) for a notification's method (`textDocument/didClose`) gets
MethodNotFound (-32601): pygls ran it as the notification and never answered. `shutdown_requested` tells `linnet
lsp` its exit status (LSP: 1 when `exit` comes without `shutdown`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import sys
import threading
from typing import Any, Callable

import attrs
import cattrs
from lsprotocol import types as T
from lsprotocol.types import ResponseErrorMessage
from pygls.exceptions import JsonRpcException
from pygls.protocol import JsonRPCResponseMessage

from linnet.semantics.pausing import pause_point

from .priority import RequestsFirst

log = logging.getLogger("linnet.lsp")

_ANSWERED = object()  # a message already answered (or dropped) while it was being read


def refusal(message: str) -> JsonRpcException:
    """The error a request gets when it is well formed but cannot be done (a rename onto a
    keyword, a view of a file with errors): LSP 3.17's `RequestFailed` (-32803), which
    clients show with its message."""
    return JsonRpcException(message, code=T.LSPErrorCodes.RequestFailed)


def _camel(text: str) -> str:
    return re.sub(r"_([a-z])", lambda m: m.group(1).upper(), text)


def params_problem(err: BaseException) -> str:
    """What is wrong with a message's params, in one line: `required field missing @
    $.params.textDocument; invalid value @ $.params.position`."""
    try:
        found = cattrs.transform_error(err)
    except Exception:  # noqa: BLE001 - not a cattrs error
        found = [f"{type(err).__name__}: {err}"]
    return "; ".join(_camel(f) for f in found) or "invalid params"


def is_message_id(value: Any) -> bool:
    """Whether `value` can be a request's id: an integer or a string (LSP's `integer | string`; JSON-RPC 2.0 allows
    null and discourages fractions, LSP neither)."""
    return isinstance(value, (int, str)) and not isinstance(value, bool)


def envelope_problem(data: dict[str, Any]) -> str | None:
    """What makes a JSON-RPC 2.0 message invalid as a message (not its params' fit to the method), in one line, or
    None: a `method` that is not a string, an `id` that is neither an integer nor a string, `params` that are
    neither an object nor an array; a response (no `method`) with neither `result` nor `error`, or an `error`
    without an integer `code` and a string `message`."""
    msg_id = data.get("id")
    if data["jsonrpc"] != "2.0":
        return f"not a JSON-RPC 2.0 message (jsonrpc {data['jsonrpc']!r})"
    if "method" in data:
        method = data["method"]
        if not isinstance(method, str):
            return f"a method is a string, got {type(method).__name__}"
        if "id" in data and not is_message_id(msg_id):
            return f"{method}: a request id is an integer or a string, got {type(msg_id).__name__}"
        params = data.get("params")
        if params is not None and not isinstance(params, (dict, list)):
            return f"{method}: params are an object or an array, got {type(params).__name__}"
        return None
    if "result" not in data and "error" not in data:
        return "neither a method (a request or notification) nor a result or error (a response)"
    if msg_id is not None and not is_message_id(msg_id):
        return f"a response id is an integer, a string or null, got {type(msg_id).__name__}"
    error = data.get("error")
    if "error" in data and not (
        isinstance(error, dict)
        and isinstance(error.get("code"), int)
        and not isinstance(error.get("code"), bool)
        and isinstance(error.get("message"), str)
    ):
        return "an error is an object with an integer `code` and a string `message`"
    return None


def strict_scalars(converter: cattrs.Converter) -> cattrs.Converter:
    """`converter` with strings and integers structured strictly: cattrs's default structures any value into a
    `str` field with `str(value)` and into an `int` field with `int(value)`, so `rename` with `newName: null`
    renamed the symbol to `None` and a position's `character: 1.5`, `true` or `"3"` became 1 or 3 (and a hover
    there answered null). A value that is not a string, or not an integer (a float with a fraction, a boolean, a
    string of digits), is an error instead, answered with InvalidParams naming the field. A float without a
    fraction (`2.0`) is an integer in JSON, which does not tell them apart, and is taken."""

    def structure_str(value: Any, _type: type) -> str:
        if not isinstance(value, str):
            raise TypeError(f"expected a string, got {type(value).__name__}")
        return value

    def structure_int(value: Any, _type: type) -> int:
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"expected an integer, got {value!r}")
        return value

    converter.register_structure_hook(str, structure_str)
    converter.register_structure_hook(int, structure_int)
    # a `bool` is an `int` to the hook dispatch: without its own hook, `snippetSupport: true` would hit the one above
    converter.register_structure_hook(bool, lambda value, _type: bool(value))
    return converter


class AnswerEveryRequest:
    """A mixin for pygls's `JsonRPCProtocol` (before it in the bases)."""

    def structure_message(self, data: dict[str, Any]):
        if "jsonrpc" not in data:
            return super().structure_message(data)  # a nested object
        if (problem := envelope_problem(data)) is not None:
            msg_id = data.get("id")
            if "method" in data or ("result" not in data and "error" not in data):
                log.warning("answered an invalid request with InvalidRequest: %s", problem)
                self._send_error(msg_id if is_message_id(msg_id) else None, T.ErrorCodes.InvalidRequest, problem)
            else:  # a malformed response to one of our requests: a response gets no answer
                log.warning("ignored a malformed response: %s", problem)
            return _ANSWERED
        if "method" not in data:  # a response to us
            return self._structure_response(data)
        method = data["method"]
        is_request = "id" in data
        message_type = self.get_message_type(method) if isinstance(method, str) else None
        if message_type is None:  # a custom request (its handler reads the params) or unknown
            # pygls's own message types take exactly these keys (JSON-RPC 2.0: params may be omitted; others ignored)
            data = {"params": None, **{k: data[k] for k in ("jsonrpc", "id", "method", "params") if k in data}}
            return super().structure_message(data)
        if is_request and "id" not in attrs.fields_dict(message_type):
            # a notification's method with an id: pygls ran it as the notification and answered nothing
            problem = f"{method} is a notification, not a request: it takes no id"
            log.warning("answered a request with MethodNotFound: %s", problem)
            self._send_error(data["id"], T.ErrorCodes.MethodNotFound, problem)
            return _ANSWERED
        try:
            return self._converter.structure(data, message_type)
        except Exception as err:  # noqa: BLE001 - whatever the client sent, it gets an answer
            problem = params_problem(err)
            if is_request:
                error = T.ResponseError(T.ErrorCodes.InvalidParams, f"{method}: {problem}")
                self._send_response(data["id"], error=error)
            else:
                log.warning("ignored a %s notification: %s", method, problem)
            return _ANSWERED

    def _structure_response(self, data: dict[str, Any]):
        """A response to one of our requests, structured as pygls does (`JsonRPCProtocol.structure_message`), but
        one that does not fit its result type is dropped with a one-line warning (pygls logs a traceback)."""
        try:
            if "error" in data:
                return self._converter.structure(data, ResponseErrorMessage)
            response_type = self._result_types.pop(data["id"], None) or JsonRPCResponseMessage
            return self._converter.structure(data, response_type)
        except Exception as err:  # noqa: BLE001 - a response gets no answer
            log.warning("ignored a response that does not fit its request: %s", params_problem(err))
            return _ANSWERED

    shutdown_requested = False
    initialize_received = False

    def handle_message(self, message):
        if message is _ANSWERED:
            return None
        if getattr(message, "jsonrpc", None) != "2.0":  # not a JSON-RPC 2.0 message pygls could structure
            msg_id = getattr(message, "id", None)
            what = type(message).__name__ if not hasattr(message, "jsonrpc") else f"jsonrpc {message.jsonrpc!r}"
            log.warning("answered a message that is not JSON-RPC 2.0 (%s) with InvalidRequest", what)
            self._send_error(
                msg_id if isinstance(msg_id, (int, str)) else None,
                T.ErrorCodes.InvalidRequest,
                f"not a JSON-RPC 2.0 request ({what})",
            )
            return None
        method = getattr(message, "method", None)
        if self._shutdown and method != "exit" and is_message_id(getattr(message, "id", None)) and method:
            # LSP: a request after `shutdown` is answered with InvalidRequest (pygls would drop it, unanswered)
            self._send_error(message.id, T.ErrorCodes.InvalidRequest, f"{method}: the server is shutting down")
            return None
        if method == "initialize":
            self.initialize_received = True
        elif not self.initialize_received and method and method != "exit":
            # LSP: before `initialize`, a request is answered with ServerNotInitialized and a notification dropped
            if is_message_id(getattr(message, "id", None)):
                self._send_error(message.id, T.ErrorCodes.ServerNotInitialized, f"{method}: initialize first")
            return None
        if method == "shutdown":
            self.shutdown_requested = True
        return super().handle_message(message)

    def answer_unframed(self, header: bytes, body: bytes) -> None:
        """A message whose `Content-Length` is not a length (`FramedReader`): InvalidRequest under the body's id
        when it has one (so the client's request is not left waiting), else id null."""
        try:
            msg_id = json.loads(body).get("id")
        except (ValueError, AttributeError):
            msg_id = None
        shown = header.decode("utf-8", "replace").strip()
        log.warning("answered a message with a bad header with InvalidRequest: %s", shown)
        problem = f"the header `{shown}` is not a Content-Length in bytes: the message was not read"
        self._send_error(msg_id if is_message_id(msg_id) else None, T.ErrorCodes.InvalidRequest, problem)

    def answer_unreadable(self, err: BaseException) -> None:
        """A body that is not JSON (`err` from the reader loop): ParseError with id null."""
        log.warning("answered a body that is not JSON with ParseError: %s", err)
        self._send_error(None, T.ErrorCodes.ParseError, f"not JSON: {err}")

    def _send_error(self, msg_id: int | str | None, code: int, message: str) -> None:
        """An error response written as a plain object, so that an unknown id goes out as `"id": null` (JSON-RPC
        2.0, section 5; pygls's own responses drop a None id)."""
        self._send_data({"jsonrpc": "2.0", "id": msg_id, "error": {"code": int(code), "message": message}})

    def _send_handler_result(self, future, *, msg_id):
        """A handler's deliberate `JsonRpcException` goes back as the error it is, with no
        traceback in the log; anything else as pygls does it."""
        if not future.cancelled() and isinstance(err := future.exception(), JsonRpcException):
            self._request_futures.pop(msg_id, None)
            self._send_response(msg_id, error=err.to_response_error())
            return
        super()._send_handler_result(future, msg_id=msg_id)


_LENGTH = re.compile(rb"content-length:[ \t]*(\d+)[ \t]*\r?\n", re.IGNORECASE)
MAX_UNFRAMED = 1 << 24  # bytes of a body without a length read before giving up on finding its end
MAX_HEADER_LINE = 1 << 20  # bytes of a line read as a header before it is taken in parts


class PrefetchingStdin:
    """The stdin reader pygls's message loop awaits (`readline`, `readexactly`), filled by one thread of its own that
    hands each chunk it reads to the event loop. pygls's `StdinAsyncReader` ran every `readline` and `read` in the
    thread pool: three trips from the loop to a thread and back per message (the header, the blank line, the body),
    each waiting for the GIL (and, on a busy machine, for a core) while a keystroke's check ran in another thread:
    traced on the 3,000-line file (bench/lsp_latency.py --burst-pause, 2 cores busy with other work), a completion
    sent with a keystroke reached the loop a median 16 ms after it was sent, 1 ms in pauses; 5.5 ms with this reader.
    Here a message already read costs the loop no thread at all, and a chunk read one hand-over (a keystroke's
    didChange and the completion sent with it often come in one)."""

    CHUNK_BYTES = 1 << 16

    def __init__(self, stdin, requests: RequestsFirst | None = None):
        self.stdin = stdin
        self.requests = requests  # told as soon as a chunk holding a request is read (`priority.RequestsFirst`)
        self._buffer: asyncio.StreamReader | None = None

    def _start(self) -> asyncio.StreamReader:
        loop = asyncio.get_running_loop()
        buffer = asyncio.StreamReader(limit=sys.maxsize)  # (pygls read a header line of any length)
        read = getattr(self.stdin, "read1", None) or self.stdin.read  # read1: what one read of the pipe gives
        requests = self.requests

        def pump() -> None:
            """(In its own thread: the blocking reads.) Hands each chunk to the loop, then the end of input."""
            while True:
                try:
                    chunk = read(self.CHUNK_BYTES)
                except (OSError, ValueError):  # closed under us
                    chunk = b""
                try:
                    if not chunk:
                        loop.call_soon_threadsafe(buffer.feed_eof)
                        return
                    request = requests is not None and b'"id"' in chunk  # (a request, or a response to ours)
                    if request:
                        requests.arrived()
                    loop.call_soon_threadsafe(buffer.feed_data, chunk)
                    if request:
                        loop.call_soon_threadsafe(requests.settle)
                except RuntimeError:  # the loop is closed: nobody reads any more
                    return

        threading.Thread(target=pump, name="linnet-stdin", daemon=True).start()
        return buffer

    @property
    def buffer(self) -> asyncio.StreamReader:
        if self._buffer is None:
            self._buffer = self._start()
        return self._buffer

    async def readline(self) -> bytes:
        """The next line with its newline (what is left without one at the end of input; b"" after it)."""
        return await self.buffer.readline()

    async def readexactly(self, n: int) -> bytes:
        """The next `n` bytes, or fewer when the input ends first (as `read(n)` gives them)."""
        try:
            return await self.buffer.readexactly(n)
        except asyncio.IncompleteReadError as err:
            return err.partial


class FramedReader:
    """The reader pygls's message loop reads headers and bodies from (`readline`, `readexactly`), with the
    `Content-Length` header checked: pygls takes only `Content-Length: <digits>\\r\\n` and skips any other header
    line, so after `Content-Length: abc` it read the body as a header line (up to the next newline: the next
    message's header) and the stream fell out of step. A valid header in another spelling (`content-length: 5`)
    is passed on as pygls expects it; for one that is not a length, the rest of the headers and the body (one JSON
    value, read until it parses) are consumed and given to `on_unframed(header, body)`, which answers."""

    def __init__(self, reader, on_unframed: Callable[[bytes, bytes], None]):
        self.reader = reader
        self.on_unframed = on_unframed

    async def readexactly(self, n: int) -> bytes:
        return await self.reader.readexactly(n)

    async def readline(self) -> bytes:
        while True:
            line = await self.reader.readline()
            if not line[:15].lower() == b"content-length:":
                return line
            if (match := _LENGTH.fullmatch(line)) is not None:
                return b"Content-Length: %d\r\n" % int(match.group(1))
            while (more := await self.reader.readline()) and more.strip():
                pass  # the other headers
            if not more:
                return more
            self.on_unframed(line, await self._json_value())

    async def _json_value(self) -> bytes:
        """One JSON value from the stream, read a byte at a time until it parses (empty when the stream ends or
        the first byte cannot start one)."""
        body = b""
        decoder = json.JSONDecoder()
        while len(body) < MAX_UNFRAMED:
            byte = await self.reader.readexactly(1)
            if not byte or (not body and byte not in b"{["):
                return body
            body += byte
            if byte in b"}]":
                try:
                    decoder.raw_decode(body.decode("utf-8"))
                    return body
                except ValueError:
                    continue
        return body


def raised_by_json_decoder(err: BaseException) -> bool:
    """Whether the JSON decoder itself raised `err` (its innermost frame is in the `json` package), not the code
    its object hook runs: JSONDecodeError, a UnicodeDecodeError of bytes, and JSON it cannot take, nested deeper
    than it recurses (RecursionError) or a number of more digits than `int` converts (ValueError)."""
    tb = err.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and os.path.dirname(tb.tb_frame.f_code.co_filename) == os.path.dirname(json.__file__)


class OneLineReaderErrors(logging.Filter):
    """pygls's reader loop logs "Unable to handle message" with a traceback for a body it cannot read; the
    message is answered (`answer_unreadable`, `handle_message`), so the log gets the one line, not the traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.getMessage() == "Unable to handle message" and record.exc_info:
            exc = record.exc_info[1]
            record.msg, record.args, record.exc_info = f"unreadable message: {type(exc).__name__}: {exc}", (), None
        return True


def warm_converters(protocol) -> None:
    """Structure a request and serialise an answer of each kind typing sends most (completion, hover, signature
    help, definition, highlights, inlay hints, semantic tokens, code lenses and actions), once: cattrs builds a
    type's functions on its first use, and the first completion's answer took 33 ms to serialise where the next
    took 0.7 (the server calls this in a worker thread after its first publish)."""
    doc, at = {"uri": "file:///warm.linnet"}, {"line": 0, "character": 0}
    span = {"start": at, "end": at}
    requests = {
        T.TEXT_DOCUMENT_COMPLETION: {"textDocument": doc, "position": at},
        T.TEXT_DOCUMENT_HOVER: {"textDocument": doc, "position": at},
        T.TEXT_DOCUMENT_SIGNATURE_HELP: {"textDocument": doc, "position": at},
        T.TEXT_DOCUMENT_DEFINITION: {"textDocument": doc, "position": at},
        T.TEXT_DOCUMENT_DOCUMENT_HIGHLIGHT: {"textDocument": doc, "position": at},
        T.TEXT_DOCUMENT_INLAY_HINT: {"textDocument": doc, "range": span},
        T.TEXT_DOCUMENT_SEMANTIC_TOKENS_FULL: {"textDocument": doc},
        T.TEXT_DOCUMENT_CODE_LENS: {"textDocument": doc},
        T.TEXT_DOCUMENT_CODE_ACTION: {"textDocument": doc, "range": span, "context": {"diagnostics": []}},
    }
    for method, params in requests.items():
        protocol.structure_message({"jsonrpc": "2.0", "id": 0, "method": method, "params": params})
        pause_point()
    rng = T.Range(T.Position(0, 0), T.Position(0, 1))
    text = T.MarkupContent(T.MarkupKind.Markdown, "")
    item = T.CompletionItem(
        "x", kind=T.CompletionItemKind.Field, detail="", documentation=text, insert_text="x",
        insert_text_format=T.InsertTextFormat.Snippet, text_edit=T.TextEdit(rng, "x"), sort_text="x",
    )  # fmt: skip
    signature = T.SignatureInformation("f(x)", text, [T.ParameterInformation("x", "")], active_parameter=0)
    command = T.Command("x", "x", arguments=[{}])
    answers = [
        T.CompletionResponse(0, T.CompletionList(False, [item])),
        T.HoverResponse(0, T.Hover(text, rng)),
        T.SignatureHelpResponse(0, T.SignatureHelp([signature], active_signature=0, active_parameter=0)),
        T.DefinitionResponse(0, [T.Location("file:///warm.linnet", rng)]),
        T.DocumentHighlightResponse(0, [T.DocumentHighlight(rng)]),
        T.InlayHintResponse(0, [T.InlayHint(T.Position(0, 0), "x", kind=T.InlayHintKind.Type, padding_left=True)]),
        T.SemanticTokensResponse(0, T.SemanticTokens([0, 0, 1, 0, 0])),
        T.CodeLensResponse(0, [T.CodeLens(rng, command)]),
        T.CodeActionResponse(0, [T.CodeAction("x", kind=T.CodeActionKind.QuickFix, command=command)]),
    ]
    for answer in answers + answers:  # (cattrs builds an answer's own function again on its second use)
        json.dumps(answer, default=protocol._serialize_message)
        pause_point()
