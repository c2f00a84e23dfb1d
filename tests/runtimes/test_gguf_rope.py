"""Llama 3 rope scaling in GGUF files (issue 14, item 1): llama.cpp writes it as the tensor `rope_freqs.weight`
and no metadata key. Small seeded Llama models with llama3 rope scaling are written the way llama.cpp writes them,
loaded through examples/llama.linnet, and compared with transformers at every position; factor vectors no llama3
parameters reproduce are refused, naming the tensor and the file."""

from __future__ import annotations

import numpy as np
import pytest

from linnet.runtimes.formats.checkpoints import CheckpointError, open_checkpoint
from linnet.runtimes.formats.gguf_rope import llama3_rope_freqs, llama3_scaling_from_rope_freqs
from tests.runtimes.conftest import LLAMA, LOGITS_ATOL, MODES, max_abs_diff, perturb, report
from tests.runtimes.gguf_writing import llamacpp_rope_freqs, write_llama_gguf

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("gguf")

import linnet.torch as lt  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_torch_thread")]

VOCAB = 96
SEQ = 40

# (head_dim, rope_theta, llama3 parameters). With head_dim 16 and rope_theta 100 the 8 wavelengths run from 6.3
# to 4300 positions, so an original context of 64 puts several in each band (kept, smoothed, divided by factor)
# and the scaling shows from the first positions on; head_dim 8 (wavelengths 6.3, 20, 63, 199) with an original
# context of 32 leaves a single smoothed frequency, where the parameters are fixed only within bounds.
ROPES = {
    "bands": (16, 100.0, {"factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "orig": 64}),
    "one-smoothed": (8, 100.0, {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "orig": 32}),
    "odd-factors": (16, 100.0, {"factor": 3.0, "low_freq_factor": 1.5, "high_freq_factor": 6.0, "orig": 96}),
}


def llama3_model(head_dim: int, theta: float, rope: dict, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=4 * head_dim,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=head_dim,
        max_position_embeddings=128,
        rope_theta=theta,
        rope_scaling={
            "rope_type": "llama3",
            "factor": rope["factor"],
            "low_freq_factor": rope["low_freq_factor"],
            "high_freq_factor": rope["high_freq_factor"],
            "original_max_position_embeddings": rope["orig"],
        },
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        initializer_range=0.1,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    perturb(model, seed=seed + 1)
    return model


@pytest.fixture(scope="module", params=list(ROPES))
def llama3_gguf(request, tmp_path_factory):
    """(path, transformers model) of a Llama 3-style model written as llama.cpp writes it."""
    head_dim, theta, rope = ROPES[request.param]
    model = llama3_model(head_dim, theta, rope)
    path = tmp_path_factory.mktemp(f"gguf-{request.param}") / "llama3.gguf"
    write_llama_gguf(path, model, rope_freqs=llamacpp_rope_freqs(model.config))
    return path, model


def ids(seed: int = 3) -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(seed))


def test_rope_freqs_become_llama3_scaling_that_reproduces_them(llama3_gguf):
    path, model = llama3_gguf
    stored = llamacpp_rope_freqs(model.config)
    assert (stored > 1).any() and (stored == 1).any(), "the case must scale some frequencies and keep others"
    with open_checkpoint(path) as ckpt:
        scaling = ckpt.config["rope_scaling"]
        assert scaling["rope_type"] == "llama3"
        assert scaling["factor"] == pytest.approx(model.config.rope_parameters["factor"])
        assert "rope_freqs.weight" in ckpt.buffer_names
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    # the recovered parameters give transformers' own llama3 frequencies
    theirs, _ = ROPE_INIT_FUNCTIONS["llama3"](model.config, "cpu")
    dim = model.config.head_dim
    default = 1.0 / (model.config.rope_parameters["rope_theta"] ** (np.arange(0, dim, 2) / dim))
    ours = default / llama3_rope_freqs(default.astype(np.float32), scaling)
    np.testing.assert_allclose(ours, theirs.double().numpy(), rtol=1e-5)


@pytest.mark.parametrize("mode", MODES)
def test_llama3_gguf_logits_match_transformers_at_every_position(llama3_gguf, mode):
    path, model = llama3_gguf
    m = lt.load(LLAMA, weights=path, mode=mode, max_positions=64, progress=False)
    x = ids()
    ours = torch.from_numpy(m.forward(x.numpy()))
    with torch.inference_mode():
        theirs = model(input_ids=x).logits
    delta = max_abs_diff(ours, theirs)
    report(f"Llama 3-style GGUF, rope_freqs.weight ({path.parent.name}, {mode}) logits at all {SEQ} positions", delta)
    assert delta < LOGITS_ATOL
    assert torch.equal(ours.argmax(-1), theirs.argmax(-1))


def test_dropping_the_factors_would_show(llama3_gguf):
    """Without the factors (the bug: loaded as plain rope) the logits are far outside the tolerance from the first
    positions on, so the comparison above checks the factors."""
    from transformers import LlamaForCausalLM

    _, model = llama3_gguf
    config = model.config.__class__.from_dict(model.config.to_dict())
    config.rope_parameters = {"rope_type": "default", "rope_theta": model.config.rope_parameters["rope_theta"]}
    plain = LlamaForCausalLM(config).eval()
    plain.load_state_dict(model.state_dict())
    x = ids()
    with torch.inference_mode():
        early = max_abs_diff(plain(input_ids=x[:, :16]).logits, model(input_ids=x[:, :16]).logits)
    report(f"{model.config.head_dim}-dim heads without the llama3 factors, positions 0-15", early)
    assert early > 100 * LOGITS_ATOL


def test_llama_3_1_factors_give_its_published_parameters():
    """The vector llama.cpp writes for Llama 3.1 8B (head_dim 128, rope_theta 500000, factor 8) maps back to its
    config.json's rope_scaling exactly."""
    from transformers import LlamaConfig

    published = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    config = LlamaConfig(
        head_dim=128, max_position_embeddings=131072, rope_theta=500000.0, rope_scaling=dict(published)
    )
    stored = llamacpp_rope_freqs(config)
    assert llama3_scaling_from_rope_freqs(stored, rope_theta=500000.0, head_dim=128, where="x.gguf") == published


def test_all_ones_is_no_scaling():
    assert llama3_scaling_from_rope_freqs(np.ones(8, np.float32), rope_theta=1e4, head_dim=16, where="x") is None


def _refused(tmp_path, stored, **kwargs):
    model = llama3_model(*ROPES["bands"][:2], ROPES["bands"][2])
    path = tmp_path / "bad.gguf"
    write_llama_gguf(path, model, rope_freqs=stored, **kwargs)
    with pytest.raises(CheckpointError) as e:
        open_checkpoint(path)
    assert str(path) in str(e.value)
    return str(e.value)


def test_factors_no_llama3_parameters_reproduce_are_refused(tmp_path):
    model = llama3_model(*ROPES["bands"][:2], ROPES["bands"][2])
    stored = llamacpp_rope_freqs(model.config)
    band = np.flatnonzero((stored > 1) & (stored < stored[-1]))
    stored[band[1]] *= 1.02  # off the line every llama3 smoothed band lies on
    message = _refused(tmp_path, stored)
    assert "'rope_freqs.weight'" in message and "no llama3 rope scaling" in message


@pytest.mark.parametrize(
    "stored, words",
    [
        (np.full(5, 2.0, np.float32), "shape [5], expected [8]"),
        (np.array([1, 1, 1, 0, 2, 2, 2, 2], np.float32), "not finite and positive"),
        (np.array([1, 1, 1, np.nan, 2, 2, 2, 2], np.float32), "not finite and positive"),
        (np.array([2, 2, 2, 2, 1, 1, 1, 1], np.float32), "no llama3 rope scaling"),  # scaled the wrong way round
    ],
)
def test_malformed_factor_vectors_are_refused(tmp_path, stored, words):
    message = _refused(tmp_path, stored)
    assert "'rope_freqs.weight'" in message and words in message


def test_factors_with_linear_scaling_keys_are_refused(tmp_path):
    model = llama3_model(*ROPES["bands"][:2], ROPES["bands"][2])
    stored = llamacpp_rope_freqs(model.config)
    extra = {"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 2.0}
    assert "rope_freqs.weight" in _refused(tmp_path, stored, extra_metadata=extra)
