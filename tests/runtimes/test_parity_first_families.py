"""The first round's families (examples/llama.linnet, gpt2.linnet, bert.linnet) on every backend, as issue 17 asks of
every zoo model: a shrunk checkpoint made by transformers with a seed, perturbed away from its init, saved with
`save_pretrained` and loaded through its folder on torch-interpret, torch, torch-compile, jax, xla and onnxruntime.

The older parity files test these families on some backends each (the embedded SmolLM2 and MiniLM checkpoints,
per-backend files); this one runs the same shrunk-checkpoint comparison on all of them, with the harness the newer
zoo families use (`tests/runtimes/zoo_decoders.py`): decoders' logits at every position, 32 greedy tokens and
cached against uncached decode; the encoder's hidden states at every position of a batch padded on both sides.

On a TPU (the tests marked tpu, JAX's backends): BERT as above, and SmolLM2's architecture at a shrunk size with the
decoders' checks in f32, and in bf16 against transformers' f32 within bf16's reach."""

from __future__ import annotations

import numpy as np
import pytest

from linnet.runtimes.backends import BACKENDS
from tests.runtimes.conftest import (
    BERT,
    GPT2,
    LLAMA,
    TPU_BACKENDS,
    TPU_LOGITS_ATOL,
    TPU_STATES_ATOL,
    device_label,
    linnet_greedy,
    max_abs_diff,
    on_devices,
    padded_encoder_batch,
    perturb,
    record,
    run_device,
)
from tests.runtimes.zoo_decoders import BACKENDS as DECODER_BACKENDS
from tests.runtimes.zoo_decoders import GREEDY_TOKENS, MAX_POSITIONS, Reference, check_decoder, save_seeded

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_torch_thread")]

VOCAB = 256
STATES_ATOL = 1e-4  # as test_parity_roberta's
SMOLLM2 = "seeded 2-layer SmolLM2-135M shape, GQA 9/3, tied"
# bf16 on a TPU (its bf16 dots: bf16 products summed in f32) against transformers in f32. JAX's bf16 on the CPU (the
# same arithmetic: matrices held in f32) is 0.017 from it on the shrunk SmolLM2's logits, and transformers' own bf16
# 0.022: bf16 keeps 8 bits, steps of 0.0156 at the largest logit (2.1). A wrong rope, mask or weight moves them by ~1.
BF16_LOGITS_ATOL = 0.1
# A top-2 gap of transformers' f32 logits under which bf16 may pick the other token (~3 times bf16's distance).
BF16_NEAR_TIE = 0.05


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


@pytest.mark.parametrize("backend, device", on_devices(DECODER_BACKENDS))
def test_small_bert_hidden_states(small_bert, backend, device):
    folder, ref = small_bert
    if (why := BACKENDS[backend].unavailable(run_device(device))) is not None:
        pytest.skip(why)
    m = BACKENDS[backend].load(BERT, weights=folder, max_batch=3, device=run_device(device), progress=False)
    ids, mask = padded_encoder_batch(VOCAB, 0, 1)
    (states,) = m.run("forward", ids.numpy(), mask.numpy())
    with torch.inference_mode():
        theirs = ref(input_ids=ids, attention_mask=mask).last_hidden_state
    # the padded positions' states are what transformers computes for them too: compare every position
    delta = max_abs_diff(states, theirs)
    label = device_label(backend, device)
    record(f"small BERT ({label}) last_hidden_state [3, 12, 32], every position, padded both sides", delta,
           model="bert", backend=label, checkpoint="seeded 2-layer, padded both sides")  # fmt: skip
    assert delta < (TPU_STATES_ATOL if device == "tpu" else STATES_ATOL)


