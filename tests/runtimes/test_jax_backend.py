"""The JAX/XLA backend on a small Llama (8 query heads over 2 KV heads, random weights): cached
steps equal the uncached forward, padded prefill is exact, decode never recompiles, the
KV cache is donated, and a serialized StableHLO artifact runs in a fresh process without
its source. Parity with transformers is in test_parity_jax.py."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from tests.runtimes.conftest import LLAMA

jax = pytest.importorskip("jax")
pytestmark = pytest.mark.jax

import linnet.jax as lj  # noqa: E402
from linnet.runtimes.backends.jax_backend import bucket_for, buckets  # noqa: E402
from linnet.runtimes.generation import Generator  # noqa: E402
from linnet.runtimes.sampling import SamplingParams  # noqa: E402

SMALL = {
    "vocab_size": 96,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-5,
}
MAX_POSITIONS = 64


def small(mode: str = "generated", **kw):
    return lj.load(
        LLAMA, config=SMALL, mode=mode, max_positions=MAX_POSITIONS, random_weights=True, seed=1, progress=False, **kw
    )


@pytest.fixture(scope="module", params=["generated", "stablehlo"])
def model(request):
    return small(request.param)


def test_buckets():
    assert buckets(768) == [16, 32, 64, 128, 256, 512, 768]
    assert bucket_for(1, 768) == 16 and bucket_for(17, 768) == 32 and bucket_for(600, 768) == 768
    assert buckets(16) == [16]


def test_step_equals_forward_and_padded_prefill_is_exact(model):
    rng = np.random.default_rng(0)
    ids = rng.integers(0, SMALL["vocab_size"], (1, 21)).astype(np.int64)
    full = np.asarray(model.forward(ids))[0]
    sm = model.step_model()
    t = lambda *x: np.array(x, dtype=np.int64)  # noqa: E731
    # Prefill 13 tokens through the bucketed path (12 padded to 16, then the 13th as a decode step).
    got = [sm.step(ids[:, :13], t(0), t(0))[0]]
    for p in range(13, ids.shape[1]):
        got.append(sm.step(ids[:, p : p + 1], t(p), t(0))[0])
    delta = np.abs(np.stack(got) - full[12:]).max()
    print(f"max|Δ| small Llama ({model.mode}) step vs forward: {delta:.3e}")
    assert delta < 1e-5
    # The unpadded entry (S = 13 exactly) agrees with the padded path.
    direct = np.asarray(model.step(ids[:, :13], t(0), t(0)))[0]
    assert np.abs(direct - full[12]).max() < 1e-5
    # A prompt whose length is a bucket (16) runs unpadded in one step, then decodes on from there.
    got = [sm.step(ids[:, :16], t(0), t(0))[0]]
    for p in range(16, ids.shape[1]):
        got.append(sm.step(ids[:, p : p + 1], t(p), t(0))[0])
    assert np.abs(np.stack(got) - full[15:]).max() < 1e-5


def test_a_padded_chunk_past_the_cache_end_drops_its_tail(model):
    """A prefill chunk near the end of the cache, padded to its bucket past the last position: the positions that
    fit are written (a prefill writes a row's block in place where it fits; here, one window per position, the
    rest dropped), so the logits equal the uncached forward's. (Two rows' prefill: test_conformance.py.)"""
    rng = np.random.default_rng(4)
    ids = rng.integers(0, SMALL["vocab_size"], (1, MAX_POSITIONS)).astype(np.int64)
    full = np.asarray(model.forward(ids))[0]
    sm = model.step_model()
    t = lambda *x: np.array(x, dtype=np.int64)  # noqa: E731
    sm.step(ids[:, :50], t(0), t(0))
    tail = sm.step(ids[:, 50:60], t(50), t(0))[0]  # 9 tokens padded to 16 at position 50: 66 > 64
    assert np.abs(tail - full[59]).max() < 1e-5
    assert np.abs(sm.step(ids[:, 60:61], t(60), t(0))[0] - full[60]).max() < 1e-5


@pytest.mark.parametrize("mode", ["generated", "stablehlo"])
def test_decode_never_recompiles(mode):
    model = small(mode)
    step_model = model.step_model()
    gen = Generator(step_model, None)
    gen.generate([1, 2, 3, 4, 5], SamplingParams(max_new_tokens=4))
    assert step_model.compiled_shapes == [(1, 1), (1, 16)]  # one prefill bucket (16) and decode (S = 1)
    # Other prompt lengths in the same bucket, and many more decode steps: nothing new.
    for n in (3, 9, 15):
        gen.generate(list(range(1, n + 1)), SamplingParams(max_new_tokens=20))
    assert step_model.compiled_shapes == [(1, 1), (1, 16)]
    # A longer prompt compiles its bucket once.
    gen.generate(list(range(1, 21)), SamplingParams(max_new_tokens=3))
    gen.generate(list(range(1, 25)), SamplingParams(max_new_tokens=3))
    assert step_model.compiled_shapes == [(1, 1), (1, 16), (1, 32)]


@pytest.mark.parametrize("mode", ["generated", "stablehlo"])
def test_warm_up_compiles_what_generation_runs(mode):
    # After warm_up, generating from a prompt of that length compiles nothing more, and gives the same tokens.
    prompt = [7, 3, 9, 1, 4, 4, 2, 8, 5, 6, 1, 3, 3, 7, 2, 9, 8, 1, 2]
    cold = Generator(small(mode).step_model(), None).generate(prompt, SamplingParams(max_new_tokens=6))
    step_model = small(mode).step_model()
    gen = Generator(step_model, None, prefill_chunk=8)
    gen.warm_up(len(prompt))
    warmed = list(step_model.compiled_shapes)
    assert warmed == [(1, 1), (1, 16)]  # chunks of 8, 8 and 3 tokens: buckets 16 (7 and 2 padded), decode
    assert gen.generate(prompt, SamplingParams(max_new_tokens=6)).token_ids == cold.token_ids
    assert step_model.compiled_shapes == warmed


def test_cache_is_donated(model):
    before = dict(model.state)
    model.step_model().step(np.array([[3]]), np.array([0]), np.array([0]))
    assert all(before[k].is_deleted() for k in before), "the old cache buffers were donated to the step"
    assert set(model.state) == set(before)


@pytest.mark.slow
def test_generation_matches_between_modes_and_with_chunked_prefill():
    prompt = [7, 3, 9, 1, 4, 4, 2, 8, 5, 6, 1, 3, 3, 7, 2, 9, 8, 1, 2]
    a = Generator(small("generated").step_model(), None).generate(prompt, SamplingParams(max_new_tokens=12))
    b = Generator(small("stablehlo").step_model(), None).generate(prompt, SamplingParams(max_new_tokens=12))
    c = Generator(small("generated").step_model(), None, prefill_chunk=5).generate(
        prompt, SamplingParams(max_new_tokens=12)
    )
    assert a.token_ids == b.token_ids == c.token_ids


@pytest.mark.slow
def test_batched_decode_rows():
    m = small(max_batch=2)
    prompts = [[5, 6, 7, 8, 9], [1, 2, 3]]
    params = SamplingParams(max_new_tokens=6)
    batch = Generator(m.step_model(), None).generate_batch(prompts, params)
    alone = [Generator(small(max_batch=2).step_model(), None).generate(p, params).token_ids for p in prompts]
    assert [r.token_ids for r in batch] == alone


@pytest.mark.parametrize("mode", ["generated", "stablehlo"])
@pytest.mark.parametrize("scan", [False, True])
def test_compiled_decode_step_does_not_copy_the_cache(mode, scan):
    """The compiled decode step (S = 1) updates the donated cache in place: no copy of a cache
    array anywhere in the optimized HLO (XLA on CPU used to copy each cache four times when a
    dot read the whole written cache through a reshape). With the layers scanned (the caches stacked, each layer's
    written in the stacked array at its index: the prelude's `StateSlot`), XLA's CPU compiler gives the attention
    dots a copy of the layer's slice to read, one per cache and layer (the unrolled step reads in place); taken
    out and written back, as a first version did, it was three."""
    m = small(mode, scan_layers=scan)
    fn = m.functions["step"]
    z = np.zeros(1, dtype=np.int64)
    text = fn.lower(m.params, m.state, np.zeros((1, 1), dtype=np.int64), z, z).compile().as_text()
    shape = next(iter(m.state.values())).shape
    layers, kv = SMALL["num_hidden_layers"], SMALL["num_key_value_heads"]
    layer = (kv, MAX_POSITIONS, 8)
    assert shape == ((layers, *layer) if scan else layer)  # held as [max_batch * H_kv, T, D] (the layers stacked)
    cache = "f32[" + ",".join(map(str, shape)) + "]"
    copies = [ln.strip()[:160] for ln in text.splitlines() if " copy(" in ln and cache in ln.split("=", 1)[-1][:40]]
    assert not copies, copies
    # Nor a piece of it: the attention dots read the written cache where it lies (one KV head's
    # slice, f32[1,T,D] or f32[T,D], was a copy per head per step).
    head = [f"f32[1,{MAX_POSITIONS},8]", f"f32[{MAX_POSITIONS},8]"]
    pieces = [ln.strip()[:160] for ln in text.splitlines() if any(f"= {h}" in ln for h in head)]
    assert not pieces, pieces
    if scan:  # the stacked caches written in place; each layer's slice read once per cache
        made = [ln.strip().split(" = ", 1) for ln in text.splitlines() if "fusion(" in ln and " = f32[" in ln]
        made_layer = [name for name, rhs in made if rhs.startswith(f"f32[{','.join(map(str, layer))}]")]
        assert len(made_layer) == 2 and all("dynamic-slice" in n for n in made_layer), made_layer
    assert "input_output_alias" in text  # the cache is donated to the step


def test_linear_layers_sharing_an_input_are_one_dot(model):
    """q, k and v (and gate and up) read one fused weight, concatenated along the output dim
    under a key naming its members; their own names are not parameters any more. (The layers are scanned on the
    CPU by default, so held stacked, `list.*.member` with the layer first: tests/runtimes/test_jax_scan.py.)"""
    hd = SMALL["hidden_size"] // SMALL["num_attention_heads"]
    n = SMALL["num_hidden_layers"]
    qkv = model.params["model.layers.*.self_attn.{q,k,v}_proj.weight"]
    rows = (SMALL["num_attention_heads"] + 2 * SMALL["num_key_value_heads"]) * hd
    assert qkv.shape == (n, rows, SMALL["hidden_size"])
    assert model.params["model.layers.*.mlp.{gate,up}_proj.weight"].shape == (n, 2 * SMALL["intermediate_size"], 64)
    assert not any(k.endswith(("q_proj.weight", "gate_proj.weight")) for k in model.params)
    assert "model.layers.*.self_attn.o_proj.weight" in model.params  # its input is not shared


def test_artifact_binds_fused_weights_from_checkpoint_names(tmp_path):
    """An exported step takes fused weights; `load_exported` makes them from a checkpoint (by
    checkpoint name) or from a dict by checkpoint name, and runs as the model loaded from source.
    Each member is checked against its shape in the artifact's JSON: a member swapped with
    another (the fused shape unchanged), mis-shaped or missing is named."""
    from safetensors.numpy import save_file

    from linnet.compiler.jax.codegen import fused_names
    from linnet.compiler.jax.module import fused_member_shapes
    from linnet.runtimes.backends.jax_backend import save_exported

    spec = small().program.params
    rng = np.random.default_rng(3)
    tensors = {t.path: (rng.standard_normal(t.shape) * 0.1).astype(np.float32) for t in spec}
    save_file(tensors, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", **SMALL}))
    # the layers unrolled, as `linnet stablehlo --serialized` exports them (a scanned one: test_jax_scan.py)
    m = lj.load(LLAMA, tmp_path, mode="stablehlo", max_positions=MAX_POSITIONS, progress=False, scan_layers=False)
    ids, pos = np.array([[4, 8, 15, 16, 23, 42]]), np.array([0])
    want = np.asarray(m.step(ids, pos, pos))
    fused = {k: fused_names(k) for k in m.params if fused_names(k)}
    meta = {"entry": "step", "max_batch": 1, "max_positions": MAX_POSITIONS}
    save_exported(
        m.exported["step"], tmp_path / "step.bin", meta | {"fused_weights": fused_member_shapes(m.program, fused)}
    )
    for kw in ({"weights": tmp_path}, {"params": tensors}):
        e = lj.load_exported(tmp_path / "step.bin", **kw)
        assert "model.layers.0.self_attn.{q,k,v}_proj.weight" in e.params
        np.testing.assert_array_equal(np.asarray(e.step(ids, pos, pos)), want)
    # review: an artifact whose JSON does not say its block writes drop rows past the cache (one exported before they
    # did) clamps such a write onto the last row: its prefill steps are never padded, nor batched by the engine
    assert not e.drops_padded_rows
    sm = e.step_model(batch_buckets=True)
    sm.warm_up_prefill(6, [2, 3])
    assert sm.prefill_batch(6) == 1

    q, k = "model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight"
    swapped = {**tensors, q: tensors[q][: tensors[k].shape[0]], k: np.concatenate([tensors[k], tensors[q]])[:64]}
    with pytest.raises(
        lj_load_error(),
        match=r"`model\.layers\.0\.self_attn\.q_proj\.weight` is \[16, 64\], the artifact takes \[64, 64\]",
    ):
        lj.load_exported(tmp_path / "step.bin", params=swapped)
    transposed = {**tensors, "model.layers.1.mlp.gate_proj.weight": tensors["model.layers.1.mlp.gate_proj.weight"].T}
    with pytest.raises(lj_load_error(), match=r"`model\.layers\.1\.mlp\.gate_proj\.weight` is \[64, 128\]"):
        lj.load_exported(tmp_path / "step.bin", params=transposed)
    del tensors["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(lj_load_error(), match=r"no tensor for `model\.layers\.1\.mlp\.up_proj\.weight`"):
        lj.load_exported(tmp_path / "step.bin", params=tensors)
    (tmp_path / "step.bin.json").unlink()
    with pytest.raises(lj_load_error(), match=r"without `max_batch`"):
        lj.load_exported(tmp_path / "step.bin", params=tensors)


def lj_load_error():
    from linnet.runtimes.loading import LoadError

    return LoadError


def test_weights_are_arguments_not_constants(tmp_path):
    m = small("stablehlo")
    text = m.exported["step"].mlir_module()
    # Every parameter is an argument of the artifact, by its checkpoint name; the artifact is small.
    for path in list(m.params)[:5]:
        assert f"params['{path}']" in text
    assert len(m.exported["step"].serialize()) < 200_000


def test_serialized_artifact_runs_in_a_fresh_process_without_source(tmp_path):
    cli = [sys.executable, "-m", "linnet", "stablehlo", str(LLAMA), "--entry", "step"]
    cli += [x for k, v in SMALL.items() for x in ("--config", f"{k}={v}")]
    cli += ["--max-positions", str(MAX_POSITIONS), "--serialized", str(tmp_path / "step.bin")]
    out = subprocess.run(cli, capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    meta = json.loads((tmp_path / "step.bin.json").read_text())
    assert meta["entry"] == "step" and meta["max_positions"] == MAX_POSITIONS

    m = small()
    np.savez(tmp_path / "weights.npz", **{k: np.asarray(v) for k, v in m.params.items()})
    ids = [[4, 8, 15, 16, 23, 42]]
    want = np.asarray(m.step(np.array(ids), np.array([0]), np.array([0])))
    code = (
        "import sys, numpy as np\n"
        "import linnet.jax as lj\n"
        "w = dict(np.load('weights.npz'))\n"
        "m = lj.load_exported('step.bin', params=w)\n"
        f"out = np.asarray(m.step(np.array({ids}), np.array([0]), np.array([0])))\n"
        "np.save('out.npy', out)\n"
        "print(sorted(x for x in sys.modules if x.split('.')[0] == 'torch'))\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert not list(tmp_path.glob("*.linnet"))
    assert run.stdout.strip() == "[]", "the artifact and a dict of weights: no torch, no source"
    got = np.load(tmp_path / "out.npy")
    assert np.abs(got - want).max() < 1e-5


def test_serialized_bf16_artifact_compiles_with_its_numerics(tmp_path):
    """A bf16 artifact exported under `equivalent` records the XLA options that numerics needs (excess precision
    off: `JaxProgram.compiler_options`) and `load_exported` compiles with them, so it computes bit for bit what the
    model loaded from source computes; under `fast` it records none."""
    for numerics in ("equivalent", "fast"):
        cli = [sys.executable, "-m", "linnet", "stablehlo", str(LLAMA), "--entry", "step", "--dtype", "bf16"]
        cli += [x for k, v in SMALL.items() for x in ("--config", f"{k}={v}")]
        cli += ["--max-positions", str(MAX_POSITIONS), "--numerics", numerics]
        cli += ["--serialized", str(tmp_path / f"{numerics}.bin")]
        out = subprocess.run(cli, capture_output=True, text=True, cwd=tmp_path)
        assert out.returncode == 0, out.stderr
    meta = {n: json.loads((tmp_path / f"{n}.bin.json").read_text()) for n in ("equivalent", "fast")}
    assert meta["equivalent"]["compiler_options"] == {"xla_allow_excess_precision": False}
    assert meta["fast"]["compiler_options"] == {}

    source = small(dtype="bf16", fuse_linear_weights=False)  # weights by checkpoint name, bf16
    weights = {k: np.asarray(v) for k, v in source.params.items()}
    ids = np.random.default_rng(5).integers(0, SMALL["vocab_size"], (1, 24)).astype(np.int64)
    want = np.asarray(small(dtype="bf16").step(ids, np.array([0]), np.array([0])), dtype=np.float32)
    artifact = lj.load_exported(tmp_path / "equivalent.bin", params=weights)
    got = np.asarray(artifact.step(ids, np.array([0]), np.array([0])), dtype=np.float32)
    np.testing.assert_array_equal(got, want)
