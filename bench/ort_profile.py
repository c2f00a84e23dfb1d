"""Where an ONNX Runtime decode step of SmolLM2-135M spends its time, op type by op type, and where the process's
memory goes, stage by stage: the two halves of issue 21's goal 3 (the `stored` rows against llama.cpp's decode speed
and peak memory), which bench/generate_speed.py measures only as totals.

One process, the embedded GGUF loaded by the `onnxruntime` backend (`--dtype stored` keeps it quantized), driven
through its `StepModel` (no sampling): a prefill of `--prompt` tokens, then `--steps` decode steps of one token.

- Memory: this process's resident set (VmRSS) and its high-water mark (VmHWM, what generate_speed.py's peak RSS
  column reads) after each stage: imports, `load`, the `step` session made (ONNX Runtime copies the initializers
  and prepacks the quantized ones then), the prefill, the decode steps. Beside them the bytes the step graph's
  initializers and the KV cache hold.
- Time: decode ms a step without the profiler (median of the steps), then the same steps again in a second session
  with ONNX Runtime's profiler on (`SessionOptions.enable_profiling`): per op type, µs a step and calls a step
  (nodes inside an `If`'s branch counted under their own type; an `If`'s time contains its branch's, so it is shown
  apart and left out of the kernel sum), and the time of a step outside every kernel (the executor, the `If`s'
  branch setup, I/O binding). The profiler slows every kernel; read its figures as shares of a step, the plain
  decode ms as the time.

    .venv/bin/python bench/ort_profile.py [--dtype stored] [--numerics fast] [--steps 64] [--out bench/results/NAME]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from generate_speed import SOURCE, THREADS, machine, peak_rss_mb, rss_mb  # bench/ runs as scripts

PROMPT_TOKENS = 512
FIRST_TOKEN = 1000  # prompt ids FIRST_TOKEN, FIRST_TOKEN + 1, ...: the bench measures speed, not text


def _stage(stages: list[dict], name: str) -> None:
    stages.append({"stage": name, "rss_mb": round(rss_mb(), 1), "peak_rss_mb": round(peak_rss_mb(), 1)})


@contextlib.contextmanager
def _profiled_sessions(prefix: str):
    """Sessions made inside have ONNX Runtime's profiler on, writing `prefix`*.json."""
    from linnet.runtimes.backends import onnx_backend

    plain = onnx_backend.session_options

    def profiled(*args, **kwargs):
        opts = plain(*args, **kwargs)
        opts.enable_profiling = True
        opts.profile_file_prefix = prefix
        return opts

    onnx_backend.session_options = profiled
    try:
        yield
    finally:
        onnx_backend.session_options = plain


def _run_steps(step_model, prompt: int, steps: int) -> tuple[list[float], list[int]]:
    """A prefill of `prompt` tokens, then `steps` greedy decode steps; (ms of each decode step, tokens)."""
    import numpy as np

    row = np.array([0], dtype=np.int64)
    ids = np.arange(FIRST_TOKEN, FIRST_TOKEN + prompt, dtype=np.int64)[None]
    logits = step_model.step(ids, np.array([0], dtype=np.int64), row)
    tokens, times = [int(np.argmax(logits[0]))], []
    for i in range(steps):
        start = time.perf_counter()
        logits = step_model.step(np.array([[tokens[-1]]], dtype=np.int64), np.array([prompt + i], dtype=np.int64), row)
        times.append(1000 * (time.perf_counter() - start))
        tokens.append(int(np.argmax(logits[0])))
    return times, tokens


def op_table(events: list[dict]) -> dict:
    """Per op type, µs and calls a decode step, from an ONNX Runtime profile (Chrome trace events) whose first
    `model_run` is the prefill and the rest decode steps. Returns {"steps", "run_us", "kernel_us", "outside_us",
    "node_runs", "ops": [{"op", "us", "calls", "contains_branch"}]}, per-step means, ops by time."""
    runs = sorted((e for e in events if e.get("name") == "model_run"), key=lambda e: e["ts"])
    if len(runs) < 2:
        raise ValueError(f"the profile holds {len(runs)} run(s); it needs a prefill and at least one decode step")
    decode_start = runs[1]["ts"]
    total: collections.Counter = collections.Counter()
    calls: collections.Counter = collections.Counter()
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and e["ts"] >= decode_start:
            op = e["args"]["op_name"]
            total[op] += e["dur"]
            calls[op] += 1
    steps = len(runs) - 1
    run_us = sum(r["dur"] for r in runs[1:]) / steps
    kernel_us = sum(t for op, t in total.items() if op != "If") / steps
    ops = [
        {"op": op, "us": round(t / steps, 1), "calls": round(calls[op] / steps, 2), "contains_branch": op == "If"}
        for op, t in total.most_common()
    ]
    return {
        "steps": steps,
        "run_us": round(run_us, 1),
        "kernel_us": round(kernel_us, 1),
        "outside_us": round(run_us - kernel_us, 1),
        "node_runs": round(sum(c for op, c in calls.items() if op != "If") / steps, 1),
        "ops": ops,
    }


