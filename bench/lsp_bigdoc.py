"""The 5 MB document (issue 45, goal 2): writes bench/results/lsp_bigdoc.json.

The document (bench/bigdoc_source.py): examples/llama.linnet (its `@weights` lines dropped) repeated `--copies`
times (570: 5.5 MB, 111,720 lines, as in the issue), each copy's config, presets and modules renamed with the copy's
number and the copies after the first made `module`s (a file has one root `model`), with the same ten mistakes in
every copy (six unknown names, a wrong argument count, two shape errors, an unread `let`): 5,700 errors and 570
warnings.

Measured, each in a fresh process:

- `linnet check` on it: wall and CPU seconds, peak RSS, the summary line; with `--peer DIR` the same command from
  another checkout (e.g. main before a change) right after, on the same file;
- the language server (`linnet lsp` over stdio, bench/lsp_latency.py's client): didOpen of the big file in a server
  that already holds examples/llama.linnet -> the first publishDiagnostics (the server checks the first screenful
  first) and -> the complete one, and how many diagnostics each published (capped: linnet/lsp/convert.py's
  MAX_PUBLISHED plus one summary); a hover on llama.linnet sent right after the didOpen (it waits for nothing the
  big file does); didClose of the big file, then a hover, then a hover every 250 ms for 6 s (past the server's pause
  after a close, where the closed file's memory is collected): the longest of those hovers and the server's RSS
  after them (`close_pause`); the big file opened again under another name and closed
  at its first publish, while the rest of it is checked, then a keystroke in llama.linnet: the time to that
  keystroke's diagnostics (its check needs the lock the closed file's check held); then the big file opened again
  and, half a second later while it is analysed, `shutdown` + `exit`: the time until the process has ended.

Contention: the CPU pressure (Linux PSI, the share of the time some task waited for a CPU) over each phase is
recorded beside it; a high wait means the numbers are slower than the machine can do.
Goals (issue 45): diagnostics within 2 s of opening, `exit` honoured within 1 s whatever runs, `linnet check` <= 5 s.
Run: `python bench/lsp_bigdoc.py [--copies N] [--peer DIR] [--server-root DIR] [--skip-check] [--skip-lsp]
[--out PATH]`. Timings live here, never in
tests.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import lsp_latency  # noqa: E402
from bigdoc_source import EXAMPLE, big_source  # noqa: E402
from generate_speed import machine  # noqa: E402  (stdlib-only at import time)
from lsp_latency import Phase, Session, git_state, pressure_snapshot  # noqa: E402
from lsprotocol import types as T  # noqa: E402

GOALS_S = {"first_diagnostics": 2.0, "exit": 1.0, "linnet_check": 5.0}


def time_check(tree: Path, path: Path) -> dict:
    """`python -m linnet check PATH` importing `tree`'s linnet: wall and CPU s and peak RSS of that process alone
    (os.wait4), exit status, summary line."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    phases: dict = {}
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err, Phase("check", phases):
        process = subprocess.Popen(
            [sys.executable, "-m", "linnet", "check", str(path)], env=env, cwd=tree, stdout=out, stderr=err, text=True
        )
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    lines = stderr.strip().splitlines()
    return {
        "tree": str(tree),
        "git": git_state(tree),
        "wall_s": phases["check"]["wall_s"],
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "peak_rss_mb": usage.ru_maxrss / 1024,  # kB on Linux
        "cpu_wait_pct": phases["check"]["cpu_wait_pct"],
        "exit_status": process.returncode,
        "summary": lines[-1] if lines else "",
        "stdout_lines": stdout.count("\n"),
    }


def published(session: Session, uri: str) -> list[tuple[float, int]]:
    """(arrival, number of diagnostics) of each publishDiagnostics for `uri`."""
    return [(at, len(p.diagnostics)) for at, p in session.published if p.uri == uri]


async def wait_for(predicate, timeout_s: float, step_s: float = 0.02) -> bool:
    deadline = time.perf_counter() + timeout_s
    while time.perf_counter() < deadline:
        if predicate():
            return True
        await asyncio.sleep(step_s)
    return predicate()


async def hover_s(session: Session, uri: str, position: T.Position) -> float:
    t0 = time.perf_counter()
    await asyncio.wait_for(
        session.client.text_document_hover_async(T.HoverParams(T.TextDocumentIdentifier(uri), position)), 600
    )
    return time.perf_counter() - t0


CLOSE_PAUSE_HOVERS = 24  # a hover every HOVER_EVERY_S after the close: 6 s, past the server's pause (2 s)
HOVER_EVERY_S = 0.25


