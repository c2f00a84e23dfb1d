"""Greedy decode steps run on the device, many per dispatch: one row's (`generation.DecodeLoop`, `GreedyLoop`) and a
serving batch's (`generation.GreedySteps`, `BatchSteps`), for the JAX backends.

One host round trip per token (send the token, run `step`, bring the logits back, take the argmax, send the next)
costs a fixed ~2 ms on a TPU, most of a small model's step there (issue 41's measurements). Here a `lax.while_loop`
runs up to `CHUNK` decode steps of one row in one dispatch: `step` on the fed token, the argmax of its logits (the
first maximum, as `sampling.sample`), the stop check (a stop id, or logits not all finite) and the KV cache all stay
on the device, and the cache is donated, so XLA updates it in place. One small array comes back per chunk:
`[count, nan, inf, token_0 .. token_{CHUNK-1}]`.

Chunks are pipelined: the next chunk is dispatched, fed with the device-side token, position and stop flag of the
one before, before that one's tokens are read back, so the device never waits on the host; a chunk dispatched after
the loop stopped runs no step (its loop condition is false at once).

The loop runs the same `step` (the model's decode entry) the per-token path runs, compiled inside the loop: XLA may
fuse it differently there, so its logits can differ from the stand-alone step's in the last bits, and the tokens
are those of its own logits (tests/runtimes/test_jax_decode_loop.py compares them with the per-token path's).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Callable

import numpy as np

from linnet.compiler.jax.x64 import x64_scoped

CHUNK = 32  # decode steps a dispatch at most: tokens reach the host at least every CHUNK steps
BATCH_STEPS = 8  # a serving batch's decode steps a dispatch at most: a request arriving meanwhile waits that many


MIN_STOPS = 4  # the smallest stop table: a tokenizer's EOS ids and a few stop ids fit


def stop_table(stop_ids: frozenset[int]) -> np.ndarray:
    """`stop_ids` as an i64 array padded with -1 (no token) to a power of two of at least `MIN_STOPS`, so that a
    handful of sizes is ever compiled."""
    size = MIN_STOPS
    while size < len(stop_ids):
        size *= 2
    table = np.full(size, -1, dtype=np.int64)
    table[: len(stop_ids)] = sorted(stop_ids)
    return table


def build_loop(step: Callable, chunk: int = CHUNK) -> Callable:
    """The function `(params, state, token, position, row, steps, stop_ids, stopped) -> (report, state, token,
    position, stopped)` to jit with the state (argument 1) donated: at most `min(steps, chunk)` greedy decode steps
    of `step` (`(params, state, ids [1, 1], positions [1], rows [1]) -> (logits [1, V], state)`) from `token` (i64
    scalar) at `position` (i64 scalar) in cache `row` (i64 scalar), none when `stopped` (bool scalar). `report` is
    i64 `[3 + chunk]`: the steps run, the NaN and Inf counts of the last step's logits, then the tokens."""
    import jax.numpy as jnp
    from jax import lax

    def run(params, state, token, position, row, steps, stop_ids, stopped):
        def going(carry):
            i, _, _, _, _, stopped, _, _ = carry
            return (i < jnp.minimum(steps, chunk)) & ~stopped

        def one_step(carry):
            i, token, position, state, tokens, _, _, _ = carry
            logits, state = step(params, state, token.reshape(1, 1), position.reshape(1), row.reshape(1))
            logits = logits[0]
            nan, inf = jnp.isnan(logits).sum(), jnp.isinf(logits).sum()
            finite = (nan + inf) == 0
            token = jnp.argmax(logits).astype(jnp.int64)
            tokens = tokens.at[i].set(token)
            stopped = jnp.any(stop_ids == token) | ~finite
            return i + 1, token, position + 1, state, tokens, stopped, nan.astype(jnp.int64), inf.astype(jnp.int64)

        zero = jnp.zeros((), jnp.int64)
        start = (zero, token, position, state, jnp.full((chunk,), -1, jnp.int64), stopped, zero, zero)
        i, token, position, state, tokens, stopped, nan, inf = lax.while_loop(going, one_step, start)
        report = jnp.concatenate([jnp.stack([i, nan, inf]), tokens])
        return report, state, token, position, stopped

    return run