def profile(dtype: str, numerics: str, steps: int, prompt: int = PROMPT_TOKENS, source: Path = SOURCE) -> dict:
    """Memory by stage, plain decode ms a step, and the profiled op table (see the module docstring)."""
    stages: list[dict] = []
    _stage(stages, "start")
    import numpy as np

    from linnet.compiler.onnx.lower import np_dtype
    from linnet.runtimes.backends import get_backend

    backend = get_backend("onnxruntime")
    _stage(stages, "imports")
    load = dict(dtype=dtype, max_positions=prompt + steps + 1, numerics=numerics, progress=False, threads=THREADS)
    model = backend.load(source, **load)
    _stage(stages, "load")
    graph = model.model_ir("step").graph
    initializers: collections.Counter = collections.Counter()
    for v in graph.initializers.values():
        initializers[str(v.const_value.dtype)] += v.const_value.nbytes
    graph_ops = collections.Counter(n.op_type for n in graph)
    step_model = model.step_model()
    step_model.warm_up([prompt], [1])
    _stage(stages, "step session made")
    _run_steps(step_model, prompt, 0)
    _stage(stages, f"prefill of {prompt} tokens")
    plain_ms, tokens = _run_steps(step_model, prompt, steps)
    _stage(stages, f"{steps} decode steps")

    with tempfile.TemporaryDirectory(prefix="linnet-ort-profile-") as tmp:
        with _profiled_sessions(str(Path(tmp) / "step")):
            profiled = backend.load(source, **load)
            _, profiled_tokens = _run_steps(profiled.step_model(), prompt, steps)
        events = json.loads(Path(profiled.session("step").end_profiling()).read_text())
    if profiled_tokens != tokens:  # the profiler must not change what runs
        raise RuntimeError(f"the profiled session's tokens differ: {profiled_tokens[:8]} vs {tokens[:8]}")
    state_bytes = sum(int(np.prod(t.shape)) * np.dtype(np_dtype(t.type.dtype)).itemsize for t in model.program.state)
    return {
        "dtype": dtype,
        "numerics": numerics,
        "prompt_tokens": prompt,
        "decode_steps": steps,
        "decode_ms_per_step": round(statistics.median(plain_ms), 2),
        "decode_tok_s": round(1000 / statistics.median(plain_ms), 1),
        "memory_stages": stages,
        "initializer_mb": {k: round(v / 2**20, 1) for k, v in initializers.most_common()},
        "kv_cache_mb": round(state_bytes / 2**20, 1),
        "graph_nodes": dict(graph_ops.most_common()),
        "profile": op_table(events),
    }


def markdown(result: dict) -> list[str]:
    p = result["profile"]
    lines = [
        f"## onnxruntime, `--dtype {result['dtype']}`, numerics {result['numerics']}",
        "",
        f"Prompt {result['prompt_tokens']} tokens, {result['decode_steps']} decode steps: "
        f"{result['decode_ms_per_step']} ms a step ({result['decode_tok_s']} tok/s) without the profiler.",
        "",
        "| stage | RSS MB | peak RSS MB |",
        "|---|---:|---:|",
        *(f"| {s['stage']} | {s['rss_mb']:.0f} | {s['peak_rss_mb']:.0f} |" for s in result["memory_stages"]),
        "",
        f"The step graph's initializers: {', '.join(f'{k} {v} MB' for k, v in result['initializer_mb'].items())};"
        f" the KV cache: {result['kv_cache_mb']} MB.",
        "",
        f"Profiled (each kernel slower under the profiler): a step {p['run_us']:.0f} µs, of which "
        f"{p['kernel_us']:.0f} in {p['node_runs']:.0f} kernel runs and {p['outside_us']:.0f} outside every kernel.",
        "",
        "| op | µs a step | share of the step | calls a step |",
        "|---|---:|---:|---:|",
    ]
    for op in p["ops"]:
        note = " (holds its branch's kernels, counted on their own rows)" if op["contains_branch"] else ""
        lines.append(f"| {op['op']}{note} | {op['us']:.0f} | {100 * op['us'] / p['run_us']:.1f} % | {op['calls']:g} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", default="stored", choices=("stored", "f32"))
    parser.add_argument("--numerics", default="fast", choices=("fast", "equivalent"))
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--out", default=None, help="write OUT.json and OUT.md")
    args = parser.parse_args()
    result = profile(args.dtype, args.numerics, args.steps)
    result["machine"] = machine()
    result["when"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    lines = [
        "# An ONNX Runtime decode step of SmolLM2-135M: time by op type, memory by stage",
        "",
        f"Written by `bench/ort_profile.py` ({result['when']}); {result['machine']['processor']}, {THREADS} threads.",
        "",
        *markdown(result),
    ]
    print("\n".join(lines))
    if args.out:
        Path(f"{args.out}.json").write_text(json.dumps(result, indent=1) + "\n")
        Path(f"{args.out}.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
