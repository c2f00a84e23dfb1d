"""The weight-streaming limit of decode: the time to read every weight matrix of a GGUF model once, as a GEMV.

bench/generate_speed.py's `limit-*` rows (issue 21: "decode within 10 % of the weight-streaming limit"). One decode
step of a batch-1 decoder multiplies a [1, in] activation by every layer matrix (q, k, v, o, gate, up, down) and by
the head; at batch 1 those products are GEMVs whose time is the time to stream the weights from memory (or cache),
so a pass over all of them, in a row's dtype, with the fastest GEMV kernel at hand, bounds its decode tok/s from
above (attention over the KV cache, norms, RoPE and the sampling come on top).

- `f32`, `bf16`: the GGUF's matrices dequantized (gguf-py's `dequantize`) and cast; torch `F.linear` on a [1, in]
  activation, torch `mv` on an [in] vector (another kernel path: in bf16 it read twice as fast here), in f32 the
  generated module's column blocks in one `bmm` (`torch-blocks`: MKL's sgemv runs on one thread) and an ONNX
  Runtime graph of `MatMul`s (ONNX Runtime's CPU `MatMul` has no bf16 kernel: that implementation then says so),
  and `inductor`: the products compiled as a compiled decode step compiles them (`inductor_pass`).
- `stored`: the stored bytes, through the fastest weight-only kernel each runtime has for them (measured on this
  machine: the exact variants below the fastest are 5-20x slower, so they would not bound anything). Q4_1: torch's
  CPU int4 kernel (`_weight_int4pack_mm_for_cpu`, groups of 32, w = (q - 8) * scale + zero with zero = m + 8 d:
  exact for Q4_1's w = d q + m; bf16 activations, its fast path: f32 activations take a slow one) and ONNX
  Runtime's `MatMulNBits` (bits 4, block 32, `accuracy_level` 4: int8 activations, MLAS's fast path) with uint8
  zero points, Q4_1's -m / d rounded to a code: the same bytes to stream (codes, scales, half a byte of zero
  point a block), not exactly Q4_1's values (an exact float zero point takes a slow path). Q8_0: `MatMulNBits`
  (bits 8, codes q + 128 around the default zero point 128: exact) and torch's `_weight_int8pack_mm` (one scale
  per row: the same bytes, not Q8_0's per-block scales, so its output is not checked).

Beside the GEMVs, `read`: the same number of bytes summed as f32 by torch (a streaming read with next to no
arithmetic): the machine's read rate at this working-set size, so a GEMV kernel far slower than it shows as a kernel
limit, not the memory's (a decode faster than the GEMV row's bound says the same).

Every implementation's output is checked against numpy on the dequantized weights (`max_rel_error`, on the first
layer matrix and on the head), so a fast pass that computes the wrong thing shows. Imports torch, onnx and
onnxruntime only inside the functions that use them.
"""

from __future__ import annotations

import re
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

# the matrices one decode step reads, by GGUF name (llama.cpp's tensor names)
LAYER_MATRIX = re.compile(r"blk\.\d+\.(attn_q|attn_k|attn_v|attn_output|ffn_gate|ffn_up|ffn_down)\.weight")
BLOCK = 32  # elements per block of Q4_0/Q4_1/Q8_0 (ggml's QK4_1, QK8_0)


@dataclass
class Matrix:
    """One weight matrix as stored: `raw` is [out, bytes per row] uint8 (GGUF's row-major blocks), `qtype` the
    GGML type's name ("Q4_1", "Q8_0", "F32", ...)."""

    name: str
    qtype: str
    out_features: int
    in_features: int
    raw: object  # numpy uint8 [out, bytes per row], or the float array of an unquantized tensor

    def dequantized(self):
        """[out, in] f32 numpy (gguf-py's reference dequantization)."""
        import numpy as np
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize

        values = dequantize(np.asarray(self.raw), GGMLQuantizationType[self.qtype])
        return np.ascontiguousarray(values.reshape(self.out_features, self.in_features), dtype=np.float32)


def decode_matrices(path: str | Path) -> list[Matrix]:
    """The matrices one decode step reads from the GGUF at `path`: every layer matrix, then the head (`output.weight`,
    or `token_embd.weight` when the head is tied to the embedding, as in SmolLM2)."""
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    by_name = {t.name: t for t in reader.tensors}
    names = [t.name for t in reader.tensors if LAYER_MATRIX.fullmatch(t.name)]
    names.append("output.weight" if "output.weight" in by_name else "token_embd.weight")
    out = []
    for name in names:
        t = by_name[name]
        in_features, out_features = (int(d) for d in t.shape)  # GGUF lists ne0 (the row length) first
        out.append(Matrix(name, t.tensor_type.name, out_features, in_features, t.data))
    return out


