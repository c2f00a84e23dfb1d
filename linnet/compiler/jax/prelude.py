"""The runtime helpers of the generated JAX code: the `Module` base class of its classes, and the functions its
statements call (`write_cache`, `scan_layers` over a list held `Stacked`, dropout's `DropoutKeys`,
`share_dropout_keys` and `dropout`, and under `--dtype stored` `dequantize`, `quantized_linear` and `quantized_take`).

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
                head = f"{prefix}{name}.*."  # a list held stacked (`Stacked`): its members under `layers.*.`
                stacked = {k[len(head) :]: v for k, v in arrays.items() if k.startswith(head)}
                items = [child[0](arrays, f"{prefix}{name}.{i}.") for i in range(child[1])] if not stacked else None
                setattr(self, name, items if items is not None else Stacked(child[0], stacked, child[1]))
            else:
                setattr(self, name, child(arrays, f"{prefix}{name}."))
        # lists without a class of their own held stacked (`encoder.layer.*.norm1.weight`): `Stacked`s, by list path
        self._stacked = _stacked_classless(self.PARAMS, self.STATE, arrays, prefix)
        for head, items in self._stacked.items():
            *parents, name = head.split(".")
            setattr(self._node(parents, name), name, items)
        for path in self.PARAMS + self.STATE:
            if _list_of(path, self._stacked) is None:
                *parents, name = path.split(".")
                setattr(self._node(parents, name), name, arrays.get(prefix + path))  # state absent: an entry reads none

    def _node(self, parents, name):
        """The module at path `parents` (made as the path goes: plain `Module`s, and lists for a list's items without
        a class, `layers.0.weight`), whose member `name` is next."""
        node = self
        for part, after in zip(parents, parents[1:] + [name]):
            if isinstance(node, list):
                node.extend(Module({}, "") for _ in range(int(part) + 1 - len(node)))
            elif not hasattr(node, part):
                setattr(node, part, [] if after.isdigit() else Module({}, ""))
            node = _child(node, part)
        return node

    def __getitem__(self, i):
        """Item `i` of a list whose items are modules of different classes (`layers[0]`)."""
        return getattr(self, str(i))

    # An item of a list held stacked, inside `Stacked.scan`, holds its state as `StateSlot`s: reading one gives the
    # item's slice (a dynamic slice of the stacked array), and the cache writers write into the stacked array
    # itself, at the item's index, so the scan updates the donated cache in place, as the unrolled code does.
    def __getattr__(self, name):
        slot = self.__dict__.get("_slots", {}).get(name)
        if slot is None:
            raise AttributeError(name)
        return slot.read()

    def __setattr__(self, name, value):
        slots = self.__dict__.setdefault("_slots", {}) if isinstance(value, StateSlot) else self.__dict__.get("_slots")
        if slots is None or (name not in slots and not isinstance(value, StateSlot)):
            object.__setattr__(self, name, value)
        elif name not in slots:
            slots[name] = value
        else:
            slots[name].assign(value)

    def state(self):
        """The state tensors of this module and its submodules, by checkpoint name."""
        out = {}
        for head, items in self._stacked.items():
            out.update({f"{self._prefix}{head}.*.{k}": v for k, v in items.state.items()})
        for path in self.STATE:
            if _list_of(path, self._stacked) is not None:
                continue
            node = self
            for part in path.split("."):
                node = _child(node, part)
            out[self._prefix + path] = node
        for name, child in self.CHILDREN.items():
            items = getattr(self, name)
            if isinstance(items, Stacked):
                out.update({f"{self._prefix}{name}.*.{k}": v for k, v in items.state.items()})
                continue
            for module in items if isinstance(child, tuple) else [items]:
                out.update(module.state())
        return out


class Stacked:
    """A list of `count` submodules of class `cls` held stacked: each member of theirs is one array whose leading
    axis is the item (`arrays`, by path relative to an item: `self_attn.k_cache` [count, ...]). `scan_layers` runs a
    loop over it as one `lax.scan`; `state` holds the stacked state, new once a scan wrote it."""

    def __init__(self, cls, arrays, count):
        self.cls, self.count = cls, count
        self.state = {k: v for k, v in cls(arrays).state().items() if v is not None}
        self.params = {k: v for k, v in arrays.items() if k not in self.state}

    def scan(self, body, carry, state_per_item=False):
        """`body(item, carry) -> carry` over the items in order, as one `lax.scan` over the stacked parameters.
        The stacked state is carried, each item holding its slots of it (`StateSlot`: written in place at its
        index); or with `state_per_item`, scanned over as the parameters are, each item given its slice and the
        slices it leaves stacked again (the scan's `xs` and `ys`), which the token-major caches of a TPU need (the
        chip's compiler re-laid the whole carried stack of caches for each layer's write and read: four copies of
        it a layer, 18.1 ms a step of SmolLM2-1.7B against 5.8 ms unrolled, 6.3 ms so;
        bench/results/tpu_profile_scan_state_2026-12-07.md).
        A parameter that can be seen as one item's without slicing (`at_layer`: a quantized pair held stacked for a
        kernel, which reads its item's tiles from the stack) is not scanned over: the item gets `at_layer(i)`, since
        a scan's slice handed to a kernel's custom call is copied out of the stack first."""
        views = {k: v for k, v in self.params.items() if hasattr(v, "at_layer")}
        sliced = {k: v for k, v in self.params.items() if k not in views}
        if state_per_item:

            def one_item(carry, xs):
                i, params, state = xs
                item = self.cls({**params, **{k: v.at_layer(i) for k, v in views.items()}, **state})
                carry = body(item, carry)
                left = item.state()
                return carry, {k: left[k] for k in state}

            carry, self.state = lax.scan(one_item, carry, (jnp.arange(self.count), sliced, self.state))
            return carry

        def one(carried, xs):
            carry, state = carried
            i, params = xs
            slots = {k: StateSlot(v, i) for k, v in state.items()}
            held = {k: v.at_layer(i) for k, v in views.items()}
            carry = body(self.cls({**params, **held, **slots}), carry)
            return (carry, {k: slot.stacked for k, slot in slots.items()}), None

        try:
            (carry, self.state), _ = lax.scan(one, (carry, self.state), (jnp.arange(self.count), sliced))
        finally:
            StateSlot.reads.clear()  # the traced slices are dead once the body is traced
        return carry


class StateSlot:
    """An item's state tensor in `Stacked.scan`: `stacked` [items, ...] and the item's `index`. `read()` gives the
    item's slice; the cache writers (`write_cache`, `write_cache_tokens`) given a slice read so write into `stacked`
    at `index` and return the slot written, which the item's assignment takes (`assign`); any other value assigned
    is written back as the item's slice."""

    reads: dict = {}  # id(slice read) -> (slot, slice): which slot an array came from, while a scan traces

    def __init__(self, stacked, index):
        self.stacked, self.index = stacked, index

    def read(self):
        a = lax.dynamic_index_in_dim(self.stacked, self.index, 0, False)
        StateSlot.reads[id(a)] = (self, a)  # the array kept alive with its id
        return a

    def assign(self, value):
        if isinstance(value, StateSlot):
            self.stacked = value.stacked
        else:
            self.stacked = lax.dynamic_update_index_in_dim(self.stacked, value, self.index, 0)

    @staticmethod
    def of(cache):
        """(the slot `cache` was read from, or None; the array to write: the slot's stacked one, or `cache`), and
        the leading index to write at (`(index,)`, or `()`)."""
        found = StateSlot.reads.get(id(cache))
        if found is None or found[1] is not cache:
            return None, cache, ()
        return found[0], found[0].stacked, (found[0].index,)


