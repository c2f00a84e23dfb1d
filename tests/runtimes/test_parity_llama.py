"""Parity of the PyTorch backend with transformers on small Llama models built from configs (GQA 8/2, llama3
rope scaling, tied and untied heads), saved with `save_pretrained` and loaded through examples/llama.linnet;
the KV cache (step) against recomputation (forward); load errors for shapes and names that don't fit."""

from __future__ import annotations

import re
import shutil

import pytest

from tests.runtimes.conftest import (
    LLAMA,
    LOGITS_ATOL,
    MODE_BACKEND,
    MODES,
    hf_greedy,
    linnet_greedy,
    max_abs_diff,
    perturb,
    record,
    report,
    rewrite_safetensors,
    safetensors_names,
)

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import linnet.torch as lt  # noqa: E402
from linnet.runtimes.loading import LoadError  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_torch_thread")]

VOCAB = 256
MAX_POSITIONS = 64
GREEDY_TOKENS = 32


def llama_config(tie: bool):
    from transformers import LlamaConfig

    # head_dim 8 gives 4 rotary frequencies; with rope_theta 100 their wavelengths are 6.3, 19.9, 62.8 and 199
    # positions, so llama3 scaling (original context 32: high-frequency cut at 32 / 4 = 8, low at 32 / 1 = 32)
    # keeps the first, interpolates the second (the smoothed band) and divides the last two by `factor`.
    return LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=128,
        rope_theta=100.0,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        },
        rms_norm_eps=1e-5,
        tie_word_embeddings=tie,
        initializer_range=0.1,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=None,
    )


@pytest.fixture(scope="module", params=[True, False], ids=["tied", "untied"])
def small_llama(request, tmp_path_factory):
    """(folder, transformers model) of a seeded 2-layer Llama saved with save_pretrained."""
    from transformers import LlamaForCausalLM

    tie = request.param
    torch.manual_seed(0 if tie else 1)
    model = LlamaForCausalLM(llama_config(tie)).eval()
    perturb(model, seed=2)
    folder = tmp_path_factory.mktemp("llama-tied" if tie else "llama-untied")
    model.save_pretrained(folder)
    return folder, model


@pytest.fixture(scope="module")
def tied_llama(tmp_path_factory):
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(llama_config(True)).eval()
    perturb(model, seed=2)
    folder = tmp_path_factory.mktemp("llama-cache")
    model.save_pretrained(folder)
    return folder, model


