"""From a `.linnet` source to a `Program`: check it, bind its config, lower, optimise, verify.

Configuration precedence (ARCHITECTURE.md): the config's defaults < the preset < the
checkpoint's config (`config.json` or GGUF metadata, by field name) < `--config key=value`.
The merged config is written as a preset of the source's own config type and checked with
the file, so a checkpoint value that breaks a shape (9 heads that don't divide 576 + 1) is
reported by the checker, on the field, like any preset error.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..errors import ConfigError, SourceError, UnknownPreset
from ..semantics.attributes import inert_keys, takes_part
from ..semantics.diagnostics import Diagnostic, LocatedLabel
from ..semantics.preset_weights import preset_model_mismatch, preset_weights_at  # noqa: F401 - re-exported
from ..semantics.program import Analysis
from ..semantics.render import render_text
from ..semantics.suggest import closest
from ..syntax import ast as A
from ..syntax.items import Location
from ..syntax.positions import LineIndex
from ..syntax.sources import NotUtf8, read_source_text
from ..types.core import DTYPES
from .analyses import analyze_source
from .core import Program
from .inline import inline_calls, layer_calls
from .lower import Lowering, LoweringError
from .passes import optimize_program
from .verify import VerifyError, verify_program

BOUND_PRESET = "linnet_loaded"
# Keys transformers writes into the config.json of every model (PretrainedConfig's own attributes and the file's
# bookkeeping). They describe the file, the tokenizer, task heads or generation defaults, never the outputs of the
# model a source describes, so loading skips them for every source. A model's own keys that do not change its
# computation (dropout rates, `initializer_range`, `use_cache`) are listed by its config's `@inert(...)`; any other
# key a config does not declare is refused (L503): ignoring it could be silently wrong.
# Keys whose meaning is Hugging Face's, with the range their computation is defined on: (bound, bound allowed).
# A value outside (from config.json, GGUF metadata or --config) is L505: it would run to NaN logits, no error.
VALUE_RANGES: dict[str, tuple[float, bool]] = {
    "rms_norm_eps": (0.0, True),
    "layer_norm_eps": (0.0, True),
    "layer_norm_epsilon": (0.0, True),
    "norm_eps": (0.0, True),
    "rope_theta": (0.0, False),
    "factor": (0.0, False),  # rope scaling (linear, llama3, ...)
    # a window of 0 masks every key: the softmax of an all-masked row is uniform, finite nonsense
    # (transformers itself crashes on it)
    "sliding_window": (1.0, True),
}

METADATA_KEYS = frozenset(
    {
        # the file: what wrote it, which classes read it, the stored dtype
        "architectures", "model_type", "transformers_version", "torch_dtype", "dtype", "_name_or_path",
        "_commit_hash", "_attn_implementation", "_attn_implementation_autoset", "auto_map", "transformers.js_config",
        # diffusers' config.json: the class that reads it and the version that wrote it (ConfigMixin.save_config)
        "_class_name", "_diffusers_version",
        # what a transformers forward returns besides the outputs, and training switches
        "output_attentions", "output_hidden_states", "return_dict", "torchscript", "gradient_checkpointing",
        # the feed-forward chunked over positions: the same values (`apply_chunking_to_forward`)
        "chunk_size_feed_forward",
        # the tokenizer's special tokens and class (generation's stop tokens come from the tokenizer files)
        "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "unk_token_id", "decoder_start_token_id",
        "tokenizer_class", "prefix",
        # task heads and pipelines (a source describes the base model or its LM head)
        "id2label", "label2id", "num_labels", "problem_type", "finetuning_task", "task_specific_params",
        # generation defaults transformers 4 wrote into config.json; `linnet generate` takes its own from flags
        "max_length", "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups",
        "diversity_penalty", "temperature", "top_k", "top_p", "typical_p", "repetition_penalty", "length_penalty",
        "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "bad_words_ids", "num_return_sequences",
        "output_scores", "return_dict_in_generate", "forced_bos_token_id", "forced_eos_token_id",
        "remove_invalid_values", "exponential_decay_length_penalty", "suppress_tokens", "begin_suppress_tokens",
    }
)  # fmt: skip


@dataclass
class ConfigLayer:
    """Config values laid over a source's preset (ARCHITECTURE.md, "Configuration precedence").

    values: field name -> Python value (nested dicts for config-typed fields).
    label: what they are, for messages (`"llama-dir/config.json"`, `"--config"`).
    path, text: the file they were read from (a config.json), where errors point; without them
        errors point into the values written as JSON under `label`.
    checkpoint: a checkpoint's config, whose keys may also be bookkeeping (METADATA_KEYS) or
        declared inert by the source (`@inert`), both skipped; `--config` values must be fields.
    flattened: keys the file held that `values` holds under other names (a flat `rope_parameters`,
        read as `rope_theta` and `rope_scaling`): a source field of that name is refused (L507).
    """

    values: dict[str, Any]
    label: str
    path: str | None = None
    text: str | None = None
    checkpoint: bool = True
    flattened: frozenset[str] = frozenset()

    def where(self) -> tuple[str, str]:
        """(path, text) errors about these values point into: the file, else the values written as
        JSON, or as the command line's `--config key=value` flags."""
        if self.path is not None and self.text is not None:
            return self.path, self.text
        if not self.checkpoint:
            flags = (f"--config {k}={v if isinstance(v, str) else json.dumps(v)}\n" for k, v in self.values.items())
            return self.label, "".join(flags)
        return self.label, json.dumps(self.values, indent=2, default=str) + "\n"


