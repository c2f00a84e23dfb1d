"""Issue 41 goal 5, first half: an 8B-class decoder on one TPU chip from a Q8_0 GGUF, `--dtype stored` on `xla`
(int8 codes and f16 scales held on the chip, dequantized inside each matmul). `bench/tpu.py --only q8` runs it after
the calibration rows (`q8_rows`); `--dry-run` runs the same path on the CPU at tiny sizes.

Rows (section "q8 ..."):

- kernel: one Q8_0 matrix-vector product the size of Llama-3.1-8B's fused gate/up projection (28672 x 4096), the
  way the generated code runs it (`prelude.quantized_linear`: the codes converted and scaled as the dot's operand)
  at default precision (`fast`) and at f32's highest (`equivalent`), beside the same product over bf16 weights and
  over the codes dequantized to bf16 first, and the Pallas kernel the TPU's generated code runs
  (linnet/compiler/jax/q8_kernel.py: codes [N, K], scales f32 [K / 32, N]) at a few tile targets, `fast` and
  `equivalent`: ms, GB/s of the bytes held (codes and scales), and whether XLA fused the dequantization into the dot
  (no [28672, 4096] float array in the optimized HLO) or materialised the matrix; a variant that fails to compile
  says why.
- prefill: a 512-row product through the same matrix (a 512-token prompt): bf16 dense (the FLOP reference), XLA
  dequantizing to bf16 then the dot, the decode kernel in row tiles of 64 (block-diagonal x: 16 times the MXU
  work), and the dequantizing kernel (each codes tile dequantized in VMEM, one plain dot) at three tile targets and
  both ways of repeating the scales (`q8_kernel.SCALE_EXPAND`), `fast` and `equivalent`: ms and TFLOP/s against the
  calibration's matmul; then 8, 32 and 64 rows through each kernel. The decode rows' prompts take the first way that
  compiled; when neither did, the decode kernel, saying so.
- vocab (by default only with qwen3-8b): Qwen3's lm_head (151936 x 4096, N's tiles 128) at one row, K's tile 512
  against the 2048 `tiles` picks: ms against streaming it.
- decode (llama-3.1-8b, and qwen3-8b or tinyllama-1.1b with `--q8-shapes`): a GGUF of the preset's shape written on the
  machine (`write_q8_gguf`: seeded N(0, 0.02) weights quantized to Q8_0 by gguf-py's own vectorised quantizer, threaded
  over row chunks, streamed to a temporary file), loaded through the real path (`linnet.load(..., dtype="stored")`,
  `jax`, `fast`: the generated module jitted with the step's shapes, so a decode step's matrices go through the kernels
  with the rows known when traced), then: load time, compile (cold), TTFT for a 512-token prompt, decode tok/s at batch
  1 over 128 new tokens with the on-device decode loop against the streaming limit (the bytes held, codes + scales +
  norms, over the calibration's measured GB/s), the chip's memory in use, and the first 32 greedy tokens. `--q8-layers
  scanned unrolled` loads each shape both ways in the same call (`scan_layers`: one `lax.scan` over the stacked layers,
  the kernels reading each layer's tiles from the stacks, or every layer traced and compiled; default: the backend's own
  choice, `jax_backend.STORED_SCANS_ON_ACCELERATORS`), each later row with its prompt's last logits and greedy tokens
  against the first's.
- distance (per shape): the same dims with 4 layers (the dequantized 8B, 32 GB in f32 and 16 GB in bf16, does not
  fit the chip): the last-token logits of a 96-token prompt and 32 greedy tokens of the stored model (`fast` and
  `equivalent`, on `xla` and on `jax`: both through the kernels on a TPU, `xla`'s with symbolic rows) against the
  same file loaded dequantized in f32 (`equivalent`) on the chip, and against the host CPU's f32 `equivalent` (16
  greedy tokens).

`--q8-sections` keeps some of kernel, prefill, vocab, decode, distance (one device call must stay under 9 minutes);
`--q8-backends jax xla` runs the decode rows on both (`xla`: the exported entries, rows symbolic, each kernel picked
when an entry runs; default `jax` alone).
Disk: the 8B file is 8.5 GB (qwen3-8b's 8.7 GB), written under $TMPDIR and removed after its row; a shape whose
file does not fit the free space is skipped, saying so.
"""

from __future__ import annotations

import functools
import gc
import math
import os
import re
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SOURCES = {
    "llama-3.1-8b": ("llama.linnet", "llama_3_1_8b"),
    "qwen3-8b": ("qwen3.linnet", "qwen3_8b"),
    "tinyllama-1.1b": ("llama.linnet", "tinyllama_1_1b"),  # 1.2 GB of Q8_0: the decode rows' form, cheaply
}
LAYERS = {"scanned": True, "unrolled": False}  # `--q8-layers`: the decode rows' `scan_layers`
TINY = {  # --dry-run: a 2-layer model, every matrix dim a multiple of Q8_0's block of 32
    "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
}  # fmt: skip
ROWS_PER_CHUNK = 256  # rows of a matrix drawn and quantized per task of the thread pool