def stored_bytes(matrices: list[Matrix]) -> int:
    return sum(int(m.raw.nbytes) for m in matrices)


# ---- the passes ---------------------------------------------------------------------------------------------------


def _time_passes(run_pass, seconds: float) -> list[float]:
    """Seconds per pass of `run_pass`: three warm-up passes, then passes for `seconds`."""
    for _ in range(3):
        run_pass()
    times: list[float] = []
    start = time.perf_counter()
    while time.perf_counter() - start < seconds or len(times) < 5:
        t0 = time.perf_counter()
        run_pass()
        times.append(time.perf_counter() - t0)
    return times


def _check(outputs, matrices: list[Matrix], x_by_in: dict, picks: tuple[int, ...]) -> float:
    """The largest relative error (max |y - ref| / max |ref|) of the outputs at `picks` against numpy."""
    import numpy as np

    worst = 0.0
    for i in picks:
        ref = x_by_in[matrices[i].in_features].astype(np.float64) @ matrices[i].dequantized().T.astype(np.float64)
        got = np.asarray(outputs[i], dtype=np.float64).reshape(ref.shape)
        worst = max(worst, float(np.max(np.abs(got - ref)) / max(np.max(np.abs(ref)), 1e-30)))
    return worst


def torch_pass(matrices: list[Matrix], dtype: str, x_by_in: dict, threads: int, seconds: float) -> dict:
    """torch's CPU GEMV for `dtype` over `matrices`: `F.linear` on a [1, in] activation for f32/bf16, the int4/int8
    weight-only kernels for the stored types."""
    return _torch_pass(matrices, dtype, x_by_in, threads, seconds, form="linear")


def torch_mv_pass(matrices: list[Matrix], dtype: str, x_by_in: dict, threads: int, seconds: float) -> dict:
    """`torch_pass` with `torch.mv` on an [in] vector for f32/bf16 (another oneDNN/BLAS path: bf16's `mv` read twice
    as fast as its `F.linear` here); the stored types have no such form (ValueError)."""
    if dtype == "stored":
        raise ValueError("the stored types have no torch.mv form (see torch)")
    return _torch_pass(matrices, dtype, x_by_in, threads, seconds, form="mv")


def torch_blocks_pass(matrices: list[Matrix], dtype: str, x_by_in: dict, threads: int, seconds: float) -> dict:
    """`torch_pass` through the generated PyTorch module's own `linear` (linnet/compiler/torch/prelude.py),
    with the weights laid out as a `fast` module holds them (`fusion.hold_wide_weights_transposed`: a wide matrix, out >
    in, held transposed): each matrix as `threads` blocks in one `torch.bmm`, of its rows, or of `in` for a wide one,
    run in parallel where MKL's sgemv runs on one thread (f32 here: 35 ms a pass as F.linear, 22 ms as blocks of rows;
    bf16's F.linear is already parallel and faster than blocks, so the module keeps it and this form is f32 only:
    ValueError otherwise)."""
    if dtype != "f32":
        raise ValueError("the generated module runs column blocks for f32 only (see torch)")
    return _torch_pass(matrices, dtype, x_by_in, threads, seconds, form="blocks")


