"""Issue 41 goal 6: Linnet against KerasHub on the same TPU chip, in one process (one program may hold the chip).

    python bench/tpu.py --only peer --out DIR            on the TPU machine (bench/tpu.sh installs .whl-peer too)
    python bench/tpu.py --only peer --out DIR --dry-run  the same path on the CPU at tiny sizes

For each shape (TinyLlama-1.1B, then SmolLM2-135M; the dry run: bench/tpu.py's 2-layer TINY), one Hugging Face folder
is made (`config.json` + `model.safetensors`, bf16): the preset of examples/llama.linnet with bench/tpu.py's seeded
random weights (`fast_random_params`, seed 0), written by Linnet's `export_hf`. Both sides load that folder:

- KerasHub 0.32 on the JAX backend: `keras_hub.models.Backbone.from_preset(folder, dtype="bfloat16",
  layer_norm_epsilon=<config.json's rms_norm_eps>)` (KerasHub's converter drops the checkpoint's epsilon and keeps
  its default 1e-6; passing it makes the two models the same function, at no cost in speed), then
  `Llama3CausalLM(backbone, preprocessor=None)` compiled with `sampler="greedy"`. Its `generate` is one `jax.jit`
  of the whole generation (prefill over every position of `token_ids`, padding included, then a `while_loop` of
  one-token steps), timed as bench/kerashub_peer.py times it: the generation of N tokens at max_length P + N; the
  first token alone at the same max_length (stopped by `stop_token_ids=(first greedy token,)`), the TTFT; decode
  tok/s = (N - 1) / (the first - the second), per run. Also the first token at max_length P + 1, the least prefill
  KerasHub can do (`kerashub_ttft_min_len_ms`). Each of the three programs is compiled by a warm-up timed apart.
- Linnet: `linnet.load(examples/llama.linnet, folder, backend="xla", device="tpu", dtype="bf16")` and its
  `Generator` (as `linnet generate`), decode steps many per dispatch on the device (`decode_loop=True`, the TPU's
  default); the prompt's compiles by `warm_up`, timed apart; TTFT is `prefill_s`, decode tok/s its
  `decode_tokens_per_s` ((N - 1) steps over their time).

Both: batch 1, bf16, greedy, a P = 512-token prompt of seeded random ids, N = 128 new tokens, one untimed run after
the warm-ups, then the median of 3 runs. Compared: the greedy tokens (common prefix; bf16 on both sides rounds
differently, so some divergence is expected) and the last prompt token's logits (max |d|, argmax), each side also
against the CPU reference: Linnet in f32 on the host's CPU from the same folder (the prompt's last logits and 16
greedy tokens). Rows: `peer` (speed, the ratios Linnet / KerasHub) and `peer distance`.

One process holds both: Linnet runs its i64 code under a scoped `jax.enable_x64` (docs/backends.md), so the
process-wide flag KerasHub needs off (its `dynamic_slice` fails on int64 with int32 indices) stays off; the
flag is still set off explicitly for KerasHub's part, in case the caller turned it on.

Device time (estimated from the CPU runs, not yet measured on the chip): about 3.5-4 minutes for TinyLlama (the
folder ~15 s, the CPU reference ~30 s, KerasHub's load ~30 s and its four compiles, Linnet's load and compiles ~25 s
cold) and 2-2.5 for SmolLM2-135M, mostly compiles; with the install and calibration about 7 minutes in all, under
bench/tpu.sh's 520 s limit. A shape starts only before `--budget-s`: `bash bench/tpu.sh --only peer --budget-s 120`
keeps the call to TinyLlama.

Wheels (carried as `.whl-peer`, installed by bench/tpu.sh after `.whl-tpu`; the device's index has keras but not
keras-hub): keras-hub 0.32.0 declares tensorflow-text, but `import keras_hub` and its Llama path need neither it nor
TensorFlow (only its Gemma 3 converter imports sentencepiece at import time): bench/tpu.sh's header lists them.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

SHAPES = ("tinyllama-1.1b", "smollm2-135m")
RUNS = 3
PAD_ID = 0  # KerasHub's padded positions: masked out, then overwritten by the generated tokens
REFERENCE_TOKENS = 16  # the CPU reference's greedy tokens (f32 decode of a 1.1B model on the host's CPU is slow)


def prefix_len(a: list[int], b: list[int]) -> int:
    """How many leading tokens `a` and `b` share."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def make_folder(shape: str, dry: bool, folder: Path) -> dict:
    """Write `shape`'s preset with seeded random bf16 weights as a Hugging Face folder; returns its config.json."""
    from tpu import LLAMA, TINY
    from tpu import SHAPES as PRESETS

    import linnet
    from linnet.runtimes.export.hf import export_hf

    # `jax` on the host's CPU: `xla` would trace its entries at load, which the export does not need
    preset, config = (None, TINY) if dry else (PRESETS[shape], None)
    model = linnet.load(
        LLAMA, backend="jax", preset=preset, config=config, random_weights=True, seed=0, device="cpu", dtype="bf16",
        progress=False,
    )  # fmt: skip
    export_hf(model, folder, dtype="bf16")
    return json.loads((folder / "config.json").read_text())