class GreedyLoop:
    """`decode_greedy` (`generation.DecodeLoop`) over a JAX model's decode entry `step` on one device: compiled once
    per stop-table size, with the model's XLA options (`compiler_options`)."""

    def __init__(self, model: Any, step: Callable, compiler_options: dict | None, chunk: int = CHUNK):
        import jax

        self.model, self.chunk, self._jax = model, chunk, jax
        self._fn = jax.jit(build_loop(step, chunk), donate_argnums=(1,), compiler_options=compiler_options)
        self._compiled: dict[int, Callable] = {}

    @x64_scoped  # the i64 specs; the executable then runs anywhere on the i64 arrays `put_input` makes
    def executable(self, table_size: int) -> Callable:
        """The loop compiled for a stop table of `table_size` ids (ahead of time, kept)."""
        exe = self._compiled.get(table_size)
        if exe is None:
            jax, m = self._jax, self.model
            on_device = jax.sharding.SingleDeviceSharding(m.device)
            i64 = jax.ShapeDtypeStruct((), np.int64, sharding=on_device)
            flag = jax.ShapeDtypeStruct((), np.bool_, sharding=on_device)
            table = jax.ShapeDtypeStruct((table_size,), np.int64, sharding=on_device)
            lowered = self._fn.lower(m.params, m.state, i64, i64, i64, i64, table, flag)
            exe = self._compiled[table_size] = lowered.compile()
        return exe

    def warm_up(self) -> None:
        """Compile the loop for the usual stop table (`MIN_STOPS` ids) and run it once for no step: XLA's first
        execution of a program pays a one-time setup that would otherwise land in the first chunk's time."""
        m, put = self.model, self.model.put_input
        zero = put(np.int64(0))
        report, m.state, *_ = self.executable(MIN_STOPS)(
            m.params, m.state, zero, zero, zero, zero, put(stop_table(frozenset())), put(np.bool_(False))
        )
        np.asarray(report)

    def __call__(
        self, token: int, position: int, row: int, steps: int, stop_ids: frozenset[int]
    ) -> Iterator[tuple[np.ndarray, tuple[int, int] | None]]:
        """See `generation.DecodeLoop.decode_greedy`."""
        m, put = self.model, self.model.put_input
        table = stop_table(stop_ids)
        exe = self.executable(len(table))
        stops, where = put(table), put(np.int64(row))
        # the device-side token, position and stop flag each chunk ends with feed the next one, host untouched
        token_at, position_at, stopped = put(np.int64(token)), put(np.int64(position)), put(np.bool_(False))
        pending = []  # reports dispatched, not read yet: one chunk runs ahead of the one read back
        for left in range(steps, 0, -self.chunk):
            report, m.state, token_at, position_at, stopped = exe(
                m.params, m.state, token_at, position_at, where, put(np.int64(left)), stops, stopped
            )
            pending.append(report)
            if len(pending) == 2 and not (yield from self._give(pending.pop(0))):
                return
        while pending:
            if not (yield from self._give(pending.pop(0))):
                return

    def _give(self, report):
        """Yield one chunk read back from `report`; True when the loop ran the whole chunk (more may follow)."""
        chunk, bad = self._read(report)
        yield chunk, bad
        return bad is None and len(chunk) == self.chunk

    def _read(self, report) -> tuple[np.ndarray, tuple[int, int] | None]:
        r = np.asarray(report)
        count, nan, inf = (int(v) for v in r[:3])
        if nan or inf:
            return r[3 : 3 + count - 1], (nan, inf)
        return r[3 : 3 + count], None


def greedy_tokens(logits):
    """i64 `[B]`, the first maximum of each row of `logits` `[B, V]` (as `sampling.sample` takes it), and i64
    `[B, 2]`, each row's NaN and Inf counts; a bf16 model's logits compared in f32, as the host compares them."""
    import jax.numpy as jnp

    x = logits.astype(jnp.float32)
    counts = jnp.stack([jnp.isnan(x).sum(-1), jnp.isinf(x).sum(-1)], axis=-1)
    return jnp.argmax(x, axis=-1).astype(jnp.int64), counts.astype(jnp.int64)