def inductor_pass(matrices: list[Matrix], dtype: str, x_by_in: dict, threads: int, seconds: float) -> dict:
    """The pass as a compiled decode step runs its linears: `F.linear` of each [1, in] activation, all in one function
    compiled by inductor with Linnet's decode options (`linnet.compiler.torch.inductor_passes.DECODE_OPTIONS`: each
    one-row product becomes a reduction that inductor writes as one parallel, vectorised loop streaming the weight
    once), each matrix with an input of its own. On a 2-core AVX-512 Xeon it read SmolLM2's bf16 matrices in 19.6
    ms a pass, where torch.mv took 20.8 and F.linear 28.3 (bench/results/generate_speed_intel_r17b_limits.md);
    with one input shared by the matrices inductor merged their loops and took 11.9-13.4 ms, which no real step can
    do. f32 and bf16; the stored types have no such form (ValueError)."""
    if dtype == "stored":
        raise ValueError("the stored types have no compiled form here (see torch)")
    import torch
    import torch.nn.functional as F

    from linnet.compiler.torch.inductor_passes import DECODE_OPTIONS

    torch.set_num_threads(threads)
    act = {"f32": torch.float32, "bf16": torch.bfloat16}[dtype]
    xs = {k: torch.from_numpy(v).to(act) for k, v in x_by_in.items()}
    # an input of its own for each matrix: products sharing one input tensor are merged into shared loops, which no
    # real step can do (each layer reads the previous one's output)
    inputs = [xs[m.in_features].clone() for m in matrices]
    weights = [torch.from_numpy(m.dequantized()).to(act) for m in matrices]

    def products(inputs, weights):
        return [F.linear(x, w) for x, w in zip(inputs, weights)]

    compiled = torch.compile(products, fullgraph=True, dynamic=False, options=DECODE_OPTIONS)

    def run_pass():
        with torch.no_grad():
            return compiled(inputs, weights)

    outputs = [y.float().numpy() for y in run_pass()]  # compiles
    times = _time_passes(run_pass, seconds)
    error = _check(outputs, matrices, x_by_in, (0, len(matrices) - 1))
    kernels = ["inductor (one-row products as reductions: DECODE_OPTIONS)"]
    return {"kernels": kernels, "pass_s": times, "max_rel_error": error}


def _torch_pass(matrices: list[Matrix], dtype: str, x_by_in: dict, threads: int, seconds: float, form: str):
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(threads)
    linear = generated_linear() if form == "blocks" else None
    act = {"f32": torch.float32, "bf16": torch.bfloat16, "stored": torch.bfloat16}[dtype]
    xs = {k: torch.from_numpy(v).to(act) for k, v in x_by_in.items()}
    calls = []
    kernels = set()
    for m in matrices:
        x = xs[m.in_features]
        if dtype != "stored" or m.qtype not in ("Q4_1", "Q8_0"):
            w = torch.from_numpy(m.dequantized()).to(act)
            if form == "mv":
                calls.append(lambda x=x[0], w=w: torch.mv(w, x))
            elif form == "blocks":
                if m.out_features > m.in_features:
                    w = w.t().contiguous().t()  # [in, out] in memory, as `fast` holds it
                calls.append(lambda x=x, w=w: linear(x, w))
            else:
                calls.append(lambda x=x, w=w: F.linear(x, w))
            blocks = "torch.bmm over blocks (of rows; of in where held transposed)"
            kernels.add({"mv": "torch.mv", "blocks": blocks}.get(form, "F.linear"))
        elif m.qtype == "Q4_1":
            codes, d, mins = _q4_1_fields(m)
            packed = torch._convert_weight_to_int4pack_for_cpu(torch.from_numpy(codes).to(torch.int32), 4)
            d_t = torch.from_numpy(d).t()  # [in / 32, out]
            scales_zeros = torch.stack([d_t, torch.from_numpy(mins).t() + 8 * d_t], dim=-1).to(act).contiguous()
            calls.append(lambda x=x, p=packed, sz=scales_zeros: torch._weight_int4pack_mm_for_cpu(x, p, BLOCK, sz))
            kernels.add("_weight_int4pack_mm_for_cpu")
        else:
            codes, d = _q8_0_fields(m)
            row_scale = torch.from_numpy(d.max(axis=1)).to(act)  # one scale per row: a stand-in, see the docstring
            w8 = torch.from_numpy(codes)
            calls.append(lambda x=x, w=w8, s=row_scale: torch._weight_int8pack_mm(x, w, s))
            kernels.add("_weight_int8pack_mm (per-row scales)")

    def run_pass():
        return [c() for c in calls]

    outputs = [y.float().numpy() for y in run_pass()]
    checked = (0,) if dtype == "stored" and matrices[-1].qtype == "Q8_0" else (0, len(matrices) - 1)
    times = _time_passes(run_pass, seconds)
    return {"kernels": sorted(kernels), "pass_s": times, "max_rel_error": _check(outputs, matrices, x_by_in, checked)}


def generated_linear(name: str = "linear"):
    """The generated PyTorch module's `linear` (linnet/compiler/torch/prelude.py), or its `linears` (which calls
    that `linear`): the function the module runs."""
    from linnet.compiler.torch import prelude

    return getattr(prelude, name)


