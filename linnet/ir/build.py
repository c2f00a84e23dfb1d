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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError, SourceError
from ..semantics.program import Analysis, Document
from ..semantics.render import render_text
from ..syntax import ast as A
from ..types.core import DTYPES
from .core import Program
from .inline import inline_calls, layer_calls
from .lower import Lowering, LoweringError
from .passes import optimize_program
from .verify import VerifyError, verify_program

BOUND_PRESET = "linnet_loaded"
# Keys of a checkpoint's config.json that describe the file, not the model: ignored silently.
METADATA_KEYS = frozenset(
    {
        "architectures", "model_type", "torch_dtype", "dtype", "transformers_version", "bos_token_id",
        "eos_token_id", "pad_token_id", "sep_token_id", "unk_token_id", "decoder_start_token_id", "_name_or_path",
        "use_cache", "quantization_config", "auto_map", "task_specific_params", "id2label", "label2id",
        "output_attentions", "output_hidden_states", "return_dict", "gradient_checkpointing",
    }
)  # fmt: skip


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
    file, a folder) and SourceError for a file that is not UTF-8, naming the byte."""
    text = str(source)
    if isinstance(source, Path) or ("\n" not in text and (text.endswith(".linnet") or _names_a_path(text))):
        p = Path(source)
        try:
            return str(p), p.read_text(encoding="utf-8-sig")
        except UnicodeDecodeError as e:
            byte = e.object[e.start]
            raise SourceError(f"{p}: not UTF-8 text (byte 0x{byte:02x} at byte {e.start}): {e.reason}") from None
    return "<source>", text


def _names_a_path(text: str) -> bool:
    """A one-line string that is a path rather than source text: it exists, or looks like a file
    name (no spaces, a suffix or a folder separator) without any of the language's brackets."""
    if Path(text).exists():
        return True
    return " " not in text and not set("{}()[]=") & set(text) and ("/" in text or "." in text)


def check_source(path: str, text: str, preset: str | None = None) -> SourceInfo:
    """Check a source and find its root model and config type. Raises ProgramError."""
    analysis = Document(path, text).analyze(preset)
    errors = [d for d in analysis.diagnostics if d.severity == "error"]
    if errors:
        texts = {path: text}
        for std_path in analysis.document.std.paths() if analysis.document.std else []:
            texts[std_path] = Path(std_path).read_text(encoding="utf-8")
        for doc in analysis.namespaces.files if analysis.namespaces is not None else []:
            texts.setdefault(doc.source.path, doc.text)  # files it imports
        rendered = "\n\n".join(render_text(d, texts.get) for d in errors)
        raise ProgramError(f"{path} has errors:\n{rendered}")
    if analysis.model is None:
        raise ProgramError(f"{path} declares no root `model` to load")
    mdef: A.ModuleDef = analysis.model.ast
    config_types = [p.type.name.id for p in mdef.params if isinstance(p.type, A.NamedType)]
    if len(config_types) != 1:
        raise ProgramError(f"{path}: model `{mdef.name.id}` takes one config, got {len(config_types)}")
    if preset is not None and preset not in analysis.declared_presets:
        known = ", ".join(analysis.declared_presets) or "none"
        raise ProgramError(f"{path} has no preset `{preset}` (presets: {known})")
    return SourceInfo(path, text, analysis, config_types[0], preset)


def preset_weights(info: SourceInfo, preset: str | None) -> str | None:
    """The `@weights("...")` default of a preset, if any."""
    for item in info.analysis.document.items:
        if item.kind == "preset" and item.name == preset and isinstance(item.ast, A.PresetDef):
            for attr in item.ast.attributes:
                if attr.name.id == "weights" and attr.args and isinstance(attr.args[0].value, A.StrLit):
                    return attr.args[0].value.value
    return None


def bind_config(info: SourceInfo, *overrides: dict[str, Any], labels: tuple[str, ...] = ()) -> SourceInfo:
    """Check the source again under the preset overridden by `overrides` (later wins; each a
    dict of field name -> Python value, nested dicts for config-typed fields). Unknown keys
    are skipped with a note in the result's `notes`. Raises ProgramError when the merged
    config does not check."""
    if not any(overrides):
        return info
    globals_ = info.analysis.globals
    notes: list[str] = []
    inits: dict[str, str] = {}
    if info.preset is not None:
        item = next(i for i in info.analysis.document.items if i.kind == "preset" and i.name == info.preset)
        for f in item.ast.value.fields:
            inits[f.name.id] = item.text[f.value.span.start : f.value.span.end]
    for i, values in enumerate(overrides):
        label = labels[i] if i < len(labels) else "overrides"
        for key, value in values.items():
            if key in METADATA_KEYS and label != "--config":
                continue
            text = _literal(globals_, info.config_type, key, value, notes, label)
            if text is not None:
                inits[key] = text
    body = "".join(f"    {k} = {v},\n" for k, v in inits.items())
    text = info.text.rstrip("\n") + f"\n\npreset {BOUND_PRESET} = {info.config_type} {{\n{body}}}\n"
    bound = check_source(info.path, text, BOUND_PRESET)
    bound.notes = notes
    bound.label = f"{info.preset or 'defaults'} + {' + '.join(lab for lab, o in zip(labels, overrides) if o)}"
    return bound


def _literal(globals_, config_type: str, key: str, value: Any, notes: list[str], label: str, site=None) -> str | None:
    """`value` as Linnet source for field `key` of the config that item `site`'s file (default:
    the loaded file) calls `config_type`."""
    item = globals_(config_type, site)
    fdef = None
    for f in item.ast.fields:
        if isinstance(f, A.ConfigField) and f.name.id == key:
            fdef = f
    if fdef is None:
        notes.append(f"{label}: `{key}` is not a field of `{config_type}`; ignored")
        return None
    t = fdef.type
    if value is None:
        return "none"
    if isinstance(t, A.LiteralType) or (isinstance(t, A.NamedType) and t.name.id == "str"):
        return json.dumps(str(value))
    name = t.name.id if isinstance(t, A.NamedType) else None
    if name == "bool":
        if not isinstance(value, bool) and value not in (0, 1):  # `--config tied=no` is not true
            raise ConfigError(f"{label}: `{key}` is a bool in `{config_type}`, got {value!r}")
        return "true" if value else "false"
    if name == "int":
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{label}: `{key}` is an int in `{config_type}`, got {value!r}")
        return str(value)
    if name == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ConfigError(f"{label}: `{key}` is a float in `{config_type}`, got {value!r}")
        return repr(float(value))
    if isinstance(value, dict) and name is not None and globals_(name, item) is not None:
        parts = []
        for k, v in value.items():
            text = _literal(globals_, name, k, v, notes, f"{label} `{key}`", item)
            if text is not None:
                parts.append(f"{k} = {text}")
        return f"{name} {{ {', '.join(parts)} }}"
    raise ConfigError(f"{label}: cannot use {value!r} for `{key}` of `{config_type}`")


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
