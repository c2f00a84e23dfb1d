"""The first round's families (examples/llama.linnet, gpt2.linnet, bert.linnet) on every backend, as issue 17 asks of
every zoo model: a shrunk checkpoint made by transformers with a seed, perturbed away from its init, saved with
`save_pretrained` and loaded through its folder on torch-interpret, torch, torch-compile, jax, xla and onnxruntime.

The older parity files test these families on some backends each (the embedded SmolLM2 and MiniLM checkpoints,
per-backend files); this one runs the same shrunk-checkpoint comparison on all of them, with the harness the newer
zoo families use (`tests/runtimes/zoo_decoders.py`): decoders' logits at every position, 32 greedy tokens and
cached against uncached decode; the encoder's hidden states at every position of a batch padded on both sides."""

from __future__ import annotations

import pytest

from linnet.runtimes.backends import BACKENDS
from tests.runtimes.conftest import BERT, GPT2, LLAMA, max_abs_diff, padded_encoder_batch, perturb, record
from tests.runtimes.zoo_decoders import BACKENDS as DECODER_BACKENDS
from tests.runtimes.zoo_decoders import MAX_POSITIONS, Reference, check_decoder, save_seeded

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_torch_thread")]

VOCAB = 256
STATES_ATOL = 1e-4  # as test_parity_roberta's


def small_decoders():
    """(source, transformers config, what the record calls the checkpoint) of each shrunk decoder."""
    llama = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=MAX_POSITIONS, tie_word_embeddings=False,
    )  # fmt: skip
    gpt2 = transformers.GPT2Config(vocab_size=VOCAB, n_positions=MAX_POSITIONS, n_embd=64, n_layer=2, n_head=4)
    return {
        "llama": (LLAMA, llama, "seeded 2-layer, GQA 4/2, untied"),
        "gpt2": (GPT2, gpt2, "seeded 2-layer"),
    }


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def small_decoder(request, tmp_path_factory):
    source, config, what = small_decoders()[request.param]
    folder = tmp_path_factory.mktemp(request.param)
    model = save_seeded(config, folder, seed=11)
    return source, folder, Reference(model, VOCAB), what


@pytest.mark.parametrize("backend", DECODER_BACKENDS)
def test_small_decoder_equals_transformers(small_decoder, backend):
    source, folder, ref, what = small_decoder
    if (why := BACKENDS[backend].unavailable("cpu")) is not None:
        pytest.skip(why)
    check_decoder(source, folder, ref, backend, what)


@pytest.fixture(scope="module")
def small_bert(tmp_path_factory):
    """(folder, transformers BertModel) of a seeded 2-layer BERT (with its pooler, which bert.linnet declares), saved
    with save_pretrained."""
    config = transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=40, type_vocab_size=2, pad_token_id=0, attn_implementation="eager",
    )  # fmt: skip
    torch.manual_seed(5)
    model = transformers.BertModel(config).eval()
    perturb(model, seed=6)
    folder = tmp_path_factory.mktemp("bert")
    model.save_pretrained(folder)
    return folder, model


@pytest.mark.parametrize("backend", DECODER_BACKENDS)
def test_small_bert_hidden_states(small_bert, backend):
    folder, ref = small_bert
    if (why := BACKENDS[backend].unavailable("cpu")) is not None:
        pytest.skip(why)
    m = BACKENDS[backend].load(BERT, weights=folder, max_batch=3, progress=False)
    ids, mask = padded_encoder_batch(VOCAB, 0, 1)
    (states,) = m.run("forward", ids.numpy(), mask.numpy())
    with torch.inference_mode():
        theirs = ref(input_ids=ids, attention_mask=mask).last_hidden_state
    # the padded positions' states are what transformers computes for them too: compare every position
    delta = max_abs_diff(states, theirs)
    record(f"small BERT ({backend}) last_hidden_state [3, 12, 32], every position, padded both sides", delta,
           model="bert", backend=backend, checkpoint="seeded 2-layer, padded both sides")  # fmt: skip
    assert delta < STATES_ATOL
