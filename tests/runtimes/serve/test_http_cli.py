"""`linnet serve`'s command line: what does not load ends with one line and exit 1 (2 for usage), never a
traceback; SIGINT stops a running server cleanly; a port in use is one error line and exit 1."""

from __future__ import annotations

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


@pytest.mark.parametrize(("args", "says"), [(["--port", "70000"], "--port"), (["--api-key", ""], "--api-key")])
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
