"""The one `LoadedModel` protocol every backend's model follows, and what they share.

    model = get_backend("jax").load("examples/llama.linnet", random_weights=True)
    model.entries                        # ("forward", "step")
    (logits,) = model.run("forward", ids)  # always a tuple of numpy arrays
    logits = model.forward(ids)          # the same; one output comes back as one array
    model.native.forward(jax_ids)        # the backend's own arrays in and out (no host copy)
    runner = Generator(model.step_model(), model.tokenizer())

numpy in, numpy out. `run(entry, *arrays)` takes numpy arrays (anything `np.asarray` takes) and
returns a tuple with one numpy array per output of the entry, on every backend, so results
compare across backends without knowing any of them; an entry read as an attribute
(`model.forward(...)`) returns the one array of a one-output entry and the tuple otherwise.
bf16 arrays are `ml_dtypes.bfloat16`, as JAX's are. An entry that writes state (the KV cache)
keeps it in the model between calls. `native` is the explicit way to the backend's own arrays
(torch tensors on the model's device, JAX arrays; ONNX Runtime's are numpy): nothing is copied
to the host, which is what a training loop or `torch.compile` around the model wants.

Inputs are checked before they reach the backend (`check_inputs`): the number of arrays, each
one's rank, its fixed dims and the dims it shares with the other inputs (`B`, `S`), its dtype
(integers and bools convert to the entry's integer or bool dtype, numbers to its float dtype;
floats for integer inputs are refused), and for an entry with a KV cache, `rows` and
`positions` inside the cache. A misfit is a `RunError` naming the input, never the backend's
own error.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from linnet.errors import RunError

if TYPE_CHECKING:
    from linnet.ir.core import Graph, Program
    from linnet.runtimes.formats.tokenizer import Tokenizer

    from .generation import StepModel

# A decoder's optional one-token step (`entry fn decode`, with `step`'s inputs and `input_ids` i64[B, 1]): the same
# logits and KV cache writes as `step`, in the form the source chose for decode (GPT-OSS: each token through its
# chosen experts only, where `step` runs every expert for a long prefill).
DECODE_ENTRY = "decode"


def step_entry(entries, tokens: int) -> str:
    """The entry a step of `tokens` tokens a row runs: `decode` for one token when the program has it, else
    `step`."""
    return DECODE_ENTRY if tokens == 1 and DECODE_ENTRY in entries else "step"


__all__ = ["LoadedModel", "ModelBase", "Entries", "check_inputs", "random_inputs", "step_entry", "DECODE_ENTRY"]


@runtime_checkable
class LoadedModel(Protocol):
    """What every backend's `load` returns.

    - `backend`: the registry name it runs on (`torch-compile`).
    - `program`: the configured Core IR program (None for a JAX artifact loaded without source).
    - `config`: the merged config (HF field names).
    - `notes`: remarks for the user (stderr), e.g. unused checkpoint tensors, upcast ops.
    - `load_s`: seconds spent loading (checking, lowering, binding weights; on xla exporting the artifact). Compiles
      happen at the first call of an entry (per shape on JAX), and are timed apart (`caches.watch`).
    - `compile_kind`: what that first call does beyond running ("compile", "session build"; "" on eager PyTorch).
    - `weights`: the weights loaded (path or embedded id), None for random weights.
    - `entries`: the entry names, in source order.
    - `tokenizer()`: the checkpoint's tokenizer, or None.
    - `held_weights()`: the parameters as held now, `{path: array}` on the host (what exports read).
    - `run(entry, *arrays)`: numpy in, a tuple of numpy arrays out (see the module docstring).
    - `native`: the entries as the backend's own functions (`model.native.forward(...)`).
    - `step_model()`: the `step` entry adapted to the generation runner (`StepModel`).
    - `reset_state()`: zero the KV cache.
    """

    backend: str
    notes: list[str]
    load_s: float
    compile_kind: str

    @property
    def program(self) -> Program | None: ...

    @property
    def config(self) -> dict[str, Any]: ...

    @property
    def weights(self) -> str | None: ...

    @property
    def entries(self) -> tuple[str, ...]: ...

    @property
    def native(self) -> Entries: ...

    def tokenizer(self) -> Tokenizer | None: ...

    def held_weights(self) -> dict[str, np.ndarray]: ...

    def run(self, entry: str, *arrays: Any) -> tuple[np.ndarray, ...]: ...

    def step_model(self) -> StepModel: ...

    def reset_state(self) -> None: ...


class Entries:
    """A model's entries as attributes: `entries.forward(*arrays)`, through `make(name)`."""

    def __init__(self, names: Sequence[str], make: Callable[[str], Callable]):
        self._names = tuple(names)
        self._make = make

    def __getattr__(self, name: str) -> Callable:
        if name.startswith("_") or name not in self._names:
            raise AttributeError(f"no entry `{name}` (entries: {', '.join(self._names)})")
        return self._make(name)

    def __dir__(self) -> list[str]:
        return list(self._names)