# The source does not check, or cannot be lowered under the requested config: the message holds
# the rendered diagnostics or names the offending field (`linnet.errors`; a config value of the
# wrong kind is its subclass `ConfigError`).
ProgramError = SourceError


@dataclass
class SourceInfo:
    """A checked source and what loading needs from it."""

    path: str
    text: str
    analysis: Analysis
    config_type: str
    preset: str | None
    notes: list[str] = field(default_factory=list)
    label: str | None = None  # the preset and the overrides bound into it, for headers


def read_source(source: str | Path) -> tuple[str, str]:
    """(path, text) of a source given as a path or as text: a `Path`, or a one-line string that
    names a file that exists or ends in `.linnet`, is a path (so `model.txt` is read, and a
    misspelt `model.linet` is not parsed as source text). A file is UTF-8, a leading byte-order
    mark dropped (as `linnet check` reads it). Raises OSError when a path cannot be read (a missing
    file; a folder, as IsADirectoryError "PATH is a folder: give a .linnet file") and SourceError
    for a file that is not UTF-8, naming the byte and its line and column."""
    text = str(source)
    if isinstance(source, Path) or ("\n" not in text and (text.endswith(".linnet") or _names_a_path(text))):
        p = Path(source)
        if p.is_dir():
            raise IsADirectoryError(f"{p} is a folder: give a .linnet file")
        try:
            return str(p), read_source_text(p)
        except NotUtf8 as e:
            raise SourceError(f"{p}: {e}") from None
    return "<source>", text


def _names_a_path(text: str) -> bool:
    """A one-line string that is a path rather than source text: it exists, or looks like a file
    name (no spaces, a suffix or a folder separator) without any of the language's brackets."""
    if Path(text).exists():
        return True
    return " " not in text and not set("{}()[]=") & set(text) and ("/" in text or "." in text)


def check_source(path: str, text: str, preset: str | None = None) -> SourceInfo:
    """Check a source and find its root model and config type. Raises ProgramError."""
    analysis = analyze_source(path, text, preset)
    _raise_errors(analysis, f"{path} has errors:")
    return _source_info(path, text, analysis, preset)


def _raise_errors(analysis: Analysis, header: str, relocate=None, extra_texts: dict[str, str] | None = None) -> None:
    """Raise ProgramError with the analysis's errors rendered, if it has any; `relocate` maps each
    Diagnostic first (onto the config.json a bound value came from), `extra_texts` are the
    texts of the files it points into besides the analysed ones."""
    errors = [d for d in analysis.diagnostics if d.severity == "error"]
    if not errors:
        return
    if relocate is not None:
        errors = [relocate(d) for d in errors]
    texts = {**_source_texts(analysis), **(extra_texts or {})}
    rendered = "\n\n".join(render_text(d, texts.get) for d in errors)
    raise ProgramError(f"{header}\n{rendered}", diagnostics=errors)


def _source_texts(analysis: Analysis) -> dict[str, str]:
    """path -> text of every file an analysis read: the document, the standard library, imports."""
    texts = {analysis.document.source.path: analysis.document.source.text}
    for std_path in analysis.document.std.paths() if analysis.document.std else []:
        texts[std_path] = Path(std_path).read_text(encoding="utf-8")
    for doc in analysis.namespaces.files if analysis.namespaces is not None else []:
        texts.setdefault(doc.source.path, doc.text)  # files it imports
    return texts


