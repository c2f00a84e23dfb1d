"""CPU seconds of each share of `linnet check --jobs N` on the 5 MB document (issue 45): what N cores would take.

One process analyses bench/bigdoc_source.py's document as `linnet check --jobs N` does (collector off), with the
parts that run alone and those that run side by side timed apart: the parse, the analysis before the fork (the
scenarios, the head of the file checked before it: `parallel.WARM_SHARE`), each share's checks (the parent's own and
each worker's, CPU seconds of its process: what it costs on a core of its own), and the parent's work after the
workers' results came back. On a machine with N free cores the analysis's wall time is about parse + before the
fork + the slowest share + after, plus the results' pickling (not counted): an estimate, which this script prints
beside the measured wall time of this machine (whose cores may be fewer than N).

Run: `python bench/check_shares.py [--jobs 8] [--copies 570] [--out PATH]` (writes PATH and the same run as a table
beside it, `.md`; timings live here, never in tests). `PYTHONPATH=CHECKOUT` measures that checkout's `linnet`, and
the result records its commit (`git`) and path (`linnet`).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from bigdoc_source import big_source  # noqa: E402


def measure(copies: int, jobs: int) -> dict:
    """The analysis of `copies` copies in `jobs` processes, its parts timed (see the module docstring)."""
    from linnet.semantics import parallel
    from linnet.semantics.program import Document

    gc.disable()
    marks: dict[str, float] = {}
    real_worker, real_init, real_collect = parallel._worker, parallel.Forked.__init__, parallel.Forked.collect
    read_fd, write_fd = os.pipe()

    def worker(share, work, ids, pipe_fd):
        start = time.process_time()

        def timed(items):
            out = work(items)
            line = {"cpu_s": time.process_time() - start, "items": len(items)}
            os.write(write_fd, (json.dumps(line) + "\n").encode())
            return out

        real_worker(share, timed, ids, pipe_fd)

    def init(self, share_list, work, table):
        marks["fork_cpu"] = time.process_time()
        real_init(self, share_list, work, table)

    def collect(self):
        marks["own_share_done_cpu"] = time.process_time()
        marks["own_share_done_wall"] = time.perf_counter()
        out = real_collect(self)
        marks["collected_wall"] = time.perf_counter()
        return out

    parallel._worker, parallel.Forked.__init__, parallel.Forked.collect = worker, init, collect
    text = big_source(copies)
    wall0, cpu0 = time.perf_counter(), time.process_time()
    document = Document("/tmp/bigdoc.linnet", text)
    cpu1 = time.process_time()
    analysis = document.analyze(jobs=jobs)
    wall2, cpu2 = time.perf_counter(), time.process_time()
    os.close(write_fd)
    with os.fdopen(read_fd) as pipe:
        workers = [json.loads(line) for line in pipe.read().splitlines()]
    parse = cpu1 - cpu0
    before_fork = marks["fork_cpu"] - cpu1
    own_share = marks["own_share_done_cpu"] - marks["fork_cpu"]
    after = cpu2 - marks["own_share_done_cpu"]
    slowest = max([own_share] + [w["cpu_s"] for w in workers])
    return {
        "copies": copies,
        "jobs": jobs,
        "parse_cpu_s": parse,
        "before_fork_cpu_s": before_fork,
        "own_share_cpu_s": own_share,
        "worker_share_cpu_s": [w["cpu_s"] for w in workers],
        "worker_share_items": [w["items"] for w in workers],
        "after_collect_cpu_s": after,
        "collect_wait_wall_s": marks["collected_wall"] - marks["own_share_done_wall"],
        "estimate_wall_s_on_free_cores": parse + before_fork + slowest + after,
        "measured_parse_and_analyze_wall_s": wall2 - wall0,
        "cpus_here": len(parallel.usable_cpus()),
        "checked_by_workers": len(analysis.remote),
        "diagnostics": len(analysis.diagnostics),
    }


def markdown(result: dict) -> str:
    """`result` as a short table and the estimate, said to be one."""
    workers = result["worker_share_cpu_s"]
    wait = f"{result['pressure_before'].get('avg10', '?')} / {result['pressure_after'].get('avg10', '?')}"
    return "\n".join(
        [
            f"# `linnet check --jobs {result['jobs']}` on the {result['copies']}-copy document, share by share",
            "",
            f"Written by `bench/check_shares.py` ({result['when']}) at {result['git']['commit'][:10]}"
            f"{' (dirty)' if result['git']['dirty'] else ''}, on {result['cpus_here']} usable CPUs (CPU wait, PSI "
            f"avg10 before / after: {wait} %; {result['jobs']} processes on fewer cores inflate each one's CPU "
            "seconds). CPU seconds:",
            "",
            "| parse | before the fork | parent's share | workers' shares (min / max) | after the results |",
            "|---:|---:|---:|---|---:|",
            f"| {result['parse_cpu_s']:.2f} | {result['before_fork_cpu_s']:.2f} | {result['own_share_cpu_s']:.2f} "
            f"| {min(workers):.2f} / {max(workers):.2f} ({len(workers)} workers, {result['checked_by_workers']} "
            f"items) | {result['after_collect_cpu_s']:.2f} |",
            "",
            f"An estimate, not a measurement: on {result['jobs']} free cores the parse and the analysis would take "
            f"about {result['estimate_wall_s_on_free_cores']:.1f} s of wall time (parse + before the fork + the "
            "slowest share + after; the results' pickling and the process's start and printing not counted). "
            f"Measured here: {result['measured_parse_and_analyze_wall_s']:.1f} s.",
            "",
        ]
    )


def measured_checkout() -> Path:
    """The checkout whose `linnet` is measured: the one PYTHONPATH names (else the installed one), imported here
    before `lsp_latency`, which puts its own checkout first on `sys.path` (this folder's: run from another checkout
    than PYTHONPATH's, that one's `linnet` was measured and its commit recorded)."""
    import linnet

    return Path(linnet.__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=8)
    parser.add_argument("--copies", type=int, default=570)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "check_shares.json")
    args = parser.parse_args()
    checkout = measured_checkout()
    from lsp_latency import git_state, pressure_snapshot

    before = pressure_snapshot()
    row = measure(args.copies, args.jobs)
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    result = {"git": git_state(checkout), "linnet": str(checkout), "when": when, **row}
    result["pressure_before"], result["pressure_after"] = before, pressure_snapshot()
    print(json.dumps(result, indent=2))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    args.out.with_suffix(".md").write_text(markdown(result), encoding="utf-8")


if __name__ == "__main__":
    main()