def _program(shape: str, config: dict | None):
    """The checked, lowered program of `shape`'s preset (under `config`), without weights: its parameter names and
    shapes and its config (not `loading.prepare`, which refuses random weights of 32 GB in f32)."""
    from linnet.ir.build import bind_config, check_source, lower_program, read_source

    source, preset = SOURCES[shape]
    info = check_source(*read_source(ROOT / "examples" / source), preset)
    return lower_program(bind_config(info, config or {}, labels=("--config",)), "f32", 1, 16)


def _gguf_names(arch: str) -> dict[str, str]:
    """Hugging Face name stem -> GGUF name stem of `arch`'s tensors (the reader's own table, inverted)."""
    from linnet.runtimes.formats.gguf import GGUF_TENSOR_MAPS

    table = GGUF_TENSOR_MAPS[arch]
    return {**{hf: g for g, hf in table.top.items()}, **{hf: g for g, hf in table.block.items()}}


def gguf_name(hf_name: str, names: dict[str, str]) -> str:
    """The GGUF name of a Hugging Face tensor name (`model.layers.3.self_attn.q_proj.weight` ->
    `blk.3.attn_q.weight`)."""
    stem, suffix = hf_name.rsplit(".", 1)
    if stem.startswith("model.layers."):
        _, _, layer, rest = stem.split(".", 3)
        return f"blk.{layer}.{names[rest]}.{suffix}"
    return f"{names[stem]}.{suffix}"


def llama3_rope_freqs(rope: dict, head_dim: int, theta: float) -> np.ndarray:
    """`rope_freqs.weight` as llama.cpp's convert_hf_to_gguf.py (`LlamaModel.generate_extra_tensors`) computes it
    for a llama3 rope scaling, in numpy f32 (tests/runtimes/gguf_writing.py has the torch original)."""
    freqs = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    old = rope["original_max_position_embeddings"]
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, dtype=np.float32)


def _metadata(arch: str, c: dict) -> dict:
    """The `{arch}.*` keys llama.cpp writes for a config (`LlamaModel.set_gguf_parameters`)."""
    keys = {
        "vocab_size": c["vocab_size"],
        "context_length": c["max_position_embeddings"],
        "embedding_length": c["hidden_size"],
        "feed_forward_length": c["intermediate_size"],
        "block_count": c["num_hidden_layers"],
        "attention.head_count": c["num_attention_heads"],
        "attention.head_count_kv": c["num_key_value_heads"],
        "rope.dimension_count": c["head_dim"],
        "attention.key_length": c["head_dim"],
        "attention.value_length": c["head_dim"],
        "rope.freq_base": float(c["rope_theta"]),
        "attention.layer_norm_rms_epsilon": float(c["rms_norm_eps"]),
    }
    return {f"{arch}.{k}": v for k, v in keys.items()}


def q8_0_blocks(w: np.ndarray) -> np.ndarray:
    """u8[N, K / 32 * 34]: `w` f32[N, K] quantized to Q8_0 by gguf-py (`gguf.quants.quantize`: ggml-quants.c's
    `quantize_row_q8_0`, vectorised in numpy)."""
    import gguf

    return gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q8_0)


def _draw_q8(shape: tuple[int, int], seed: list[int], pool: ThreadPoolExecutor) -> np.ndarray:
    """Q8_0 blocks of an N(0, 0.02) matrix `shape`, one seeded stream per chunk of `ROWS_PER_CHUNK` rows."""
    n, k = shape

    def chunk(start: int) -> np.ndarray:
        rng = np.random.default_rng([*seed, start])
        w = rng.standard_normal((min(ROWS_PER_CHUNK, n - start), k), dtype=np.float32)
        w *= 0.02
        return q8_0_blocks(w)

    return np.concatenate(list(pool.map(chunk, range(0, n, ROWS_PER_CHUNK))))


