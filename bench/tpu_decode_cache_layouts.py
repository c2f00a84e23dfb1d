"""Does the KV cache's layout cost a one-row decode loop on the TPU? The attention part of SmolLM2-135M's decode step
alone (30 layers; 9 query heads over 3 KV heads of 64; a cache of 544 positions; bf16), 128 steps in one
`lax.while_loop`, each step writing one token's keys and values into each layer's cache and attending over all 544
positions under a mask, as Linnet's generated step does (linnet/compiler/jax/codegen.py `_grouped_attention`,
prelude.py `write_cache_tokens`). No weights: what differs between variants is only where the caches live and how
they are laid out.

Variants: the caches token-major `[1, T, H_kv * D]` passed into the loop's `jit` as donated arguments (what Linnet's
`jax_loop.GreedyLoop` does); the same caches made inside the `jit` (what KerasHub's generation does: XLA then picks
their layout); and keys held positions-minor `[1, H_kv * D, T]` (the layout the profile showed XLA copying the
token-major keys into every step), values token-major, passed in. Device time per step from the profiler's trace
(its XLA ops summed), wall time per step beside it, and each variant's output's distance from the first.
The last stop's profile of the whole model: bench/results/tpu_decode_135m_2026-12-06.md.

    OUT=DIR python bench/tpu_decode_cache_layouts.py             on the TPU machine (DIR/decode_cache_layouts.json)
    OUT=DIR python bench/tpu_decode_cache_layouts.py --dry-run   the CPU, tiny sizes
"""

from __future__ import annotations

import collections
import glob
import gzip
import json
import os
import sys
import time

import numpy as np


def trace_us(jax, fn, out: str) -> float:
    """Device µs of one call of `fn` (the sum of the XLA ops in a profiler trace; 0 where the trace has none)."""
    d = os.path.join(out, "trace")
    jax.profiler.start_trace(d)
    fn()
    jax.profiler.stop_trace()
    files = sorted(glob.glob(os.path.join(d, "**", "*.trace.json.gz"), recursive=True), key=os.path.getmtime)
    if not files:
        return 0.0
    events = json.load(gzip.open(files[-1]))["traceEvents"]
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    total = collections.Counter()
    for e in events:
        if e.get("ph") == "X" and threads.get((e.get("pid"), e.get("tid"))) == "XLA Ops" and "while" not in e["name"]:
            total["ops"] += e["dur"]
    return float(total["ops"])


