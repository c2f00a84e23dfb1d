"""Training-speed benchmark: writes bench/results/train_speed.json and train_speed.md.

Side by side, in one run on one machine: LoRA SFT, DPO and GRPO on a shrunk Llama (4 layers, hidden 256, a
character tokenizer, two-number multiplication data: tests/runtimes/train/toy_pref.py) and LoRA SFT on
SmolLM2-135M-Instruct (the embedded Q4_1 GGUF dequantized by transformers and saved as a Hugging Face folder, so
both sides train the same f32 weights), for Linnet on PyTorch and on JAX (`linnet.train`, backend `torch` or `jax`;
a backend the registry does not mark `can_train` gives a row marked skipped) and TRL 1.16 + PEFT (SFTTrainer,
DPOTrainer, GRPOTrainer from tests/runtimes/train/trl_reference.py).

- Same start and data on both sides: LoRA r 8, alpha 8, q_proj and v_proj, from one PEFT-initialised adapter
  (PEFT draws A, B = 0) that Linnet loads (`adapter=`) and TRL trains as a `PeftModel`; rows in file order; f32;
  learning rate 1e-3 for every method (TRL's defaults, 2e-5 and 1e-6, barely move a model in a few steps).
- Per configuration (its own process, `--one NAME`, so load time and peak RSS are its own): load, then `--steps`
  optimizer steps; step time is the median over the steps after the first (the first pays for warm-up), tokens/s
  the real (unpadded) tokens of those steps over their time (prompt and completion; GRPO's include generation);
  the losses (and GRPO's mean rewards) of every step are recorded. SFT and DPO start from the same weights and
  see the same batches, so their losses must agree (max |Δloss| is reported); GRPO samples differently on each
  side, so its rewards are compared as means.
- Contention, as bench/generate_speed.py records it (whose helpers this reuses): before each configuration the
  parent waits (at most `--quiet-wait` s) for idle cores, and each row records its CPU seconds per wall second and
  the share of the time some task waited for a CPU (/proc/pressure/cpu).

Goal (issue 19): faster than TRL on each method at the same losses.
Run: `python bench/train_speed.py [--steps N] [--only NAME,...] [--tiny] [--out PATH]`; `--tiny` shrinks every
workload (2 layers, hidden 32, 3 steps, no SmolLM2) to prove the script runs. Timings live here, never in tests.
"""

from __future__ import annotations

import argparse
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

LLAMA = ROOT / "examples" / "llama.linnet"
LEARNING_RATE = 1e-3
CHILD_TIMEOUT_S = 3600
REWARD = "tests.runtimes.train.toy_pref:product_digits_reward"

# workload -> method, model, rows per micro-batch (GRPO: prompts, each sampled `num_generations` times), rows
WORKLOADS = {
    "sft-shrunk": dict(method="sft", model="shrunk", batch=8, rows=64),
    "dpo-shrunk": dict(method="dpo", model="shrunk", batch=4, rows=32),
    "grpo-shrunk": dict(method="grpo", model="shrunk", batch=1, rows=16, num_generations=8, max_completion_length=16),
    "sft-smollm2": dict(method="sft", model="smollm2", batch=4, rows=32),
}
SIDES = ("linnet-torch", "linnet-jax", "trl")
CONFIGS = [f"{w}/{s}" for w in WORKLOADS for s in SIDES]
# --shape: the generated model of the `*-shrunk` workloads (LlamaConfig fields over tests' tiny config)
SHAPES = {
    "tiny": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2),
    "shrunk": dict(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=8,
                   num_key_value_heads=4),
    # Llama 3.1 8B's shape (meta-llama/Llama-3.1-8B config.json), random weights at Llama's initializer_range
    "llama3-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=8, vocab_size=128256, rope_theta=500000.0, rms_norm_eps=1e-5,
                      max_position_embeddings=2048, initializer_range=0.02),
}  # fmt: skip
THINGS = ["a kettle", "the moon", "a violin", "a bicycle", "an oak tree", "a lighthouse", "a teapot", "a glacier"]


# ---- the work folder (parent) -------------------------------------------------------------------------------------


