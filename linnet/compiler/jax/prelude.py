"""The runtime helpers of the generated JAX code: the `Module` base class of its classes, and the functions its
statements call (`write_cache`, dropout's `DropoutKeys`, `share_dropout_keys` and `dropout`, and under `--dtype stored`
`dequantize`, `quantized_linear` and `quantized_take`).

A generated module imports the ones it uses (`from linnet.compiler.jax.prelude import Module, write_cache`): the
backend runs it so (`module.compile_program`), and the language server shows it so. A standalone file (`linnet jax
FILE -o model.py`, which imports only jax) carries their definitions instead, which the code generator reads from
this file's text (`codegen` imports no jax): `Module` before the model's classes, the functions after them. So each
definition here stands alone: it reads jax, `jnp`, `lax` and this file's names only. The fused weights
(`FUSED_WEIGHTS`, `fuse_weights`) and the dropout key's name (`DROPOUT_KEY`) are the model's, written in its file.
"""

import jax
import jax.numpy as jnp
from jax import lax


class Module:
    """A module of the checkpoint's tree over `arrays` (a dict by checkpoint name): the tensors
    named in PARAMS and STATE (dotted paths) and the submodules in CHILDREN (a class, or (class,
    count) for a list) are attributes (None for state `arrays` lacks). Assigning a state tensor
    records its new value: `state()` gives every state tensor of the tree by checkpoint name."""

    PARAMS: tuple = ()
    STATE: tuple = ()
    CHILDREN: dict = {}

    def __init__(self, arrays, prefix=""):
        self._prefix = prefix
        for name, child in self.CHILDREN.items():
            if isinstance(child, tuple):
                setattr(self, name, [child[0](arrays, f"{prefix}{name}.{i}.") for i in range(child[1])])
            else:
                setattr(self, name, child(arrays, f"{prefix}{name}."))
        for path in self.PARAMS + self.STATE:
            *parents, name = path.split(".")
            node = self
            for part, after in zip(parents, parents[1:] + [name]):
                if isinstance(node, list):  # a list of submodules without a class (`layers.0.weight`)
                    node.extend(Module({}, "") for _ in range(int(part) + 1 - len(node)))
                elif not hasattr(node, part):
                    setattr(node, part, [] if after.isdigit() else Module({}, ""))
                node = _child(node, part)
            setattr(node, name, arrays.get(prefix + path))  # state is absent for an entry that reads none

    def __getitem__(self, i):
        """Item `i` of a list whose items are modules of different classes (`layers[0]`)."""
        return getattr(self, str(i))

    def state(self):
        """The state tensors of this module and its submodules, by checkpoint name."""
        out = {}
        for path in self.STATE:
            node = self
            for part in path.split("."):
                node = _child(node, part)
            out[self._prefix + path] = node
        for name, child in self.CHILDREN.items():
            for module in getattr(self, name) if isinstance(child, tuple) else [getattr(self, name)]:
                out.update(module.state())
        return out


def _child(node, part):
    """`node.part`, or item `part` of a list of submodules."""
    return node[int(part)] if isinstance(node, list) else getattr(node, part)


# For caches held as [rows * H, T, D]. One token a row (decode): one scatter whose window is a row's H heads at one
# position, a dynamic-update-slice in place. Several tokens a row (prefill): a dynamic-update-slice of each row's
# [H, S, D] block where it fits in the cache, else (a padded prefill's tail past the end) the scatter of one window
# per position, which drops the positions past the cache. A TPU runs a scatter one window after another: a prefill
# of 512 tokens written as 512 windows a cache took ~1 ms a cache there, most of its time to first token.
def write_cache(cache, rows, positions, new):
    """`cache` [max_batch * H, T, D] with `new` [B, H, S, D] written at row `rows[b]`, positions
    `positions[b] + 0..S-1`; rows and positions past the cache are dropped (a padded batch's extra rows, a padded
    prefill's tail)."""
    return _one_or_many(
        new.shape[2],
        lambda c: _scatter_positions(c, rows, positions, new),
        lambda c: _write_blocks(c, rows, positions, new),
        cache,
    )