def scan_layers(items, body, carry, state_per_item=False):
    """`carry = body(item, carry)` for each item of a list of submodules, in order: one `lax.scan` when the list is
    held stacked (`Stacked`: the body is traced and compiled once), else a plain loop. Returns the last carry.
    `state_per_item`: how the scan holds the items' state (`Stacked.scan`)."""
    if isinstance(items, Stacked):
        return items.scan(body, carry, state_per_item)
    for item in items:
        carry = body(item, carry)
    return carry


def _stacked_classless(params, state, arrays, prefix):
    """The lists of submodules that have no class of their own (their items' members are among a module's `params`
    and `state` paths, `encoder.layer.0.norm1.weight`: a module the generated code inlined) and that `arrays` holds
    stacked (`encoder.layer.*.norm1.weight`, the runtime's `scan.stacked_key`), each as a `Stacked` of a class made
    for its items from item 0's paths (the items are alike: `scan.stacked_lists`), by list path relative to
    `prefix`."""
    heads = {k[len(prefix) :].partition(".*.")[0] for k in arrays if ".*." in k and k.startswith(prefix)}
    members, counts = {}, {}
    for kind, paths in (("PARAMS", params), ("STATE", state)):
        for path in paths:
            found = _list_of(path, heads)
            if found is not None:
                head, index, rest = found
                counts[head] = max(counts.get(head, 0), index + 1)
                if index == 0:
                    members.setdefault(head, {"PARAMS": [], "STATE": []})[kind].append(rest)
    out = {}
    for head, kinds in members.items():
        item = type("StackedItem", (Module,), {k: tuple(v) for k, v in kinds.items()})
        held = f"{prefix}{head}.*."
        out[head] = Stacked(item, {k[len(held) :]: v for k, v in arrays.items() if k.startswith(held)}, counts[head])
    return out