@pytest.fixture(scope="module")
def small_smollm2(tmp_path_factory):
    """(folder, Reference, top-2 gap of transformers' f32 logits at each of its greedy tokens) of SmolLM2-135M's
    architecture (HuggingFaceTB/SmolLM2-135M-Instruct's config.json: 9 query heads over 3 key/value heads, rope_theta
    1e5, rms_norm_eps 1e-5, tied head) shrunk to 2 layers, head_dim 8 and a vocabulary of 256, saved by transformers."""
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=72, intermediate_size=192, num_hidden_layers=2, num_attention_heads=9,
        num_key_value_heads=3, max_position_embeddings=MAX_POSITIONS, rms_norm_eps=1e-5, rope_theta=100000.0,
        tie_word_embeddings=True,
    )  # fmt: skip
    folder = tmp_path_factory.mktemp("smollm2")
    model = save_seeded(config, folder, seed=11)
    ref = Reference(model, VOCAB)
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([ref.prompt + ref.greedy])).logits[0, len(ref.prompt) - 1 : -1]
    top2 = logits.topk(2, dim=-1).values
    return folder, ref, (top2[:, 0] - top2[:, 1]).tolist()


@pytest.mark.tpu
@pytest.mark.parametrize("backend", TPU_BACKENDS)
def test_small_smollm2_on_tpu(small_smollm2, backend):
    """f32 on the chip: the decoders' checks within TPU_LOGITS_ATOL. Tokens are compared exactly: transformers' top-2
    gaps here are 0.0078 or more in the forward and 0.078 or more along its greedy path, over twice the bound."""
    folder, ref, gaps = small_smollm2
    assert min(gaps) > 2 * TPU_LOGITS_ATOL
    check_decoder(LLAMA, folder, ref, backend, SMOLLM2, device="tpu")


@pytest.mark.tpu
@pytest.mark.parametrize("backend", TPU_BACKENDS)
def test_small_smollm2_bf16_on_tpu(small_smollm2, backend, tpu_device):
    """bf16 under `equivalent` (the default numerics) against transformers in f32: the logits at every position within
    BF16_LOGITS_ATOL, their argmax transformers' but at near ties, and the greedy tokens (KV cache in bf16)
    transformers' f32 ones up to the first that transformers picks by a near tie."""
    import linnet
    from linnet.runtimes.backends.jax_backend import F32_MATRICES_NOTE

    folder, ref, gaps = small_smollm2
    m = linnet.load(LLAMA, folder, backend=backend, dtype="bf16", device=tpu_device, max_positions=MAX_POSITIONS,
                    progress=False)  # fmt: skip
    assert [n for n in m.notes if n != F32_MATRICES_NOTE] == []  # (the CPU's note: bf16 matrices held in f32)
    logits = np.asarray(m.forward(ref.ids.numpy()), np.float32)
    delta = max_abs_diff(logits, ref.logits)
    label = device_label(backend, "tpu")
    record(f"{SMOLLM2} bf16 ({label}) logits {list(logits.shape)} vs transformers f32", delta, model="llama",
           backend=label, checkpoint=SMOLLM2)  # fmt: skip
    assert np.isfinite(logits).all() and delta < BF16_LOGITS_ATOL

    top2 = np.sort(ref.logits, axis=-1)[..., -2:]
    differ = logits.argmax(-1) != ref.logits.argmax(-1)
    assert (top2[..., 1] - top2[..., 0])[differ].max(initial=0) < BF16_NEAR_TIE, np.argwhere(differ)

    sure = next((i for i, gap in enumerate(gaps) if gap < BF16_NEAR_TIE), len(gaps))
    assert sure >= GREEDY_TOKENS // 2, gaps  # the reference leaves enough tokens to compare
    tokens = linnet_greedy(m, ref.prompt, GREEDY_TOKENS)
    agree = next((i for i, (a, b) in enumerate(zip(tokens, ref.greedy)) if a != b), GREEDY_TOKENS)
    print(f"{SMOLLM2} bf16 ({label}): greedy tokens agree with transformers f32 for {agree}/{GREEDY_TOKENS}")
    assert tokens[:sure] == ref.greedy[:sure]