def _source_info(path: str, text: str, analysis: Analysis, preset: str | None) -> SourceInfo:
    if analysis.model is None:
        raise ProgramError(f"{path} declares no root `model` to load")
    mdef: A.ModuleDef = analysis.model.ast
    config_types = [p.type.name.id for p in mdef.params if isinstance(p.type, A.NamedType)]
    if len(config_types) != 1:
        raise ProgramError(f"{path}: model `{mdef.name.id}` takes one config, got {len(config_types)}")
    if preset is not None and preset not in analysis.declared_presets:
        known = ", ".join(analysis.declared_presets) or "none"
        raise UnknownPreset(f"{path} has no preset `{preset}` (presets: {known})")
    return SourceInfo(path, text, analysis, config_types[0], preset)


def preset_weights(info: SourceInfo, preset: str | None) -> str | None:
    """The `@weights("...")` default of a preset, if any."""
    found = preset_weights_at(info.analysis, preset)
    return found[0] if found is not None else None


def preset_config(info: SourceInfo, preset: str | None) -> dict[str, Any]:
    """The config values of `preset` (None: the config defaults) as Python values, every field
    evaluated (nested configs as dicts). Raises ProgramError for a preset that did not evaluate."""
    scenario = next((s for s in info.analysis.scenarios if s.name == (preset or "defaults")), None)
    if scenario is None:
        raise ProgramError(f"{info.path}: preset `{preset or 'defaults'}` did not evaluate")
    return _plain(scenario.configs[info.config_type])


def bind_config(info: SourceInfo, *overrides: dict[str, Any] | ConfigLayer, labels: tuple[str, ...] = ()) -> SourceInfo:
    """Check the source again under its preset overridden by `overrides` (later wins; each a
    `ConfigLayer`, or a dict of field name -> Python value labelled by `labels`, a "--config" label
    making it command-line values).

    Every key must be a field of the source's config (nested dicts: of the field's config type),
    and is then checked against the field's type (a one-value type such as `hidden_act: "silu"`
    refuses any other value); a checkpoint's keys may also be bookkeeping (METADATA_KEYS) or
    declared inert by the config's `@inert(...)`, and are skipped. Raises ConfigError (L503 for an
    undeclared key, L401 for a value of the wrong kind, L505 for a number outside `VALUE_RANGES`)
    and ProgramError when the merged config does not check; each points at the key in its
    config.json (or the `--config` values) and at the field's declaration in the source."""
    layers = []
    for i, o in enumerate(overrides):
        name = labels[i] if i < len(labels) else "overrides"
        layers.append(o if isinstance(o, ConfigLayer) else ConfigLayer(o, name, checkpoint=name != "--config"))
    if not any(layer.values for layer in layers):
        return info
    binder = _Binder(info)
    if info.preset is not None:
        item = next(i for i in info.analysis.document.items if i.kind == "preset" and i.name == info.preset)
        for f in item.ast.value.fields:
            if isinstance(f, A.FieldInit):
                value = item.text[f.value.span.start : f.value.span.end]
                binder.inits[f.name.id] = (value, [], item.resolve(f.span), binder.declaration(f.name.id))
    for layer in layers:
        binder.bind(layer)
        binder.refuse_flattened(layer)
    if binder.refused:
        texts = {**_source_texts(info.analysis), **dict(layer.where() for layer in layers)}
        raise ConfigError("\n\n".join(render_text(d, texts.get) for d in binder.refused), diagnostics=binder.refused)
    prefix = info.text.rstrip("\n") + f"\n\npreset {BOUND_PRESET} = {info.config_type} {{\n"
    body, marks = [], []
    offset = len(prefix)
    for key, (value, sub_marks, where, decl) in binder.inits.items():
        line = f"    {key} = {value},\n"
        start = offset + 4 + len(key) + 3
        marks.append((offset, offset + len(line), where, decl))
        marks += [(start + a, start + b, w, d) for a, b, w, d in sub_marks]
        body.append(line)
        offset += len(line)
    text = prefix + "".join(body) + "}\n"
    label = f"{info.preset or 'defaults'} + {' + '.join(layer.label for layer in layers if layer.values)}"
    analysis = analyze_source(info.path, text, BOUND_PRESET)
    _raise_errors(
        analysis,
        f"{info.path} does not check under the loaded config ({label}):",
        relocate=lambda d: _relocated(d, info.path, len(info.text.rstrip("\n")), marks, label),
        extra_texts=dict(layer.where() for layer in layers),
    )
    bound = _source_info(info.path, text, analysis, BOUND_PRESET)
    bound.label = label
    return bound