def main() -> int:
    dry = "--dry-run" in sys.argv
    out = os.environ.get("OUT", "/tmp/decode_cache_layouts")
    os.makedirs(out, exist_ok=True)
    import jax
    import jax.numpy as jnp
    from jax import lax

    layers, t, hkv, g, d, steps = (2, 16, 3, 3, 8, 8) if dry else (30, 544, 3, 3, 64, 128)
    dtype = jnp.bfloat16
    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.normal(size=(layers, 1, hkv, g, d)), dtype)
    new_kv = jnp.asarray(rng.normal(size=(layers, 2, hkv * d)), dtype)
    start = steps // 2  # positions already written: the mask covers the rest

    def layer_out(qi, k_tm, v_tm, position, keys_minor=False):
        """One layer's attention output [1, H_kv, G, D] from caches token-major (or keys [1, H_kv * D, T])."""
        mask = jnp.arange(t) <= position
        if keys_minor:
            kk = k_tm.reshape(1, hkv, d, t)
            scores = jnp.einsum("bkgd,bkdt->bkgt", qi, kk)
        else:
            kk = k_tm.reshape(1, t, hkv, d)
            scores = jnp.einsum("bkgd,btkd->bkgt", qi, kk)
        scores = jnp.where(mask, scores * 0.125, jnp.finfo(dtype).min)
        probs = jax.nn.softmax(scores.astype(jnp.float32), axis=-1).astype(dtype)
        return jnp.einsum("bkgt,btkd->bkgd", probs, v_tm.reshape(1, t, hkv, d))

    def run_loop(ks, vs, keys_minor=False):
        def body(carry):
            i, ks, vs, acc = carry
            position = start + i
            outs = []
            new_ks, new_vs = [], []
            for li in range(layers):
                k_new, v_new = new_kv[li, 0] * (1 + i), new_kv[li, 1] * (1 + i)
                if keys_minor:
                    k = lax.dynamic_update_slice(ks[li], k_new.reshape(1, hkv * d, 1).astype(dtype), (0, 0, position))
                else:
                    k = lax.dynamic_update_slice(ks[li], k_new.reshape(1, 1, hkv * d).astype(dtype), (0, position, 0))
                v = lax.dynamic_update_slice(vs[li], v_new.reshape(1, 1, hkv * d).astype(dtype), (0, position, 0))
                new_ks.append(k)
                new_vs.append(v)
                outs.append(layer_out(q[li] + acc.astype(dtype), k, v, position, keys_minor))
            acc = sum(o.astype(jnp.float32) for o in outs) * 1e-3
            return i + 1, tuple(new_ks), tuple(new_vs), acc

        zero = jnp.zeros((1, hkv, g, d), jnp.float32)
        _, ks, vs, acc = lax.while_loop(lambda c: c[0] < steps, body, (jnp.int32(0), ks, vs, zero))
        return acc, ks, vs

    tm = (1, t, hkv * d)
    caches = lambda shape: tuple(jnp.asarray(rng.normal(size=shape), dtype) for _ in range(layers))  # noqa: E731
    k0, v0 = caches(tm), caches(tm)
    k0_minor = tuple(jnp.swapaxes(k, 1, 2) for k in k0)

    passed = jax.jit(lambda ks, vs: run_loop(ks, vs), donate_argnums=(0, 1))
    passed_minor = jax.jit(lambda ks, vs: run_loop(ks, vs, keys_minor=True), donate_argnums=(0, 1))
    seed_k, seed_v = np.stack([np.asarray(k) for k in k0]), np.stack([np.asarray(v) for v in v0])

    @jax.jit
    def inside(sk, sv):  # the caches made inside the jit from the same values (XLA picks their layout)
        ks = tuple(sk[i].astype(dtype) for i in range(layers))
        vs = tuple(sv[i].astype(dtype) for i in range(layers))
        return run_loop(ks, vs)[0]

    fresh = lambda caches: tuple(jnp.array(c) for c in caches)  # noqa: E731  (the passed-in caches are donated)
    variants = {  # name -> (make the inputs, run)
        "token-major caches passed in (Linnet)": (lambda: (fresh(k0), fresh(v0)), lambda a: passed(*a)[0]),
        "token-major caches made inside the jit (KerasHub)": (lambda: (seed_k, seed_v), lambda a: inside(*a)),
        "keys positions-minor, passed in": (lambda: (fresh(k0_minor), fresh(v0)), lambda a: passed_minor(*a)[0]),
    }
    rows, first = [], None
    for name, (make, run) in variants.items():
        args = jax.block_until_ready(make())
        t0 = time.perf_counter()
        y = np.asarray(run(args).block_until_ready(), np.float32)
        compile_s = time.perf_counter() - t0
        walls = []
        for _ in range(3):
            args = jax.block_until_ready(make())
            t0 = time.perf_counter()
            run(args).block_until_ready()
            walls.append(time.perf_counter() - t0)
        args = jax.block_until_ready(make())
        device = trace_us(jax, lambda: run(args).block_until_ready(), out)  # noqa: B023  (called here, at once)
        first = y if first is None else first
        row = {
            "variant": name,
            "first_call_s": round(compile_s, 2),
            "wall_us_per_step": round(min(walls) / steps * 1e6, 1),
            "device_us_per_step": round(device / steps, 1),
            "max_abs_diff_vs_first": float(np.max(np.abs(y - first))),
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    result = {"device": str(jax.devices()[0]), "layers": layers, "positions": t, "steps": steps, "rows": rows}
    with open(os.path.join(out, "decode_cache_layouts.json"), "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
