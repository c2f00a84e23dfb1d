"""Parity of the JAX/XLA backend with transformers, sentence-transformers and the PyTorch backend: the
embedded SmolLM2-135M-Instruct (GGUF dequantized to f32; logits at every position and 32 greedy tokens
through the generation runner, generated JAX and the StableHLO artifact), a small GPT-2 and all-MiniLM-L6-v2.
The references and fixtures are the PyTorch parity tests' own."""

from __future__ import annotations

import numpy as np
import pytest

from tests.runtimes.conftest import (
    BERT,
    GPT2,
    LLAMA,
    LOGITS_ATOL,
    MINILM,
    SEEDED,
    SENTENCE_TRANSFORMERS,
    SMOLLM2_GGUF,
    hf_greedy,
    linnet_greedy,
    max_abs_diff,
    record,
    report,
)

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("jax")

import linnet.jax as lj  # noqa: E402
import linnet.torch as lt  # noqa: E402
from tests.runtimes.test_parity_bert import SENTENCES, padded_batch, sentence_transformer  # noqa: E402, F401
from tests.runtimes.test_parity_gpt2 import N_POSITIONS, gpt2, prompts  # noqa: E402, F401
from tests.runtimes.test_parity_smollm2 import GREEDY_TOKENS, MAX_POSITIONS, reference  # noqa: E402, F401

pytestmark = [pytest.mark.jax, pytest.mark.torch, pytest.mark.usefixtures("one_torch_thread")]
JAX_MODES = ("generated", "stablehlo")
JAX_BACKEND = {"generated": "jax", "stablehlo": "xla"}  # each mode's backend in the registry


@pytest.fixture(scope="module")
def smollm2():
    # The artifact path (mode "stablehlo") runs the same functions; it is compared on the small models here
    # and in test_jax_backend.py (the same tokens as the generated path).
    return lj.load(LLAMA, mode="generated", max_positions=MAX_POSITIONS, progress=False)


@pytest.fixture(scope="module")
def smollm2_torch():
    return lt.load(LLAMA, mode="generated", max_positions=MAX_POSITIONS, progress=False)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["chat", "plain"])
def test_smollm2_logits_and_greedy_tokens(smollm2, smollm2_torch, reference, kind):  # noqa: F811
    prompt, expected, ref_logits = reference[kind]
    logits = np.array(smollm2.forward(np.array([prompt + expected])))
    n = len(prompt)
    overall = max_abs_diff(logits, ref_logits)
    what = f"SmolLM2-135M GGUF->f32 (jax {smollm2.mode}, {kind} prompt) logits at all {n + len(expected)} positions"
    record(what, overall, model="llama", backend=JAX_BACKEND[smollm2.mode], checkpoint=SMOLLM2_GGUF)
    assert overall < LOGITS_ATOL

    tokens = linnet_greedy(smollm2, prompt, GREEDY_TOKENS)
    tok = smollm2.tokenizer()
    print(f"jax {smollm2.mode}, {kind}: {tok.decode(tokens)!r}")
    assert tokens == expected, (tok.decode(tokens), tok.decode(expected))
    assert tokens == linnet_greedy(smollm2_torch, prompt, GREEDY_TOKENS)
    theirs = smollm2_torch.forward(np.array([prompt + expected]))
    report(f"SmolLM2-135M (jax {smollm2.mode} vs torch generated, {kind} prompt) logits", max_abs_diff(logits, theirs))


@pytest.mark.slow
@pytest.mark.parametrize("mode", JAX_MODES)
def test_gpt2_logits_and_greedy_tokens(gpt2, mode):  # noqa: F811
    full, _, ref = gpt2
    m = lj.load(GPT2, weights=full, mode=mode, max_positions=N_POSITIONS, progress=False)
    assert m.config["n_inner"] == 4 * 64
    ids = prompts(2, 20, seed=2)
    ours = np.array(m.forward(ids.numpy()))
    with torch.inference_mode():
        theirs = ref(input_ids=ids).logits
    delta = max_abs_diff(ours, theirs)
    record(f"small GPT-2 (jax {mode}) logits [2, 20, 256]", delta, model="gpt2", backend=JAX_BACKEND[mode],
           checkpoint=SEEDED)  # fmt: skip
    assert delta < LOGITS_ATOL
    prompt = ids[0, :10].tolist()
    assert linnet_greedy(m, prompt, 32) == hf_greedy(ref, prompt, 32)


def test_gpt2_file_without_transformer_prefix(gpt2):  # noqa: F811
    _, bare, ref = gpt2
    m = lj.load(GPT2, weights=bare, max_positions=N_POSITIONS, progress=False)
    ids = prompts(2, 20, seed=3)
    with torch.inference_mode():
        delta = max_abs_diff(np.array(m.forward(ids.numpy())), ref(input_ids=ids).logits)
    report("small GPT-2 (jax) from a file without `transformer.` logits", delta)
    assert delta < LOGITS_ATOL


@pytest.mark.slow
@pytest.mark.parametrize("mode", JAX_MODES)
def test_minilm_embeddings_match_sentence_transformers(sentence_transformer, mode):  # noqa: F811
    _, st = sentence_transformer
    m = lj.load(BERT, preset="all_minilm_l6_v2", mode=mode, progress=False)
    input_ids, mask = padded_batch(m.tokenizer(), SENTENCES)
    states = torch.from_numpy(np.array(m.forward(input_ids.numpy(), mask.numpy())))
    with torch.inference_mode():
        ref_states = st[0].auto_model(input_ids=input_ids, attention_mask=mask).last_hidden_state
        ref = st.encode(SENTENCES, convert_to_tensor=True, batch_size=len(SENTENCES))
    keep = mask.bool()
    delta_states = max_abs_diff(states[keep], ref_states[keep])
    what = f"all-MiniLM-L6-v2 (jax {mode}) token states at real tokens"
    record(
        what, delta_states, model="bert", backend=JAX_BACKEND[mode], checkpoint=MINILM, against=SENTENCE_TRANSFORMERS
    )
    assert delta_states < 1e-4
    weights = mask[..., None].to(states.dtype)
    pooled = (states * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
    ours = torch.nn.functional.normalize(pooled, dim=-1)
    cosine = torch.nn.functional.cosine_similarity(ours, ref, dim=-1)
    what = f"all-MiniLM-L6-v2 (jax {mode}) normalised sentence embeddings"
    record(what, max_abs_diff(ours, ref), model="bert", backend=JAX_BACKEND[mode], checkpoint=MINILM,
           against=SENTENCE_TRANSFORMERS)  # fmt: skip
    assert cosine.min().item() >= 0.99999