def onnxruntime_pass(matrices: list[Matrix], dtype: str, x_by_in: dict, threads: int, seconds: float) -> dict:
    """ONNX Runtime's fastest CPU GEMV for `dtype`: one graph of `MatMul`s (f32/bf16) or `MatMulNBits` (the
    stored types), one output per matrix, run sequentially on `threads` intra-op threads."""
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    elem = {"f32": TensorProto.FLOAT, "bf16": TensorProto.BFLOAT16, "stored": TensorProto.FLOAT}[dtype]
    inputs = [helper.make_tensor_value_info(f"x{k}", elem, [1, k]) for k in sorted(x_by_in)]
    nodes, inits, outputs, ops = [], [], [], set()
    for i, m in enumerate(matrices):
        y = f"y{i}"
        outputs.append(helper.make_tensor_value_info(y, elem, [1, m.out_features]))
        if dtype == "stored" and m.qtype in ("Q4_1", "Q8_0"):
            blob, scales, zeros, bits = _matmul_nbits_fields(m)
            names = [f"w{i}", f"s{i}"] + ([f"z{i}"] if zeros is not None else [])
            inits += [numpy_helper.from_array(blob, names[0]), numpy_helper.from_array(scales, names[1])]
            if zeros is not None:
                inits.append(numpy_helper.from_array(zeros, names[2]))
            nodes.append(
                helper.make_node(
                    "MatMulNBits",
                    [f"x{m.in_features}", *names],
                    [y],
                    domain="com.microsoft",
                    K=m.in_features,
                    N=m.out_features,
                    bits=bits,
                    block_size=BLOCK,
                    accuracy_level=4,
                )
            )
            ops.add(f"MatMulNBits (bits {bits})")
            continue
        w_t = np.ascontiguousarray(m.dequantized().T)  # MatMul's B is [in, out]
        if dtype == "bf16":
            inits.append(_bf16_initializer(w_t, f"w{i}"))
        else:
            inits.append(numpy_helper.from_array(w_t, f"w{i}"))
        nodes.append(helper.make_node("MatMul", [f"x{m.in_features}", f"w{i}"], [y]))
        ops.add("MatMul")
    graph = helper.make_graph(nodes, "weight_streaming", inputs, outputs, inits)
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    )
    model.ir_version = 10
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    del model, graph, inits
    if dtype == "bf16":
        feeds = {f"x{k}": _bf16_ortvalue(v) for k, v in x_by_in.items()}
    else:
        feeds = {f"x{k}": v for k, v in x_by_in.items()}

    def run_pass():
        return session.run(None, feeds)

    first = run_pass()
    outs = [np.asarray(o, dtype=np.float32) if dtype != "bf16" else _bf16_to_f32(o) for o in first]
    times = _time_passes(run_pass, seconds)
    return {"kernels": sorted(ops), "pass_s": times, "max_rel_error": _check(outs, matrices, x_by_in, (0, -1))}


