"""`--dtype stored` on the JAX backends: a tiny Llama-shaped GGUF, every matrix Q8_0 (written by gguf-py's writer
and quantizer from seeded weights), loaded through the real path with its matrices held as int8 codes and f16
scales on the device, against the same file loaded dequantized in f32."""

from __future__ import annotations

import numpy as np
import pytest

from linnet.compiler.jax.scan import STACKED_INDEX
from linnet.errors import LoadError
from linnet.runtimes.backends import BACKENDS
from tests.cli.test_backends import run_cli
from tests.runtimes.conftest import LLAMA
from tests.runtimes.gguf_writing import write_llama_gguf
from tests.runtimes.test_gguf_stored import tiny_llama

pytest.importorskip("jax")
pytest.importorskip("torch")
pytest.importorskip("gguf")
pytestmark = pytest.mark.jax

ALL_Q8_0 = {"*": "q8_0"}  # llama.cpp's Q8_0 file: every matrix q8_0 (token_embd and output too), norms f32
OPTIONS = dict(max_positions=64, progress=False)


def untied_llama():
    """`tiny_llama` with its own lm_head (Llama 3.1's layout: `output.weight` beside `token_embd.weight`)."""
    import torch

    model = tiny_llama(seed=1)
    model.config.tie_word_embeddings = False
    model.lm_head.weight = torch.nn.Parameter(torch.randn_like(model.lm_head.weight) * 0.05)
    return model


@pytest.fixture(scope="module", params=["tied", "untied"])
def q8_gguf(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("jax-stored") / f"tiny-q8_0-{request.param}.gguf"
    write_llama_gguf(path, tiny_llama() if request.param == "tied" else untied_llama(), quantize=ALL_Q8_0)
    return path


@pytest.fixture(scope="module")
def models(q8_gguf):
    stored = BACKENDS["xla"].load(LLAMA, weights=q8_gguf, dtype="stored", scan_layers=True, **OPTIONS)
    f32 = BACKENDS["xla"].load(LLAMA, weights=q8_gguf, dtype="f32", scan_layers=True, **OPTIONS)
    return stored, f32


def test_the_matrices_are_held_as_int8_codes_and_f16_scales(models, q8_gguf):
    stored, f32 = models
    # the layers scanned: each pair's codes and scales stacked too, [layers, ...] (a scan's item gets its own pair)
    assert not any(".layers.0." in k for k in stored.params)
    matrices = {k: v for k, v in stored.params.items() if isinstance(v, tuple)}
    # every matrix: embeddings, the fused q/k/v and gate/up, o_proj, down_proj (each stacked), lm_head when untied
    untied = "untied" in q8_gguf.name
    assert len(matrices) == 1 + 4 + untied
    assert ("lm_head.weight" in matrices) == untied
    assert sum(f".{STACKED_INDEX}." in k for k in matrices) == 4
    for key, (codes, scales) in matrices.items():
        *layers, n, k = codes.shape
        assert codes.dtype == np.int8 and scales.dtype == np.float16 and scales.shape == (*layers, n, k // 32), key
        assert codes.shape == f32.params[key].shape and layers == ([2] if STACKED_INDEX in key else [])
    assert stored.params["model.norm.weight"].dtype == np.float32
    held = sum(c.nbytes + s.nbytes for c, s in matrices.values())
    dense = sum(f32.params[k].nbytes for k in matrices)
    assert held * 4 == dense * 34 // 32  # 34 bytes a block of 32 (Q8_0's own size) against 4 a value


def test_scanned_pairs_give_the_unrolled_models_logits_and_weights(models, q8_gguf):
    """Stacked pairs (`_Binder` stacks codes and scales leaf by leaf; `lax.scan` slices each) against the same file
    held unstacked with its layers unrolled: the same logits (1e-5 of their scale; measured 0) and the same weights
    exported by checkpoint name (`model_weights` dequantizes a stacked pair, then splits it by layer)."""
    from linnet.runtimes.model_weights import model_weights

    stored, _ = models
    unrolled = BACKENDS["xla"].load(LLAMA, weights=q8_gguf, dtype="stored", scan_layers=False, **OPTIONS)
    assert isinstance(unrolled.params["model.layers.1.self_attn.o_proj.weight"], tuple)
    ids = np.random.default_rng(2).integers(0, 96, (1, 12))
    (got,), (want,) = stored.run("forward", ids), unrolled.run("forward", ids)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())
    a, b = model_weights(stored), model_weights(unrolled)
    assert list(a) == list(b)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def test_logits_equal_the_dequantized_model(models):
    # Both sides multiply the same f32 values: a Q8_0 weight is an int8 times an f16 scale, exact in f32 whether the
    # GGUF reader dequantizes it at load (the f32 model) or the step does (the stored one), and `equivalent` dots
    # f32 at full precision. So only XLA's choice of dot kernel (summation order) may differ between the two
    # programs: per dot at most K * 2^-24 * sum |x w| (K = 96 here), about 6e-6 of the logits' scale through two
    # layers; bounded at 1e-5 of it. Measured: 0 (XLA's CPU compiler keeps the order).
    stored, f32 = models
    ids = np.random.default_rng(0).integers(0, 96, (2, 24))
    (got,) = stored.run("forward", ids)
    (want,) = f32.run("forward", ids)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())
    step = [m.step_model() for m in (stored, f32)]
    prompt = ids[:1, :9]
    got, want = (s.step(prompt, np.zeros(1, np.int64), np.zeros(1, np.int64)) for s in step)  # prefill
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())


