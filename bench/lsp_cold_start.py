"""Cold start of the language server, two checkouts side by side: writes bench/results/lsp_cold_start.json and .md.

A start is what an editor does: spawn `python -m linnet lsp` (bench/lsp_latency.py's GC_TRACE wrapper, which runs
it as the CLI does), initialize, initialized, didOpen, until the first publishDiagnostics of the opened file;
timed from the client (pygls's LanguageClient over stdio). Each checkout gets `--runs` fresh processes per file,
the two interleaved (A, B, A, B, ...) so a change in the machine's load hits both alike, after one untimed start
each (open `SETTLE_S` after its first diagnostics) that fills its bytecode cache and Linnet's cache folder (both
in a temporary folder per checkout: a user's second start). Files: examples/llama.linnet (its `@weights` preset),
the same grown to 3,000 lines, and examples/llama.linnet edited between starts (`EDITED`: what the last start
published is for another text).

Beside the wall time, the server's own CPU time up to the first diagnostics and the time its threads waited for a
CPU (summed over /proc/<pid>/task/*/schedstat: on-CPU and run-queue nanoseconds), so contention on this shared
machine can be told from the server's work; and one `python -X importtime -m linnet lsp` (stdin closed: it imports,
then ends) per checkout, its slowest top-level imports.

Goal (issue 45): cold start to first diagnostics <= 400 ms p90 on examples/llama.linnet.
Run: `python bench/lsp_cold_start.py [--baseline PATH] [--runs N] [--out PATH]` (--baseline: another checkout, as
`git worktree add /tmp/base main`). Timings live here, never in tests.
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
sys.path.insert(0, str(ROOT / "bench"))

import lsp_latency as L  # noqa: E402
from check_speed import calibration_s  # noqa: E402
from generate_speed import machine  # noqa: E402

GOAL_P90_MS = 400.0
# examples/llama.linnet opened as it was at the last start but one: each start opens the other of two texts (both
# parsed before), so what the last start published is never for this text and the start checks before publishing
EDITED = "llama.linnet (edited between starts)"
SETTLE_S = 5.0  # how long an untimed start's session stays open after its first diagnostics


def task_times_ms(pid: int) -> tuple[float, float]:
    """(on-CPU ms, ms waiting for a CPU) of every thread of process `pid` so far (/proc schedstat)."""
    cpu = wait = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "schedstat").read_text().split()
        except OSError:
            continue  # a thread that ended
        cpu, wait = cpu + int(fields[0]), wait + int(fields[1])
    return cpu / 1e6, wait / 1e6


async def one_start(env: dict, root: Path, server_root: Path, path: Path, text: str, settle_s: float = 0.0) -> dict:
    """One start to the first diagnostics of `path` holding `text`; the session then stays open `settle_s` (an
    editor's session outlasts the whole check of a big file, whose end writes what the start keeps) and ends."""
    L.SERVER_ROOT[0] = server_root
    session = L.Session(env)
    t0 = time.perf_counter()
    initialized = await session.start(root)
    session.open(path, text)
    at, diagnostics = await session.diagnostics(1)
    cpu_ms, wait_ms = task_times_ms(session.pid)
    await asyncio.sleep(settle_s)
    await session.stop()
    return {
        "total_s": at - t0,
        "initialize_s": initialized,
        "cpu_ms": cpu_ms,
        "cpu_wait_ms": wait_ms,
        "diagnostics": len(diagnostics),
    }


def edited(text: str) -> str:
    """`text` with one item changed (its docstring comment), as a file edited since the last start."""
    return text.replace("module LlamaMLP", "## Edited since the last start.\nmodule LlamaMLP", 1)


def importtime(env: dict, server_root: Path, top: int = 12) -> list[dict]:
    """The slowest imports of one `python -X importtime -m linnet lsp` with stdin closed, at the top two levels
    (what the process imports, and what those import)."""
    run = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "linnet", "lsp"],
        cwd=server_root,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )
    rows = []
    for line in run.stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        self_us, cumulative_us, name = line.replace("import time:", "").split("|")
        if not self_us.strip().isdigit():
            continue  # the header line
        # -X importtime indents a module two spaces per level below the one that imported it, from one space
        if len(name) - len(name.lstrip(" ")) <= 3:
            rows.append({"module": name.strip(), "cumulative_ms": int(cumulative_us) / 1000})
    return sorted(rows, key=lambda r: -r["cumulative_ms"])[:top]