def prompts(n: int, length: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(2, VOCAB, (n, length), generator=g)


@pytest.mark.parametrize("mode", MODES)
def test_small_llama_logits_and_greedy_tokens(small_llama, mode):
    folder, ref = small_llama
    tied = ref.config.tie_word_embeddings
    names = safetensors_names(folder)
    # The tied file stores the head once, as the embeddings; the untied one has its own lm_head.weight.
    assert ("lm_head.weight" in names) == (not tied)
    assert "model.embed_tokens.weight" in names

    m = lt.load(LLAMA, weights=folder, mode=mode, max_positions=MAX_POSITIONS, progress=False)
    assert m.config["tie_word_embeddings"] == tied
    assert m.config["num_key_value_heads"] == 2 and m.config["head_dim"] == 8
    assert m.config["rope_scaling"]["rope_type"] == "llama3"
    assert set(m.module.state_dict()) == names

    ids = prompts(2, 24, seed=3)
    ours = torch.from_numpy(m.forward(ids.numpy()))  # numpy in and out, as on every backend
    with torch.inference_mode():
        theirs = ref(input_ids=ids).logits
    delta = max_abs_diff(ours, theirs)
    checkpoint = f"seeded 2-layer, {'tied' if tied else 'untied'}"
    what = f"small Llama ({'tied' if tied else 'untied'}, {mode}) logits [2, 24, {VOCAB}]"
    record(what, delta, model="llama", backend=MODE_BACKEND[mode], checkpoint=checkpoint)
    assert delta < LOGITS_ATOL
    assert torch.equal(ours.argmax(-1), theirs.argmax(-1))

    prompt = ids[0, :12].tolist()
    expected = hf_greedy(ref, prompt, GREEDY_TOKENS)
    assert linnet_greedy(m, prompt, GREEDY_TOKENS) == expected


def test_llama3_rope_scaling_would_show(tied_llama):
    """The same weights without rope scaling give logits far outside the tolerance, so the comparison above
    checks the llama3 frequencies (and not only plain rotary embeddings)."""
    from transformers import LlamaForCausalLM

    _, ref = tied_llama
    config = llama_config(True)
    config.rope_parameters = {"rope_type": "default", "rope_theta": 100.0}
    plain = LlamaForCausalLM(config).eval()
    plain.load_state_dict(ref.state_dict())
    ids = prompts(2, 24, seed=3)
    with torch.inference_mode():
        delta = max_abs_diff(plain(input_ids=ids).logits, ref(input_ids=ids).logits)
    report("small Llama without rope scaling, against the llama3-scaled one", delta)
    assert delta > 100 * LOGITS_ATOL


def poison_cache(m) -> None:
    """Fill the KV cache with large finite garbage: any read of a position not written since would show
    (NaN would poison even masked positions, 0 * NaN being NaN in the attention's matmul)."""
    g = torch.Generator().manual_seed(9)
    for buf in m.module.buffers():
        buf.copy_(torch.randn(buf.shape, generator=g) * 100)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("prefill", [1, 5])
def test_cached_decode_equals_recompute(tied_llama, mode, prefill):
    folder, _ = tied_llama
    m = lt.load(LLAMA, weights=folder, mode=mode, max_positions=MAX_POSITIONS, progress=False)
    ids = prompts(1, 16, seed=4)
    with torch.inference_mode():
        full = m.native.forward(ids)[0]
        poison_cache(m)
        got = [m.native.step(ids[:, :prefill], torch.tensor([0]), torch.tensor([0]))[0]]
        for p in range(prefill, ids.shape[1]):
            got.append(m.native.step(ids[:, p : p + 1], torch.tensor([p]), torch.tensor([0]))[0])
    delta = max_abs_diff(torch.stack(got), full[prefill - 1 :])
    what = f"small Llama ({mode}) step (prefill {prefill}, then decode) vs forward, every position"
    record(what, delta, model="llama", backend=MODE_BACKEND[mode], checkpoint="seeded 2-layer, tied", against="forward")
    assert delta < 1e-4


@pytest.mark.parametrize("mode", MODES)
def test_batch_of_two_rows_at_different_positions(tied_llama, mode):
    folder, _ = tied_llama
    m = lt.load(LLAMA, weights=folder, mode=mode, max_batch=2, max_positions=MAX_POSITIONS, progress=False)
    a, b = prompts(1, 7, seed=5)[0], prompts(1, 12, seed=6)[0]
    t = torch.tensor

    def prefill(row: int, tokens: torch.Tensor) -> None:
        m.native.step(tokens[None], t([0]), t([row]))

    with torch.inference_mode():
        poison_cache(m)
        # Each row alone: A in row 0 (positions 0..4, then 5..6), B in row 1 (0..9, then 10..11).
        prefill(0, a[:5])
        alone_a = m.native.step(a[None, 5:7], t([5]), t([0]))[0]
        prefill(1, b[:10])
        alone_b = m.native.step(b[None, 10:12], t([10]), t([1]))[0]
        # Both together, in one step of B = 2 at different positions; then one more decode step of both.
        poison_cache(m)
        prefill(0, a[:5])
        prefill(1, b[:10])
        both = m.native.step(torch.stack([a[5:7], b[10:12]]), t([5, 10]), t([0, 1]))
        nxt = prompts(2, 1, seed=7)
        both_next = m.native.step(nxt, t([7, 12]), t([0, 1]))
        # The same with the entries in the other order (entry 0 uses row 1).
        poison_cache(m)
        prefill(0, a[:5])
        prefill(1, b[:10])
        swapped = m.native.step(torch.stack([b[10:12], a[5:7]]), t([10, 5]), t([1, 0]))
        ref_a = m.native.forward(torch.cat([a, nxt[0]])[None])[0]
        ref_b = m.native.forward(torch.cat([b, nxt[1]])[None])[0]

    assert max_abs_diff(alone_a, ref_a[6]) < 1e-4 and max_abs_diff(alone_b, ref_b[11]) < 1e-4
    delta = max(max_abs_diff(both[0], alone_a), max_abs_diff(both[1], alone_b))
    delta = max(delta, max_abs_diff(swapped[0], alone_b), max_abs_diff(swapped[1], alone_a))
    report(f"small Llama ({mode}) batched rows vs each row alone", delta)
    assert delta < 1e-5
    delta_next = max(max_abs_diff(both_next[0], ref_a[7]), max_abs_diff(both_next[1], ref_b[12]))
    report(f"small Llama ({mode}) batched decode vs forward", delta_next)
    assert delta_next < 1e-4


# ---- load errors -----------------------------------------------------------------------------------------------


@pytest.fixture
def llama_copy(tied_llama, tmp_path):
    folder = tmp_path / "llama"
    shutil.copytree(tied_llama[0], folder)
    return folder


def test_tensor_of_the_wrong_shape_is_named_with_both_shapes(llama_copy):
    name = "model.layers.1.mlp.up_proj.weight"

    def shrink(tensors):
        assert tuple(tensors[name].shape) == (128, 64)
        tensors[name] = tensors[name][:120]
        return tensors

    rewrite_safetensors(llama_copy, shrink)
    with pytest.raises(LoadError) as err:
        lt.load(LLAMA, weights=llama_copy, progress=False)
    message = str(err.value)
    assert f"`{name}`" in message and "[120, 64]" in message and "[128, 64]" in message, message


def test_config_override_that_does_not_fit_the_checkpoint(tied_llama):
    with pytest.raises(LoadError) as err:
        lt.load(LLAMA, weights=tied_llama[0], config={"intermediate_size": 96}, progress=False)
    message = str(err.value)
    assert re.search(r"`model\.layers\.\d+\.mlp\.(gate|up|down)_proj\.weight`", message), message
    shapes = re.findall(r"\[\d+, \d+\]", message)
    assert sorted(shapes) in (["[128, 64]", "[96, 64]"], ["[64, 128]", "[64, 96]"]), message


@pytest.mark.parametrize("name", ["model.layers.0.self_attn.k_proj.weight", "model.norm.weight"])
def test_missing_tensor_is_named(llama_copy, name):
    rewrite_safetensors(llama_copy, lambda tensors: {k: v for k, v in tensors.items() if k != name})
    with pytest.raises(LoadError) as err:
        lt.load(LLAMA, weights=llama_copy, progress=False)
    assert f"`{name}`" in str(err.value), str(err.value)
    assert "missing" in str(err.value)


def test_untied_source_on_a_tied_checkpoint_misses_lm_head(tied_llama):
    with pytest.raises(LoadError) as err:
        lt.load(LLAMA, weights=tied_llama[0], config={"tie_word_embeddings": False}, progress=False)
    assert "`lm_head.weight`" in str(err.value), str(err.value)


@pytest.mark.parametrize("small_llama", [False], indirect=True, ids=["untied"])
def test_tied_config_with_a_different_stored_head_is_refused(small_llama, tmp_path):
    """`tie_word_embeddings: true` over a checkpoint that stores its own `lm_head.weight`: transformers 5 uses the
    stored head, so tying it to the embeddings (as Linnet did, with a note) ran silently wrong (~9 in the trial).
    A different head is an error naming the tensor, the key and the file; a head equal to the embeddings bit for
    bit loads, without a note, and matches transformers."""
    import json

    from transformers import LlamaForCausalLM

    folder, model = small_llama
    copy = tmp_path / "tied-with-head"
    shutil.copytree(folder, copy)
    cfg = json.loads((copy / "config.json").read_text())
    cfg["tie_word_embeddings"] = True
    (copy / "config.json").write_text(json.dumps(cfg))
    ids = prompts(2, 12, seed=5)
    with torch.no_grad():
        ref = LlamaForCausalLM.from_pretrained(copy).eval()
        assert torch.equal(ref.lm_head.weight, model.lm_head.weight)  # transformers keeps the stored head
        assert max_abs_diff(ref(ids).logits, model(ids).logits) == 0
    with pytest.raises(LoadError) as err:
        lt.load(LLAMA, weights=copy, progress=False)
    msg = str(err.value)
    assert "`lm_head.weight`" in msg and "`tie_word_embeddings`" in msg and str(copy / "config.json") in msg, msg
    assert err.value.code == "L502"

    # the stored head equal to the embeddings: tied and untied are one model
    rewrite_safetensors(copy, lambda t: {**t, "lm_head.weight": t["model.embed_tokens.weight"].clone()})
    with torch.no_grad():
        ref = LlamaForCausalLM.from_pretrained(copy).eval()
        expected = ref(ids).logits
    m = lt.load(LLAMA, weights=copy, progress=False)
    assert not any("lm_head" in n for n in m.notes), m.notes
    got = torch.as_tensor(m.forward(ids.numpy()))
    assert max_abs_diff(got, expected) < LOGITS_ATOL


@pytest.mark.parametrize(
    "patch, key",
    [
        ({"rms_norm_eps": -1.0}, "rms_norm_eps"),
        ({"rope_parameters": {"rope_type": "default", "rope_theta": -5.0}}, "rope_theta"),
        ({"rope_parameters": {"rope_type": "default", "rope_theta": 0.0}}, "rope_theta"),
        ({"rope_parameters": {"rope_type": "linear", "rope_theta": 100.0, "factor": 0.0}}, "rope_scaling.factor"),
        ({"rope_parameters": {"rope_type": "linear", "rope_theta": 100.0, "factor": -2.0}}, "rope_scaling.factor"),
    ],
    ids=["eps-neg", "theta-neg", "theta-zero", "factor-zero", "factor-neg"],
)
def test_config_values_outside_their_range_are_refused(tied_llama, tmp_path, patch, key):
    """Values transformers loads without a word and computes NaN (or meaningless positions) from: Linnet ran them
    to NaN logits and empty text. Now L505 names the key in config.json."""
    import json

    from transformers import LlamaForCausalLM

    copy = tmp_path / "bad-config"
    shutil.copytree(tied_llama[0], copy)
    cfg = json.loads((copy / "config.json").read_text())
    cfg.pop("rope_scaling", None)
    cfg.update(patch)
    (copy / "config.json").write_text(json.dumps(cfg))
    if key == "rms_norm_eps":  # what transformers makes of it: NaN logits
        with torch.no_grad():
            logits = LlamaForCausalLM.from_pretrained(copy).eval()(prompts(1, 8, seed=3)).logits
        assert not torch.isfinite(logits).all()
    with pytest.raises(LoadError) as err:
        lt.load(LLAMA, weights=copy, progress=False)
    msg = str(err.value)
    assert "L505" in msg and f"`{key}` must be" in msg and str(copy / "config.json") in msg, msg


def test_config_override_outside_its_range_is_refused(tied_llama):
    with pytest.raises(LoadError) as err:
        lt.load(LLAMA, weights=tied_llama[0], config={"rms_norm_eps": -1e-5}, progress=False)
    assert "L505" in str(err.value) and "`rms_norm_eps` must be >= 0.0" in str(err.value)
