"""Issue 41 goal 5, second half: Llama-3.1-8B's shape in bf16 (16.06 GB, more than the 15.7 GiB chip) with its last
layers held in host memory and streamed to the chip each step (`--cpu-offload-gb`, linnet/runtimes/backends/
jax_offload.py). `bench/tpu.py --only offload` runs it after the calibration rows (`offload_rows`); `--dry-run` runs
the same path on the CPU at tiny sizes (a 4-layer Llama of 64 wide).

Rows (section "offload ..."):

- distance: the 8B's dims with 4 layers (3.9 GB, which fits): seeded random bf16 weights in memory, the last-token
  logits of a 64-token prompt and 16 greedy tokens, resident on the chip against the same model with its last two
  layers offloaded (the same programs run: equal is expected), and both against the host CPU's bf16 `equivalent`
  (the bf16 values held in f32 there: jax_backend's docstring).
- h2d: host-to-device GB/s of one layer's bytes (436 MB), from numpy and from pinned host memory (what the offloaded
  layers are held in), in this call: the bandwidth a token's offloaded bytes stream at.
- streaming: 8 layers of the 8B's matrices (3.5 GB) streamed from pinned host memory through a layer's matrix reads,
  the two ways the issue names, on the same arrays: the driver `jax_offload` runs (a program a layer, the next
  layer's transfer issued first) and one jitted program taking them in host memory (XLA's host offload:
  `jax.device_put(w, jax.memory.Space.Device)` inside it). ms a pass, GB/s, and whether the outputs agree: which is
  faster on the chip (`--cpu-offload-gb` runs the first; the second is not built into the backends).
- decode, per cap (`--offload-gib`, default 8: the mission row's "GPU capped at 8 GiB, streaming half the weights";
  4 is about the least that fits the chip): a Hugging Face folder of the 8B shape written on the machine's disk
  (`write_random_folder`: one seeded stream per tensor, a shard per layer, a thread pool; 16.06 GB), loaded through
  the real path (`linnet.load(..., weights=folder, dtype="bf16", cpu_offload_gb=cap)`, xla; where the disk lacks
  the space, the same distribution drawn in memory, `random_weights`, the row says so), then: load time, the
  cold compile, TTFT of a 64-token prompt, ms a token over 16 greedy tokens against the offloaded bytes over the
  measured pinned H2D GB/s (the bound when the transfer is the whole step) and against the resident bytes over the
  calibration's HBM GB/s, the chip's memory in use, and the greedy tokens.

Device time (estimated, not measured: the chip's disk speed is unknown): the folder ~40 s (8e9 normal draws on 12
threads ~10-20 s, 16 GB written at >= 0.5 GB/s), distance ~60 s (three loads of 3.9 GB and their compiles), the
streaming row ~15 s (3.5 GB put in pinned memory, 2 x 4 passes at ~0.5 s, two compiles), each cap's decode ~90-120 s
at 8 GiB (load ~30 s, cold compile ~30-45 s, a 2-token warm-up and the 16 tokens: ~22 passes of 8.7 GB at ~6.7 GB/s
~ 30 s), ~70 s at 4 GiB. One cap: ~4.5 minutes; both: ~5.5-6. A call's budget (`--budget-s`) skips a cap that would
start after it, saying so.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
LLAMA = ROOT / "examples" / "llama.linnet"
SHAPE = "llama-3.1-8b"
TINY = {  # --dry-run: a 4-layer Llama
    "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
}  # fmt: skip
PROMPT, NEW, WARM_NEW = 64, 16, 2


def _program(dry: bool, layers: int | None = None):
    from tpu_q8 import _program as checked_program

    config = dict(TINY) if dry else {}
    if layers is not None:
        config["num_hidden_layers"] = layers
    return checked_program(SHAPE, config or None)


def write_random_folder(folder: Path, program, seed: int = 0, workers: int = 8) -> dict:
    """A Hugging Face folder of `program`'s parameters (config.json, model-*.safetensors and their index): the
    distribution `bench/tpu.py`'s `fast_random_params` draws (norm scales 1, the rest N(0, 0.02)) in bf16, one
    seeded stream per tensor, a shard per layer and one per other tensor (the 8B's embeddings and head are 1 GB
    each: one shard for both would be the last thread's alone) drawn and written by `workers` threads, so at most
    `workers` shards are in memory at once (the 8B's: ~0.7 GB each with the f32 draw). Returns its size and how long
    writing took. Measured on the 2-core dev machine (load 8, shared): 2.97 GB (the 8B's dims, 2 layers) in 86 s on
    2 threads, the normal draws most of it (42 M values/s a core there; the bf16 cast and the write ~10 %)."""
    from safetensors.numpy import save_file

    from linnet.runtimes.formats.checkpoints import numpy_dtype

    bf16 = numpy_dtype("bf16")
    shards: dict[str, list] = {}
    for index, spec in enumerate(program.params):
        parts = spec.path.split(".")
        name = f"layer-{int(parts[2]):03d}" if parts[1:2] == ["layers"] else f"other-{index:03d}"  # embeddings, head
        shards.setdefault(name, []).append((index, spec))

    def write(item) -> dict[str, str]:
        name, specs = item
        tensors = {}
        for index, spec in specs:
            if len(spec.shape) == 1:
                tensors[spec.path] = np.ones(spec.shape, bf16)
                continue
            a = np.random.default_rng([seed, index]).standard_normal(spec.shape, dtype=np.float32)
            a *= 0.02
            tensors[spec.path] = a.astype(bf16)
        file = f"model-{name}.safetensors"
        save_file(tensors, str(folder / file), metadata={"format": "pt"})
        return dict.fromkeys(tensors, file)

    t = time.perf_counter()
    folder.mkdir(parents=True, exist_ok=True)
    weight_map: dict[str, str] = {}
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for names in pool.map(write, shards.items()):
            weight_map |= names
    size = sum(int(np.prod(s.shape)) * 2 for s in program.params)
    index = {"metadata": {"total_size": size}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    config = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], **program.config}
    (folder / "config.json").write_text(json.dumps({**config, "torch_dtype": "bfloat16"}, indent=1))
    seconds = time.perf_counter() - t
    gbps = size / seconds / 1e9
    return {"folder_gb": round(size / 1e9, 2), "write_s": round(seconds, 1), "write_gbps": round(gbps, 2)}


def h2d_row(dev, layer_bytes: int) -> dict:
    """GB/s putting `layer_bytes` on `dev` from a numpy array and from pinned host memory (median of 3 each)."""
    import jax
    from tpu import median_s

    from linnet.runtimes.backends.jax_offload import host_sharding

    host = np.ones(layer_bytes, np.uint8)
    on_device = jax.sharding.SingleDeviceSharding(dev)
    row = {"bytes_mb": round(layer_bytes / 1e6, 1)}
    seconds = median_s(lambda: jax.device_put(host, on_device).block_until_ready(), 3)
    row["numpy_gbps"] = round(layer_bytes / seconds / 1e9, 2)
    pinned = host_sharding(dev)
    if pinned is not None:
        held = jax.device_put(host, pinned)
        seconds = median_s(lambda: jax.device_put(held, on_device).block_until_ready(), 3)
        row["pinned_host_gbps"] = round(layer_bytes / seconds / 1e9, 2)
        del held
    return row


def _layer(h, w: dict):
    """A Llama layer's matrix reads (no attention): each of its matrices read once, h [1, hidden]."""
    import jax

    a = (h @ w["qkv"].T)[:, : h.shape[1]] @ w["o"].T
    gate_up = (h + a) @ w["gate_up"].T
    half = gate_up.shape[1] // 2
    return h + a + (jax.nn.silu(gate_up[:, :half]) * gate_up[:, half:]) @ w["down"].T


def streaming_rows(report, dev, dry: bool, layers: int = 8) -> None:
    """The two ways to stream `layers` layers of the 8B's matrices (bf16, 436 MB each) from pinned host memory, on
    the same arrays in one call: the driver `jax_offload` runs (a program a layer, the next layer's `device_put`
    issued before the current layer runs) and one jitted program taking them in host memory and moving each inside
    (`jax.device_put(w, jax.memory.Space.Device)`: XLA's host offload, its scheduler free to prefetch). ms a pass
    against the bytes at the measured H2D GB/s, and whether both give the same output."""
    import jax
    import jax.numpy as jnp
    from tpu import median_s

    from linnet.runtimes.backends.jax_offload import host_sharding

    hidden, inter, kv = (64, 128, 32) if dry else (4096, 14336, 2048)
    shapes = {
        "qkv": (hidden + kv, hidden),
        "o": (hidden, hidden),
        "gate_up": (2 * inter, hidden),
        "down": (hidden, inter),
    }
    host, on_device = host_sharding(dev), jax.sharding.SingleDeviceSharding(dev)
    if host is None:
        report.add("offload streaming", {"skipped": f"{dev.platform} has no pinned host memory"})
        return
    bf16 = jnp.bfloat16
    # one block of random values repeated (np.resize): 1.75e9 fresh draws would cost more than the row measures
    block = (np.random.default_rng(0).standard_normal(1 << 20, dtype=np.float32) * 0.02).astype(bf16)
    ws = [{k: jax.device_put(np.resize(block, s), host) for k, s in shapes.items()} for _ in range(layers)]
    h = jax.device_put(np.ones((1, hidden), bf16), on_device)
    one = jax.jit(_layer)

    def driver():
        pending, x = jax.device_put(ws[0], on_device), h
        for i in range(layers):
            current, pending = pending, (jax.device_put(ws[i + 1], on_device) if i + 1 < layers else None)
            x = one(x, current)
            del current
            if pending is not None:
                x.block_until_ready()
        return x.block_until_ready()

    @jax.jit
    def whole(ws, x):
        for w in ws:
            x = _layer(x, jax.device_put(w, jax.memory.Space.Device))
        return x

    nbytes = sum(int(np.prod(s)) * 2 for s in shapes.values()) * layers
    row = {"layers": layers, "gb": round(nbytes / 1e9, 3)}
    outs = {}
    for name, fn in (("driver (jax_offload's)", driver), ("one program, XLA host offload", lambda: whole(ws, h))):
        try:
            outs[name] = np.asarray(jax.block_until_ready(fn()), np.float32)
            row[f"{name} ms"] = round(median_s(lambda fn=fn: jax.block_until_ready(fn()), 3) * 1e3, 1)
            row[f"{name} gbps"] = round(nbytes / row[f"{name} ms"] / 1e6, 2)
        except Exception as err:  # the other variant still runs
            row[f"{name} error"] = f"{type(err).__name__}: {err}"[:500]
    if len(outs) == 2:
        a, b = outs.values()
        row["max_abs_diff"] = float(np.max(np.abs(a - b)))
    report.add("offload streaming", row)


def _load(dev_name: str, dry: bool, **options):
    import linnet

    config = TINY if dry else None
    preset = None if dry else "llama_3_1_8b"
    return linnet.load(
        LLAMA,
        backend="xla",
        preset=preset,
        config=config,
        dtype="bf16",
        device=dev_name,
        max_positions=PROMPT + NEW + WARM_NEW,
        progress=False,
        **options,
    )


def _free(model) -> None:
    model.params.clear()
    model.state.clear()
    model.step_executables.clear()
    gc.collect()


def _generate(model, ids: np.ndarray, new: int):
    """(the result of `new` greedy tokens, the warm-up's seconds): the shapes compiled and run once first."""
    from linnet.runtimes.generation import Generator
    from linnet.runtimes.sampling import SamplingParams

    g = Generator(model.step_model(), None)
    t = time.perf_counter()
    g.warm_up(len(ids))
    g.generate(ids.tolist(), SamplingParams(max_new_tokens=WARM_NEW))  # XLA's first executions set up
    warm_s = time.perf_counter() - t
    return g.generate(ids.tolist(), SamplingParams(max_new_tokens=new)), warm_s


def distance_rows(report, device: str, dry: bool) -> None:
    """The 8B's dims with 4 layers: resident against offloaded on the chip, and both against the CPU's bf16."""
    from tpu import last_logits

    layers = 4
    vocab = _program(dry, layers).config["vocab_size"]
    ids = np.random.default_rng(1).integers(0, vocab, PROMPT).astype(np.int64)
    config = {**(TINY if dry else {}), "num_hidden_layers": layers}
    runs = {}
    for name, dev_name, cap in (
        ("device resident", device, None),
        ("device, last layers offloaded", device, "1.5 layers"),
        ("cpu bf16 equivalent", "cpu", None),
    ):
        t = time.perf_counter()
        m = _load_config(dev_name, dry, config, cap)
        note = next((n for n in m.notes if "offload" in n), "")
        runs[name] = (last_logits(m, ids), _generate(m, ids, NEW)[0].token_ids, time.perf_counter() - t, note)
        _free(m)
    resident, cpu = runs["device resident"], runs["cpu bf16 equivalent"]
    for name, (logits, tokens, seconds, note) in runs.items():
        report.add(
            "offload distance",
            {
                "shape": f"{SHAPE} dims, {layers} layers" if not dry else f"tiny, {layers} layers",
                "run": name,
                "max_abs_diff_vs_resident": float(np.max(np.abs(logits - resident[0]))),
                "bit_equal_to_resident": bool(np.array_equal(logits, resident[0])),
                "greedy_agree_vs_resident": f"{sum(a == b for a, b in zip(tokens, resident[1]))}/{len(tokens)}",
                "max_abs_diff_vs_cpu": float(np.max(np.abs(logits - cpu[0]))),
                "greedy_agree_vs_cpu": f"{sum(a == b for a, b in zip(tokens, cpu[1]))}/{len(tokens)}",
                "logits_max_abs": float(np.max(np.abs(resident[0]))),
                "s": round(seconds, 1),
                "note": note,
            },
        )


def _load_config(dev_name: str, dry: bool, config: dict, cap: str | None):
    """A model of `config` with seeded random weights; with `cap`, 1.5 layers' bf16 bytes offloaded (its last two
    layers where they are held in bf16, the TPU; one on the CPU, which holds the matrices in f32)."""
    import linnet

    options = {"scan_layers": False}  # the resident layers unrolled, as the offloaded model runs them (the CPU scans)
    if cap is not None:
        from linnet.runtimes.backends.jax_offload import GIB

        layer = sum(int(np.prod(s.shape)) * 2 for s in _program(dry, 1).params if ".layers.0." in s.path)
        options["cpu_offload_gb"] = 1.5 * layer / GIB
    preset = None if dry else "llama_3_1_8b"
    return linnet.load(
        LLAMA, backend="xla", preset=preset, config=config, dtype="bf16", device=dev_name, random_weights=True,
        seed=0, max_positions=PROMPT + NEW + WARM_NEW, progress=False, **options
    )  # fmt: skip


def decode_rows(report, device: str, dry: bool, calibration: dict, caps: list[float], budget_end: float) -> None:
    """The 8B shape from a folder on disk, per cap: load, compile, TTFT, ms a token against the H2D and HBM bounds."""
    import jax
    from tpu_q8 import _memory_gb

    program = _program(dry)
    dev = jax.devices(device)[0]
    layer_bytes = sum(int(np.prod(s.shape)) * 2 for s in program.params if ".layers.0." in s.path)
    h2d = h2d_row(dev, layer_bytes)
    report.add("offload h2d", h2d)
    streaming_rows(report, dev, dry)
    h2d_gbps = h2d.get("pinned_host_gbps", h2d["numpy_gbps"])
    size = sum(int(np.prod(s.shape)) * 2 for s in program.params)
    tmp = Path(tempfile.mkdtemp(prefix="linnet-offload-"))
    try:
        free = shutil.disk_usage(tmp).free
        folder = tmp / "llama-3.1-8b-bf16" if free >= size * 1.05 else None
        if folder is not None:
            written = write_random_folder(folder, program, workers=min(12, os.cpu_count() or 4))
        else:  # the same distribution drawn in memory (`fast_random_params`), bound by the same binder
            written = {"skipped": f"{size / 1e9:.1f} GB folder, {free / 1e9:.1f} GB free in {tmp}: weights in memory"}
        report.data.setdefault("offload_folder", written)
        weights = {"weights": folder} if folder is not None else {"random_weights": True, "seed": 0}
        ids = np.random.default_rng(2).integers(0, program.config["vocab_size"], PROMPT).astype(np.int64)
        for cap in caps:
            if time.monotonic() > budget_end:
                report.add("offload decode", {"cpu_offload_gb": cap, "skipped": "time budget spent"})
                continue
            if dry:
                cap = cap * layer_bytes / (1 << 30) / 4  # tiny: the cap scaled to a layer's size (8 GiB: two)
            t = time.perf_counter()
            m = _load(device, dry, cpu_offload_gb=cap, **weights)
            load_s = time.perf_counter() - t
            result, warm_s = _generate(m, ids, NEW)
            plan = m.offload
            ms_token = 1e3 / result.decode_tokens_per_s if result.decode_tokens_per_s else float("nan")
            h2d_ms = plan.offloaded_bytes / (h2d_gbps * 1e9) * 1e3
            hbm_ms = plan.resident_bytes / (calibration["stream_bf16_gbps"] * 1e9) * 1e3
            row = {"shape": SHAPE if not dry else "tiny", "cpu_offload_gb": round(cap, 6), "backend": "xla bf16"}
            row |= {"weights": "HF folder on disk" if folder is not None else "random, in memory (no disk space)"}
            row |= {"offloaded": f"layers {plan.resident}..{plan.count - 1} ({len(plan.offloaded)} of {plan.count})"}
            row |= {"offloaded_gb": round(plan.offloaded_bytes / 1e9, 3)}
            row |= {"resident_gb": round(plan.resident_bytes / 1e9, 3)}
            row |= {"load_s": round(load_s, 1), "compile_cold_and_warm_up_s": round(warm_s, 1)}
            row |= {"ttft_ms": round(result.prefill_s * 1e3, 1), "ms_per_token": round(ms_token, 1)}
            row |= {"h2d_gbps": h2d_gbps, "h2d_bound_ms": round(h2d_ms, 1), "of_h2d_bound": f"{h2d_ms / ms_token:.0%}"}
            row |= {"hbm_bound_ms": round(hbm_ms, 2), "h2d_plus_hbm_ms": round(h2d_ms + hbm_ms, 1)}
            row |= {**_memory_gb(device), "greedy": " ".join(str(i) for i in result.token_ids)}
            report.add("offload decode", row)
            _free(m)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def offload_rows(report, device: str, dry: bool, calibration: dict, budget_end: float, caps: list[float] | None = None):
    """The rows of this module (its docstring), in order: distance, h2d and decode per cap (default 8 GiB)."""
    for section, rows in (
        ("offload distance", lambda: distance_rows(report, device, dry)),
        ("offload decode", lambda: decode_rows(report, device, dry, calibration, caps or [8.0], budget_end)),
    ):
        try:
            rows()
        except Exception as err:  # a section that fails says why, and the next still runs (one device call)
            report.add(section, {"error": f"{type(err).__name__}: {err}"[:2000]})