async def run(args: argparse.Namespace) -> dict:
    checkouts = {"this": ROOT}
    if args.baseline:
        checkouts = {"baseline": args.baseline.resolve(), "this": ROOT}
    result: dict = {
        "benchmark": "lsp_cold_start",
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": {k: v for k, v in machine().items() if k != "threads"},
        "checkouts": {name: f"{path} at {L.git_state(path)['commit'][:10]}" for name, path in checkouts.items()},
        "dirty": {name: L.git_state(path)["dirty"] for name, path in checkouts.items()},
        "runs": args.runs,
        "goal_p90_ms": GOAL_P90_MS,
        "cpu_pressure_before": L.pressure_snapshot(),
        "loadavg_before": os.getloadavg(),
        "calibration_before_s": calibration_s(),
        "files": {},
        "importtime": {},
    }
    with tempfile.TemporaryDirectory(prefix="lsp_cold-") as tmp:
        root = Path(tmp)
        envs = {}
        for name in checkouts:
            env = dict(os.environ)
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            env["PYTHONPYCACHEPREFIX"] = str(root / name / "pycache")
            env["LINNET_CACHE_DIR"] = str(root / name / "cache")
            env["LINNET_BENCH_GC_TRACE"] = str(root / name / "gc_trace.jsonl")
            envs[name] = env
        llama = L.EXAMPLE.read_text(encoding="utf-8")
        # each start opens the next text of its row's list, in turn
        files = {
            "llama.linnet": [llama],
            "llama_3k.linnet": [L.weights_file(3000)],
            EDITED: [llama, edited(llama)],
        }
        for file_name, texts in files.items():
            path = root / file_name.split(" ")[0]
            rows: dict[str, list[dict]] = {name: [] for name in checkouts}
            for text in texts:  # untimed: fills the caches
                path.write_text(text, encoding="utf-8")
                for name, server_root in checkouts.items():
                    await one_start(envs[name], root, server_root, path, text, SETTLE_S)
            wait0 = L.cpu_pressure_us()
            t0 = time.perf_counter()
            for run_idx in range(args.runs):
                text = texts[run_idx % len(texts)]
                path.write_text(text, encoding="utf-8")
                for name, server_root in checkouts.items():
                    rows[name].append(await one_start(envs[name], root, server_root, path, text))
            wall = time.perf_counter() - t0
            wait1 = L.cpu_pressure_us()
            out = {"lines": text.count("\n") + 1}
            if wait0 is not None and wait1 is not None:
                out["cpu_wait_pct"] = 100 * (wait1 - wait0) / 1e6 / wall
            for name, series in rows.items():
                out[name] = {
                    "first_diagnostics": L.summary([r["total_s"] for r in series]),
                    "initialize": L.summary([r["initialize_s"] for r in series]),
                    "server_cpu": L.summary([r["cpu_ms"] / 1000 for r in series]),
                    "server_cpu_wait": L.summary([r["cpu_wait_ms"] / 1000 for r in series]),
                    "diagnostics": sorted({r["diagnostics"] for r in series}),
                }
            result["files"][file_name] = out
        for name, server_root in checkouts.items():
            result["importtime"][name] = importtime(envs[name], server_root)
    result["calibration_after_s"] = calibration_s()
    result["loadavg_after"] = os.getloadavg()
    result["cpu_pressure_after"] = L.pressure_snapshot()
    return result


def markdown(result: dict) -> str:
    m = result["machine"]
    lines = [
        "# Language server: cold start to first diagnostics",
        "",
        f"Written by `bench/lsp_cold_start.py` ({result['date']}). Machine: {m['processor']}, {m['cpus']} CPUs, "
        f"Python {m['python']}; CPU wait (Linux PSI avg60) {result['cpu_pressure_before'].get('avg60', 0):.0f} % "
        f"before, {result['cpu_pressure_after'].get('avg60', 0):.0f} % after; load average "
        f"{result['loadavg_before'][0]:.1f} / {result['loadavg_after'][0]:.1f}. "
        + "; ".join(f"{name}: {where}" for name, where in result["checkouts"].items())
        + f". {result['runs']} fresh processes per file and checkout, interleaved, caches warm (a second start).",
        "",
        "| file | checkout | first diagnostics p50 / p90 / max ms | initialize p50 ms | server CPU p50 / p90 ms "
        "| server waited for a CPU p50 ms | machine's CPU wait (PSI) % |",
        "|---|---|---|---:|---|---:|---:|",
    ]
    for file_name, row in result["files"].items():
        for name in result["checkouts"]:
            r = row[name]
            f = r["first_diagnostics"]
            lines.append(
                f"| {file_name} ({row['lines']} lines) | {name} | {f['p50_ms']:.0f} / {f['p90_ms']:.0f} / "
                f"{f['max_ms']:.0f} | {r['initialize']['p50_ms']:.0f} | {r['server_cpu']['p50_ms']:.0f} / "
                f"{r['server_cpu']['p90_ms']:.0f} "
                f"| {r['server_cpu_wait']['p50_ms']:.0f} | {row.get('cpu_wait_pct', float('nan')):.0f} |"
            )
    lines += ["", f"Goal: examples/llama.linnet p90 <= {result['goal_p90_ms']:.0f} ms.", ""]
    for name, rows in result["importtime"].items():
        top = ", ".join(f"{r['module']} {r['cumulative_ms']:.0f}" for r in rows[:8])
        lines.append(f"- `-X importtime -m linnet lsp`, {name}, slowest top-level imports (ms, cumulative): {top}.")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, help="another Linnet checkout, timed beside this one")
    parser.add_argument("--runs", type=int, default=12, help="fresh processes per file and checkout")
    parser.add_argument("--out", type=Path, help="results path without suffix (default bench/results/lsp_cold_start)")
    args = parser.parse_args()
    out = args.out or ROOT / "bench" / "results" / "lsp_cold_start"
    result = asyncio.run(run(args))
    Path(f"{out}.json").write_text(json.dumps(result, indent=2) + "\n")
    Path(f"{out}.md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
