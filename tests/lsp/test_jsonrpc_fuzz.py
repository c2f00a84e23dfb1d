"""JSON-RPC 2.0 by the book, fuzzed: hypothesis writes messages (ids, methods, params and envelopes of every JSON
type) to the real server process over stdio, and each must get what the JSON-RPC 2.0 spec says:

- a request whose envelope is invalid (a `method` that is not a string, an `id` that is neither an integer nor a
  string, `params` neither an object nor an array; a message that is neither a request nor a response) gets
  Invalid Request (-32600), with its id when that is valid and id null otherwise; the same for a notification
  with such a method (the spec's own example answers one);
- a valid request gets its result or an error of the protocol's codes: MethodNotFound (-32601), InvalidParams
  (-32602), RequestFailed (-32803); never InternalError (-32603);
- a valid notification gets nothing;
- nothing logs a traceback (stderr, window/logMessage), and the server keeps serving.

A request about a position whose `line` or `character` is not a `uinteger` (1.5, true, "3") is InvalidParams too.
`rename` with `newName: null` (or any non-string) is InvalidParams, not a rename to `None`."""

from __future__ import annotations

import itertools
import json
import time

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lsprotocol import types as T

from .conftest import TIMEOUT_S
from .test_malformed import URI, RawClient, request_methods, send_raw

# methods that end the session or run workers are not fuzzed (their own tests cover them)
NOT_FUZZED = {"shutdown", "exit", "initialize", "workspace/executeCommand", "linnet/showGenerated"}
METHODS = [m for m in request_methods() if m not in NOT_FUZZED] + [
    "textDocument/didChange",
    "textDocument/didClose",
    "$/cancelRequest",
    "$/setTrace",
    "no/suchMethod",
]
MISSING = object()
json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**40), 2**40), st.floats(allow_nan=False), st.text())
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)),
    max_leaves=8,
)
# a coordinate is mostly a fit one (so that the other is the one that decides) or any JSON value
coordinates = st.one_of(st.integers(0, 3), st.integers(0, 3), st.sampled_from([1.5, True, "1", -1.0, 2.0]), json_values)
positions = st.fixed_dictionaries({"line": coordinates, "character": coordinates})
lsp_like = st.fixed_dictionaries(
    {"textDocument": st.one_of(st.just({"uri": URI}), json_values)},
    optional={"position": st.one_of(positions, json_values), "newName": json_values, "query": json_values},
)
messages = st.fixed_dictionaries(
    {
        "jsonrpc": st.one_of(st.just("2.0"), st.just("2.0"), st.just("2.0"), json_scalars),
        "id": st.one_of(st.just(MISSING), st.just("valid"), json_values),
        "method": st.one_of(st.sampled_from(METHODS), st.sampled_from(METHODS), json_values, st.just(MISSING)),
        "params": st.one_of(st.just(MISSING), lsp_like, lsp_like, json_values),
    },
    optional={"result": json_values, "error": json_values},
)
_ids = itertools.count(10_000)
# the protocol's requests whose params carry a `position` (hover, completion, definition, rename...)
POSITION_METHODS = {
    method
    for method, (_request, _response, params, _result) in T.METHOD_TO_TYPES.items()
    if method in METHODS and params is not None and "position" in attrs.fields_dict(params)
}


def _valid_id(value) -> bool:
    return isinstance(value, (int, str)) and not isinstance(value, bool)


