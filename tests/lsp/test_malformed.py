"""Malformed requests get an answer: raw JSON-RPC frames to the real server process.

Every request method the server implements is sent with `position: null`, no
`textDocument`, `line: -1`, `params: null` and an unknown URI; each must be answered with a
result or a JSON-RPC error (InvalidParams, -32602, or RequestFailed, -32803), never silence,
and nothing may log a traceback (on stderr or to the client)."""

from __future__ import annotations

import json
import subprocess
import threading
import time

from lsprotocol import types as T

from linnet.lsp.server import create_server

from .conftest import EXAMPLES, SERVER, TIMEOUT_S, WORKSPACE

NOT_SENT = {T.INITIALIZE, T.SHUTDOWN}  # the session's own lifecycle
URI = (WORKSPACE / "malformed.linnet").as_uri()
TEXT = "config C {\n  a: int = 1\n}\n"


def request_methods() -> list[str]:
    """The requests the server registers (custom ones included), not its notifications."""
    fm = create_server().protocol.fm
    methods = set(fm.features) | set(fm.builtin_features)
    return sorted(
        m for m in methods if m not in NOT_SENT and (m not in T.METHOD_TO_TYPES or T.METHOD_TO_TYPES[m][1] is not None)
    )


MALFORMED = {
    "position null": {"textDocument": {"uri": URI}, "position": None},
    "no textDocument": {"position": {"line": 0, "character": 0}},
    "line -1": {"textDocument": {"uri": URI}, "position": {"line": -1, "character": 0}},
    "params null": None,
    "unknown uri": {"textDocument": {"uri": "file:///nowhere/nothing.linnet"}, "position": {"line": 0, "character": 0}},
}