class ModelBase:
    """What the backends' models share: the program, config and tokenizer from `prepared`, the
    entry names, `run` with its input checks, entries as attributes, and `native`. A backend
    defines `_run_arrays(entry, arrays) -> list[np.ndarray]` (checked numpy in, numpy out) and
    `_native_entry(entry) -> Callable` (its own arrays in and out)."""

    # Annotations only: a default here would become the default of the dataclass fields of the same name.
    backend: str
    notes: list[str]
    load_s: float
    max_batch: int
    max_positions: int

    # Read through __dict__, so that a half-built model never sends these to __getattr__.
    @property
    def program(self) -> Program | None:
        prepared = self.__dict__.get("prepared")
        return prepared.program if prepared is not None else None

    @property
    def config(self) -> dict[str, Any]:
        program = self.program
        return program.config if program is not None else {}

    @property
    def weights(self) -> str | None:
        prepared = self.__dict__.get("prepared")
        return prepared.weights if prepared is not None else None

    @property
    def entries(self) -> tuple[str, ...]:
        program = self.program
        return tuple(program.entries) if program is not None else ()

    def tokenizer(self) -> Tokenizer | None:
        prepared = self.__dict__.get("prepared")
        return prepared.tokenizer() if prepared is not None else None

    def held_weights(self) -> dict[str, np.ndarray]:
        """The parameters as the model holds them now, by path, copied to the host (`model_weights` orders and
        checks them). This default reads `self.params`, a dict of arrays by path; PyTorch's model overrides it."""
        from linnet.runtimes.model_weights import params_weights

        return params_weights(self)

    def graph(self, entry: str) -> Graph | None:
        """The IR graph of `entry` (None when the model has no program). Raises KeyError naming
        the entries."""
        if entry not in self.entries:
            raise KeyError(f"no entry `{entry}` (entries: {', '.join(self.entries)})")
        return self.program.entries[entry] if self.program is not None else None

    def run(self, entry: str, *arrays: Any) -> tuple[np.ndarray, ...]:
        """Entry `entry` on numpy arrays; a tuple of numpy arrays, one per output. Raises KeyError
        for an unknown entry and RunError for inputs that don't fit it."""
        graph = self.graph(entry)
        checked = check_inputs(graph, arrays, self.max_batch, self.max_positions) if graph is not None else arrays
        return tuple(self._run_arrays(entry, list(checked)))

    def entry(self, name: str) -> Callable:
        """Entry `name` as a function of numpy arrays returning one array (one output) or a tuple."""
        self.graph(name)

        def call(*arrays):
            outs = self.run(name, *arrays)
            return outs[0] if len(outs) == 1 else outs

        call.__name__ = name
        return call

    @property
    def native(self) -> Entries:
        return Entries(self.entries, self._native_entry)

    def __getattr__(self, name: str):
        # only names that are neither fields nor class attributes reach here: the entries
        if not name.startswith("_") and name in self.entries:
            return self.entry(name)
        raise AttributeError(f"{type(self).__name__} has no attribute or entry `{name}`")

    def _run_arrays(self, entry: str, arrays: list[np.ndarray]) -> list[np.ndarray]:
        raise NotImplementedError

    def _native_entry(self, entry: str) -> Callable:
        raise NotImplementedError


# --------------------------------------------------------------------------------------------- inputs

_KINDS = {"i64": "iub", "i32": "iub", "bool": "iub", "f32": "iubf", "f16": "iubf", "bf16": "iubf", "f64": "iubf"}