def _uinteger(value) -> bool:
    """Whether `value` is an LSP `uinteger` as JSON has it: an integer in [0, 2**31 - 1], written with or without a
    `.0` (JSON does not tell `2` from `2.0`); not a boolean, a string or a fraction."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**31


def _misplaced(message: dict) -> bool:
    """Whether `message` is a request about a position whose `line` or `character` is not a `uinteger`: params that
    do not fit the method, which get InvalidParams (a `character` of 1.5 or true was taken as 1 and answered null)."""
    params, method = message.get("params"), message.get("method")
    position = params.get("position") if isinstance(params, dict) else None
    return (
        isinstance(method, str)
        and method in POSITION_METHODS
        and isinstance(position, dict)
        and not all(_uinteger(position.get(k)) for k in ("line", "character"))
    )


def _expected(message: dict) -> int | None:
    """The error code the spec gives `message` when its envelope is invalid (-32600), or None when it is valid."""
    if message.get("jsonrpc") != "2.0":
        return -32600
    if "method" in message:
        method, params = message["method"], message.get("params")
        if not isinstance(method, str) or ("id" in message and not _valid_id(message["id"])):
            return -32600
        if params is not None and not isinstance(params, (dict, list)):
            return -32600
        return None
    return -32600 if "result" not in message and "error" not in message else None


OPEN_TEXT = "config C {\n  a: int = 1\n}\n"


def reopen(client: RawClient) -> None:
    """The document closed (if open) and opened again with `OPEN_TEXT`."""
    client.send({"method": "textDocument/didClose", "params": {"textDocument": {"uri": URI}}})
    document = {"uri": URI, "languageId": "linnet", "version": 1, "text": OPEN_TEXT}
    client.send({"method": "textDocument/didOpen", "params": {"textDocument": document}})


@pytest.fixture(scope="module")
def server():
    client = RawClient()
    client.send({"id": 0, "method": "initialize", "params": {"capabilities": {}}})
    assert client.responses({0})
    client.send({"method": "initialized", "params": {}})
    reopen(client)
    yield client
    stderr = client.close()
    assert "Traceback" not in stderr, stderr[-3000:]
    assert client.process.returncode == 0
    logged = [m["params"]["message"] for m in client.messages if m.get("method") == "window/logMessage"]
    assert not [m for m in logged if "Traceback" in m]


def _wait(client: RawClient, accept, since: int = 0) -> dict:
    """The first message from `client.messages[since]` on that `accept` takes, waiting for it."""
    deadline = time.monotonic() + TIMEOUT_S / 4
    while time.monotonic() < deadline:
        for m in client.messages[since:]:
            if accept(m):
                return m
        time.sleep(0.002)
    raise AssertionError("no answer")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fields=messages)
def test_every_message_is_answered_as_json_rpc_2_says(server, fields):
    message = {k: v for k, v in fields.items() if v is not MISSING}
    if message.get("id") == "valid":
        message["id"] = next(_ids) if message.get("method") != "$/cancelRequest" else f"id-{next(_ids)}"
    if message.get("method") in ("$/cancelRequest",) and "id" not in message:
        message.pop("params", None)  # a cancel of a real request is the client's business; here: no params
    expected = _expected(message)
    before = len(server.messages)
    send_raw(server, json.dumps(message).encode())
    sentinel = f"sentinel-{next(_ids)}"
    server.send({"id": sentinel, "method": "workspace/symbol", "params": {"query": "C"}})
    answer = _wait(server, lambda m: m.get("id") == sentinel)
    assert answer.get("error") is None, answer  # still serving
    is_request = "method" in message and _valid_id(message.get("id"))
    if expected is not None:
        msg_id = message["id"] if _valid_id(message.get("id")) else None  # null when it cannot be read
        if "method" not in message and ("result" in message or "error" in message):
            return  # a malformed response to us: nothing to answer
        found = [m for m in server.messages[before:] if "method" not in m and m.get("id") == msg_id and m is not answer]
        assert found and found[0]["error"]["code"] == expected, (message, server.messages[before:])
    elif is_request:
        # answers from this message on: hypothesis draws ids (-135) that an earlier example's message used too, and
        # that one's answer (an InvalidRequest for a list method) was taken for this one's
        found = _wait(server, lambda m: "method" not in m and m.get("id") == message["id"], since=before)
        error = found.get("error")
        assert error is None or error["code"] in (-32601, -32602, -32803), (message, found)
        if _misplaced(message):
            assert error is not None and error["code"] == -32602, (message, found)


position_requests = st.fixed_dictionaries(
    {
        "method": st.sampled_from(sorted(POSITION_METHODS)),
        "params": st.fixed_dictionaries(
            {"textDocument": st.just({"uri": URI}), "position": positions},
            optional={"newName": st.just("D"), "context": st.just({"includeDeclaration": True})},
        ),
    }
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fields=position_requests)
def test_every_request_about_a_position_gets_invalid_params_when_it_is_not_one(server, fields):
    """Valid requests about a position (the envelope fuzz above makes few): one whose `line` or `character` is not a
    `uinteger` gets InvalidParams; the others a result or a refusal."""
    message = {"id": next(_ids), **fields}
    send_raw(server, json.dumps({"jsonrpc": "2.0", **message}).encode())
    found = _wait(server, lambda m: "method" not in m and m.get("id") == message["id"])
    error = found.get("error")
    if _misplaced(message):
        assert error is not None and error["code"] == -32602, (message, found)
    else:
        assert error is None or error["code"] in (-32602, -32803), (message, found)


def test_rename_to_null_is_invalid_params(server):
    """Issue 45 item 4: `newName: null` renamed the symbol to `None`."""
    reopen(server)  # the fuzz may have closed or changed the document
    for new_name in (None, 5, ["x"]):
        msg_id = next(_ids)
        params = {"textDocument": {"uri": URI}, "position": {"line": 0, "character": 7}, "newName": new_name}
        server.send({"id": msg_id, "method": "textDocument/rename", "params": params})
        found = _wait(server, lambda m, i=msg_id: "method" not in m and m.get("id") == i)
        assert found.get("error", {}).get("code") == -32602, found
        assert "$.params.newName" in found["error"]["message"]
    msg_id = next(_ids)
    params = {"textDocument": {"uri": URI}, "position": {"line": 0, "character": 7}, "newName": "D"}
    server.send({"id": msg_id, "method": "textDocument/rename", "params": params})
    found = _wait(server, lambda m: "method" not in m and m.get("id") == msg_id)
    assert found["result"]["changes"][URI][0]["newText"] == "D"


def test_a_position_that_is_not_an_integer_is_invalid_params(server):
    """A `character` (or `line`) of 1.5, true or "3" was taken as 1 or 3 and answered with a null result."""
    reopen(server)
    for method in sorted(POSITION_METHODS):
        for line, character in ((0, 1.5), (0, True), (0, "3"), ("0", 7), (False, 7)):
            msg_id = next(_ids)
            params = {"textDocument": {"uri": URI}, "position": {"line": line, "character": character}, "newName": "D"}
            server.send({"id": msg_id, "method": method, "params": params})
            found = _wait(server, lambda m, i=msg_id: "method" not in m and m.get("id") == i)
            assert found.get("error", {}).get("code") == -32602, (method, line, character, found)
            assert "$.params.position." in found["error"]["message"]
    msg_id = next(_ids)
    params = {"textDocument": {"uri": URI}, "position": {"line": 0.0, "character": 7.0}}  # JSON: 7.0 is 7
    server.send({"id": msg_id, "method": "textDocument/hover", "params": params})
    assert _wait(server, lambda m: "method" not in m and m.get("id") == msg_id).get("result") is not None


def test_object_and_list_ids_and_integer_methods_are_invalid_requests(server):
    """Issue 45 item 4: an object or list `id` and an integer `method` got -32603 with a traceback."""
    before = len(server.messages)
    for body in (
        {"jsonrpc": "2.0", "id": {"a": 1}, "method": "workspace/symbol", "params": {"query": ""}},
        {"jsonrpc": "2.0", "id": [1], "method": "workspace/symbol", "params": {"query": ""}},
        {"jsonrpc": "2.0", "method": 1, "params": "bar"},  # the spec's own example
    ):
        send_raw(server, json.dumps(body).encode())
    server.send({"id": 42, "method": "textDocument/hover", "params": {"textDocument": {"uri": URI}, "position": 5}})
    _wait(server, lambda m: m.get("id") == 42)
    time.sleep(0.2)
    nulls = [m["error"]["code"] for m in server.messages[before:] if "id" in m and m["id"] is None]
    assert nulls == [-32600, -32600, -32600], server.messages[before:]
    server.send({"id": 43, "method": "textDocument/hover", "params": {"textDocument": {"uri": URI}, "position": 5}})
    assert _wait(server, lambda m: m.get("id") == 43)["error"]["code"] == -32602


def test_a_notification_method_sent_as_a_request_is_answered_method_not_found(server):
    """A request (with an id) for `textDocument/didClose` or `$/cancelRequest` ran as the notification and was never
    answered (the fuzz found it); it gets MethodNotFound, and the document stays open."""
    for method, params in (
        ("textDocument/didClose", {"textDocument": {"uri": URI}}),
        ("$/cancelRequest", {"id": 12345}),
    ):
        msg_id = next(_ids)
        server.send({"id": msg_id, "method": method, "params": params})
        found = _wait(server, lambda m, i=msg_id: "method" not in m and m.get("id") == i)
        assert found["error"]["code"] == -32601 and "is a notification, not a request" in found["error"]["message"]
    msg_id = next(_ids)
    params = {"textDocument": {"uri": URI}, "position": {"line": 0, "character": 7}}
    server.send({"id": msg_id, "method": "textDocument/hover", "params": params})
    assert _wait(server, lambda m: "method" not in m and m.get("id") == msg_id).get("result") is not None