def kerashub_side(folder: Path, config: dict, ids: np.ndarray, new: int) -> dict:
    """KerasHub on the default JAX device: load, warm up, time, the prompt's last logits (see the module docstring).
    Raises ImportError without keras-hub; what KerasHub raises otherwise."""
    os.environ.setdefault("KERAS_BACKEND", "jax")
    import jax

    jax.config.update("jax_enable_x64", False)  # x64 on breaks KerasHub's int32 slicing (Linnet's is scoped)
    t = time.perf_counter()
    import keras
    import keras_hub

    import_s = time.perf_counter() - t
    if keras.config.backend() != "jax":
        raise RuntimeError(f"keras runs on {keras.config.backend()}, not jax (KERAS_BACKEND was set before)")
    t = time.perf_counter()
    backbone = keras_hub.models.Backbone.from_preset(
        str(folder), dtype="bfloat16", layer_norm_epsilon=config["rms_norm_eps"]
    )
    lm = keras_hub.models.Llama3CausalLM(backbone=backbone, preprocessor=None)
    lm.compile(sampler="greedy")
    load_s = time.perf_counter() - t
    prompt = ids.tolist()

    def inputs(max_length: int) -> dict:
        n = max_length - len(prompt)
        return {
            "token_ids": np.array([prompt + [PAD_ID] * n], np.int32),
            "padding_mask": np.array([[True] * len(prompt) + [False] * n]),
        }

    full, short = inputs(len(prompt) + new), inputs(len(prompt) + 1)

    def gen(x: dict, stop=None) -> tuple[float, list[int]]:
        start = time.perf_counter()
        out = lm.generate(x, stop_token_ids=stop, strip_prompt=False)
        ids_out = np.asarray(out["token_ids"])  # numpy: the computation is done
        return time.perf_counter() - start, ids_out[0, len(prompt) :].tolist()

    warm = {}
    warm["generate"], tokens = gen(full)
    stop = (tokens[0],)
    warm["first_token"], _ = gen(full, stop)
    warm["first_token_min_len"], _ = gen(short)
    gen(full), gen(full, stop), gen(short)  # one untimed run, as Linnet's side has
    runs = []
    for _ in range(RUNS):
        t_full, toks = gen(full)
        t_first, _ = gen(full, stop)
        t_short, _ = gen(short)
        runs.append((t_full, t_first, t_short, toks))
    logits = lm.predict_on_batch(
        {"token_ids": np.array([prompt], np.int32), "padding_mask": np.ones((1, len(prompt)), bool)}
    )
    result = {
        "import_s": import_s,
        "load_s": load_s,
        "compile_s": sum(warm.values()),
        "ttft_ms": 1e3 * statistics.median(r[1] for r in runs),
        "ttft_min_len_ms": 1e3 * statistics.median(r[2] for r in runs),
        # (at the dry run's tiny sizes the difference can be noise below zero)
        "decode_tok_s": statistics.median((new - 1) / (r[0] - r[1]) if r[0] > r[1] else float("nan") for r in runs),
        "generate_ms": 1e3 * statistics.median(r[0] for r in runs),
        "tokens": tokens,
        "tokens_same_every_run": all(r[3] == tokens for r in runs),
        "logits": np.asarray(logits[0, -1], np.float32),
        "layer_norm_epsilon": backbone.layer_norm_epsilon,
        "versions": {"keras": keras.__version__, "keras_hub": keras_hub.__version__},
    }
    keras.backend.clear_session()  # (the model's arrays go with this frame)
    return result