def test_greedy_tokens_equal_the_dequantized_model(models):
    from linnet.runtimes.generation import Generator
    from linnet.runtimes.sampling import SamplingParams

    stored, f32 = models
    prompt = [5, 17, 42, 8, 3, 61, 29]
    params = SamplingParams(max_new_tokens=20)
    for loop in (False, True):  # the host's per-token loop, and the decode loop a TPU runs on the device
        tokens = [Generator(m.step_model(decode_loop=loop), None).generate(prompt, params).token_ids for m in models]
        assert len(tokens[0]) == 20 and tokens[0] == tokens[1]


def test_generated_jax_equals_the_exported_artifact(models, q8_gguf):
    stored, _ = models
    jitted = BACKENDS["jax"].load(LLAMA, weights=q8_gguf, dtype="stored", **OPTIONS)
    assert isinstance(jitted.params["model.embed_tokens.weight"], tuple)
    assert "quantized_linear(" in jitted.source and "quantized_take(" in jitted.source
    ids = np.arange(16)[None] % 90 + 3
    np.testing.assert_array_equal(jitted.run("forward", ids)[0], stored.run("forward", ids)[0])


@pytest.fixture(scope="module")
def q4_gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("jax-stored-q4") / "tiny-q4_1.gguf"
    write_llama_gguf(path, tiny_llama(), quantize={"*": "q4_1", "token_embd.weight": "q8_0"})
    return path


def test_another_quant_type_is_refused_naming_the_tensors(q4_gguf):
    with pytest.raises(LoadError) as err:
        BACKENDS["xla"].load(LLAMA, weights=q4_gguf, dtype="stored", **OPTIONS)
    message = str(err.value)
    assert "--dtype stored on the JAX backends holds q8_0 matrices quantized" in message
    assert "`model.layers.0.self_attn.q_proj.weight` (q4_1)" in message and "and 10 more" in message
    assert "--dtype f32" in message and "--backend torch or onnxruntime" in message


def test_cli_refuses_another_quant_type_without_a_traceback(q4_gguf):
    r = run_cli(
        "generate", str(LLAMA), "--weights", str(q4_gguf), "--backend", "xla", "--dtype", "stored",
        "--prompt-ids", "1,2,3", "--max-new-tokens", "2", "--print-ids",
    )  # fmt: skip
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr and "(q4_1)" in r.stderr


def test_cli_generates_the_dequantized_models_tokens(tmp_path):
    path = tmp_path / "tiny-q8_0.gguf"
    write_llama_gguf(path, untied_llama(), quantize=ALL_Q8_0)
    args = ["--weights", str(path), "--backend", "xla", "--prompt-ids", "5,17,42", "--max-new-tokens", "8"]
    runs = [run_cli("generate", str(LLAMA), *args, "--dtype", dtype, "--print-ids") for dtype in ("stored", "f32")]
    assert all(r.returncode == 0 for r in runs), runs[0].stderr + runs[1].stderr
    assert runs[0].stdout == runs[1].stdout and runs[0].stdout.strip()


@pytest.mark.tpu
@pytest.mark.parametrize("numerics", ["equivalent", "fast"])
def test_stored_on_the_tpu_is_the_dequantized_model(q8_gguf, tpu_device, numerics):
    # On the chip: the int8 pairs held there, and the logits against the same file dequantized in f32 there under
    # `equivalent` (f32 dots at highest precision). Under `equivalent` both multiply the same f32 values, so only
    # summation order and the chip's transcendentals differ: bounded at 1e-4 of the logits' scale. Under `fast` the
    # chip rounds each dot's operands to bf16 (2^-9 relative), and the two sides round different values: the kernel
    # the activations only (int8 codes are exact in bf16, the f32 scales applied after the dot), the dequantized
    # model also each code x scale. Two layers of four dots and the head: bounded at 2^-7 of the logits' scale
    # (four such roundings). The chip measured 2.2e-3 tied and 5.0e-3 untied on logits of scale 1.4 and 1.5 (one
    # more rounded dot: the head); TPU_LOGITS_ATOL (3e-3, the f32 decoders' bound) was too tight for the second.
    from tests.runtimes.conftest import record

    options = dict(OPTIONS, device=tpu_device)
    stored = BACKENDS["xla"].load(LLAMA, weights=q8_gguf, dtype="stored", numerics=numerics, **options)
    f32 = BACKENDS["xla"].load(LLAMA, weights=q8_gguf, dtype="f32", **options)
    codes, scales = stored.params["model.embed_tokens.weight"]  # held for the Pallas kernel: scales f32 [K / 32, N]
    assert codes.dtype == np.int8 and scales.dtype == np.float32 and codes.devices() == {stored.device}
    assert scales.shape == (codes.shape[1] // 32, codes.shape[0])
    ids = np.random.default_rng(3).integers(0, 96, (1, 24))
    (got,) = stored.run("forward", ids)
    (want,) = f32.run("forward", ids)
    delta = float(np.abs(got - want).max())
    record(
        f"stored {numerics} logits",
        delta,
        model="llama",
        backend="xla",
        checkpoint=q8_gguf.name,
        against="f32 dequantized",
    )
    bound = (1e-4 if numerics == "equivalent" else 2**-7) * np.abs(want).max()
    assert delta <= bound, (delta, bound)


def test_a_fused_group_quantized_in_part_is_refused_naming_its_members():
    from linnet.compiler.jax.module import compile_program
    from linnet.errors import BackendError
    from linnet.runtimes.loading import LoadOptions, prepare

    program = prepare(LLAMA, None, LoadOptions(preset="smollm2_135m", random_weights=True, max_positions=16)).program
    names = [f"model.layers.0.self_attn.{m}_proj.weight" for m in "qkv"]
    with pytest.raises(BackendError) as err:
        compile_program(program, quantized={names[0]: 32, names[1]: 32})
    message = str(err.value)
    assert f"`{names[0]}` (groups of 32)" in message and f"`{names[2]}` (not quantized)" in message
    assert "must be quantized alike" in message
