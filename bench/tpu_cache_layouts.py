"""KV cache layouts for a batched decode step on one TPU chip: 22 layers of a TinyLlama-shaped cache write and decode
attention (64 rows of 640 positions, 4 KV heads of 64, 8 query heads each, bf16) at 8, 32 and 64 rows, the caches held
flat ([rows * H, T, D]) or token-major ([rows, T, H * D]), each written by a scatter or by a one-hot select, each read
by gathering the batch's rows or by attending over every row. Device time from the jax profiler's trace (the sum of
its XLA ops), wall time beside it, and the distance of each variant's output from the first.

    OUT=DIR python bench/tpu_cache_layouts.py             on the TPU machine (DIR/probe4.json)
    OUT=DIR python bench/tpu_cache_layouts.py --dry-run   the same code on the CPU at tiny sizes (no device times)

bench/results/tpu_cache_layouts_2026-12-06.json holds the run that chose the token-major layout
(linnet/ir/attention.py)."""

from __future__ import annotations

import collections
import glob
import json
import os
import re
import sys
import time

import numpy as np

OUT = os.environ.get("OUT", "/tmp/tpu_cache_layouts")
RESULTS = {}


def save(k, v):
    RESULTS[k] = v
    print(k, json.dumps(v)[:400], flush=True)
    with open(os.path.join(OUT, "probe4.json"), "w") as f:
        json.dump(RESULTS, f, indent=1)


def device_ms(jax, fn, reps=5):
    fn()
    fn()
    d = os.path.join(OUT, "trace")
    jax.profiler.start_trace(d)
    for _ in range(reps):
        fn()
    jax.profiler.stop_trace()
    files = sorted(glob.glob(os.path.join(d, "**", "*.xplane.pb"), recursive=True), key=os.path.getmtime)
    pd = jax.profiler.ProfileData.from_file(files[-1])
    total, kinds = 0, collections.Counter()
    for plane in pd.planes:
        if "TPU:0" not in plane.name:
            continue
        for line in plane.lines:
            if line.name != "XLA Ops":
                continue
            for ev in line.events:
                total += ev.duration_ns
                m = re.match(r"%([a-zA-Z_\-]+)", ev.name)
                kinds[m.group(1) if m else "?"] += ev.duration_ns
    import shutil

    shutil.rmtree(d, ignore_errors=True)
    return round(total / reps / 1e6, 3), {k: round(v / reps / 1e3) for k, v in kinds.most_common(8)}


def stepper(jax, dev, layers: int, shape, write, attn, inputs):
    """A function running `layers` layers of `write` (each K and V cache) then `attn`, the caches donated and kept
    between calls, returning the output once ready."""
    jnp = jax.numpy

    def layer_stack(state, q, new, rows, pos):
        out, new_state = q, []
        for i in range(layers):
            k = write(state[2 * i], rows, pos, new)
            v = write(state[2 * i + 1], rows, pos, new)
            out = attn(k, v, out, rows, pos)
            new_state += [k, v]
        return out, new_state

    f = jax.jit(layer_stack, donate_argnums=(0,))
    holder = [[jax.device_put(jnp.full(shape, 0.01, jnp.bfloat16), dev) for _ in range(2 * layers)]]

    def go():
        o, holder[0] = f(holder[0], *inputs)
        o.block_until_ready()
        return o

    return go