def linnet_side(folder: Path, device: str, ids: np.ndarray, new: int) -> dict:
    """Linnet `xla` on `device` in bf16 from the folder: load, warm up, time, the prompt's last logits."""
    from tpu import LLAMA

    import linnet
    from linnet.runtimes.generation import Generator
    from linnet.runtimes.sampling import SamplingParams

    t = time.perf_counter()
    model = linnet.load(
        LLAMA, str(folder), backend="xla", device=device, dtype="bf16", max_positions=len(ids) + new, progress=False
    )
    load_s = time.perf_counter() - t
    step_model = model.step_model(decode_loop=True)
    generator = Generator(step_model, None)
    t = time.perf_counter()
    generator.warm_up(len(ids))
    compile_s = time.perf_counter() - t
    params = SamplingParams(max_new_tokens=new)
    generator.generate(ids.tolist(), params)  # one untimed run: XLA's first executions set up
    runs = []
    for _ in range(RUNS):
        t = time.perf_counter()
        result = generator.generate(ids.tolist(), params)
        runs.append((time.perf_counter() - t, result))
    tokens = runs[0][1].token_ids
    logits = step_model.step(ids[None, :], np.zeros(1, np.int64), np.zeros(1, np.int64))[0]
    out = {
        "load_s": load_s,
        "compile_s": compile_s,
        "ttft_ms": 1e3 * statistics.median(r.prefill_s for _, r in runs),
        "decode_tok_s": statistics.median(r.decode_tokens_per_s for _, r in runs),
        "generate_ms": 1e3 * statistics.median(wall for wall, _ in runs),
        "tokens": tokens,
        "tokens_same_every_run": all(r.token_ids == tokens for _, r in runs),
        "logits": np.asarray(logits, np.float32),
        "weight_bytes": sum(a.nbytes for a in model.params.values()),
        "params": sum(int(np.prod(a.shape)) for a in model.params.values()),
    }
    del model, step_model, generator
    gc.collect()
    return out


def cpu_reference(folder: Path, ids: np.ndarray) -> dict:
    """Linnet in f32 on the host's CPU from the folder: the prompt's last logits and its first greedy tokens."""
    from tpu import LLAMA, last_logits

    import linnet
    from linnet.runtimes.generation import Generator
    from linnet.runtimes.sampling import SamplingParams

    model = linnet.load(
        LLAMA, str(folder), backend="xla", device="cpu", dtype="f32", max_positions=len(ids) + 32, progress=False
    )
    logits = last_logits(model, ids)
    tokens = Generator(model.step_model(decode_loop=False), None).generate(
        ids.tolist(), SamplingParams(max_new_tokens=REFERENCE_TOKENS)
    )
    del model
    gc.collect()
    return {"logits": logits, "tokens": tokens.token_ids}


class Phases:
    """Prints each phase's seconds as it ends (a call cut short by its time limit still says where the time went)."""

    def __init__(self, shape: str):
        self.shape, self.start = shape, time.perf_counter()

    def done(self, phase: str) -> float:
        took, self.start = time.perf_counter() - self.start, time.perf_counter()
        print(f"peer {self.shape}: {phase} {took:.1f} s", flush=True)
        return took


def peer_rows(
    report, device: str, dry: bool, calibration: dict, budget_end: float, shapes: tuple[str, ...] = SHAPES
) -> None:
    """Issue 41 goal 6's rows (see the module docstring) into `report`, sections `peer` and `peer distance`, for
    `shapes` (of SHAPES); a shape is skipped once `budget_end` (time.monotonic()) has passed, and a side that fails
    reports its error."""
    prompt, new = (64, 16) if dry else (512, 128)
    for shape in ("tiny",) if dry else shapes:
        if time.monotonic() > budget_end:
            report.add("peer", {"shape": shape, "skipped": "time budget spent"})
            continue
        folder = Path(tempfile.mkdtemp(prefix="linnet-peer-")) / "hf"
        phases = Phases(shape)
        try:
            config = make_folder(shape, dry, folder)
            folder_s = phases.done("folder")
            ids = np.random.default_rng(2).integers(0, config["vocab_size"], prompt).astype(np.int64)
            reference = cpu_reference(folder, ids)
            phases.done("cpu reference")
            try:
                keras_side = kerashub_side(folder, config, ids, new)
            except Exception as err:  # the Linnet side still runs, and the row says why this one did not
                carry = " (carry .whl-peer: bench/tpu.sh's header lists its wheels)"
                hint = carry if isinstance(err, ImportError) else ""
                keras_side = {"error": f"{type(err).__name__}: {err}{hint}"}
            gc.collect()  # KerasHub's model off the chip before Linnet's comes on
            phases.done("kerashub")
            ours = linnet_side(folder, device, ids, new)
            phases.done("linnet")
        finally:
            shutil.rmtree(folder.parent, ignore_errors=True)
        report.add("peer", speed_row(shape, prompt, new, folder_s, ours, keras_side, calibration))
        report.add("peer distance", distance_row(shape, ours, keras_side, reference))
        report.data.setdefault("peer_tokens", {})[shape] = {
            "linnet": ours["tokens"],
            "kerashub": keras_side.get("tokens"),
            "cpu_f32": reference["tokens"],
        }
        report.write()