def _one_or_many(s, one, many, cache):
    """`one(cache)` when S (`s`) is 1, else `many(cache)`; S symbolic (an exported entry), decided once S is known (a
    constant predicate, which XLA folds away)."""
    if isinstance(s, int):
        return one(cache) if s == 1 else many(cache)
    return lax.cond(jnp.asarray(s) == 1, one, many, cache)


def _write_blocks(cache, rows, positions, new):
    """`write_cache` as one dynamic-update-slice of each row's [H, S, D] block, or where it does not fit (a padded
    prefill's tail past the end) that row's scatter (`_scatter_positions`)."""
    h, s = new.shape[1], new.shape[2]
    rows, positions = jnp.asarray(rows), jnp.asarray(positions)  # indexed by the loop's traced i

    def write_row(i, cache):
        row, position, block = rows[i], positions[i], new[i]
        return lax.cond(
            _block_fits(row * h, position, s, cache),
            lambda c: lax.dynamic_update_slice(c, block, (row * h, position, 0)),
            lambda c: _scatter_positions(c, row[None], position[None], block[None]),
            cache,
        )

    return lax.fori_loop(0, new.shape[0], write_row, cache)


def _block_fits(first, position, s, cache):
    """Whether a block of `s` positions from `position`, starting at index `first` of the cache's dim 0, lies inside
    `cache` (a dynamic-update-slice would clamp one that does not onto the last row or positions: a padded batch's
    rows past the cache, a padded prefill's tail)."""
    return (first < cache.shape[0]) & (position + jnp.asarray(s, position.dtype) <= cache.shape[1])


def _scatter_positions(cache, rows, positions, new):
    """`write_cache` as one scatter of one [H, D] window per row and position, positions past the cache dropped."""
    h, s = new.shape[1], new.shape[2]
    rows_and_positions = jnp.broadcast_arrays(rows[:, None] * h, positions[:, None] + lax.iota(jnp.int64, s))
    window = lax.ScatterDimensionNumbers(
        update_window_dims=(1, 3), inserted_window_dims=(1,), scatter_dims_to_operand_dims=(0, 1)
    )
    return lax.scatter(
        cache, jnp.stack(rows_and_positions, axis=-1), new, window, mode=lax.GatherScatterMode.FILL_OR_DROP
    )


# For caches held as [rows, T, H * D] (on a TPU: `linnet.ir.attention` says why). The same plan as `write_cache`: one
# token a row, one scatter of one [H * D] window per row (XLA runs it as one fusion); several, a dynamic-update-slice
# of each row's [S, H * D] block where it fits, else that row's scatter, which drops the positions past the cache.
def write_cache_tokens(cache, rows, positions, new):
    """`cache` [max_batch, T, H * D] with `new` [B, H, S, D] written at row `rows[b]`, positions
    `positions[b] + 0..S-1`; rows and positions past the cache are dropped (a padded prefill's tail, a padded
    batch's extra rows)."""
    b, h, s, d = new.shape
    tokens = jnp.swapaxes(new, 1, 2).reshape(b, s, h * d)
    return _one_or_many(
        s,
        lambda c: _scatter_tokens(c, rows, positions, tokens),
        lambda c: _write_token_blocks(c, rows, positions, tokens),
        cache,
    )


def _write_token_blocks(cache, rows, positions, tokens):
    """`write_cache_tokens` of `tokens` [B, S, H * D] as one dynamic-update-slice of each row's block, or where it
    does not fit that row's scatter (`_scatter_tokens`)."""
    s = tokens.shape[1]
    rows, positions = jnp.asarray(rows), jnp.asarray(positions)  # indexed by the loop's traced i

    def write_row(i, cache):
        row, position, block = rows[i], positions[i], tokens[i]
        return lax.cond(
            _block_fits(row, position, s, cache),
            lambda c: lax.dynamic_update_slice(c, block[None], (row, position, 0)),
            lambda c: _scatter_tokens(c, row[None], position[None], block[None]),
            cache,
        )

    return lax.fori_loop(0, tokens.shape[0], write_row, cache)


