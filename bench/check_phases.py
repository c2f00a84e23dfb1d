"""Where `linnet check`'s time goes on the 5 MB document (issue 45): writes bench/results/check_phases.{json,md}.

For each number of copies of bench/bigdoc_source.py's document, a fresh process per collector setting does what
`linnet check` does, phase by phase, and reports each phase's CPU seconds: reading the items (parse), the analysis
(of which the item checks: how many module-under-config checks ran), rendering every diagnostic, and what the
process spent after it (the interpreter's teardown: a full collection and the freeing of every object, measured
as the process's CPU seconds (os.wait4) minus what it had spent when the work was done). Collector settings:
`threshold` (what main's `linnet check` set: gc.set_threshold(200_000, 30, 30), then a normal exit) and
`disabled` (what it does now: gc.disable() and an exit without teardown, os._exit). Peak RSS of each process.

Contention: the CPU pressure (Linux PSI avg10, the share of time some task waited for a CPU) before and after each
process is recorded beside it; under contention CPU seconds grow too (shared caches, SMT siblings), so compare rows
of one run only. Run: `python bench/check_phases.py [--copies 20 100] [--out PATH]`. Timings live here, never in
tests.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from bigdoc_source import big_source  # noqa: E402

SETTINGS = ("threshold", "disabled")


def child(copies: int, setting: str) -> None:
    """The phases in this process (`--child`): prints one JSON line, then ends as `setting` says."""
    import gc

    if setting == "threshold":
        gc.set_threshold(200_000, 30, 30)
    else:
        gc.disable()
    sys.path.insert(0, str(ROOT))
    from linnet.semantics.program import Workspace
    from linnet.semantics.render import render_text

    text = big_source(copies)
    path = "/tmp/bigdoc.linnet"
    t0 = time.process_time()
    document = Workspace().open(path, text)
    t1 = time.process_time()
    analysis = document.analyze()
    t2 = time.process_time()
    sources = {path: text}
    rendered = [
        render_text(d, lambda p: sources.get(p) or Path(p).read_text(encoding="utf-8")) for d in analysis.diagnostics
    ]
    t3 = time.process_time()
    row = {
        "parse_cpu_s": t1 - t0,
        "analyze_cpu_s": t2 - t1,
        "render_cpu_s": t3 - t2,
        "cpu_s_when_done": t3,
        "checks_run": analysis.stats.checks_run,
        "diagnostics": len(rendered),
    }
    print(json.dumps(row), flush=True)
    if setting == "disabled":
        os._exit(0)


def measure(copies: int, setting: str) -> dict:
    """One fresh process of `child`: its phases, its whole CPU seconds and peak RSS, and the CPU wait around it."""
    from lsp_latency import pressure_snapshot  # the client's modules (pygls) in the parent only

    before = pressure_snapshot()
    process = subprocess.Popen(
        [sys.executable, __file__, "--child", str(copies), setting], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    out = process.stdout.read()
    _, status, usage = os.wait4(process.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"the child for {copies} copies ({setting}) failed")
    row = json.loads(out.strip().splitlines()[-1])
    row["process_cpu_s"] = usage.ru_utime + usage.ru_stime
    row["teardown_cpu_s"] = row["process_cpu_s"] - row["cpu_s_when_done"]
    row["peak_rss_mb"] = usage.ru_maxrss / 1024
    row["pressure_before"], row["pressure_after"] = before, pressure_snapshot()
    return {"copies": copies, "setting": setting, **row}


def markdown(result: dict) -> str:
    lines = [
        "# `linnet check` on the 5 MB document, phase by phase",
        "",
        f"Written by `bench/check_phases.py` ({result['when']}) at {result['git']['commit'][:10]}"
        f"{' (dirty)' if result['git']['dirty'] else ''}. Machine: {result['machine'].get('processor')}, "
        f"{result['machine'].get('cpus')} CPUs. CPU seconds of one process per row; CPU wait is Linux PSI avg10 "
        "before / after the row's process (contention inflates CPU seconds too: compare rows of this run only).",
        "",
        "| copies | collector | parse s | analyze s | checks | render s | teardown s | process CPU s | peak RSS MB "
        "| CPU wait % |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in result["rows"]:
        wait = f"{r['pressure_before'].get('avg10', '?')} / {r['pressure_after'].get('avg10', '?')}"
        lines.append(
            f"| {r['copies']} | {r['setting']} | {r['parse_cpu_s']:.2f} | {r['analyze_cpu_s']:.2f} | {r['checks_run']} "
            f"| {r['render_cpu_s']:.2f} | {r['teardown_cpu_s']:.2f} | {r['process_cpu_s']:.2f} "
            f"| {r['peak_rss_mb']:.0f} | {wait} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        child(int(sys.argv[2]), sys.argv[3])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, nargs="+", default=[20, 100])
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "check_phases.json")
    args = parser.parse_args()
    from generate_speed import machine  # stdlib-only at import time
    from lsp_latency import git_state

    result = {
        "machine": machine(),
        "git": git_state(),
        "when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "rows": [],
    }
    for copies in args.copies:
        for setting in SETTINGS:
            row = measure(copies, setting)
            print(json.dumps(row), flush=True)
            result["rows"].append(row)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    args.out.with_suffix(".md").write_text(markdown(result), encoding="utf-8")


if __name__ == "__main__":
    main()