def side_fields(side: str, result: dict, stream_ms: float) -> dict:
    """One side's speed columns, named `<side>_...`: TTFT, decode tok/s (and of the weight-streaming limit, a
    step's weights read at the calibration's GB/s), whole generation, load and compile."""
    fields = {
        "ttft_ms": round(result["ttft_ms"], 1),
        "decode_tok_s": round(result["decode_tok_s"], 1),
        "of_weights_limit": f"{stream_ms * result['decode_tok_s'] / 1e3:.0%}",
        "generate_ms": round(result["generate_ms"], 1),
        "load_s": round(result["load_s"], 1),
        "compile_s": round(result["compile_s"], 1),
    }
    return {f"{side}_{k}": v for k, v in fields.items()}


def speed_row(shape: str, prompt: int, new: int, folder_s: float, ours: dict, peer: dict, calibration: dict) -> dict:
    """The `peer` row: both sides' TTFT, decode rate and compile time, and Linnet / KerasHub."""
    stream_ms = ours["weight_bytes"] / (calibration["stream_bf16_gbps"] * 1e9) * 1e3
    row = {
        "shape": shape,
        "prompt+new": f"{prompt}+{new}",
        "params_m": round(ours["params"] / 1e6, 1),
        "folder_s": round(folder_s, 1),
        "compiles": "cold for both (bench/tpu.py's persistent cache starts empty; KerasHub's jits use it too)",
    } | side_fields("linnet", ours, stream_ms)
    if "error" in peer:
        return row | {"kerashub_error": peer["error"]}
    return (
        row
        | side_fields("kerashub", peer, stream_ms)
        | {
            "kerashub_ttft_min_len_ms": round(peer["ttft_min_len_ms"], 1),
            "decode_linnet_over_kerashub": round(ours["decode_tok_s"] / peer["decode_tok_s"], 2),
            "ttft_linnet_over_kerashub": round(ours["ttft_ms"] / peer["ttft_ms"], 2),
            "ttft_linnet_over_kerashub_min_len": round(ours["ttft_ms"] / peer["ttft_min_len_ms"], 2),
            "kerashub": f"keras-hub {peer['versions']['keras_hub']}, keras {peer['versions']['keras']}",
        }
    )


def distance_row(shape: str, ours: dict, peer: dict, reference: dict) -> dict:
    """The `peer distance` row: greedy tokens (common prefix) and the prompt's last logits of each side, against
    each other and against the CPU's f32."""
    ref_logits, ref_tokens = reference["logits"], reference["tokens"]
    row = {
        "shape": shape,
        "linnet_vs_cpu_f32_max_abs_diff": float(np.max(np.abs(ours["logits"] - ref_logits))),
        "linnet_argmax_same_as_cpu": bool(np.argmax(ours["logits"]) == np.argmax(ref_logits)),
        "linnet_cpu_f32_common_prefix": f"{prefix_len(ours['tokens'], ref_tokens)}/{len(ref_tokens)}",
        "linnet_tokens_same_every_run": ours["tokens_same_every_run"],
    }
    if "error" in peer:
        return row
    return row | {
        "kerashub_vs_cpu_f32_max_abs_diff": float(np.max(np.abs(peer["logits"] - ref_logits))),
        "kerashub_argmax_same_as_cpu": bool(np.argmax(peer["logits"]) == np.argmax(ref_logits)),
        "kerashub_cpu_f32_common_prefix": f"{prefix_len(peer['tokens'], ref_tokens)}/{len(ref_tokens)}",
        "kerashub_tokens_same_every_run": peer["tokens_same_every_run"],
        "linnet_vs_kerashub_max_abs_diff": float(np.max(np.abs(ours["logits"] - peer["logits"]))),
        "linnet_kerashub_common_prefix": f"{prefix_len(ours['tokens'], peer['tokens'])}/{len(ours['tokens'])}",
        "kerashub_layer_norm_epsilon": peer["layer_norm_epsilon"],
    }
