"""Every composite's native form against its decomposed body, per backend and per numerics.

The passes decide which composites a backend runs natively (`PassOptions.native`) and which
attention variants apply (`linnet.ir.attention`); `PassOptions.decompose` asks for a composite's
body instead. Here each backend runs the same program both ways, on the same inputs and
weights, and the outputs must agree: to float rounding where the native form is what the
reference computes (`equivalent`), and closely under `fast` (fused kernels). `linear` is
compared with the `x @ transpose(w)` it is recognised from."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from linnet.compiler.torch.codegen import TorchModule
from linnet.ir import build
from linnet.ir.pipeline import NUMERICS, PassOptions, prepare
from tests.conftest import EXAMPLES

# A small model per composite: `f` takes the composite's tensor arguments.
COMPOSITE_SOURCES = {
    "softmax": "entry fn f(x: [B, S, c.d]) -> [B, S, c.d] { softmax(x) }",
    "silu": "entry fn f(x: [B, S, c.d]) -> [B, S, c.d] { silu(x) }",
    "gelu": "entry fn f(x: [B, S, c.d]) -> [B, S, c.d] { gelu(x) }",
    "gelu_tanh": "entry fn f(x: [B, S, c.d]) -> [B, S, c.d] { gelu_tanh(x) }",
    "rms_norm": "entry fn f(x: [B, S, c.d]) -> [B, S, c.d] { rms_norm(x, w, 1e-5) }",
    "layer_norm": "entry fn f(x: [B, S, c.d]) -> [B, S, c.d] { layer_norm(x, w, 1e-5) }",
}
TEMPLATE = "config C {{ d: int = 16 }}\nmodel M(c: C) {{\n    w: [c.d]\n    {entry}\n}}\n"
# Attention in every variant a backend emits: llama (grouped, G = 2, upcast) with a KV cache long
# enough for ONNX's key trimming and blocked prefill, and a power-of-two scale (head_dim 16).
LLAMA = dict(
    vocab_size=64, hidden_size=64, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16,
)  # fmt: skip
LLAMA_POSITIONS = 160
# Mistral's sliding window, shorter than the long prefill (so its later query blocks and trimmed keys start
# behind masked keys) and than the decode positions.
MISTRAL = dict(LLAMA, sliding_window=48)
DECODERS = {"llama": ("llama.linnet", LLAMA), "mistral": ("mistral.linnet", MISTRAL)}
BACKENDS = ("torch", "jax", "onnx")
TOLERANCE = {"equivalent": dict(rtol=1e-5, atol=2e-6), "fast": dict(rtol=2e-3, atol=2e-3)}


def passes(backend: str) -> PassOptions:
    if backend == "torch":
        pytest.importorskip("torch")
        from linnet.compiler.torch.codegen import PASSES
    elif backend == "jax":
        pytest.importorskip("jax")
        from linnet.compiler.jax.codegen import PASSES
    else:
        pytest.importorskip("onnxruntime")
        from linnet.compiler.onnx.lower import PASSES
    return PASSES


def random_params(program, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {p.path: (rng.standard_normal(p.shape) * 0.5 + (1.0 if len(p.shape) == 1 else 0.0)).astype(np.float32)
            for p in program.params}  # fmt: skip


class Runner:
    """Runs a program's entries on one backend with given pass options (numpy in and out)."""

    def __init__(self, backend: str, program, options: PassOptions, numerics: str, params: dict):
        self.backend, self.program, self.numerics, self.params = backend, program, numerics, params
        prepared = prepare(program, options, numerics)
        if backend == "torch":
            import torch

            from linnet.compiler.torch.codegen import TorchModule

            ns: dict = {}
            exec(TorchModule(prepared, numerics).write(), ns)
            self.model = ns[program.root]("cpu")
            self.model.load_state_dict({k: torch.from_numpy(v) for k, v in params.items()}, strict=False, assign=True)
        elif backend == "jax":
            import jax

            from linnet.compiler.jax.codegen import module_source

            jax.config.update("jax_enable_x64", True)  # the generated code's i64, run here without Linnet's scope
            ns = {}
            exec(module_source(prepared, numerics), ns)
            self.ns, self.jax = ns, jax
            self.arrays = ns["fuse_weights"](dict(params))
            held = {t.path: prepared.state_layouts.get(t.path, t.shape) for t in program.state}
            self.state = {k: np.zeros(shape, np.float32) for k, shape in held.items()}
        else:
            import onnxruntime as ort

            from linnet.compiler.onnx.lower import cache_names, lower_entry, to_proto

            self.state = {t.path: np.zeros(t.shape, np.float32) for t in program.state}
            self.names = cache_names(program)
            self.sessions = {}
            for entry in program.entries:
                proto = to_proto(lower_entry(program, entry, params, numerics, passes=options))
                so = ort.SessionOptions()
                so.intra_op_num_threads = 1
                self.sessions[entry] = ort.InferenceSession(proto.SerializeToString(), so)

    def run(self, entry: str, *inputs: np.ndarray) -> np.ndarray:
        if self.backend == "torch":
            import torch

            with torch.inference_mode():
                out = getattr(self.model, entry)(*[torch.from_numpy(np.asarray(a)) for a in inputs])
            return out.numpy()
        if self.backend == "jax":
            out = self.ns[entry]({**self.arrays, **self.state}, *inputs)
            if self.program.state_written(entry):
                *out, new = out
                self.state.update({k: np.asarray(v) for k, v in new.items()})
                out = out[0]
            return np.asarray(out)
        sess = self.sessions[entry]
        names = [i.name for i in sess.get_inputs()]
        feed = dict(zip(names, inputs))
        for path, (past, _) in self.names.items():
            if past in names:
                feed[past] = self.state[path]
        outs = sess.run(None, feed)
        present = {o.name: v for o, v in zip(sess.get_outputs(), outs)}
        for path, (_, name) in self.names.items():
            if name in present:
                self.state[path] = present[name]
        return outs[0]


