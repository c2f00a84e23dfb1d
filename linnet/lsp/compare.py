"""The `linnet.compare` command: an entry on several backends in a worker, shown as a report.

The worker is `linnet run FILE --entry E --compare B1,B2,... --format json` (`linnet.runtimes.backends.compare`)
on a copy of the editor's text (`views.run_worker`), so the server imports no framework. Its
report (a row per backend, max |Δ| per pair, disagreements with the checker) is written as a
Markdown file under the cache folder (`<cache>/reports/`, `linnet.runtimes.backends.caches.cache_root`),
read-only on disk (mode 0444), and shown with `window/showDocument`: every client that supports
it opens a file URI (VS Code, Neovim 0.9+), and Vim and Neovim open a file without write
permission as 'readonly'. A client without `window/showDocument` gets a message
naming the file (Neovim 0.7, 0.8); the command also returns the report with its `reportUri`.
"""

from __future__ import annotations

import os
from pathlib import Path

from .views import ViewError, backend_label, worker_report

__all__ = ["COMPARE_BACKENDS", "compare_entry", "lens_title", "report_markdown", "summary", "write_report"]


def __getattr__(name: str):
    """`REFERENCE`: the registry's reference backend, imported on first use (the registry imports numpy)."""
    if name == "REFERENCE":
        from linnet.runtimes.backends.compare import REFERENCE

        return REFERENCE
    raise AttributeError(name)


def format_delta(value) -> str:
    from linnet.runtimes.backends.compare import format_delta as registry_format_delta

    return registry_format_delta(value)


def delta_to_reference(report: dict, row: dict) -> str:
    """The registry's `delta_to_reference` (a row's max |Δ| against the reference, as `linnet run --compare`
    prints it), imported when a report is written."""
    from linnet.runtimes.backends.compare import delta_to_reference as registry_delta_to_reference

    return registry_delta_to_reference(report, row)


COMPARE_BACKENDS = ("torch", "xla", "onnxruntime")  # the lens's; torch-interpret, the reference, is always added


def lens_title(backends: tuple[str, ...] = COMPARE_BACKENDS) -> str:
    """The lens's title from the registry's labels: "Compare ▸ PyTorch · XLA · ONNX Runtime"."""
    return "Compare ▸ " + " · ".join(backend_label(b) for b in backends)


async def compare_entry(
    interpreter: str | None,
    path: str,
    text: str,
    entry: str,
    backends: list[str],
    preset: str | None,
    buffers: dict[str, str] | None = None,
) -> dict:
    """The report of `linnet run --compare` for `entry` of `text` (saved as `path`) under
    `preset`, from a worker reading the files it imports from `buffers` where given. Raises
    ViewError with the worker's message when it prints no report (a source that does not check,
    an unknown entry or backend)."""
    args = ["run", "{file}", "--entry", entry, "--compare", ",".join(backends), "--format", "json"]
    if preset:
        args += ["--preset", preset]
    return await worker_report(interpreter, args, path, text, buffers)


def report_folder() -> Path:
    """Where reports go: `<cache folder>/reports`, or a per-user folder in the temporary
    directory when caching is off (`LINNET_NO_CACHE`)."""
    from linnet.runtimes.backends.caches import cache_root

    root = cache_root()
    if root is None:
        import tempfile  # here: with shutil, ~10 ms of a start that never compares

        return Path(tempfile.gettempdir()) / f"linnet-{os.getuid()}" / "reports"
    return root / "reports"


