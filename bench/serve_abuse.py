"""Abuse benchmark for `linnet serve` (issue 42): writes bench/results/serve_abuse.json (or `--out`).

A real `linnet serve` (the embedded SmolLM2-135M-Instruct on torch, `--max-batch 2`, in its own process, from this
checkout or `--server-root`'s) is driven from threads of this process with httpx (the `openai` client's HTTP
library), all bodies encoded before the clock starts:

1. `quiet`: one streaming completion (150 tokens, EOS ignored) while a thread GETs `/health` every 20 ms: the
   longest gap between two streamed chunks and /health's latencies, with nothing else going on;
2. `huge`: the same while `--huge` requests of `--huge-mb` MB arrive one after the other (a completion whose
   prompt is English text, then a chat whose message is): their statuses and seconds, the stream's longest gap
   and /health's latencies while they arrive (goal: /health under 50 ms, no gap over 100 ms);
3. `memory`: the server's RSS (psutil) when idle, after `--memory-requests` such requests (two at a time), and
   5 s later (goal: within 10 % of before); and the server's CPU time per such request (user + system), which
   contention on a shared machine changes far less than wall-clock latencies.

Contention, as bench/generate_speed.py records it: the run waits for quiet cores first, and records the share of
the time some task on this shared machine waited for a CPU (Linux PSI) during each phase.
Run: `python bench/serve_abuse.py [--server-root DIR] [--memory-requests 50] [--out PATH] [-- SERVE_ARGS...]`,
e.g. `-- --max-request-bytes 64000000` to let 10 MB bodies through the body limit to the length check.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import generate_speed as gs  # noqa: E402  (bench/ is not a package)

MODEL = gs.EMBEDDED_ID
HEALTH_EVERY_S = 0.02
STREAM_TOKENS = 150


def _httpx():
    try:
        import httpx
    except ImportError:
        import httpx2 as httpx
    return httpx


def start(server_root: Path, args: list[str], log: Path) -> tuple[subprocess.Popen, str]:
    port = gs_free_port()
    env = {**os.environ, "PYTHONPATH": str(server_root), "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    with open(log, "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "linnet", "serve", "--port", str(port), "--max-batch", "2", *args],
            cwd=server_root,
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=env,
        )
    deadline = time.monotonic() + 600
    while "linnet serve: serving" not in log.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise SystemExit(f"linnet serve did not start:\n{log.read_text()}")
        time.sleep(0.2)
    return proc, f"http://127.0.0.1:{port}"


def gs_free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def huge_bodies(mb: float) -> list[tuple[str, bytes]]:
    """A completion and a chat of about `mb` MB of English text each (this repository's docs, repeated)."""
    text = "\n\n".join(p.read_text() for p in gs.PROMPT_TEXT)
    size = int(mb * 1e6)
    text = (text * (size // len(text) + 1))[:size]
    completion = {"model": MODEL, "prompt": text, "max_tokens": 4}
    chat = {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 4}
    return [
        ("/v1/completions", json.dumps(completion).encode()),
        ("/v1/chat/completions", json.dumps(chat).encode()),
    ]


def post(client, url: str, path: str, body: bytes) -> dict:
    started = time.perf_counter()
    try:
        r = client.post(url + path, content=body, headers={"Content-Type": "application/json"}, timeout=600)
        status, code = r.status_code, (r.json().get("error") or {}).get("code") if r.status_code >= 400 else None
    except Exception as err:  # noqa: BLE001 - a cut connection is a result too
        status, code = None, f"{type(err).__name__}: {err}"
    return {"path": path, "bytes": len(body), "status": status, "code": code, "s": time.perf_counter() - started}


def phase(url: str, bodies: list[tuple[str, bytes]]) -> dict:
    """One stream and the /health prober; `bodies` are sent one after the other once the stream has started."""
    httpx = _httpx()
    stop = threading.Event()
    health: list[float] = []
    chunks: list[float] = []
    started = threading.Event()

    def probe() -> None:
        with httpx.Client() as client:
            while not stop.is_set():
                t = time.perf_counter()
                client.get(url + "/health", timeout=60)
                health.append(time.perf_counter() - t)
                time.sleep(HEALTH_EVERY_S)

    def stream() -> None:
        body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": STREAM_TOKENS, "stream": True}
        body |= {"ignore_eos": True, "temperature": 0}
        with httpx.Client() as client, client.stream("POST", url + "/v1/completions", json=body, timeout=600) as r:
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    chunks.append(time.perf_counter())
                    started.set()
        stop.set()

    pressure0, t0 = gs.cpu_pressure_us(), time.perf_counter()
    with ThreadPoolExecutor(2) as pool:
        probing, streaming = pool.submit(probe), pool.submit(stream)
        started.wait(120)
        sent_from = time.perf_counter()
        with httpx.Client() as client:
            results = [post(client, url, path, body) for path, body in bodies]
        sent_to = time.perf_counter()
        streaming.result()
        stop.set()
        probing.result()
    pressure1, wall = gs.cpu_pressure_us(), time.perf_counter() - t0
    gaps = [b - a for a, b in zip(chunks, chunks[1:], strict=False)]
    during = [b - a for a, b in zip(chunks, chunks[1:], strict=False) if b >= sent_from and a <= sent_to]
    return {
        "requests": results,
        "stream_chunks": len(chunks),
        "max_gap_ms": 1e3 * max(gaps) if gaps else None,
        "max_gap_while_sending_ms": 1e3 * max(during) if during else None,
        "sending_s": sent_to - sent_from,
        "stream_outlasted_sending": bool(chunks) and chunks[-1] > sent_to,
        "health_ms": {
            "n": len(health),
            "p50": 1e3 * statistics.median(health),
            "max": 1e3 * max(health),
        },
        "cpu_wait_pct": None if pressure0 is None else round(100 * (pressure1 - pressure0) / 1e6 / wall, 1),
    }


def memory(url: str, pid: int, bodies: list[tuple[str, bytes]], n: int) -> dict:
    import psutil

    httpx = _httpx()
    process = psutil.Process(pid)
    before = process.memory_info().rss / 2**20
    cpu0 = sum(process.cpu_times()[:2])
    pressure0, t0 = gs.cpu_pressure_us(), time.perf_counter()
    with ThreadPoolExecutor(2) as pool, httpx.Client() as client:
        results = list(pool.map(lambda i: post(client, url, *bodies[i % len(bodies)]), range(n)))
    wall = time.perf_counter() - t0
    cpu = sum(process.cpu_times()[:2]) - cpu0  # the server's CPU seconds: what contention does not change
    after = process.memory_info().rss / 2**20
    time.sleep(5)
    settled = process.memory_info().rss / 2**20
    statuses: dict[str, int] = {}
    for r in results:
        statuses[str(r["status"])] = statuses.get(str(r["status"]), 0) + 1
    return {
        "requests": n,
        "statuses": statuses,
        "seconds": wall,
        "server_cpu_ms_per_request": 1e3 * cpu / n,
        "server_threads": process.num_threads(),
        "rss_mib_before": before,
        "rss_mib_after": after,
        "rss_mib_after_5s": settled,
        "growth_pct": 100 * (settled - before) / before,
        "cpu_wait_pct": None if pressure0 is None else round(100 * (gs.cpu_pressure_us() - pressure0) / 1e6 / wall, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server-root", type=Path, default=ROOT, help="the checkout whose `linnet serve` runs")
    parser.add_argument("--huge-mb", type=float, default=10.0)
    parser.add_argument("--huge", type=int, default=2, help="huge requests sent during the `huge` phase")
    parser.add_argument("--memory-requests", type=int, default=50)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "serve_abuse.json")
    parser.add_argument("serve_args", nargs="*", help="more `linnet serve` arguments (after --)")
    args = parser.parse_args()
    waited = gs.wait_for_quiet(60)
    bodies = huge_bodies(args.huge_mb)
    log = Path(os.environ.get("TMPDIR", "/tmp")) / f"serve_abuse_{os.getpid()}.log"
    proc, url = start(args.server_root.resolve(), args.serve_args, log)
    try:
        httpx = _httpx()
        httpx.post(url + "/v1/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 4}, timeout=120)
        result = {
            "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "machine": gs.machine(),
            "git": gs.git_info(),
            "server_root": str(args.server_root.resolve()),
            "server_git": subprocess.run(
                ["git", "rev-parse", "HEAD"], cwd=args.server_root, capture_output=True, text=True
            ).stdout.strip(),
            "serve_args": ["--max-batch", "2", *args.serve_args],
            "huge_mb": args.huge_mb,
            "waited_for_quiet_s": round(waited, 1),
            "quiet": phase(url, []),
            "huge": phase(url, (bodies * args.huge)[: args.huge]),
            "memory": memory(url, proc.pid, bodies, args.memory_requests),
        }
    finally:
        proc.terminate()
        proc.wait(60)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("quiet", "huge", "memory")}, indent=1))


if __name__ == "__main__":
    main()
