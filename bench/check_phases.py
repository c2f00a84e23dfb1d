"""Where `linnet check`'s time goes on the 5 MB document (issue 45): writes bench/results/check_phases.{json,md}.

For each number of copies of bench/bigdoc_source.py's document, a fresh process per collector setting does what
`linnet check` does, phase by phase, and reports each phase's CPU seconds: reading the items (parse), the analysis
(of which the item checks: how many module-under-config checks ran), rendering every diagnostic, and what the
process spent after it (the interpreter's teardown: a full collection and the freeing of every object, measured
as the process's CPU seconds (os.wait4) minus what it had spent when the work was done). Collector settings:
`threshold` (what main's `linnet check` set: gc.set_threshold(200_000, 30, 30), then a normal exit) and
`disabled` (what it does now: gc.disable() and an exit without teardown, os._exit). Peak RSS of each process.

Per edit (`--edits N`, the language server's path without its transport): bench/lsp_latency.py's 3,000-line file
(llama.linnet grown with renamed copies of its modules) in one Document; N keystrokes typed into LlamaMLP's body
(` + gate_projj(x)`, a character at a time, again and again: unknown names and broken syntax as typing leaves
them), each followed by the analysis; CPU seconds of each (time.process_time), p50 / p95 / p99 / max. The
collector as the server sets it (linnet/lsp/collector.py: the open file's analysis frozen, no automatic full
collection; the server runs those in pauses). A second workload, `toggle`, is bench/lsp_latency.py --burst-pause's
keystroke: `q_proj` <-> `v_proj` toggled inside LlamaAttention.project (a module of three functions), each edit
then analysed.

`--cli-jobs 1 default` adds rows of the whole `linnet check` command on the document (`python -m linnet check FILE`,
with `--jobs N`, or without `--jobs` for `default`), its output written to /dev/null: wall seconds from start to
exit, CPU seconds of the process and its workers (os.wait4), peak RSS, exit status.

`--peer DIR` runs every row again with DIR's `linnet` (e.g. main before a change), right after this tree's.
`--cli-rounds N` runs the `--cli-jobs` rows N times, the trees alternating within each round.
`--rounds N` runs the per-edit rows N times, the trees alternating, so that a difference can be told from the
machine's drift (each row is one process: a few ms of p50 come and go between runs on shared cores).
`--jobs 1 2` adds rows of the analysis in that many processes (`linnet check --jobs`: its forked workers' CPU
seconds are counted with the parent's; analyze wall s beside them); a tree without it runs one process.

Contention: the CPU pressure (Linux PSI avg10, the share of time some task waited for a CPU) before and after each
process is recorded beside it; under contention CPU seconds grow too (shared caches, SMT siblings), so compare rows
of one run only.

Run: `python bench/check_phases.py [--copies 20 100] [--jobs 1 2] [--settings disabled] [--edits 200]
[--workloads typed toggle] [--rounds N] [--cli-jobs 1 default] [--cli-rounds N] [--peer DIR] [--out PATH]`.
Timings live here, never in tests.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from bigdoc_source import big_source  # noqa: E402

SETTINGS = ("threshold", "disabled")
TYPED = " + gate_projj(x)"  # typed into LlamaMLP's body, a character at a time (`edits`)


def _cpu_s() -> float:
    """CPU seconds of this process and of its waited-for children (`linnet check --jobs`'s workers)."""
    import resource

    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def child(copies: int, setting: str, jobs: int = 1) -> None:
    """The phases in this process (`--child`): prints one JSON line, then ends as `setting` says. `jobs` > 1:
    the analysis as `linnet check --jobs` runs it (workers' CPU seconds counted; a tree without it: one process)."""
    import gc
    import inspect

    if setting == "threshold":
        gc.set_threshold(200_000, 30, 30)
    else:
        gc.disable()
    from linnet.semantics.program import Workspace  # the tree PYTHONPATH names (`measure`)
    from linnet.semantics.render import render_text

    text = big_source(copies)
    path = "/tmp/bigdoc.linnet"
    t0, w0 = _cpu_s(), time.perf_counter()
    document = Workspace().open(path, text)
    t1, w1 = _cpu_s(), time.perf_counter()
    has_jobs = "jobs" in inspect.signature(document.analyze).parameters
    analysis = document.analyze(jobs=jobs) if has_jobs else document.analyze()
    t2, w2 = _cpu_s(), time.perf_counter()
    sources = {path: text}
    rendered = [
        render_text(d, lambda p: sources.get(p) or Path(p).read_text(encoding="utf-8")) for d in analysis.diagnostics
    ]
    t3 = _cpu_s()
    row = {
        "parse_cpu_s": t1 - t0,
        "analyze_cpu_s": t2 - t1,
        "parse_wall_s": w1 - w0,
        "analyze_wall_s": w2 - w1,
        "jobs": jobs if has_jobs else 1,
        "checked_by_workers": len(getattr(analysis, "remote", {})),
        "render_cpu_s": t3 - t2,
        "cpu_s_when_done": t3,
        "checks_run": analysis.stats.checks_run,
        "diagnostics": len(rendered),
    }
    print(json.dumps(row), flush=True)
    if setting == "disabled":
        os._exit(0)


def edits(path: str, n: int, workload: str = "typed") -> None:
    """The per-edit workload in this process (`--child-edits`): prints one JSON line of CPU seconds per edit.
    `workload`: "typed" (TYPED typed into LlamaMLP's body) or "toggle" (`q_proj` <-> `v_proj` in
    LlamaAttention.project, as bench/lsp_latency.py --burst-pause types)."""
    import gc

    from linnet.semantics.program import Document

    text = Path(path).read_text(encoding="utf-8")
    document = Document(path, text)
    document.analyze()
    # as the server's collector (linnet/lsp/collector.py) does: the open file's analysis frozen, the automatic full
    # collection put out of the way (the server runs it in pauses, not in an edit)
    gc.freeze()
    young, middle, full = gc.get_threshold()
    gc.set_threshold(young, middle, full * 100)
    body = "        down_proj(silu(gate_proj(x)) * up_proj(x))"  # the code, not the doc comment that quotes it
    at = text.index(body) + len(body)
    typed, costs = "", []
    if workload == "toggle":
        at = text.index("q_proj(x)", text.index("fn project("))
        for _ in range(n):
            t0 = time.process_time()
            document.edit(at, at + 1, "v" if document.text[at] == "q" else "q")
            document.analyze()
            costs.append(time.process_time() - t0)
        print(json.dumps({"edit_cpu_s": costs}), flush=True)
        return
    for _ in range(n):
        if len(typed) == len(TYPED):  # the whole text typed: take it away, and type it again
            document.edit(at, at + len(typed), "")
            document.analyze()
            typed = ""
        t0 = time.process_time()
        document.edit(at + len(typed), at + len(typed), TYPED[len(typed)])
        document.analyze()
        costs.append(time.process_time() - t0)
        typed += TYPED[len(typed)]
    print(json.dumps({"edit_cpu_s": costs}), flush=True)


def run_child(args: list[str], tree: Path) -> tuple[dict, object]:
    """This script's child mode `args` with `tree`'s linnet: (its JSON line, its rusage)."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    process = subprocess.Popen([sys.executable, __file__, *args], stdout=subprocess.PIPE, text=True, cwd=ROOT, env=env)
    out = process.stdout.read()
    _, status, usage = os.wait4(process.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"the child {args} of {tree} failed")
    return json.loads(out.strip().splitlines()[-1]), usage


def measure_edits(path: Path, n: int, tree: Path, workload: str = "typed") -> dict:
    """Per-edit CPU seconds of `tree`'s analysis (`edits`), summarised, with the CPU wait around them."""
    from lsp_latency import git_state, pressure_snapshot

    before = pressure_snapshot()
    row, _ = run_child(["--child-edits", str(path), str(n), workload], tree)
    costs = sorted(row["edit_cpu_s"])

    def at(q: float) -> float:
        return costs[min(len(costs) - 1, int(q * len(costs)))]

    return {
        "tree": str(tree),
        "git": git_state(tree),
        "workload": workload,
        "edits": n,
        "p50_ms": 1000 * at(0.5),
        "p95_ms": 1000 * at(0.95),
        "p99_ms": 1000 * at(0.99),
        "max_ms": 1000 * costs[-1],
        "mean_ms": 1000 * sum(costs) / len(costs),
        "pressure_before": before,
        "pressure_after": pressure_snapshot(),
    }


def measure(copies: int, setting: str, tree: Path = ROOT, jobs: int = 1) -> dict:
    """One fresh process of `child`: its phases, its whole CPU seconds and peak RSS, and the CPU wait around it."""
    from lsp_latency import pressure_snapshot  # the client's modules (pygls) in the parent only

    before = pressure_snapshot()
    row, usage = run_child(["--child", str(copies), setting, str(jobs)], tree)
    row["tree"] = str(tree)
    row["process_cpu_s"] = usage.ru_utime + usage.ru_stime
    row["teardown_cpu_s"] = row["process_cpu_s"] - row["cpu_s_when_done"]
    row["peak_rss_mb"] = usage.ru_maxrss / 1024
    row["pressure_before"], row["pressure_after"] = before, pressure_snapshot()
    return {"copies": copies, "setting": setting, **row}  # `jobs`: what the tree ran (1 where it has no --jobs)


def measure_cli(path: Path, tree: Path, jobs: str) -> dict:
    """The whole `linnet check` of `path` with `tree`'s linnet (`jobs`: `--jobs`' value, or "default" for none):
    wall and CPU seconds (the process and the workers it waited for), peak RSS, exit status, CPU wait around it."""
    from lsp_latency import git_state, pressure_snapshot

    before = pressure_snapshot()
    env = dict(os.environ, PYTHONPATH=str(tree), NO_COLOR="1")
    args = [sys.executable, "-m", "linnet", "check", *([] if jobs == "default" else ["--jobs", jobs]), str(path)]
    start = time.perf_counter()
    # cwd `tree`: `-m` puts the working directory first on sys.path, before PYTHONPATH
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tree, env=env)
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - start
    return {
        "tree": str(tree),
        "git": git_state(tree),
        "jobs": jobs,
        "wall_s": wall,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "peak_rss_mb": usage.ru_maxrss / 1024,
        "exit": os.waitstatus_to_exitcode(status),
        "pressure_before": before,
        "pressure_after": pressure_snapshot(),
    }


