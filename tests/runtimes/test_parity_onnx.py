"""Parity of the ONNX Runtime backend with transformers, sentence-transformers and the PyTorch backend: the
embedded SmolLM2-135M-Instruct (GGUF dequantized; logits at every position and 32 greedy tokens through the
generation runner, in f32, and f16's distance), a GQA decoder with 4 query heads and 2 KV heads (routing: query
head h reads KV head h // 2), the KV cache kept in bound OrtValues, a small GPT-2 and all-MiniLM-L6-v2. The
references and fixtures are the PyTorch parity tests' own."""

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
pytest.importorskip("onnxruntime")
pytest.importorskip("onnx_ir")

import linnet.onnx as lo  # noqa: E402
import linnet.torch as lt  # noqa: E402
from tests.runtimes.test_parity_bert import SENTENCES, padded_batch, sentence_transformer  # noqa: E402, F401
from tests.runtimes.test_parity_gpt2 import N_POSITIONS, gpt2, prompts  # noqa: E402, F401
from tests.runtimes.test_parity_smollm2 import GREEDY_TOKENS, MAX_POSITIONS, reference  # noqa: E402, F401

pytestmark = [pytest.mark.onnxruntime, pytest.mark.torch, pytest.mark.usefixtures("one_torch_thread")]
THREADS = 1  # ORT intra-op threads (the machine's two cores are shared; see one_torch_thread)


@pytest.fixture(scope="module")
def smollm2():
    return lo.load(LLAMA, max_positions=MAX_POSITIONS, threads=THREADS, progress=False)


@pytest.fixture(scope="module")
def smollm2_torch():
    return lt.load(LLAMA, mode="generated", max_positions=MAX_POSITIONS, progress=False)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["chat", "plain"])
def test_smollm2_logits_and_greedy_tokens(smollm2, smollm2_torch, reference, kind):  # noqa: F811
    prompt, expected, ref_logits = reference[kind]
    logits = smollm2.forward(np.array([prompt + expected]))
    n = len(prompt)
    overall = max_abs_diff(logits, ref_logits)
    what = f"SmolLM2-135M GGUF->f32 (onnxruntime, {kind} prompt) logits at all {n + len(expected)} positions"
    record(what, overall, model="llama", backend="onnxruntime", checkpoint=SMOLLM2_GGUF)
    assert overall < LOGITS_ATOL

    tokens = linnet_greedy(smollm2, prompt, GREEDY_TOKENS)
    tok = smollm2.tokenizer()
    print(f"onnxruntime, {kind}: {tok.decode(tokens)!r}")
    assert tokens == expected, (tok.decode(tokens), tok.decode(expected))
    assert tokens == linnet_greedy(smollm2_torch, prompt, GREEDY_TOKENS)
    theirs = smollm2_torch.forward(np.array([prompt + expected]))
    report(f"SmolLM2-135M (onnxruntime vs torch generated, {kind} prompt) logits", max_abs_diff(logits, theirs))
    # The step's last-token logits after an unpadded prefill equal forward's at that position.
    smollm2.reset_state()
    step = smollm2.step_model().step(np.array([prompt]), np.array([0]), np.array([0]))
    report(f"SmolLM2-135M (onnxruntime, {kind}) prefill step vs forward", max_abs_diff(step[0], logits[0, n - 1]))
    assert max_abs_diff(step[0], logits[0, n - 1]) < 1e-4


@pytest.mark.slow
def test_smollm2_f16_runs_and_reports_its_distance(reference):  # noqa: F811
    prompt, expected, ref_logits = reference["plain"]
    m = lo.load(LLAMA, dtype="f16", max_positions=MAX_POSITIONS, threads=THREADS, progress=False)
    logits = m.forward(np.array([prompt + expected]))
    assert logits.dtype == np.float16
    delta = max_abs_diff(logits.astype(np.float32), ref_logits)
    report("SmolLM2-135M GGUF->f16 (onnxruntime, plain prompt) logits vs transformers f32", delta)
    tokens = linnet_greedy(m, prompt, 8)
    agree = sum(a == b for a, b in zip(tokens, expected[:8]))
    print(f"f16 greedy: {agree}/8 of the first tokens agree with transformers f32")
    assert np.isfinite(logits.astype(np.float32)).all() and delta < 1.0


# ----------------------------------------------------------------------------- GQA routing

GQA = {
    "num_hidden_layers": 2,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "vocab_size": 64,
}


