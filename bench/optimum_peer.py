"""The ONNX Runtime rows' peer from issue 6, measured here: writes bench/results/optimum_peer.json.

The peer: `optimum-cli export onnx --task text-generation-with-past` of the same weights, run by optimum's
`ORTModelForCausalLM` on ONNX Runtime CPU, f32, 2 threads. The workload and the timing are
bench/generate_speed.py's: SmolLM2-135M-Instruct from the embedded Q4_1 GGUF (dequantized), the same 512 prompt
token ids, 128 new tokens, greedy, batch 1; load timed, one warm-up generation (timed apart), 3 timed generations,
medians. Time to first token is the wall clock from the `generate` call to the first new token (a transformers
streamer: its first `put` is the prompt, then one per new token); decode tok/s is (new tokens - 1) / (time of the
last token - time of the first) (`generate_speed.timing`). EOS does not stop generation (the generation config has
no `eos_token_id`, the attention mask is all ones), as in the bench's transformers rows.

ONNX Runtime settings: `SessionOptions` with intra_op_num_threads=2, inter_op_num_threads=1, the graph optimisation
level left at its default (ORT_ENABLE_ALL, recorded in the JSON), CPUExecutionProvider, `use_cache=True`, IO
binding as optimum defaults (off on CPU; recorded).

It runs in its own environment: optimum-onnx 0.1.0 pins transformers < 4.58, and Linnet's venv has transformers 5.
So it has three steps, each a subcommand:

- `prepare` (Linnet's venv): the prompt ids (`generate_speed.make_prompt`, which needs Linnet's tokenizer), Linnet's
  ONNX backend's greedy tokens on that prompt (f32, as `generate_speed.run_onnxruntime` makes them), and the GGUF's
  path, to DATA/prep.json.
- `export` (the optimum env): the GGUF loaded as the bench's transformers rows load it (`from_pretrained(dir,
  gguf_file=...)`, dequantized to f32), `save_pretrained` (model and tokenizer) to DATA/smollm2-hf, then
  `optimum-cli export onnx --task text-generation-with-past` to DATA/smollm2-onnx; its log goes to DATA/export.log
  and the logits max diff of its validation into DATA/export.json.
- `measure` (the optimum env): waits for idle cores (`generate_speed.wait_for_quiet`), times as above, records the
  contention (`generate_speed.timed_runs`) and a calibration (the bench's pure-Python loop and f32 matmul), compares
  the greedy tokens with Linnet's ONNX backend's (common prefix length), writes the JSON, prints one line.

Contention: optimum's `generate` runs its logits processing in torch, whose intra-op pool (2 threads by default)
contends with ONNX Runtime's, so `cpu_wait_pct` reads ~10 % with nothing else running; under OMP_NUM_THREADS=1 it
reads ~0.1 % and the timings stay within run-to-run noise (measured once on this 2-core machine).

Only stdlib-level helpers are imported from bench/generate_speed.py (its module imports nothing from Linnet), so
the prompt and the timing are the bench's own code, not copies.

Setup and run (DATA defaults to ../optdata next to the repo):
    python3.11 -m venv /work/optenv && /work/optenv/bin/pip install optimum-onnx==0.1.0 "transformers<4.58" \
        onnxruntime==1.32.0 torch==2.13.0 gguf accelerate
    .venv/bin/python bench/optimum_peer.py prepare && /work/optenv/bin/python bench/optimum_peer.py export && \
        /work/optenv/bin/python bench/optimum_peer.py measure
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import generate_speed as gs  # noqa: E402  (stdlib-only at import time)

DATA = ROOT.parent / "optdata"
OUT = ROOT / "bench" / "results" / "optimum_peer.json"
PROMPT_TOKENS = 512
NEW_TOKENS = 128
RUNS = 3


def version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def prepare(data: Path) -> None:
    """Linnet's venv: the prompt ids, Linnet's ONNX greedy tokens, the GGUF path."""
    import numpy as np  # noqa: F401  (Linnet's ONNX backend needs it)

    import linnet.onnx as lo
    from linnet.runtimes.generation import Generator
    from linnet.runtimes.sampling import SamplingParams

    prompt, info = gs.make_prompt(PROMPT_TOKENS)
    m = lo.load(
        gs.SOURCE,
        dtype="f32",
        max_positions=PROMPT_TOKENS + NEW_TOKENS,
        numerics="equivalent",
        threads=gs.THREADS,
        progress=False,
    )
    runner = Generator(m.step_model(), None)  # no tokenizer: no EOS ids
    result = runner.generate(prompt, SamplingParams(max_new_tokens=NEW_TOKENS, stop_token_ids=frozenset()))
    data.mkdir(parents=True, exist_ok=True)
    prep = {
        "prompt": {**info, "ids": prompt},
        "gguf": str(Path(gs.gguf_dir()) / gs.GGUF_NAME),
        "linnet_onnx_f32_tokens": list(result.token_ids),
        "linnet": {
            "version": __import__("linnet").__version__,
            "git": gs.git_info(),
            "numerics": "equivalent",
            "onnxruntime": version("onnxruntime"),
        },
    }
    (data / "prep.json").write_text(json.dumps(prep))
    print(f"wrote {data / 'prep.json'}: {len(prompt)} prompt ids, {len(result.token_ids)} Linnet ONNX tokens")


def export(data: Path) -> None:
    """The optimum env: the GGUF as an HF folder (f32), then optimum-cli's export."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    prep = json.loads((data / "prep.json").read_text())
    gguf = Path(prep["gguf"])
    hf, onnx_dir = data / "smollm2-hf", data / "smollm2-onnx"
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(hf)
    model.save_pretrained(hf)
    config = json.loads((hf / "config.json").read_text())
    cmd = [
        str(Path(sys.executable).parent / "optimum-cli"),
        "export",
        "onnx",
        "--model",
        str(hf),
        "--task",
        "text-generation-with-past",
        str(onnx_dir),
    ]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True)
    log = r.stdout + r.stderr
    (data / "export.log").write_text(log)
    diff = re.search(r"- logits: max diff = ([0-9.eE+-]+)", log)
    info = {
        "command": " ".join(cmd),
        "returncode": r.returncode,
        "export_s": time.perf_counter() - t0,
        "logits_max_diff": float(diff.group(1).rstrip(".")) if diff else None,
        "validation_atol": 1e-5,
        "within_atol": "not within the set tolerance" not in log,
        "tied_weights_warning": "Found different candidate ONNX initializers" in log,
        "hf_config": {k: config.get(k) for k in ("rms_norm_eps", "tie_word_embeddings", "rope_theta", "dtype")},
    }
    (data / "export.json").write_text(json.dumps(info, indent=1))
    print(json.dumps(info))
    if r.returncode:
        sys.exit(log[-4000:])


