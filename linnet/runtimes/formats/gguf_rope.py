"""Llama 3 rope scaling recovered from a GGUF file's `rope_freqs.weight`, and checked.

llama.cpp's convert_hf_to_gguf.py (`LlamaModel.generate_extra_tensors`) writes a Llama 3.x checkpoint's
`rope_scaling = {"rope_type": "llama3", factor, low_freq_factor, high_freq_factor, original_max_position_embeddings}`
as no metadata key at all but as one f32 tensor, `rope_freqs.weight` of shape [head_dim / 2]: per frequency the
divisor llama.cpp applies to it (`theta_i = position * inv_freq_i / rope_freqs_i`). For frequency i with
`wavelen_i = 2 pi / inv_freq_i` (L = original_max_position_embeddings, lf / hf = low / high_freq_factor):

    wavelen_i < L / hf        -> 1
    wavelen_i > L / lf        -> factor
    otherwise                 -> 1 / ((1 - s_i) / factor + s_i),   s_i = (L / wavelen_i - lf) / (hf - lf)

which is transformers' `_compute_llama3_parameters` (modeling_rope_utils.py) written as a divisor, and what
Linnet's `llama3_inv_freq` (linnet/std/rope.linnet) computes. The vector fixes `factor` (its last entry, the
longest wavelength) and, in 1 / wavelength, a straight line through the smoothed band; only the ratios L / lf and
L / hf matter, so the parameters are recovered up to that scale and between the two thresholds' neighbouring
frequencies. Any parameter set that reproduces the stored vector gives the same frequencies, so the one chosen is
checked against the vector with the source's formula, and a vector no llama3 parameters reproduce is refused.

Needs numpy only.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from linnet.errors import CheckpointError

__all__ = ["llama3_scaling_from_rope_freqs", "llama3_rope_freqs"]

# Stored factors are f32 computed in f32 (torch); recomputing them in f64 from other but equivalent parameters
# differs by a few f32 ulps. 1e-5 relative is far below any change that would show in logits.
_RTOL = 1e-5
# llama.cpp reads `original_max_position_embeddings` from the top level of config.json, where Llama 3.x has none,
# so its files are written with these (Llama 3.1 and 3.2's own values, and llama.cpp's defaults).
_LLAMA3_DEFAULTS = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def default_inv_freq(theta: float, head_dim: int) -> np.ndarray:
    """`1 / theta ** (arange(0, head_dim, 2) / head_dim)` in f32, as transformers and llama.cpp compute it.
    f32[head_dim / 2]."""
    exponents = np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)
    return (np.float32(1.0) / np.power(np.float32(theta), exponents)).astype(np.float32)


def llama3_rope_freqs(inv_freq: np.ndarray, scaling: dict[str, Any]) -> np.ndarray:
    """The `rope_freqs.weight` vector (divisors, f64[N]) of llama3 `scaling` over default frequencies `inv_freq`
    (f32[N]): `inv_freq / llama3_inv_freq(inv_freq, scaling)`, following transformers' `_compute_llama3_parameters`
    (modeling_rope_utils.py) term for term. `scaling` has factor, low_freq_factor, high_freq_factor and
    original_max_position_embeddings."""
    inv = inv_freq.astype(np.float64)
    factor = float(scaling["factor"])
    low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    old = float(scaling["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv
    scaled = np.where(wavelen > old / low, inv / factor, inv)
    with np.errstate(divide="ignore", invalid="ignore"):
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old / high) & ~(wavelen > old / low)
    return inv / np.where(medium, smoothed, scaled)


def _reproduces(stored: np.ndarray, inv_freq: np.ndarray, scaling: dict[str, Any]) -> bool:
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return bool(np.allclose(llama3_rope_freqs(inv_freq, scaling), stored, rtol=_RTOL, atol=0.0))


def _candidates(stored: np.ndarray, inv_freq: np.ndarray) -> list[dict[str, Any]]:
    """Parameter sets to try, most conventional first: Llama 3's own thresholds with the stored factor, then the
    thresholds fitted to the vector (see the module docstring), with the low/high factors rounded and as fitted."""
    factor = float(stored[-1])
    out = [{"rope_type": "llama3", "factor": factor, **_LLAMA3_DEFAULTS}]
    x = inv_freq.astype(np.float64) / (2 * math.pi)  # 1 / wavelength, decreasing with the index
    ones = np.isclose(stored, 1.0, rtol=_RTOL, atol=0.0)
    full = np.isclose(stored, factor, rtol=_RTOL, atol=0.0)
    medium = np.flatnonzero(~ones & ~full)
    if abs(factor - 1.0) <= _RTOL or not full.any():
        return out
    # s = (x - x_low) / (x_high - x_low) in the smoothed band, from 1 / r = 1 / factor + s (1 - 1 / factor)
    s = (1.0 / stored - 1.0 / factor) / (1.0 - 1.0 / factor)
    above = x[ones].min() if ones.any() else None  # the lowest frequency kept as is
    below = x[full].max()  # the highest frequency divided by factor
    if len(medium) >= 2:
        slope, intercept = np.polyfit(x[medium], s[medium], 1)
        thresholds = [((1.0 - intercept) / slope, -intercept / slope)] if slope > 0 else []
    elif len(medium) == 1:  # the line passes through one point: put x_high between it and its neighbour
        x_m, s_m = x[medium[0]], s[medium[0]]
        top = above if above is not None else 2 * x_m
        thresholds = []
        for t in (0.5, 0.1, 0.01):
            x_high = x_m + t * (top - x_m)
            thresholds.append((x_high, (x_m - s_m * x_high) / (1.0 - s_m)))
    else:  # no smoothed band: both thresholds fall in the gap between the kept and the divided frequencies
        top = above if above is not None else 2 * below
        thresholds = [(below + 2 * (top - below) / 3, below + (top - below) / 3)]
    for x_high, x_low in thresholds:
        if not (x_high > x_low > 0):
            continue
        old = max(1, round(1.0 / x_low))  # choose L so that low_freq_factor comes out near 1
        low, high = float(old * x_low), float(old * x_high)
        for lo, hi in ((round(low, 4), round(high, 4)), (low, high)):
            out.append(
                {
                    "rope_type": "llama3",
                    "factor": factor,
                    "low_freq_factor": lo,
                    "high_freq_factor": hi,
                    "original_max_position_embeddings": old,
                }
            )
    return out


def llama3_scaling_from_rope_freqs(
    stored: np.ndarray, *, rope_theta: float, head_dim: int, where: str
) -> dict[str, Any] | None:
    """The config's `rope_scaling` that reproduces a GGUF `rope_freqs.weight` vector.

    `stored`: f32[head_dim / 2], the divisor per rotary frequency. `rope_theta`, `head_dim`: the file's
    `{arch}.rope.freq_base` and head size. Returns None for a vector of ones (no scaling), else
    `{"rope_type": "llama3", "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}`
    whose llama3 frequencies (transformers' `_compute_llama3_parameters`) reproduce every entry within f32
    tolerance (relative 1e-5). Raises CheckpointError naming `where` and `rope_freqs.weight` when the shape is
    wrong, an entry is not finite and positive, or no llama3 parameters reproduce the vector.
    """
    half = head_dim // 2
    name = f"{where}: tensor 'rope_freqs.weight'"
    if stored.shape != (half,):
        raise CheckpointError(
            f"{name} has shape {list(stored.shape)}, expected [{half}] (one factor per rotary frequency of "
            f"head_dim {head_dim})"
        )
    r = stored.astype(np.float64)
    if not np.all(np.isfinite(r)) or np.any(r <= 0):
        raise CheckpointError(f"{name} has entries that are not finite and positive: {r.tolist()}")
    if np.allclose(r, 1.0, rtol=_RTOL, atol=0.0):
        return None
    inv_freq = default_inv_freq(rope_theta, head_dim)
    for scaling in _candidates(r, inv_freq):
        if _reproduces(r, inv_freq, scaling):
            return scaling
    shown = ", ".join(f"{v:.6g}" for v in r)
    raise CheckpointError(
        f"{name} holds rope frequency factors [{shown}] that no llama3 rope scaling (factor, low_freq_factor, "
        f"high_freq_factor, original_max_position_embeddings) reproduces at rope_theta {rope_theta:g}; Linnet "
        "does not guess rotary frequencies (convert the checkpoint from its config.json instead)"
    )
