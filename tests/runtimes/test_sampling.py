"""`linnet.runtimes.sampling`: greedy, temperature, top-k and top-p (checked against transformers' warpers),
seeded reproducibility, and the empirical distribution of samples."""

from __future__ import annotations

import numpy as np
import pytest

from linnet.runtimes.sampling import SamplingParams, filter_logits, sample, softmax


def random_logits(seed: int, batch: int = 8, vocab: int = 50) -> np.ndarray:
    return (np.random.default_rng(seed).normal(size=(batch, vocab)) * 3).astype(np.float32)


# ---- parameters ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_k": -1}, "top_k"),
        ({"top_k": 2.5}, "top_k"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.01}, "top_p"),
        ({"top_p": -0.5}, "top_p"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"seed": -3}, "seed"),
        ({"seed": 1.5}, "seed"),
        ({"stop_token_ids": [-1]}, "stop_token_ids"),
    ],
)
def test_invalid_params_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


def test_params_defaults_and_normalisation():
    params = SamplingParams(stop_token_ids=[3, 5, 3])
    assert params.greedy and params.top_k == 0 and params.top_p == 1.0 and params.seed is None
    assert params.stop_token_ids == frozenset({3, 5})
    assert not SamplingParams(temperature=0.7).greedy


# ---- greedy --------------------------------------------------------------------------------------------------


def test_greedy_is_argmax():
    logits = random_logits(0)
    assert np.array_equal(sample(logits, SamplingParams()), np.argmax(logits, axis=-1))
    assert sample(logits, SamplingParams()).dtype == np.int64


def test_greedy_takes_the_first_maximum_on_ties():
    logits = np.array([[1.0, 3.0, 3.0, 0.0], [5.0, 5.0, 5.0, 5.0]], dtype=np.float32)
    assert sample(logits, SamplingParams(), None).tolist() == [1, 0]


def test_greedy_ignores_top_k_and_top_p_and_rng():
    logits = random_logits(1)
    params = SamplingParams(top_k=3, top_p=0.5, seed=7)
    assert np.array_equal(sample(logits, params, np.random.default_rng(0)), np.argmax(logits, axis=-1))


# ---- sampling ------------------------------------------------------------------------------------------------


def test_seeded_sampling_is_reproducible_and_differs_across_seeds():
    logits = np.zeros((1000, 20), dtype=np.float32)  # uniform: seeds must give different draws
    params = SamplingParams(temperature=1.0, seed=1234)
    first = sample(logits, params, params.make_rng())
    again = sample(logits, params, params.make_rng())
    other = SamplingParams(temperature=1.0, seed=1235)
    assert np.array_equal(first, again)
    assert not np.array_equal(first, sample(logits, other, other.make_rng()))


def test_top_k_1_equals_greedy():
    logits = random_logits(2, batch=64)
    params = SamplingParams(temperature=1.7, top_k=1, seed=0)
    assert np.array_equal(sample(logits, params, params.make_rng()), np.argmax(logits, axis=-1))


def test_tiny_top_p_equals_greedy():
    logits = random_logits(3, batch=64)
    params = SamplingParams(temperature=1.0, top_p=1e-6, seed=0)
    assert np.array_equal(sample(logits, params, params.make_rng()), np.argmax(logits, axis=-1))


def test_top_p_keeps_the_smallest_set_reaching_p():
    probs = np.array([[0.5, 0.3, 0.15, 0.05]])
    logits = np.log(probs)

    def kept(top_p):
        return np.flatnonzero(np.isfinite(filter_logits(logits, SamplingParams(temperature=1.0, top_p=top_p)))).tolist()

    assert kept(0.3) == [0]
    assert kept(0.5 - 1e-9) == [0]
    assert kept(0.51) == [0, 1]
    assert kept(0.79) == [0, 1]
    assert kept(0.81) == [0, 1, 2]
    assert kept(0.96) == [0, 1, 2, 3]
    assert kept(1.0) == [0, 1, 2, 3]


def test_top_k_keeps_ties_with_the_kth():
    logits = np.array([[4.0, 2.0, 3.0, 3.0, 1.0]])
    out = filter_logits(logits, SamplingParams(temperature=1.0, top_k=2))
    assert np.isfinite(out).tolist() == [[True, False, True, True, False]]