@dataclass(frozen=True)
class _Input:
    """What an entry takes at one input: its name, dtype, signature text and dims (an int, or
    the dim's text when it is symbolic)."""

    name: str
    dtype: str
    numpy: np.dtype
    signature: str
    dims: tuple[int | str, ...]


@lru_cache(maxsize=64)
def _signature(graph: Graph) -> tuple[tuple[_Input, ...], bool]:
    """What `graph` takes, and whether it uses state (both read once per graph)."""
    from linnet.runtimes.formats.checkpoints import numpy_dtype
    from linnet.types.dims import format_dim

    out = []
    for v in graph.inputs:
        texts = [format_dim(d) for d in v.dims]
        dims = tuple(d.as_int() if d.as_int() is not None else t for d, t in zip(v.dims, texts))
        signature = f"{v.dtype.name}[{', '.join(texts)}]"
        out.append(_Input(v.name, v.dtype.name, numpy_dtype(v.dtype.name), signature, dims))
    return tuple(out), graph.uses_state


def check_inputs(graph: Graph, arrays: Sequence[Any], max_batch: int, max_positions: int) -> list[np.ndarray]:
    """`arrays` as the numpy arrays entry `graph` takes: converted to its dtypes, checked against
    its rank and dims (a dim named alike, `B` or `S`, has one size across the inputs), and for an
    entry with a KV cache, `rows` within [0, max_batch) and `positions` + S within max_positions.

    Raises RunError naming the input and what the entry takes."""
    from linnet.runtimes.formats.checkpoints import is_floating

    name = graph.name
    takes, uses_state = _signature(graph)
    if len(arrays) != len(takes):
        names = ", ".join(i.name for i in takes)
        raise RunError(f"`{name}` takes {len(takes)} input(s) ({names}), got {len(arrays)}")
    sizes: dict[str, int] = {}
    out = []
    for want, x in zip(takes, arrays):
        a = x if isinstance(x, np.ndarray) else np.asarray(x)
        kind = "f" if is_floating(a) else a.dtype.kind
        if kind not in _KINDS.get(want.dtype, kind):
            raise RunError(f"`{name}` input `{want.name}` is {a.dtype}, the entry takes {want.signature}")
        if a.ndim != len(want.dims):
            raise RunError(f"`{name}` input `{want.name}` has shape {list(a.shape)}, the entry takes {want.signature}")
        for d, n in zip(want.dims, a.shape):
            if isinstance(d, int):
                fixed, bound = d, ""
            elif d.isidentifier():
                fixed = sizes.setdefault(d, n)
                bound = f" ({d} = {fixed} from the inputs before)"
            else:
                continue
            if fixed != n:
                raise RunError(
                    f"`{name}` input `{want.name}` has shape {list(a.shape)}, the entry takes {want.signature}{bound}"
                )
        out.append(np.ascontiguousarray(a if a.dtype == want.numpy else a.astype(want.numpy)))
    for i, (size, table) in _index_bounds(graph).items():
        ids = out[i]
        if ids.size and (ids.min() < 0 or ids.max() >= size):
            bad = np.argwhere((ids < 0) | (ids >= size))[0]
            raise RunError(
                f"`{name}` input `{takes[i].name}` holds {int(ids[tuple(bad)])} at index {bad.tolist()}, outside "
                f"[0, {size}): the rows of `{table}` (ids index it; a backend would fail or silently clamp)"
            )
    if uses_state:
        _check_cache_bounds(graph, dict(zip((i.name for i in takes), out)), max_batch, max_positions)
    return out