def main():
    dry = "--dry-run" in sys.argv
    os.makedirs(OUT, exist_ok=True)
    import jax
    import jax.numpy as jnp
    from jax import lax

    jax.config.update("jax_enable_x64", True)
    dev = jax.devices("cpu" if dry else "tpu")[0]
    R, H, T, D, G, L = (8, 2, 64, 16, 2, 2) if dry else (64, 4, 640, 64, 8, 22)
    bf = jnp.bfloat16

    def scatter(cache, idx, new, window_dims, inserted, to_operand):
        dn = lax.ScatterDimensionNumbers(
            update_window_dims=window_dims, inserted_window_dims=inserted, scatter_dims_to_operand_dims=to_operand
        )
        return lax.scatter(cache, idx, new, dn, mode=lax.GatherScatterMode.FILL_OR_DROP)

    # layouts: "flat" [R*H, T, D]; "rthd" [R, T, H*D]
    def write_flat_scatter(c, rows, pos, new):  # new [B, H, D]
        idx = jnp.stack([rows * H, pos], -1)
        return scatter(c, idx, new[:, :, None, :].reshape(-1, H, D), (1, 2), (1,), (0, 1))

    def write_flat_select(c, rows, pos, new):
        hit = jnp.arange(R)[:, None] == rows[None, :]
        at = jnp.max(jnp.where(hit, pos[None, :], -1), axis=1)
        val = new[jnp.argmax(hit, axis=1)]  # [R, H, D]
        c4 = c.reshape(R, H, T, D)
        out = jnp.where(jnp.arange(T)[None, None, :, None] == at[:, None, None, None], val[:, :, None, :], c4)
        return out.reshape(c.shape)

    def write_rthd_scatter(c, rows, pos, new):
        idx = jnp.stack([rows, pos], -1)
        return scatter(c, idx, new.reshape(-1, H * D), (1,), (0, 1), (0, 1))

    def write_rthd_select(c, rows, pos, new):
        hit = jnp.arange(R)[:, None] == rows[None, :]
        at = jnp.max(jnp.where(hit, pos[None, :], -1), axis=1)
        val = new.reshape(-1, H * D)[jnp.argmax(hit, axis=1)]
        return jnp.where(jnp.arange(T)[None, :, None] == at[:, None, None], val[:, None, :], c)

    def attn_flat_take(k, v, q, rows, pos):  # q [B, H*G, D]
        b = q.shape[0]
        kt = jnp.take(k.reshape(R, H, T, D), rows, axis=0, mode="clip").reshape(H * b, T, D)
        vt = jnp.take(v.reshape(R, H, T, D), rows, axis=0, mode="clip").reshape(H * b, T, D)
        s = jnp.einsum("ksd,ktd->kst", q.reshape(H * b, G, D), kt).reshape(b, H * G, T) * 0.125
        s = jnp.where(jnp.arange(T)[None, None, :] <= pos[:, None, None], s, -1e30)
        p = jax.nn.softmax(s.astype(jnp.float32), -1).astype(bf)
        return jnp.einsum("kst,ktd->ksd", p.reshape(H * b, G, T), vt).reshape(b, H * G, D)

    def attn_flat_all(k, v, q, rows, pos):
        qa = jnp.zeros((R, H * G, D), q.dtype).at[rows].set(q, mode="drop")
        pa = jnp.full((R,), -1, pos.dtype).at[rows].set(pos, mode="drop")
        s = jnp.einsum("ksd,ktd->kst", qa.reshape(H * R, G, D), k).reshape(R, H * G, T) * 0.125
        s = jnp.where(jnp.arange(T)[None, None, :] <= pa[:, None, None], s, -1e30)
        p = jax.nn.softmax(s.astype(jnp.float32), -1).astype(bf)
        o = jnp.einsum("kst,ktd->ksd", p.reshape(H * R, G, T), v).reshape(R, H * G, D)
        return jnp.take(o, rows, axis=0, mode="clip")

    def attn_rthd_take(k, v, q, rows, pos):
        b = q.shape[0]
        kt = jnp.take(k, rows, axis=0, mode="clip").reshape(b, T, H, D)
        vt = jnp.take(v, rows, axis=0, mode="clip").reshape(b, T, H, D)
        s = jnp.einsum("bhgd,bthd->bhgt", q.reshape(b, H, G, D), kt).reshape(b, H * G, T) * 0.125
        s = jnp.where(jnp.arange(T)[None, None, :] <= pos[:, None, None], s, -1e30)
        p = jax.nn.softmax(s.astype(jnp.float32), -1).astype(bf)
        return jnp.einsum("bhgt,bthd->bhgd", p.reshape(b, H, G, T), vt).reshape(b, H * G, D)

    def attn_rthd_all(k, v, q, rows, pos):
        qa = jnp.zeros((R, H * G, D), q.dtype).at[rows].set(q, mode="drop")
        pa = jnp.full((R,), -1, pos.dtype).at[rows].set(pos, mode="drop")
        s = jnp.einsum("bhgd,bthd->bhgt", qa.reshape(R, H, G, D), k.reshape(R, T, H, D)).reshape(R, H * G, T) * 0.125
        s = jnp.where(jnp.arange(T)[None, None, :] <= pa[:, None, None], s, -1e30)
        p = jax.nn.softmax(s.astype(jnp.float32), -1).astype(bf)
        o = jnp.einsum("bhgt,bthd->bhgd", p.reshape(R, H, G, T), v.reshape(R, T, H, D)).reshape(R, H * G, D)
        return jnp.take(o, rows, axis=0, mode="clip")

    variants = {
        "flat scatter+take (now)": ("flat", write_flat_scatter, attn_flat_take),
        "flat select+take": ("flat", write_flat_select, attn_flat_take),
        "flat select+all": ("flat", write_flat_select, attn_flat_all),
        "flat scatter+all": ("flat", write_flat_scatter, attn_flat_all),
        "rthd scatter+take": ("rthd", write_rthd_scatter, attn_rthd_take),
        "rthd select+take": ("rthd", write_rthd_select, attn_rthd_take),
        "rthd scatter+all": ("rthd", write_rthd_scatter, attn_rthd_all),
        "rthd select+all": ("rthd", write_rthd_select, attn_rthd_all),
    }
    key = jax.random.PRNGKey(0)
    for B in (4,) if dry else (8, 32, 64):
        rows = jax.device_put(jnp.array(np.random.default_rng(0).permutation(R)[:B]), dev)
        pos = jax.device_put(jnp.array(np.random.default_rng(1).integers(T // 2, T - 1, B)), dev)
        q = jax.device_put(jax.random.normal(key, (B, H * G, D), bf), dev)
        new = jax.device_put(jax.random.normal(key, (B, H, D), bf), dev)
        ref = None
        for name, (layout, write, attn) in variants.items():
            shape = (R * H, T, D) if layout == "flat" else (R, T, H * D)

            go = stepper(jax, dev, L, shape, write, attn, (q, new, rows, pos))

            try:
                o = np.asarray(go().astype(jnp.float32))
                ref = o if ref is None else ref
                t = time.perf_counter()
                for _ in range(10):
                    go()
                wall = (time.perf_counter() - t) / 10 * 1e3
                dms, kinds = device_ms(jax, go) if not dry else (None, None)
                save(
                    f"B{B} {name}",
                    {
                        "wall_ms": round(wall, 3),
                        "device_ms": dms,
                        "kinds_us": kinds,
                        "max_diff": float(np.abs(o - ref).max()),
                    },
                )
            except Exception as e:
                save(f"B{B} {name}", {"error": f"{type(e).__name__}: {str(e)[:300]}"})
            del go


main()