class _Binder:
    """Turns config layers into Linnet source for the bound preset: `inits[key]` = (value text,
    marks inside it, where the value came from, the field's declaration); `refused` collects
    diagnostics for undeclared keys and values of the wrong kind."""

    def __init__(self, info: SourceInfo):
        self.info = info
        self.globals = info.analysis.globals
        self.inits: dict[str, tuple[str, list, Location, Location | None]] = {}
        self.refused: list[Diagnostic] = []

    def declaration(self, key: str) -> Location | None:
        """Where field `key` of the source's config is declared."""
        item = self.globals(self.info.config_type)
        fdef = next((f for f in item.ast.fields if isinstance(f, A.ConfigField) and f.name.id == key), None)
        return item.resolve(fdef.span) if fdef is not None else None

    def bind(self, layer: ConfigLayer) -> None:
        item = self.globals(self.info.config_type)
        for key, value in layer.values.items():
            found = self._value(layer, item, (key,), value)
            if found is not None:
                self.inits[key] = found

    def _value(self, layer: ConfigLayer, item, keys: tuple[str, ...], value: Any):
        """(Linnet text of `value` for field `keys[-1]` of config `item`, marks, location,
        declaration), or None when the key is skipped or refused."""
        key = keys[-1]
        cdef: A.ConfigDef = item.ast
        fields = {f.name.id: f for f in cdef.fields if isinstance(f, A.ConfigField)}
        fdef = fields.get(key)
        at = _key_location(layer, keys)
        if fdef is None:
            if layer.checkpoint and ((len(keys) == 1 and key in METADATA_KEYS) or key in inert_keys(cdef)):
                return None
            self._refuse_unknown(layer, item, keys, sorted(fields), at)
            return None
        decl = item.resolve(fdef.span)
        t = fdef.type
        try:
            if isinstance(value, dict) and isinstance(t, A.NamedType) and self.globals(t.name.id, item) is not None:
                record = self.globals(t.name.id, item)
                parts, marks, length = [], [], len(t.name.id) + 3
                for k, v in value.items():
                    found = self._value(layer, record, keys + (k,), v)
                    if found is None:
                        continue
                    text, _, where, sub_decl = found
                    part = f"{k} = {text}"
                    marks.append((length, length + len(part), where, sub_decl))
                    parts.append(part)
                    length += len(part) + 2
                return f"{t.name.id} {{ {', '.join(parts)} }}", marks, at, decl
            text = _literal(t, value)
            self._check_range(keys, value, cdef, at, decl)
            return text, [], at, decl
        except ValueError as err:
            self.refused.append(
                _diagnostic(
                    "L401",
                    f"`{'.'.join(keys)}` {err} in `{cdef.name.id}`, got {json.dumps(value, default=str)}",
                    at,
                    [LocatedLabel(decl, "declared here")],
                )
            )
            return None

    def _check_range(self, keys: tuple[str, ...], value: Any, cdef: A.ConfigDef, at: Location, decl) -> None:
        """Refuse (L505) a number outside `VALUE_RANGES[key]`, naming the key and where it is written."""
        rule = VALUE_RANGES.get(keys[-1])
        if rule is None or isinstance(value, bool) or not isinstance(value, (int, float)):
            return
        low, inclusive = rule
        if value > low or (inclusive and value == low):
            return
        bound = f">= {low}" if inclusive else f"> {low}"
        self.refused.append(
            _diagnostic(
                "L505",
                f"`{'.'.join(keys)}` must be {bound}, got {json.dumps(value)} (in `{cdef.name.id}`): the model would "
                "compute NaN or meaningless values",
                at,
                [LocatedLabel(decl, "declared here")],
            )
        )

    def refuse_flattened(self, layer: ConfigLayer) -> None:
        """L507 for each field of the source's config named as a key the layer's file held but loading reads under
        other names (`layer.flattened`): the field would keep its default whatever the file says."""
        item = self.globals(self.info.config_type)
        for f in item.ast.fields:
            if isinstance(f, A.ConfigField) and f.name.id in layer.flattened:
                name = item.ast.name.id
                self.refused.append(
                    _diagnostic(
                        "L507",
                        f"`{f.name.id}` in {layer.label} is read as `rope_theta` and `rope_scaling`, so the field "
                        f"`{name}.{f.name.id}` would keep its default",
                        _key_location(layer, (f.name.id,)),
                        [LocatedLabel(item.resolve(f.span), "the source declares the field here")],
                        [
                            "loading spreads transformers 5's `rope_parameters` over transformers 4's keys; declare "
                            "`rope_theta: float` and `rope_scaling: RopeScaling?` (linnet/std/rope.linnet) instead"
                        ],
                    )
                )

    def _refuse_unknown(self, layer: ConfigLayer, item, keys: tuple[str, ...], fields: list[str], at: Location) -> None:
        name = item.ast.name.id
        dotted = ".".join(keys)
        hint = closest(keys[-1], fields)
        notes = [f"did you mean `{hint}`?"] if hint else []
        if layer.checkpoint:
            notes.append(
                "Linnet refuses keys whose effect it cannot tell: ignoring one that changes the computation would "
                f"be silently wrong; if `{keys[-1]}` does not, add it to `@inert(...)` on `config {name}`"
            )
            what = f"nor a key `{name}` declares inert"
        else:
            what = "so it cannot be set"
        self.refused.append(
            _diagnostic(
                "L503",
                f"`{dotted}` in {layer.label} is not a field of `{name}`, {what}",
                at,
                [LocatedLabel(item.resolve(item.ast.name.span), f"`config {name}` is declared here")],
                notes,
            )
        )