def both(backend: str, program, numerics: str, composite: str):
    """(native runner, body runner), or a skip when the backend runs `composite` as its body
    under `numerics` anyway."""
    options = passes(backend)
    if numerics not in options.native.get(composite, ()):
        pytest.skip(f"{backend} runs {composite} as its body under {numerics}: nothing native to compare")
    params = random_params(program)
    native = Runner(backend, program, options, numerics, params)
    body = Runner(backend, program, replace(options, decompose=frozenset({composite})), numerics, params)
    return native, body


@pytest.mark.parametrize("numerics", NUMERICS)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("composite", sorted(COMPOSITE_SOURCES))
def test_native_composite_equals_its_body(composite, backend, numerics):
    program = build(TEMPLATE.format(entry=COMPOSITE_SOURCES[composite]))
    native, body = both(backend, program, numerics, composite)
    x = np.random.default_rng(1).standard_normal((2, 5, 16)).astype(np.float32) * 3
    np.testing.assert_allclose(native.run("f", x), body.run("f", x), **TOLERANCE[numerics])


@pytest.mark.parametrize("numerics", NUMERICS)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("decoder", sorted(DECODERS))
def test_native_attention_equals_its_body_in_every_variant(decoder, backend, numerics):
    """forward (no cache, 60 tokens), a long prefill (ONNX: blocked, keys trimmed; PyTorch: keys trimmed),
    a short prefill, and decode steps (ONNX: keys first, in place over a cache 85 % full); then a new request
    in the same row, whose decode steps attend 13 % of the cache (ONNX: keys trimmed first, the stale keys
    of the first request after them); causal, and with a sliding window shorter than the prefill and than the
    decode positions (Mistral)."""
    file, config = DECODERS[decoder]
    program = build(EXAMPLES / file, config=config, max_positions=LLAMA_POSITIONS)
    native, body = both(backend, program, numerics, "attention")
    ids = np.random.default_rng(2).integers(0, 64, (1, 140))
    # logits after a layer and the head: grouped dots round differently from repeated ones
    tol = dict(rtol=1e-4, atol=2e-5) if numerics == "equivalent" else TOLERANCE[numerics]
    np.testing.assert_allclose(native.run("forward", ids[:, :60]), body.run("forward", ids[:, :60]), **tol)
    for start, stop in ((0, 130), (130, 135), (135, 136), (136, 137), (0, 20), (20, 21), (21, 22)):
        args = (ids[:, start:stop], np.array([start]), np.array([0]))
        np.testing.assert_allclose(native.run("step", *args), body.run("step", *args), **tol)


