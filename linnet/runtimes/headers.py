"""Checkpoint headers against a source: what loading would report, without reading tensor data.

    report = check_weights("examples/llama.linnet", text, "smollm2-135m-instruct", preset="smollm2_135m")
    report.diagnostics   # Diagnostic values on the member or config field each concerns
    report.files         # the files read (config.json, safetensors, .gguf): what an editor watches

The same code as loading (`loading.bind_checkpoint_config`, `loading.weight_problems`), on a `CheckpointHeaders`:
the names, shapes, dtypes and config of a checkpoint read from its headers alone (safetensors' JSON headers and
index, config.json, GGUF metadata and tensor table), cached by each file's (path, mtime, size). `linnet check
--weights` and the language server (`linnet/lsp/weights.py`) both call `check_weights`.

Reported, as loading would: a parameter missing from the checkpoint, a tensor no parameter takes (unless the model
is `@takes_part`), a shape (L501), an integer tensor where a parameter is (L504), a config.json key the source
does not declare (L503), a value out of range (L505) or of the wrong kind (L401), and what the checker finds under
the loaded config; plus L506 for weights that cannot be opened. One thing loading checks needs tensor data: a
stored `lm_head.weight` under `tie_word_embeddings` is compared with the embeddings only by loading (a note says so).

Reading needs numpy (the GGUF reader's metadata arrays), never torch, jax nor onnxruntime. The one piece of tensor
data read is a GGUF's `rope_freqs.weight` (head_dim / 2 floats), which holds Llama 3's rope scaling: opening a
GGUF reads it, as loading does.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from linnet.errors import CheckpointError, SourceError
from linnet.ir.build import SourceInfo, check_source, lower_program
from linnet.runtimes.formats.checkpoints import Checkpoint, open_checkpoint
from linnet.runtimes.formats.embedded import EMBEDDED, EmbeddedError, resolve_embedded
from linnet.runtimes.loading import WeightProblem, bind_checkpoint_config, dequantizing_view, weight_problems
from linnet.semantics.diagnostics import Diagnostic, LocatedLabel
from linnet.semantics.member_paths import member_location
from linnet.syntax import ast as A
from linnet.syntax.items import Location

__all__ = [
    "CheckpointHeaders",
    "WeightsReport",
    "read_headers",
    "check_weights",
]


@dataclass(eq=False)
class CheckpointHeaders(Checkpoint):
    """What a checkpoint's headers say: names, shapes, stored dtypes, the (normalised) config. Holds no open file.

    Fields (besides `Checkpoint`'s): `files`, the files read, each with (mtime_ns, size) when read."""

    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict, repr=False)
    dtypes: dict[str, str] = field(default_factory=dict, repr=False)
    files: dict[Path, tuple[int, int]] = field(default_factory=dict, repr=False)

    def shape(self, name: str) -> tuple[int, ...]:
        if name not in self.shapes:
            raise self._unknown(name)
        return self.shapes[name]

    def dtype(self, name: str) -> str:
        if name not in self.dtypes:
            raise self._unknown(name)
        return self.dtypes[name]

    def load(self, name: str, dtype: Any = None):
        raise CheckpointError(f"{self.source}: only the headers were read; open the checkpoint to load `{name}`")

    def tokenizer(self):
        return None


def _checkpoint_files(path: Path) -> list[Path]:
    """The files whose change changes what `open_checkpoint(path)` reads: a .gguf file itself; a folder's
    config.json, index and *.safetensors."""
    if path.is_dir():
        names = ("config.json", "model.safetensors.index.json")
        return [path / n for n in names if (path / n).is_file()] + sorted(path.glob("*.safetensors"))
    if path.name == "config.json":
        return _checkpoint_files(path.parent)
    return [path]


def _signature(files: list[Path]) -> tuple:
    out = []
    for f in files:
        try:
            st = f.stat()
        except OSError:
            out.append((str(f), None, None))
            continue
        out.append((str(f), st.st_mtime_ns, st.st_size))
    return tuple(out)


def _local_path(spec: str) -> Path:
    """The folder or file an embedded id or a path names (an embedded id is resolved without importing its
    package). Raises CheckpointError."""
    if spec in EMBEDDED:
        try:
            return resolve_embedded(spec)[0]
        except EmbeddedError as e:
            raise CheckpointError(f"embedded checkpoint {spec!r}: {e}") from None
    return Path(spec).expanduser()


_CACHE: OrderedDict[tuple, CheckpointHeaders] = OrderedDict()
_CACHE_SIZE = 8
_CACHE_LOCK = threading.Lock()


def read_headers(spec: str | os.PathLike[str]) -> CheckpointHeaders:
    """The headers of a checkpoint (a Hugging Face folder, a .gguf file or an embedded id, as `open_checkpoint`
    takes), read once per version of its files: cached by each file's (path, mtime, size), the last 8 kept.
    Raises CheckpointError as `open_checkpoint` does."""
    source = os.fspath(spec)
    path = _local_path(source)
    key = (source, _signature(_checkpoint_files(path)) if path.exists() else ())
    with _CACHE_LOCK:
        if key in _CACHE:
            _CACHE.move_to_end(key)
            return _CACHE[key]
    with open_checkpoint(source) as ckpt:
        names = list(ckpt.tensor_names)
        headers = CheckpointHeaders(
            source=ckpt.source,
            format=ckpt.format,
            config=ckpt.config,
            tensor_names=names,
            buffer_names=set(ckpt.buffer_names),
            path=ckpt.path,
            flattened=ckpt.flattened,
            shapes={n: tuple(ckpt.shape(n)) for n in names},
            dtypes={n: ckpt.dtype(n) for n in names},
            files={Path(f): (mtime, size) for f, mtime, size in key[1]},
        )
    with _CACHE_LOCK:
        _CACHE[key] = headers
        while len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    return headers