def _literal(t: A.Type, value: Any) -> str:
    """`value` as Linnet source for a field of type `t`. Raises ValueError("is a bool") when it is
    of the wrong kind; a value outside a literal type is written as it is, for the checker to
    report on the field."""
    if value is None:
        return "none"
    if isinstance(t, A.ListType):  # longrope's `short_factor`, `layer_types`
        if not isinstance(value, list):
            raise ValueError("is a list")
        return "[" + ", ".join(_literal(t.item, v) for v in value) + "]"
    if isinstance(t, A.LiteralType) and t.kind == "bool":
        t = A.NamedType(t.span, A.Name(t.span, "bool"))
    if isinstance(t, A.LiteralType) or (isinstance(t, A.NamedType) and t.name.id == "str"):
        if not isinstance(value, str):
            raise ValueError("is a str")
        return json.dumps(value)
    name = t.name.id if isinstance(t, A.NamedType) else None
    if name == "bool":
        if not isinstance(value, bool) and value not in (0, 1):  # `--config tied=no` is not true
            raise ValueError("is a bool")
        return "true" if value else "false"
    if name == "int":
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError("is an int")
        return str(value)
    if name == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError("is a float")
        return repr(float(value))
    raise ValueError(f"is a `{name}` record" if name else "cannot take this value")


def _key_location(layer: ConfigLayer, keys: tuple[str, ...]) -> Location:
    """Where key path `keys` is written in the layer's file: the quoted key of each level in turn
    (`"rope_scaling"`, then `"factor"` after it), or the key of a `--config key=value` line; the
    file's start if it is not found."""
    path, text = layer.where()
    start, span = 0, (0, 0)
    for key in keys:
        if layer.path is None and not layer.checkpoint:  # `--config key=value` lines
            m = re.compile(r"^--config (%s)=" % re.escape(key), re.M).search(text, start)
        else:
            m = re.compile(r'("%s")\s*:' % re.escape(key)).search(text, start)
        if m is None:
            break
        span, start = m.span(1), m.end()
    index = LineIndex(text)
    return Location(path, index.position(span[0]), index.position(span[1]))


def _diagnostic(code: str, message: str, at: Location, labels=(), notes=()) -> Diagnostic:
    return Diagnostic(code, "error", message, at, labels=tuple(labels), notes=tuple(notes))


def _relocated(d: Diagnostic, path: str, source_end: int, marks, label: str) -> Diagnostic:
    """`d` with every place inside the bound preset (offsets past `source_end` of `path`) moved to
    where its value came from: the key in config.json or `--config`, or the preset's field; the
    primary place also gets a label on the field's declaration, and "preset `linnet_loaded`" in
    the notes reads as the loaded config."""

    def origin(loc: Location):
        """(where the value came from, the field's declaration) of a place in the bound preset."""
        if loc.path != path or loc.start.offset < source_end:
            return None
        inside = [m for m in marks if m[0] <= loc.start.offset < m[1]]
        return min(inside, key=lambda m: m[1] - m[0])[2:] if inside else None

    labels = []
    for lab in d.labels:
        moved = origin(lab.location)
        labels.append(LocatedLabel(moved[0], lab.message) if moved is not None else lab)
    notes = tuple(n.replace(f"preset `{BOUND_PRESET}`", f"the loaded config ({label})") for n in d.notes)
    moved = origin(d.location)
    if moved is None:
        return replace(d, labels=tuple(labels), notes=notes)
    location, decl = moved
    if decl is not None:
        labels.append(LocatedLabel(decl, "the source declares the field here"))
    return replace(d, location=location, labels=tuple(labels), notes=notes)