@pytest.fixture(scope="module")
def gqa_pair():
    """A 2-layer Llama with 4 query heads and 2 KV heads, random weights, on torch and on ONNX Runtime (the
    same weights, taken from the torch model)."""
    # 80 positions: over TRIM_MIN_KEYS, so decode reads the cache in place and prefill skips unwritten keys
    kwargs = dict(preset="smollm2_135m", config=GQA, max_batch=2, max_positions=80, progress=False)
    tm = lt.load(LLAMA, mode="generated", random_weights=True, seed=3, **kwargs)
    state = tm.module.state_dict()
    params = {p.path: state[p.path].detach().numpy() for p in tm.program.params}
    om = lo.load(LLAMA, params=params, threads=THREADS, **kwargs)
    return tm, om


def test_gqa_decoder_matches_torch(gqa_pair):
    tm, om = gqa_pair
    ids = np.random.default_rng(0).integers(2, 64, (2, 9))
    with torch.inference_mode():
        theirs = tm.forward(ids)
    ours = om.forward(ids)
    delta = max_abs_diff(ours, theirs)
    report("GQA Llama 4/2 heads (onnxruntime vs torch) logits", delta)
    assert delta < 1e-5
    prompt = ids[0, :5].tolist()
    assert linnet_greedy(om, prompt, 20) == linnet_greedy(tm, prompt, 20)


@pytest.mark.parametrize("dtype, bound", [("f32", 1e-5), ("f16", 2e-3)])
def test_long_prefill_in_blocks_matches_torch(dtype, bound):
    """A prefill of at least PREFILL_BLOCK_MIN_ROWS rows runs in blocks of query rows, each over its own keys:
    two rows at different positions (one with cache already written) match the torch backend (f32), and so does
    the decode step after them. f16 masks with `Where` instead of an added bias: its blocks slice the mask."""
    from linnet.compiler.onnx.lower import PREFILL_BLOCK_MIN_ROWS

    n = PREFILL_BLOCK_MIN_ROWS + 3
    kwargs = dict(preset="smollm2_135m", config=GQA, max_batch=2, max_positions=2 * n, progress=False)
    tm = lt.load(LLAMA, mode="generated", random_weights=True, seed=5, **kwargs)
    state = tm.module.state_dict()
    params = {p.path: state[p.path].detach().numpy() for p in tm.program.params}
    om = lo.load(LLAMA, params=params, dtype=dtype, **kwargs)
    rng = np.random.default_rng(2)
    head, ids, last = rng.integers(2, 64, (1, 9)), rng.integers(2, 64, (2, n)), rng.integers(2, 64, (2, 1))
    t = torch.tensor
    om.reset_state()
    step = om.step_model().step
    step(head, np.array([0]), np.array([1]))
    ours = [step(ids, np.array([0, 9]), np.array([0, 1])), step(last, np.array([n, n + 9]), np.array([0, 1]))]
    with torch.inference_mode():
        tm.native.step(t(head), t([0]), t([1]))
        theirs = [
            tm.native.step(t(ids), t([0, 9]), t([0, 1])).numpy(),
            tm.native.step(t(last), t([n, n + 9]), t([0, 1])).numpy(),
        ]
    for what, a, b in zip(("prefill", "decode after it"), ours, theirs):
        delta = max_abs_diff(a, b)
        report(f"GQA Llama (onnxruntime {dtype} vs torch f32) {n}-row prefill in blocks, two rows: {what}", delta)
        assert delta < bound


def test_steps_outside_the_cache_are_refused(gqa_pair):
    """A row or position outside the KV cache is a ValueError naming it, before ONNX Runtime runs."""
    _, om = gqa_pair
    step = om.step_model().step
    with pytest.raises(ValueError, match=r"rows \[2\] are outside the cache's 2 rows"):
        step(np.array([[3]]), np.array([0]), np.array([2]))
    with pytest.raises(ValueError, match=r"reach position 80, outside the cache's 80 positions"):
        step(np.array([[3, 4]]), np.array([79]), np.array([0]))
    step(np.array([[3]]), np.array([79]), np.array([1]))  # the last position of the last row is fine


def test_gqa_query_head_1_reads_kv_head_0():
    """Uniform attention (zero queries) over KV heads holding distinct values: query heads 0 and 1 read KV head
    0 (+1), heads 2 and 3 read KV head 1 (-1). A Tile-based expansion would give head 1 the -1 of KV head 1."""
    src = (
        "config C { d: int = 2 }\n"
        "model Probe(c: C) {\n"
        "    entry fn forward(q: [B, 4, S, c.d], k: [B, 2, S, c.d], v: [B, 2, S, c.d], mask: bool[B, S, S])"
        " -> [B, 4, S, c.d] {\n"
        "        attention(q, k, v, mask, 1.0)\n"
        "    }\n"
        "}\n"
    )
    m = lo.load(src, random_weights=True, progress=False)
    q = np.zeros((1, 4, 3, 2), np.float32)
    k = np.random.default_rng(0).random((1, 2, 3, 2), dtype=np.float32)
    v = np.stack([np.full((3, 2), 1.0), np.full((3, 2), -1.0)])[None].astype(np.float32)
    out = m.forward(q, k, v, np.ones((1, 3, 3), bool))
    np.testing.assert_array_equal(out[0, :, :, :], np.repeat(v[0], 2, axis=0))
    assert (out[0, 1] == 1.0).all()