async def lsp_run(text: str, root: Path, timeout_s: float, tree: Path = ROOT) -> dict:
    """The language-server measurements described in the module docstring, of the server in `tree`."""
    phases: dict = {}
    env = dict(os.environ, PYTHONPATH=str(tree), LINNET_BENCH_GC_TRACE=str(root / "gc.jsonl"))
    lsp_latency.TIMEOUT_S = timeout_s
    lsp_latency.SERVER_ROOT[0] = tree
    session = Session(env)
    await session.start(root)
    example = EXAMPLE.read_text(encoding="utf-8")
    session.open(root / "llama.linnet", example)
    await session.diagnostics(1)
    small_uri = session.uri
    hover_at = session.position(example.index("fn forward(x: [..., c.hidden_size])") + 3)
    big = root / "big.linnet"
    out: dict = {}
    with Phase("open", phases):
        t0 = time.perf_counter()
        session.open(big, text)
        out["hover_during_open_s"] = await hover_s(session, small_uri, hover_at)
        await wait_for(lambda: published(session, session.uri), timeout_s)
        first = published(session, session.uri)
        out["first_diagnostics_s"] = first[0][0] - t0 if first else None
        out["first_published"] = first[0][1] if first else None
        complete = await wait_for(lambda: len(published(session, session.uri)) >= 2, timeout_s, 0.1)
        rows = published(session, session.uri)
        out["complete_diagnostics_s"] = rows[-1][0] - t0 if complete else None
        out["complete_published"] = rows[-1][1] if complete else None
        out["publishes"] = len(rows)
    out["summary_diagnostic"] = next(
        (d.message for _, p in session.published[::-1] if p.uri == session.uri for d in p.diagnostics[-1:]), None
    )
    out["rss_after_open_mb"] = session.status()
    with Phase("close", phases):
        session.client.text_document_did_close(T.DidCloseTextDocumentParams(T.TextDocumentIdentifier(session.uri)))
        out["hover_after_close_s"] = await hover_s(session, small_uri, hover_at)
    with Phase("close_pause", phases):
        hovers = []
        for _ in range(CLOSE_PAUSE_HOVERS):
            hovers.append(await hover_s(session, small_uri, hover_at))
            await asyncio.sleep(HOVER_EVERY_S)
        out["close_pause_longest_hover_s"] = max(hovers)
        out["rss_after_close_pause_mb"] = session.status()
    with Phase("close_while_checking", phases):
        session.open(root / "big_closed.linnet", text)
        big_uri = session.uri
        await wait_for(lambda: published(session, big_uri), timeout_s)  # its first screenful: the rest is checked now
        session.client.text_document_did_close(T.DidCloseTextDocumentParams(T.TextDocumentIdentifier(big_uri)))
        session.uri, session.text, session.version = small_uri, example, 1  # a keystroke in llama.linnet
        at = example.index("q_proj(x)", example.index("fn project("))
        sent = session.change(at, at + 1, "v")  # (same shapes: a check, no new diagnostics)
        arrived, _ = await session.diagnostics(session.version)
        out["edit_after_closing_while_checking_s"] = arrived - sent
    with Phase("exit", phases):
        session.open(root / "big_again.linnet", text)
        await asyncio.sleep(0.5)  # its analysis is under way
        process = session.client._server
        t0 = time.perf_counter()
        await asyncio.wait_for(session.client.shutdown_async(None), timeout_s)
        out["shutdown_response_s"] = time.perf_counter() - t0
        session.client.exit(None)
        try:
            await asyncio.wait_for(process.wait(), 30)
            out["exit_s"] = time.perf_counter() - t0
        except asyncio.TimeoutError:
            out["exit_s"] = None  # still running 30 s later
            process.kill()
        out["exit_status"] = process.returncode
    await session.client.stop()
    session._stderr_task.cancel()
    for name, phase in phases.items():
        phase.pop("window", None)
        out[f"{name}_phase"] = phase
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, default=570)
    parser.add_argument("--peer", type=Path, help="also time `linnet check` from this checkout (e.g. main)")
    parser.add_argument("--skip-lsp", action="store_true")
    parser.add_argument("--skip-check", action="store_true")
    parser.add_argument("--server-root", type=Path, default=ROOT, help="time the language server of this checkout")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for each publish")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "lsp_bigdoc.json")
    args = parser.parse_args()
    text = big_source(args.copies)
    result: dict = {
        "machine": machine(),
        "git": git_state(),
        "pressure_before": pressure_snapshot(),
        "document": {"copies": args.copies, "bytes": len(text.encode()), "lines": text.count("\n")},
        "goals_s": GOALS_S,
    }
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        path = root / "big.linnet"
        path.write_text(text, encoding="utf-8")
        if not args.skip_check:
            result["linnet_check"] = time_check(ROOT, path)
            print(json.dumps(result["linnet_check"]), flush=True)
        if args.peer is not None:
            result["linnet_check_peer"] = time_check(args.peer.resolve(), path)
            print(json.dumps(result["linnet_check_peer"]), flush=True)
        if not args.skip_lsp:
            result["lsp_server"] = {"tree": str(args.server_root), "git": git_state(args.server_root.resolve())}
            result["lsp"] = asyncio.run(lsp_run(text, root, args.timeout, args.server_root.resolve()))
            print(json.dumps(result["lsp"]), flush=True)
    result["pressure_after"] = pressure_snapshot()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
