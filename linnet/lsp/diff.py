"""The `linnet.diff` and `linnet.verify` commands: `linnet diff` (Linnet against transformers, module by module) and
`linnet verify` (the source against itself) on the root model, in a worker, shown as a diagnostic.

The worker is `linnet diff FILE --weights W --preset P --format json` (or `linnet verify FILE [--weights W] --preset
P --format json`) on a copy of the editor's text (`views.run_worker`), so the server imports no framework. The
weights are the preset's (`linnet.weights` setting, else its `@weights(...)`), as the header checks find them
(`WeightChecks.targets`). The result is kept per document until its text changes: a difference is one diagnostic
(warning, source "linnet diff" or "linnet verify") on the member declaring the first diverging module (the root
model's name when none is named), with max |Δ| and the entry; agreement clears it and says so in a message.
"""

from __future__ import annotations

from pathlib import Path

from lsprotocol import types as T

from linnet.semantics.member_paths import member_location

from .convert import lsp_range
from .views import worker_report

DIFF_COMMAND = "linnet.diff"
VERIFY_COMMAND = "linnet.verify"
DIFF_TITLE = "Diff against transformers"
VERIFY_TITLE = "Verify"


def weights_for(targets: list, preset: str | None) -> str | None:
    """The weights of `preset` among the header checks' targets ((preset, spec, base, named_at)): a path relative
    to its base made absolute, an embedded id as given; None when the preset names none."""
    for name, spec, base, _ in targets:
        if name == preset:
            candidate = Path(base) / spec
            return str(candidate) if not Path(spec).is_absolute() and candidate.exists() else spec
    return None


async def diff_report(
    interpreter: str | None,
    path: str,
    text: str,
    weights: str,
    preset: str | None,
    buffers: dict[str, str] | None = None,
) -> dict:
    """`linnet diff`'s JSON report for `text` (saved as `path`, its imports read from `buffers` where given) on
    `weights`. Raises ViewError with the worker's message when it prints none (a reference that cannot run: exit
    2)."""
    args = ["diff", "{file}", "--weights", weights, "--format", "json"]
    if preset:
        args += ["--preset", preset]
    return await worker_report(interpreter, args, path, text, buffers)


async def verify_run(
    interpreter: str | None,
    path: str,
    text: str,
    weights: str | None,
    preset: str | None,
    buffers: dict[str, str] | None = None,
) -> dict:
    """`linnet verify --format json`'s report on `text`, its imports read from `buffers` where given (its `agree`,
    and `checks`: each pair of computations with
    `kind`, `description`, `agree`, `position` and the first parting `module` {path, methods, max_delta, ...}).
    Raises ViewError when it prints none (a source that does not check, weights it cannot load: exit 2)."""
    args = ["verify", "{file}", "--format", "json"]
    args += (["--weights", weights] if weights else []) + (["--preset", preset] if preset else [])
    return await worker_report(interpreter, args, path, text, buffers)


def diff_diagnostic(report: dict, analysis, path: str) -> T.Diagnostic | None:
    """The diagnostic of a `linnet diff` report: None when every module agrees."""
    first = report.get("first")
    if not first:
        return None
    delta = "shapes differ" if first["max_abs_diff"] is None else f"max |Δ| {first['max_abs_diff']:.3g}"
    name = first["name"] or f"the output of `{first['entry']}`"
    message = (
        f"differs from {report['reference']} {report['architecture']}: {name} in `{first['entry']}` ({delta}, "
        f"max |reference| {first['scale']:.3g}; shapes {first['ours_shape']} and {first['ref_shape']}); "
        f"{report['differences']} module output(s) differ"
    )
    return _on_member(analysis, path, first["name"], message, "linnet diff")


def verify_diagnostic(report: dict, analysis, path: str) -> T.Diagnostic | None:
    """The diagnostic of a `linnet verify` report: None when every check agrees; else on the first parting module
    of the first check that parts (the root model's name when it names none)."""
    first = next((c for c in report.get("checks", []) if not c.get("agree")), None)
    if first is None:
        return None
    module = first.get("module") or {}
    ways = " and ".join(f"`{w}`" for w in first.get("ways", []))
    at = f" first at {first.get('axis', 'position')} {first['position']}" if first.get("position") is not None else ""
    message = (
        f"{first.get('kind')}: {first.get('description')}: {ways} part{at} (max |Δ| {first.get('max_delta', 0):.3g})"
    )
    if module:
        message += f"; first module whose outputs part: {module.get('path') or 'the root module'}"
    return _on_member(analysis, path, module.get("path") or "", message, "linnet verify")


def _on_member(analysis, path: str, dotted: str, message: str, source: str) -> T.Diagnostic | None:
    model = analysis.model
    if model is None or model.ast is None:
        return None
    where = (member_location(analysis, path, dotted) if dotted else None) or model.resolve(model.ast.name.span)
    return T.Diagnostic(lsp_range(where), message, severity=T.DiagnosticSeverity.Warning, source=source)