def test_temperature_divides_logits():
    logits = random_logits(4)
    out = filter_logits(logits, SamplingParams(temperature=0.5))
    assert out.dtype == np.float64
    np.testing.assert_allclose(out, logits.astype(np.float64) / 0.5)


def test_empirical_distribution_matches_softmax():
    n, logits = 20_000, np.array([1.0, 0.2, -0.5, 2.0, 0.0, -2.0], dtype=np.float32)
    params = SamplingParams(temperature=1.0, seed=42)
    draws = sample(np.tile(logits, (n, 1)), params, params.make_rng())
    freq = np.bincount(draws, minlength=logits.size) / n
    assert np.max(np.abs(freq - softmax(logits))) < 0.01


def test_empirical_distribution_with_temperature_and_top_k():
    n, logits = 20_000, np.array([1.0, 0.2, -0.5, 2.0, 0.0, -2.0], dtype=np.float32)
    params = SamplingParams(temperature=0.8, top_k=3, seed=7)
    draws = sample(np.tile(logits, (n, 1)), params, params.make_rng())
    freq = np.bincount(draws, minlength=logits.size) / n
    keep = [0, 1, 3]
    expected = np.zeros(logits.size)
    expected[keep] = softmax(logits[keep] / 0.8)
    assert freq[[2, 4, 5]].sum() == 0
    assert np.max(np.abs(freq - expected)) < 0.01


def test_sampling_never_draws_removed_tokens():
    logits = random_logits(5, batch=2000, vocab=30)
    params = SamplingParams(temperature=2.0, top_k=5, top_p=0.7, seed=3)
    draws = sample(logits, params, params.make_rng())
    allowed = np.isfinite(filter_logits(logits, params))
    assert allowed[np.arange(len(draws)), draws].all()


def test_sampling_errors():
    with pytest.raises(ValueError, match="rng"):
        sample(random_logits(0), SamplingParams(temperature=1.0), None)
    with pytest.raises(ValueError, match=r"\[B, V\]"):
        sample(np.zeros(5, dtype=np.float32), SamplingParams())
    with pytest.raises(ValueError, match="no finite value"):
        sample(np.full((1, 4), np.nan, dtype=np.float32), SamplingParams(temperature=1.0), np.random.default_rng(0))


# ---- against transformers ------------------------------------------------------------------------------------


@pytest.mark.torch
@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p"),
    [(1.0, 5, 1.0), (0.7, 0, 0.9), (1.3, 10, 0.5), (1.0, 0, 0.05), (0.5, 40, 0.95), (2.0, 1, 0.3), (1.0, 50, 0.99)],
)
def test_filters_match_transformers_warpers(temperature, top_k, top_p):
    torch = pytest.importorskip("torch")
    logits_process = pytest.importorskip("transformers.generation.logits_process")
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
    for seed in range(5):
        logits = random_logits(100 + seed, batch=16, vocab=64)
        # transformers' generate: temperature, then top-k, then top-p; each skipped at its neutral value.
        warpers = [logits_process.TemperatureLogitsWarper(temperature)]
        if top_k:
            warpers.append(logits_process.TopKLogitsWarper(top_k))
        if top_p < 1.0:
            warpers.append(logits_process.TopPLogitsWarper(top_p))
        scores = torch.from_numpy(logits)
        for warper in warpers:
            scores = warper(None, scores)
        expected = scores.numpy()
        ours = filter_logits(logits, params)
        assert np.array_equal(np.isfinite(ours), np.isfinite(expected)), f"kept sets differ (seed {seed})"
        np.testing.assert_allclose(ours[np.isfinite(ours)], expected[np.isfinite(expected)], rtol=1e-6)


def test_a_temperature_so_small_the_division_overflows_samples_the_maximum():
    """logits / 1e-310 overflowed to inf, and the softmax of [inf, ...] had no finite value: `sample` raised (and the
    serving engine failed every request beside it). The logits less their maximum are divided instead."""
    logits = np.array([[1.0, 3.0, 2.0], [0.5, 0.2, -1.0]])
    params = SamplingParams(temperature=1e-310)
    assert sample(logits, params, np.random.default_rng(0)).tolist() == [1, 0]
    kept = filter_logits(logits, params)
    assert kept[0, 1] == 0.0 and np.isneginf(kept[0, [0, 2]]).all()
