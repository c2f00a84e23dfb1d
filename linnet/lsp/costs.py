"""What a preset costs, for hover and inlay hints: `linnet.ir.cost` over the Core IR of the
document's root model, lowered once per analysis and preset and cached while that analysis is
current (an edit makes a new analysis; the old entries go with it).

Hover on the name of the root model or a preset where it is declared shows the summary table
(`linnet check --summary`); of a module, its parameters per instance and in the whole model; of
a submodule member (or a list of them), the parameters it holds per instance of its module.
Nothing is shown for a document with errors; where the model checks but does not lower under the preset (a
size only lowering finds wrong: a window larger than its input), the hover says why. The first such hover after an
edit lowers the model (tens of milliseconds); later ones read the cache; hovers elsewhere never lower it."""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from pathlib import Path

from linnet.errors import LinnetError
from linnet.ir.build import lower_analysis
from linnet.ir.core import Program
from linnet.ir.cost import ProgramCost, module_instances, module_param_counts, program_cost
from linnet.ir.verify import VerifyError
from linnet.semantics.diagnostics import SymbolAnchor
from linnet.semantics.program import Analysis
from linnet.summary import format_count, sizes_text, table_lines


@dataclass
class Costs:
    """A preset's program, its cost, parameters per instance of each module class, and how many
    instances the model holds."""

    program: Program
    cost: ProgramCost
    per_instance: dict[str, int]
    instances: dict[str, int]


@dataclass
class NotLowered:
    """Why a model that checks has no costs under a preset: the first line of what lowering it raised."""

    reason: str


_CACHE: "weakref.WeakKeyDictionary[Analysis, dict[str | None, Costs | NotLowered | None]]" = weakref.WeakKeyDictionary()


def costs_of(analysis: Analysis, preset: str | None) -> Costs | None:
    """The costs of the root model under `preset` (None: the config defaults), computed once per
    analysis and preset; None for a document without a root model, with errors, or that does not
    lower (`not_lowered` says why)."""
    found = _computed(analysis, preset)
    return found if isinstance(found, Costs) else None


def not_lowered(analysis: Analysis, preset: str | None) -> str | None:
    """Why the root model, which checks, does not lower under `preset`; None when it does (or has errors, or there
    is no root model: nothing to explain)."""
    found = _computed(analysis, preset)
    return found.reason if isinstance(found, NotLowered) else None


def _computed(analysis: Analysis, preset: str | None) -> Costs | NotLowered | None:
    cached = _CACHE.setdefault(analysis, {})
    if preset not in cached:
        cached[preset] = _compute(analysis, preset)
    return cached[preset]


def _compute(analysis: Analysis, preset: str | None) -> Costs | NotLowered | None:
    if analysis.model is None or any(d.severity == "error" for d in analysis.diagnostics):
        return None
    # What lowering and costing raise for a source that checks: a LinnetError (a size only lowering finds wrong, a
    # list index out of range for one layer...; ValueError: the cost model's sizes), or a VerifyError (the Core IR
    # it made breaks an invariant: a bug). Anything else is a bug the request's guard logs.
    try:
        program = lower_analysis(analysis, preset)
        return Costs(program, program_cost(program), module_param_counts(program), module_instances(program))
    except (LinnetError, ValueError) as err:
        return NotLowered(_first_line(err))
    except VerifyError as err:
        return NotLowered(f"the Core IR it lowers to is not valid ({err}): a bug in Linnet; please report it")


def _first_line(err: Exception) -> str:
    lines = [line for line in str(err).splitlines() if line.strip()]
    return lines[0] if lines else type(err).__name__


def preset_to_show(analysis: Analysis, preset: str | None) -> str | None:
    """The selected preset, else the file's first, else None (the config defaults)."""
    return preset or (analysis.presets[0] if analysis.presets else None)


def cost_section(analysis: Analysis, target, preset: str | None) -> str | None:
    """Hover markdown about what `target` costs: the summary for the root model or a preset, the
    parameters of a module or a member; None when there is nothing to say."""
    if not isinstance(target, SymbolAnchor):
        return None
    name = target.path[0]
    if len(target.path) == 1 and name in analysis.declared_presets:
        preset = name
    else:
        preset = preset_to_show(analysis, preset)
    costs = costs_of(analysis, preset)
    under = f"under preset `{preset}`" if preset else "under the config defaults"
    if costs is None:
        reason = not_lowered(analysis, preset)
        is_model = analysis.model is not None and name == analysis.model.name
        if reason is None or not (len(target.path) == 1 and (is_model or name in analysis.declared_presets)):
            return None
        return f"**Cost** {under}: not known: the model does not lower: {reason}"
    if len(target.path) == 1 and (name == costs.program.model or name in analysis.declared_presets):
        lines = "\n".join(table_lines(costs.cost))
        return f"**Cost** {under} ({sizes_text(costs.cost)}):\n\n```text\n{lines}\n```"
    classes = module_classes(costs.program, name, target.file)
    if not classes:
        return None
    if len(target.path) == 1:
        per = {costs.per_instance[key] for key in classes}
        total = sum(costs.per_instance[key] * costs.instances.get(key, 0) for key in classes)
        n = sum(costs.instances.get(key, 0) for key in classes)
        each = format_count(per.pop()) if len(per) == 1 else "varies"
        return f"parameters {under}: {each} per instance, {n} in the model: {format_count(total)} ({total:,})"
    if len(target.path) == 3 and target.path[1] == "member":
        held = {member_params(costs, key, target.path[2]) for key in classes} - {None}
        if len(held) != 1:
            return None
        count = held.pop()
        return f"parameters {under}: {format_count(count)} ({count:,}) per `{name}`"
    return None


def member_params(costs: Costs, key: str, member: str, per_item: bool = False):
    """Parameters submodule member `member` holds in one instance of module class `key`, a list of
    layers all of them; with `per_item`, (parameters of one, how many) instead. None for a member
    that is not a submodule (a tensor's hover lists its checkpoint names and elements)."""
    module = costs.program.modules[key]
    if member not in module.children:
        return None
    child, n = module.children[member]
    if per_item:
        return costs.per_instance[child], n or 1
    return costs.per_instance[child] * (n or 1)


def module_classes(program: Program, name: str, path: str = "") -> list[str]:
    """The module classes (`Program.modules` keys) of module `name` defined in the file at `path`
    (any file if empty): one per set of arguments it is built with."""
    file = Path(path).name if path else None
    return [
        key
        for key, m in program.modules.items()
        if m.name == name and (file is None or m.origin.rsplit(":", 1)[0] == file)
    ]
