"""Imported modules checked under the importer's configs.

A module imported from another file (`from "llama.linnet" import LlamaDecoderLayer`) is checked in its own file
under that file's presets; the importer builds it with its own config values (a `Mistral` preset given to a
module declared over `Llama`, `sharing.py`). Lowering checks the module under those values
(`Analysis.resolved`) and refused what `linnet check` had not seen: 0 attention heads make the `rearrange` in
`LlamaAttention` split `(h d)` with h = 0. So the importer's check does the same, once per imported module and
config value that its own checks build (through the submodules the imported module builds in turn), and reports
the first error at the member that builds the module, the imported line labelled.

It reads the call information of the item checks: with `--jobs`, a worker finds what the items it checked build
(`item_findings`, after its share's checks) and sends the findings back with theirs (`Analysis.remote`), since their
results stay in the worker; the parent takes them in the file's order, so one process and N print the same.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..types.core import ConfigT, NoneT
from .diagnostics import Finding, Label, LocalAnchor

if TYPE_CHECKING:
    from .program import Analysis


def imported_findings(analysis: "Analysis") -> list[Finding]:
    """The first error of each imported module checked under a config value of the analysed file's checks,
    located at the constructor call in the analysed file that builds it (directly or through the modules it
    builds), with the scenarios (presets) the building check ran under; in the file's order, an item a worker
    checked with what the worker found (`item_findings`)."""
    out: list[Finding] = []
    verdicts: dict = {}  # (item, config key) -> the first error found under it, or None
    for item in analysis.document.items:
        ia = analysis.items.get(item)
        if ia is not None:
            out.extend(item_findings(analysis, item, ia.results, verdicts))
        elif item in analysis.remote:
            out.extend(analysis.remote[item].imported or ())
    return out


def item_findings(analysis: "Analysis", item, results, verdicts: dict) -> list[Finding]:
    """`imported_findings` of one item of the analysed file, from its (scenario names, result) pairs; `verdicts`:
    each imported module's first error under each config key, shared by the calls that build it."""
    source = analysis.document.source
    out: list[Finding] = []
    for names, result in results:
        for call, info in result.call_info.items():
            found = _first_error(analysis, info, verdicts, source, set())
            if found is None:
                continue
            where = ", ".join(f"`{n}`" for n in names or ())
            out.append(
                Finding(
                    found.code,
                    f"`{info.item.name}` under this config: {found.message}",
                    LocalAnchor(item, call.span),
                    labels=[Label(found.anchor, "fails here")],
                    notes=([f"under {'presets' if len(names) > 1 else 'preset'} {where}"] if names else [])
                    + list(found.notes),
                )
            )
    return out


def _first_error(analysis: "Analysis", info, verdicts: dict, source, visiting: set) -> Finding | None:
    """The first error of the imported module a "module" call builds, checked under the call's config arguments,
    or of an imported module that module builds in turn; None for other calls."""
    if info.kind != "module" or info.item is None or info.item.is_std or info.item.source is source:
        return None
    binding = {k: a.value for k, a in info.args.items() if isinstance(a.value, (ConfigT, NoneT))}
    if not any(isinstance(v, ConfigT) for v in binding.values()):
        return None
    key = (info.item, tuple(sorted((k, v.value.key() if isinstance(v, ConfigT) else None) for k, v in binding.items())))
    if key in verdicts:
        return verdicts[key]
    if key in visiting:
        return None
    visiting.add(key)
    result, _ = analysis._check_now(info.item, binding)
    found = next((f for f in result.findings if f.severity in (None, "error")), None)
    if found is None:
        for inner in result.call_info.values():
            found = _first_error(analysis, inner, verdicts, source, visiting)
            if found is not None:
                break
    verdicts[key] = found
    return found
