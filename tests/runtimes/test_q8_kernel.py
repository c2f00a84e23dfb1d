"""The Pallas Q8_0 matrix product (`linnet.compiler.jax.q8_kernel`), interpreted on the CPU (`interpret=True`: the
kernel's own program, run by Pallas's interpreter), against the dequantized matrix's product in f64; and the
`--dtype stored` load holding its pairs for it where the kernel runs (a TPU), which the CPU keeps as the file has
them (XLA's dot)."""

from __future__ import annotations

import numpy as np
import pytest

from linnet.runtimes.backends import BACKENDS
from tests.runtimes.conftest import LLAMA

jax = pytest.importorskip("jax")
pytestmark = pytest.mark.jax


def q8_matrix(n: int, k: int, seed: int = 0):
    """Random codes i8[n, k] and f16 scales [n, k / 32] as a Q8_0 file holds them, and W in f64."""
    rng = np.random.default_rng(seed)
    codes = rng.integers(-127, 128, (n, k), dtype=np.int8)
    scales = (rng.random((n, k // 32), dtype=np.float32) * 1e-2).astype(np.float16)
    return codes, scales, codes * np.repeat(scales.astype(np.float64), 32, axis=1)


# (rows M, N, K, tile targets): one tile, several along N and K, K = 14336 (the 8B's down_proj) in tiles of 512,
# and K = 1536 under a target of 1024 (no multiple of 1024 divides it: tiles of 768)
SHAPES = [(1, 128, 256, 1024, 512), (3, 384, 1536, 128, 1024), (1, 256, 14336, 256, 512), (64, 256, 512, 128, 256)]


@pytest.mark.parametrize("m,n,k,tn,tk", SHAPES)
def test_kernel_equals_the_dequantized_product(m, n, k, tn, tk):
    from linnet.compiler.jax.q8_kernel import hold, q8_matmul

    codes, scales, w = q8_matrix(n, k)
    x = np.random.default_rng(1).standard_normal((m, k), dtype=np.float32)
    want = x.astype(np.float64) @ w.T
    held = hold(codes, scales)
    # equivalent: f32 products of exact f32 values, summed per block then over blocks: f32 rounding of the sums,
    # about sqrt(K) * 2^-24 of sum |x w|; bounded at 1e-6 of the largest output
    exact = np.asarray(q8_matmul(x, held.codes, held.scales_t, precision="highest", tn=tn, tk=tk, interpret=True))
    np.testing.assert_allclose(exact, want, rtol=0, atol=1e-6 * np.abs(want).max())
    # fast: x rounded to bf16 (2^-9 relative) before an exact dot: bounded at 2^-9 * sum |x| |w| per output
    for widen in (True, False):  # the codes widened to bf16 first, or handed to the dot as int8
        fast = np.asarray(q8_matmul(x, held.codes, held.scales_t, tn=tn, tk=tk, widen_codes=widen, interpret=True))
        assert np.all(np.abs(fast - want) <= 2.0**-9 * (np.abs(x) @ np.abs(w).T) + 1e-6), widen


def spy_kernels(monkeypatch) -> list[str]:
    """The names of the kernels (`_kernel`, `_dequantizing_kernel`) traced from now on, in a list that grows."""
    from linnet.compiler.jax import q8_kernel

    used = []
    for name in ("_kernel", "_dequantizing_kernel"):
        original = getattr(q8_kernel, name)
        monkeypatch.setattr(q8_kernel, name, lambda *a, _f=original, _n=name, **kw: used.append(_n) or _f(*a, **kw))
    return used


# (rows M, N, K, tile targets) for the dequantizing kernel: rows past one tile of 512 (two tiles, the last padded),
# several tiles along N and K, and rows not a multiple of 16 (padded)
PREFILL_SHAPES = [(520, 256, 512, 128, 256), (70, 384, 1536, 128, 512), (3, 128, 256, 1024, 512)]


@pytest.mark.parametrize("expand", ["broadcast", "dot"])
@pytest.mark.parametrize("m,n,k,tn,tk", PREFILL_SHAPES)
def test_the_dequantizing_kernel_equals_the_dequantized_product(m, n, k, tn, tk, expand):
    from linnet.compiler.jax.q8_kernel import hold, q8_matmul

    codes, scales, w = q8_matrix(n, k, seed=m)
    x = np.random.default_rng(m + 1).standard_normal((m, k), dtype=np.float32)
    want = x.astype(np.float64) @ w.T
    held = hold(codes, scales)
    options = dict(tn=tn, tk=tk, prefill=True, expand=expand, interpret=True)
    # equivalent: W's tile dequantized exactly in f32, one f32 dot per tile: f32 rounding of the sums, as above
    exact = np.asarray(q8_matmul(x, held.codes, held.scales_t, precision="highest", **options))
    np.testing.assert_allclose(exact, want, rtol=0, atol=1e-6 * np.abs(want).max())
    # fast: x and the dequantized W each rounded to bf16 (2^-9 relative) before an exact dot: 2^-8 * sum |x| |w|
    fast = np.asarray(q8_matmul(x, held.codes, held.scales_t, **options))
    assert np.all(np.abs(fast - want) <= 2.0**-8 * (np.abs(x) @ np.abs(w).T) + 1e-6)


def test_prefill_rows_go_through_the_dequantizing_kernel(monkeypatch):
    # Past PREFILL_ROWS the block-diagonal spread would cost G (16) times a plain dot's MXU work: the kernel that
    # dequantizes its tile takes those rows; decode's rows keep the decode kernel.
    from linnet.compiler.jax import q8_kernel

    used = spy_kernels(monkeypatch)
    codes, scales, w = q8_matrix(128, 256)
    held = q8_kernel.hold(codes, scales)
    for rows, kernel in ((1, "_kernel"), (q8_kernel.PREFILL_ROWS, "_kernel"), (q8_kernel.PREFILL_ROWS + 1, None)):
        used.clear()
        q8_kernel.q8_matmul.clear_cache()  # traced again (another test's shapes), so the spies see the kernels
        x = np.random.default_rng(rows).standard_normal((rows, 256), dtype=np.float32)
        got = np.asarray(q8_kernel.q8_matmul(x, held.codes, held.scales_t, precision="highest", interpret=True))
        assert set(used) == {kernel or "_dequantizing_kernel"}, rows
        want = x.astype(np.float64) @ w.T
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6 * np.abs(want).max())


@pytest.mark.parametrize(
    "rows,prefill,expand", [(1, False, None), (64, False, None), (512, True, "broadcast"), (512, True, "dot")]
)
def test_the_kernels_lower_for_a_tpu_at_the_8b_shapes(rows, prefill, expand):
    # Pallas's TPU lowering (the kernel's Mosaic program), run on the CPU: what fails here fails on the chip before
    # Mosaic's own compiler sees it (that one runs only there). The 8B's matrices: fused gate/up, down_proj over
    # 14336, Qwen3's lm_head over its vocab 151936 (tiles of 128 x 2048); each held alone, and a layer's of 36
    # stacked (a scan's: the layer's index prefetched, its tiles read from the stacks).
    import functools

    import jax.numpy as jnp

    from linnet.compiler.jax.q8_kernel import BLOCK, q8_matmul

    for n, k in ((28672, 4096), (4096, 14336), (151936, 4096)):
        for precision, layers in ((None, ()), ("highest", ()), (None, (36,)), ("highest", (36,))):
            args = (
                jax.ShapeDtypeStruct((rows, k), jnp.float32),
                jax.ShapeDtypeStruct((*layers, n, k), jnp.int8),
                jax.ShapeDtypeStruct((*layers, k // BLOCK, n), jnp.float32),
                *([jax.ShapeDtypeStruct((), jnp.int32)] if layers else []),
            )
            options = dict(precision=precision, prefill=prefill, expand=expand, interpret=False)
            f = jax.jit(functools.partial(q8_matmul, **options))
            text = f.trace(*args).lower(lowering_platforms=("tpu",)).as_text()
            assert "tpu_custom_call" in text, (n, k, precision, layers)


def test_tiles_of_the_8b_matrices_and_none_for_a_tiny_model():
    from linnet.compiler.jax.q8_kernel import tiles

    # fused gate/up, fused q/k/v, o_proj, lm_head over K = 4096; down_proj over 14336
    assert [tiles(n, 4096) for n in (28672, 6144, 4096, 128256)] == [(1024, 512)] * 3 + [(768, 512)]
    assert tiles(4096, 14336) == (1024, 512) and tiles(4096, 14336, 2048, 2048) == (2048, 2048)
    assert tiles(128, 96) is None and tiles(96, 256) is None  # K = 96, N = 96: XLA's dot
    # Qwen3-8B: fused gate/up 24576, down_proj over 12288; its vocab 151936 = 128 x 1187 takes tiles of 128 along N,
    # so K's grow to 2048 (1187 steps of 256 KB, not 9496 of 64 KB); less for a batch's spread (64 rows: 512)
    assert tiles(24576, 4096) == (1024, 512) and tiles(4096, 12288) == (1024, 512)
    assert tiles(151936, 4096) == (128, 2048) and tiles(151936, 4096, rows=64) == (128, 512)


def test_a_kernel_pair_multiplies_by_the_kernel_for_any_known_rows(monkeypatch):
    from linnet.compiler.jax import q8_kernel
    from linnet.compiler.jax.prelude import dequantize, quantized_linear, quantized_take
    from linnet.compiler.jax.q8_kernel import TILE_M, hold

    calls = []
    kernel = q8_kernel.q8_matmul
    monkeypatch.setattr(q8_kernel, "q8_matmul", lambda *a, **kw: calls.append(a[0].shape) or kernel(*a, **kw))

    codes, scales, w = q8_matrix(256, 512)
    held = hold(codes, scales)
    np.testing.assert_array_equal(np.asarray(dequantize(held)), w.astype(np.float32))
    rows = np.asarray(quantized_take(held, np.array([[3, 200]]), 0))
    np.testing.assert_array_equal(rows, w[[[3, 200]]].astype(np.float32))
    for m in (2, 2 * TILE_M + 3):  # decode's rows in one tile; prefill's in three, the last padded
        x = np.random.default_rng(m).standard_normal((1, m, 512), dtype=np.float32)
        calls.clear()
        got = np.asarray(quantized_linear(x, held, "highest"))
        assert calls == [(m, 512)], m
        want = x.astype(np.float64) @ w.T
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6 * np.abs(want).max())


def test_the_load_holds_pairs_for_the_kernel_where_it_runs(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    pytest.importorskip("gguf")
    from linnet.compiler.jax import q8_kernel
    from tests.runtimes.gguf_writing import write_llama_gguf
    from tests.runtimes.test_jax_stored import ALL_Q8_0, OPTIONS, untied_llama

    path = tmp_path / "tiny-q8_0.gguf"
    write_llama_gguf(path, untied_llama(), quantize=ALL_Q8_0)
    plain = BACKENDS["xla"].load(LLAMA, weights=path, dtype="stored", **OPTIONS)
    monkeypatch.setattr(q8_kernel, "uses_kernel", lambda platform: True)  # the CPU as a TPU would hold them
    relaid = BACKENDS["xla"].load(LLAMA, weights=path, dtype="stored", **OPTIONS)
    assert "model.layers.*.mlp.down_proj.weight" in relaid.params  # scanned (the CPU's default): stacked pairs
    for key, pair in plain.params.items():
        if isinstance(pair, tuple):
            held = relaid.params[key]
            assert isinstance(held, q8_kernel.KMajorQ8), key
            np.testing.assert_array_equal(held.codes, pair[0])
            np.testing.assert_array_equal(held.scales_t, np.swapaxes(np.asarray(pair[1], np.float32), -1, -2))
    ids = np.random.default_rng(0).integers(0, 96, (2, 24))
    (got,), (want,) = relaid.run("forward", ids), plain.run("forward", ids)  # tiny dims: XLA's dot, re-laid scales
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())


def kernel_sized_llama():
    """A two-layer transformers Llama whose every matrix tiles for the kernel (N a multiple of 128, K of 256)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(2)
    config = LlamaConfig(
        vocab_size=256, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, tie_word_embeddings=False, max_position_embeddings=128, rms_norm_eps=1e-5,
    )  # fmt: skip
    return LlamaForCausalLM(config)


def kernel_sized_models(tmp_path, monkeypatch, backend: str):
    """The kernel-sized Llama as a Q8_0 GGUF loaded `--dtype stored`, `equivalent`, on `backend` twice: as the CPU
    holds the pairs (XLA's dot) and as a TPU does (for the kernels, interpreted); (plain, relaid)."""
    pytest.importorskip("torch")
    pytest.importorskip("gguf")
    from linnet.compiler.jax import q8_kernel
    from tests.runtimes.gguf_writing import write_llama_gguf
    from tests.runtimes.test_jax_stored import ALL_Q8_0, OPTIONS

    path = tmp_path / "kernel-sized-q8_0.gguf"
    write_llama_gguf(path, kernel_sized_llama(), quantize=ALL_Q8_0)
    options = dict(OPTIONS, weights=path, dtype="stored", numerics="equivalent")
    plain = BACKENDS[backend].load(LLAMA, **options)
    monkeypatch.setattr(q8_kernel, "uses_kernel", lambda platform: True)
    q8_kernel.q8_matmul.clear_cache()
    return plain, lambda: BACKENDS[backend].load(LLAMA, **options)


def assert_same_greedy_tokens(plain, relaid) -> None:
    """8 greedy tokens of a 7-token prompt, equal on both models, with the host loop and the device loop."""
    from linnet.runtimes.generation import Generator
    from linnet.runtimes.sampling import SamplingParams

    prompt, params = [5, 17, 42, 8, 3, 61, 29], SamplingParams(max_new_tokens=8)
    for loop in (False, True):
        tokens = [
            Generator(m.step_model(decode_loop=loop), None).generate(prompt, params).token_ids for m in (plain, relaid)
        ]
        assert len(tokens[0]) == 8 and tokens[0] == tokens[1], loop


def test_decode_through_the_kernel_generates_the_xla_paths_tokens(tmp_path, monkeypatch):
    # The generated module (`jax`: the step jitted with its real shapes) on a CPU that holds the pairs as a TPU
    # does, so its decode step runs the kernel (interpreted) inside the decode loop, against the pairs as the CPU
    # holds them (XLA's dot), both `equivalent`: the same greedy tokens, host loop and device loop.
    from linnet.compiler.jax import q8_kernel

    plain, load_relaid = kernel_sized_models(tmp_path, monkeypatch, "jax")
    calls = []
    kernel = q8_kernel.q8_matmul
    monkeypatch.setattr(q8_kernel, "q8_matmul", lambda *a, **kw: calls.append(a[1].shape[-2:]) or kernel(*a, **kw))
    relaid = load_relaid()
    # the layers scanned (the CPU's default): the kernel is traced once, on the stacked pairs and the layer's index
    assert isinstance(relaid.params["model.layers.*.self_attn.o_proj.weight"], q8_kernel.KMajorQ8)
    assert_same_greedy_tokens(plain, relaid)
    # every matrix of the decode step through the kernel: q/k/v, o_proj, gate/up, down_proj, lm_head
    assert {(512, 256), (256, 256), (1024, 256), (256, 512)} <= set(calls)


def test_symbolic_rows_export_for_a_tpu_through_all_three_kernel_choices():
    # An exported entry's rows (`B * S`, symbolic) lowered for a TPU on the CPU: the grid's row count a dynamic
    # bound, one Mosaic call per branch of the switch (decode kernel in tiles of 8 and 64, dequantizing kernel).
    # Exported under 64-bit types, as Linnet traces (linnet/compiler/jax/x64.py): no operand of a Mosaic call may be
    # 64-bit (the TPU compiler cannot narrow one inside a custom call: the chip refused every such `xla` entry)
    import re

    import jax.numpy as jnp
    from jax import export

    from linnet.compiler.jax.q8_kernel import BLOCK, q8_matmul

    (rows,) = export.symbolic_shape("m")
    for n, k in ((28672, 4096), (151936, 4096)):
        args = (
            jax.ShapeDtypeStruct((rows, k), jnp.float32),
            jax.ShapeDtypeStruct((n, k), jnp.int8),
            jax.ShapeDtypeStruct((k // BLOCK, n), jnp.float32),
        )
        with jax.enable_x64(True):
            kernel = jax.jit(lambda x, c, s: q8_matmul(x, c, s, interpret=False))
            module = export.export(kernel, platforms=["tpu"])(*args).mlir_module()
        calls = [line for line in module.splitlines() if "@tpu_custom_call(" in line]
        assert len(calls) == 3, (n, k)
        operand_types = [re.search(r": \((.*?)\) ->", line).group(1) for line in calls]
        assert not [t for t in operand_types if re.search(r"[iuf]64>", t)], operand_types


def test_the_xla_backends_exported_entries_run_the_kernels_for_any_rows(tmp_path, monkeypatch):
    # `xla` exports each entry once with symbolic batch and sequence dims: the kernels' row count is then symbolic,
    # and which kernel runs (decode in tiles of 8 or 64, dequantizing in tiles of 256) is picked when it runs. On a
    # CPU holding the pairs as a TPU does (the kernels interpreted), against the pairs as the CPU holds them (XLA's
    # dot), both `equivalent`: logits at 7, 40 and 80 rows (each branch), and the same greedy tokens on both loops.
    from linnet.compiler.jax import q8_kernel

    plain, load_relaid = kernel_sized_models(tmp_path, monkeypatch, "xla")
    used = spy_kernels(monkeypatch)
    relaid = load_relaid()
    assert isinstance(relaid.params["lm_head.weight"], q8_kernel.KMajorQ8)
    for rows in (7, 40, 80):
        ids = np.random.default_rng(rows).integers(0, 256, (1, rows))
        (got,), (want,) = relaid.run("forward", ids), plain.run("forward", ids)
        # the kernels sum each block's products, then the blocks (or W's tile dequantized in f32, one dot a tile):
        # f32 rounding of the sums only (test_kernel_equals_the_dequantized_product)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())
    assert set(used) == {"_kernel", "_dequantizing_kernel"}  # traced when the entries were exported: both kernels
    assert_same_greedy_tokens(plain, relaid)


@pytest.mark.tpu
@pytest.mark.parametrize("backend", ["jax", "xla"])
def test_the_kernels_on_the_tpu_give_the_dequantized_models_logits(tmp_path, monkeypatch, tpu_device, backend):
    # On the chip, with matrices that tile (tiny ones keep XLA's dot, so test_jax_stored's tpu test never reached
    # the kernels there): the pairs held for the kernels against the same file dequantized in f32 on the chip,
    # both `equivalent`, at 7 rows (the decode kernel) and 80 (the dequantizing kernel; on `xla` picked when the
    # symbolic-row entry runs: the chip refused those entries while their grid bound was 64-bit). Same summation
    # bound as test_the_xla_backends_exported_entries_run_the_kernels_for_any_rows.
    pytest.importorskip("torch")
    pytest.importorskip("gguf")
    from linnet.compiler.jax import q8_kernel
    from tests.runtimes.conftest import record
    from tests.runtimes.gguf_writing import write_llama_gguf
    from tests.runtimes.test_jax_stored import ALL_Q8_0, OPTIONS

    path = tmp_path / "kernel-sized-q8_0.gguf"
    write_llama_gguf(path, kernel_sized_llama(), quantize=ALL_Q8_0)
    options = dict(OPTIONS, weights=path, numerics="equivalent", device=tpu_device)
    used = spy_kernels(monkeypatch)
    stored = BACKENDS[backend].load(LLAMA, dtype="stored", **options)
    f32 = BACKENDS[backend].load(LLAMA, dtype="f32", **options)
    if tpu_device == "tpu":
        assert isinstance(stored.params["lm_head.weight"], q8_kernel.KMajorQ8)
    for rows in (7, 80):
        ids = np.random.default_rng(rows).integers(0, 256, (1, rows))
        (got,), (want,) = stored.run("forward", ids), f32.run("forward", ids)
        delta = float(np.abs(got - want).max())
        record(
            f"stored kernels {rows} rows", delta, model="llama", backend=backend, checkpoint=path.name,
            against="f32 dequantized",
        )  # fmt: skip
        assert delta <= 1e-4 * np.abs(want).max(), (rows, delta)
    if tpu_device == "tpu":
        assert set(used) == {"_kernel", "_dequantizing_kernel"}