def lower_program(
    info: SourceInfo,
    dtype: str = "f32",
    max_batch: int = 1,
    max_positions: int = 768,
    entries: list[str] | None = None,
    optimize_ir: bool = True,
) -> Program:
    """Lower the root model of a checked source under its preset (or the config defaults).

    Returns a verified `Program` with one graph per entry (all entries unless `entries`) and
    the functions they call; with `optimize_ir`, layers are inlined where they are used
    (`inline.layer_calls`) and the graphs folded, merged and pruned.
    Raises ProgramError (unknown entry or dtype, a lowering failure)."""
    if dtype not in ("f32", "f16", "bf16", "f64"):
        raise ProgramError(f"dtype must be f32, f16 or bf16, got {dtype!r}")
    if max_batch < 1 or max_positions < 1:
        raise ProgramError("max_batch and max_positions are at least 1")
    analysis = info.analysis
    scenario_name = info.preset or "defaults"
    scenario = next((s for s in analysis.scenarios if s.name == scenario_name), None)
    if scenario is None:
        raise ProgramError(f"{info.path}: preset `{scenario_name}` did not evaluate")
    lowering = Lowering(analysis, analysis.model, scenario.configs, DTYPES[dtype], max_batch, max_positions)
    try:
        root = lowering.root()
        lowering.collect_tensors(root)
        program = Program(
            info.path,
            analysis.model.name,
            info.label or info.preset,
            DTYPES[dtype],
            max_batch,
            max_positions,
            params=list(lowering.params.values()),
            state=list(lowering.state.values()),
            config=_plain(scenario.configs[info.config_type]),
            modules=lowering.modules,
            root=lowering.module_class(root),
        )
        program.takes_part, program.part_prefix = takes_part(analysis.model.ast)
        fns = {f.name.id: f for f in A.flat_members(analysis.model.ast.members) if isinstance(f, A.FnDef) and f.entry}
        for name in entries or list(fns):
            if name not in fns:
                raise ProgramError(f"{info.path}: no entry `{name}` (entries: {', '.join(fns)})")
            program.entries[name] = lowering.lower_entry(root, fns[name])
        program.functions = lowering.functions
        if optimize_ir:
            # layers (`Linear`, `RMSNorm`...) read where they are used; then fold, merge, prune
            program = inline_calls(program, layer_calls(program))
            optimize_program(program)
        verify_program(program)
    except (LoweringError, RecursionError) as err:
        raise ProgramError(str(err)) from err
    except VerifyError as err:
        if err.stale_state is None:
            raise
        where = err.op.origin if err.op is not None and err.op.origin else info.path
        raise ProgramError(
            f"{where}: state `{err.stale_state}` is used here after it was written (by a cache_write, or by "
            "a call or loop that writes it): backends update state in place, so the value read before the "
            "write is gone; read the state again after the write"
        ) from err
    return program


def lower_analysis(analysis: Analysis, preset: str | None, **options) -> Program:
    """Lower the root model of an analysis the caller already holds (the language server's) under
    `preset` (None: the config defaults); `options` are `lower_program`'s. Raises ProgramError
    when it has errors, no root model, or does not lower."""
    source = analysis.document.source
    _raise_errors(analysis, f"{source.path} has errors:")
    return lower_program(_source_info(source.path, source.text, analysis, preset), **options)


def _plain(cv) -> dict[str, Any]:
    from ..semantics.configs import MISSING, ConfigValue

    out = {}
    for k, v in cv.values.items():
        if isinstance(v, ConfigValue):
            out[k] = _plain(v)
        elif v is not MISSING:
            out[k] = v
    return out


def build(
    source: str | Path,
    preset: str | None = None,
    config: dict[str, Any] | None = None,
    dtype: str = "f32",
    max_batch: int = 1,
    max_positions: int = 768,
    entries: list[str] | None = None,
) -> Program:
    """Check, configure and lower a source in one call (`linnet ir`, code emitters)."""
    path, text = read_source(source)
    info = check_source(path, text, preset)
    info = bind_config(info, config or {}, labels=("--config",))
    return lower_program(info, dtype, max_batch, max_positions, entries)
