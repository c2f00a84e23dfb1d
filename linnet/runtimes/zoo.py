"""The zoo index: which shipped example loads a checkpoint, and under which of its presets.

`linnet generate --weights DIR` without a source file asks `choose(DIR)`: the checkpoint's
`model_type` (config.json's, or a GGUF file's `general.architecture`, `-` read as `_`) names
the example `examples/<model_type>.linnet` (the file-name convention of the zoo: one source per
Hugging Face `model_type`). A diffusers model's config.json has no `model_type`: its `_class_name`
in snake case, without the `Model` suffix, stands in (`AutoencoderKL` -> `autoencoder_kl`,
`UNet2DConditionModel` -> `unet_2d_condition`, the names of diffusers' own modules). The preset
is the one whose config differs from the checkpoint's config in the fewest fields (the first
declared on a tie). The checkpoint's own values still win over the preset's when the model
loads; the preset supplies what config.json leaves out.

The index is the examples folder itself, read when asked, so a new `examples/<model_type>.linnet`
joins without code changes. The folder is `linnet/examples/` beside `linnet/runtimes/` in an installed wheel (pyproject
ships it as the package data of `linnet.examples`) and `examples/` beside `linnet/` in a source tree.

Needs only the front end and the checkpoint reader (no torch, jax or onnxruntime).
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from linnet.errors import LoadError
from linnet.ir.build import check_source, preset_config, read_source
from linnet.runtimes.formats.checkpoints import open_checkpoint

__all__ = ["Choice", "choose", "closest_preset", "diffusers_model_type", "examples_dir", "known_sources"]


def examples_dir() -> Path:
    """The folder of the shipped examples (see the module docstring for where it is)."""
    package = Path(__file__).resolve().parent.parent  # linnet/
    installed = package / "examples"
    return installed if installed.is_dir() else package.parent / "examples"


def known_sources(folder: Path | None = None) -> dict[str, Path]:
    """model_type -> example source, one per `<model_type>.linnet` in `folder` (default
    `examples_dir()`), sorted by model_type. Empty when the folder is missing."""
    folder = examples_dir() if folder is None else folder
    return {p.stem: p for p in sorted(folder.glob("*.linnet")) if p.is_file()}


@dataclass(frozen=True)
class Choice:
    """A source and preset picked for a checkpoint.

    `source`: the example's path. `model_type`: what the checkpoint said. `preset`: the closest
    preset (None: the source declares none). `compared`: how many of the checkpoint's config keys
    are fields of the source's config. `differences`: (field, checkpoint value, preset value) for
    each compared field whose values differ."""

    source: Path
    model_type: str
    preset: str | None
    compared: int
    differences: tuple[tuple[str, Any, Any], ...] = ()

    def describe(self, shown_source: str | None = None) -> str:
        """One line for stderr: `using examples/llama.linnet, preset tinyllama_1_1b (closest: ...)`."""
        where = shown_source or str(self.source)
        if self.preset is None:
            return f"using {where} (model_type {self.model_type!r}; it declares no preset: the config defaults)"
        if not self.differences:
            why = f"equal in all {self.compared} fields the checkpoint's config sets"
        else:
            shown = ", ".join(f"{k} {_show(mine)} (preset {_show(theirs)})" for k, mine, theirs in self.differences[:4])
            more = f" and {len(self.differences) - 4} more" if len(self.differences) > 4 else ""
            why = (
                f"{len(self.differences)} of {self.compared} fields differ: {shown}{more}; "
                "the checkpoint's values are used"
            )
        return f"using {where}, preset {self.preset} (closest: {why})"


def choose(weights: str | os.PathLike[str], folder: Path | None = None) -> Choice:
    """The example and preset for `weights` (a Hugging Face folder, a .gguf file or an embedded
    id; see `open_checkpoint`), among the sources of `known_sources(folder)`.

    Raises LoadError naming the model_type and listing the known ones when no example has it,
    or when the checkpoint's config has no `model_type`; CheckpointError (a LoadError) for a
    checkpoint that cannot be opened; SourceError when the example does not check."""
    checkpoint = open_checkpoint(weights)
    try:
        config = dict(checkpoint.config)
    finally:
        checkpoint.close()
    known = known_sources(folder)
    model_type = config.get("model_type")
    if model_type is None and isinstance(config.get("_class_name"), str):
        model_type = diffusers_model_type(config["_class_name"])
    listed = ", ".join(known) or f"none: no examples in {folder or examples_dir()}"
    if not isinstance(model_type, str) or not model_type:
        raise LoadError(
            f"{weights}: its config names no model_type (nor a diffusers `_class_name`), so no example can be "
            f"picked for it; give the source file (known model types: {listed})"
        )
    model_type = model_type.replace("-", "_")  # GGUF spells architectures with `-` (gpt-oss)
    if model_type not in known:
        raise LoadError(
            f"{weights}: no example for model_type {model_type!r} (known model types: {listed}); "
            "give a source file for it"
        )
    return closest_preset(known[model_type], config, model_type)


# The words of a diffusers class name: `UNet` and a dimension count such as `2D` are single words in diffusers'
# module names (unet_2d_condition.py), then capitalised words, acronyms (`KL`) and numbers.
_CLASS_WORDS = re.compile(r"UNet|\d+D|[A-Z][a-z]+|[A-Z]+(?![a-z])|\d+|[a-z]+")


def diffusers_model_type(class_name: str) -> str:
    """The zoo's name of a diffusers model class: its words in snake case, without a trailing `Model`
    (`AutoencoderKL` -> "autoencoder_kl", `UNet2DConditionModel` -> "unet_2d_condition")."""
    words = _CLASS_WORDS.findall(class_name)
    if len(words) > 1 and words[-1] == "Model":
        words.pop()
    return "_".join(w.lower() for w in words)


def closest_preset(source: Path, config: dict[str, Any], model_type: str = "") -> Choice:
    """The preset of `source` whose config differs from `config` (a checkpoint's config, as
    `open_checkpoint` normalises it) in the fewest fields; keys that are not fields of the
    source's config (bookkeeping, inert keys) and `null` values are not compared, nor are keys
    of a nested config that `config` leaves out. The first declared preset wins a tie.
    Raises SourceError when the source does not check."""
    info = check_source(*read_source(source))
    best: Choice | None = None
    for preset in info.analysis.declared_presets or [None]:
        values = preset_config(info, preset)
        compared = [k for k, v in config.items() if k in values and v is not None]
        differences = tuple((k, config[k], values[k]) for k in compared if not _same(config[k], values[k]))
        choice = Choice(source, model_type, preset, len(compared), differences)
        if best is None or len(choice.differences) < len(best.differences):
            best = choice
    return best


def _same(mine: Any, theirs: Any) -> bool:
    """Whether a checkpoint's value equals a preset's: floats to f32 precision (config.json
    holds f32 values widened: 9.999999747378752e-06 for 1e-5), dicts on the checkpoint's keys."""
    if isinstance(mine, dict) and isinstance(theirs, dict):
        return all(k in theirs and _same(v, theirs[k]) for k, v in mine.items() if v is not None)
    if isinstance(mine, (list, tuple)) and isinstance(theirs, (list, tuple)):
        return len(mine) == len(theirs) and all(_same(a, b) for a, b in zip(mine, theirs))
    numbers = (int, float)
    if isinstance(mine, numbers) and isinstance(theirs, numbers) and not isinstance(mine, bool):
        if isinstance(theirs, bool):
            return False
        return math.isclose(mine, theirs, rel_tol=1e-6, abs_tol=0.0)
    return mine == theirs


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
