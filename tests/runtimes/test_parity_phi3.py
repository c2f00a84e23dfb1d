"""examples/phi3.linnet against transformers' Phi-3: the presets check and count transformers' parameters at
the real sizes (instantiated on the meta device); small seeded Phi-3 models (2 layers, GQA 8/2, fused
`qkv_proj` and `gate_up_proj`, partial rotary, LongRoPE switching to `long_factor` past a short original
context, a sliding window shorter than the prompt), saved with `save_pretrained` and loaded through the folder
path on every backend: logits at every position, 32 greedy tokens, and the KV cache against recomputation."""

from __future__ import annotations

import json

import numpy as np
import pytest

from linnet.runtimes.backends import BACKENDS
from linnet.semantics.program import Document
from tests.conftest import EXAMPLES
from tests.runtimes.conftest import (
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

PHI3 = EXAMPLES / "phi3.linnet"
VOCAB = 256
MAX_POSITIONS = 64
ORIGINAL = 16  # LongRoPE's original context: prompts past it take `long_factor`
WINDOW = 6
GREEDY_TOKENS = 32
FAST = ["torch-interpret", "torch", "onnxruntime"]
# each compiles every shape it meets (prefill, decode, both prompt lengths): tens of seconds on a shared core
SLOW = ["jax", "xla", "torch-compile"]
BACKENDS_RUN = FAST + [pytest.param(b, marks=pytest.mark.slow) for b in SLOW]
SMALL = {
    # longrope: rotary_dim = int(8 * 0.5) = 4, so 2 factors per list; factor 64 / 16 = 4 > 1 scales cos and sin
    "longrope": dict(
        partial_rotary_factor=0.5,
        sliding_window=WINDOW,
        rope_scaling={"type": "longrope", "short_factor": [1.0, 1.7], "long_factor": [2.5, 9.0]},
    ),
    # the 4K variant's shape: full rotary, plain rope, no window
    "plain": dict(partial_rotary_factor=1.0, sliding_window=None, rope_scaling=None),
}
REAL = {  # the presets' configs as transformers' Phi3Config takes them
    "phi3_mini_4k_instruct": dict(max_position_embeddings=4096, sliding_window=2047),
    "phi3_mini_128k_instruct": dict(max_position_embeddings=131072, sliding_window=262144),
}


def small_config(kind: str):
    return transformers.Phi3Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=MAX_POSITIONS,
        original_max_position_embeddings=ORIGINAL,
        rope_theta=100.0,
        rms_norm_eps=1e-5,
        initializer_range=0.1,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=None,
        **SMALL[kind],
    )


@pytest.fixture(scope="module", params=list(SMALL))
def small_phi3(request, tmp_path_factory):
    """(kind, folder, transformers model) of a seeded, perturbed 2-layer Phi-3 saved with save_pretrained."""
    torch.manual_seed(0)
    model = transformers.Phi3ForCausalLM(small_config(request.param)).eval()
    perturb(model, seed=2)
    folder = tmp_path_factory.mktemp(f"phi3-{request.param}")
    model.save_pretrained(folder)
    return request.param, folder, model