def build_batch_steps(step: Callable, chunk: int = BATCH_STEPS) -> Callable:
    """The function `(params, state, ids, positions, rows, n) -> (tokens, bad, state)` to jit with the state
    (argument 1) donated: `n` (i64 scalar, at most `chunk`) greedy decode steps of `step` (`(params, state, ids
    [B, 1], positions [B], rows [B]) -> (logits [B, V], state)`) of every row at once, each row fed its own argmax
    at its next position. `tokens` i64 `[B, chunk]`: step j's argmax of each row in column j (-1 past `n`); `bad`
    i64 `[B, chunk, 2]`: the NaN and Inf counts of the logits each token came from."""
    import jax.numpy as jnp
    from jax import lax

    def run(params, state, ids, positions, rows, n):
        def one_step(i, carry):
            ids, positions, state, tokens, bad = carry
            logits, state = step(params, state, ids, positions, rows)
            token, counts = greedy_tokens(logits)
            tokens = lax.dynamic_update_slice(tokens, token[:, None], (0, i))
            bad = lax.dynamic_update_slice(bad, counts[:, None], (0, i, 0))
            return token[:, None], positions + 1, state, tokens, bad

        b = ids.shape[0]
        start = (ids, positions, state, jnp.full((b, chunk), -1, jnp.int64), jnp.zeros((b, chunk, 2), jnp.int64))
        _, _, state, tokens, bad = lax.fori_loop(0, n, one_step, start)
        return tokens, bad, state

    return run


class BatchSteps:
    """`step_greedy_steps` (`generation.GreedySteps`) over a JAX model's decode entry `step` on one device: up to
    `chunk` decode steps of a batch in one dispatch (`build_batch_steps`), compiled once per batch size, with the
    model's XLA options. One host round trip per step costs a fixed ~1-2 ms on a TPU (issue 41's profile), a
    fifth of a 1.1B model's batched step; here it is paid once per `chunk` steps."""

    def __init__(self, model: Any, step: Callable, compiler_options: dict | None, chunk: int = BATCH_STEPS):
        import jax

        self.model, self.chunk, self._jax = model, chunk, jax
        self._fn = jax.jit(build_batch_steps(step, chunk), donate_argnums=(1,), compiler_options=compiler_options)
        self._compiled: dict[int, Callable] = {}

    @x64_scoped  # the i64 specs; the executable then runs anywhere on the i64 arrays `put_input` makes
    def executable(self, b: int) -> Callable:
        """The steps compiled for a batch of `b` rows (ahead of time, kept)."""
        exe = self._compiled.get(b)
        if exe is None:
            jax, m = self._jax, self.model
            on_device = jax.sharding.SingleDeviceSharding(m.device)
            ids = jax.ShapeDtypeStruct((b, 1), np.int64, sharding=on_device)
            vec = jax.ShapeDtypeStruct((b,), np.int64, sharding=on_device)
            n = jax.ShapeDtypeStruct((), np.int64, sharding=on_device)
            exe = self._compiled[b] = self._fn.lower(m.params, m.state, ids, vec, vec, n).compile()
        return exe

    def warm_up(self, b: int) -> None:
        """Compile the steps of `b` rows and run them once for no step (XLA's first execution of a program pays a
        one-time setup)."""
        m, put = self.model, self.model.put_input
        zeros = np.zeros(b, np.int64)
        tokens, _, m.state = self.executable(b)(
            m.params, m.state, put(zeros[:, None]), put(zeros), put(zeros), put(np.int64(0))
        )
        np.asarray(tokens)

    def __call__(
        self, ids: np.ndarray, positions: np.ndarray, rows: np.ndarray, n: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """`n` (1..chunk) steps of the `[B, 1]` `ids` at `positions` of `rows`; returns i64 `[B, n]` tokens and
        `[B, n, 2]` NaN and Inf counts. Rows and positions are the caller's to keep inside the cache."""
        if not 1 <= n <= self.chunk:
            raise ValueError(f"steps must be 1..{self.chunk}, got {n}")
        m, put = self.model, self.model.put_input
        tokens, bad, m.state = self.executable(ids.shape[0])(
            m.params, m.state, put(ids), put(positions), put(rows), put(np.int64(n))
        )
        return np.asarray(tokens)[:, :n], np.asarray(bad)[:, :n]
