"""Issue 41's rows on one TPU chip, in one process (one program may hold the chip; opening it costs ~15 s).

    python bench/tpu.py --out DIR            on a machine whose JAX has a TPU (bench/tpu.sh installs and runs it)
    python bench/tpu.py --out DIR --dry-run  the same path on the CPU at tiny sizes: proves it runs end to end

Rows, each written to DIR/tpu_<date>.json and .md as it completes (a call cut short keeps what it measured):

- calibration: a bf16 8192^3 matmul (TFLOP/s), a bf16 matrix-vector product streaming a 2.15 GB matrix (GB/s, the
  weight-streaming limit of decode), a 512 MB host-to-device copy (GB/s);
- numerics (SmolLM2-135M's shape, `xla`): f32 and bf16 under `equivalent` and `fast`, the last-token logits of a
  64-token prompt against the CPU's f32 `equivalent` (the same weights, JAX on the host's CPU; max |d|) and greedy
  tokens agreeing over 32 new tokens;
- decode and prefill (bf16, `xla`, batch 1, a 512-token prompt of seeded random ids, 256 greedy new tokens) for the
  SmolLM2-135M, TinyLlama-1.1B and SmolLM2-1.7B shapes: compile (cold), TTFT against the FLOP bound (2 x params x
  512 at the measured TFLOP/s), decode tok/s against the streaming limit (the weights, and the weights plus the KV
  cache a step reads, at the measured GB/s), with the per-token host loop and the on-device decode loop
  (`jax_loop`) side by side; the distance from the CPU reference and greedy agreement per shape;
- q8 (only when asked: `--only q8`, `--q8-shapes`): goal 5's 8B class from a Q8_0 GGUF (bench/tpu_q8.py says what);
- compile (`--only compile`, not run by default: bench/tpu_compile.py): the 1.1B shape's load and warm-up compiles,
  cold and from the persistent cache, with its 22 layers unrolled and scanned.
- train (only when asked: `--only train`, `--train-batches`): goal 8's LoRA SFT on the 1.1B shape, tokens/s and MFU,
  and the losses against the CPU's (bench/tpu_train.py says what).
- offload (only when asked: `--only offload`, `--offload-gib`): goal 5's Llama-3.1-8B shape in bf16 with its last
  layers in host memory, streamed to the chip each step (bench/tpu_offload.py says what).

Weights: each model's preset (examples/llama.linnet) with seeded random weights (`random_weights`: biases 0, norm
scales 1, the rest N(0, 0.02)). The loader's own `random_params` draws them one tensor after another in f64, which
takes a minute for 1.7B parameters; the bench swaps in the same distribution drawn in f32 by a thread pool, one
seeded stream per tensor (`fast_random_params`), so the TPU and the CPU reference get the same weights.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
LLAMA = ROOT / "examples" / "llama.linnet"
SHAPES = {"smollm2-135m": "smollm2_135m", "tinyllama-1.1b": "tinyllama_1_1b", "smollm2-1.7b": "smollm2_1_7b_instruct"}
TINY = {  # --dry-run: a 2-layer Llama
    "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2,
}  # fmt: skip


def fast_random_params(program, seed: int = 0) -> dict[str, np.ndarray]:
    """`linnet.runtimes.loading.random_params`' distribution (biases 0, other 1-d parameters 1, the rest N(0, 0.02)),
    drawn in f32 from one PCG64 stream per tensor (seeded `[seed, index]`) on a thread pool, cast to the working
    dtype."""
    from linnet.runtimes.formats.checkpoints import numpy_dtype

    dtype = numpy_dtype(program.dtype.name)

    def draw(item):
        index, spec = item
        if spec.path.endswith("bias"):
            return spec.path, np.zeros(spec.shape, dtype)
        if len(spec.shape) == 1:
            return spec.path, np.ones(spec.shape, dtype)
        rng = np.random.default_rng([seed, index])
        a = rng.standard_normal(spec.shape, dtype=np.float32)
        a *= 0.02
        return spec.path, a.astype(dtype)

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 4) as pool:
        return dict(pool.map(draw, enumerate(program.params)))


def median_s(fn, runs: int) -> float:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def ready(fn, *args):
    return fn(*args).block_until_ready()


def calibrate(jax, device, dry: bool) -> dict:
    """TFLOP/s of a bf16 matmul, GB/s streaming a bf16 matrix through a matrix-vector product, GB/s host to
    device."""
    jnp = jax.numpy
    n = 512 if dry else 8192
    key = jax.random.PRNGKey(0)
    a = jax.device_put(jax.random.normal(key, (n, n), jnp.bfloat16), device)
    b = jax.device_put(jax.random.normal(key, (n, n), jnp.bfloat16), device)
    mm = jax.jit(lambda a, b: a @ b)
    mm(a, b).block_until_ready()
    t_mm = median_s(functools.partial(ready, mm, a, b), 10)
    rows, cols = (1024, 1024) if dry else (65536, 16384)
    # the weight-streaming limit: the best of three reads of one 2.15 GB bf16 matrix (a matrix-vector product each
    # way round, and a plain sum), as a decode step reads its weights
    w = jax.device_put(jnp.ones((rows, cols), jnp.bfloat16), device)
    x = jax.device_put(jnp.ones((cols,), jnp.bfloat16), device)
    y = jax.device_put(jnp.ones((rows,), jnp.bfloat16), device)
    layers = jax.device_put(jnp.ones((64, 4096, 4096) if not dry else (4, 512, 512), jnp.bfloat16), device)
    kernels = {
        "64 x (4096 x 4096) @ x": (jax.jit(lambda m, x: jnp.einsum("lij,j->li", m, x[: m.shape[2]])), (layers, x)),
        "w @ x": (jax.jit(lambda w, x: w @ x), (w, x)),
        "y @ w": (jax.jit(lambda w, y: y @ w), (w, y)),
        "sum(w)": (jax.jit(lambda w: jnp.sum(w, dtype=jnp.float32)), (w,)),
    }
    stream = {}
    for label, (fn, args) in kernels.items():
        fn(*args).block_until_ready()
        size = args[0].size * 2
        stream[label] = size / median_s(functools.partial(ready, fn, *args), 10) / 1e9
    del w, x, y, a, b, layers
    host = np.ones((8 if dry else 512) << 20, np.uint8)
    t_h2d = median_s(functools.partial(ready, jax.device_put, host, device), 3)
    return {
        "matmul_bf16_tflops": round(2 * n**3 / t_mm / 1e12, 3),
        "stream_bf16_gbps": round(max(stream.values()), 1),
        "stream_by_kernel_gbps": {k: round(v, 1) for k, v in stream.items()},
        "stream_matrix_gb": round(rows * cols * 2 / 1e9, 3),
        "host_to_device_gbps": round(host.nbytes / t_h2d / 1e9, 2),
    }


def load(shape: str, dry: bool, **options):
    import linnet

    preset, config = (None, TINY) if dry else (SHAPES[shape], None)
    return linnet.load(
        LLAMA, backend="xla", preset=preset, config=config, random_weights=True, seed=0, progress=False, **options
    )


def last_logits(model, ids: np.ndarray) -> np.ndarray:
    """f32 [V]: the logits of the last of `ids` (one row, from position 0), through the model's step."""
    sm = model.step_model(decode_loop=False)
    return sm.step(ids[None, :], np.zeros(1, np.int64), np.zeros(1, np.int64))[0]


