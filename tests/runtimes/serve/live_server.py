"""Start and stop a real `linnet serve` process on a free loopback port, for the HTTP tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT

START_TIMEOUT_S = 180  # a hang, not a slow start: loading takes a few seconds


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(tmp_path: Path, *args: str) -> tuple[subprocess.Popen, str, Path]:
    """Start `linnet serve ARGS` on a free loopback port; returns (process, base URL, stderr log) once it listens.
    Fails with the log when it exits or does not come up."""
    port = _free_port()
    log = tmp_path / f"serve-{port}.log"
    with open(log, "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "linnet", "serve", "--port", str(port), *args],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=err,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    deadline = time.monotonic() + START_TIMEOUT_S
    while "linnet serve: serving" not in log.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"linnet serve did not start (exit {proc.poll()}):\n{log.read_text()}")
        time.sleep(0.2)
    return proc, f"http://127.0.0.1:{port}", log


def stop_server(proc: subprocess.Popen, log: Path) -> tuple[int, str]:
    """SIGTERM, then the exit status and the log."""
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        code = proc.wait()
    return code, log.read_text()
