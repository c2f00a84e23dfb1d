"""Export benchmark: writes bench/results/export_speed.json and export_speed.md.

Issue 16's "the engine cannot tell the difference", measured in one run on one machine: each engine on the original
checkpoint against the same engine on Linnet's export of it, SmolLM2-135M-Instruct (the embedded Q4_1 GGUF), a
prompt of `--prompt-tokens` ids of real text (bench/generate_speed.py's `make_prompt`), `--new-tokens` greedy
tokens, batch 1, 2 threads:

- llama.cpp (llama-cpp-python, built with AMX off by tools/llama_cpp_wheel.sh) on the original GGUF and on
  `linnet.export.gguf(model, type="q4_1")` (the original's type; its tensors come out byte-identical);
- transformers (eager f32, `AutoModelForCausalLM`) on the original GGUF and on `linnet.export.hf(model)`'s folder.
  `linnet.export.hf` comes from the export-hf branch: without it that pair is skipped and its rows say so.

Per configuration, in its own process (`--one NAME`, one JSON line back) so that load time is its own, alternating
original and export for `--rounds` rounds and keeping each one's fastest round: load time, one warm-up
generation, then `--runs` timed generations; medians of time to first token (prefill of the prompt
and the first token) and decode tok/s ((new tokens - 1) / (last token - first token)). Timing, contention (CPU
seconds per wall second, and the share of time some task waited for a CPU, /proc/pressure/cpu) and machine
information are bench/generate_speed.py's helpers; before each configuration the parent waits for idle cores.
Export time is timed in the parent (the model loaded once; each export from memory to a file).

Goal (issue): each pair within 5 % (decode, TTFT, load). Run: `python bench/export_speed.py [--runs N]`.
Timings live here, never in tests.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import generate_speed as gs  # noqa: E402  (bench/ is not a package)

OUT = ROOT / "bench" / "results" / "export_speed"
THREADS = gs.THREADS
# name -> (engine, checkpoint): "original" is the embedded GGUF, "export" Linnet's export of it
CONFIGS = {
    "llama.cpp original": ("llama.cpp", "original"),
    "llama.cpp export": ("llama.cpp", "export"),
    "transformers original": ("transformers", "original"),
    "transformers export": ("transformers", "export"),
}
GOAL_PCT = 5.0


def run_one(args: argparse.Namespace) -> None:
    """The child: one configuration; prints `RESULT {json}`."""
    engine, checkpoint = CONFIGS[args.one]
    prompt = json.loads(Path(args.prompt_file).read_text())
    target = args.original if checkpoint == "original" else args.export
    if engine == "llama.cpp":
        res = gs.run_llama_cpp(target, prompt, args.new_tokens, args.runs, logits=False)
    else:
        res = gs.run_transformers("eager", "f32", prompt, args.new_tokens, args.runs, folder=target)
    timed = res["timed"]
    row = {
        "name": args.one,
        "engine": engine,
        "checkpoint": checkpoint,
        "path": target or "embedded GGUF",
        "load_s": res["load_s"],
        "warmup_s": res["warmup_s"],
        "ttft_ms_median": 1000 * statistics.median(t[0] for t in timed),
        "decode_tok_s_median": statistics.median(t[1] for t in timed),
        "tokens": timed[0][2],
        **res["contention"],
    }
    print("RESULT " + json.dumps(row))


def run_child(name: str, args: argparse.Namespace, paths: dict[str, str | None], prompt_file: Path) -> dict:
    cmd = [sys.executable, __file__, "--one", name, "--prompt-file", str(prompt_file)]
    cmd += ["--runs", str(args.runs), "--new-tokens", str(args.new_tokens)]
    engine = CONFIGS[name][0]
    if paths[f"{engine} original"]:
        cmd += ["--original", paths[f"{engine} original"]]
    cmd += ["--export", paths[f"{engine} export"]]
    env = dict(os.environ, OMP_NUM_THREADS=str(THREADS), TOKENIZERS_PARALLELISM="false", TQDM_DISABLE="1")
    waited = gs.wait_for_quiet(args.quiet_wait)
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=gs.CHILD_TIMEOUT_S)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-20:])
        print(f"  {name}: FAILED (rc {proc.returncode})\n{tail}", file=sys.stderr, flush=True)
        return {"name": name, "error": tail}
    row = json.loads(lines[-1][len("RESULT ") :]) | {"waited_for_quiet_s": waited}
    print(
        f"  {name}: load {row['load_s']:.2f} s, TTFT {row['ttft_ms_median']:.0f} ms, decode "
        f"{row['decode_tok_s_median']:.1f} tok/s, CPU wait {row['cpu_wait_pct'] or 0:.0f} %",
        file=sys.stderr,
        flush=True,
    )
    return row


def exports(folder: Path) -> tuple[dict[str, str | None], dict]:
    """Linnet's exports of the embedded SmolLM2 (GGUF q4_1; the HF folder when `linnet.export.hf` exists), the
    paths each configuration loads, and how long each export took."""
    import linnet.export
    import linnet.torch

    t0 = time.perf_counter()
    model = linnet.torch.load(gs.SOURCE, weights=gs.EMBEDDED_ID, progress=False)
    timings = {"linnet_load_s": time.perf_counter() - t0}
    original = str(Path(gs.gguf_dir()) / gs.GGUF_NAME)
    paths: dict[str, str | None] = {"llama.cpp original": original, "transformers original": None}
    t0 = time.perf_counter()
    paths["llama.cpp export"] = str(linnet.export.gguf(model, folder / "smollm2-q4_1.gguf", type="q4_1"))
    timings["export_gguf_q4_1_s"] = time.perf_counter() - t0
    if importlib.util.find_spec("linnet.runtimes.export.hf") is not None:  # the export-hf branch
        t0 = time.perf_counter()
        linnet.export.hf(model, folder / "smollm2-hf")
        timings["export_hf_f32_s"] = time.perf_counter() - t0
        paths["transformers export"] = str(folder / "smollm2-hf")
    return paths, timings


def fastest(runs: list[dict]) -> dict:
    """Of one configuration's rounds, the fastest decode (best of N: other processes only ever slow a round down;
    the machine-wide CPU wait does not say whose tasks waited), with the others listed."""
    ok = [r for r in runs if "error" not in r] or runs
    best = max(ok, key=lambda r: r.get("decode_tok_s_median") or 0)
    keys = ("load_s", "ttft_ms_median", "decode_tok_s_median", "cpu_wait_pct", "error")
    return best | {"other_rounds": [{k: r.get(k) for k in keys} for r in runs if r is not best]}


def pairs(rows: list[dict]) -> list[dict]:
    """Per engine, the export's load time, TTFT and decode against the original's, in % (positive: slower)."""
    by = {r["name"]: r for r in rows if "error" not in r}
    out = []
    for engine in ("llama.cpp", "transformers"):
        a, b = by.get(f"{engine} original"), by.get(f"{engine} export")
        if a is None or b is None:
            continue
        for metric, slower_if_higher in (("load_s", True), ("ttft_ms_median", True), ("decode_tok_s_median", False)):
            change = 100 * (b[metric] / a[metric] - 1)
            slower = change if slower_if_higher else -change
            out.append(
                {
                    "engine": engine,
                    "metric": metric,
                    "original": a[metric],
                    "export": b[metric],
                    "export_slower_pct": slower,
                    "within_goal": slower <= GOAL_PCT,
                    "same_tokens": a["tokens"] == b["tokens"],
                }
            )
    return out


def markdown(result: dict) -> str:
    lines = [
        "# Export speed: each engine on the original SmolLM2 checkpoint vs on Linnet's export",
        "",
        f"{result['prompt_tokens']} prompt tokens, {result['new_tokens']} new tokens, greedy, {THREADS} threads, "
        f"median of {result['runs']} runs. Goal: the export within {GOAL_PCT:.0f} % of the original.",
        "",
        "| engine | metric | original | export | export slower | same tokens |",
        "|---|---|---|---|---|---|",
    ]
    for p in result["pairs"]:
        lines.append(
            f"| {p['engine']} | {p['metric']} | {p['original']:.3g} | {p['export']:.3g} | "
            f"{p['export_slower_pct']:+.1f} % | {p['same_tokens']} |"
        )
    lines += ["", "Export time: " + ", ".join(f"{k} {v:.2f} s" for k, v in result["export_timings"].items())]
    lines += [f"Skipped: {s}" for s in result["skipped"]]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--one", choices=list(CONFIGS), help=argparse.SUPPRESS)
    parser.add_argument("--prompt-file", help=argparse.SUPPRESS)
    parser.add_argument("--original", help=argparse.SUPPRESS)
    parser.add_argument("--export", help=argparse.SUPPRESS)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--quiet-wait", type=float, default=60.0, help="max seconds to wait for idle cores")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each configuration, alternating (the "
                        "fastest is kept)")  # fmt: skip
    parser.add_argument("--out", default=str(OUT), help="PATH.json and PATH.md (default bench/results/export_speed)")
    args = parser.parse_args()
    if args.one:
        run_one(args)
        return
    with tempfile.TemporaryDirectory(prefix="export-speed-") as tmp:
        prompt, prompt_info = gs.make_prompt(args.prompt_tokens)
        prompt_file = Path(tmp) / "prompt.json"
        prompt_file.write_text(json.dumps(prompt))
        paths, timings = exports(Path(tmp))
        skipped, attempts = [], {}
        for name, (engine, _) in CONFIGS.items():
            if paths.get(f"{engine} export") is None:
                skipped.append(f"{name}: linnet.export.hf is not on this branch (the export-hf branch adds it)")
            elif engine == "llama.cpp" and importlib.util.find_spec("llama_cpp") is None:
                skipped.append(f"{name}: llama-cpp-python is not installed (tools/llama_cpp_wheel.sh)")
            else:
                attempts[name] = []
        for _ in range(args.rounds):  # original, export, original, export...: contention hits both alike
            for name in attempts:
                attempts[name].append(run_child(name, args, paths, prompt_file))
        rows = [fastest(runs) for runs in attempts.values()]
    result = {
        "machine": gs.machine(),
        "versions": gs.versions(),
        "prompt": prompt_info,
        "prompt_tokens": args.prompt_tokens,
        "new_tokens": args.new_tokens,
        "runs": args.runs,
        "rounds": args.rounds,
        "export_timings": timings,
        "rows": rows,
        "pairs": pairs(rows),
        "skipped": skipped,
    }
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    out.with_suffix(".md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