def _list_of(path, heads):
    """(list path, item index, the member's path in the item) when `path` is a member of an item of a list in
    `heads` (`encoder.layer.3.norm1.weight` -> ("encoder.layer", 3, "norm1.weight")), else None."""
    parts = path.split(".")
    for i in range(1, len(parts) - 1):
        if parts[i].isdigit() and ".".join(parts[:i]) in heads:
            return ".".join(parts[:i]), int(parts[i]), ".".join(parts[i + 1 :])
    return None


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
    prefill's tail). A cache read from a `StateSlot` is written in its stacked array, and the slot returned."""
    slot, cache, lead = StateSlot.of(cache)
    out = _one_or_many(
        new.shape[2],
        lambda c: _scatter_positions(c, rows, positions, new, lead),
        lambda c: _write_blocks(c, rows, positions, new, lead),
        cache,
    )
    return out if slot is None else StateSlot(out, slot.index)


def _one_or_many(s, one, many, cache):
    """`one(cache)` when S (`s`) is 1, else `many(cache)`; S symbolic (an exported entry), decided once S is known (a
    constant predicate, which XLA folds away)."""
    if isinstance(s, int):
        return one(cache) if s == 1 else many(cache)
    return lax.cond(jnp.asarray(s) == 1, one, many, cache)


def _write_blocks(cache, rows, positions, new, lead=()):
    """`write_cache` as one dynamic-update-slice of each row's [H, S, D] block, or where it does not fit (a padded
    prefill's tail past the end) that row's scatter (`_scatter_positions`). `lead`: the indices of the dims `cache`
    has before [rows * H, T, D] (a stacked item's)."""
    h, s = new.shape[1], new.shape[2]
    rows, positions = jnp.asarray(rows), jnp.asarray(positions)  # indexed by the loop's traced i
    k = len(lead)

    def write_row(i, cache):
        row, position, block = rows[i], positions[i], new[i]
        return lax.cond(
            _block_fits(row * h, position, s, cache, k),
            lambda c: lax.dynamic_update_slice(c, block.reshape((1,) * k + block.shape), (*lead, row * h, position, 0)),
            lambda c: _scatter_positions(c, row[None], position[None], block[None], lead),
            cache,
        )

    return lax.fori_loop(0, new.shape[0], write_row, cache)


def _block_fits(first, position, s, cache, k=0):
    """Whether a block of `s` positions from `position`, starting at index `first` of the cache's row dim (dim `k`:
    after the `k` stacked dims a `lead` indexes), lies inside `cache` (a dynamic-update-slice would clamp one that does
    not onto the last row or positions: a padded batch's rows past the cache, a padded prefill's tail)."""
    return (first < cache.shape[k]) & (position + jnp.asarray(s, position.dtype) <= cache.shape[k + 1])


def _scatter_positions(cache, rows, positions, new, lead=()):
    """`write_cache` as one scatter of one [H, D] window per row and position, positions past the cache dropped;
    `lead` as `_write_blocks` takes it."""
    h, s, k = new.shape[1], new.shape[2], len(lead)
    index = (*lead, rows[:, None] * h, positions[:, None] + lax.iota(jnp.int64, s))
    window = lax.ScatterDimensionNumbers(
        update_window_dims=(1, 3),
        inserted_window_dims=(*range(k), k + 1),
        scatter_dims_to_operand_dims=tuple(range(k + 2)),
    )
    indices = jnp.stack(jnp.broadcast_arrays(*(jnp.asarray(i, jnp.int64) for i in index)), axis=-1)
    return lax.scatter(cache, indices, new, window, mode=lax.GatherScatterMode.FILL_OR_DROP)


# For caches held as [rows, T, H * D] (on a TPU: `linnet.ir.attention` says why). The same plan as `write_cache`: one
# token a row, one scatter of one [H * D] window per row (XLA runs it as one fusion); several, a dynamic-update-slice
# of each row's [S, H * D] block where it fits, else that row's scatter, which drops the positions past the cache.
def write_cache_tokens(cache, rows, positions, new):
    """`cache` [max_batch, T, H * D] with `new` [B, H, S, D] written at row `rows[b]`, positions
    `positions[b] + 0..S-1`; rows and positions past the cache are dropped (a padded prefill's tail, a padded
    batch's extra rows)."""
    b, h, s, d = new.shape
    tokens = jnp.swapaxes(new, 1, 2).reshape(b, s, h * d)
    slot, cache, lead = StateSlot.of(cache)
    out = _one_or_many(
        s,
        lambda c: _scatter_tokens(c, rows, positions, tokens, lead),
        lambda c: _write_token_blocks(c, rows, positions, tokens, lead),
        cache,
    )
    return out if slot is None else StateSlot(out, slot.index)


