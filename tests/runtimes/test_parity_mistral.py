"""examples/mistral.linnet against transformers' MistralForCausalLM.

At real size (no weights): the source checks clean under each preset, and each preset's parameters are those of
transformers' model for that config built on the `meta` device (names, shapes and count). At shrunk size: a
seeded 2-layer Mistral (GQA 8/2, a sliding window of 6 positions, shorter than every prompt), its norms perturbed
away from 1, saved with `save_pretrained` and loaded through the folder on every backend: logits at every position,
32 greedy tokens (the decode runs far past the window), and cached decode against recomputation at every position.
The reference is transformers' eager attention (`attn_implementation="eager"`), the maths the source states."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from linnet.runtimes.backends import BACKENDS
from linnet.semantics.program import Document
from tests.runtimes.conftest import (
    ALL_BACKENDS,
    LOGITS_ATOL,
    MISTRAL,
    hf_greedy,
    linnet_greedy,
    max_abs_diff,
    perturb,
    record,
    report,
)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_torch_thread")]

VOCAB = 256
WINDOW = 6
MAX_POSITIONS = 64
GREEDY_TOKENS = 32

# The real configs of the presets (the checkpoints' config.json, less bookkeeping).
REAL_CONFIGS = {
    "mistral_7b_instruct_v0_3": dict(
        vocab_size=32768, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, head_dim=128, max_position_embeddings=32768, rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, sliding_window=None,
    ),
    "mistral_7b_v0_1": dict(
        vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, max_position_embeddings=32768, rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, sliding_window=4096,
    ),
}  # fmt: skip


def analysis():
    return Document(str(MISTRAL), MISTRAL.read_text(encoding="utf-8")).analyze()


def test_checks_clean_under_every_preset():
    result = analysis()
    assert result.diagnostics == []
    assert sorted(result.presets) == sorted(REAL_CONFIGS)


@pytest.mark.parametrize("preset", sorted(REAL_CONFIGS))
def test_preset_parameters_are_the_real_checkpoints(preset):
    """Names, shapes and count of the preset's parameters against transformers' model of the real config on the
    `meta` device (no memory: the header-only description of the checkpoint)."""
    with torch.device("meta"):
        ref = transformers.MistralForCausalLM(transformers.MistralConfig(**REAL_CONFIGS[preset]))
    theirs = {name: tuple(p.shape) for name, p in ref.state_dict().items()}
    tree = analysis().trees[preset]
    ours = {p.path: p.shape() for p in tree.params}
    assert ours == theirs
    assert tree.param_count() == ref.num_parameters()


@pytest.mark.parametrize("preset", sorted(REAL_CONFIGS))
def test_preset_config_is_the_real_config_json(preset, tmp_path):
    """Every field of the preset equals the value in the config.json transformers writes for the real config
    (rotary settings read as `checkpoints.normalize_config` reads them), so a preset cannot drift from its
    checkpoint in a value the parameter shapes do not show (rope_theta, rms_norm_eps, sliding_window). The
    fields transformers has no key for (`attention_bias`, `mlp_bias`: read by the Llama modules Mistral imports)
    hold the value transformers implies."""
    from linnet.ir import build
    from linnet.runtimes.export.hf import IMPLIED_FIELDS
    from linnet.runtimes.formats.checkpoints import normalize_config

    transformers.MistralConfig(**REAL_CONFIGS[preset]).save_pretrained(tmp_path)
    real = normalize_config(json.loads((tmp_path / "config.json").read_text()))
    ours = build(MISTRAL, preset=preset).config
    implied = {key: value(ours) for key, value in IMPLIED_FIELDS["mistral"].items()}
    assert {key: ours[key] for key in implied} == implied and not implied.keys() & real.keys()
    assert {key: real[key] for key in ours if key not in implied} == {k: v for k, v in ours.items() if k not in implied}


# std.attention's masks over queries at positions 10..21 (a decode-like offset) and keys 0..23.
MASKS_SOURCE = """config C {
    window: int = 5
}
model Masks(c: C) {
    entry fn sliding(query_positions: i64[B, S], key_positions: i64[T]) -> bool[B, S, T] {
        sliding_window_mask(query_positions, key_positions, c.window)
    }
}
"""


@pytest.mark.parametrize("window", [1, 5, 30])
def test_sliding_window_mask_is_transformers(tmp_path, window):
    """`sliding_window_mask` against masking_utils' `sliding_window_causal_mask_function` (`q - window < kv <= q`),
    for a window of one key, one shorter than the queries' positions and one longer than every key."""
    from transformers.masking_utils import sliding_window_causal_mask_function

    source = tmp_path / "masks.linnet"
    source.write_text(MASKS_SOURCE)
    m = BACKENDS["torch-interpret"].load(source, config={"window": window}, random_weights=True, progress=False)
    queries, keys = np.arange(10, 22)[None], np.arange(24)
    (ours,) = m.run("sliding", queries, keys)
    rule = sliding_window_causal_mask_function(window)
    theirs = rule(0, 0, torch.from_numpy(queries[0])[:, None], torch.from_numpy(keys)[None, :]).tolist()
    assert ours[0].tolist() == theirs


