"""The transformers pair of issue 16's export benchmark: transformers on the original embedded SmolLM2 GGUF against
transformers on Linnet's Hugging Face export of it, plus the export's own time. Writes
bench/results/export_hf_speed.json.

    python bench/export_hf_speed.py [--runs N] [--new-tokens N] [--prompt-tokens N] [--out PATH]

Both sides run in their own child process (so load time and memory are their own), through
bench/generate_speed.py's `run_transformers` (greedy `generate`, eager f32, timestamps per token): load time, time
to first token, decode tok/s (medians over `--runs`), and whether the greedy tokens agree. The original is read by
transformers' own GGUF loader (dequantized to f32); the export is `linnet export hf` of the same file in f32, so
both hold the same values. The goal: the export within 5% of the original on each figure.

`transformers_pair(export_dir, prompt, new_tokens, runs)` is the function bench/export_speed.py (the GGUF pair)
calls for its transformers rows; `export_smollm2(out_dir)` makes the export and returns its seconds.
Timings live here, never in tests.
"""

from __future__ import annotations

import argparse
import json
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

OUT = ROOT / "bench" / "results" / "export_hf_speed.json"
CHILD_TIMEOUT_S = 1800


def export_smollm2(out_dir: Path) -> float:
    """Export the embedded SmolLM2 GGUF to a Hugging Face folder `out_dir` in f32; the seconds it took (load
    through Linnet's PyTorch backend and write)."""
    import linnet
    import linnet.export

    t0 = time.perf_counter()
    model = linnet.load(ROOT / "examples" / "llama.linnet", "smollm2-135m-instruct", max_positions=16, progress=False)
    linnet.export.hf(model, out_dir, dtype="f32")
    return time.perf_counter() - t0


def _side(folder: str | None, prompt: list[int], new_tokens: int, runs: int) -> dict:
    """One side, in this process: the figures of `gs.run_transformers` on the GGUF (folder None) or `folder`."""
    r = gs.run_transformers("eager", "f32", prompt, new_tokens, runs, folder=folder)
    ttft, decode, tokens = zip(*[(t[0], t[1], t[2]) for t in r["timed"]])
    return {
        "load_s": r["load_s"],
        "ttft_s": statistics.median(ttft),
        "decode_tok_s": statistics.median(decode),
        "tokens": list(tokens[0]),
        "contention": r["contention"],
    }


def transformers_pair(export_dir: Path, prompt: list[int], new_tokens: int, runs: int) -> list[dict]:
    """[original row, export row]: transformers on the embedded GGUF and on `export_dir`, each in a child process,
    with `export_vs_original` ratios (export / original) on the export's row."""
    rows = []
    sides = (("transformers on the original GGUF", None), ("transformers on Linnet's HF export", export_dir))
    for name, folder in sides:
        gs.wait_for_quiet(60)
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump({"folder": str(folder) if folder else None, "prompt": prompt, "new_tokens": new_tokens,
                       "runs": runs}, f)  # fmt: skip
        out = subprocess.run([sys.executable, __file__, "--child", f.name], capture_output=True, text=True,
                             timeout=CHILD_TIMEOUT_S)  # fmt: skip
        if out.returncode != 0:
            raise RuntimeError(f"{name} failed:\n{out.stderr[-3000:]}")
        rows.append({"name": name, **json.loads(out.stdout.strip().splitlines()[-1])})
    original, export = rows
    export["export_vs_original"] = {k: export[k] / original[k] for k in ("load_s", "ttft_s", "decode_tok_s")}
    export["same_tokens"] = export["tokens"] == original["tokens"]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        job = json.loads(Path(args.child).read_text())
        print(json.dumps(_side(job["folder"], job["prompt"], job["new_tokens"], job["runs"])))
        return
    prompt, prompt_info = gs.make_prompt(args.prompt_tokens)
    with tempfile.TemporaryDirectory() as tmp:
        export_dir = Path(tmp) / "smollm2-hf"
        export_s = export_smollm2(export_dir)
        rows = transformers_pair(export_dir, prompt, args.new_tokens, args.runs)
    result = {
        "machine": gs.machine(),
        "versions": gs.versions(),
        "git": gs.git_info(),
        "prompt": prompt_info,
        "new_tokens": args.new_tokens,
        "runs": args.runs,
        "export_s": export_s,
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"export (GGUF -> HF f32): {export_s:.1f} s")
    for r in rows:
        print(f"{r['name']:<38} load {r['load_s']:6.2f} s  TTFT {r['ttft_s'] * 1e3:7.1f} ms  "
              f"decode {r['decode_tok_s']:6.1f} tok/s")  # fmt: skip
    print(f"ratios (export / original): {rows[1]['export_vs_original']}, same tokens: {rows[1]['same_tokens']}")


if __name__ == "__main__":
    main()