def prompts(n: int, length: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(2, VOCAB, (n, length), generator=g)


def load(backend: str, folder):
    reason = BACKENDS[backend].unavailable("cpu")
    if reason is not None:
        pytest.skip(reason)
    return BACKENDS[backend].load(PHI3, weights=folder, max_positions=MAX_POSITIONS, progress=False)


def test_presets_check_clean():
    analysis = Document(str(PHI3), PHI3.read_text()).analyze()
    assert analysis.diagnostics == []
    assert analysis.presets == list(REAL)


@pytest.mark.parametrize("preset", list(REAL))
def test_parameter_count_equals_transformers_at_the_real_size(preset):
    tree = Document(str(PHI3), PHI3.read_text()).analyze().trees[preset]
    with torch.device("meta"):
        real = transformers.Phi3ForCausalLM(transformers.Phi3Config(**REAL[preset]))
    assert tree.param_count() == sum(p.numel() for p in real.parameters()) == 3_821_079_552
    ours = {p.path: p.shape() for p in tree.params}
    assert ours == {name: tuple(p.shape) for name, p in real.named_parameters()}


@pytest.mark.parametrize("backend", BACKENDS_RUN)
def test_logits_at_every_position_and_greedy_tokens(small_phi3, backend):
    kind, folder, ref = small_phi3
    m = load(backend, folder)
    assert m.config["rotary_dim"] == (4 if kind == "longrope" else 8)
    # 12 positions stay in LongRoPE's original context (short factors), 24 pass it (long factors); both pass
    # the sliding window.
    for length in (12, 24):
        ids = prompts(2, length, seed=3)
        ours = torch.from_numpy(m.run("forward", ids.numpy())[0])
        with torch.inference_mode():
            theirs = ref(input_ids=ids).logits
        delta = max_abs_diff(ours, theirs)
        what = f"small Phi-3 ({kind}, {backend}) logits [2, {length}, {VOCAB}]"
        record(what, delta, model="phi3", backend=backend, checkpoint=f"seeded 2-layer, {kind}")
        assert delta < LOGITS_ATOL
        assert torch.equal(ours.argmax(-1), theirs.argmax(-1))
    prompt = prompts(1, 12, seed=4)[0].tolist()  # decoding crosses the original context and the window
    assert linnet_greedy(m, prompt, GREEDY_TOKENS) == hf_greedy(ref, prompt, GREEDY_TOKENS)


@pytest.mark.parametrize("backend", BACKENDS_RUN)
@pytest.mark.parametrize("prefill", [1, 5])
def test_cached_decode_equals_recompute(small_phi3, backend, prefill):
    """Step by step with the KV cache against `forward` over the whole prompt, at every position past the
    sliding window; 16 tokens keep `max(position_ids) + 1` within the original context for both (past it,
    transformers' LongRoPE itself gives a cached decode other factors than a recomputation)."""
    kind, folder, _ = small_phi3
    m = load(backend, folder)
    ids = prompts(1, ORIGINAL, seed=5)
    row = np.array([0])
    full = m.run("forward", ids.numpy())[0][0]
    got = [m.run("step", ids[:, :prefill].numpy(), np.array([0]), row)[0][0]]
    for p in range(prefill, ids.shape[1]):
        got.append(m.run("step", ids[:, p : p + 1].numpy(), np.array([p]), row)[0][0])
    delta = max_abs_diff(np.stack(got), full[prefill - 1 :])
    what = f"small Phi-3 ({kind}, {backend}) step (prefill {prefill}, then decode) vs forward"
    record(what, delta, model="phi3", backend=backend, checkpoint=f"seeded 2-layer, {kind}", against="forward")
    assert delta < 1e-4


def test_longrope_and_the_window_would_show(small_phi3):
    """Without LongRoPE's factors or without the window, transformers' logits move far outside the tolerance,
    so the comparisons above check both."""
    kind, _, ref = small_phi3
    if kind != "longrope":
        pytest.skip("the plain model has neither")
    ids = prompts(2, 24, seed=3)
    for change in ({"rope_scaling": None}, {"sliding_window": None}):
        config = small_config(kind)
        for key, value in change.items():
            setattr(config, key, value)
        if "rope_scaling" in change:
            config.rope_parameters = {"rope_type": "default", "rope_theta": 100.0, "partial_rotary_factor": 0.5}
        other = transformers.Phi3ForCausalLM(config).eval()
        other.load_state_dict(ref.state_dict())
        with torch.inference_mode():
            delta = max_abs_diff(other(input_ids=ids).logits, ref(input_ids=ids).logits)
        report(f"small Phi-3 with {change}, against the longrope model with its window", delta)
        assert delta > 100 * LOGITS_ATOL


def test_a_factor_list_of_the_wrong_length_is_refused(small_phi3, tmp_path):
    """LongRoPE needs one factor per rotary frequency (rotary_dim / 2 = 2 here): a config.json with 3 is an
    error naming the broadcast, not a model that runs with some frequencies unscaled."""
    kind, folder, _ = small_phi3
    if kind != "longrope":
        pytest.skip("the plain model has no factors")
    for name in ("model.safetensors", "config.json"):
        (tmp_path / name).write_bytes((folder / name).read_bytes())
    config = json.loads((tmp_path / "config.json").read_text())
    config["rope_parameters"]["short_factor"] = [1.0, 1.5, 2.0]
    (tmp_path / "config.json").write_text(json.dumps(config))
    from linnet.runtimes.loading import LoadError

    with pytest.raises(LoadError, match=r"L201.*\[2\] and \[3\]|L201.*\[3\] and \[2\]"):
        load("torch-interpret", tmp_path)


@pytest.mark.parametrize("preset", list(REAL))
def test_the_real_checkpoint_layout_fits_every_parameter(preset, tmp_path):
    """L501/L502 against a header-only description of the real checkpoint: every tensor name and shape that
    transformers saves for the real config fits the source under that config (its config.json bound as a
    loaded checkpoint's), and one wrong shape is refused naming the tensor."""
    from linnet.ir.build import bind_config, check_source, lower_program
    from linnet.runtimes.formats.checkpoints import open_checkpoint
    from linnet.runtimes.loading import LoadError, match_weights

    info = check_source(str(PHI3), PHI3.read_text(), preset)
    scaling = lower_program(info, max_positions=16).config["rope_scaling"]
    rope = {}
    if scaling is not None:  # the 128K preset's lists, written to config.json as transformers writes them
        assert scaling["rope_type"] == "longrope" and len(scaling["short_factor"]) == len(scaling["long_factor"]) == 48
        rope = {"rope_scaling": {"type": "longrope", "short_factor": scaling["short_factor"],
                                 "long_factor": scaling["long_factor"]}}  # fmt: skip
    config = transformers.Phi3Config(**REAL[preset], **rope)
    with torch.device("meta"):
        model = transformers.Phi3ForCausalLM(config)
    header_only_checkpoint(tmp_path, config, model)
    ckpt = open_checkpoint(tmp_path)
    program = lower_program(bind_config(info, ckpt.config, labels=(str(tmp_path),)), max_positions=16)
    assert program.config["rope_scaling"] == (
        None if scaling is None else {**scaling, "original_max_position_embeddings": 4096}
    )
    notes: list[str] = []
    assert len(match_weights(program, ckpt, notes)) == len(ckpt.tensor_names) == 32 * 6 + 3 and notes == []

    with torch.device("meta"):
        model.model.layers[7].self_attn.qkv_proj = torch.nn.Linear(3072, 3 * 3072 + 8, bias=False)
    header_only_checkpoint(tmp_path, config, model)
    with pytest.raises(LoadError, match=r"model.layers.7.self_attn.qkv_proj.weight.*\[9224, 3072\]") as err:
        match_weights(program, open_checkpoint(tmp_path), notes)
    assert err.value.code == "L501"
