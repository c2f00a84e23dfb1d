"""Issue 41 goal 8: `linnet train --backend jax --device tpu` LoRA SFT on one TPU chip (`bench/tpu.py --only train`).

Rows (section `train`):
- for each batch size (`--train-batches`: 4 rows of 512 tokens, and 8 with activation checkpointing, `8r`, by
  default; 8 rows hold ~9 GB of attention probabilities without it): LoRA SFT (rank 16, alpha 32, on
  every attention and MLP projection: q/k/v/o, gate/up/down) of a TinyLlama-1.1B-shaped Hugging Face folder of
  seeded random bf16 weights (`tpu.fast_random_params`, written with `export_hf`), on seeded random token rows
  (`{"input_ids": [...]}`, 512 tokens, the whole row in the loss), in bf16 mixed precision (`--bf16`: bf16 weights
  and activations, f32 adapters and AdamW). `linnet.train`, the call `linnet train` makes. Warm-up steps, then
  timed steps: tokens/s and the model FLOP utilisation against the calibration's measured bf16 matmul TFLOP/s and
  against the chip's peak (197 TFLOP/s bf16 for a v5e), the first step's time beyond a timed step (compile, cold:
  the bench's compile cache starts empty), and the load time.
- `train vs cpu`: the same rows through the same steps on a 2-layer model of the same width (the 1.1B shape with
  `num_hidden_layers=2`, cheap on the CPU) on the host's CPU in f32 (the reference: JAX on `jax.devices("cpu")`,
  in the same process) and on the chip in f32 and in bf16: each step's loss, the largest difference and whether it
  is within the numerics' tolerance (f32: 1e-4 relative; bf16: 1e-2 relative, a few bf16 roundings of 2^-8).

Model FLOPs (the PaLM paper's MFU, Chowdhery et al. 2022, appendix B: 6N + 12·L·H·Q·T FLOPs a token for training,
N the parameters of the matmuls, L layers, H heads, Q head dim, T the sequence length, no causal halving), adapted
to LoRA: a frozen weight computes its forward (2N) and its input's gradient (2N) but no weight gradient, so
4·N_frozen + 6·N_lora + 12·L·H·Q·T a token, N_frozen the frozen matmul weights (the projections and the output
head, not the embedding: a lookup), N_lora the adapters. Recomputation (none here) and padding count for nothing.

Device time (estimate): writing the 2.2 GB folder ~20 s; per batch size a load (~15 s), a cold compile of the
step (~40-90 s) and the steps (~0.1-1 s each); the CPU comparison ~60 s. About 5 minutes for two batch sizes.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

LORA_TARGETS = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
V5E_PEAK_BF16_TFLOPS = 197.0  # Google Cloud's TPU v5e spec sheet: 197 TFLOP/s bf16 per chip
TOLERANCE = {"f32": 1e-4, "bf16": 1e-2}  # relative, on each step's loss


def lora_settings():
    from linnet.runtimes.train import LoraSettings

    return LoraSettings(r=16, lora_alpha=32.0, targets=LORA_TARGETS)


def write_folder(folder: Path, dry: bool, layers: int | None = None) -> Path:
    """A Llama HF folder of seeded random bf16 weights: TinyLlama-1.1B's shape (tpu.TINY's under `dry`), with
    `layers` decoder layers when given."""
    from tpu import LLAMA, SHAPES, TINY  # bench/ is not a package: tpu.py puts bench/ first on sys.path

    import linnet
    from linnet.runtimes.export.hf import export_hf

    config = dict(TINY) if dry else {}
    if layers is not None:
        config["num_hidden_layers"] = layers
    model = linnet.load(LLAMA, backend="jax", preset=None if dry else SHAPES["tinyllama-1.1b"], config=config or None,
                        random_weights=True, seed=0, dtype="bf16", progress=False)  # fmt: skip
    export_hf(model, folder, dtype="bf16")
    return folder


def write_rows(path: Path, rows: int, tokens: int, vocab: int, seed: int = 0) -> Path:
    """`rows` seeded random rows of `tokens` token ids (3 .. vocab-1) as `linnet train` reads them."""
    rng = np.random.default_rng(seed)
    lines = [json.dumps({"input_ids": rng.integers(3, vocab, tokens).tolist()}) for _ in range(rows)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def model_flops_per_token(params: dict, config: dict, tokens: int) -> tuple[float, dict]:
    """The LoRA-adapted PaLM model FLOPs of one trained token (module docstring) and its terms."""
    lora = sum(int(np.prod(a.shape)) for k, a in params.items() if ".lora_" in k)
    frozen = sum(
        int(np.prod(a.shape)) for k, a in params.items() if a.ndim == 2 and ".lora_" not in k and "embed" not in k
    )
    attention = 12 * config["num_hidden_layers"] * config["hidden_size"] * tokens  # H·Q = hidden_size for Llama
    terms = {"n_frozen_matmul_m": round(frozen / 1e6, 1), "n_lora_m": round(lora / 1e6, 2)}
    return 4 * frozen + 6 * lora + attention, terms


def run_train(
    weights: Path, data: Path, device: str, dtype: str, batch: int, steps: int, lr: float = 1e-4, remat: bool = False
):
    """`linnet.train` (LoRA SFT, the rows in file order; `remat`: activation checkpointing) -> (its result, wall
    seconds)."""
    from tpu import LLAMA

    import linnet

    t = time.perf_counter()
    result = linnet.train(
        LLAMA, weights, data=data, backend="jax", device=device, lora=lora_settings(), bf16=dtype == "bf16",
        per_device_train_batch_size=batch, max_steps=steps, learning_rate=lr, shuffle=False, progress=False,
        max_length=None, gradient_checkpointing=remat,
    )  # fmt: skip
    return result, time.perf_counter() - t


def speed_rows(report, device: str, dry: bool, calibration: dict, work: Path, batches: list[str], budget_end: float):
    """The 1.1B shape's LoRA SFT at each batch size (`8`, or `8r` with activation checkpointing): tokens/s, MFU,
    compile and load times."""
    tokens, warm, timed = (64, 1, 2) if dry else (512, 2, 8)
    folder = write_folder(work / "tinyllama-1.1b", dry)
    config = json.loads((folder / "config.json").read_text())
    measured = calibration["matmul_bf16_tflops"]
    for spec in batches:
        batch, remat = int(spec.rstrip("r")), spec.endswith("r")
        if time.monotonic() > budget_end:
            report.add("train", {"batch": spec, "skipped": "time budget spent"})
            continue
        data = write_rows(work / f"rows-{batch}.jsonl", batch * (warm + timed), tokens, config["vocab_size"])
        try:
            result, wall = run_train(folder, data, device, "bf16", batch, warm + timed, remat=remat)
        except Exception as err:  # out of memory at a batch too big: the row says so, the next still runs
            report.add("train", {"batch": spec, "error": f"{type(err).__name__}: {str(err)[:300]}"})
            continue
        history = result.history
        steps_s = [r["elapsed_s"] for r in history[warm:]]
        trained = sum(r["num_tokens"] for r in history[warm:])
        tok_s = trained / sum(steps_s)
        flops, terms = model_flops_per_token(result.model.params, config, tokens)
        achieved = tok_s * flops / 1e12
        report.add("train", {
            "shape": "tiny" if dry else "tinyllama-1.1b", "batch": batch, "tokens_per_row": tokens,
            "activation_checkpointing": remat,
            "dtype": "bf16 (f32 adapters, AdamW)", "lora": f"r16 a32 {LORA_TARGETS}", **terms,
            "model_tflop_per_step": round(flops * batch * tokens / 1e12, 2), "tokens_per_s": round(tok_s, 1),
            "ms_per_step": round(float(np.median(steps_s)) * 1e3, 1), "model_tflops": round(achieved, 2),
            "mfu_of_measured": f"{achieved / measured:.1%}" if measured > 0 else "n/a",
            "mfu_of_peak_197": f"{achieved / V5E_PEAK_BF16_TFLOPS:.1%}",
            "first_step_s": round(history[0]["elapsed_s"], 1),
            "compile_s_cold": round(history[0]["elapsed_s"] - float(np.median(steps_s)), 1),
            "load_s": round(wall - sum(r["elapsed_s"] for r in history), 1),
            "losses": [round(r["loss"], 4) for r in history], "steps": f"{warm} warm-up + {timed} timed",
        })  # fmt: skip
        del result


def cpu_rows(report, device: str, dry: bool, work: Path) -> None:
    """The same rows and steps on a 2-layer model of the 1.1B shape's width: the CPU in f32 against the device in
    f32 and in bf16, each step's loss."""
    tokens, batch, steps = (32, 2, 3) if dry else (128, 2, 4)
    folder = write_folder(work / "two-layers", dry, layers=2)
    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    data = write_rows(work / "rows-cpu.jsonl", batch * steps, tokens, vocab, seed=1)
    reference, _ = run_train(folder, data, "cpu", "f32", batch, steps, lr=1e-3)
    ref = [r["loss"] for r in reference.history]
    for dtype in ("f32", "bf16"):
        result, _ = run_train(folder, data, device, dtype, batch, steps, lr=1e-3)
        got = [r["loss"] for r in result.history]
        rel = max(abs(a - b) / abs(b) for a, b in zip(got, ref))
        norms = [(a["grad_norm"], b["grad_norm"]) for a, b in zip(result.history, reference.history)]
        report.add("train vs cpu", {
            "shape": "2 layers of " + ("tiny" if dry else "tinyllama-1.1b"), "device_dtype": dtype,
            "rows": f"{batch} x {tokens} tokens, {steps} steps, lr 1e-3", "cpu_f32_losses": [round(x, 5) for x in ref],
            "device_losses": [round(x, 5) for x in got], "max_abs_diff": max(abs(a - b) for a, b in zip(got, ref)),
            "max_rel_diff": rel, "tolerance_rel": TOLERANCE[dtype], "within": rel <= TOLERANCE[dtype],
            "grad_norm_max_rel_diff": max(abs(a - b) / b for a, b in norms),
        })  # fmt: skip


def train_rows(report, device: str, dry: bool, calibration: dict, budget_end: float, batches=None) -> None:
    """Goal 8's rows (module docstring) into `report` (`tpu.Report`), the CPU comparison first (cheap, and what
    says the numbers are of the right computation)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="linnet-train-") as tmp:
        work = Path(tmp)
        cpu_rows(report, device, dry, work)
        speed_rows(
            report, device, dry, calibration, work, list(batches or (("2", "4r") if dry else ("4", "8r"))), budget_end
        )