def read_pass(nbytes: int, threads: int, seconds: float) -> dict:
    """Seconds to read `nbytes` once: one contiguous f32 buffer of that size summed by torch on `threads` threads."""
    import torch

    torch.set_num_threads(threads)
    buffer = torch.ones(nbytes // 4, dtype=torch.float32)
    times = _time_passes(lambda: buffer.sum(), seconds)
    return {"ms_per_pass": 1000 * statistics.median(times), "ms_per_pass_min": 1000 * min(times), "passes": len(times)}


def measure(path: str | Path, dtype: str, threads: int, seconds: float = 2.0) -> dict:
    """The weight-streaming limit of the GGUF at `path` in `dtype` ("f32", "bf16" or "stored"): every
    implementation's median seconds per pass, the faster one's ms, GB/s over the bytes one pass reads, and the
    decode tok/s that bounds (1 / seconds per pass); `read`: the same bytes read without a GEMV (`read_pass`). An
    implementation that fails records its error."""
    import numpy as np

    matrices = decode_matrices(path)
    n_params = sum(m.out_features * m.in_features for m in matrices)
    nbytes = {"f32": 4 * n_params, "bf16": 2 * n_params, "stored": stored_bytes(matrices)}[dtype]
    rng = np.random.default_rng(0)
    x_by_in = {k: rng.standard_normal((1, k)).astype(np.float32) for k in {m.in_features for m in matrices}}
    impls: dict[str, dict] = {}
    runs = [("torch", torch_pass), ("torch-mv", torch_mv_pass), ("onnxruntime", onnxruntime_pass)]
    runs = runs + [("torch-blocks", torch_blocks_pass)] if dtype == "f32" else runs
    runs = runs + [("inductor", inductor_pass)]
    for name, run in runs if dtype != "stored" else [runs[0], runs[2]]:
        try:
            r = run(matrices, dtype, x_by_in, threads, seconds)
        except Exception as err:  # a kernel this build lacks: recorded, the other implementation still counts
            impls[name] = {"error": f"{type(err).__name__}: {str(err).strip().splitlines()[0][:300]}"}
            continue
        r["ms_per_pass"] = 1000 * statistics.median(r["pass_s"])
        r["ms_per_pass_min"] = 1000 * min(r["pass_s"])
        r["passes"] = len(r.pop("pass_s"))
        impls[name] = r
    ok = {k: v for k, v in impls.items() if "error" not in v}
    result = {
        "dtype": dtype,
        "matrices": len(matrices),
        "weight_elements": n_params,
        "bytes_per_pass": nbytes,
        "stored_types": sorted({m.qtype for m in matrices}),
        "implementations": impls,
    }
    try:
        read = read_pass(nbytes, threads, seconds)
        read.update(gb_per_s=nbytes / (read["ms_per_pass"] / 1000) / 1e9, bound_tok_s=1000 / read["ms_per_pass"])
        result["read"] = read
    except Exception as err:  # recorded, as an implementation's
        result["read"] = {"error": f"{type(err).__name__}: {err}"}
    if ok:
        best = min(ok, key=lambda k: ok[k]["ms_per_pass"])
        ms = ok[best]["ms_per_pass"]
        result.update(fastest=best, ms_per_pass=ms, gb_per_s=nbytes / (ms / 1000) / 1e9, bound_tok_s=1000 / ms)
    return result


# ---- the stored layouts -------------------------------------------------------------------------------------------


def _groups(m: Matrix):
    """`m`'s blocks in Linnet's affine group form (`linnet.runtimes.formats.gguf_quants`, what `--dtype stored`
    packs)."""
    import numpy as np

    from linnet.runtimes.formats.gguf_quants import group_quantized

    return group_quantized(np.asarray(m.raw), m.qtype.lower(), (m.out_features, m.in_features))


def _q4_1_fields(m: Matrix):
    """Q4_1 as codes [out, in] uint8, d and m [out, in / 32] f32 (w = code * d + m)."""
    g = _groups(m)
    return g.codes, g.scales, g.offsets


def _q8_0_fields(m: Matrix):
    """Q8_0 as codes [out, in] int8 and d [out, in / 32] f32 (w = code * d)."""
    import numpy as np

    g = _groups(m)
    return (g.codes.astype(np.int16) - 128).astype(np.int8), g.scales


def _matmul_nbits_fields(m: Matrix):
    """(B [out, blocks, blob] uint8, scales [out, blocks] f32, zero points or None, bits) for ONNX Runtime's
    MatMulNBits, whose codes are packed low nibble first along K."""
    import numpy as np

    if m.qtype == "Q4_1":
        codes, d, mins = _q4_1_fields(m)
        pairs = codes.reshape(m.out_features, -1, BLOCK // 2, 2)
        blob = (pairs[..., 0] | (pairs[..., 1] << 4)).astype(np.uint8)
        safe = np.where(d == 0, 1.0, d)
        zero = np.clip(np.rint(-mins / safe), 0, 15).astype(np.uint8)  # [out, blocks]; two a byte, low first
        zero = zero.reshape(m.out_features, -1)
        if zero.shape[1] % 2:
            zero = np.concatenate([zero, np.zeros_like(zero[:, :1])], axis=1)
        return blob, d, (zero[:, 0::2] | (zero[:, 1::2] << 4)).astype(np.uint8), 4
    codes, d = _q8_0_fields(m)
    blob = (codes.astype(np.int16) + 128).astype(np.uint8).reshape(m.out_features, -1, BLOCK)
    return blob, d, None, 8


def _bf16_bits(values):
    import torch

    return torch.from_numpy(values).to(torch.bfloat16).view(torch.int16).numpy().view("uint16")


def _bf16_initializer(values, name: str):
    from onnx import TensorProto, helper

    return helper.make_tensor(name, TensorProto.BFLOAT16, values.shape, _bf16_bits(values).tobytes(), raw=True)


def _bf16_ortvalue(values):
    import onnxruntime as ort

    return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(_bf16_bits(values), 16)  # 16: TensorProto.BFLOAT16


def _bf16_to_f32(values):
    import numpy as np

    return (np.asarray(values).view(np.uint16).astype(np.uint32) << 16).view(np.float32)
