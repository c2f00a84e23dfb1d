"""bf16 on JAX/XLA's CPU (matrices held in f32, `linnet.compiler.jax.codegen` `f32_matrices`) on the embedded
SmolLM2-135M-Instruct against transformers in f32, with the ONNX Runtime bf16 test's bound and near-tie rule (its
reference fixture is the PyTorch parity test's own). The arithmetic equals XLA's bf16 dots: test_jax_f32_matrices.py."""

from __future__ import annotations

import numpy as np
import pytest

from tests.runtimes.conftest import LLAMA, linnet_greedy, max_abs_diff, report

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("jax")

import linnet.jax as lj  # noqa: E402
from linnet.runtimes.backends.jax_backend import F32_MATRICES_NOTE  # noqa: E402
from tests.runtimes.test_parity_onnx_bf16 import NEAR_TIE  # noqa: E402
from tests.runtimes.test_parity_smollm2 import MAX_POSITIONS, reference  # noqa: E402, F401

pytestmark = [pytest.mark.jax, pytest.mark.torch, pytest.mark.usefixtures("one_torch_thread")]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["plain", "chat"])
def test_smollm2_bf16_logits_and_greedy_tokens(reference, kind):  # noqa: F811
    """transformers f32 is the reference (the ONNX Runtime bf16 test's fixture): the bf16 logits within 2.0, and an
    argmax that differs from transformers' at a generated position only where its f32 top-2 gap is a near tie."""
    m = lj.load(LLAMA, dtype="bf16", max_positions=MAX_POSITIONS, progress=False)
    assert F32_MATRICES_NOTE in m.notes
    prompt, expected, ref_logits = reference[kind]
    logits = np.asarray(m.forward(np.array([prompt + expected])), np.float32)
    delta = max_abs_diff(logits, ref_logits)
    report(f"SmolLM2-135M GGUF->bf16 (jax, f32-held matrices, {kind} prompt)", delta)
    assert np.isfinite(logits).all() and delta < 2.0
    at = slice(len(prompt) - 1, len(prompt) - 1 + len(expected))
    ref_top2 = torch.as_tensor(ref_logits[0, at]).topk(2, dim=-1)
    gaps = (ref_top2.values[:, 0] - ref_top2.values[:, 1]).numpy()
    differ = np.flatnonzero(logits[0, at].argmax(-1) != ref_top2.indices[:, 0].numpy())
    print(f"jax bf16, {kind}: argmax equals transformers f32 at {len(expected) - len(differ)}/{len(expected)}")
    assert len(differ) <= len(expected) // 8 and all(gaps[i] < NEAR_TIE for i in differ)
    tokens = linnet_greedy(m, prompt, 16)
    agree = next((i for i, (a, b) in enumerate(zip(tokens, expected)) if a != b), 16)
    print(f"jax bf16, {kind}: greedy tokens agree with transformers f32 for {agree}/16")
