"""`linnet serve`'s command line: what does not load ends with one line and exit 1 (2 for usage), never a
traceback; SIGINT stops a running server cleanly; a port in use is one error line and exit 1."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.runtimes.serve.live_server import start_server

pytestmark = [pytest.mark.torch]
pytest.importorskip("fastapi")


def serve(*args: str, timeout_s: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "linnet", "serve", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def _one_error_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.startswith("linnet serve:")]
    assert len(lines) == 1, stderr
    return lines[0]


def test_weights_that_do_not_exist_exit_1_with_one_line(tmp_path):
    r = serve("--weights", str(tmp_path / "missing"))
    assert r.returncode == 1
    assert "no such file or folder" in _one_error_line(r.stderr)


def test_a_source_with_errors_exits_1_with_one_line(tmp_path):
    bad = tmp_path / "bad.linnet"
    bad.write_text("model M {\n")
    r = serve(str(bad), "--weights", "smollm2-135m-instruct")
    assert r.returncode == 1, r.stderr
    assert "bad.linnet has errors" in _one_error_line(r.stderr)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--port", "70000"], "--port"),
        (["--api-key", ""], "--api-key"),
        (["--served-model-name", ""], "--served-model-name must not be empty"),  # was served as the weights' path
        (["--prefill-chunk", "0"], "--prefill-chunk"),
        (["--max-num-batched-tokens", "-1"], "--max-num-batched-tokens"),
        (["--max-queue-delay-ms", "-1"], "--max-queue-delay-ms"),
        (["--max-queue-delay-ms", "nan"], "--max-queue-delay-ms"),
    ],
)
def test_bad_options_are_usage_errors(args, says):
    r = serve(*args)
    assert r.returncode == 2
    assert says in _one_error_line(r.stderr)


@pytest.mark.slow
def test_sigint_stops_the_server_and_a_port_in_use_is_one_error(tmp_path):
    proc, url, log = start_server(tmp_path, "--max-positions", "64", "--max-batch", "1")
    port = int(url.rsplit(":", 1)[1])
    taken = serve("--port", str(port), "--max-positions", "64", "--max-batch", "1")
    assert taken.returncode == 1 and "Traceback" not in taken.stderr
    assert "address already in use" in taken.stderr
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 130  # KeyboardInterrupt's status, after uvicorn's clean shutdown
    text = log.read_text()
    assert "Traceback" not in text and "linnet serve: stopped" in text, text
    with socket.socket() as s:  # the port is free again
        s.bind(("127.0.0.1", port))


def _stream(url: str, max_tokens: int) -> socket.socket:
    """A raw streaming completion that would run long (EOS ignored); the socket is left to read."""
    body = json.dumps(
        {
            "model": "smollm2-135m-instruct",
            "prompt": "Once",
            "max_tokens": max_tokens,
            "stream": True,
            "ignore_eos": True,
        }
    ).encode()
    host, port = url.removeprefix("http://").rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=120)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    return sock


def _read_to_end(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    sock.close()
    return data


@pytest.mark.slow
def test_sigterm_ends_running_and_waiting_streams_with_an_error_event_and_done(tmp_path):
    """Streams still running after the shutdown grace period (one generating, one waiting for the only row) end
    with the 503 error event and `[DONE]` and a complete chunked body; they used to be cut mid-chunk by
    uvicorn's task cancellation, which logged a CancelledError traceback per stream."""
    proc, url, log = start_server(tmp_path, "--max-positions", "2048", "--max-batch", "1")
    streams = [_stream(url, 2000) for _ in range(2)]
    streams[0].recv(1)  # the first has started generating
    proc.send_signal(signal.SIGTERM)
    for sock in streams:
        data = _read_to_end(sock)
        assert b'"error": {"message": "the request was cancelled: the server is shutting down"' in data, data[-300:]
        assert data.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n"), data[-300:]
    assert proc.wait(timeout=60) == 0
    text = log.read_text()
    assert "Traceback" not in text and "linnet serve: stopped" in text, text


def test_the_queue_delay_default_is_the_engines():
    from linnet.cli.serve import MAX_QUEUE_DELAY_MS
    from linnet.runtimes.serve.engine import MAX_QUEUE_DELAY_S

    assert MAX_QUEUE_DELAY_MS == 1000 * MAX_QUEUE_DELAY_S
