"""Sampling parameters and the one sampler every backend's generation goes through.

numpy only (no torch, jax or onnxruntime), so the same logits and the same seed give the same tokens on every
backend. The filters follow transformers' `generation/logits_process.py` in the order its `generate` applies
them: `TemperatureLogitsWarper`, then `TopKLogitsWarper`, then `TopPLogitsWarper`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

__all__ = ["SamplingParams", "filter_logits", "sample", "softmax"]


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each new token and when to stop.

    - `temperature` (>= 0): 0 (the default) is greedy decoding (argmax); > 0 divides the logits by it and samples.
    - `top_k` (>= 0): keep the `top_k` highest logits (ties with the k-th kept too); 0 turns it off.
    - `top_p` (0 < top_p <= 1): nucleus sampling, keep the smallest set of most probable tokens whose cumulative
      probability reaches `top_p` (at least one token); 1.0 turns it off.
    - `seed`: seeds the `numpy.random.Generator` a generation samples with (`None`: fresh OS entropy, so runs
      differ). Unused when greedy.
    - `max_new_tokens` (>= 1): the most tokens to generate; reaching it finishes with reason "length".
    - `stop_token_ids`: extra token ids that end generation (finish reason "stop") on top of the tokenizer's EOS ids.

    Raises `ValueError` naming the field when a value is out of range.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    max_new_tokens: int = 256
    stop_token_ids: frozenset[int] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        if not isinstance(self.temperature, (int, float)) or math.isnan(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be a number >= 0, got {self.temperature!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, (int, np.integer)) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0 (0 turns it off), got {self.top_k!r}")
        if not isinstance(self.top_p, (int, float)) or not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1] (1 turns it off), got {self.top_p!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, (int, np.integer))):
            raise ValueError(f"seed must be an integer or None, got {self.seed!r}")
        if self.seed is not None and self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed!r}")
        if (
            isinstance(self.max_new_tokens, bool)
            or not isinstance(self.max_new_tokens, (int, np.integer))
            or self.max_new_tokens < 1
        ):
            raise ValueError(f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}")
        if not isinstance(self.stop_token_ids, Iterable) or isinstance(self.stop_token_ids, (str, bytes)):
            raise ValueError(f"stop_token_ids must be a collection of token ids, got {self.stop_token_ids!r}")
        stop = frozenset(int(t) for t in self.stop_token_ids)
        if any(t < 0 for t in stop):
            raise ValueError(f"stop_token_ids must be token ids >= 0, got {sorted(stop)}")
        object.__setattr__(self, "stop_token_ids", stop)

    @property
    def greedy(self) -> bool:
        """True when tokens are picked by argmax (temperature 0)."""
        return self.temperature <= 0

    def make_rng(self) -> np.random.Generator:
        """A fresh `numpy.random.Generator` (PCG64) seeded with `seed` (OS entropy when `seed` is None)."""
        return np.random.default_rng(self.seed)


def filter_logits(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """Temperature, top-k and top-p applied to `logits` (f32 or f64 `[B, V]`); returns f64 `[B, V]` with the
    removed tokens set to -inf.

    - temperature: `logits / temperature` (transformers `TemperatureLogitsWarper`); not applied when greedy.
    - top-k (transformers `TopKLogitsWarper`): remove every logit strictly below the k-th largest, so ties with
      the k-th are kept; k is clipped to V.
    - top-p (transformers `TopPLogitsWarper`): sort ascending, take the cumulative softmax (f64 here, f32 there),
      remove the tokens whose cumulative probability is <= 1 - top_p, but always keep the most probable token.
      This keeps the smallest set of most probable tokens whose probability sums to >= top_p. Skipped at
      top_p = 1, as transformers' `generate` does.
    """
    x = np.array(logits, dtype=np.float64, copy=True)
    if x.ndim != 2:
        raise ValueError(f"logits must be [B, V], got shape {tuple(x.shape)}")
    if not params.greedy:
        with np.errstate(over="ignore"):
            scaled = x / params.temperature
        if np.isinf(scaled[np.isfinite(x)]).any():
            # a temperature so small that the division overflows (1e-310): divide the logits less their row's
            # maximum instead, which the softmax and top-k/top-p give the same tokens for, without an inf at the top
            with np.errstate(over="ignore"):
                scaled = (x - np.max(x, axis=-1, keepdims=True)) / params.temperature
        x = scaled
    vocab = x.shape[-1]
    if params.top_k > 0 and params.top_k < vocab:
        kth = np.partition(x, vocab - params.top_k, axis=-1)[:, vocab - params.top_k, None]
        x[x < kth] = -np.inf
    if params.top_p < 1.0:
        order = np.argsort(x, axis=-1, kind="stable")  # ascending, as torch.sort(descending=False)
        sorted_logits = np.take_along_axis(x, order, axis=-1)
        cumulative = np.cumsum(softmax(sorted_logits), axis=-1)
        remove_sorted = cumulative <= 1.0 - params.top_p
        remove_sorted[:, -1] = False  # min_tokens_to_keep = 1
        remove = np.zeros_like(remove_sorted)
        np.put_along_axis(remove, order, remove_sorted, axis=-1)
        x[remove] = -np.inf
    return x


def softmax(x: np.ndarray) -> np.ndarray:
    """Softmax over the last axis in f64: `exp(x - max) / sum(exp(x - max))`; -inf entries get probability 0."""
    x = np.asarray(x, dtype=np.float64)
    e = np.exp(x - np.max(x, axis=-1, keepdims=True))
    return e / np.sum(e, axis=-1, keepdims=True)


def sample(logits: np.ndarray, params: SamplingParams, rng: np.random.Generator | None = None) -> np.ndarray:
    """Pick one token per row of `logits` (f32 `[B, V]`); returns i64 `[B]`.

    Greedy (temperature 0): `argmax`, the first maximum on ties; `rng` is not used (may be None). Otherwise the
    logits go through `filter_logits`, then `softmax` in f64, and each row b, in order, draws one uniform
    `u = rng.random()` and takes the first token whose cumulative probability exceeds `u` (inverse CDF), so a
    token of probability 0 is never drawn and the same `rng` state gives the same tokens on every backend.

    Raises `ValueError` for logits that are not `[B, V]` with V >= 1, for rows with no finite logit left, or
    when sampling without an `rng`.
    """
    x = np.asarray(logits)
    if x.ndim != 2 or x.shape[-1] < 1:
        raise ValueError(f"logits must be [B, V] with V >= 1, got shape {tuple(x.shape)}")
    if params.greedy:
        return np.argmax(x, axis=-1).astype(np.int64)
    if rng is None:
        raise ValueError("sampling (temperature > 0) needs an rng (numpy.random.Generator)")
    filtered = filter_logits(x, params)
    bad = ~np.isfinite(np.max(filtered, axis=-1))
    if bad.any():
        raise ValueError(f"logits rows {np.flatnonzero(bad).tolist()} have no finite value to sample from")
    cdf = np.cumsum(softmax(filtered), axis=-1)
    u = rng.random(x.shape[0]) * cdf[:, -1]
    picks = np.array([np.searchsorted(cdf[b], u[b], side="right") for b in range(x.shape[0])], dtype=np.int64)
    return np.minimum(picks, x.shape[-1] - 1)