class RawClient:
    """Content-Length frames over the server's stdin and stdout."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(SERVER, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.messages: list[dict] = []
        threading.Thread(target=self._read, daemon=True).start()

    def send(self, message: dict) -> None:
        body = json.dumps({"jsonrpc": "2.0", **message}).encode()
        self.process.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        self.process.stdin.flush()

    def _read(self) -> None:
        out = self.process.stdout
        while True:
            length = None
            while (line := out.readline()).strip():
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            if not line or length is None:
                return
            self.messages.append(json.loads(out.read(length)))

    def responses(self, ids: set[int]) -> dict[int, dict]:
        deadline = time.monotonic() + TIMEOUT_S
        while time.monotonic() < deadline:
            found = {m["id"]: m for m in list(self.messages) if m.get("id") in ids and "method" not in m}
            if set(found) == ids:
                return found
            time.sleep(0.05)
        return found

    def close(self) -> str:
        self.send({"id": "bye", "method": "shutdown"})
        self.responses({"bye"})
        self.send({"method": "exit"})
        try:
            _, err = self.process.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            _, err = self.process.communicate()
        return err.decode("utf-8", "replace")


def test_every_malformed_request_is_answered_without_a_traceback():
    client = RawClient()
    try:
        client.send({"id": 0, "method": "initialize", "params": {"capabilities": {}}})
        assert client.responses({0})
        client.send({"method": "initialized", "params": {}})
        open_params = {"textDocument": {"uri": URI, "languageId": "linnet", "version": 1, "text": TEXT}}
        client.send({"method": "textDocument/didOpen", "params": open_params})
        sent: dict[int, tuple[str, str]] = {}
        for method in request_methods():
            for case, params in MALFORMED.items():
                msg_id = len(sent) + 1
                sent[msg_id] = (method, case)
                client.send({"id": msg_id, "method": method, "params": params})
        # malformed notifications are dropped (they have no answer), and the server goes on
        client.send({"method": "textDocument/didChange", "params": None})
        client.send({"method": "textDocument/didOpen", "params": {"textDocument": None}})
        hover = {"textDocument": {"uri": URI}, "position": {"line": 0, "character": 8}}
        client.send({"id": 9999, "method": "textDocument/hover", "params": hover})
        answered = client.responses(set(sent) | {9999})
    finally:
        stderr = client.close()
    missing = [sent[i] for i in sent if i not in answered]
    assert not missing, f"no answer to {missing}"
    for msg_id, (method, case) in sent.items():
        error = answered[msg_id].get("error")
        assert error is None or error["code"] in (-32602, -32803), (method, case, error)
        if case == "params null" and method in T.METHOD_TO_TYPES and T.METHOD_TO_TYPES[method][2] is not None:
            assert error is not None and error["code"] == -32602, (method, case, answered[msg_id])
    by_case = {case: answered[i] for i, (m, case) in sent.items() if m == T.TEXT_DOCUMENT_HOVER}
    assert "@ $.params.position" in by_case["position null"]["error"]["message"]
    assert "required field missing @ $.params.textDocument" in by_case["no textDocument"]["error"]["message"]
    assert by_case["line -1"]["error"]["code"] == -32602
    assert by_case["unknown uri"] == {"jsonrpc": "2.0", "id": by_case["unknown uri"]["id"], "result": None}
    assert "C" in answered[9999]["result"]["contents"]["value"]  # still serving
    assert "Traceback" not in stderr
    logged = [m["params"]["message"] for m in client.messages if m.get("method") == "window/logMessage"]
    assert not [m for m in logged if "Traceback" in m]


def send_raw(client: RawClient, body: bytes) -> None:
    client.process.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
    client.process.stdin.flush()


def test_bodies_that_are_not_json_rpc_2_are_answered_with_id_null():
    """A body that is not JSON gets ParseError (-32700), a batch array, `null` or `"jsonrpc": "1.0"` InvalidRequest
    (-32600), each with id null (the request's id where it has one), a one-line log entry and no traceback; the
    server keeps serving; `exit` after `shutdown` exits 0."""
    client = RawClient()
    try:
        client.send({"id": 0, "method": "initialize", "params": {"capabilities": {}}})
        assert client.responses({0})
        for body in (b"{bad}", b"[]", b'[{"jsonrpc": "2.0", "id": 5, "method": "shutdown"}]', b"null"):
            send_raw(client, body)
        send_raw(client, b'{"jsonrpc": "1.0", "id": 7, "method": "shutdown"}')
        client.send({"id": 8, "method": "workspace/symbol", "params": {"query": ""}})
        assert client.responses({7, 8})[8].get("error") is None  # still serving, and not shut down by id 5
        deadline = time.monotonic() + TIMEOUT_S
        while time.monotonic() < deadline and sum(m.get("id", 0) is None for m in client.messages) < 4:
            time.sleep(0.05)
        nulls = [m["error"]["code"] for m in client.messages if "id" in m and m["id"] is None]
        assert client.responses({7})[7]["error"]["code"] == -32600
    finally:
        stderr = client.close()
    assert sorted(nulls) == [-32700, -32600, -32600, -32600]
    assert "Traceback" not in stderr
    assert client.process.returncode == 0


def test_json_nested_too_deep_or_a_number_too_long_for_int_is_a_parse_error():
    """Bodies that are JSON the decoder cannot take (arrays nested 100,000 deep: RecursionError; an integer of 5,000
    digits: ValueError, Python's int limit) get ParseError (-32700) with id null, as a body that is not JSON does,
    and no traceback on stderr or to the client; the server keeps serving."""
    client = RawClient()
    try:
        client.send({"id": 0, "method": "initialize", "params": {"capabilities": {}}})
        assert client.responses({0})
        position = b'{"line": 1' + b"0" * 5000 + b', "character": 0}'
        too_long = b'{"jsonrpc": "2.0", "id": 3, "method": "textDocument/hover", "params": {"position": %s}}' % position
        for body in (b"[" * 100_000 + b"]" * 100_000, too_long):
            send_raw(client, body)
        client.send({"id": 8, "method": "workspace/symbol", "params": {"query": ""}})
        assert client.responses({8})[8].get("error") is None  # still serving
        deadline = time.monotonic() + TIMEOUT_S
        while time.monotonic() < deadline and sum(m.get("id", 0) is None for m in client.messages) < 2:
            time.sleep(0.05)
        nulls = [m["error"]["code"] for m in client.messages if "id" in m and m["id"] is None]
    finally:
        stderr = client.close()
    assert nulls == [-32700, -32700]
    assert "Traceback" not in stderr
    logged = [m["params"]["message"] for m in client.messages if m.get("method") == "window/logMessage"]
    assert not [m for m in logged if "Traceback" in m]


def test_shutdown_while_a_command_waits_is_answered_and_cancels_it():
    """`shutdown` while a workspace/executeCommand is in flight (here linnet.selectPreset waiting for the client to
    pick from its message request; a run or comparison under way is the same) is answered null, and the command
    RequestCancelled (-32800), with no traceback. pygls cancelled the requests in flight while iterating the dict
    that a cancelled command's future drops itself from (pygls issue #606): shutdown got InternalError."""
    client = RawClient()
    try:
        client.send({"id": 0, "method": "initialize", "params": {"capabilities": {}}})
        assert client.responses({0})
        client.send({"method": "initialized", "params": {}})
        llama = EXAMPLES / "llama.linnet"  # four presets to pick from
        text = llama.read_text(encoding="utf-8")
        open_params = {"textDocument": {"uri": llama.as_uri(), "languageId": "linnet", "version": 1, "text": text}}
        client.send({"method": "textDocument/didOpen", "params": open_params})
        client.send({"id": 1, "method": "workspace/executeCommand", "params": {"command": "linnet.selectPreset"}})
        deadline = time.monotonic() + TIMEOUT_S
        while time.monotonic() < deadline and not any(
            m.get("method") == "window/showMessageRequest" for m in client.messages
        ):
            time.sleep(0.05)
        client.send({"id": 2, "method": "shutdown"})
        answered = client.responses({1, 2})
    finally:
        stderr = client.close()
    assert answered[2] == {"jsonrpc": "2.0", "id": 2, "result": None}
    assert answered[1]["error"]["code"] == -32800
    assert "Traceback" not in stderr


def test_exit_without_shutdown_exits_1():
    client = RawClient()
    client.send({"id": 0, "method": "initialize", "params": {"capabilities": {}}})
    assert client.responses({0})
    client.send({"method": "exit"})
    client.process.communicate(timeout=TIMEOUT_S)
    assert client.process.returncode == 1