def measure(data: Path, out: Path, quiet_wait: float) -> None:
    """The optimum env: load, warm up, time, compare, write."""
    import onnxruntime as ort
    import torch
    from optimum.onnxruntime import ORTModelForCausalLM
    from transformers.generation.streamers import BaseStreamer

    prep = json.loads((data / "prep.json").read_text())
    prompt = prep["prompt"]["ids"]
    onnx_dir = data / "smollm2-onnx"

    so = ort.SessionOptions()
    so.intra_op_num_threads = gs.THREADS
    so.inter_op_num_threads = 1
    t0 = time.perf_counter()
    model = ORTModelForCausalLM.from_pretrained(
        onnx_dir, session_options=so, provider="CPUExecutionProvider", use_cache=True
    )
    load_s = time.perf_counter() - t0
    model.generation_config.eos_token_id = None  # EOS must not end a benchmark run
    ids = torch.tensor([prompt], dtype=torch.int64)
    kwargs = dict(
        attention_mask=torch.ones_like(ids),
        max_new_tokens=NEW_TOKENS,
        min_new_tokens=NEW_TOKENS,
        do_sample=False,
        pad_token_id=model.generation_config.pad_token_id,
    )

    class Stamps(BaseStreamer):
        """`generate`'s streamer: the time of each `put` (the prompt first, then one per new token), as the
        bench's transformers rows take them."""

        def __init__(self) -> None:
            self.stamps: list[float] = []
            self.end = lambda: None

        def put(self, value) -> None:
            self.stamps.append(time.perf_counter())

    def one() -> tuple[float, float, list[int]]:
        streamer = Stamps()
        start = time.perf_counter()
        out_ids = model.generate(ids, streamer=streamer, **kwargs)
        tokens = out_ids[0, len(prompt) :].tolist()
        assert len(tokens) == NEW_TOKENS, len(tokens)
        ttft, decode = gs.timing(start, streamer.stamps[1:])
        return ttft, decode, tokens

    waited = gs.wait_for_quiet(quiet_wait)
    loadavg_before = os.getloadavg()
    t0 = time.perf_counter()
    one()
    warmup_s = time.perf_counter() - t0
    timed, contention = gs.timed_runs(one, RUNS)
    loadavg_after = os.getloadavg()

    torch.set_num_threads(gs.THREADS)
    calibration = {"python_loop_s": gs.calibration_s(), "matmul_f32_tflops": gs.matmul_tflops("f32")}

    tokens = timed[0][2]
    linnet = prep["linnet_onnx_f32_tokens"]
    prefix = next((i for i, (a, b) in enumerate(zip(tokens, linnet)) if a != b), min(len(tokens), len(linnet)))
    export_info = json.loads((data / "export.json").read_text()) if (data / "export.json").exists() else None
    result = {
        "benchmark": "optimum_peer",
        "what": "optimum-cli export onnx --task text-generation-with-past (f32) on ONNX Runtime CPU via "
        "ORTModelForCausalLM, same workload as bench/generate_speed.py",
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "model": f"{gs.EMBEDDED_ID} ({gs.GGUF_NAME}, dequantized, saved as an f32 HF folder, exported by optimum)",
        "prompt_tokens": len(prompt),
        "prompt_sha256_of_ids": prep["prompt"]["sha256_of_ids"],
        "new_tokens": NEW_TOKENS,
        "runs": RUNS,
        "threads": {"intra_op": so.intra_op_num_threads, "inter_op": so.inter_op_num_threads},
        "ttft_ms": 1000 * statistics.median(t[0] for t in timed),
        "decode_tok_s": statistics.median(t[1] for t in timed),
        "load_s": load_s,
        "warmup_s": warmup_s,
        "ttft_ms_all": [1000 * t[0] for t in timed],
        "decode_tok_s_all": [t[1] for t in timed],
        "tokens_same_every_run": all(t[2] == tokens for t in timed),
        "tokens": tokens,
        "linnet_onnx_f32_common_prefix": prefix,
        "linnet_onnx_f32_compared": min(len(tokens), len(linnet)),
        "linnet": prep["linnet"],
        "ort": {
            "graph_optimization_level": str(so.graph_optimization_level),
            "providers": model.providers,
            "session_graph_optimization_level": str(model.session.get_session_options().graph_optimization_level),
            "use_io_binding": model.use_io_binding,
            "use_cache": model.use_cache,
        },
        "export": export_info,
        "contention": {
            **contention,
            "waited_for_quiet_s": waited,
            "loadavg_before": loadavg_before,
            "loadavg_after": loadavg_after,
        },
        "calibration": calibration,
        "machine": gs.machine(),
        "versions": {
            name: version(name)
            for name in ("optimum-onnx", "optimum", "transformers", "onnxruntime", "torch", "onnx", "numpy")
        }
        | {"python": sys.version.split()[0]},
    }
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(
        f"optimum peer: TTFT {result['ttft_ms']:.0f} ms, decode {result['decode_tok_s']:.1f} tok/s, load "
        f"{load_s:.2f} s, warm-up {warmup_s:.2f} s; greedy tokens equal Linnet ONNX f32's for {prefix}/"
        f"{result['linnet_onnx_f32_compared']}; cpu_wait {contention['cpu_wait_pct']:.1f}% -> {out}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=["prepare", "export", "measure"])
    parser.add_argument("--data", type=Path, default=DATA, help="prompt, HF folder, ONNX export (outside the repo)")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--quiet-wait", type=float, default=600, help="max seconds to wait for idle cores")
    args = parser.parse_args()
    if args.step == "prepare":
        prepare(args.data)
    elif args.step == "export":
        export(args.data)
    else:
        measure(args.data, args.out, args.quiet_wait)


if __name__ == "__main__":
    main()
