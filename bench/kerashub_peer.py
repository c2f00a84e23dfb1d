"""The JAX/XLA rows' peer from issue 5, measured here: writes bench/results/kerashub_peer.json.

The peer: KerasHub on JAX (XLA CPU), `keras_hub.models.CausalLM.from_preset(<local Hugging Face folder>)`, which
KerasHub recognises by the folder's `config.json` (`model_type: llama` -> `utils/transformers/convert_llama3.py`,
a `Llama3CausalLM` on a `Llama3Backbone`, weights ported from `model.safetensors` by its `SafetensorLoader`); no
network, no tokenizer (`preprocessor=None`: the token ids go in directly). f32, greedy (`compile(sampler="greedy")`),
batch 1, 2 threads. The workload is bench/generate_speed.py's: SmolLM2-135M-Instruct from the embedded Q4_1 GGUF
(dequantized, saved as an f32 HF folder by bench/optimum_peer.py's `export`), the same 512 prompt token ids, 128 new
tokens; load timed, warm-ups (XLA compiles on the first call of each shape) timed apart, 3 timed runs, medians.

KerasHub's converter drops the checkpoint's `rms_norm_eps` (1e-5 for SmolLM2): `convert_llama3.convert_backbone_config`
passes no `layer_norm_epsilon`, so the backbone keeps its default, 1e-6. The timed model is KerasHub as it loads
(1e-6; the JSON records both values). After the timed runs, one more 128-token generation runs on a backbone built
with the checkpoint's epsilon (`Backbone.from_preset(dir, layer_norm_epsilon=...)`, which the converter merges into
the backbone config), to tell how much of any token difference the epsilon explains (`eps_check` in the JSON).

Timing. KerasHub's `generate` is one `jax.jit` of the whole generation (prefill, then a `while_loop` of one-token
steps) and yields nothing until it returns, so there are no per-token timestamps. With `preprocessor=None` the
number of new tokens is fixed by the input's length: `token_ids` is [1, max_length] (prompt, then padding, with
`padding_mask` false there) and the loop fills every padded position; the prefill (`_build_cache`) runs over all
max_length positions, padding included, and the first new token comes from one more step on the last prompt token.
- Generation of 128 tokens: max_length 640 (the least that holds 512 + 128, as a user generating 128 tokens sets it),
  `stop_token_ids=None` so EOS does not stop it.
- Time to first token: the same max_length 640 (so the same prefill over 640 positions), stopped after its first
  token by passing `stop_token_ids=(first greedy token,)` (taken from the 128-token warm-up). This is what a user
  generating 128 tokens waits before the first could be had; it is the fair pair for the decode rate.
- Decode tok/s: 127 / (time of the 128-token generation - time of the 1-token generation), per run (the two run
  back to back), median of 3.
- Also recorded, not headlined: one new token at max_length 513 (prefill over 513 positions), the least KerasHub
  can do for one token (`ttft_ms_min_len`).
Each of the three shapes is compiled by its own warm-up (timed apart; `warmup_s` is their sum, the JIT warm-up).

Threads: as bench/generate_speed.py's jax rows, the process is pinned to 2 cores (`sched_setaffinity`) before jax is
imported (XLA's CPU thread pool is as wide as the cores it may use); no XLA_FLAGS. keras-hub depends on
tensorflow-text, so TensorFlow is installed and imported by `import keras_hub` (3.5-5 s here, recorded apart as
`import_s`); it computes nothing here.

Greedy tokens are compared (common prefix length) with Linnet's ONNX backend's f32 tokens (DATA/prep.json, as
optimum_peer.py's) and the bench's transformers eager f32 tokens (bench/results/generate_speed.json, same prompt
sha256). Contention (`generate_speed.timed_runs`) and a calibration (the bench's pure-Python loop and torch f32
matmul at 2 threads, after the timed runs) are recorded. Only stdlib-level helpers are imported from
bench/generate_speed.py and bench/optimum_peer.py, so the prompt and the timing are the bench's own code.

Steps (DATA defaults to ../optdata next to the repo):
- `prepare` (Linnet's venv): DATA/prep.json by optimum_peer.py's `prepare` (the prompt ids, Linnet's ONNX f32
  tokens), if missing. The HF folder DATA/smollm2-hf is optimum_peer.py's `export` (its env: transformers < 5 can
  save the dequantized GGUF; Linnet's transformers 5 refuses to save a GGUF-loaded model).
- `measure` (the KerasHub env): load, warm up, time, compare, write the JSON, print one line.

Setup and run:
    python3.11 -m venv /work/kerasenv && /work/kerasenv/bin/pip install keras-hub==0.32.0 keras==3.15.1 \
        "jax[cpu]==0.10.2" jaxlib==0.10.2 safetensors torch==2.13.0   # torch (CPU) only for the calibration
    .venv/bin/python bench/kerashub_peer.py prepare    # plus optimum_peer.py's export if DATA/smollm2-hf is missing
    /work/kerasenv/bin/python bench/kerashub_peer.py measure
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import generate_speed as gs  # noqa: E402  (stdlib-only at import time)

DATA = ROOT.parent / "optdata"
OUT = ROOT / "bench" / "results" / "kerashub_peer.json"
BENCH = ROOT / "bench" / "results" / "generate_speed.json"
PROMPT_TOKENS = 512
NEW_TOKENS = 128
RUNS = 3
PAD_ID = 0  # any id: padded positions are masked out and overwritten by generated tokens


def version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def prepare(data: Path) -> None:
    """Linnet's venv: optimum_peer.py's prep.json (prompt ids, Linnet's ONNX f32 tokens), if missing."""
    import optimum_peer

    if (data / "prep.json").exists():
        print(f"{data / 'prep.json'} exists; reusing it")
    else:
        optimum_peer.prepare(data)
    hf = data / "smollm2-hf"
    if not (hf / "model.safetensors").exists():
        print(f"{hf} is missing: run `bench/optimum_peer.py export` in the optimum env (see its docstring)")


def prefix_len(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def measure(data: Path, out: Path, quiet_wait: float, prompt_tokens: int, new_tokens: int, eps_check: bool) -> None:
    """The KerasHub env: load, warm up, time, compare, write."""
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[: gs.THREADS])
    os.environ["KERAS_BACKEND"] = "jax"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np

    t0 = time.perf_counter()
    import jax
    import keras
    import keras_hub

    import_s = time.perf_counter() - t0
    assert keras.config.backend() == "jax", keras.config.backend()

    prep = json.loads((data / "prep.json").read_text())
    prompt = prep["prompt"]["ids"][:prompt_tokens]
    hf = data / "smollm2-hf"
    hf_config = json.loads((hf / "config.json").read_text())

    t0 = time.perf_counter()
    model = keras_hub.models.CausalLM.from_preset(str(hf), preprocessor=None)
    model.compile(sampler="greedy")
    load_s = time.perf_counter() - t0
    backbone = model.backbone
    assert backbone.dtype == "float32", backbone.dtype

    def inputs(max_length: int) -> dict:
        n = max_length - len(prompt)
        return {
            "token_ids": np.array([prompt + [PAD_ID] * n], dtype="int32"),
            "padding_mask": np.array([[True] * len(prompt) + [False] * n]),
        }

    full_len, short_len = len(prompt) + new_tokens, len(prompt) + 1
    full_in, short_in = inputs(full_len), inputs(short_len)

    def gen(m, x: dict, stop=None) -> tuple[float, list[int]]:
        start = time.perf_counter()
        o = m.generate(x, stop_token_ids=stop, strip_prompt=False)
        ids = np.asarray(o["token_ids"])  # generate returns numpy: the computation is done
        took = time.perf_counter() - start
        return took, ids[0, len(prompt) :].tolist()

    waited = gs.wait_for_quiet(quiet_wait)
    loadavg_before = os.getloadavg()
    warm_full_s, tokens = gen(model, full_in)
    assert len(tokens) == new_tokens, len(tokens)
    stop = (tokens[0],)
    warm_first_s, first = gen(model, full_in, stop)
    assert first[0] == tokens[0] and first[1:] == [PAD_ID] * (new_tokens - 1), first[:4]
    warm_short_s, short = gen(model, short_in)
    assert short == tokens[:1], (short, tokens[:1])
    warmup_s = warm_full_s + warm_first_s + warm_short_s

    def one() -> tuple[float, float, float, list[int]]:
        t_full, toks = gen(model, full_in)
        t_first, _ = gen(model, full_in, stop)
        t_short, _ = gen(model, short_in)
        return t_full, t_first, t_short, toks

    timed, contention = gs.timed_runs(one, RUNS)
    loadavg_after = os.getloadavg()
    decodes = [(new_tokens - 1) / (t_full - t_first) for t_full, t_first, _, _ in timed]

    eps_info = {
        "checkpoint_rms_norm_eps": hf_config.get("rms_norm_eps"),
        "kerashub_layer_norm_epsilon": backbone.layer_norm_epsilon,
        "converter_kept_rms_norm_eps": abs(backbone.layer_norm_epsilon - hf_config["rms_norm_eps"])
        <= 1e-9 * abs(hf_config["rms_norm_eps"]),
    }
    linnet = prep["linnet_onnx_f32_tokens"]
    bench = json.loads(BENCH.read_text()) if BENCH.exists() else None
    tf_tokens = None
    if bench and bench["prompt"]["sha256_of_ids"] == prep["prompt"]["sha256_of_ids"]:
        row = next((r for r in bench["rows"] if r["name"] == gs.REFERENCE and "tokens" in r), None)
        tf_tokens = row["tokens"] if row else None

    if eps_check:
        t0 = time.perf_counter()
        fixed = keras_hub.models.Backbone.from_preset(str(hf), layer_norm_epsilon=hf_config["rms_norm_eps"])
        fixed_lm = type(model)(backbone=fixed, preprocessor=None)
        fixed_lm.compile(sampler="greedy")
        _, fixed_tokens = gen(fixed_lm, full_in)
        eps_info["checkpoint_eps_run"] = {
            "layer_norm_epsilon": fixed.layer_norm_epsilon,
            "how": "keras_hub.models.Backbone.from_preset(dir, layer_norm_epsilon=<config rms_norm_eps>), "
            f"one untimed {new_tokens}-token generation after the timed runs",
            "s": time.perf_counter() - t0,
            "tokens": fixed_tokens,
            "common_prefix_with_default_eps": prefix_len(fixed_tokens, tokens),
            "linnet_onnx_f32_common_prefix": prefix_len(fixed_tokens, linnet),
            "transformers_eager_f32_common_prefix": prefix_len(fixed_tokens, tf_tokens) if tf_tokens else None,
        }
        del fixed_lm, fixed

    import torch

    torch.set_num_threads(gs.THREADS)
    calibration = {"python_loop_s": gs.calibration_s(), "matmul_f32_tflops": gs.matmul_tflops("f32")}

    result = {
        "benchmark": "kerashub_peer",
        "what": "KerasHub on JAX (XLA CPU): CausalLM.from_preset(<local HF folder>) -> Llama3CausalLM, f32, greedy, "
        "generate on token ids (preprocessor=None), same workload as bench/generate_speed.py",
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "model": f"{gs.EMBEDDED_ID} ({gs.GGUF_NAME}, dequantized, saved as an f32 HF folder by optimum_peer.py export)",
        "prompt_tokens": len(prompt),
        "prompt_sha256_of_ids": prep["prompt"]["sha256_of_ids"] if len(prompt) == PROMPT_TOKENS else None,
        "new_tokens": new_tokens,
        "runs": RUNS,
        "threads": {
            "xla_cpu_threads": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
            "how": "sched_setaffinity to 2 cores before importing jax (as generate_speed.py's jax rows); no XLA_FLAGS",
            "xla_flags": os.environ.get("XLA_FLAGS"),
        },
        "ttft_ms": 1000 * statistics.median(t[1] for t in timed),
        "decode_tok_s": statistics.median(decodes),
        "import_s": import_s,
        "load_s": load_s,
        "warmup_s": warmup_s,
        "warmup_s_each": {
            f"generate_{new_tokens}_len{full_len}": warm_full_s,
            f"generate_1_len{full_len}_stop": warm_first_s,
            f"generate_1_len{short_len}": warm_short_s,
        },
        "generate_ms_all": [1000 * t[0] for t in timed],
        "ttft_ms_all": [1000 * t[1] for t in timed],
        "decode_tok_s_all": decodes,
        "ttft_ms_min_len": 1000 * statistics.median(t[2] for t in timed),
        "ttft_ms_min_len_all": [1000 * t[2] for t in timed],
        "min_len": short_len,
        "timing_method": {
            "generate": f"wall time of model.generate on token_ids [1, {full_len}] ({len(prompt)} prompt + "
            f"{new_tokens} padding), stop_token_ids=None",
            "ttft": f"wall time of model.generate on the same [1, {full_len}] input with stop_token_ids=(first "
            "greedy token,): prefill over all positions (padding included) plus one step",
            "decode": f"({new_tokens} - 1) / (generate time - ttft time), per run (back to back), median",
            "ttft_min_len": f"wall time of model.generate on [1, {short_len}] (1 padded position): the least prefill",
        },
        "tokens_same_every_run": all(t[3] == tokens for t in timed),
        "tokens": tokens,
        "linnet_onnx_f32_common_prefix": prefix_len(tokens, linnet),
        "linnet_onnx_f32_compared": min(len(tokens), len(linnet)),
        "transformers_eager_f32_common_prefix": prefix_len(tokens, tf_tokens) if tf_tokens else None,
        "transformers_eager_f32_from": f"bench/results/generate_speed.json ({bench['date']})" if tf_tokens else None,
        "rms_norm_eps": eps_info,
        "kerashub": {
            "task": type(model).__name__,
            "backbone": type(backbone).__name__,
            "dtype": backbone.dtype,
            "sampler": type(model.sampler).__name__,
            "tie_word_embeddings": backbone.tie_word_embeddings,
            "rope_max_wavelength": backbone.rope_max_wavelength,
            "tensorflow_imported": "tensorflow" in sys.modules,
            "jax_devices": [str(d) for d in jax.devices()],
        },
        "linnet": prep["linnet"],
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
            for name in ("keras-hub", "keras", "jax", "jaxlib", "tensorflow", "tensorflow-text", "numpy", "torch")
        }
        | {"python": sys.version.split()[0]},
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    tf_cmp = (
        f", transformers eager f32's for {result['transformers_eager_f32_common_prefix']}/{len(tokens)}"
        if tf_tokens
        else ""
    )
    print(
        f"KerasHub peer: TTFT {result['ttft_ms']:.0f} ms (len {short_len}: {result['ttft_ms_min_len']:.0f} ms), "
        f"decode {result['decode_tok_s']:.1f} tok/s, load {load_s:.2f} s (+ import {import_s:.1f} s), warm-up "
        f"{warmup_s:.1f} s; eps {backbone.layer_norm_epsilon:g} (checkpoint {hf_config['rms_norm_eps']:g}); greedy "
        f"tokens equal Linnet ONNX f32's for {result['linnet_onnx_f32_common_prefix']}/"
        f"{result['linnet_onnx_f32_compared']}{tf_cmp}; cpu_wait {contention['cpu_wait_pct']:.1f}% -> {out}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=["prepare", "measure"])
    parser.add_argument("--data", type=Path, default=DATA, help="prep.json and the HF folder (outside the repo)")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--quiet-wait", type=float, default=600, help="max seconds to wait for idle cores")
    parser.add_argument("--prompt-tokens", type=int, default=PROMPT_TOKENS, help="development only")
    parser.add_argument("--new-tokens", type=int, default=NEW_TOKENS, help="development only")
    parser.add_argument("--no-eps-check", action="store_true", help="skip the run with the checkpoint's epsilon")
    args = parser.parse_args()
    if args.step == "prepare":
        prepare(args.data)
    else:
        measure(args.data, args.out, args.quiet_wait, args.prompt_tokens, args.new_tokens, not args.no_eps_check)


if __name__ == "__main__":
    main()
