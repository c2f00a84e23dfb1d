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

from .conftest import SERVER, TIMEOUT_S, WORKSPACE

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
