"""Language-server latency benchmark: writes bench/results/lsp_latency.json and lsp_latency.md.

A client (pygls's LanguageClient) starts `python -m linnet lsp` over stdio, as an editor does, and times from the
client's side (so every number includes JSON-RPC both ways):

- edit -> diagnostics: one didChange inside one function of the generated 5,000-line file (bench/check_speed.py's
  file: a config, presets, and modules with let-chains, the examples' attention and gated-MLP blocks; it checks
  clean) until the publishDiagnostics of that version arrives; p50, p99 and the worst over `--samples` edits of
  each kind: `keeps` toggles one character of a let
  expression (`v_proj` <-> `q_proj`, same shapes, no diagnostics), `breaks` toggles `up_proj` <-> `o_proj`, which
  alternately breaks the shapes of `gate * up` and mends them (one error, then none);
- hover on a let name, completion after `c.` and at an empty position in a function body, inlay hints for a
  screenful (50 lines): p50, p99 and the worst over `--samples` requests on a settled document (its analysis is
  cached: these time the feature, not a re-check);
- open a 5,000-line file in a running server: didOpen -> the first publishDiagnostics, and -> the complete ones
  (the server publishes a big file's first diagnostics progressively), and a hover sent right after the didOpen;
  `--open-runs` times, each with a fresh URI;
- cold start: process spawn -> initialize -> initialized -> didOpen -> first publishDiagnostics, on
  examples/llama.linnet and on the 5,000-line file, p50, p90 and the worst of `--cold-runs` fresh processes
  (bytecode cached under a temporary PYTHONPYCACHEPREFIX by one untimed start first, as a user's second start);
- garbage collection in the server: the server runs under a `gc.callbacks` hook (GC_TRACE below, nothing in the
  server itself) that logs every collection's generation and pause; each phase reports the collections that fell
  inside it (count, full collections, the longest pause), so a slow p99 can be told apart from a collector stall;
- the server's peak RSS (VmHWM in /proc/<pid>/status) before shutdown, after all of the above on the big file.

Contention: other processes may share this machine's cores. The CPU pressure (Linux PSI, /proc/pressure/cpu: the
share of the time some task waited for a CPU) over each phase and a fixed pure-Python workload before and after are
recorded beside the results; a high wait means the numbers are slower than the machine can do.

Goals (issue 20, 5,000-line file): edit -> diagnostics <= 16 ms p50 and <= 50 ms p99; hover and completion <= 10 ms
p99; cold start to first diagnostics on an example <= 0.5 s p90 over 10 starts; open a 5,000-line file to first
diagnostics <= 1 s.
Run: `python bench/lsp_latency.py [--samples N] [--cold-runs N] [--open-runs N] [--quick] [--out PATH]`.
Timings live here, never in tests.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from check_speed import calibration_s, generated_source  # noqa: E402
from generate_speed import machine  # noqa: E402  (stdlib-only at import time)
from lsprotocol import types as T  # noqa: E402
from pygls.lsp.client import LanguageClient  # noqa: E402

from linnet.lsp.server import PROGRESSIVE_LINES  # noqa: E402

# The server as `linnet lsp` runs it (the CLI's path), under a gc.callbacks hook that appends one JSON line per
# collection (generation, start on CLOCK_MONOTONIC, which every process shares on Linux, and pause) to
# $LINNET_BENCH_GC_TRACE.
GC_TRACE = """
import gc, json, os, time
out = open(os.environ["LINNET_BENCH_GC_TRACE"], "a", buffering=1)
started = [0.0]
def trace(phase, info):
    if phase == "start":
        started[0] = time.monotonic()
    else:
        t = time.monotonic()
        out.write(json.dumps([info["generation"], started[0], t - started[0]]) + chr(10))
gc.callbacks.append(trace)
from linnet.cli import main
raise SystemExit(main(["lsp"]))
"""
SERVER = [sys.executable, "-c", GC_TRACE]
EXAMPLE = ROOT / "examples" / "llama.linnet"
TIMEOUT_S = 60.0
SERVER_ROOT = [ROOT]  # the Linnet tree the server imports (--server-root: time another checkout with this client)
PAUSE_S = 4.0  # a pause in typing, longer than the server's idle delay (linnet/lsp/collector.py IDLE_S)
GOALS_MS = {
    "edit_to_diagnostics_p50": 16.0,
    "edit_to_diagnostics_p99": 50.0,
    "hover_p99": 10.0,
    "completion_p99": 10.0,
    "cold_start_example_p90": 500.0,
    "open_big_file_first_diagnostics": 1000.0,
}


def cpu_pressure_us() -> int | None:
    """Microseconds some runnable task on this machine waited for a CPU (Linux PSI)."""
    try:
        some = Path("/proc/pressure/cpu").read_text().splitlines()[0]
        return int(some.rsplit("total=", 1)[1])
    except (OSError, IndexError, ValueError):
        return None


def pressure_snapshot() -> dict:
    try:
        text = Path("/proc/pressure/cpu").read_text().splitlines()[0]
    except OSError:
        return {}
    return {k: float(v) for k, v in (f.split("=") for f in text.split()[1:]) if k.startswith("avg")}


class Phase:
    """Wall time, CPU wait % and the server's garbage collections during a block of measurements."""

    def __init__(self, name: str, phases: dict, gc_trace: GcTrace | None = None):
        self.name, self.phases, self.gc_trace = name, phases, gc_trace

    def __enter__(self):
        self.t0, self.m0, self.p0 = time.perf_counter(), time.monotonic(), cpu_pressure_us()
        return self

    def __exit__(self, *exc):
        wall, p1 = time.perf_counter() - self.t0, cpu_pressure_us()
        wait = None if self.p0 is None or p1 is None else 100 * (p1 - self.p0) / 1e6 / wall
        self.phases[self.name] = {"wall_s": wall, "cpu_wait_pct": wait, "window": (self.m0, time.monotonic())}