def write_q8_gguf(path: Path, shape: str, config: dict | None = None, seed: int = 0) -> dict:
    """A GGUF of `shape`'s preset (under `config`) at `path`, every matrix Q8_0 from seeded N(0, 0.02) weights, the
    norms 1 (f32), llama.cpp's names and metadata (and Llama 3's `rope_freqs.weight`), streamed tensor by tensor.
    Returns {"file_gb", "write_s"}."""
    import gguf

    program = _program(shape, config)
    c = dict(program.config)
    arch = "qwen3" if shape.startswith("qwen3") else "llama"
    names = _gguf_names(arch)
    t = time.perf_counter()
    w = gguf.GGUFWriter(str(path), arch)
    for key, value in _metadata(arch, c).items():
        (w.add_float32 if isinstance(value, float) else w.add_uint32)(key, value)
    w.add_uint32("general.file_type", int(gguf.LlamaFileType.MOSTLY_Q8_0))
    tensors: list[tuple[str, tuple[int, ...], bool]] = []
    for spec in program.params:
        quantized = len(spec.shape) == 2
        tensors.append((gguf_name(spec.path, names), tuple(spec.shape), quantized))
    rope = c.get("rope_scaling")
    extra = {}
    if isinstance(rope, dict) and rope.get("rope_type") == "llama3":
        extra["rope_freqs.weight"] = llama3_rope_freqs(rope, c["head_dim"], float(c["rope_theta"]))
    q8 = gguf.GGMLQuantizationType.Q8_0
    for name, dims, quantized in tensors:
        if quantized:
            nbytes = dims[0] * dims[1] // 32 * 34
            w.add_tensor_info(name, (dims[0], dims[1] // 32 * 34), np.dtype(np.uint8), nbytes, raw_dtype=q8)
        else:
            w.add_tensor_info(name, dims, np.dtype(np.float32), 4 * int(np.prod(dims)))
    for name, a in extra.items():
        w.add_tensor_info(name, a.shape, a.dtype, a.nbytes)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 4) as pool:
        for index, (_, dims, quantized) in enumerate(tensors):
            w.write_tensor_data(_draw_q8(dims, [seed, index], pool) if quantized else np.ones(dims, np.float32))
    for a in extra.values():
        w.write_tensor_data(a)
    w.close()
    return {"file_gb": round(path.stat().st_size / 1e9, 3), "write_s": round(time.perf_counter() - t, 1)}


def file_bytes(shape: str, config: dict | None = None) -> int:
    """The size of `write_q8_gguf`'s file for `shape`, near enough (34 bytes a block of 32, f32 norms)."""
    program = _program(shape, config)
    values = [(int(np.prod(s.shape)), len(s.shape)) for s in program.params]
    return sum(n * 34 // 32 if rank == 2 else 4 * n for n, rank in values) + (1 << 20)


def _load(
    path: Path,
    shape: str,
    device: str,
    dtype: str,
    numerics: str,
    max_positions: int,
    backend: str = "xla",
    scan_layers: bool | None = None,
):
    """`shape`'s file at `path` through `linnet.load`; `scan_layers` None: the backend's default."""
    import linnet

    source, _ = SOURCES[shape]
    options = {} if scan_layers is None else {"scan_layers": scan_layers}
    return linnet.load(
        ROOT / "examples" / source,
        weights=path,
        backend=backend,
        dtype=dtype,
        numerics=numerics,
        device=device,
        max_positions=max_positions,
        progress=False,
        **options,
    )


def held_bytes(model) -> int:
    """Bytes of the parameters as held: a quantized pair's codes and scales, the other arrays."""
    leaves = [x for v in model.params.values() for x in (v if isinstance(v, tuple) else (v,))]
    return sum(int(x.nbytes) for x in leaves)


def _memory_gb(device: str) -> dict:
    import jax

    stats = jax.devices(device)[0].memory_stats() or {}
    return {
        k.replace("bytes_", "device_").replace("_in_use", "_in_use_gb") + ("" if "in_use" in k else "_gb"): round(
            v / 1e9, 2
        )
        for k, v in stats.items()
        if k in ("bytes_in_use", "peak_bytes_in_use", "bytes_limit")
    }


def _fused(compiled_text: str, n: int, k: int) -> bool:
    """Whether the entry computation of an optimized HLO module makes no float array of n * k values: the dequantized
    matrix is then made inside the dot's fusion (never written to memory), not materialised by a fusion of its own
    (in any shape: [n, k], [k, n], [k / 32, 32, n])."""
    lines = compiled_text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("ENTRY"))
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("}"))
    shapes = re.findall(r"\b(?:f32|bf16)\[([\d,]+)\]", "\n".join(lines[start:end]))
    return not any(math.prod(int(d) for d in dims.split(",")) == n * k for dims in shapes)


