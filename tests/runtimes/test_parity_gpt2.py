"""Parity of the PyTorch backend with transformers on a small GPT-2 built from a config (Conv1D weights stored
[in, out], a head tied to `transformer.wte`), saved with `save_pretrained` and loaded through
examples/gpt2.linnet; also a file whose names lack the `transformer.` prefix (as openai-community/gpt2's own
model.safetensors does), with the legacy `attn.bias` mask buffers."""

from __future__ import annotations

import copy
import json

import pytest

from linnet.runtimes.backends import BACKENDS
from tests.runtimes.conftest import (
    ALL_BACKENDS,
    GPT2,
    LOGITS_ATOL,
    MODE_BACKEND,
    MODES,
    SEEDED,
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

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_torch_thread")]

VOCAB = 256
N_POSITIONS = 64
GREEDY_TOKENS = 32


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    """(folder of GPT2LMHeadModel, folder of its GPT2Model without `transformer.`, transformers model)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=VOCAB,
        n_embd=64,
        n_layer=2,
        n_head=4,
        n_positions=N_POSITIONS,
        initializer_range=0.1,
        bos_token_id=0,
        eos_token_id=1,
    )
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config).eval()
    perturb(model, seed=1)
    full = tmp_path_factory.mktemp("gpt2")
    model.save_pretrained(full)
    # The base model alone: names `h.0.attn.c_attn.weight`, `wte.weight`... (no head: it is tied to wte).
    bare = tmp_path_factory.mktemp("gpt2-bare")
    model.transformer.save_pretrained(bare)

    def add_mask_buffers(tensors):
        # Older files (openai-community/gpt2 among them) also store each layer's causal mask and masked bias.
        for i in range(config.n_layer):
            tensors[f"h.{i}.attn.bias"] = torch.tril(torch.ones(N_POSITIONS, N_POSITIONS))[None, None]
            tensors[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
        return tensors

    rewrite_safetensors(bare, add_mask_buffers)
    return full, bare, model


def prompts(n: int, length: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (n, length), generator=g)


@pytest.mark.parametrize("mode", MODES)
def test_gpt2_logits_and_greedy_tokens(gpt2, mode):
    full, _, ref = gpt2
    names = safetensors_names(full)
    assert "transformer.h.0.attn.c_proj.weight" in names and "lm_head.weight" not in names
    m = lt.load(GPT2, weights=full, mode=mode, max_positions=N_POSITIONS, progress=False)
    assert set(m.module.state_dict()) == names
    # transformers writes `"n_inner": null` (meaning 4 * n_embd); the source's default applies.
    assert json.loads((full / "config.json").read_text())["n_inner"] is None
    assert m.config["n_inner"] == 4 * 64

    ids = prompts(2, 20, seed=2)
    with torch.inference_mode():
        ours = m.native.forward(ids)
        theirs = ref(input_ids=ids).logits
    delta = max_abs_diff(ours, theirs)
    record(
        f"small GPT-2 ({mode}) logits [2, 20, {VOCAB}]",
        delta,
        model="gpt2",
        backend=MODE_BACKEND[mode],
        checkpoint=SEEDED,
    )
    # This also checks the orientation of every Conv1D weight: `x @ weight` with weight [in, out]. The
    # non-square ones (c_attn [64, 192], mlp.c_fc [64, 256], mlp.c_proj [256, 64]) would fail the shape check
    # when loading; attn.c_proj is square [64, 64], so only this comparison catches a missing (or extra)
    # transpose there (see test_missing_c_proj_transpose_would_show).
    assert delta < LOGITS_ATOL

    prompt = ids[0, :10].tolist()
    assert linnet_greedy(m, prompt, GREEDY_TOKENS) == hf_greedy(ref, prompt, GREEDY_TOKENS)


def test_missing_c_proj_transpose_would_show(gpt2):
    """The logits comparison above is sharp enough to see attn.c_proj used as [out, in]."""
    _, _, ref = gpt2
    wrong = copy.deepcopy(ref)
    with torch.no_grad():
        for block in wrong.transformer.h:
            assert block.attn.c_proj.weight.shape[0] == block.attn.c_proj.weight.shape[1]
            block.attn.c_proj.weight.copy_(block.attn.c_proj.weight.T.clone())
    ids = prompts(2, 20, seed=2)
    with torch.inference_mode():
        delta = max_abs_diff(wrong(input_ids=ids).logits, ref(input_ids=ids).logits)
    report("small GPT-2 with attn.c_proj transposed, against the right one", delta)
    assert delta > 100 * LOGITS_ATOL


def test_gpt2_file_without_transformer_prefix(gpt2):
    full, bare, ref = gpt2
    names = safetensors_names(bare)
    assert "h.0.attn.c_proj.weight" in names and "wte.weight" in names and "h.0.attn.bias" in names
    assert not any(n.startswith("transformer.") for n in names)
    m = lt.load(GPT2, weights=bare, mode="generated", max_positions=N_POSITIONS, progress=False)
    # The module keeps the source's names, so its state_dict matches the prefixed file.
    assert set(m.module.state_dict()) == safetensors_names(full)

    ids = prompts(2, 20, seed=3)
    with torch.inference_mode():
        delta = max_abs_diff(m.forward(ids), ref(input_ids=ids).logits)
    report("small GPT-2 (generated) from a file without `transformer.` logits", delta)
    assert delta < LOGITS_ATOL


@pytest.mark.parametrize("mode", MODES)
def test_gpt2_cached_decode_equals_recompute(gpt2, mode):
    full, _, _ = gpt2
    m = lt.load(GPT2, weights=full, mode=mode, max_positions=N_POSITIONS, progress=False)
    ids = prompts(1, 12, seed=4)
    t = torch.tensor
    with torch.inference_mode():
        full_logits = m.native.forward(ids)[0]
        got = [m.native.step(ids[:, :4], t([0]), t([0]))[0]]
        for p in range(4, ids.shape[1]):
            got.append(m.native.step(ids[:, p : p + 1], t([p]), t([0]))[0])
    delta = max_abs_diff(torch.stack(got), full_logits[3:])
    what = f"small GPT-2 ({mode}) step vs forward, every position"
    record(what, delta, model="gpt2", backend=MODE_BACKEND[mode], checkpoint=SEEDED, against="forward")
    assert delta < 1e-4


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_generation_stops_at_the_learned_position_table(gpt2, backend):
    """GPT-2's `wpe` has `n_positions` rows: a position past it has no embedding (PyTorch and ONNX Runtime raised
    IndexError, XLA clamped the index and ran on, silently wrong). Loading with a larger `max_positions` sizes the
    cache to the table, says so in a note, and generation stops there with finish "length", its tokens
    transformers' greedy tokens up to that point."""
    from linnet.runtimes.generation import Generator
    from linnet.runtimes.sampling import SamplingParams

    full, _, ref = gpt2
    if (why := BACKENDS[backend].unavailable("cpu")) is not None:
        pytest.skip(why)
    m = BACKENDS[backend].load(GPT2, weights=full, max_positions=4 * N_POSITIONS, progress=False)
    assert m.max_positions == N_POSITIONS
    assert any("learned position table (n_positions)" in note for note in m.notes), m.notes
    prompt = prompts(1, 5, seed=7)[0].tolist()
    result = Generator(m.step_model(), None).generate(prompt, SamplingParams(max_new_tokens=2 * N_POSITIONS))
    assert result.finish_reason == "length"
    assert len(prompt) + len(result.token_ids) == N_POSITIONS
    assert result.token_ids == hf_greedy(ref, prompt, N_POSITIONS - len(prompt))