def collections_by_phase(phases: dict, gc_trace: GcTrace) -> None:
    """Each phase's collections, read once every server has exited (a collection is logged when it ends)."""
    for phase in phases.values():
        phase["gc"] = gc_trace.between(*phase.pop("window"))


def percentile(sorted_ms: list[float], q: float) -> float:
    """The nearest-rank `q` quantile (0..1) of sorted samples: a sample that was measured, never an interpolation
    (with 100 samples p99 is the second worst)."""
    return sorted_ms[max(0, math.ceil(q * len(sorted_ms)) - 1)]


def summary(samples_s: list[float]) -> dict:
    """p50, p90, p95, p99, extremes and the sorted samples (kept in the JSON, and to pool two series)."""
    ms = sorted(x * 1000 for x in samples_s)
    return {
        "n": len(ms),
        "p50_ms": statistics.median(ms),
        "p90_ms": percentile(ms, 0.90),
        "p95_ms": percentile(ms, 0.95),
        "p99_ms": percentile(ms, 0.99),
        "min_ms": ms[0],
        "max_ms": ms[-1],
        "samples_ms": [round(x, 3) for x in ms],
    }


class GcTrace:
    """The server's collections (GC_TRACE's log), read back per phase."""

    def __init__(self, path: Path):
        self.path = path

    def rows(self) -> list[tuple[int, float, float]]:
        """(generation, start on time.monotonic(), pause s) of every collection logged so far (a collection is
        logged when it ends)."""
        out = []
        if self.path.exists():
            for line in self.path.read_text().splitlines():
                try:
                    gen, start, pause = json.loads(line)
                except ValueError:
                    continue  # a line a killed process left half-written
                out.append((gen, start, pause))
        return out

    def between(self, t0: float, t1: float) -> dict:
        """Collections that ran at some time in [t0, t1] (time.monotonic()): how many, how many were full
        (generation 2), their total and longest pause."""
        rows = [(gen, pause) for gen, start, pause in self.rows() if start <= t1 and start + pause >= t0]
        full = [p for g, p in rows if g == 2]
        return {
            "collections": len(rows),
            "full_collections": len(full),
            "total_pause_ms": 1000 * sum(p for _, p in rows),
            "max_pause_ms": 1000 * max((p for _, p in rows), default=0.0),
            "max_full_pause_ms": 1000 * max(full, default=0.0),
        }


def pooled(*summaries: dict) -> dict:
    return summary([x / 1000 for s in summaries for x in s["samples_ms"]])


