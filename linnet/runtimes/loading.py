"""Backend-neutral loading: a source, a preset and weights become a configured `Program` and
a plan binding each parameter to a checkpoint tensor.

Weights (ARCHITECTURE.md, "Weights"): a Hugging Face directory, a `.gguf` file or an embedded
id. With none given, the preset's `@weights(...)` default is used; a file whose presets name
no default weights needs `weights=` (or `random_weights=True`, for `linnet run`).

Names are checked both ways and every shape against the checker's: a mismatch is an
`L501`/`L502` error naming the tensor (and both shapes). A checkpoint whose names lack (or
add) a leading prefix the source has, like GPT-2 files saved without `transformer.`, or a
RoBERTa-for-X checkpoint's `roberta.`, is matched by that prefix. A model marked
`@takes_part` takes a part of its checkpoint: the tensors none of its parameters takes are a
note (how many, and a few), not an error.

Tensors travel as numpy arrays (`planned_tensors`, `random_params`); each runtime converts
them once to its own arrays. Nothing here imports torch, jax or onnxruntime.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from linnet.errors import LoadError, SourceError, UnknownPreset
from linnet.ir.build import (
    ConfigLayer,
    SourceInfo,
    bind_config,
    check_source,
    lower_program,
    preset_weights,
    read_source,
)
from linnet.ir.core import Program
from linnet.runtimes.formats.checkpoints import EMBEDDED_IDS as EMBEDDED
from linnet.runtimes.formats.checkpoints import (
    INTEGER_DTYPES,
    Checkpoint,
    check_cast_fits,
    numpy_dtype,
    open_checkpoint,
)
from linnet.runtimes.formats.gguf_quants import STORED, STORED_TYPES, working_dtype
from linnet.runtimes.formats.gguf_reader import PLAIN_TYPES
from linnet.runtimes.formats.mxfp4 import quantized_view
from linnet.syntax import ast as A
from linnet.types.core import F32, WORK

from .model import LoadedModel

__all__ = [
    "LoadOptions",
    "LoadError",
    "LoadedModel",
    "Prepared",
    "prepare",
    "default_preset",
    "planned_tensors",
    "random_params",
    "match_weights",
    "weight_problems",
    "WeightProblem",
    "bind_checkpoint_config",
    "dequantizing_view",
    "resolve_preset_weights",
]


@dataclass(frozen=True)
class LoadOptions:
    """What every backend's load takes beside the source and its weights (ARCHITECTURE.md, "Backends"): the one
    set of loading options, passed whole from `Backend.load` to a runtime module and to `prepare`.

    Fields:
        preset: the source's preset (None: the first with default weights when no weights are given, else the
            config defaults).
        config: `--config` overrides, HF field names (the last word of the configuration precedence).
        dtype: the working dtype ("f32", "bf16", "f16"), or "stored" (GGUF's quantized matrices kept as stored).
        numerics: "equivalent" (the reference's op order and casts) or "fast".
        device: "cpu", "cuda[:N]" or "tpu" (a backend runs the kinds its record lists).
        max_batch: KV-cache rows (requests decoded together).
        max_positions: positions each cache row holds.
        random_weights: draw seeded N(0, 0.02) weights when none are given (`random_params`), instead of the
            preset's default weights.
        seed: the seed of those random weights.
        progress: show a progress bar while tensors are read.
    """

    preset: str | None = None
    config: dict[str, Any] | None = None
    dtype: str = "f32"
    numerics: str = "equivalent"
    device: str = "cpu"
    max_batch: int = 1
    max_positions: int = 768
    random_weights: bool = False
    seed: int = 0
    progress: bool = True


LOAD_OPTION_NAMES = frozenset(LoadOptions.__dataclass_fields__)


@dataclass
class Prepared:
    """What a backend needs: the program, the checkpoint (None for random weights) and the
    parameter path -> checkpoint name plan. `notes` are remarks for stderr."""

    program: Program
    info: SourceInfo
    checkpoint: Checkpoint | None
    plan: dict[str, str] = field(default_factory=dict)
    weights: str | None = None
    notes: list[str] = field(default_factory=list)
    stored: bool = False  # `--dtype stored`: GGUF's quantized tensors load as `GroupQuantized` (see gguf_quants)

    def tokenizer(self):
        return self.checkpoint.tokenizer() if self.checkpoint is not None else None


def default_preset(info: SourceInfo) -> str | None:
    """The first preset with default weights, else None (the config defaults)."""
    for name in info.analysis.declared_presets:
        if preset_weights(info, name) is not None:
            return name
    return None


def prepare(
    source: str | Path,
    weights: str | Path | None = None,
    options: LoadOptions = LoadOptions(),
    *,
    entries: list[str] | None = None,
    text: str | None = None,
    view: Callable[[Program, Checkpoint], Checkpoint] | None = None,
) -> Prepared:
    """Check the source, open the weights, merge configs, lower, and match names and shapes, under `options`'
    preset, config, dtype, cache size (max_batch, max_positions) and random_weights.

    `text`, when given, is the source's text checked under the path `source` (a source transform's output, such
    as LoRA's, whose imports and messages stay those of the file); `view(program, checkpoint)` sees the opened
    checkpoint through a view before names are matched (LoRA adds its adapters' tensors there).

    `dtype="stored"` (`--dtype stored`, see `gguf_quants`) lowers the program in f32 and marks the result
    `stored`, so that `planned_tensors` keeps the GGUF file's quantized tensors quantized; it needs a GGUF
    checkpoint with quantized tensors.

    Raises LoadError (UnknownPreset for a preset the source does not declare, OSError for an unreadable source)."""
    preset, config, random_weights = options.preset, options.config, options.random_weights
    max_batch, max_positions = options.max_batch, options.max_positions
    stored, dtype = options.dtype == STORED, working_dtype(options.dtype)
    if stored and random_weights:
        raise LoadError("--dtype stored keeps a GGUF file's quantized weights as stored: give --weights (a .gguf file)")
    try:
        path, text = (str(source), text) if text is not None else read_source(source)
        info = check_source(path, text, preset)
        if preset is None and weights is None and not random_weights:
            preset = info.preset = default_preset(info)
        if weights is None and not random_weights:
            named = preset_weights(info, preset) if preset is not None else None
            weights = resolve_preset_weights(path, named) if named is not None else None
            if weights is None:
                which = f"preset `{preset}`" if preset else f"{path} (no preset)"
                raise LoadError(
                    f"{which} names no default weights: give --weights (a HF directory, .gguf or embedded id)"
                )
        checkpoint = None
        notes: list[str] = []
        if weights is not None:
            checkpoint = open_checkpoint(weights)
            info = bind_checkpoint_config(info, checkpoint, weights, config)
        else:
            info = bind_config(info, config or {}, labels=("--config",))
        notes += info.notes
        program = lower_program(info, dtype, max_batch, max_positions, entries)
        table = learned_position_rows(program.config)
        if table is not None and table < max_positions:
            notes.append(
                f"the cache holds {table} positions, the rows of the model's learned position table (n_positions), "
                f"not {max_positions}"
            )
            program = lower_program(info, dtype, max_batch, table, entries)
        _check_fits_in_memory(program, random_weights=checkpoint is None)
    except UnknownPreset:
        raise  # the caller's usage error (exit 2 on the command line), not the source's
    except SourceError as err:  # a source or config error met while loading (CheckpointError is a LoadError)
        raise LoadError(err.message, code=err.code) from err
    if checkpoint is not None:
        checkpoint = dequantizing_view(program, checkpoint)
        if view is not None:
            checkpoint = view(program, checkpoint)
    prepared = Prepared(program, info, checkpoint, weights=str(weights) if weights is not None else None, notes=notes)
    if checkpoint is not None:
        prepared.plan = match_weights(program, checkpoint, prepared.notes)
    if stored:
        _check_stored(prepared)
    return prepared


def _check_stored(prepared: Prepared) -> None:
    """Mark `prepared` (with a checkpoint) for `--dtype stored`, or refuse, before any tensor is read, a checkpoint
    with nothing to keep quantized (a Hugging Face folder, a GGUF file whose tensors are all plain floats) or with
    tensors of a type `gguf_quants` cannot keep (naming a few and their types). Raises LoadError."""
    ckpt = prepared.checkpoint
    if ckpt.format != "gguf":
        raise LoadError(
            f"--dtype stored keeps a GGUF file's quantized weights as stored, but {ckpt.source} is a {ckpt.format} "
            "checkpoint: nothing in it is quantized; use --dtype f32, bf16 or f16"
        )
    types = {ckpt.dtype(name) for name in prepared.plan.values()}
    if not types - PLAIN_TYPES:
        raise LoadError(
            f"--dtype stored keeps quantized weights as stored, but every tensor of {ckpt.source} is "
            f"{', '.join(sorted(types))}: nothing in it is quantized; use --dtype f32, bf16 or f16"
        )
    cannot = {name: ckpt.dtype(name) for name in prepared.plan.values()}
    cannot = {name: t for name, t in cannot.items() if t not in PLAIN_TYPES and t not in STORED_TYPES}
    if cannot:
        few = ", ".join(f"`{name}` ({t})" for name, t in list(cannot.items())[:4])
        raise LoadError(
            f"--dtype stored cannot keep {len(cannot)} tensor(s) of {ckpt.source} quantized: {few}; it keeps "
            f"{', '.join(STORED_TYPES)}; use --dtype f32 (dequantized)"
        )
    prepared.stored = True
    prepared.notes.append(
        f"--dtype stored: the {', '.join(sorted(types - PLAIN_TYPES))} matrices of "
        f"{Path(ckpt.source).name} stay quantized; activations, norms and the KV cache are f32"
    )


def dequantizing_view(program: Program, ckpt: Checkpoint) -> Checkpoint:
    """`ckpt` with the quantized tensors of the parameters `program` declares `@quantized(...)` read as those
    parameters, dequantized to the program's dtype, when the checkpoint's `quantization_config.quant_method`
    (a config field the source must declare, so any other method is refused when the config is bound) names their
    format; else `ckpt` itself. See `mxfp4.quantized_view`; raises CheckpointError for a malformed pair."""
    scheme = program.config.get("quantization_config")
    method = scheme.get("quant_method") if isinstance(scheme, dict) else None
    quantized = {p.path: p.quantized for p in program.params if p.quantized}
    return quantized_view(ckpt, quantized, method, program.dtype.name)


def learned_position_rows(config: dict[str, Any]) -> int | None:
    """The rows of a learned absolute-position table (GPT-2's `wpe`, `n_positions` rows in transformers'
    GPT2Config), or None for a model whose positions have no table (rope). A position past the table has no
    embedding: PyTorch and ONNX Runtime fail on it and XLA clamps the index (silently wrong), so loading sizes
    the cache to at most these rows and generation stops there with finish reason "length", as transformers'
    GPT-2 cannot go past them either; Whisper's decoder table has `max_target_positions` rows.
    (`max_position_embeddings` is not such a bound: rope models run past it.)"""
    rows = config.get("n_positions", config.get("max_target_positions"))
    return rows if isinstance(rows, int) and not isinstance(rows, bool) and rows > 0 else None


def resolve_preset_weights(source_path: str, named: str) -> str:
    """The checkpoint a preset's `@weights("...")` names: an embedded id as it is; a path relative to the folder
    of the `.linnet` file at `source_path` (the current folder for a source given as text), `~` expanded."""
    if named in EMBEDDED:
        return named
    p = Path(named).expanduser()
    if p.is_absolute() or source_path == "<source>":
        return str(p)
    return str(Path(source_path).parent / p)


def bind_checkpoint_config(
    info: SourceInfo, checkpoint: Checkpoint, weights: str | Path, config: dict[str, Any] | None = None
) -> SourceInfo:
    """`info` checked again under its preset overridden by the checkpoint's config (config.json or the GGUF
    metadata; `null`s of fields with defaults dropped, see `_drop_unset`) and then `config` (`--config`), as
    loading binds them (ARCHITECTURE.md, "Configuration precedence"). Errors about a config.json value point at
    its key in the file. Raises ConfigError (L503, L505, L507, L401) or ProgramError, each carrying its
    `diagnostics`."""
    ckpt_config = ConfigLayer(_drop_unset(info, checkpoint.config), f"{weights} config", flattened=checkpoint.flattened)
    if checkpoint.format == "hf" and checkpoint.path is not None:  # errors point at the key in config.json
        config_json = Path(checkpoint.path) / "config.json"
        ckpt_config.label = str(config_json)
        try:
            ckpt_config.text, ckpt_config.path = config_json.read_text(encoding="utf-8"), str(config_json)
        except (OSError, UnicodeDecodeError):
            pass  # read when the checkpoint opened; gone since: errors show the values
    return bind_config(info, ckpt_config, config or {}, labels=("", "--config"))


RANDOM_WEIGHTS_SHARE = 0.5  # of the memory available now, the most random weights and state may take


def _check_fits_in_memory(program: Program, random_weights: bool) -> None:
    """Refuse what would not fit in memory (bytes against MemAvailable, Linux only), rather than let
    the allocation fail with a framework traceback or the process be killed: random weights and the
    state (KV cache) together, or with a checkpoint the state alone (its size is set by
    `--max-positions` and `--max-batch`; the checkpoint's own size is the user's choice). Raises LoadError."""
    try:
        meminfo = Path("/proc/meminfo").read_text()
    except OSError:
        return
    available = next(
        (int(line.split()[1]) * 1024 for line in meminfo.splitlines() if line.startswith("MemAvailable:")), None
    )
    if available is None:
        return

    def nbytes(specs) -> int:
        total = 0
        for spec in specs:
            n = 1
            for d in spec.shape:
                n *= d
            dtype = program.dtype if spec.type.dtype == WORK else spec.type.dtype
            total += n * (dtype.itemsize or F32.itemsize)
        return total

    total = nbytes(program.params + program.state) if random_weights else nbytes(program.state)
    if total <= RANDOM_WEIGHTS_SHARE * available:
        return
    if random_weights:
        label = f"preset `{program.preset}`" if program.preset else "the config defaults"
        raise LoadError(
            f"random weights for {program.model} under {label} need {total / 2**30:.1f} GiB, "
            f"more than half the {available / 2**30:.1f} GiB available: pick a smaller preset (--preset)"
        )
    raise LoadError(
        f"the state (KV cache) of {program.model} for max_batch {program.max_batch} and max_positions "
        f"{program.max_positions} needs {total / 2**30:.1f} GiB, more than half the {available / 2**30:.1f} GiB "
        "available: lower --max-positions or --max-batch"
    )


def planned_tensors(prepared: Prepared, progress: bool, dtype: str | None = None):
    """Yield (parameter path, numpy array) for every entry of `prepared.plan`, each read as
    `Checkpoint.load(name, dtype)` (a read-only memory map where the format allows; `dtype` a
    Linnet dtype name casts floating-point tensors), with a progress bar on stderr for loads
    that take over a second. Without `dtype` (the runtime casts on its device) each tensor is
    still checked to fit the program's dtype (`check_cast_fits`). When `prepared.stored`, a quantized
    GGUF matrix comes as a `GroupQuantized` (never cast) and the rest as above, and once the caller has taken one
    the file's resident pages are released (`Checkpoint.release_pages`: backends keep their own packed copies,
    so the load's peak does not hold the file's pages beside them). Raises CheckpointError for
    unreadable data and for values that are, or become when cast, NaN or infinite."""
    import sys

    from tqdm import tqdm

    bar = tqdm(
        total=len(prepared.plan),
        desc=f"loading {Path(str(prepared.weights)).name}",
        unit="tensor",
        file=sys.stderr,
        delay=1.0,
        disable=not progress,
        leave=False,
    )
    with bar:
        for path, name in prepared.plan.items():
            quantized = prepared.stored and prepared.checkpoint.dtype(name) not in PLAIN_TYPES
            a = prepared.checkpoint.load(name, dtype=STORED if quantized else dtype)
            if dtype is None and not quantized:
                check_cast_fits(a, prepared.program.dtype.name, name, prepared.checkpoint.path or prepared.weights)
            yield path, a
            if quantized:  # the backend has repacked it: its pages of the file are dead weight in our RSS
                prepared.checkpoint.release_pages()
            bar.update(1)


def _drop_unset(info: SourceInfo, config: dict[str, Any]) -> dict[str, Any]:
    """The checkpoint config without the `null`s of fields the source declares non-optional with a default:
    transformers writes `null` for a field it leaves to its default (GPT-2's `n_inner`, meaning 4 * n_embd),
    so the preset's value or the source's default stands."""
    item = info.analysis.globals(info.config_type)
    fields = {f.name.id: f for f in item.ast.fields if isinstance(f, A.ConfigField)} if item is not None else {}

    def unset(key: str, value: Any) -> bool:
        f = fields.get(key)
        if value is not None or f is None or f.default is None:
            return False
        return not (isinstance(f.type, A.NamedType) and f.type.optional)

    return {k: v for k, v in config.items() if not unset(k, v)}


@dataclass(frozen=True)
class WeightProblem:
    """One way a checkpoint does not fit a program, as loading words it.

    code: "L501" (shape), "L502" (names; a stored head under `tie_word_embeddings` that differs; parameters found
        under two prefixes), "L504" (an integer or bool tensor where a parameter is).
    kind: "shape", "missing", "extra", "tied", "prefix" or "dtype".
    message: one line naming the checkpoint, the tensor and the source's parameter.
    param: the source's parameter path it concerns (`model.layers.0.self_attn.q_proj.weight`), if one.
    tensor: the checkpoint tensor it concerns, if one.
    """

    code: str
    kind: str
    message: str
    param: str | None = None
    tensor: str | None = None


def weight_problems(
    program: Program, ckpt: Checkpoint, notes: list[str], read_data: bool = True
) -> tuple[dict[str, str], list[WeightProblem]]:
    """(parameter path -> checkpoint name, every problem found): names both ways, every dtype and every shape.
    Checkpoint tensors no parameter takes are problems unless the model is `@takes_part` (then a note in
    `notes`). A stored `lm_head.weight` under `tie_word_embeddings` must equal the embeddings bit for bit; with
    `read_data` false (a header check) that comparison, the only one that reads tensor data, is left to loading
    and said in `notes`. The loader (`match_weights`) and `linnet check --weights` share this."""
    model = [p.path for p in program.params]
    names = [n for n in ckpt.tensor_names if n not in ckpt.buffer_names]
    try:
        rename = prefix_map(model, set(names), program.part_prefix if program.takes_part else None, ckpt.source)
    except LoadError as err:
        return {}, [WeightProblem(err.code or "L502", "prefix", err.message)]
    plan = {m: rename(m) for m in model}
    taken = set(plan.values())
    problems: list[WeightProblem] = []
    for m, c in plan.items():  # an integer tensor where a parameter is (safetensors lists it as a buffer)
        if c in ckpt and ckpt.dtype(c) in INTEGER_DTYPES:
            message = (
                f"`{c}` in {ckpt.source} is {ckpt.dtype(c)} {list(ckpt.shape(c))}, but {program.source} declares "
                f"`{m}` as a parameter, which takes floating point (f32, f16, bf16)"
            )
            problems.append(WeightProblem("L504", "dtype", message, m, c))
    present = set(names)
    missing = [m for m, c in plan.items() if c not in present]
    extra = [n for n in names if n not in taken]
    tied = program.config.get("tie_word_embeddings")
    if extra and tied:
        heads = [n for n in extra if n.endswith("lm_head.weight")]
        for n in heads:
            if read_data:
                try:
                    _check_tied_head(ckpt, n, [c for c in taken if c in ckpt])
                except LoadError as err:
                    problems.append(WeightProblem("L502", "tied", err.message, None, n))
            else:
                notes.append(
                    f"{ckpt.source} stores `{n}` while `tie_word_embeddings` is true: loading compares it with the "
                    "embeddings bit for bit (tensor data, not read by a header check)"
                )
        extra = [n for n in extra if n not in heads]
    if extra and program.takes_part and not missing:
        where = _part_prefix(plan)
        notes.append(
            f"{ckpt.source}: {program.source} takes a part of the checkpoint ({where}); "
            f"{len(extra)} tensor(s) not used: " + _few(extra, 4)
        )
        extra = []
    for m in missing:
        message = f"`{m}` in {program.source} has no tensor `{plan[m]}` in {ckpt.source}"
        problems.append(WeightProblem("L502", "missing", message, m, plan[m]))
    for n in extra:
        message = f"`{n}` in {ckpt.source} is taken by no parameter of {program.source}"
        problems.append(WeightProblem("L502", "extra", message, None, n))
    for spec in program.params:
        c = plan[spec.path]
        if c not in present:
            continue
        have = tuple(ckpt.shape(c))
        if have != spec.shape:
            message = (
                f"`{c}` in {ckpt.source} is {list(have)}, but {program.source} declares `{spec.path}` as "
                f"{list(spec.shape)}"
            )
            problems.append(WeightProblem("L501", "shape", message, spec.path, c))
    return plan, problems


def match_weights(program: Program, ckpt: Checkpoint, notes: list[str]) -> dict[str, str]:
    """Parameter path -> checkpoint name, every shape and dtype checked (`weight_problems`). Checkpoint tensors
    no parameter takes are an error unless the model is `@takes_part` (then a note in `notes`).
    Raises LoadError for the first kind of problem found, in this order: parameters under two prefixes (L502),
    an integer or bool tensor where a parameter is (L504), a stored `lm_head.weight` under
    `tie_word_embeddings` that differs from the embeddings (L502), names missing or extra (L502, all of them
    in one message), a shape (L501)."""
    plan, problems = weight_problems(program, ckpt, notes)
    for kind in ("prefix", "dtype", "tied"):
        first = next((p for p in problems if p.kind == kind), None)
        if first is not None:
            raise LoadError(first.message, code=first.code)
    missing = [p.param for p in problems if p.kind == "missing"]
    extra = [p.tensor for p in problems if p.kind == "extra"]
    if missing or extra:
        names = [n for n in ckpt.tensor_names if n not in ckpt.buffer_names]
        lines = [f"the names of {ckpt.source} don't match {program.source}"]
        if missing:
            lines.append(f"  {len(missing)} parameter(s) missing from the checkpoint: " + _few(missing))
        stored = [p.tensor for p in problems if p.kind == "missing" and f"{p.tensor}_blocks" in ckpt]
        if stored:
            lines.append(
                f"  {_few([n + '_blocks' for n in stored])} (and `_scales`) look quantized (MXFP4 blocks and "
                "scales), but the checkpoint's config has no `quantization_config` the source reads them under"
            )
        if extra:
            lines.append(f"  {len(extra)} checkpoint tensor(s) no parameter takes: " + _few(extra))
            if len(extra) < len(names):
                lines.append("  (a source that loads a part of a checkpoint says so with `@takes_part` on its model)")
        raise LoadError("\n".join(lines), code="L502")
    shape = next((p for p in problems if p.kind == "shape"), None)
    if shape is not None:
        raise LoadError(shape.message, code=shape.code)
    return plan


def _part_prefix(plan: dict[str, str]) -> str:
    """How the plan places the parameters: "under `roberta.`" or "its names as the source's"."""
    m, c = next(iter(plan.items()))
    return f"under `{c[: len(c) - len(m)]}`" if c != m and c.endswith(m) else "names as the source's"


_EMBEDDING_NAMES = ("embed_tokens", "wte", "word_embeddings", "token_embd")


def _check_tied_head(ckpt: Checkpoint, head: str, taken: list[str]) -> None:
    """A checkpoint that stores `head` while the config ties the head to the embeddings loads only when the
    stored head equals the embeddings bit for bit: transformers 5 uses a stored head even when
    `tie_word_embeddings` is true, so tying a different one would run silently wrong. The embeddings are the
    tensor the model takes whose name says so (`embed_tokens`, `wte`, `word_embeddings`) with the head's shape.
    Raises LoadError (L502) naming the tensor, the key and the file."""
    where = (
        str(Path(ckpt.path) / "config.json")
        if ckpt.format == "hf" and ckpt.path is not None and "tie_word_embeddings" in ckpt.config
        else "the config"
    )
    shape, dtype = tuple(ckpt.shape(head)), ckpt.dtype(head)
    embeds = [c for c in taken if any(k in c for k in _EMBEDDING_NAMES) and tuple(ckpt.shape(c)) == shape]
    for emb in embeds:
        if ckpt.dtype(emb) != dtype:
            continue
        a, b = ckpt.load(head), ckpt.load(emb)
        width = a.dtype.itemsize
        as_bits = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}.get(width)
        if as_bits is not None and np.array_equal(a.view(as_bits), b.view(as_bits)):
            return
    against = f", which differs from `{embeds[0]}`" if embeds else " (no embedding tensor of its shape to compare)"
    raise LoadError(
        f"{ckpt.source} stores its own `{head}`{against}, but `tie_word_embeddings` is true in {where}: "
        "transformers uses the stored head, the source would use the embeddings; set `tie_word_embeddings` "
        "to false (or drop the stored head if the model is meant to be tied)",
        code="L502",
    )


def random_params(program: Program, seed: int = 0) -> dict[str, np.ndarray]:
    """Random weights for `program` by parameter path, the same on every backend: biases 0, other
    1-d parameters (norm scales) 1, the rest N(0, 0.02) drawn in parameter order from numpy's
    PCG64 with `seed`; f32, cast to the working dtype (bf16 rounds to nearest even)."""
    rng = np.random.default_rng(seed)
    dtype = numpy_dtype(program.dtype.name)
    out = {}
    for spec in program.params:
        shape = spec.shape
        if spec.path.endswith("bias"):
            a = np.zeros(shape, np.float32)
        elif len(shape) == 1:
            a = np.ones(shape, np.float32)
        else:
            a = (rng.standard_normal(shape) * 0.02).astype(np.float32)
        out[spec.path] = a.astype(dtype)
    return out


def prefix_map(model: list[str], names: set[str], prefix: str | None = None, source: str = "the checkpoint"):
    """A renaming model path -> checkpoint name: identity, dropping a leading segment the
    checkpoint lacks (`transformer.` in GPT-2 files saved without it), or adding the prefix the
    checkpoint has (`bert.`, `model.encoder.`: any number of segments). With `prefix` (a model's
    `@takes_part("roberta")`), that prefix and nothing else. Raises LoadError (L502) when the
    parameters are found whole under more than one prefix (name one with `@takes_part`)."""
    if prefix is not None:
        return lambda m, p=prefix + ".": p + m
    if not model or all(m in names for m in model):
        return lambda m: m
    heads = {m.split(".", 1)[0] for m in model}
    for head in heads:
        drop = head + "."
        stripped = {m: m[len(drop) :] for m in model if m.startswith(drop)}
        if stripped and all(s in names for s in stripped.values()):
            return lambda m, p=drop: m[len(p) :] if m.startswith(p) else m
    # prefixes under which the first parameter is found, then those that hold every parameter
    first = model[0]
    candidates = sorted({n[: -len(first)] for n in names if n.endswith("." + first)})
    found = [p for p in candidates if all(p + m in names for m in model)]
    if len(found) > 1:
        shown = ", ".join(f"`{p}`" for p in found)
        raise LoadError(
            f"every parameter is in {source} under more than one prefix ({shown}): name the one to load with "
            f'`@takes_part("{found[0][:-1]}")` on the model',
            code="L502",
        )
    if found:
        return lambda m, p=found[0]: p + m
    return lambda m: m


def _few(names: list[str], n: int = 6) -> str:
    shown = ", ".join(f"`{x}`" for x in names[:n])
    return shown + (f" and {len(names) - n} more" if len(names) > n else "")