def _write_token_blocks(cache, rows, positions, tokens, lead=()):
    """`write_cache_tokens` of `tokens` [B, S, H * D] as one dynamic-update-slice of each row's block, or where it
    does not fit that row's scatter (`_scatter_tokens`); `lead` as `_write_blocks` takes it."""
    s, k = tokens.shape[1], len(lead)
    rows, positions = jnp.asarray(rows), jnp.asarray(positions)  # indexed by the loop's traced i

    def write_row(i, cache):
        row, position, block = rows[i], positions[i], tokens[i]
        return lax.cond(
            _block_fits(row, position, s, cache, k),
            lambda c: lax.dynamic_update_slice(
                c, block.reshape((1,) * (k + 1) + block.shape), (*lead, row, position, 0)
            ),
            lambda c: _scatter_tokens(c, row[None], position[None], block[None], lead),
            cache,
        )

    return lax.fori_loop(0, tokens.shape[0], write_row, cache)


def _scatter_tokens(cache, rows, positions, tokens, lead=()):
    """`write_cache_tokens` of `tokens` [B, S, H * D] as one scatter of one [H * D] window per row and position,
    those past the cache dropped; `lead` as `_write_blocks` takes it."""
    s, k = tokens.shape[1], len(lead)
    index = (*lead, rows[:, None], positions[:, None] + lax.iota(jnp.int64, s))
    window = lax.ScatterDimensionNumbers(
        update_window_dims=(2,),
        inserted_window_dims=tuple(range(k + 2)),
        scatter_dims_to_operand_dims=tuple(range(k + 2)),
    )
    indices = jnp.stack(jnp.broadcast_arrays(*(jnp.asarray(i, jnp.int64) for i in index)), axis=-1)
    return lax.scatter(cache, indices, tokens, window, mode=lax.GatherScatterMode.FILL_OR_DROP)


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
        items = getattr(module, name)
        if isinstance(items, Stacked):  # never: a list whose loop runs dropout is not stacked (`scan.py`)
            continue
        for item in items if isinstance(child, tuple) else [items]:
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
    w = _own_pair(w)
    codes, scales = w[0], _row_scales(w)
    *rows, k = codes.shape
    groups = scales.shape[-1]
    blocks = codes.reshape(*rows, groups, k // groups).astype(dtype) * scales.astype(dtype)[..., None]
    return blocks.reshape(*rows, k)


def quantized_linear(x, w, precision):
    """`x @ w.T`: x [..., K] and w [N, K] (an array, or a quantized pair dequantized in x's dtype inside the dot)
    -> [..., N], at `precision`. A pair held for a kernel (on a TPU: `linnet.compiler.jax.q8_kernel.KMajorQ8`)
    multiplies itself (`w.matmul`)."""
    if hasattr(w, "matmul"):
        return w.matmul(x, precision)
    return jnp.einsum("...i,oi->...o", x, dequantize(w, x.dtype), precision=precision)


def quantized_take(w, indices, axis):
    """`jnp.take(w, indices, axis, mode="clip")`; of a quantized pair (axis 0), the rows' codes and scales taken, then
    dequantized in f32: exactly the dequantized table's rows, without the table."""
    if not isinstance(w, tuple):
        return jnp.take(w, indices, axis=axis, mode="clip")
    w = _own_pair(w)
    return dequantize((jnp.take(w[0], indices, axis=0, mode="clip"), _row_scales(w, indices)))


def _own_pair(w):
    """A quantized pair as its own arrays: a scanned item's view of a pair held stacked (`Stacked.scan`, `at_layer`)
    as the item's pair (`pair()`: a slice of each stack), any other pair itself."""
    return w.pair() if hasattr(w, "pair") else w


def _row_scales(w, indices=None):
    """A quantized pair's scales [N, K / G], one row per row of codes (or those of the rows `indices`, clipped): the
    pair's second array, or what a pair held for a kernel gives (`row_scales`: held otherwise, e.g. transposed)."""
    if hasattr(w, "row_scales"):
        return w.row_scales(indices)
    return w[1] if indices is None else jnp.take(w[1], indices, axis=0, mode="clip")