def prepare(work: Path, shape: str, workloads: list[str], device: str, tiny: bool) -> None:
    """Models (the `*-shrunk` one of `shape`, made on `device` and saved in bf16 when it is 8B-sized), initial
    adapters and data files of `workloads` into `work`."""
    from tests.runtimes.train import toy_pref
    from tests.runtimes.train.trl_reference import peft_model

    models = {WORKLOADS[w]["model"] for w in workloads}
    if "shrunk" in models:
        save_shrunk(work / "shrunk", shape, device)
    if "smollm2" in models:
        save_smollm2(work / "smollm2")
    for m in models:
        peft_model(work / m).save_pretrained(work / f"{m}-adapter")
    for w in workloads:
        spec = WORKLOADS[w]
        n = 8 if tiny else spec["rows"]
        if spec["model"] == "smollm2":
            rows = [
                {"prompt": [{"role": "user", "content": f"Describe {t} in the Linnet style."}],
                 "completion": [{"role": "assistant", "content": f"LINNET: {t} -- noted, filed, done."}]}
                for t in (THINGS * 8)[:n]
            ]  # fmt: skip
        elif spec["method"] == "sft":
            rows = [{"prompt": r["prompt"], "completion": r["chosen"]} for r in toy_pref.multiplication_preferences(n)]
        elif spec["method"] == "dpo":
            rows = toy_pref.multiplication_preferences(n)
        else:
            rows = toy_pref.multiplication_prompts(n)
        (work / f"{w}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def save_shrunk(folder: Path, shape: str, device: str) -> None:
    """The shrunk model of `shape` (random, seed 0) and the char tokenizer. The 8B shape is initialised on
    `device` and saved in bf16 (16 GB rather than 32; both sides load it in f32)."""
    from tests.runtimes.train import toy_pref

    if shape != "llama3-8b":
        toy_pref.save_tiny_llama(folder, **SHAPES[shape])
        return
    import torch
    from transformers import LlamaForCausalLM

    from tests.runtimes.train.conftest import tiny_llama_config

    config = tiny_llama_config()
    for key, value in SHAPES[shape].items():
        setattr(config, key, value)
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(folder)
    del model
    toy_pref.save_char_tokenizer(folder)


def save_smollm2(folder: Path) -> None:
    """The embedded SmolLM2-135M-Instruct GGUF, dequantized to f32 by transformers, as a Hugging Face folder."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(gs.gguf_dir(), gguf_file=gs.GGUF_NAME, dtype=torch.float32)
    # save_pretrained refuses a model loaded from a GGUF ("quantized with gguf and is not serializable"); its
    # dequantized f32 weights and config are written as a folder's files instead (the tied head stored once).
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:  # stored once, as transformers writes a tied model
        del tensors["lm_head.weight"]
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    config = model.config
    del config.quantization_config  # the folder holds f32 weights, not the GGUF's
    config.__dict__.pop("_model_name_or_path", None)  # the GGUF's general.name, which transformers' reader keeps
    config.architectures = [type(model).__name__]
    config.save_pretrained(folder)
    AutoTokenizer.from_pretrained(gs.gguf_dir(), gguf_file=gs.GGUF_NAME).save_pretrained(folder)


# ---- one configuration (child process) ----------------------------------------------------------------------------


def run_linnet(work: Path, workload: str, backend: str, steps: int, batch: int, device: str, bf16: bool) -> dict:
    import linnet
    from linnet.runtimes.backends import get_backend

    if not get_backend(backend).can_train:
        return {"skipped": f"backend {backend} does not train yet (the registry's can_train)"}
    spec = WORKLOADS[workload]
    if get_backend(backend).family == "jax":
        from linnet.runtimes.train.jax_trainer import JAX_LOSSES

        if spec["method"] not in JAX_LOSSES:
            return {"skipped": f"{spec['method']} does not train on JAX (JAX trains {', '.join(JAX_LOSSES)})"}
    options = {}
    if spec["method"] == "grpo":
        options = dict(reward=REWARD, num_generations=spec["num_generations"],
                       max_completion_length=spec["max_completion_length"])  # fmt: skip
    t0 = time.perf_counter()
    result = linnet.train(
        LLAMA, work / spec["model"], data=work / f"{workload}.jsonl", method=spec["method"], backend=backend,
        adapter=work / f"{spec['model']}-adapter", shuffle=False, progress=False, max_steps=steps,
        per_device_train_batch_size=batch, learning_rate=LEARNING_RATE, method_options=options, device=device,
        bf16=bf16,
    )  # fmt: skip
    total_s = time.perf_counter() - t0
    history = result.history
    return {
        "total_s": total_s,
        "step_s": [h["elapsed_s"] for h in history],
        "tokens": [h["num_tokens"] for h in history],
        "losses": [h["loss"] for h in history],
        "rewards": [h["reward"] for h in history] if spec["method"] == "grpo" else None,
    }


def run_trl(work: Path, workload: str, steps: int, batch: int, device: str, bf16: bool) -> dict:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, TrainerCallback

    from tests.runtimes.train import toy_pref, trl_reference

    spec = WORKLOADS[workload]
    folder = work / spec["model"]
    rows = [json.loads(line) for line in (work / f"{workload}.jsonl").read_text().splitlines()]
    t0 = time.perf_counter()
    base = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).to(device)
    model = PeftModel.from_pretrained(base, work / f"{spec['model']}-adapter", is_trainable=True)
    out = Path(tempfile.mkdtemp(prefix="trl-"))
    on_device = dict(use_cpu=device == "cpu", bf16=bf16)
    if spec["method"] == "grpo":
        g = spec["num_generations"]
        trainer = trl_reference.grpo_trainer(
            folder, rows, [toy_pref.product_digits_reward], out, steps, num_generations=g,
            max_completion_length=spec["max_completion_length"], lora=model, learning_rate=LEARNING_RATE,
            per_device_train_batch_size=batch * g, **on_device,
        )  # fmt: skip
    else:
        make = trl_reference.sft_trainer if spec["method"] == "sft" else trl_reference.dpo_trainer
        trainer = make(folder, rows, out, steps, batch, lora=model, learning_rate=LEARNING_RATE, **on_device)

    class StepTimes(TrainerCallback):
        def __init__(self):
            self.starts, self.times = [], []

        def on_step_begin(self, args, state, control, **kwargs):
            self.starts.append(time.perf_counter())

        def on_step_end(self, args, state, control, **kwargs):
            self.times.append(time.perf_counter() - self.starts[-1])

    timer = StepTimes()
    trainer.add_callback(timer)
    trainer.train()
    total_s = time.perf_counter() - t0
    logs = [row for row in trainer.state.log_history if "loss" in row]
    cumulative = [row["num_tokens"] for row in logs]
    return {
        "total_s": total_s,
        "step_s": timer.times,
        "tokens": [b - a for a, b in zip([0.0, *cumulative[:-1]], cumulative)],
        "losses": [row["loss"] for row in logs],
        "rewards": [row["reward"] for row in logs] if spec["method"] == "grpo" else None,
    }


def run_one(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(gs.THREADS)
    workload, side = args.one.split("/")
    batch = WORKLOADS[workload]["batch"]
    work = Path(args.work)
    if side == "trl":

        def run() -> dict:
            return run_trl(work, workload, args.steps, batch, args.device, args.bf16)
    else:

        def run() -> dict:
            return run_linnet(work, workload, side.removeprefix("linnet-"), args.steps, batch, args.device, args.bf16)

    (row,), contention = gs.timed_runs(run, 1)
    if "skipped" not in row:
        later = slice(1, None) if len(row["step_s"]) > 1 else slice(None)
        row["step_s_median"] = statistics.median(row["step_s"][later])
        row["tokens_per_s"] = sum(row["tokens"][later]) / sum(row["step_s"][later])
    row.update(contention, peak_rss_mb=gs.peak_rss_mb(), name=args.one, workload=workload, side=side)
    print("RESULT " + json.dumps(row), flush=True)


# ---- the run (parent) ---------------------------------------------------------------------------------------------


def run_child(name: str, args: argparse.Namespace, work: Path) -> dict:
    cmd = [sys.executable, __file__, "--one", name, "--work", str(work), "--steps", str(args.steps)]
    cmd += ["--device", args.device] + (["--bf16"] if args.bf16 else [])
    env = dict(os.environ, OMP_NUM_THREADS=str(gs.THREADS), TOKENIZERS_PARALLELISM="false", TQDM_DISABLE="1")
    waited = gs.wait_for_quiet(args.quiet_wait)
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    wall = time.perf_counter() - start
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-25:])
        print(f"  {name}: FAILED (rc {proc.returncode}) after {wall:.0f} s\n{tail}", file=sys.stderr, flush=True)
        return {"name": name, "error": tail, "process_wall_s": wall}
    row = json.loads(lines[-1][len("RESULT ") :])
    row.update(process_wall_s=wall, waited_for_quiet_s=waited)
    if "skipped" in row:
        print(f"  {name}: skipped ({row['skipped']})", file=sys.stderr, flush=True)
    else:
        print(f"  {name}: step {row['step_s_median'] * 1000:.0f} ms, {row['tokens_per_s']:.0f} tok/s, loss "
              f"{row['losses'][0]:.4f} -> {row['losses'][-1]:.4f}, CPU wait {row['cpu_wait_pct'] or 0:.0f} %",
              file=sys.stderr, flush=True)  # fmt: skip
    return row


def compare(rows: list[dict]) -> list[dict]:
    """Per workload and Linnet backend: speed-up over TRL (its median step time / ours) and the loss distance."""
    by_name = {r["name"]: r for r in rows}
    out = []
    for w in WORKLOADS:
        trl = by_name.get(f"{w}/trl")
        for side in ("linnet-torch", "linnet-jax"):
            ours = by_name.get(f"{w}/{side}")
            if not trl or not ours or "step_s_median" not in trl or "step_s_median" not in ours:
                continue
            entry = {"workload": w, "side": side, "speedup_vs_trl": trl["step_s_median"] / ours["step_s_median"]}
            n = min(len(trl["losses"]), len(ours["losses"]))
            if not ours.get("rewards"):  # GRPO's losses are of different samples: its rewards are compared instead
                entry["max_abs_loss_diff"] = max(abs(a - b) for a, b in zip(trl["losses"][:n], ours["losses"][:n]))
            else:
                entry["mean_reward"] = {
                    "linnet": statistics.mean(ours["rewards"]),
                    "trl": statistics.mean(trl["rewards"]),
                }
            out.append(entry)
    return out


def markdown(result: dict) -> str:
    lines = [
        "# Training speed (bench/train_speed.py)",
        "",
        f"{result['machine']['processor']}, {gs.THREADS} threads, device {result['device']}; shrunk model "
        f"{result['shape']['name']}; {result['steps']} steps; {'bf16 autocast' if result['bf16'] else 'f32'}; LoRA "
        f"r 8 (q_proj, v_proj); learning rate {LEARNING_RATE}. Step time: median over the steps after the first.",
        "",
        "| configuration | step (ms) | tokens/s | first loss | last loss | CPU wait |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        if "step_s_median" not in r:
            lines.append(f"| {r['name']} | {r.get('skipped') or 'failed'} | | | | |")
            continue
        lines.append(
            f"| {r['name']} | {r['step_s_median'] * 1000:.0f} | {r['tokens_per_s']:.0f} | {r['losses'][0]:.4f} | "
            f"{r['losses'][-1]:.4f} | {r.get('cpu_wait_pct') or 0:.0f} % |"
        )
    lines += ["", "| workload | Linnet | speed-up vs TRL | max abs loss diff / mean rewards |", "|---|---|---:|---:|"]
    for c in result["comparison"]:
        if "mean_reward" in c:
            same = f"reward {c['mean_reward']['linnet']:.3f} (TRL {c['mean_reward']['trl']:.3f})"
        else:
            same = f"{c['max_abs_loss_diff']:.2e}"
        lines.append(f"| {c['workload']} | {c['side']} | {c['speedup_vs_trl']:.2f}x | {same} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--one", help=argparse.SUPPRESS)
    p.add_argument("--work", help=argparse.SUPPRESS)
    p.add_argument("--steps", type=int, default=10, help="optimizer steps per configuration (10)")
    p.add_argument("--only", help="comma-separated configurations (workload/side) or workloads")
    p.add_argument("--tiny", action="store_true", help="--shape tiny, 3 steps, no SmolLM2: prove it runs")
    p.add_argument("--shape", choices=SHAPES, default="shrunk", help="the *-shrunk workloads' model (shrunk)")
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda (bench/gpu_train.sh)")
    p.add_argument("--bf16", action="store_true", help="bf16 autocast over f32 weights on both sides")
    p.add_argument("--quiet-wait", type=float, default=60.0, help="seconds to wait for idle cores before each")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "train_speed"), help="output path stem")
    args = p.parse_args()
    if args.one:
        run_one(args)
        return
    names = CONFIGS
    if args.only:
        wanted = args.only.split(",")
        names = [n for n in CONFIGS if n in wanted or n.split("/")[0] in wanted]
    if args.tiny:
        names = [n for n in names if not n.startswith("sft-smollm2")]
        args.steps, args.shape = min(args.steps, 3), "tiny"
    workloads = list(dict.fromkeys(n.split("/")[0] for n in names))
    with tempfile.TemporaryDirectory(prefix="train-speed-") as tmp:
        work = Path(tmp)
        prepare(work, args.shape, workloads, args.device, args.tiny)
        calibration_before = gs.calibration()
        rows = [run_child(name, args, work) for name in names]
        calibration_after = gs.calibration()
    result = {
        "benchmark": "train_speed",
        "steps": args.steps,
        "tiny": args.tiny,
        "shape": {"name": args.shape, **SHAPES[args.shape]},
        "device": args.device,
        "bf16": args.bf16,
        "learning_rate": LEARNING_RATE,
        "machine": gs.machine(),
        "versions": {**gs.versions(), "trl": __import__("trl").__version__, "peft": __import__("peft").__version__},
        "calibration": {"before": calibration_before, "after": calibration_after},
        "rows": rows,
        "comparison": compare(rows),
    }
    gs.write_results(result, args.out, markdown)


if __name__ == "__main__":
    main()
