"""KV caches held token-major ([max_batch, T, H * D], the layout the JAX backends use on a TPU) against held flat
([max_batch * H, T, D], the CPU's): the same logits for prefills of several rows, a decode batch padded to a power
of two with a row past the cache, a padded prefill whose tail runs past the end, and the on-device greedy loop; the
padded row writes nothing. On the CPU, with the layout forced (`jax_backend.cache_layout_for`); the test marked tpu
checks that the chip gets it by default."""

from __future__ import annotations

import numpy as np
import pytest

from tests.runtimes.conftest import GPT2, LLAMA, layer_states

jax = pytest.importorskip("jax")
pytestmark = pytest.mark.jax

import linnet.jax as lj  # noqa: E402
from linnet.runtimes.backends import jax_backend  # noqa: E402
from linnet.runtimes.generation import Generator  # noqa: E402
from linnet.runtimes.sampling import SamplingParams  # noqa: E402

CONFIGS = {
    "llama": (LLAMA, {"vocab_size": 96, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                      "num_attention_heads": 8, "num_key_value_heads": 2}),
    "gpt2": (GPT2, {"vocab_size": 96, "n_embd": 64, "n_layer": 2, "n_head": 4}),
}  # fmt: skip
MAX_POSITIONS = 64
ROWS = 4
# f32: the two layouts batch the attention dots differently, so XLA sums in another order (~1e-5 measured)
ATOL = 1e-4


def load(monkeypatch, name: str, layout: str, mode: str = "generated"):
    monkeypatch.setattr(jax_backend, "cache_layout_for", lambda device: layout)
    source, config = CONFIGS[name]
    return lj.load(
        source, config=config, mode=mode, max_batch=ROWS, max_positions=MAX_POSITIONS, random_weights=True, seed=2,
        progress=False,
    )  # fmt: skip


def steps(model) -> list[np.ndarray]:
    """Logits of: prefills of three rows (lengths 7, 13, 5), four decode steps of those rows (three rows run as
    four, the fourth past the cache), and a prefill of row 3 at position 60 padded past the end."""
    sm = model.step_model(decode_loop=False, batch_buckets=True)
    rng = np.random.default_rng(0)
    vocab = sm.vocab_size
    a = lambda *x: np.array(x, dtype=np.int64)  # noqa: E731
    out = [sm.step(rng.integers(0, vocab, (1, n)), a(0), a(row)) for row, n in ((0, 7), (2, 13), (1, 5))]
    untouched = layer_states(model.state)
    for t in range(4):
        out.append(sm.step(rng.integers(0, vocab, (3, 1)), a(7 + t, 13 + t, 5 + t), a(0, 2, 1)))
    for k, v in layer_states(model.state).items():  # the padded row (past the cache) wrote nothing: row 3 is zeros
        if jax_backend.cache_layout_for(model.device) == "token_major" and v.ndim == 3:
            assert not v[3].any() and not untouched[k][3].any(), k
    out.append(sm.step(rng.integers(0, vocab, (1, 9)), a(60), a(3)))
    return out


@pytest.mark.parametrize("mode", ["generated", "stablehlo"])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_token_major_caches_give_the_flat_layouts_logits(monkeypatch, name, mode):
    flat = steps(load(monkeypatch, name, "flat", mode))
    model = load(monkeypatch, name, "token_major", mode)
    heads_by_dim = {k: v.shape for k, v in layer_states(model.state).items() if v.ndim == 3}
    assert heads_by_dim and all(s[0] == ROWS and s[1] == MAX_POSITIONS for s in heads_by_dim.values())
    token_major = steps(model)
    for i, (x, y) in enumerate(zip(flat, token_major)):
        assert x.shape == y.shape
        assert np.abs(x - y).max() < ATOL, (i, float(np.abs(x - y).max()))


def test_the_greedy_loop_runs_on_token_major_caches(monkeypatch):
    """The on-device loop (the TPU's default) over token-major caches gives the per-token path's tokens."""
    prompt, params = [5, 17, 3, 88, 41, 9], SamplingParams(max_new_tokens=40)
    model = load(monkeypatch, "llama", "token_major")
    looped = Generator(model.step_model(decode_loop=True), None).generate(prompt, params).token_ids
    stepped = Generator(model.step_model(decode_loop=False), None).generate(prompt, params).token_ids
    assert looped == stepped


def test_the_generated_module_says_how_it_holds_its_caches(monkeypatch):
    """Token-major caches are written by `write_cache_tokens`, and the scan over the layers hands each layer its
    slice of them (`state_per_item`: carried whole, the TPU re-laid the stack at every layer); flat ones stay
    carried, written in place (tests/runtimes/test_jax_backend.py: no copy of them on the CPU)."""
    model = load(monkeypatch, "llama", "token_major")
    assert "held as [max_batch, T, H * D]" in model.source
    assert "write_cache_tokens(" in model.source
    assert "state_per_item=True)" in model.source
    assert "state_per_item" not in load(monkeypatch, "llama", "flat").source


@pytest.mark.tpu
def test_on_a_tpu_caches_are_token_major_by_default():
    """On the chip the caches are held token-major, as `jax_backend.cache_layout_for` says. (What that buys there
    is measured, not asserted: bench/results/tpu_serve_*: held flat, XLA copied every cache into another layout
    for a batched decode step's scatter and wrote its rows one by one, 18 of TinyLlama's 20 ms at batch 32.)"""
    from tests.conftest import tpu_tests_device

    device = tpu_tests_device()
    source, config = CONFIGS["llama"]
    model = lj.load(
        source, config=config, device=device, max_batch=ROWS, max_positions=MAX_POSITIONS, random_weights=True,
        progress=False,
    )  # fmt: skip
    if model.device.platform != "tpu":
        pytest.skip(f"the tests marked tpu run on {device} here (LINNET_TPU_TESTS_DEVICE)")
    assert model.cache_layout == "token_major"
    shape = next(v.shape for v in layer_states(model.state).values() if v.ndim == 3)
    assert shape == (ROWS, MAX_POSITIONS, config["hidden_size"] // config["num_attention_heads"] * 2)
