"""The two forms of GPT-OSS's experts, timed: writes bench/results/moe_forms.json.

examples/gpt_oss.linnet computes the mixture of experts two ways (GptOssExperts): `forward`, every expert on every
token (dense: num_local_experts / k times the expert work, as batched matmuls that read each weight once), and
`chosen`, each token through its k experts (`gather_matmul`: as its body, a copy of the k chosen expert matrices
per token). The source's `forward` and `step` entries (whole sequences, prefills) run the dense form,
its `decode` entry (one token a row, what generation runs after the prefill) the sparse one. On the PyTorch backends
the sparse decode is also timed with `gather_matmul` as its body (the chosen matrices copied per token) instead of
its native form (`F.grouped_mm`, each chosen matrix read in place). This times, on one
backend with random weights at a GPT-OSS-shaped size (shrunk in depth and width so that 32 experts fit beside other
jobs), a prefill of `--prefill` tokens by both forms (the sparse prefill through a copy of the source whose `step`
takes the sparse form) and single-token decode steps by both (`step` dense, `decode` sparse), and checks that the
two forms give the same logits (max |Δ|), so the timings are of the same computation.

Run: `python bench/moe_forms.py [--backend torch] [--prefill 128] [--steps 16] [--out PATH]`. Timings here, never in
tests; the JSON records the CPU pressure (Linux PSI) seen while it ran.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SOURCE = ROOT / "examples" / "gpt_oss.linnet"
OUT = ROOT / "bench" / "results" / "moe_forms.json"
# GPT-OSS-20B's shape (32 experts, 4 per token, 64 query / 8 KV heads of 64) at a quarter of its width (hidden and
# expert width 720 instead of 2880) and 2 layers: the experts' weights are 32 * 3 * 720 * 720 f32 = 200 MB a layer.
CONFIG = dict(
    vocab_size=8192, hidden_size=720, intermediate_size=720, num_hidden_layers=2, num_attention_heads=64,
    num_key_value_heads=8, head_dim=64, num_local_experts=32, num_experts_per_tok=4, sliding_window=128,
    layer_types=["sliding_attention", "full_attention"],
)  # fmt: skip
DENSE_STEP, SPARSE_STEP = (
    "model.step(input_ids, positions, rows, false)",
    "model.step(input_ids, positions, rows, true)",
)


def sparse_prefill_variant(text: str) -> str:
    """The source with its `step` entry taking the sparse form of the experts (as `decode` does)."""
    assert text.count(DENSE_STEP) == 1, "the `step` entry runs the dense experts"
    return text.replace(DENSE_STEP, SPARSE_STEP)


def cpu_pressure() -> float | None:
    """Linux PSI: the share of time some task waited for a CPU over the last 10 s, in %."""
    try:
        line = Path("/proc/pressure/cpu").read_text().split("\n")[0]
        return float(line.split("avg10=")[1].split()[0])
    except (OSError, IndexError, ValueError):
        return None


def load(path: Path, backend: str, positions: int):
    from linnet.runtimes.backends import BACKENDS

    return BACKENDS[backend].load(path, config=CONFIG, random_weights=True, max_batch=1, max_positions=positions,
                                  progress=False)  # fmt: skip


def timed(fn, *args):
    t0 = time.perf_counter()
    out = fn(*args)
    return 1e3 * (time.perf_counter() - t0), out


def gathered_decode_ms(path: Path, backend: str, ids: np.ndarray, prefill: int, steps: int) -> float:
    """Median ms of the sparse decode with `gather_matmul` run as its body (the chosen matrices gathered per row)
    instead of PyTorch's native grouped form: the same computation, to compare the two in one run."""
    from linnet.compiler.torch import codegen

    native = codegen.PASSES
    codegen.PASSES = replace(native, decompose=native.decompose | {"gather_matmul"})
    try:
        m = load(path, backend, prefill + steps + 1)
    finally:
        codegen.PASSES = native
    zero = np.array([0])
    m.run("decode", ids[:, :1], zero, zero)
    m.reset_state()
    m.run("step", ids[:, :prefill], zero, zero)
    times = [timed(m.run, "decode", ids[:, p : p + 1], np.array([p]), zero)[0] for p in range(prefill, prefill + steps)]
    return statistics.median(times)


def measure(path: Path, sparse_path: Path, backend: str, prefill: int, steps: int, seed: int) -> dict:
    """Milliseconds of each form's prefill and decode steps, and the largest logit difference between the forms."""
    ids = np.random.default_rng(seed).integers(2, CONFIG["vocab_size"], (1, prefill + steps))
    zero = np.array([0])
    m = load(path, backend, prefill + steps + 1)
    for entry in ("step", "decode"):  # warm up (compiles on the JAX and compiled torch backends)
        m.run(entry, ids[:, :1], zero, zero)
    m.run("forward", ids[:, :8])
    m.reset_state()
    forward_ms, (full,) = timed(m.run, "forward", ids[:, :prefill])
    m.reset_state()
    dense_prefill_ms, (last,) = timed(m.run, "step", ids[:, :prefill], zero, zero)
    decode = {"step": [], "decode": []}
    logits = {"step": [], "decode": []}
    for entry in decode:
        m.reset_state()
        m.run("step", ids[:, :prefill], zero, zero)
        for p in range(prefill, prefill + steps):
            ms, (out,) = timed(m.run, entry, ids[:, p : p + 1], np.array([p]), zero)
            decode[entry].append(ms)
            logits[entry].append(out[0])
    del m
    gathered = gathered_decode_ms(path, backend, ids, prefill, steps) if backend.startswith("torch") else None
    s = load(sparse_path, backend, prefill + steps + 1)
    s.run("step", ids[:, :8], zero, zero)
    s.reset_state()
    sparse_prefill_ms, (sparse_last,) = timed(s.run, "step", ids[:, :prefill], zero, zero)
    delta = max(
        float(np.abs(np.stack(logits["step"]) - np.stack(logits["decode"])).max()),
        float(np.abs(last - sparse_last).max()),
        float(np.abs(full[0, -1] - last[0]).max()),
    )
    return {
        "prefill_ms": {"forward (dense)": forward_ms, "step (dense)": dense_prefill_ms,
                       "step (sparse)": sparse_prefill_ms},
        "decode_ms_median": {"step (dense)": statistics.median(decode["step"]),
                             "decode (sparse)": statistics.median(decode["decode"]),
                             **({"decode (sparse, gathered)": gathered} if gathered else {})},
        "max_abs_diff_between_forms": delta,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", default="torch")
    parser.add_argument("--prefill", type=int, default=128)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    text = SOURCE.read_text(encoding="utf-8")
    before = cpu_pressure()
    with tempfile.TemporaryDirectory() as tmp:
        sparse_path = Path(tmp) / "gpt_oss_sparse_prefill.linnet"
        sparse_path.write_text(sparse_prefill_variant(text), encoding="utf-8")
        rows = measure(SOURCE, sparse_path, args.backend, args.prefill, args.steps, seed=0)
    result = {
        "what": "GPT-OSS experts, dense (every expert on every token) against sparse (gather of the k chosen)",
        "backend": args.backend,
        "config": CONFIG,
        "prefill_tokens": args.prefill,
        "decode_steps": args.steps,
        "cpu_wait_percent_before_after": [before, cpu_pressure()],
        **rows,
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