def markdown(result: dict) -> str:
    lines = [
        "# `linnet check` on the 5 MB document, phase by phase",
        "",
        f"Written by `bench/check_phases.py` ({result['when']}) at {result['git']['commit'][:10]}"
        f"{' (dirty)' if result['git']['dirty'] else ''}. Machine: {result['machine'].get('processor')}, "
        f"{result['machine'].get('cpus')} CPUs. CPU seconds of one process per row; CPU wait is Linux PSI avg10 "
        "before / after the row's process (contention inflates CPU seconds too: compare rows of this run only).",
        "",
        "| tree | copies | collector | jobs | parse s | analyze s | analyze wall s | checks | render s | teardown s "
        "| process CPU s | peak RSS MB | CPU wait % |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in result["rows"]:
        wait = f"{r['pressure_before'].get('avg10', '?')} / {r['pressure_after'].get('avg10', '?')}"
        lines.append(
            f"| {r['tree']} | {r['copies']} | {r['setting']} | {r.get('jobs', 1)} | {r['parse_cpu_s']:.2f} "
            f"| {r['analyze_cpu_s']:.2f} | {r.get('analyze_wall_s', float('nan')):.2f} | {r['checks_run']} "
            f"| {r['render_cpu_s']:.2f} | {r['teardown_cpu_s']:.2f} | {r['process_cpu_s']:.2f} "
            f"| {r['peak_rss_mb']:.0f} | {wait} |"
        )
    if result.get("cli"):
        lines += [
            "",
            f"The whole `linnet check` of the {result['cli_copies']}-copy document (`python -m linnet check FILE`, "
            "output to /dev/null; `default`: no `--jobs`); CPU s counts the workers:",
            "",
            "| round | tree | commit | --jobs | wall s | CPU s | peak RSS MB | exit | CPU wait % |",
            "|---:|---|---|---|---:|---:|---:|---:|---|",
        ]
        for r in result["cli"]:
            wait = f"{r['pressure_before'].get('avg10', '?')} / {r['pressure_after'].get('avg10', '?')}"
            lines.append(
                f"| {r.get('round', 1)} | {r['tree']} | {r['git']['commit'][:10]}"
                f"{' (dirty)' if r['git']['dirty'] else ''} | {r['jobs']} "
                f"| {r['wall_s']:.2f} | {r['cpu_s']:.2f} | {r['peak_rss_mb']:.0f} | {r['exit']} | {wait} |"
            )
    if result.get("edits"):
        lines += [
            "",
            f"Per edit on the 3,000-line file (CPU ms per edit, each edit then analysed): `typed`: `{TYPED}` typed "
            "into LlamaMLP's body a character at a time; `toggle`: `q_proj` <-> `v_proj` in LlamaAttention.project "
            "(the burst benchmark's keystroke):",
            "",
            "| round | tree | commit | workload | edits | p50 | p95 | p99 | max | mean | CPU wait % |",
            "|---:|---|---|---|---:|---:|---:|---:|---:|---:|---|",
        ]
        for r in result["edits"]:
            wait = f"{r['pressure_before'].get('avg10', '?')} / {r['pressure_after'].get('avg10', '?')}"
            dirty = " (dirty)" if r["git"]["dirty"] else ""
            lines.append(
                f"| {r.get('round', 1)} | {r['tree']} | {r['git']['commit'][:10]}{dirty} "
                f"| {r.get('workload', 'typed')} | {r['edits']} "
                f"| {r['p50_ms']:.1f} | {r['p95_ms']:.1f} | {r['p99_ms']:.1f} | {r['max_ms']:.1f} | {r['mean_ms']:.1f} "
                f"| {wait} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    if len(sys.argv) in (4, 5) and sys.argv[1] == "--child":
        child(int(sys.argv[2]), sys.argv[3], int(sys.argv[4]) if len(sys.argv) == 5 else 1)
        return
    if len(sys.argv) in (4, 5) and sys.argv[1] == "--child-edits":
        edits(sys.argv[2], int(sys.argv[3]), *sys.argv[4:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, nargs="*", default=[20, 100])
    parser.add_argument("--jobs", type=int, nargs="*", default=[1], help="processes of the analysis (each a row)")
    parser.add_argument("--settings", nargs="*", default=list(SETTINGS), choices=SETTINGS, help="collector settings")
    parser.add_argument("--edits", type=int, default=0, help="keystrokes of the per-edit workload (0: none)")
    parser.add_argument(
        "--workloads", nargs="*", default=["typed"], choices=("typed", "toggle"), help="per-edit workloads (`edits`)"
    )
    parser.add_argument("--rounds", type=int, default=1, help="times the per-edit rows run, the trees alternating")
    parser.add_argument(
        "--cli-jobs", nargs="*", default=[], help="rows of the whole `linnet check` (`--jobs` values; `default`: none)"
    )
    parser.add_argument("--cli-copies", type=int, default=570, help="copies of the document the --cli-jobs rows check")
    parser.add_argument(
        "--cli-rounds", type=int, default=1, help="times the --cli-jobs rows run, the trees alternating in each"
    )
    parser.add_argument("--peer", type=Path, help="also measure this checkout's linnet (e.g. main before a change)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "check_phases.json")
    args = parser.parse_args()
    from generate_speed import machine  # stdlib-only at import time
    from lsp_latency import git_state, weights_file

    trees = [ROOT] + ([args.peer.resolve()] if args.peer else [])
    result = {
        "machine": machine(),
        "git": git_state(),
        "when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "rows": [],
        "cli": [],
        "cli_copies": args.cli_copies,
        "edits": [],
    }
    for copies in args.copies:
        for setting in args.settings:
            for jobs in args.jobs:
                for tree in trees:
                    row = measure(copies, setting, tree, jobs)
                    print(json.dumps(row), flush=True)
                    result["rows"].append(row)
    if args.cli_jobs:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "bigdoc.linnet"
            path.write_text(big_source(args.cli_copies), encoding="utf-8")
            for round_ in range(1, args.cli_rounds + 1):
                for jobs in args.cli_jobs:
                    for tree in trees:
                        row = {"round": round_, **measure_cli(path, tree, jobs)}
                        print(json.dumps(row), flush=True)
                        result["cli"].append(row)
    if args.edits:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "llama_3k.linnet"
            path.write_text(weights_file(3000), encoding="utf-8")
            for round_ in range(1, args.rounds + 1):
                for workload in args.workloads:
                    for tree in trees:
                        row = {"round": round_, **measure_edits(path, args.edits, tree, workload)}
                        print(json.dumps(row), flush=True)
                        result["edits"].append(row)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    args.out.with_suffix(".md").write_text(markdown(result), encoding="utf-8")


if __name__ == "__main__":
    main()