class Session:
    """One server process and the client's view of one open document."""

    def __init__(self, env: dict):
        self.env = env
        self.client = LanguageClient("linnet-bench", "1")
        self.published: list[tuple[float, T.PublishDiagnosticsParams]] = []
        self.arrived = asyncio.Event()

        def publish(params: T.PublishDiagnosticsParams) -> None:
            self.published.append((time.perf_counter(), params))
            self.arrived.set()

        self.client.feature(T.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)(publish)
        self.uri, self.text, self.version = "", "", 0
        self.stderr: list[bytes] = []

    async def _drain_stderr(self) -> None:
        """Keep reading the server's stderr so a full pipe never blocks it."""
        stream = self.client._server.stderr
        while line := await stream.readline():
            self.stderr.append(line)

    async def start(self, root: Path) -> float:
        """Spawn and initialize; the time of the initialize response after spawning."""
        t0 = time.perf_counter()
        await self.client.start_io(*SERVER, env=self.env, cwd=str(SERVER_ROOT[0]))
        self._stderr_task = asyncio.create_task(self._drain_stderr())
        await asyncio.wait_for(
            self.client.initialize_async(
                T.InitializeParams(
                    capabilities=T.ClientCapabilities(),
                    root_uri=root.as_uri(),
                    workspace_folders=[T.WorkspaceFolder(root.as_uri(), root.name)],
                )
            ),
            TIMEOUT_S,
        )
        self.client.initialized(T.InitializedParams())
        return time.perf_counter() - t0

    @property
    def pid(self) -> int:
        return self.client._server.pid

    def open(self, path: Path, text: str) -> None:
        self.uri, self.text, self.version = path.as_uri(), text, 1
        self.client.text_document_did_open(T.DidOpenTextDocumentParams(T.TextDocumentItem(self.uri, "linnet", 1, text)))

    async def diagnostics(self, version: int) -> tuple[float, list[T.Diagnostic]]:
        """(arrival time, diagnostics) of the publishDiagnostics for `version`."""
        deadline = time.perf_counter() + TIMEOUT_S
        while True:
            for at, p in reversed(self.published):
                if p.uri == self.uri and p.version == version:
                    return at, list(p.diagnostics)
            self.arrived.clear()
            await asyncio.wait_for(self.arrived.wait(), max(0.001, deadline - time.perf_counter()))

    async def complete_diagnostics(self) -> float:
        """The arrival time of the last publishDiagnostics of an opened document's first version: the second one
        for a file of PROGRESSIVE_LINES lines or more (the server publishes its first items first), else the
        first."""
        expected = 2 if self.text.count("\n") + 1 >= PROGRESSIVE_LINES else 1
        deadline = time.perf_counter() + TIMEOUT_S
        while True:
            mine = [at for at, p in self.published if p.uri == self.uri and p.version == 1]
            if len(mine) >= expected:
                return mine[expected - 1]
            self.arrived.clear()
            await asyncio.wait_for(self.arrived.wait(), max(0.001, deadline - time.perf_counter()))

    def position(self, offset: int) -> T.Position:
        line = self.text.count("\n", 0, offset)
        start = self.text.rfind("\n", 0, offset) + 1
        return T.Position(line, len(self.text[start:offset].encode("utf-16-le")) // 2)

    def change(self, start: int, end: int, new: str) -> float:
        """A ranged didChange; the time it was written."""
        rng = T.Range(self.position(start), self.position(end))
        self.text = self.text[:start] + new + self.text[end:]
        self.version += 1
        self.client.text_document_did_change(
            T.DidChangeTextDocumentParams(
                T.VersionedTextDocumentIdentifier(version=self.version, uri=self.uri),
                [T.TextDocumentContentChangePartial(range=rng, text=new)],
            )
        )
        return time.perf_counter()

    def status(self) -> dict:
        """VmHWM and VmRSS of the server process, MB."""
        out = {}
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmHWM", "VmRSS"):
                out[key] = int(value.split()[0]) / 1024  # kB
        return out

    async def stop(self) -> None:
        try:
            await asyncio.wait_for(self.client.shutdown_async(None), TIMEOUT_S)
            self.client.exit(None)
        finally:
            await self.client.stop()
            self._stderr_task.cancel()


async def timed(request) -> tuple[float, object]:
    t0 = time.perf_counter()
    result = await asyncio.wait_for(request, TIMEOUT_S)
    return time.perf_counter() - t0, result


async def cold_start(env: dict, root: Path, path: Path, text: str) -> dict:
    session = Session(env)
    t0 = time.perf_counter()
    initialized = await session.start(root)
    session.open(path, text)
    at, diags = await session.diagnostics(1)
    await session.stop()
    return {"total_s": at - t0, "initialize_s": initialized, "diagnostics": len(diags)}


async def cold_starts(env: dict, root: Path, path: Path, text: str, runs: int) -> dict:
    await cold_start(env, root, path, text)  # untimed: fills the bytecode cache
    rows = [await cold_start(env, root, path, text) for _ in range(runs)]
    out = summary([r["total_s"] for r in rows])
    out["initialize"] = summary([r["initialize_s"] for r in rows])
    out["diagnostics"] = rows[0]["diagnostics"]
    return out


async def open_big_file(env: dict, root: Path, text: str, runs: int, phases: dict, gc_trace: GcTrace) -> dict:
    """didOpen of the 5,000-line file in a running server (the standard library and an example already checked, as
    in an editor session) -> the first publishDiagnostics and -> the complete one, and a hover on a name near the
    top sent right after the didOpen; a fresh URI each run."""
    session = Session(env)
    await session.start(root)
    session.open(root / "llama.linnet", EXAMPLE.read_text(encoding="utf-8"))
    await session.diagnostics(1)
    first, complete, hover, publishes = [], [], [], []
    name_at = text.index("let q = heads") + len("let ")
    with Phase("open_big_file", phases, gc_trace):
        for run in range(runs):
            path = root / f"opened_{run}.linnet"
            path.write_text(text, encoding="utf-8")
            session.open(path, text)
            sent = time.perf_counter()
            request = session.client.text_document_hover_async(
                T.HoverParams(T.TextDocumentIdentifier(session.uri), session.position(name_at))
            )
            result = await asyncio.wait_for(request, TIMEOUT_S)
            hover.append(time.perf_counter() - sent)  # from the didOpen, as the user waits
            assert result is not None and "q:" in result.contents.value, result
            await session.diagnostics(1)
            at = min(t for t, p in session.published if p.uri == session.uri and p.version == 1)
            first.append(at - sent)
            complete.append(await session.complete_diagnostics() - sent)
            publishes.append([len(p.diagnostics) for _, p in session.published if p.uri == session.uri])
            session.client.text_document_did_close(T.DidCloseTextDocumentParams(T.TextDocumentIdentifier(session.uri)))
    await session.stop()
    return {
        "first_diagnostics": summary(first),
        "complete_diagnostics": summary(complete),
        "hover_after_open": summary(hover),
        "publishes": publishes,
    }


async def steady_state(
    env: dict, root: Path, path: Path, text: str, samples: int, phases: dict, gc_trace: GcTrace
) -> dict:
    session = Session(env)
    await session.start(root)
    session.open(path, text)
    await session.complete_diagnostics()
    out: dict = {"file_lines": text.count("\n"), "file_chars": len(text)}
    blocks = [i for i in range(len(text)) if text.startswith("module Block", i)]
    middle = blocks[len(blocks) // 2]

    def find(needle: str) -> int:
        return session.text.index(needle, middle)

    # ---- edit -> diagnostics (and the server's memory before and after: it should not grow with edits)
    rss_open = session.status()["VmRSS"]
    edits_before = session.version
    with Phase("edit_to_diagnostics", phases, gc_trace):
        for kind, needle, a, b in (
            ("keeps", "let v = heads(v_proj(x))", "v", "q"),
            ("breaks", "let up = up_proj(x)", "up", "o"),
        ):
            at = find(needle) + needle.index(f"{a}_proj")
            times, counts = [], set()
            current, other = a, b
            for n in range(samples):
                sent = session.change(at, at + len(current), other)
                arrived, diags = await session.diagnostics(session.version)
                times.append(arrived - sent)
                counts.add((n % 2, len(diags)))
                current, other = other, current
            if current != a:  # leave the text as it was
                session.change(at, at + len(current), a)
                await session.diagnostics(session.version)
            want = {(0, 0), (1, 0)} if kind == "keeps" else {(0, 1), (1, 0)}
            assert counts == want, f"{kind}: (edit parity, diagnostics) {sorted(counts)}, expected {sorted(want)}"
            out[f"edit_to_diagnostics_{kind}"] = summary(times)
    out["edit_to_diagnostics"] = pooled(out["edit_to_diagnostics_keeps"], out["edit_to_diagnostics_breaks"])
    edits = session.version - edits_before
    rss_edited = session.status()["VmRSS"]
    with Phase("pause_after_edits", phases, gc_trace):  # the server collects in pauses: give it one
        paused_at = time.monotonic()
        await asyncio.sleep(PAUSE_S)
        idle_full = []
        for _ in range(int(TIMEOUT_S / 0.1)):  # until the full collection the pause started has ended
            idle_full = [p for g, t, p in gc_trace.rows() if g == 2 and t >= paused_at]
            if idle_full:
                break
            await asyncio.sleep(0.1)
    rss_paused = session.status()["VmRSS"]
    out["idle_full_collection_ms"] = 1000 * max(idle_full) if idle_full else None
    out["rss_growth"] = {
        "after_open_mb": rss_open,
        "after_edits_mb": rss_edited,
        "after_pause_mb": rss_paused,
        "edits": edits,
        "kb_per_edit": 1024 * (rss_edited - rss_open) / edits,
    }

    doc = T.TextDocumentIdentifier(session.uri)

    # ---- hover on a let name, settled
    with Phase("hover", phases, gc_trace):
        at = session.position(find("let q = heads") + len("let "))
        times = []
        for _ in range(samples):
            dt, result = await timed(session.client.text_document_hover_async(T.HoverParams(doc, at)))
            assert result is not None and "q: [B, c.num_heads, S, c.head_dim]" in result.contents.value, result
            times.append(dt)
        out["hover"] = summary(times)

    # ---- completion after `c.` and at an empty position in a body (each after one edit, then settled)
    with Phase("completion", phases, gc_trace):
        anchor = find("let up = up_proj(x)") + len("let up = up_proj(x)")
        for kind, line, expect in (
            ("after_c_dot", "\n        let zz = c.", "hidden_size"),
            ("empty_scope", "\n        ", "gate"),
        ):
            session.change(anchor, anchor, line)
            await session.diagnostics(session.version)
            at = session.position(anchor + len(line))
            times = []
            for _ in range(samples):
                dt, result = await timed(session.client.text_document_completion_async(T.CompletionParams(doc, at)))
                labels = {i.label for i in (result.items if isinstance(result, T.CompletionList) else result)}
                assert expect in labels, (kind, sorted(labels)[:20])
                times.append(dt)
            out[f"completion_{kind}"] = summary(times)
            out[f"completion_{kind}"]["items"] = len(labels)
            session.change(anchor, anchor + len(line), "")
            await session.diagnostics(session.version)
    out["completion"] = pooled(out["completion_after_c_dot"], out["completion_empty_scope"])

    # ---- inlay hints for a screenful
    with Phase("inlay_hints", phases, gc_trace):
        first = session.position(middle).line
        rng = T.Range(T.Position(first, 0), T.Position(first + 50, 0))
        times = []
        for _ in range(samples):
            dt, result = await timed(session.client.text_document_inlay_hint_async(T.InlayHintParams(doc, rng)))
            assert result, "no inlay hints"
            times.append(dt)
        out["inlay_hints_50_lines"] = summary(times)
        out["inlay_hints_50_lines"]["hints"] = len(result)

    out["server_memory_mb"] = session.status()
    await session.stop()
    return out


def git_state(root: Path = ROOT) -> dict:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True).stdout.strip()

    return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain", "--", "lsp", "linnet"))}


def markdown(result: dict) -> str:
    s, c, o = result["steady_state"], result["cold_start"], result["open_big_file"]
    g = GOALS_MS
    m, v = result["machine"], result["versions"]
    rows = [
        (
            "edit → diagnostics, 5,000 lines (both kinds)",
            s["edit_to_diagnostics"],
            f"{g['edit_to_diagnostics_p50']:.0f} p50, {g['edit_to_diagnostics_p99']:.0f} p99",
            s["edit_to_diagnostics"]["p50_ms"] <= g["edit_to_diagnostics_p50"]
            and s["edit_to_diagnostics"]["p99_ms"] <= g["edit_to_diagnostics_p99"],
        ),
        ("  keeps shapes (`v_proj` ↔ `q_proj`)", s["edit_to_diagnostics_keeps"], "", None),
        ("  breaks / mends a shape (`up_proj` ↔ `o_proj`)", s["edit_to_diagnostics_breaks"], "", None),
        ("hover on a `let` name", s["hover"], f"{g['hover_p99']:.0f} p99", s["hover"]["p99_ms"] <= g["hover_p99"]),
        (
            "completion (both)",
            s["completion"],
            f"{g['completion_p99']:.0f} p99",
            s["completion"]["p99_ms"] <= g["completion_p99"],
        ),
        ("  after `c.`", s["completion_after_c_dot"], "", None),
        ("  empty position in a body", s["completion_empty_scope"], "", None),
        ("inlay hints, 50 lines", s["inlay_hints_50_lines"], "", None),
        (
            "open 5,000 lines → first diagnostics",
            o["first_diagnostics"],
            f"{g['open_big_file_first_diagnostics']:.0f}",
            o["first_diagnostics"]["max_ms"] <= g["open_big_file_first_diagnostics"],
        ),
        ("open 5,000 lines → complete diagnostics", o["complete_diagnostics"], "", None),
        ("open 5,000 lines → a hover sent with the didOpen", o["hover_after_open"], "", None),
        (
            "cold start → first diagnostics, examples/llama.linnet",
            c["example"],
            f"{g['cold_start_example_p90']:.0f} p90",
            c["example"]["p90_ms"] <= g["cold_start_example_p90"],
        ),
        (f"cold start → first diagnostics, generated {s['file_lines']} lines", c["generated"], "", None),
    ]
    lines = [
        "# Language server latency",
        "",
        f"Written by `bench/lsp_latency.py` ({result['date']}). Client: pygls {v['pygls']} over stdio; server "
        f"`python -m linnet lsp`, Linnet at {v['linnet_git']['commit'][:10]}"
        f"{' (with uncommitted changes)' if v['linnet_git']['dirty'] else ''}. Machine: {m['processor']}, "
        f"{m['cpus']} CPUs, Python {m['python']}. Requests on a settled document ({s['file_lines']} lines); "
        f"{result['settings']['samples']} samples per edit kind and request row, {result['settings']['open_runs']} "
        f"opens, {result['settings']['cold_runs']} cold starts per file.",
        "",
        "| measurement | n | p50 ms | p90 ms | p99 ms | worst ms | goal ms | met |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name, r, goal, met in rows:
        lines.append(
            f"| {name} | {r['n']} | {r['p50_ms']:.1f} | {r['p90_ms']:.1f} | {r['p99_ms']:.1f} | {r['max_ms']:.1f} "
            f"| {goal} | {'' if met is None else ('yes' if met else 'no')} |"
        )
    mem, growth = s["server_memory_mb"], s["rss_growth"]
    ph = result["phases"]
    lines += [
        "",
        "| phase | wall s | CPU wait % | collections | full | longest full pause ms | longest pause ms |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in ph.items():
        gc_ = r.get("gc") or {}
        wait = r.get("cpu_wait_pct")
        lines.append(
            f"| {name} | {r['wall_s']:.1f} | {'' if wait is None else f'{wait:.0f}'} | {gc_.get('collections', '')} "
            f"| {gc_.get('full_collections', '')} | {gc_.get('max_full_pause_ms', 0):.1f} "
            f"| {gc_.get('max_pause_ms', 0):.1f} |"
        )
    pb, pa = result["cpu_pressure_before"], result["cpu_pressure_after"]
    lines += [
        "",
        f"Server peak RSS (VmHWM) after the steady-state rows on the 5,000-line file: {mem.get('VmHWM', 0):.0f} MB "
        f"(VmRSS {mem.get('VmRSS', 0):.0f} MB). VmRSS after opening it: {growth['after_open_mb']:.0f} MB; after "
        f"the {growth['edits']} edits timed above: {growth['after_edits_mb']:.0f} MB "
        f"({growth['kb_per_edit']:.0f} kB per edit); after a pause (at least {PAUSE_S:.0f} s, until the server's "
        f"idle full collection ended): {growth.get('after_pause_mb', 0):.0f} MB. That collection took "
        f"{s.get('idle_full_collection_ms') or 0:.0f} ms (a request arriving during it waits; none was sent).",
        "",
        f"Contention: CPU wait above is Linux PSI (the share of the phase's time some task waited for a CPU). "
        f"PSI avg10/avg60 before: {pb.get('avg10', 0):.1f} / {pb.get('avg60', 0):.1f} %, after: "
        f"{pa.get('avg10', 0):.1f} / {pa.get('avg60', 0):.1f} %. Python loop calibration before / after: "
        f"{result['calibration_before_s']:.2f} / {result['calibration_after_s']:.2f} s; load average "
        f"{result['loadavg_before'][0]:.1f} / {result['loadavg_after'][0]:.1f}.",
        "",
        "- Times are the client's: from writing the didChange to reading the publishDiagnostics of that version; "
        "from writing a request to reading its response. Percentiles are nearest-rank (a measured sample).",
        "- edit → diagnostics: the file declares two presets, so each check runs under three configurations "
        "(defaults and both presets); `breaks` alternates one error and none (the script checks that it does).",
        "- Open: a file of 1,000+ lines gets two publishes of its first version: the first has every syntax error "
        "and the findings of the items in its first 150 lines, the complete one everything (linnet/lsp/server.py "
        "`_check_first_items`). The hover is timed from the didOpen.",
        "- Collections: the server's own (`gc.callbacks`), those that ran during each phase.",
        "- Cold start: fresh process each run, bytecode cached (an untimed start first).",
        "",
    ]
    return "\n".join(lines)


async def run(args: argparse.Namespace) -> dict:
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    result: dict = {
        "benchmark": "lsp_latency",
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(),
        },
        "versions": {
            "linnet": __import__("linnet").__version__,
            "pygls": __import__("importlib.metadata").metadata.version("pygls"),
            "linnet_git": git_state(),
        },
        "settings": {
            "samples": args.samples,
            "cold_runs": args.cold_runs,
            "open_runs": args.open_runs,
            "lines": args.lines,
        },
        "goals_ms": GOALS_MS,
        "cpu_pressure_before": pressure_snapshot(),
        "loadavg_before": os.getloadavg(),
        "calibration_before_s": calibration_s(),
    }
    phases: dict = {}
    text = generated_source(args.lines)
    with tempfile.TemporaryDirectory(prefix="lsp_latency-") as tmp:
        root = Path(tmp)
        env["PYTHONPYCACHEPREFIX"] = str(root / "pycache")  # a user's bytecode cache, outside the repository
        gc_trace = GcTrace(root / "gc_trace.jsonl")
        env["LINNET_BENCH_GC_TRACE"] = str(gc_trace.path)
        big = root / "generated.linnet"
        big.write_text(text, encoding="utf-8")
        example = root / "llama.linnet"
        example.write_text(EXAMPLE.read_text(encoding="utf-8"), encoding="utf-8")
        with Phase("cold_start", phases, gc_trace):
            cold = {
                "example": await cold_starts(env, root, example, example.read_text(encoding="utf-8"), args.cold_runs),
                "generated": await cold_starts(env, root, big, text, max(1, args.cold_runs // 2)),
            }
        result["cold_start"] = cold
        result["open_big_file"] = await open_big_file(env, root, text, args.open_runs, phases, gc_trace)
        result["steady_state"] = await steady_state(env, root, big, text, args.samples, phases, gc_trace)
        collections_by_phase(phases, gc_trace)
    result["phases"] = phases
    result["calibration_after_s"] = calibration_s()
    result["loadavg_after"] = os.getloadavg()
    result["cpu_pressure_after"] = pressure_snapshot()
    s, o = result["steady_state"], result["open_big_file"]
    result["goals_met"] = {
        "edit_to_diagnostics_p50": s["edit_to_diagnostics"]["p50_ms"] <= GOALS_MS["edit_to_diagnostics_p50"],
        "edit_to_diagnostics_p99": s["edit_to_diagnostics"]["p99_ms"] <= GOALS_MS["edit_to_diagnostics_p99"],
        "hover_p99": s["hover"]["p99_ms"] <= GOALS_MS["hover_p99"],
        "completion_p99": s["completion"]["p99_ms"] <= GOALS_MS["completion_p99"],
        "cold_start_example_p90": cold["example"]["p90_ms"] <= GOALS_MS["cold_start_example_p90"],
        "open_big_file_first_diagnostics": o["first_diagnostics"]["max_ms"]
        <= GOALS_MS["open_big_file_first_diagnostics"],
    }
    return result


# ----- burst and pause (issue 45): typing in bursts on files whose presets name weights (`@weights`)


def weights_file(lines: int) -> str:
    """examples/llama.linnet (its `@weights("smollm2-135m-instruct")` preset) grown to about `lines` lines with
    renamed copies of its modules (each checks, none is used by the model)."""
    text = EXAMPLE.read_text(encoding="utf-8")
    start, end = text.index("module LlamaMLP"), text.index("model LlamaForCausalLM")
    modules, parts, i = text[start:end], [text], 0
    names = ("LlamaMLP", "LlamaAttention", "LlamaDecoderLayer", "LlamaModel")
    while sum(p.count("\n") for p in parts) < lines:
        copy = modules
        for name in names:
            copy = copy.replace(name, f"{name}{i}")
        parts.append("\n" + copy)
        i += 1
    return "".join(parts)


def rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def children_rss_mb(pid: int) -> float:
    try:
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return 0.0
    return sum(rss_mb(int(k)) or 0.0 for k in kids)


def warm_client(client) -> None:
    """Build, before anything is timed, the functions this harness's client (pygls, cattrs) reads a completion and
    a hover answer with: it builds them on first use (~10 ms in the client, once per client: an editor has its
    own), which counted as the server's time in the first completion of each file. Nothing is sent."""
    converter = client.protocol._converter
    span = {"start": {"line": 0, "character": 0}, "end": {"line": 0, "character": 1}}
    markdown = {"kind": "markdown", "value": ""}
    item = {"label": "x", "kind": 5, "detail": "", "documentation": markdown, "insertText": "x", "sortText": "x"}
    item["textEdit"] = {"range": span, "newText": "x"}
    for _ in range(2):  # (cattrs builds an answer's own function again on its second use)
        converter.structure({"jsonrpc": "2.0", "id": 0, "result": {"isIncomplete": False, "items": [item]}},
                            T.CompletionResponse)  # fmt: skip
        converter.structure({"jsonrpc": "2.0", "id": 0, "result": {"contents": markdown, "range": span}},
                            T.HoverResponse)  # fmt: skip


async def burst_and_pause(env: dict, root: Path, name: str, text: str, rounds: int, seed: int = 45) -> dict:
    """`rounds` bursts of 20 keystrokes 150 ms apart (toggling `q_proj` <-> `v_proj` in LlamaAttention.project: same
    shapes, a re-check each) with a completion after `c.` and a hover on a `let` name every 5th key, then a pause of
    2.5-4 s in which a completion and a hover go every 250 ms (where a full collection or a weight check would
    make them wait). Times: edit -> the publish of that version (a version a later key overtook is not
    published: counted), completion and hover, all from the client; the server's RSS (and its children's: the
    weight worker) after every round."""
    import random

    rng = random.Random(seed)
    session = Session(env)
    await session.start(root)
    path = root / name
    path.write_text(text, encoding="utf-8")
    session.open(path, text)
    await session.complete_diagnostics()
    await asyncio.sleep(PAUSE_S)  # the weight check of the opened text ends
    project = session.text.index("fn project(")
    at = session.text.index("q_proj(x)", project)
    comp_at = session.text.index("c.num_attention_heads", project) + 2
    hover_at = session.text.index("let q", project) + 4
    edits, completions, hovers, pause_completions, pause_hovers, rss, worker_rss = [], [], [], [], [], [], []
    overtaken = 0

    async def ask(where_completion: list, where_hover: list) -> None:
        pos_c, pos_h = session.position(comp_at), session.position(hover_at)
        doc = T.TextDocumentIdentifier(session.uri)
        dt, _ = await timed(session.client.text_document_completion_async(T.CompletionParams(doc, pos_c)))
        where_completion.append(dt)
        dt, _ = await timed(session.client.text_document_hover_async(T.HoverParams(doc, pos_h)))
        where_hover.append(dt)

    warm_client(session.client)
    pending: list[tuple[int, float]] = []
    for _ in range(rounds):
        for key in range(20):
            new = "v" if session.text[at] == "q" else "q"
            pending.append((session.version + 1, session.change(at, at + 1, new)))
            if key % 5 == 4:
                await ask(completions, hovers)
            await asyncio.sleep(0.150)
        pause_s = rng.uniform(2.5, 4.0)
        t_end = time.perf_counter() + pause_s
        while time.perf_counter() < t_end - 0.25:
            await asyncio.sleep(0.25)
            await ask(pause_completions, pause_hovers)
        await asyncio.sleep(max(0.0, t_end - time.perf_counter()))
        last_version = session.version
        await session.diagnostics(last_version)
        for version, sent in pending:
            arrived = [t for t, p in session.published if p.uri == session.uri and p.version == version]
            if arrived:
                edits.append(arrived[0] - sent)
            else:
                overtaken += 1
        pending = []
        rss.append(rss_mb(session.pid))
        worker_rss.append(children_rss_mb(session.pid))
    await session.stop()
    return {
        "file": name,
        "lines": text.count("\n") + 1,
        "rounds": rounds,
        "edits": rounds * 20,
        "edit_to_diagnostics": summary(edits),
        "overtaken_versions": overtaken,
        "completion_in_burst": summary(completions),
        "hover_in_burst": summary(hovers),
        "completion_in_pause": summary(pause_completions),
        "hover_in_pause": summary(pause_hovers),
        "completion": pooled(summary(completions), summary(pause_completions)),
        "hover": pooled(summary(hovers), summary(pause_hovers)),
        "rss_mb_by_round": [round(x or 0.0, 1) for x in rss],
        "worker_rss_mb_by_round": [round(x, 1) for x in worker_rss],
    }


def burst_markdown(result: dict) -> str:
    m = result["machine"]
    cpu = result.get("cpu_model") or m["processor"]  # (runs recorded before `machine` named the model)
    wait_before = result["cpu_pressure_before"].get("avg60", 0)
    wait_after = result["cpu_pressure_after"].get("avg60", 0)
    lines = [
        "# Language server: typing in bursts and pauses on files with `@weights`",
        "",
        f"Written by `bench/lsp_latency.py --burst-pause` ({result['date']}). Server: {result['server']}. Machine: "
        f"{cpu}, {m['cpus']} CPUs, Python {m['python']}; CPU wait (Linux PSI avg60) "
        f"{wait_before:.0f} % before, {wait_after:.0f} % after. "
        "Each round: 20 keystrokes 150 ms apart, a "
        "completion and a hover every 5th key, then a 2.5-4 s pause with a completion and a hover every 250 ms.",
        "",
        "| file | measurement | n | p50 ms | p95 ms | p99 ms | max ms |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for row in result["runs"]:
        for key, label in (
            ("edit_to_diagnostics", "edit → diagnostics"),
            ("completion", "completion (all)"),
            ("completion_in_pause", "  completion in pauses"),
            ("hover", "hover (all)"),
            ("hover_in_pause", "  hover in pauses"),
        ):
            r = row[key]
            lines.append(
                f"| {row['file']} ({row['lines']} lines) | {label} | {r['n']} | {r['p50_ms']:.1f} | {r['p95_ms']:.1f} "
                f"| {r['p99_ms']:.1f} | {r['max_ms']:.1f} |"
            )
    lines.append("")
    for row in result["runs"]:
        rss = row["rss_mb_by_round"]
        lines.append(
            f"- {row['file']}: {row['edits']} edits ({row['overtaken_versions']} versions overtaken by the next key, "
            f"never published); server RSS after the first round {rss[0]:.0f} MB, after the last {rss[-1]:.0f} MB "
            f"(max {max(rss):.0f}); the weight worker's {row['worker_rss_mb_by_round'][-1]:.0f} MB; longest "
            f"collection {row['gc']['max_pause_ms']:.0f} ms ({row['gc']['full_collections']} full)."
        )
    return "\n".join(lines) + "\n"


async def run_burst(args: argparse.Namespace) -> dict:
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    result: dict = {
        "benchmark": "lsp_latency --burst-pause",
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        # the CPU model and its AVX-512/AMX flags, as the speed benchmarks record them (not their torch threads)
        "machine": {k: v for k, v in machine().items() if k != "threads"},
        "server": f"{SERVER_ROOT[0]} at {git_state(SERVER_ROOT[0])['commit'][:10]}",
        "cpu_pressure_before": pressure_snapshot(),
        "calibration_before_s": calibration_s(),
        "runs": [],
    }
    with tempfile.TemporaryDirectory(prefix="lsp_burst-") as tmp:
        root = Path(tmp)
        env["PYTHONPYCACHEPREFIX"] = str(root / "pycache")
        gc_trace = GcTrace(root / "gc_trace.jsonl")
        env["LINNET_BENCH_GC_TRACE"] = str(gc_trace.path)
        for name, text, rounds in (
            ("llama.linnet", EXAMPLE.read_text(encoding="utf-8"), args.rounds),
            ("llama_3k.linnet", weights_file(3000), args.big_rounds),
        ):
            t0 = time.monotonic()
            row = await burst_and_pause(env, root, name, text, rounds)
            row["gc"] = gc_trace.between(t0, time.monotonic())
            result["runs"].append(row)
    result["cpu_pressure_after"] = pressure_snapshot()
    result["calibration_after_s"] = calibration_s()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=200, help="samples per latency row (edits: per kind)")
    parser.add_argument(
        "--cold-runs", type=int, default=10, help="fresh processes on the example (half as many on the big file)"
    )
    parser.add_argument("--open-runs", type=int, default=5, help="opens of the big file in a running server")
    parser.add_argument("--lines", type=int, default=5000, help="lines in the generated file")
    parser.add_argument("--quick", action="store_true", help="smoke run: 10 samples, 2 cold runs")
    parser.add_argument("--out", type=Path, help="results path without suffix (default bench/results/lsp_latency)")
    parser.add_argument("--burst-pause", action="store_true", help="only the burst-and-pause workload (issue 45)")
    parser.add_argument("--rounds", type=int, default=50, help="burst-and-pause rounds on llama.linnet (20 edits each)")
    parser.add_argument("--big-rounds", type=int, default=15, help="burst-and-pause rounds on the 3,000-line file")
    parser.add_argument("--server-root", type=Path, help="the Linnet checkout the server runs (default: this one)")
    args = parser.parse_args()
    if args.server_root:
        SERVER_ROOT[0] = args.server_root.resolve()
    if args.burst_pause:
        out = args.out or ROOT / "bench" / "results" / "lsp_latency_burst"
        result = asyncio.run(run_burst(args))
        Path(f"{out}.json").write_text(json.dumps(result, indent=2) + "\n")
        Path(f"{out}.md").write_text(burst_markdown(result))
        print(burst_markdown(result))
        return
    if args.quick:
        args.samples, args.cold_runs, args.open_runs = 10, 2, 2
    out = args.out or ROOT / "bench" / "results" / ("lsp_latency_quick" if args.quick else "lsp_latency")
    result = asyncio.run(run(args))
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(f"{out}.json").write_text(json.dumps(result, indent=2) + "\n")
    Path(f"{out}.md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