def write_report(report: dict, source: str, folder: Path | None = None) -> Path:
    """Write `report` as Markdown to `<folder>/<stem>-<hash of the source path>.<entry>.compare.md`,
    replacing the last one of that source and entry, read-only (0444). Returns its path. Raises
    ViewError when the folder cannot be written."""
    folder = folder or report_folder()
    import hashlib  # here: its import (OpenSSL's) is ~5 ms of a start that never compares

    digest = hashlib.sha256(source.encode("utf-8", "surrogateescape")).hexdigest()[:8]
    path = folder / f"{Path(source).stem}-{digest}.{report['entry']}.compare.md"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)  # the old one is read-only: replace it, never write through it
        path.write_text(report_markdown(report), encoding="utf-8")
        path.chmod(0o444)
    except OSError as err:
        raise ViewError(f"cannot write the comparison report in {folder}: {err.strerror or err}") from err
    return path


def report_markdown(report: dict) -> str:
    """The report as a Markdown document: the run, a table with a row per backend (status, output
    shapes and dtypes against the checker's, max |Δ| against the reference, time), max |Δ| of
    every pair, and the disagreements."""
    preset = f"preset `{report['preset']}`" if report.get("preset") else "the config's defaults"
    inputs = ", ".join(f"`{i['name']}` {i['shape']} {i['dtype']}" for i in report["inputs"])
    out = [
        f"# `{report['entry']}` compared across backends",
        "",
        f"{report['file']}, {preset}, {report['dtype']}, {report['weights']} (seed {report['seed']}); "
        f"inputs: {inputs}. The same inputs and weights on every backend; the reference is "
        f"{backend_label(report['reference'])} (`{report['reference']}`).",
        "",
        "| backend | status | outputs (checker) | max \\|out\\| | max \\|Δ\\| vs reference | time |",
        "|---|---|---|---|---|---|",
    ]
    for row in report["backends"]:
        name = f"{row['label']} (`{row['backend']}`)"
        if row["status"] != "ok":
            out.append(f"| {name} | {row['status']}: {_cell(row['reason'])} | | | | |")
            continue
        outs = "; ".join(_output_cell(o) for o in row["outputs"])
        delta = delta_to_reference(report, row)
        out.append(f"| {name} | ok | {outs} | {row['max_abs']:.3g} | {delta} | {row['time_ms']:.2f} ms |")
    if report["pairs"]:
        out += ["", f"## max |Δ| between backends (tolerance {report['tolerance']:g})", ""]
        out += ["| | | max \\|Δ\\| | |", "|---|---|---|---|"]
        for p in report["pairs"]:
            verdict = "agree" if p["agree"] else "**disagree**"
            out.append(f"| `{p['a']}` | `{p['b']}` | {format_delta(p['max_abs_diff'])} | {verdict} |")
    out += ["", "## Disagreements", ""]
    out += [f"- {_cell(d)}" for d in report["disagreements"]] or ["None: every backend that ran agrees."]
    notes = [(row["backend"], n) for row in report["backends"] for n in row.get("notes", [])]
    if notes:
        out += ["", "## Notes", ""] + [f"- `{b}`: {_cell(n)}" for b, n in notes]
    return "\n".join(out) + "\n"


def summary(report: dict, path: Path) -> str:
    """One line for a message: how many backends ran and agree, and where the report is."""
    ran = [r for r in report["backends"] if r["status"] == "ok"]
    worst = max((p["max_abs_diff"] for p in report["pairs"] if p["max_abs_diff"] is not None), default=0.0)
    verdict = f"{len(report['disagreements'])} disagreement(s)" if report["disagreements"] else "all agree"
    return (
        f"{report['entry']} on {len(ran)} of {len(report['backends'])} backends: {verdict} "
        f"(largest max |Δ| {worst:.3g}); report: {path}"
    )


def _output_cell(o: dict) -> str:
    text = f"{o['shape']} {o['dtype']}"
    if o["shape"] != o["checker_shape"] or o["dtype"] != o["checker_dtype"]:
        text += f" (checker: **{o['checker_shape']} {o['checker_dtype']}**)"
    return text


def _cell(text: str | None) -> str:
    """Text safe inside a Markdown table cell or list item: one line, pipes escaped."""
    return " ".join(str(text or "").split()).replace("|", "\\|")
