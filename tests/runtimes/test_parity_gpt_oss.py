"""examples/gpt_oss.linnet against transformers' GptOssForCausalLM.

At real size (no weights): the source checks clean under its preset, and gpt-oss-20b's parameters are those of
transformers' model for that config built on the `meta` device (names, shapes and count; the released checkpoint's
MXFP4 layout is test_parity_gpt_oss_mxfp4.py's). At shrunk size: a seeded 2-layer GPT-OSS (one sliding layer with
a 6-position window, shorter than every prompt, then one full layer; GQA 8/2; 4 experts, 2 per token; YaRN), every
parameter perturbed (norms, biases, sinks, router), saved with `save_pretrained` and loaded through the folder on
every backend: logits at every position (the dense experts of `forward`), 32 greedy tokens (generation runs the
sparse experts of `decode`), and cached decode (dense `step` and sparse `decode`) against recomputation at every
position past the window. The reference is transformers' eager attention (`attn_implementation="eager"`), the maths
the source states."""

from __future__ import annotations

import json

import numpy as np
import pytest

from linnet.runtimes.backends import BACKENDS
from linnet.semantics.program import Document
from tests.runtimes.conftest import (
    ALL_BACKENDS,
    GPT_OSS,
    LOGITS_ATOL,
    header_only_checkpoint,
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

# openai/gpt-oss-20b's config.json, as transformers 5 reads it (less bookkeeping and the quantization_config).
REAL_CONFIGS = {
    "gpt_oss_20b": dict(
        vocab_size=201088, hidden_size=2880, intermediate_size=2880, num_hidden_layers=24, num_attention_heads=64,
        num_key_value_heads=8, head_dim=64, num_local_experts=32, num_experts_per_tok=4,
        max_position_embeddings=131072, rms_norm_eps=1e-5, sliding_window=128, swiglu_limit=7.0,
        rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0,
                         "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 4096},
        layer_types=["sliding_attention", "full_attention"] * 12,
    ),
}  # fmt: skip


def analysis():
    return Document(str(GPT_OSS), GPT_OSS.read_text(encoding="utf-8")).analyze()


def test_checks_clean_under_every_preset():
    result = analysis()
    assert result.diagnostics == []
    assert sorted(result.presets) == sorted(REAL_CONFIGS)


@pytest.mark.parametrize("preset", sorted(REAL_CONFIGS))
def test_preset_parameters_are_the_real_checkpoints(preset):
    """Names, shapes and count of the preset's parameters against transformers' model of the real config on the
    `meta` device (no memory: the header-only description of the checkpoint, in its unquantized layout)."""
    with torch.device("meta"):
        ref = transformers.GptOssForCausalLM(transformers.GptOssConfig(**REAL_CONFIGS[preset]))
    theirs = {name: tuple(p.shape) for name, p in ref.state_dict().items()}
    tree = analysis().trees[preset]
    ours = {p.path: p.shape() for p in tree.params}
    assert ours == theirs
    assert tree.param_count() == ref.num_parameters()


@pytest.mark.parametrize("preset", sorted(REAL_CONFIGS))
def test_preset_config_is_the_real_config_json(preset, tmp_path):
    """Every field of the preset equals the value in the config.json transformers writes for the real config
    (rotary settings read as `checkpoints.normalize_config` reads them; YaRN fields the real config leaves out are
    `none` in both), so a preset cannot drift from its checkpoint in a value the parameter shapes do not show."""
    from linnet.ir import build
    from linnet.runtimes.formats.checkpoints import normalize_config

    transformers.GptOssConfig(**REAL_CONFIGS[preset]).save_pretrained(tmp_path)
    real = normalize_config(json.loads((tmp_path / "config.json").read_text()))
    ours = build(GPT_OSS, preset=preset).config
    assert (
        ours.pop("quantization_config") is None
    )  # how a checkpoint stores the experts, not the model (test_parity_gpt_oss_mxfp4)
    real["rope_scaling"] = {key: real["rope_scaling"].get(key) for key in ours["rope_scaling"]}
    assert {key: real[key] for key in ours} == ours


def small_config(**changes):
    base = dict(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=32, num_hidden_layers=2, num_attention_heads=8,
        num_key_value_heads=2, head_dim=8, num_local_experts=4, num_experts_per_tok=2, sliding_window=WINDOW,
        max_position_embeddings=128, layer_types=["sliding_attention", "full_attention"],
        rope_parameters={"rope_type": "yarn", "rope_theta": 100.0, "factor": 4.0, "beta_fast": 32.0,
                         "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 32},
        initializer_range=0.1, bos_token_id=0, eos_token_id=1, pad_token_id=None,
    )  # fmt: skip
    return transformers.GptOssConfig(**(base | changes))


def small_model(**changes):
    torch.manual_seed(0)
    model = transformers.GptOssForCausalLM._from_config(small_config(**changes), attn_implementation="eager").eval()
    perturb(model, seed=2)
    return model


@pytest.fixture(scope="module")
def small_gpt_oss(tmp_path_factory):
    """(folder, transformers model) of the seeded small GPT-OSS, saved with save_pretrained."""
    model = small_model()
    folder = tmp_path_factory.mktemp("gpt_oss")
    model.save_pretrained(folder)
    return folder, model


def prompts(n: int, length: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(2, VOCAB, (n, length), generator=g)


def load(backend: str, folder, max_batch: int = 1, **kwargs):
    if (why := BACKENDS[backend].unavailable("cpu")) is not None:
        pytest.skip(why)
    return BACKENDS[backend].load(GPT_OSS, weights=folder, max_batch=max_batch, max_positions=MAX_POSITIONS,
                                  progress=False, **kwargs)  # fmt: skip


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_logits_and_greedy_tokens(small_gpt_oss, backend):
    folder, ref = small_gpt_oss
    m = load(backend, folder, max_batch=2)
    assert m.config["layer_types"] == ["sliding_attention", "full_attention"] and m.config["num_local_experts"] == 4
    ids = prompts(2, 24, seed=3)
    (ours,) = m.run("forward", ids.numpy())
    with torch.inference_mode():
        theirs = ref(input_ids=ids).logits
    delta = max_abs_diff(ours, theirs)
    record(f"small GPT-OSS (window {WINDOW}, experts 2 of 4, {backend}) logits [2, 24, {VOCAB}], every position", delta,
           model="gpt_oss", backend=backend, checkpoint=f"seeded 2-layer, window {WINDOW}, experts 2 of 4")  # fmt: skip
    assert delta < LOGITS_ATOL
    assert torch.equal(torch.from_numpy(ours).argmax(-1), theirs.argmax(-1))

    prompt = ids[0, :12].tolist()
    assert linnet_greedy(m, prompt, GREEDY_TOKENS) == hf_greedy(ref, prompt, GREEDY_TOKENS)


@pytest.mark.parametrize("backend", ALL_BACKENDS)
@pytest.mark.parametrize("prefill", [1, 9])
def test_cached_decode_equals_recompute_past_the_window(small_gpt_oss, backend, prefill):
    """A prefill (1 token, or 9: longer than the window), then decode steps to position 29, by `step` (every expert
    on every token) and by `decode` (each token through its chosen experts, the form generation runs): the logits at
    every position equal the forward's over the whole sequence."""
    folder, _ = small_gpt_oss
    m = load(backend, folder)
    ids = prompts(1, 30, seed=4).numpy()
    (full,) = m.run("forward", ids)
    for entry in ("step", "decode"):
        m.reset_state()
        got = [m.run("step", ids[:, :prefill], np.array([0]), np.array([0]))[0][0]]
        for p in range(prefill, ids.shape[1]):
            got.append(m.run(entry, ids[:, p : p + 1], np.array([p]), np.array([0]))[0][0])
        delta = max_abs_diff(np.stack(got), full[0, prefill - 1 :])
        record(f"small GPT-OSS ({backend}) {entry} (prefill {prefill}, decode to 29) vs forward, every position",
               delta, model="gpt_oss", backend=backend, checkpoint=f"seeded 2-layer, window {WINDOW}, experts 2 of 4",
               against="forward")  # fmt: skip
        assert delta < 1e-4


@pytest.mark.parametrize(
    "what, change",
    [
        ("sinks at zero", lambda sd: {k: (v * 0 if k.endswith("sinks") else v) for k, v in sd.items()}),
        ("its experts in reverse order", lambda sd: {k: (v.flip(0) if "experts" in k else v) for k, v in sd.items()}),
    ],
)
def test_the_pieces_would_show(small_gpt_oss, what, change):
    """The reference with its sinks zeroed or its experts permuted gives logits far outside the tolerance, so the
    comparisons above check the sinks and the routing (a source that ignored them would fail)."""
    _, ref = small_gpt_oss
    other = small_model()
    other.load_state_dict(change(ref.state_dict()))
    ids = prompts(2, 24, seed=3)
    with torch.inference_mode():
        delta = max_abs_diff(other(input_ids=ids).logits, ref(input_ids=ids).logits)
    report(f"small GPT-OSS with {what}, against the original", delta)
    assert delta > 100 * LOGITS_ATOL


def test_layer_types_choose_each_layers_mask(small_gpt_oss, tmp_path):
    """The same weights with the layer types swapped (full, then sliding), and with every layer full: each equal to
    transformers under that config, and far from the original past the window."""
    folder, ref = small_gpt_oss
    ids = prompts(2, 24, seed=3)
    for layer_types in (["full_attention", "sliding_attention"], ["full_attention", "full_attention"]):
        other = small_model(layer_types=layer_types)
        other.load_state_dict(ref.state_dict())
        m = load("torch", folder, config={"layer_types": layer_types})
        with torch.inference_mode():
            theirs = other(input_ids=ids).logits
            assert max_abs_diff(theirs, ref(input_ids=ids).logits) > 100 * LOGITS_ATOL
        assert max_abs_diff(m.run("forward", ids.numpy())[0], theirs) < LOGITS_ATOL


@pytest.mark.parametrize(
    "rope",
    [
        {"truncate": True},
        {"truncate": True, "beta_fast": 8.0, "factor": 16.0},
        {"attention_factor": 1.3},
        {"mscale": 0.9, "mscale_all_dim": 0.5},
    ],
    ids=str,
)
def test_yarn_variants_are_transformers(small_gpt_oss, tmp_path, rope):
    """YaRN's rounded correction range (`truncate`, the Qwen and DeepSeek spelling), another beta and factor, an
    explicit attention factor and the two-`mscale` ratio: the same weights under each rope, against transformers."""
    _, ref = small_gpt_oss
    params = dict(small_config().rope_parameters) | rope
    other = small_model(rope_parameters=params)
    other.load_state_dict(ref.state_dict())
    folder = tmp_path / "rope"
    other.save_pretrained(folder)
    m = load("torch", folder)
    ids = prompts(2, 24, seed=3)
    with torch.inference_mode():
        theirs = other(input_ids=ids).logits
    delta = max_abs_diff(m.run("forward", ids.numpy())[0], theirs)
    report(f"small GPT-OSS, YaRN {rope}, torch", delta)
    assert delta < LOGITS_ATOL


TOP_K_SOURCE = """config C {
    k: int = 2
}
model TopK(c: C) {
    entry fn chosen(x: f32[B, S, N]) -> bool[B, S, N] {
        top_k_mask(x, c.k)
    }
}
"""


@pytest.mark.parametrize("k", [1, 2, 5])
def test_top_k_mask_is_torch_topk(tmp_path, k):
    """std's `top_k_mask` marks the entries torch.topk returns (random logits over 5 experts), and with ties (small
    integers) the first `k` of a stable sort by decreasing value: ties go to the lower index."""
    source = tmp_path / "top_k.linnet"
    source.write_text(TOP_K_SOURCE)
    m = BACKENDS["torch-interpret"].load(source, config={"k": k}, random_weights=True, progress=False)
    g = torch.Generator().manual_seed(k)
    logits = torch.randn(3, 7, 5, generator=g)
    (ours,) = m.run("chosen", logits.numpy())
    theirs = torch.zeros_like(logits, dtype=torch.bool).scatter_(-1, torch.topk(logits, k, dim=-1).indices, True)
    assert ours.tolist() == theirs.tolist()
    ties = torch.randint(0, 3, (3, 7, 5), generator=g).float()
    (ours,) = m.run("chosen", ties.numpy())
    order = np.argsort(-ties.numpy(), axis=-1, kind="stable")[..., :k]
    stable = np.zeros(ties.shape, dtype=bool)
    np.put_along_axis(stable, order, True, axis=-1)
    assert ours.tolist() == stable.tolist()


@pytest.mark.parametrize("preset", sorted(REAL_CONFIGS))
def test_the_real_checkpoint_layout_fits_every_parameter(preset, tmp_path):
    """L501/L502 against a header-only description of the real checkpoint (unquantized, as transformers saves
    GptOssForCausalLM for the real config): every tensor name and shape fits the source under that config.json,
    and one wrong expert shape is refused naming the tensor."""
    from linnet.ir.build import bind_config, check_source, lower_program
    from linnet.runtimes.formats.checkpoints import open_checkpoint
    from linnet.runtimes.loading import LoadError, match_weights

    info = check_source(str(GPT_OSS), GPT_OSS.read_text(), preset)
    config = transformers.GptOssConfig(**REAL_CONFIGS[preset])
    with torch.device("meta"):
        model = transformers.GptOssForCausalLM(config)
    header_only_checkpoint(tmp_path, config, model)
    ckpt = open_checkpoint(tmp_path)
    program = lower_program(bind_config(info, ckpt.config, labels=(str(tmp_path),)), max_positions=16)
    assert program.config["layer_types"] == ["sliding_attention", "full_attention"] * 12
    notes: list[str] = []
    assert len(match_weights(program, ckpt, notes)) == len(ckpt.tensor_names) == 24 * 17 + 3 and notes == []

    with torch.device("meta"):
        model.model.layers[5].mlp.experts.down_proj = torch.nn.Parameter(torch.empty(32, 2880, 2881))
    header_only_checkpoint(tmp_path, config, model)
    with pytest.raises(LoadError, match=r"model.layers.5.mlp.experts.down_proj.*\[32, 2880, 2881\]") as err:
        match_weights(program, open_checkpoint(tmp_path), notes)
    assert err.value.code == "L501"