@dataclass
class WeightsReport:
    """What `check_weights` found: diagnostics located in the source (config problems also point into
    config.json), remarks loading would print (`notes`), and the files read (`files`, for watchers)."""

    diagnostics: list[Diagnostic] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)


def check_weights(
    path: str,
    text: str,
    weights: str,
    preset: str | None = None,
    config: dict[str, Any] | None = None,
    weights_at: Location | None = None,
) -> WeightsReport:
    """Check a source's parameters and config against a checkpoint's headers, as loading would (`prepare`:
    the config defaults < `preset` < the checkpoint's config < `config`), reading no tensor data.

    Args:
        path, text: the `.linnet` source (its errors are the checker's to report: none here when it has any).
        weights: a Hugging Face folder, a .gguf file or an embedded id (a relative path is taken as given).
        preset: the preset the weights are for (None: the config defaults, as `--weights` without `--preset`).
        config: `--config` values laid over the checkpoint's.
        weights_at: where the weights are named in the source (a `@weights(...)` argument), for L506.
    Returns a WeightsReport; every diagnostic names the checkpoint and the tensor or key, and carries
    `presets=(preset,)` when a preset was given.
    """
    report = WeightsReport()
    try:
        info = check_source(path, text, preset)
    except SourceError:
        return report  # the checker reports the source's own errors
    presets = (preset,) if preset is not None else None
    anchor = weights_at or _preset_location(info, preset) or _model_location(info)
    try:
        ckpt = read_headers(weights)
    except CheckpointError as err:
        report.diagnostics.append(Diagnostic("L506", "error", err.message, anchor, presets=presets))
        return report
    report.files = list(ckpt.files)
    under = f"checked against {weights}" + (f" under preset `{preset}`" if preset else "")
    try:
        bound = bind_checkpoint_config(info, ckpt, weights, config)
        report.notes += bound.notes
        program = lower_program(bound)
    except SourceError as err:
        for d in err.diagnostics or ():
            report.diagnostics.append(_into_source(d, info, anchor, presets, under))
        if not err.diagnostics:
            report.diagnostics.append(Diagnostic("L506", "error", err.message, anchor, presets=presets))
        return report
    try:
        view = dequantizing_view(program, ckpt)
    except CheckpointError as err:
        report.diagnostics.append(Diagnostic("L501", "error", err.message, _model_location(info), presets=presets))
        return report
    _plan, problems = weight_problems(program, view, report.notes, read_data=False)
    for p in problems:
        report.diagnostics.append(
            Diagnostic(p.code, "error", p.message, _problem_location(info, p), notes=(under,), presets=presets)
        )
    return report


def _problem_location(info: SourceInfo, p: WeightProblem) -> Location:
    """The member of the source a weight problem concerns: the deepest member along its parameter path (or,
    for a tensor no parameter takes, along the tensor's name) declared in the source file itself; else the
    root model's name."""
    found = _member_along(info, p.param or p.tensor or "")
    return found or _model_location(info)


def _member_along(info: SourceInfo, dotted: str) -> Location | None:
    return member_location(info.analysis, info.path, dotted)


def _model_location(info: SourceInfo) -> Location:
    model = info.analysis.model
    return model.resolve(model.ast.name.span)


def _preset_location(info: SourceInfo, preset: str | None) -> Location | None:
    for item in info.analysis.document.items:
        if item.kind == "preset" and item.name == preset and isinstance(item.ast, A.PresetDef):
            return item.resolve(item.ast.name.span)
    return None


def _preset_field(info: SourceInfo, preset: str | None, key: str) -> Location | None:
    """Where `preset` sets field `key`, if it does."""
    for item in info.analysis.document.items:
        if item.kind == "preset" and item.name == preset and isinstance(item.ast, A.PresetDef):
            for f in item.ast.value.fields:
                if isinstance(f, A.FieldInit) and f.name.id == key:
                    return item.resolve(f.span)
    return None


def _into_source(d: Diagnostic, info: SourceInfo, anchor: Location, presets, under: str) -> Diagnostic:
    """A config diagnostic (located at the key in config.json, or on the checkpoint's values written as JSON)
    moved onto the source: the preset's field when the preset sets it, else the field's declaration, else
    `anchor`; config.json's key becomes a related location (when it is a file), and the message names the
    file when it does not already."""
    source_len = len(info.text)
    in_source = d.location.path == info.path and d.location.end.offset <= source_len
    if in_source:
        return replace(d, notes=(*d.notes, under), presets=presets)
    labels = [lab for lab in d.labels if not (lab.location.path == info.path and lab.location.end.offset > source_len)]
    decl = next((lab.location for lab in labels if lab.location.path == info.path), None)
    key = _key_at(d.location)
    primary = (_preset_field(info, info.preset, key) if key else None) or decl or anchor
    related = [lab for lab in labels if lab.location != primary]
    if Path(d.location.path).is_file():
        related.insert(0, LocatedLabel(d.location, f"`{key}` is set here" if key else "set here"))
    message = d.message if d.location.path in d.message else f"{d.message} (in {d.location.path})"
    return replace(
        d, message=message, location=primary, labels=tuple(related), notes=(*d.notes, under), presets=presets
    )


def _key_at(loc: Location) -> str | None:
    """The JSON key `"name"` written at `loc` (config.json's quoted key, as `_key_location` finds it)."""
    try:
        text = Path(loc.path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    found = text[loc.start.offset : loc.end.offset]
    return found[1:-1] if len(found) >= 2 and found[0] == found[-1] == '"' else None
