"""Issue 41 goal 7: compile time of the TinyLlama-1.1B shape on the XLA backend, its 22 layers unrolled against one
`lax.scan` over them (`linnet.compiler.jax.scan`, `load(scan_layers=...)`).

    python bench/tpu.py --only compile ...          on the chip: `compile_scan_rows`, one row per variant
    python bench/tpu_compile.py --cpu [--out DIR]   this machine's CPU: where the time goes, per program

The chip's rows (`compile_scan_rows`, wired into bench/tpu.py as `--only compile`): per variant (unrolled, scanned),
in one process, each with an empty persistent cache of its own (`LINNET_CACHE_DIR`):
- `load_s`: checking, lowering to Core IR, tracing and exporting `forward` and `step` to StableHLO, binding the
  seeded random weights (the xla backend exports at load);
- `cold_s`: `Generator.warm_up` of a 512-token prompt (the 512 prefill bucket, the decode step and the on-device
  decode loop `jax_loop.GreedyLoop`), every program compiled and written to the cache;
- `cache_load_s` and `from_persistent_cache_s`: the same again after `jax.clear_caches()` with a new model, as a
  second process would (load, then warm_up with every program found in the cache: tracing and lowering are paid
  again, XLA's compiles are not);
- the distance of the last prompt token's logits from the CPU's f32 reference (scanned, on the host's CPU) and the
  greedy agreement of 32 new tokens with the unrolled variant on the chip;
- what the scan costs when running: ms a token of a 512 + 128 generation (the on-device decode loop), and a
  decode step of 32 rows at position 512 of 640 (serving's shape, where the caches are large: the scanned step
  reads each layer's cache slice as a copy on the CPU, and whether XLA does so on the chip is to be seen), timed
  three ways (`_batch_decode`): waited for step by step, 300 steps back to back (the device's time a step), and
  through serving's multi-step decode (`step_greedy_steps`).

The CPU breakdown (`cpu_breakdown`): the same programs as the chip runs them (token-major caches, bf16 matrices as
they are) traced, lowered and compiled for this machine's CPU from shapes alone (no weights): per program, the
seconds of tracing and lowering and of XLA's compile, cold and from the persistent cache, both variants, with the
machine's CPU contention (the share of the time some task waited for a CPU, Linux PSI) recorded. XLA's CPU
compiler is slower than the TPU's, but what is compiled, and how often, is the same.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from generate_speed import cpu_pressure_us  # stdlib-only at import time (bench/ is on sys.path)

ROOT = Path(__file__).resolve().parent.parent
LLAMA = ROOT / "examples" / "llama.linnet"
PRESET = "tinyllama_1_1b"
TINY = {  # --dry-run: a 2-layer Llama (bench/tpu.py's)
    "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2,
}  # fmt: skip
VARIANTS = {"unrolled": False, "scanned": True}


def _fresh_cache() -> Path:
    """A new, empty persistent compile cache for this process (`caches.enable`), so that compiles start cold."""
    from linnet.runtimes.backends import caches

    os.environ["LINNET_CACHE_DIR"] = tempfile.mkdtemp(prefix="linnet-compile-")
    return caches.enable("jax")


def _load(dry: bool, device: str, scan: bool, dtype: str = "bf16", max_positions: int = 768, max_batch: int = 1):
    import linnet

    preset, config = (None, TINY) if dry else (PRESET, None)
    return linnet.load(
        LLAMA, backend="xla", preset=preset, config=config, random_weights=True, seed=0, progress=False,
        device=device, dtype=dtype, max_positions=max_positions, max_batch=max_batch, scan_layers=scan,
    )  # fmt: skip


def _warm_up(model, prompt: int):
    """`Generator.warm_up` of one `prompt`-token request with the on-device decode loop, and its compile report."""
    from linnet.runtimes.backends import caches
    from linnet.runtimes.generation import Generator

    g = Generator(model.step_model(decode_loop=True), None)
    with caches.watch("jax") as report:
        g.warm_up(prompt)
    return g, report


def compile_scan_rows(report, device: str, dry: bool) -> None:
    """One `compile` row per variant (unrolled, scanned) of the 1.1B shape (the module docstring), into `report`
    (bench/tpu.py's `Report`). Device time, estimated: about 95 s unrolled (25 s cold and 4.3 s cached were
    measured; two loads of ~6 s, a 32-row model's step and multi-step decode compiled ~20 s each, 600 steps of ~8
    ms) and 55 s scanned, plus ~40 s for the CPU reference on the host: about 3.5 minutes, with bench/tpu.py's start
    and calibration (~45 s) under 4.5."""
    import jax

    from linnet.runtimes.sampling import SamplingParams

    prompt, new = (64, 16) if dry else (512, 32)
    ids = np.random.default_rng(7).integers(0, TINY["vocab_size"] if dry else 32000, prompt).astype(np.int64)
    tokens, logits = {}, {}
    for name, scan in VARIANTS.items():
        jax.clear_caches()  # nothing compiled by the variant before (the argmax of `step_greedy`) is kept in memory
        folder = _fresh_cache()
        t = time.perf_counter()
        m = _load(dry, device, scan)
        load_s = time.perf_counter() - t
        g, cold = _warm_up(m, prompt)
        sm = m.step_model(decode_loop=False)
        logits[name] = sm.step(ids[None, :], np.zeros(1, np.int64), np.zeros(1, np.int64))[0]
        tokens[name] = g.generate(ids.tolist(), SamplingParams(max_new_tokens=new)).token_ids
        t = time.perf_counter()
        g.generate(ids.tolist(), SamplingParams(max_new_tokens=4 * new))  # the device loop, as the speed rows run
        generate_s = time.perf_counter() - t
        del m, g, sm
        jax.clear_caches()  # a second process: the persistent cache holds every program, nothing else is kept
        t = time.perf_counter()
        m = _load(dry, device, scan)
        cache_load_s = time.perf_counter() - t
        _, warm = _warm_up(m, prompt)
        del m
        report.add(
            "compile",
            {
                "shape": "tiny" if dry else "tinyllama-1.1b",
                "layers": name,
                "load_s": round(load_s, 2),
                "cold_s": round(cold.seconds, 2),
                "cold_cache": cold.describe(),
                "cache_load_s": round(cache_load_s, 2),
                "from_persistent_cache_s": round(warm.seconds, 2),
                "warm_cache": warm.describe(),
                "cache_mb": round(sum(f.stat().st_size for f in Path(folder).rglob("*") if f.is_file()) / 1e6, 1),
                "greedy_agree_with_unrolled": f"{sum(a == b for a, b in zip(tokens[name], tokens['unrolled']))}/{new}",
                "max_abs_diff_vs_unrolled": float(np.max(np.abs(logits[name] - logits["unrolled"]))),
                f"generate_{prompt}+{4 * new}_ms_per_token": round(generate_s / (4 * new) * 1e3, 3),
                **_batch_decode(dry, device, scan),
            },
        )
    ref = _load(dry, "cpu", True, dtype="f32", max_positions=prompt + 16)
    cpu = ref.step_model(decode_loop=False).step(ids[None, :], np.zeros(1, np.int64), np.zeros(1, np.int64))[0]
    report.add(
        "compile_distance",
        {
            **{f"max_abs_diff_{k}_vs_cpu_f32": float(np.max(np.abs(v - cpu))) for k, v in logits.items()},
            **{f"argmax_same_{k}": bool(np.argmax(v) == np.argmax(cpu)) for k, v in logits.items()},
        },
    )


def _batch_decode(dry: bool, device: str, scan: bool, rows: int = 32) -> dict:
    """A decode step of `rows` rows at position 512 of 640 (serving's shape: the caches are read whole), where the
    scan's read of each layer's cache slice would cost if XLA copies it. Three ways, ms a step:
    - `decode_step_ms_at_32_rows`: the median of 20 steps each waited for (the host's per-token path);
    - `device_step_ms_at_32_rows`: 300 steps dispatched back to back, one wait at the end (each step's inputs put
      and the donated cache threaded, as serving's steps are): the host's dispatch overlaps the chip's work, so this
      is the device time of a step;
    - `batch_steps_ms_per_step_at_32_rows`: serving's multi-step decode (`step_greedy_steps`, `jax_loop.BatchSteps`:
      BATCH_STEPS greedy steps a dispatch, the tokens read back after each dispatch), 300 steps, per step."""
    import jax

    from linnet.runtimes.backends.jax_loop import BATCH_STEPS

    positions, steps = (48, 24) if dry else (512, 300)
    m = _load(dry, device, scan, max_positions=positions + 128, max_batch=rows)
    sm = m.step_model(decode_loop=True, batch_buckets=False)
    ids, at, which = np.ones((rows, 1), np.int64), np.full(rows, positions, np.int64), np.arange(rows, dtype=np.int64)
    sm.step(ids, at, which)  # compile and first run
    times = []
    for _ in range(20):
        t = time.perf_counter()
        sm.step(ids, at, which)
        times.append(time.perf_counter() - t)
    t = time.perf_counter()
    for _ in range(steps):
        logits = sm._call(ids, at, which)  # the logits left on the device: no wait between steps
    jax.block_until_ready((logits, m.state))
    device_s = time.perf_counter() - t
    sm.step_greedy_steps(ids, at, which, BATCH_STEPS)  # compile and first run
    t = time.perf_counter()
    for _ in range(steps // BATCH_STEPS):
        sm.step_greedy_steps(ids, at, which, BATCH_STEPS)
    batch_s = time.perf_counter() - t
    del m, sm
    return {
        "decode_step_ms_at_32_rows": round(float(np.median(times)) * 1e3, 3),
        "device_step_ms_at_32_rows": round(device_s / steps * 1e3, 3),
        "batch_steps_ms_per_step_at_32_rows": round(batch_s / (steps // BATCH_STEPS * BATCH_STEPS) * 1e3, 3),
        "decode_steps_timed": steps,
    }


# ----------------------------------------------------------------------------- the CPU breakdown


def cpu_breakdown(layers: int, scan: bool) -> dict:
    """Per program of a generation on the chip (the 512 prefill bucket, the decode step, a decode batch bucket of 4
    rows, the decode loop), traced, lowered and compiled for the CPU from shapes alone, cold and then from the
    persistent cache (after `jax.clear_caches()`); and the export of `step` (tracing it with symbolic dims, what
    the xla backend does at load). Seconds, rounded."""
    import jax

    from linnet.compiler.jax.module import compile_program, export_entry, exported_fn, param_specs
    from linnet.runtimes.backends.jax_loop import build_loop
    from linnet.runtimes.loading import LoadOptions, prepare

    _fresh_cache()
    config = {"num_hidden_layers": layers}
    options = LoadOptions(preset=PRESET, config=config, dtype="bf16", random_weights=True, max_positions=768)
    compiled = compile_program(prepare(LLAMA, None, options).program, cache_layout="token_major", scan_layers=scan)
    params, state = param_specs(
        compiled.program, compiled.fused, compiled.held_dtype, compiled.cache_layout, compiled.stacked
    )
    t = time.perf_counter()
    exported = export_entry(compiled, "step", platforms=["cpu"])
    out: dict = {"export_step_s": round(time.perf_counter() - t, 2)}
    i64 = lambda *shape: jax.ShapeDtypeStruct(shape, np.int64)  # noqa: E731
    step_args = {
        "prefill_512": (i64(1, 512), i64(1), i64(1)),
        "decode_1": (i64(1, 1), i64(1), i64(1)),
        "decode_4": (i64(4, 1), i64(4), i64(4)),
    }
    loop_args = (i64(), i64(), i64(), i64(), i64(4), jax.ShapeDtypeStruct((), np.bool_))
    for rnd in ("cold", "cached"):
        jax.clear_caches()
        step = exported_fn(exported, True, compiled.compiler_options)
        loop = jax.jit(build_loop(exported.call), donate_argnums=(1,), compiler_options=compiled.compiler_options)
        programs = {name: (step, args) for name, args in step_args.items()} | {"decode_loop": (loop, loop_args)}
        for name, (fn, args) in programs.items():
            t = time.perf_counter()
            lowered = fn.lower(params, state, *args)
            lower_s = time.perf_counter() - t
            t = time.perf_counter()
            lowered.compile()
            out[f"{name}_{rnd}"] = {"trace_lower_s": round(lower_s, 2), "compile_s": round(time.perf_counter() - t, 2)}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu", action="store_true", help="the CPU breakdown (the chip's rows run from bench/tpu.py)")
    ap.add_argument("--layers", type=int, default=22)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = ap.parse_args(argv)
    if not args.cpu:
        ap.error("on the chip run bench/tpu.py --only compile; here, --cpu")
    import jax

    jax.config.update("jax_enable_x64", True)  # the IR's i64, for the whole of this bench's own process
    wait0, t0 = cpu_pressure_us(), time.perf_counter()
    rows = {}
    for name, scan in VARIANTS.items():
        rows[name] = cpu_breakdown(args.layers, scan)
        print(name, json.dumps(rows[name]), flush=True)
    wall, wait1 = time.perf_counter() - t0, cpu_pressure_us()
    record = {
        "what": f"{PRESET} ({args.layers} layers), bf16, xla programs of the chip compiled for the CPU, no weights",
        "machine": f"{os.cpu_count()} CPUs, jax {jax.__version__}",
        "wall_s": round(wall, 1),
        "cpu_wait_pct": None if wait0 is None or wait1 is None else round(100 * (wait1 - wait0) / 1e6 / wall, 1),
        "loadavg_after": os.getloadavg(),
        "rows": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "tpu_compile_cpu.json"
    path.write_text(json.dumps(record, indent=2) + "\n")
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