def small_config(sliding_window: int | None = WINDOW):
    return transformers.MistralConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=8,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=128, rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 100.0}, sliding_window=sliding_window,
        initializer_range=0.1, bos_token_id=0, eos_token_id=1, pad_token_id=None,
    )  # fmt: skip


@pytest.fixture(scope="module")
def small_mistral(tmp_path_factory):
    """(folder, transformers model) of a seeded 2-layer Mistral with a 6-position window, saved with save_pretrained."""
    torch.manual_seed(0)
    model = transformers.MistralForCausalLM._from_config(small_config(), attn_implementation="eager").eval()
    perturb(model, seed=2)
    folder = tmp_path_factory.mktemp("mistral")
    model.save_pretrained(folder)
    return folder, model


def prompts(n: int, length: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(2, VOCAB, (n, length), generator=g)


def load(backend: str, folder, max_batch: int = 1):
    if (why := BACKENDS[backend].unavailable("cpu")) is not None:
        pytest.skip(why)
    return BACKENDS[backend].load(MISTRAL, weights=folder, max_batch=max_batch, max_positions=MAX_POSITIONS,
                                  progress=False)  # fmt: skip


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_logits_and_greedy_tokens(small_mistral, backend):
    folder, ref = small_mistral
    m = load(backend, folder, max_batch=2)
    assert m.config["sliding_window"] == WINDOW and m.config["num_key_value_heads"] == 2
    ids = prompts(2, 24, seed=3)
    (ours,) = m.run("forward", ids.numpy())
    with torch.inference_mode():
        theirs = ref(input_ids=ids).logits
    delta = max_abs_diff(ours, theirs)
    what = f"small Mistral (window {WINDOW}, {backend}) logits [2, 24, {VOCAB}], every position"
    record(what, delta, model="mistral", backend=backend, checkpoint=f"seeded 2-layer, window {WINDOW}")
    assert delta < LOGITS_ATOL
    assert torch.equal(torch.from_numpy(ours).argmax(-1), theirs.argmax(-1))

    prompt = ids[0, :12].tolist()
    assert linnet_greedy(m, prompt, GREEDY_TOKENS) == hf_greedy(ref, prompt, GREEDY_TOKENS)


@pytest.mark.parametrize("backend", ALL_BACKENDS)
@pytest.mark.parametrize("prefill", [1, 9])
def test_cached_decode_equals_recompute_past_the_window(small_mistral, backend, prefill):
    """A prefill (1 token, or 9: longer than the window), then decode steps to position 29: the step logits at every
    position equal the forward's over the whole sequence."""
    folder, _ = small_mistral
    m = load(backend, folder)
    ids = prompts(1, 30, seed=4).numpy()
    (full,) = m.run("forward", ids)
    m.reset_state()
    got = [m.run("step", ids[:, :prefill], np.array([0]), np.array([0]))[0][0]]
    for p in range(prefill, ids.shape[1]):
        got.append(m.run("step", ids[:, p : p + 1], np.array([p]), np.array([0]))[0][0])
    delta = max_abs_diff(np.stack(got), full[0, prefill - 1 :])
    what = f"small Mistral ({backend}) step (prefill {prefill}, decode to 29) vs forward, every position"
    record(
        what, delta, model="mistral", backend=backend, checkpoint=f"seeded 2-layer, window {WINDOW}", against="forward"
    )
    assert delta < 1e-4


def test_the_window_would_show(small_mistral):
    """The same weights with full attention give logits far outside the tolerance past the window, so the
    comparisons above check the sliding window (and not plain causal attention)."""
    folder, ref = small_mistral
    full = transformers.MistralForCausalLM._from_config(small_config(None), attn_implementation="eager").eval()
    full.load_state_dict(ref.state_dict())
    ids = prompts(2, 24, seed=3)
    with torch.inference_mode():
        delta = max_abs_diff(full(input_ids=ids).logits, ref(input_ids=ids).logits)
    report("small Mistral with full attention, against the windowed one", delta)
    assert delta > 100 * LOGITS_ATOL
    m = load("torch", folder)
    m_full = BACKENDS["torch"].load(MISTRAL, weights=folder, config={"sliding_window": None},
                                    max_positions=MAX_POSITIONS, progress=False)  # fmt: skip
    with torch.inference_mode():
        theirs = full(input_ids=ids).logits
    assert max_abs_diff(m_full.run("forward", ids.numpy())[0], theirs) < LOGITS_ATOL
    assert max_abs_diff(m.run("forward", ids.numpy())[0][:, :WINDOW], theirs[:, :WINDOW]) < LOGITS_ATOL


def test_a_config_json_written_as_v0_3_ships_loads(small_mistral, tmp_path):
    """Mistral 7B Instruct v0.3's config.json spelling (transformers 4.42: flat `rope_theta`, no `head_dim`,
    `"sliding_window": null`, `torch_dtype`) over the small weights: loaded as full causal attention, as
    transformers loads it."""
    folder, ref = small_mistral
    out = tmp_path / "v0_3"
    shutil.copytree(folder, out)
    c = ref.config
    config_json = {
        "architectures": ["MistralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2,
        "hidden_act": "silu", "hidden_size": c.hidden_size, "initializer_range": 0.02,
        "intermediate_size": c.intermediate_size, "max_position_embeddings": c.max_position_embeddings,
        "model_type": "mistral", "num_attention_heads": c.num_attention_heads, "num_hidden_layers": 2,
        "num_key_value_heads": c.num_key_value_heads, "rms_norm_eps": c.rms_norm_eps, "rope_theta": 100.0,
        "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "float32",
        "transformers_version": "4.42.0.dev0", "use_cache": True, "vocab_size": VOCAB,
    }  # fmt: skip
    (out / "config.json").write_text(json.dumps(config_json, indent=2))
    theirs_model = transformers.MistralForCausalLM.from_pretrained(out, attn_implementation="eager").eval()
    assert theirs_model.config.sliding_window is None
    m = load("torch", out)
    assert m.config["sliding_window"] is None and m.config["head_dim"] == 8
    ids = prompts(2, 24, seed=3)
    with torch.inference_mode():
        theirs = theirs_model(input_ids=ids).logits
    delta = max_abs_diff(m.run("forward", ids.numpy())[0], theirs)
    report("small Mistral, v0.3-style config.json (no window), torch", delta)
    assert delta < LOGITS_ATOL


def test_a_sliding_window_of_zero_is_refused(tmp_path):
    """`sliding_window: 0` masks every key, which would run as a uniform softmax (finite and wrong): L505."""
    import linnet
    from linnet.errors import LinnetError

    config = transformers.MistralConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                        num_attention_heads=4, num_key_value_heads=2, sliding_window=0)  # fmt: skip
    transformers.MistralForCausalLM(config).save_pretrained(tmp_path)
    with pytest.raises(LinnetError, match=r"L505.*`sliding_window` must be >= 1"):
        linnet.load(MISTRAL, tmp_path, backend="torch", max_positions=32, progress=False)