def kernel_rows(report, device: str, dry: bool, calibration: dict) -> None:
    """One Q8_0 matrix-vector product (8B's fused gate/up size) several ways: ms, GB/s of the bytes read, whether
    the dequantization was fused into the dot, the distance from the model's form at `highest`; each variant's
    optimized HLO written beside the report (`q8_kernel_<i>.hlo.txt`)."""
    import jax
    import jax.numpy as jnp

    from linnet.compiler.jax.prelude import dequantize, quantized_linear
    from linnet.compiler.jax.q8_kernel import hold, q8_matmul

    n, k = (256, 512) if dry else (28672, 4096)  # dry: K a multiple of the kernel's 256
    dev = jax.devices(device)[0]
    rng = np.random.default_rng(0)
    codes_np = rng.integers(-127, 128, (n, k), dtype=np.int8)
    scales_np = (rng.random((n, k // 32), dtype=np.float32) * 1e-3).astype(np.float16)
    codes, scales = jax.device_put(codes_np, dev), jax.device_put(scales_np, dev)
    codes_t, scales_t = jax.device_put(codes_np.T.copy(), dev), jax.device_put(scales_np.T.copy(), dev)
    x = jax.device_put(rng.standard_normal((1, k), dtype=np.float32), dev)
    dense = jax.device_put(jnp.ones((n, k), jnp.bfloat16), dev)
    q8 = (x, codes, scales)
    kernel_args = (x, codes, jax.device_put(hold(codes_np, scales_np).scales_t, dev))  # scales f32 [K / 32, N]

    def held_k_major(x, ct, st):  # codes held [K, N]: the blocks split a major dim, scales broadcast along it
        w = ct.reshape(k // 32, 32, n).astype(jnp.float32) * st.astype(jnp.float32)[:, None, :]
        return x @ w.reshape(k, n)

    def block_dots(x, ct, st):  # torch_xla's blockwise form (xla_quantized_matmul.py): a dot per block, then scales
        blocks = ct.reshape(k // 32, 32, n).astype(jnp.float32)
        per_block = jnp.einsum("gcn,mgc->mgn", blocks, x.reshape(-1, k // 32, 32))
        return jnp.einsum("gn,mgn->mn", st.astype(jnp.float32), per_block)

    def repeated_scales(x, c, s):  # codes untouched, the scales repeated to [N, K]
        return jnp.einsum("...i,oi->...o", x, c.astype(jnp.float32) * jnp.repeat(s.astype(jnp.float32), 32, axis=1))

    def bf16_operand(x, c, s):
        w = dequantize((c, s), jnp.bfloat16)
        return jnp.einsum("...i,oi->...o", x.astype(jnp.bfloat16), w, preferred_element_type=jnp.float32)

    variants = {
        "q8_0 fast, the model's form (codes [N, K])": (lambda x, c, s: quantized_linear(x, (c, s), None), q8),
        "q8_0 equivalent (highest), the model's form": (lambda x, c, s: quantized_linear(x, (c, s), "highest"), q8),
        "q8_0 fast, scales repeated to [N, K]": (repeated_scales, q8),
        "q8_0 fast, codes held [K, N]": (held_k_major, (x, codes_t, scales_t)),
        "q8_0 fast, codes held [K, N], a dot per block then scales": (block_dots, (x, codes_t, scales_t)),
        "q8_0 fast, dequantized to bf16": (bf16_operand, q8),
        **{  # the Pallas kernel (linnet/compiler/jax/q8_kernel.py) at a few tile targets; interpreted on the CPU
            f"q8_0 {mode}, Pallas kernel tn={tn} tk={tk}{'' if widen else ', int8 codes into the dot'}": (
                functools.partial(q8_matmul, precision=precision, tn=tn, tk=tk, widen_codes=widen),
                kernel_args,
            )
            for mode, precision, tn, tk, widen in (
                ("fast", None, 1024, 512, True),
                ("fast", None, 2048, 1024, True),
                ("fast", None, 512, 2048, True),
                ("fast", None, 4096, 512, True),
                ("fast", None, 1024, 512, False),
                ("equivalent (highest)", "highest", 1024, 512, True),
            )
        },
        "bf16 dense": (lambda x, w: jnp.einsum("...i,oi->...o", x.astype(jnp.bfloat16), w), (x, dense)),
    }
    want = np.asarray(quantized_linear(x, (codes, scales), "highest"))
    for i, (label, (fn, args)) in enumerate(variants.items()):
        quantized = label.startswith("q8")
        read = n * k + n * k // 32 * 2 if quantized else n * k * 2
        row = _time_variant(report, "q8 kernel (one matrix-vector product)", label, fn, args, f"q8_kernel_{i}")
        if row is None:
            continue
        s = row.pop("s")
        row |= {"matrix": f"{n} x {k}", "ms": round(s * 1e3, 4), "gb_read": round(read / 1e9, 4)}
        row |= {
            "gbps": round(read / s / 1e9, 1),
            "of_stream_limit": f"{read / s / 1e9 / calibration['stream_bf16_gbps']:.0%}",
        }
        if quantized:
            row["dequantization_fused"] = _fused(row.pop("hlo"), n, k)
            row["max_abs_diff_vs_highest"] = float(np.max(np.abs(np.asarray(fn(*args)) - want)))
        row.pop("hlo", None)
        report.add("q8 kernel (one matrix-vector product)", row)


def _time_variant(report, section: str, label: str, fn, args, hlo_name: str) -> dict | None:
    """`fn(*args)` jitted: compiled (its optimized HLO written beside the report as `<hlo_name>.hlo.txt`), run once,
    then the median of 20 runs. {"variant", "s", "hlo"}; None, after a row saying why, when it fails to compile (a
    kernel's tiles on this chip): the other variants still run."""
    import jax
    from tpu import median_s, ready

    jitted = jax.jit(fn)
    try:
        text = jitted.lower(*args).compile().as_text()
    except Exception as err:
        report.add(section, {"variant": label, "error": f"{err}"[:1500]})
        return None
    (report.out / f"{hlo_name}.hlo.txt").write_text(f"# {label}\n{text}")
    ready(jitted, *args)
    return {"variant": label, "s": median_s(functools.partial(ready, jitted, *args), 20), "hlo": text}


def prefill_kernel_rows(report, device: str, dry: bool, calibration: dict) -> str | None:
    """A 512-row Q8_0 matrix product (a 512-token prompt through the 8B's fused gate/up, 28672 x 4096) several
    ways: ms and TFLOP/s against the calibration's bf16 matmul (the FLOP bound), the distance from XLA's f32 product
    at `highest`; then 8, 32 and 64 rows through each kernel (GB/s of the codes and scales read, TFLOP/s): where the
    dequantizing kernel overtakes the decode kernel. The first of the dequantizing kernel's `SCALE_EXPAND` ways
    that compiled here (`fast`, default tiles), which the decode rows' prefill then uses; None when neither did
    (they keep the decode kernel, `q8_kernel.PREFILL_ROWS = None`, and say so)."""
    import jax
    import jax.numpy as jnp

    from linnet.compiler.jax.prelude import dequantize, quantized_linear
    from linnet.compiler.jax.q8_kernel import hold, q8_matmul

    section = "q8 prefill kernel"
    m, n, k = (128, 256, 512) if dry else (512, 28672, 4096)  # dry: more rows than PREFILL_ROWS
    dev = jax.devices(device)[0]
    rng = np.random.default_rng(0)
    codes_np = rng.integers(-127, 128, (n, k), dtype=np.int8)
    scales_np = (rng.random((n, k // 32), dtype=np.float32) * 1e-3).astype(np.float16)
    codes, scales = jax.device_put(codes_np, dev), jax.device_put(scales_np, dev)
    x = jax.device_put(rng.standard_normal((m, k), dtype=np.float32), dev)
    kernel_args = (x, codes, jax.device_put(hold(codes_np, scales_np).scales_t, dev))
    dense = jax.device_put(jnp.ones((n, k), jnp.bfloat16), dev)

    def xla_dequantized_bf16(x, c, s):  # the matrix dequantized to bf16 by XLA (made in HBM), then the dot
        w = dequantize((c, s), jnp.bfloat16)
        return jnp.einsum("mk,nk->mn", x.astype(jnp.bfloat16), w, preferred_element_type=jnp.float32)

    def bf16_dense(x, w):
        return jnp.einsum("mk,nk->mn", x.astype(jnp.bfloat16), w)

    kernel = "q8_0 fast, Pallas dequantizing kernel tn=1024 tk=512"
    expands = {kernel: "broadcast", f"{kernel}, scales repeated by a dot": "dot"}
    variants = {
        "bf16 dense (the FLOP reference)": (bf16_dense, (x, dense)),
        "q8_0 fast, XLA: dequantized to bf16, then the dot": (xla_dequantized_bf16, (x, codes, scales)),
        "q8_0 fast, Pallas decode kernel (block-diagonal x), rows in tiles of 64": (
            functools.partial(q8_matmul, prefill=False),
            kernel_args,
        ),
        **{label: (functools.partial(q8_matmul, prefill=True, expand=e), kernel_args) for label, e in expands.items()},
        "q8_0 fast, Pallas dequantizing kernel tn=2048 tk=512": (
            functools.partial(q8_matmul, prefill=True, tn=2048),
            kernel_args,
        ),
        "q8_0 fast, Pallas dequantizing kernel tn=1024 tk=1024": (
            functools.partial(q8_matmul, prefill=True, tk=1024),
            kernel_args,
        ),
        "q8_0 equivalent (highest), Pallas dequantizing kernel tn=1024 tk=512": (
            functools.partial(q8_matmul, prefill=True, precision="highest"),
            kernel_args,
        ),
    }
    want = np.asarray(quantized_linear(x, (codes, scales), "highest"))
    flop = 2 * m * n * k
    tflops = calibration["matmul_bf16_tflops"]
    compiled = []
    for i, (label, (fn, args)) in enumerate(variants.items()):
        row = _time_variant(report, section, label, fn, args, f"q8_prefill_{i}")
        if row is None:
            continue
        s, _ = row.pop("s"), row.pop("hlo")
        compiled += [expands[label]] if label in expands else []
        row |= {"rows": m, "matrix": f"{n} x {k}", "ms": round(s * 1e3, 4), "tflops": round(flop / s / 1e12, 1)}
        row |= {"flop_bound_ms": round(flop / (tflops * 1e12) * 1e3, 4) if tflops else None}
        row |= {"of_flop_bound": f"{flop / s / 1e12 / tflops:.0%}" if tflops else None}
        if label.startswith("q8"):
            row["max_abs_diff_vs_highest"] = float(np.max(np.abs(np.asarray(fn(*args)) - want)))
            row["max_abs_highest"] = float(np.max(np.abs(want)))
        report.add(section, row)
    for rows in (8, 32, 64):  # where the dequantizing kernel overtakes the decode kernel (PREFILL_ROWS is 64)
        for label, fn in (
            ("decode kernel", functools.partial(q8_matmul, prefill=False)),
            ("dequantizing kernel", None),
        ):
            if fn is None and not compiled:
                continue
            fn = fn or functools.partial(q8_matmul, prefill=True, expand=compiled[0])
            args = (x[:rows], *kernel_args[1:])
            row = _time_variant(report, section, f"q8_0 fast, {label}", fn, args, f"q8_rows_{rows}_{label[:3]}")
            if row is None:
                continue
            s, _ = row.pop("s"), row.pop("hlo")
            row |= {"rows": rows, "matrix": f"{n} x {k}", "ms": round(s * 1e3, 4)}
            row |= {
                "gbps": round((n * k + n * k // 32 * 4) / s / 1e9, 1),
                "tflops": round(2 * rows * n * k / s / 1e12, 1),
            }
            report.add(section, row)
    return compiled[0] if compiled else None


def vocab_kernel_rows(report, device: str, dry: bool, calibration: dict) -> None:
    """Qwen3-8B's lm_head (151936 x 4096; 151936 = 128 x 1187, so N's tiles are 128) at one row through the decode
    kernel, K's tile 512 (9496 grid steps) against the 2048 `tiles` now picks (2374): ms against streaming the
    codes and scales at the calibration's GB/s."""
    import jax

    from linnet.compiler.jax.q8_kernel import hold, q8_matmul

    section = "q8 kernel (Qwen3 lm_head, one row)"
    n, k = (128 * 11, 4096) if dry else (151936, 4096)
    dev = jax.devices(device)[0]
    rng = np.random.default_rng(0)
    codes_np = rng.integers(-127, 128, (n, k), dtype=np.int8)
    held = hold(codes_np, (rng.random((n, k // 32), dtype=np.float32) * 1e-3).astype(np.float16))
    args = (jax.device_put(rng.standard_normal((1, k), dtype=np.float32), dev),)
    args += (jax.device_put(held.codes, dev), jax.device_put(held.scales_t, dev))
    read = n * k + n * k // 32 * 4
    for i, (label, tn, tk) in enumerate((("tiles 128 x 512", 128, 512), ("tiles 128 x 2048 (`tiles`)", 1024, 512))):
        row = _time_variant(report, section, label, functools.partial(q8_matmul, tn=tn, tk=tk), args, f"q8_vocab_{i}")
        if row is None:
            continue
        s, _ = row.pop("s"), row.pop("hlo")
        row |= {"matrix": f"{n} x {k}", "ms": round(s * 1e3, 4), "gbps": round(read / s / 1e9, 1)}
        row |= {"stream_ms": round(read / (calibration["stream_bf16_gbps"] * 1e9) * 1e3, 4)}
        report.add(section, row)


def _tmp_gguf(tmp: Path, shape: str, config: dict | None, report, section: str) -> Path | None:
    """Write `shape`'s Q8_0 GGUF under `tmp`, or report why not (the free disk space); the path or None."""
    need = file_bytes(shape, config)
    free = shutil.disk_usage(tmp).free
    if free < need * 1.05:
        report.add(section, {"shape": shape, "skipped": f"{need / 1e9:.1f} GB file, {free / 1e9:.1f} GB free in {tmp}"})
        return None
    path = tmp / f"{shape}-q8_0.gguf"
    report.data.setdefault("q8_files", {})[shape] = write_q8_gguf(path, shape, config)
    return path


def decode_rows(
    report,
    device: str,
    dry: bool,
    calibration: dict,
    shapes: list[str],
    budget_end: float,
    prefill: str,
    backends: list[str] | None = None,
    layers: list[str] | None = None,
) -> None:
    """Each 8B shape on each of `backends` (default `jax`) with its layers each way of `layers` (`LAYERS`' names;
    default the backend's own): load, compile, TTFT against the FLOP bound, decode tok/s against the streaming limit,
    memory, greedy tokens (a later way's against the first's). `prefill` names the kernel the prompt's rows go
    through."""
    backends = backends or ["jax"]
    runs = [(backend, way) for backend in backends for way in layers or [None]]
    for shape in shapes:
        if time.monotonic() > budget_end:
            report.add("q8 decode", {"shape": shape, "skipped": "time budget spent"})
            continue
        tmp = Path(tempfile.mkdtemp(prefix="linnet-q8-"))
        try:
            path = _tmp_gguf(tmp, shape, TINY if dry else None, report, "q8 decode")
            first: dict = {}  # backend -> the first way's (name, last logits, greedy tokens)
            for i, (backend, way) in enumerate(runs if path is not None else []):
                label = {"shape": shape, "backend": backend, "layers": way or "default"}
                if time.monotonic() > budget_end:
                    report.add("q8 decode", {**label, "skipped": "time budget spent"})
                    continue
                try:  # one run's failure (a kernel's compile on this chip) says why; the next still runs
                    _decode_row(
                        report, path, shape, backend, device, dry, calibration, prefill, i == len(runs) - 1, way, first
                    )
                except Exception as err:
                    report.add("q8 decode", {**label, "error": f"{type(err).__name__}: {err}"[:2000]})
                    gc.collect()
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def _decode_row(
    report,
    path: Path,
    shape: str,
    backend: str,
    device: str,
    dry: bool,
    calibration: dict,
    prefill: str,
    last: bool,
    way: str | None = None,
    first: dict | None = None,
):
    """One decode row (`decode_rows`): `shape`'s file at `path` loaded on `backend` (`jax`: the generated module
    jitted with the step's real shapes, the kernels with their rows known when traced; `xla`: the exported entries,
    symbolic rows, the kernel picked when they run), its layers `way` (`LAYERS`; None: the backend's default), `path`
    removed after the `last` load. `first` (backend -> the first way's name, last logits and tokens) gets this run's
    when it has none for `backend`, else the row compares with it."""
    from tpu import greedy, last_logits

    prompt, new = (64, 16) if dry else (512, 128)
    t = time.perf_counter()
    m = _load(path, shape, device, "stored", "fast", prompt + new, backend=backend, scan_layers=LAYERS.get(way))
    load_s = time.perf_counter() - t
    if last:
        path.unlink()  # the model holds its own copy: free the disk (and a tmpfs's memory) now
    held = held_bytes(m)
    ids = np.random.default_rng(2).integers(0, m.vocab_size, prompt).astype(np.int64)
    result, compile_s = greedy(m, ids, new, decode_loop=True)
    ms_step = 1e3 / result.decode_tokens_per_s if result.decode_tokens_per_s else float("nan")
    stream_ms = held / (calibration["stream_bf16_gbps"] * 1e9) * 1e3
    tflops = calibration["matmul_bf16_tflops"]
    params = sum(int(np.prod(s.shape)) for s in m.program.params)
    flop_ms = 2 * params * prompt / (tflops * 1e12) * 1e3 if tflops else float("nan")  # dry: 0.0 TFLOP/s
    seconds = {"load_s": load_s, "compile_cold_s": compile_s}  # the compile: an empty persistent cache
    seconds["compile_from_persistent_cache_s"] = _recompile_s(m, prompt)
    ms = {"ttft": result.prefill_s * 1e3, "ttft_flop_bound": flop_ms, "step": ms_step, "held_stream": stream_ms}
    row = {"shape": shape, "dtype": "stored (q8_0), fast", "backend": backend, "layers": _layers(m, way)}
    row["prefill"] = prefill
    row |= {"params_b": round(params / 1e9, 2)}
    row |= {"held_gb": round(held / 1e9, 3), **report.data["q8_files"][shape]}
    row |= {k: round(v, 1) for k, v in seconds.items()} | {f"{k}_ms": round(v, 3) for k, v in ms.items()}
    row["ttft_of_flop_bound"] = f"{flop_ms / ms['ttft']:.0%}"
    row |= {"decode_tok_s": round(result.decode_tokens_per_s, 2), "of_limit": f"{stream_ms / ms_step:.0%}"}
    row |= {**_memory_gb(device), "greedy_32": " ".join(str(i) for i in result.token_ids[:32])}
    logits = last_logits(m, ids)  # the prompt's last logits (its prefill bucket, compiled above)
    if first is not None and backend in first:  # against the first way's, as the distance rows compare
        name, ref_logits, ref_tokens = first[backend]
        row[f"max_abs_diff_logits_vs_{name}"] = float(np.max(np.abs(logits - ref_logits)))
        row[f"greedy_agree_vs_{name}"] = (
            f"{sum(a == b for a, b in zip(result.token_ids, ref_tokens))}/{len(ref_tokens)}"
        )
    elif first is not None:
        first[backend] = (row["layers"], logits, list(result.token_ids))
    report.add("q8 decode", row)
    _free(m)


def _layers(model, way: str | None) -> str:
    """How `model` runs its layers: `way` when asked for, else what the backend's default gave (stacked params: a
    scan), "(default)" added."""
    scanned = any(".*." in key for key in model.params)
    return way or ("scanned" if scanned else "unrolled") + " (default)"


def _free(model) -> None:
    """Release `model`'s device memory now: its parameters and cache dropped, whoever still holds the model (the
    8B's 8.5 GB and the next row's 7.7 GB of f32 do not fit the chip together)."""
    model.params.clear()
    model.state.clear()
    model.step_executables.clear()
    gc.collect()


def _recompile_s(model, prompt: int) -> float:
    """Seconds to compile `model`'s generation again (prefill bucket, decode step, decode loop) once this process
    has forgotten it (`jax.clear_caches()`, the model's executables dropped): what the persistent compile cache,
    which the cold compile filled, gives a second run."""
    import jax

    from linnet.runtimes.generation import Generator

    jax.clear_caches()
    model.step_executables.clear()
    t = time.perf_counter()
    Generator(model.step_model(decode_loop=True), None).warm_up(prompt)
    return time.perf_counter() - t


def distance_rows(report, device: str, dry: bool, shape: str, budget_end: float) -> None:
    """`shape`'s dims with 4 layers: the stored model under both numerics, on `xla` (XLA's dot over the dequantized
    matrices) and on `jax` (on a TPU the kernels: a 96-token prompt, past `PREFILL_ROWS`, through the dequantizing
    kernel, each new token through the decode kernel), against the same file dequantized in f32 on the device, and
    against the CPU's f32 `equivalent`."""
    from tpu import greedy, last_logits

    if time.monotonic() > budget_end:
        report.add("q8 distance", {"shape": shape, "skipped": "time budget spent"})
        return
    config = TINY if dry else {"num_hidden_layers": 4}
    tmp = Path(tempfile.mkdtemp(prefix="linnet-q8-"))
    try:
        path = _tmp_gguf(tmp, shape, config, report, "q8 distance")
        if path is None:
            return
        label = f"{shape} dims, {config['num_hidden_layers']} layers"
        vocab = _program(shape, config).config["vocab_size"]
        ids = np.random.default_rng(1).integers(0, vocab, 96).astype(np.int64)
        runs = {}
        for name, dev, dtype, numerics, new, backend in (
            ("device f32 equivalent (dequantized)", device, "f32", "equivalent", 32, "xla"),
            ("device stored fast, xla", device, "stored", "fast", 32, "xla"),
            ("device stored equivalent, xla", device, "stored", "equivalent", 32, "xla"),
            ("device stored fast, jax", device, "stored", "fast", 32, "jax"),
            ("device stored equivalent, jax", device, "stored", "equivalent", 32, "jax"),
            ("cpu f32 equivalent (dequantized)", "cpu", "f32", "equivalent", 16, "xla"),
        ):
            if time.monotonic() > budget_end:
                break
            t = time.perf_counter()
            try:  # a run that fails (a kernel's compile on this chip) says why; the others still run
                m = _load(path, shape, dev, dtype, numerics, 192, backend=backend)
                logits, tokens = last_logits(m, ids), greedy(m, ids, new, warm=False)[0].token_ids
                runs[name] = (logits, tokens, time.perf_counter() - t)
                _free(m)
            except Exception as err:
                report.add("q8 distance", {"shape": label, "run": name, "error": f"{type(err).__name__}: {err}"[:1500]})
                gc.collect()
        ref_logits, ref_tokens, _ = runs["device f32 equivalent (dequantized)"]
        cpu = runs.get("cpu f32 equivalent (dequantized)")
        for name, (logits, tokens, s) in runs.items():
            row = {
                "shape": label,
                "run": name,
                "max_abs_diff_vs_device_f32": float(np.max(np.abs(logits - ref_logits))),
                "logits_max_abs": float(np.max(np.abs(ref_logits))),
                "argmax_same": bool(np.argmax(logits) == np.argmax(ref_logits)),
                "greedy_agree_vs_device_f32": f"{sum(a == b for a, b in zip(tokens, ref_tokens))}/{len(tokens)}",
                "s": round(s, 1),
            }
            if cpu is not None:
                row["max_abs_diff_vs_cpu_f32"] = float(np.max(np.abs(logits - cpu[0])))
                row["greedy_agree_vs_cpu_f32"] = f"{sum(a == b for a, b in zip(tokens, cpu[1]))}/{len(cpu[1])}"
            report.add("q8 distance", row)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


SECTIONS = ("kernel", "prefill", "vocab", "decode", "distance")


def q8_rows(
    report,
    device: str,
    dry: bool,
    calibration: dict,
    budget_end: float,
    shapes: list[str] | None = None,
    sections: list[str] | None = None,
    backends: list[str] | None = None,
    layers: list[str] | None = None,
):
    """The rows of this module (its docstring), in order: kernel, prefill kernel, the Qwen3 lm_head's tiles (by
    default only with qwen3-8b in `shapes`), decode per shape (`shapes`, default the Llama 3.1 8B shape) on each of
    `backends` (default `jax`) with its layers each way of `layers` (`LAYERS`' names; default the backend's own),
    distance per shape with 4 layers; `sections` (of `SECTIONS`) keeps only those."""
    from linnet.compiler.jax import q8_kernel

    shapes = shapes or ["llama-3.1-8b"]
    sections = sections or [s for s in SECTIONS if s != "vocab" or "qwen3-8b" in shapes]
    prefill = {"kernel": "the dequantizing kernel (rows past PREFILL_ROWS)"}

    def prefill_rows():
        expand = prefill_kernel_rows(report, device, dry, calibration)
        if expand is None:
            q8_kernel.PREFILL_ROWS = None  # the decode rows' prompts through the decode kernel, as before
            prefill["kernel"] = "the decode kernel (the dequantizing kernel did not compile: its row says why)"
        else:
            q8_kernel.SCALE_EXPAND = expand
            prefill["kernel"] += f", scales repeated by {expand}"

    for section, rows in (
        ("kernel", lambda: kernel_rows(report, device, dry, calibration)),
        ("prefill", prefill_rows),
        ("vocab", lambda: vocab_kernel_rows(report, device, dry, calibration)),
        (
            "decode",
            lambda: decode_rows(
                report, device, dry, calibration, shapes, budget_end, prefill["kernel"], backends, layers
            ),
        ),
        ("distance", lambda: [distance_rows(report, device, dry, shape, budget_end) for shape in shapes]),
    ):
        if section not in sections:
            continue
        try:
            rows()
        except Exception as err:  # a section that fails says why, and the next still runs (one device call)
            report.add(f"q8 {section}", {"error": f"{type(err).__name__}: {err}"[:2000]})