def test_cache_stays_in_bound_ortvalues_and_batches_rows(gqa_pair):
    """Two rows at different positions in one step equal each row alone and the torch backend; the cache
    OrtValues are the same objects before and after (bound as past and present, one binding reused across steps),
    a step's logits stay as returned through later steps, and swapping buffers instead gives the same logits."""
    tm, om = gqa_pair
    rng = np.random.default_rng(1)
    a, b = rng.integers(2, 64, 7), rng.integers(2, 64, 12)
    om.reset_state()
    before = dict(om.state)
    step = om.step_model().step
    first = step(a[None, :5], np.array([0]), np.array([0]))
    kept = first.copy()
    step(b[None, :10], np.array([0]), np.array([1]))
    both = step(np.stack([a[5:7], b[10:12]]), np.array([5, 10]), np.array([0, 1]))
    assert all(om.state[k] is v for k, v in before.items())
    np.testing.assert_array_equal(first, kept)
    t = torch.tensor
    with torch.inference_mode():
        tm.native.step(t(a[None, :5]), t([0]), t([0]))
        tm.native.step(t(b[None, :10]), t([0]), t([1]))
        theirs = tm.native.step(t(np.stack([a[5:7], b[10:12]])), t([5, 10]), t([0, 1])).numpy()
    delta = max_abs_diff(both, theirs)
    report("GQA Llama (onnxruntime vs torch) batched rows at different positions", delta)
    assert delta < 1e-5
    om.share_buffer = False
    try:
        om.reset_state()
        step(a[None, :5], np.array([0]), np.array([0]))
        step(b[None, :10], np.array([0]), np.array([1]))
        swapped = step(np.stack([a[5:7], b[10:12]]), np.array([5, 10]), np.array([0, 1]))
    finally:
        om.share_buffer = True
        om.reset_state()
    np.testing.assert_array_equal(swapped, both)


# ----------------------------------------------------------------------------- GPT-2, all-MiniLM


@pytest.mark.slow
def test_gpt2_logits_and_greedy_tokens(gpt2):  # noqa: F811
    full, _, ref = gpt2
    m = lo.load(GPT2, weights=full, max_positions=N_POSITIONS, threads=THREADS, progress=False)
    ids = prompts(2, 20, seed=2)
    ours = m.forward(ids.numpy())
    with torch.inference_mode():
        theirs = ref(input_ids=ids).logits
    delta = max_abs_diff(ours, theirs)
    record(
        "small GPT-2 (onnxruntime) logits [2, 20, 256]", delta, model="gpt2", backend="onnxruntime", checkpoint=SEEDED
    )
    assert delta < LOGITS_ATOL
    prompt = ids[0, :10].tolist()
    assert linnet_greedy(m, prompt, 32) == hf_greedy(ref, prompt, 32)


@pytest.mark.slow
def test_minilm_embeddings_match_sentence_transformers(sentence_transformer):  # noqa: F811
    _, st = sentence_transformer
    m = lo.load(BERT, preset="all_minilm_l6_v2", threads=THREADS, progress=False)
    input_ids, mask = padded_batch(m.tokenizer(), SENTENCES)
    states = torch.from_numpy(m.forward(input_ids.numpy(), mask.numpy()))
    with torch.inference_mode():
        ref_states = st[0].auto_model(input_ids=input_ids, attention_mask=mask).last_hidden_state
        ref = st.encode(SENTENCES, convert_to_tensor=True, batch_size=len(SENTENCES))
    keep = mask.bool()
    delta_states = max_abs_diff(states[keep], ref_states[keep])
    what = "all-MiniLM-L6-v2 (onnxruntime) token states at real tokens"
    record(what, delta_states, model="bert", backend="onnxruntime", checkpoint=MINILM, against=SENTENCE_TRANSFORMERS)
    assert delta_states < 1e-4
    weights = mask[..., None].to(states.dtype)
    pooled = (states * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
    ours = torch.nn.functional.normalize(pooled, dim=-1)
    cosine = torch.nn.functional.cosine_similarity(ours, ref, dim=-1)
    what = "all-MiniLM-L6-v2 (onnxruntime) normalised sentence embeddings"
    record(
        what,
        max_abs_diff(ours, ref),
        model="bert",
        backend="onnxruntime",
        checkpoint=MINILM,
        against=SENTENCE_TRANSFORMERS,
    )
    assert cosine.min().item() >= 0.99999