@lru_cache(maxsize=64)
def _index_bounds(graph: Graph) -> dict[int, tuple[int, str]]:
    """{input position: (rows, table path)} for each integer input of entry `graph` that indexes a parameter along
    a dim of fixed size (a `take` from an embedding table, reached through calls and loop bodies): the one range
    check every backend shares, so an id past the table is a RunError everywhere (PyTorch and ONNX Runtime would
    raise their own index errors, JAX and XLA clamp to the last row without a word)."""
    bounds: dict[int, tuple[int, str]] = {}
    seen: set[tuple[int, frozenset]] = set()

    def walk(g: Graph, tracked: dict[int, int], prefix: str) -> None:
        key = (id(g), frozenset(tracked.items()))
        if key in seen:
            return
        seen.add(key)
        for op in g.ops:
            if op.name == "take" and id(op.args.get("indices")) in tracked:
                table, dim = op.args["x"], int(op.args.get("dim", 0))
                size = table.type.shape.dims[dim].as_int() if dim < len(table.type.shape.dims) else None
                producer = table.producer
                if size is not None and producer is not None and producer.name == "param":
                    pos = tracked[id(op.args["indices"])]
                    if pos not in bounds or size < bounds[pos][0]:
                        bounds[pos] = (size, prefix + producer.attrs["path"])
            elif op.name == "call" and op.callee is not None:
                by_name = {v.name: v for v in op.callee.inputs}
                inner = {
                    id(by_name[k]): tracked[id(v)] for k, v in op.args.items() if k in by_name and id(v) in tracked
                }
                if inner:
                    walk(op.callee, inner, prefix + str(op.attrs.get("receiver") or ""))
            if op.body is not None:
                walk(op.body, tracked, prefix)

    walk(graph, {id(v): i for i, v in enumerate(graph.inputs) if v.type.dtype.kind == "int"}, "")
    return bounds


def _check_cache_bounds(graph: Graph, arrays: dict[str, np.ndarray], max_batch: int, max_positions: int) -> None:
    """Raise RunError when a step would read or write outside the KV cache: `rows` not in
    [0, max_batch), or `positions` + S past max_positions (the backends would give an index error, or
    on ONNX Runtime's ScatterND only "invalid indice", or on XLA silently clamp)."""
    ids = arrays.get(graph.inputs[0].name)
    rows, positions = arrays.get("rows"), arrays.get("positions")
    if rows is not None and rows.size and (rows.min() < 0 or rows.max() >= max_batch):
        raise RunError(f"rows {rows.tolist()} are outside the cache's {max_batch} rows (max_batch)")
    if positions is not None and ids is not None and ids.ndim == 2 and positions.size:
        end = int(positions.max()) + ids.shape[1]
        if positions.min() < 0 or end > max_positions:
            raise RunError(
                f"positions {positions.tolist()} with {ids.shape[1]} tokens reach position {end - 1}, outside the "
                f"cache's {max_positions} positions (max_positions)"
            )


def random_inputs(graph: Graph, sizes: dict[str, int], seed: int = 0, vocab_size: int = 100) -> list[np.ndarray]:
    """Inputs for entry `graph` with its symbolic dims set by `sizes` (`{"B": 2, "S": 8}`): token
    ids uniform in [0, vocab_size), `rows` 0..B-1, an all-ones `attention_mask`, zeros for other
    integers (positions), all-true bools, N(0, 1) floats; seeded, so every backend gets the same.
    Raises RunError for a dim `sizes` leaves unknown."""
    rng = np.random.default_rng(seed)
    out = []
    for v in graph.inputs:
        shape = [concrete_dim(d, sizes) for d in v.dims]
        if v.dtype.name in ("i64", "i32"):
            dt = np.int64 if v.dtype.name == "i64" else np.int32
            if v.name == "input_ids":
                a = rng.integers(0, int(vocab_size), shape, dtype=dt)
            elif v.name == "rows":
                a = np.arange(shape[0], dtype=dt)
            elif v.name == "attention_mask":
                a = np.ones(shape, dtype=dt)
            else:
                a = np.zeros(shape, dtype=dt)
        elif v.dtype.name == "bool":
            a = np.ones(shape, dtype=np.bool_)
        else:
            a = rng.standard_normal(shape).astype(np.float32)
        out.append(a)
    return out


def concrete_dim(d, sizes: dict[str, int]) -> int:
    """A dim's size with its dim variables set by `sizes` (`{"B": 1, "S": 8, "N": 4}`), computed
    by the dim algebra (`linnet.types.dims.evaluate`). Raises RunError naming the dim and the
    variables `sizes` lacks (or a `/` that is not whole under them)."""
    from linnet.types.dims import evaluate

    try:
        return evaluate(d, sizes)
    except ValueError as err:
        raise RunError(str(err)) from None