@pytest.mark.parametrize("backend", BACKENDS)
def test_linear_equals_the_matmul_it_replaces(backend):
    """`linear(x, w)` (recognised from `x @ transpose(w)`, and fused with its neighbours where the
    backend fuses) against the matmul of a transpose, with the recognition turned off."""
    source = TEMPLATE.format(entry="entry fn f(x: [B, S, c.d]) -> [B, S, c.d] { x @ transpose(m) + x @ transpose(n) }")
    source = source.replace("w: [c.d]", "m: [c.d, c.d]\n    n: [c.d, c.d]")
    program = build(source)
    options = passes(backend)
    params = random_params(program)
    x = np.random.default_rng(3).standard_normal((2, 5, 16)).astype(np.float32)
    recognised = Runner(backend, program, options, "equivalent", params)
    plain = Runner(backend, program, replace(options, linear=False, fuse_linear_weights=False), "equivalent", params)
    assert any(op.name == "linear" for op in prepare(program, options).entries["f"].ops)
    np.testing.assert_allclose(recognised.run("f", x), plain.run("f", x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("numerics", NUMERICS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_native_gather_matmul_equals_its_body(backend, numerics):
    """`gather_matmul` (a mixture of experts' sparse form) natively (PyTorch: rows sorted by expert, one
    `grouped_mm`) against its body (the chosen matrices gathered), with each token's 2 rows expanded from one
    (GPT-OSS's form), experts chosen twice by one token, by several tokens, and not at all."""
    source = TEMPLATE.format(
        entry="entry fn f(x: [B, S, c.d], indices: i64[B, S, 2]) -> [B, S, 2, 8] {\n"
        "        gather_matmul(expand(unsqueeze(x, 2), [B, S, 2, c.d]), experts, indices)\n    }"
    ).replace("w: [c.d]", "experts: [6, c.d, 8]")
    program = build(source)
    native, body = both(backend, program, numerics, "gather_matmul")
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 5, 16)).astype(np.float32) * 3
    indices = rng.choice([0, 2, 3, 5], size=(2, 5, 2))
    indices[0, 0] = 3
    np.testing.assert_allclose(native.run("f", x, indices), body.run("f", x, indices), **TOLERANCE["equivalent"])


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_torch_rms_norm_is_its_body_bit_for_bit(dtype):
    """PyTorch's native RMS norm under `equivalent` (`F.rms_norm` between transformers' casts) computes exactly what
    the op-by-op body computes (f32 normalisation, cast back, `weight *` in the working dtype): no tolerance."""
    torch = pytest.importorskip("torch")
    source = TEMPLATE.format(entry=COMPOSITE_SOURCES["rms_norm"]).replace("d: int = 16", "d: int = 576")
    program = build(source, dtype=dtype)
    native, body = both("torch", program, "equivalent", "rms_norm")
    assert "F.rms_norm" in TorchModule(prepare(program, passes("torch")), "equivalent").write()
    rng = np.random.default_rng(4)
    weight = torch.from_numpy(rng.standard_normal(576).astype(np.float32) + 1).to(native.model.w.dtype)
    x = torch.from_numpy(rng.standard_normal((2, 33, 576)).astype(np.float32) * 3).to(weight.dtype)
    for runner in (native, body):
        runner.model.load_state_dict({"w": weight}, strict=False, assign=True)
    with torch.inference_mode():
        assert torch.equal(native.model.f(x), body.model.f(x))


def test_onnx_fast_rms_norm_is_one_rms_normalization():
    """Under `fast` an f32 `rms_norm` on ONNX Runtime is one RMSNormalization (opset 23; the body is six ops:
    Pow, ReduceMean, Add, Sqrt, Reciprocal, Mul), and it computes x / sqrt(mean(x ** 2) + eps) * weight."""
    pytest.importorskip("onnxruntime")
    from linnet.compiler.onnx.lower import PASSES, lower_entry

    program = build(TEMPLATE.format(entry=COMPOSITE_SOURCES["rms_norm"]))
    params = random_params(program)
    ops = {n.op_type for n in lower_entry(program, "f", params, "fast", passes=PASSES).graph}
    assert "RMSNormalization" in ops and not ops & {"ReduceMean", "Pow", "Sqrt"}
    x = np.random.default_rng(2).standard_normal((2, 5, 16)).astype(np.float32) * 3
    y = Runner("onnxruntime", program, PASSES, "fast", params).run("f", x)
    x64 = x.astype(np.float64)
    want = x64 / np.sqrt((x64**2).mean(-1, keepdims=True) + 1e-5) * params["w"]
    np.testing.assert_allclose(y, want, rtol=1e-6, atol=1e-6)