def _scatter_tokens(cache, rows, positions, tokens):
    """`write_cache_tokens` of `tokens` [B, S, H * D] as one scatter of one [H * D] window per row and position,
    those past the cache dropped."""
    s = tokens.shape[1]
    rows_and_positions = jnp.broadcast_arrays(rows[:, None], positions[:, None] + lax.iota(jnp.int64, s))
    window = lax.ScatterDimensionNumbers(
        update_window_dims=(2,), inserted_window_dims=(0, 1), scatter_dims_to_operand_dims=(0, 1)
    )
    return lax.scatter(
        cache, jnp.stack(rows_and_positions, axis=-1), tokens, window, mode=lax.GatherScatterMode.FILL_OR_DROP
    )


# Dropout, for a program that runs one: keys drawn in the order the trace runs the dropouts.
class DropoutKeys:
    """The random keys of one call's dropouts: the i-th dropout the trace runs draws with `fold_in(key, i)`.
    `key` None (the entry's `p` has no DROPOUT_KEY): inference, every dropout is the identity."""

    def __init__(self, key):
        self.key, self.count = key, 0

    def next(self):
        self.count += 1
        return jax.random.fold_in(self.key, self.count)


def share_dropout_keys(module, keys):
    """Give `module` and every submodule of it `keys` (their methods read `self.dropout_keys`)."""
    module.dropout_keys = keys
    for name, child in module.CHILDREN.items():
        for item in getattr(module, name) if isinstance(child, tuple) else [getattr(module, name)]:
            share_dropout_keys(item, keys)


def dropout(x, p, keys):
    """torch.nn.functional.dropout: with a key, each element zeroed with probability `p` and the others scaled by
    1 / (1 - p); without one (inference) `x`."""
    if keys is None or keys.key is None:
        return x
    keep = jax.random.bernoulli(keys.next(), 1.0 - p, x.shape)
    return jnp.where(keep, x * (1.0 / (1.0 - p)), jnp.zeros((), x.dtype))


# Matrices kept quantized (`--dtype stored`): a parameter may be a pair (codes, scales), codes i8[N, K] and scales
# f16[N, K / G], one scale per group of G consecutive values of a row (a GGUF Q8_0 matrix: G = 32, W = codes * scale;
# `linnet.runtimes.backends.jax_quantized` binds them). Which parameters are pairs is seen when the code is traced,
# so one class serves every layer, quantized or not. The values are dequantized where they are read, inside the jitted
# step: XLA fuses the convert and multiply into the dot's operand where it can, so the matrix is read as int8.
def dequantize(w, dtype=jnp.float32):
    """`w` itself, or the values `dtype`[..., K] of a quantized pair (codes i8[..., K], scales f16[..., K / G]):
    codes * scales, exact in f32 (an 8-bit integer times an f16)."""
    if not isinstance(w, tuple):
        return w
    codes, scales = w
    *rows, k = codes.shape
    groups = scales.shape[-1]
    blocks = codes.reshape(*rows, groups, k // groups).astype(dtype) * scales.astype(dtype)[..., None]
    return blocks.reshape(*rows, k)


def quantized_linear(x, w, precision):
    """`x @ w.T`: x [..., K] and w [N, K] (an array, or a quantized pair dequantized in x's dtype inside the dot)
    -> [..., N], at `precision`."""
    return jnp.einsum("...i,oi->...o", x, dequantize(w, x.dtype), precision=precision)


def quantized_take(w, indices, axis):
    """`jnp.take(w, indices, axis, mode="clip")`; of a quantized pair (axis 0), the rows' codes and scales taken, then
    dequantized in f32: exactly the dequantized table's rows, without the table."""
    if not isinstance(w, tuple):
        return jnp.take(w, indices, axis=axis, mode="clip")
    codes, scales = w
    return dequantize((jnp.take(codes, indices, axis=0, mode="clip"), jnp.take(scales, indices, axis=0, mode="clip")))