def greedy(model, ids: np.ndarray, new: int, decode_loop: bool | None = None, warm: bool = True):
    from linnet.runtimes.generation import Generator
    from linnet.runtimes.sampling import SamplingParams

    g = Generator(model.step_model(decode_loop=decode_loop), None)
    t = time.perf_counter()
    if warm:
        g.warm_up(len(ids))
    compile_s = time.perf_counter() - t
    params = SamplingParams(max_new_tokens=new)
    g.generate(ids.tolist(), params)  # a first run: XLA's first executions set up
    return g.generate(ids.tolist(), params), compile_s


class Report:
    def __init__(self, out: Path, name: str):
        self.out, self.name = out, name
        self.data: dict = {"rows": []}

    def add(self, section: str, row: dict) -> None:
        row = {"section": section, **row}
        self.data["rows"].append(row)
        print(json.dumps(row), flush=True)
        self.write()

    def write(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / f"{self.name}.json").write_text(json.dumps(self.data, indent=2) + "\n")
        lines = [f"# {self.name}", "", f"{self.data.get('machine', '')}", ""]
        for section in dict.fromkeys(r["section"] for r in self.data["rows"]):
            rows = [r for r in self.data["rows"] if r["section"] == section]
            keys = [k for k in rows[0] if k != "section"]
            for r in rows[1:]:
                keys += [k for k in r if k not in keys and k != "section"]
            lines += [f"## {section}", "", "| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
            lines += ["| " + " | ".join(str(r.get(k, "")) for k in keys) + " |" for r in rows] + [""]
        (self.out / f"{self.name}.md").write_text("\n".join(lines))


def numerics_rows(report: Report, device: str, dry: bool) -> None:
    """SmolLM2-135M's shape in f32 and bf16 under both numerics against the CPU's f32 `equivalent`."""
    vocab = TINY["vocab_size"] if dry else 49152  # SmolLM2's
    ids = np.random.default_rng(1).integers(0, vocab, 64).astype(np.int64)
    cpu_logits, cpu_tokens = {}, {}
    for dtype in ("f32", "bf16"):
        ref = load("smollm2-135m", dry, device="cpu", dtype=dtype, max_positions=128)
        cpu_logits[dtype] = last_logits(ref, ids)
        cpu_tokens[dtype] = greedy(ref, ids, 32, warm=False)[0].token_ids
        del ref
    ref_logits, ref_tokens = cpu_logits["f32"], cpu_tokens["f32"]
    for dtype in ("f32", "bf16"):
        for numerics in ("equivalent", "fast"):
            t = time.perf_counter()
            try:
                m = load("smollm2-135m", dry, device=device, dtype=dtype, numerics=numerics, max_positions=128)
                logits = last_logits(m, ids)
                tokens = greedy(m, ids, 32, warm=False)[0].token_ids
            except Exception as err:  # a row that fails says why, and the others still run
                report.add("numerics", {"dtype": dtype, "numerics": numerics, "error": f"{type(err).__name__}: {err}"})
                continue
            agree = sum(a == b for a, b in zip(tokens, ref_tokens))
            report.add(
                "numerics",
                {
                    "shape": "smollm2-135m",
                    "dtype": dtype,
                    "numerics": numerics,
                    "max_abs_diff_vs_cpu_f32": float(np.max(np.abs(logits - ref_logits))),
                    "argmax_same": bool(np.argmax(logits) == np.argmax(ref_logits)),
                    "greedy_agree": f"{agree}/{len(ref_tokens)}",
                    "max_abs_diff_vs_cpu_same_dtype": float(np.max(np.abs(logits - cpu_logits[dtype]))),
                    "greedy_agree_same_dtype": f"{sum(a == b for a, b in zip(tokens, cpu_tokens[dtype]))}/32",
                    "s": round(time.perf_counter() - t, 1),
                },
            )
            del m


def speed_rows(
    report: Report, device: str, dry: bool, calibration: dict, budget_end: float, only: list[str] | None = None
) -> None:
    prompt, new = (64, 16) if dry else (512, 256)
    shapes = ["smollm2-135m"] if dry else list(only or SHAPES)
    for shape in shapes:
        if time.monotonic() > budget_end:
            report.add("decode", {"shape": shape, "skipped": "time budget spent"})
            continue
        t = time.perf_counter()
        m = load(shape, dry, device=device, dtype="bf16", max_positions=prompt + new)
        load_s = time.perf_counter() - t
        ids = np.random.default_rng(2).integers(0, m.vocab_size, prompt).astype(np.int64)
        params = sum(int(np.prod(a.shape)) for a in m.params.values())
        weight_bytes = sum(a.nbytes for a in m.params.values())
        cache_bytes = sum(a.nbytes for a in m.state.values())
        gbps, tflops = calibration["stream_bf16_gbps"], calibration["matmul_bf16_tflops"]
        stream_ms = weight_bytes / (gbps * 1e9) * 1e3
        with_cache_ms = (weight_bytes + cache_bytes) / (gbps * 1e9) * 1e3
        flop_ms = 2 * params * prompt / (tflops * 1e12) * 1e3
        tpu_tokens = {}
        for loop in (False, True):
            result, compile_s = greedy(m, ids, new, decode_loop=loop)
            tpu_tokens[loop] = result.token_ids
            ms_step = 1e3 / result.decode_tokens_per_s if result.decode_tokens_per_s else float("nan")
            report.add(
                "decode",
                {
                    "shape": shape,
                    "decode_loop": "device" if loop else "host (a round trip per token)",
                    "params_m": round(params / 1e6, 1),
                    "weights_gb": round(weight_bytes / 1e9, 3),
                    "kv_cache_gb": round(cache_bytes / 1e9, 3),
                    "load_s": round(load_s, 1),
                    "compile_s": round(compile_s, 1),
                    "ttft_ms": round(result.prefill_s * 1e3, 1),
                    "ttft_flop_bound_ms": round(flop_ms, 2),
                    "ttft_of_bound": f"{flop_ms / (result.prefill_s * 1e3):.0%}",
                    "decode_tok_s": round(result.decode_tokens_per_s, 1),
                    "ms_per_step": round(ms_step, 3),
                    "weights_stream_ms": round(stream_ms, 3),
                    "of_weights_limit": f"{stream_ms / ms_step:.0%}",
                    "of_weights_and_cache_limit": f"{with_cache_ms / ms_step:.0%}",
                    "new_tokens": len(result.token_ids),
                },
            )
        same = tpu_tokens[False] == tpu_tokens[True]
        diverge = next((i for i, (a, b) in enumerate(zip(*tpu_tokens.values())) if a != b), None)
        # the CPU reference: the same weights in f32 on the host's CPU, 64 prompt tokens, 16 greedy tokens
        ref_row = {"shape": shape, "device_loop_tokens_equal_host_loop": same, "first_differing_token": diverge}
        if time.monotonic() < budget_end:
            short = ids[:64]
            logits = last_logits(m, short)
            tokens = greedy(m, short, 16, warm=False)[0].token_ids
            del m
            ref = load(shape, dry, device="cpu", dtype="f32", max_positions=128)
            ref_logits = last_logits(ref, short)
            ref_tokens = greedy(ref, short, 16, warm=False)[0].token_ids
            del ref
            ref_row |= {
                "max_abs_diff_vs_cpu_f32": float(np.max(np.abs(logits - ref_logits))),
                "greedy_agree_16": f"{sum(a == b for a, b in zip(tokens, ref_tokens))}/{len(ref_tokens)}",
            }
        report.add("distance (bf16 on the device against f32 on the CPU)", ref_row)


SERVE_CONFIGS = {  # (prompts prefilled in one step at most, decode steps in one dispatch at most)
    "one prompt a step, one decode step a dispatch": (1, False),
    "8 prompts a step, multi-step decode": (8, True),
}


def serve_rows(report: Report, device: str, dry: bool, calibration: dict) -> None:
    """The serving engine (continuous batching, `linnet serve`'s, in process: the TPU machine allows no sockets) on
    the 1.1B shape in bf16: C requests of 512 prompt + 128 new tokens (greedy, EOS ignored) submitted at once, for C
    = 8, 32 and 64 on one engine of 64 rows, in two configurations side by side (`SERVE_CONFIGS`): one prompt's
    prefill and one decode step per dispatch (last session's), and up to 8 prompts prefilled in one step
    (`PrefillBatches`) with up to `jax_loop.BATCH_STEPS` decode steps per dispatch (`GreedySteps`). Against the limit
    at that batch: a decode step reads the weights once and each row's whole KV cache row (the attention reads every
    position of its row), at the measured GB/s; and the prefill's FLOP bound (2 x params x prompt tokens at the
    measured TFLOP/s) beside it. Also one decode step of each batch on its own (`step_greedy`) against its limit."""
    from linnet.runtimes.sampling import SamplingParams
    from linnet.runtimes.serve.engine import Engine, Finished, Request

    shape = "smollm2-135m" if dry else "tinyllama-1.1b"
    prompt, new = (32, 8) if dry else (512, 128)
    concurrencies = (2, 4) if dry else (8, 32, 64)
    rows = max(concurrencies)
    m = load(shape, dry, device=device, dtype="bf16", max_batch=rows, max_positions=prompt + new)
    weight_bytes = sum(a.nbytes for a in m.params.values())
    params = sum(a.size for a in m.params.values())
    row_bytes = sum(a.nbytes for a in m.state.values()) / rows
    step_ms = {}
    rng = np.random.default_rng(3)
    for config, (together, multi_step) in SERVE_CONFIGS.items():
        # multi-step decode on the CPU too (`--dry-run`), where it is off by default; batch buckets as on the chip
        sm = m.step_model(decode_loop=True if multi_step else False, batch_buckets=True)
        engine = Engine(sm, None, prefill_chunk=prompt, step_token_budget=together * prompt + rows)
        t = time.perf_counter()
        engine.warm_up()
        compile_s = time.perf_counter() - t
        if not step_ms:  # one decode step at each batch on its own (tokens taken on the device, `step_greedy`)
            for c in concurrencies:
                args = (
                    np.zeros((c, 1), np.int64),
                    np.full(c, prompt + new - 2, np.int64),
                    np.arange(c, dtype=np.int64),
                )
                sm.step_greedy(*args)
                step_ms[c] = median_s(functools.partial(sm.step_greedy, *args), 10) * 1e3
        engine.start()
        try:
            for c in concurrencies:
                requests = [
                    Request(rng.integers(0, m.vocab_size, prompt).tolist(), SamplingParams(), new, ignore_eos=True)
                    for _ in range(c)
                ]
                start = time.perf_counter()
                handles = [engine.submit(r) for r in requests]
                done = [next(e for e in h.events() if isinstance(e, Finished)) for h in handles]
                wall = time.perf_counter() - start
                tokens = sum(f.completion_tokens for f in done)
                ttft = [f.ttft_s * 1e3 for f in done if f.ttft_s is not None]
                itl = [g * 1e3 for f in done for g in f.inter_token_s]
                step_limit_s = (weight_bytes + c * row_bytes) / (calibration["stream_bf16_gbps"] * 1e9)
                prefill_bound_s = 2 * params * prompt * c / (calibration["matmul_bf16_tflops"] * 1e12)
                report.add(
                    "serve",
                    {
                        "shape": shape,
                        "config": config,
                        "concurrency": c,
                        "prompt+new": f"{prompt}+{new}",
                        "finished": f"{sum(f.finish_reason == 'length' for f in done)}/{c}",
                        "tok_s": round(tokens / wall, 1),
                        "decode_limit_tok_s": round(c / step_limit_s, 1),
                        "of_limit": f"{tokens / wall / (c / step_limit_s):.0%}",
                        # the least wall a run can take: every prompt at the FLOP bound, then `new` steps at the limit
                        "of_prefill_and_decode_limit": f"{(prefill_bound_s + new * step_limit_s) / wall:.0%}",
                        "ttft_p50_ms": round(float(np.percentile(ttft, 50)), 1),
                        "ttft_p99_ms": round(float(np.percentile(ttft, 99)), 1),
                        "itl_p50_ms": round(float(np.percentile(itl, 50)), 2),
                        "itl_p99_ms": round(float(np.percentile(itl, 99)), 2),
                        "wall_s": round(wall, 2),
                        "decode_step_ms": round(step_ms[c], 3),
                        "decode_step_limit_ms": round(step_limit_s * 1e3, 3),
                        "decode_step_of_limit": f"{step_limit_s * 1e3 / step_ms[c]:.0%}",
                        "warm_up_compile_s": round(compile_s, 1),
                    },
                )
        finally:
            engine.shutdown()


def compile_rows(report: Report, device: str, dry: bool) -> None:
    """The 1.1B shape's compiles for a generation (prefill bucket, decode step, decode loop) again, in the same
    process after `jax.clear_caches()`: what the persistent compile cache gives a second run. Cold: the speed rows'
    compiles of the same shape (the cache empty then)."""
    import jax

    shape = "smollm2-135m" if dry else "tinyllama-1.1b"
    cold = sum(r.get("compile_s", 0) for r in report.data["rows"] if r["section"] == "decode" and r["shape"] == shape)
    jax.clear_caches()
    prompt = 64 if dry else 512
    m = load(shape, dry, device=device, dtype="bf16", max_positions=prompt + (16 if dry else 256))
    from linnet.runtimes.generation import Generator

    t = time.perf_counter()
    Generator(m.step_model(), None).warm_up(prompt)
    cached = round(time.perf_counter() - t, 2)
    report.add("compile", {"shape": shape, "cold_s": round(cold, 1), "from_persistent_cache_s": cached})


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    ap.add_argument("--dry-run", action="store_true", help="the CPU, tiny sizes")
    ap.add_argument("--budget-s", type=float, default=420, help="start no new shape after this many seconds")
    rows = ("calibration", "numerics", "speed", "serve", "peer", "q8", "compile", "train", "offload")
    ap.add_argument("--only", choices=rows, action="append")
    shapes = ("llama-3.1-8b", "qwen3-8b", "tinyllama-1.1b")
    ap.add_argument("--q8-shapes", nargs="+", choices=shapes, help="q8's decode rows (tpu_q8)")
    ap.add_argument("--q8-sections", nargs="+", choices=("kernel", "prefill", "vocab", "decode", "distance"))
    ap.add_argument("--q8-backends", nargs="+", choices=("jax", "xla"), help="q8's decode rows' backends (jax)")
    ap.add_argument("--q8-layers", nargs="+", choices=("scanned", "unrolled"), help="q8's decode rows' layers")
    ap.add_argument("--speed-shapes", nargs="+", choices=tuple(SHAPES), help="speed's decode rows (all)")
    ap.add_argument("--peer-shapes", nargs="+", choices=("tinyllama-1.1b", "smollm2-135m"), help="peer's shapes")
    ap.add_argument(
        "--train-batches", type=lambda s: s.split(","), help="train rows (tpu_train): 4,8r (r: checkpointed)"
    )
    ap.add_argument("--offload-gib", type=float, nargs="+", help="offload's caps in GiB (tpu_offload; default 8)")
    args = ap.parse_args(argv)
    start = time.monotonic()

    os.environ.setdefault("LINNET_CACHE_DIR", tempfile.mkdtemp(prefix="linnet-cache-"))  # empty: compiles start cold
    import jax

    import linnet.runtimes.loading as loading
    from linnet.runtimes.backends import caches

    caches.enable("jax")  # as `Backend.load` does (before the calibration compiles)

    loading.random_params = fast_random_params
    device = "cpu" if args.dry_run else "tpu"
    dev = jax.devices(device)[0]
    name = f"tpu_{time.strftime('%Y-%m-%d')}" + ("_dry_run" if args.dry_run else "")
    report = Report(args.out, name)
    report.data["machine"] = f"{dev.device_kind} ({dev.platform}), jax {jax.__version__}, {os.cpu_count()} host cores"
    only = set(args.only or ("calibration", "numerics", "speed", "serve"))
    calibration = calibrate(jax, dev, args.dry_run)
    report.add("calibration", calibration)
    if "numerics" in only:
        numerics_rows(report, device, args.dry_run)
    if "speed" in only:
        speed_rows(report, device, args.dry_run, calibration, start + args.budget_s, args.speed_shapes)
        if args.dry_run or "tinyllama-1.1b" in (args.speed_shapes or SHAPES):  # its cold compiles were timed
            compile_rows(report, device, args.dry_run)
    if "serve" in only and time.monotonic() < start + args.budget_s:
        serve_rows(report, device, args.dry_run, calibration)
    if "peer" in only:  # not in the default set: its own call (bench/tpu_peer.py, KerasHub from .whl-peer)
        from tpu_peer import peer_rows

        peer_shapes = tuple(args.peer_shapes or ("tinyllama-1.1b", "smollm2-135m"))
        peer_rows(report, device, args.dry_run, calibration, start + args.budget_s, peer_shapes)
    if "q8" in only and args.only:  # goal 5's 8B rows: asked for by name (`--only q8`), minutes of their own
        from tpu_q8 import q8_rows

        q8_rows(
            report,
            device,
            args.dry_run,
            calibration,
            start + args.budget_s,
            args.q8_shapes,
            args.q8_sections,
            args.q8_backends,
            args.q8_layers,
        )
    if "compile" in only:  # not by default: layers unrolled against scanned (bench/tpu_compile.py)
        from tpu_compile import compile_scan_rows

        compile_scan_rows(report, device, args.dry_run)
    if "train" in only and args.only:  # goal 8's LoRA SFT rows (bench/tpu_train.py): by name, minutes of their own
        from tpu_train import train_rows

        train_rows(report, device, args.dry_run, calibration, start + args.budget_s, args.train_batches)
    if "offload" in only and args.only:  # goal 5's offload rows (bench/tpu_offload.py): by name, minutes of their own
        from tpu_offload import offload_rows

        offload_rows(report, device, args.dry_run, calibration, start + args.budget_s, args.offload_gib)
    report.data["wall_s"] = round(time.monotonic() - start, 1)
    report.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
