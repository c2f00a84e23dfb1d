"""`linnet run FILE --compare B1,B2,...`: one entry on several backends, compared.

Every backend gets the same seeded random inputs (`linnet.runtimes.model.random_inputs`) and the
same weights (the seeded random weights of `linnet.runtimes.loading.random_params`, the same on
every backend, or `--weights`). The report has one row per backend, `torch-interpret` (the Core
IR op by op, the `equivalent` reference) first, then the backends asked for:

- a backend that cannot run here (not installed, no such device, not the working dtype) is a row saying why
  (`status: "unavailable"`); one that fails to load or run is a row with its error
  (`status: "failed"`); neither stops the others;
- each output's shape and dtype next to the checker's (the entry's IR signature with the input
  sizes bound); a mismatch is a disagreement;
- max |Δ| of every output against the reference, and between every pair of backends that ran
  (`pairs`); a pair further apart than the tolerance is a disagreement.

`--format json` prints the report as one JSON object (what the language server's "Compare" lens
shows); text prints a table. Exit 0 when every backend that ran agrees, 1 on any disagreement or
failed backend, 2 for a usage error. This module is the comparison (rows, pairs, the report), shared by the CLI and
the language server's report; the loading and running are `linnet.cli.run`'s (`compare_backends`), as for
`linnet run`.
"""

from __future__ import annotations

import argparse

REFERENCE = "torch-interpret"
# the max |Δ| two backends may differ by, per working dtype: f32 is ARCHITECTURE.md's "about 1e-4 on
# logits"; f16 and bf16 keep 11 and 8 significant bits, so a few rounding steps of values near 1
# stored: each backend's weight-only quantized matmul rounds its own way (torch's int4 kernels take bf16 activations)
TOLERANCE = {"f32": 1e-4, "f16": 1e-2, "bf16": 5e-2, "stored": 5e-2}


def parse_backends(text: str) -> list[str]:
    """`--compare torch,xla` as registry names, in order, each once, the reference first.
    Raises ValueError for an empty list or a name the registry lacks (naming the backends)."""
    from linnet.runtimes.backends import BACKENDS

    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise ValueError(f"--compare takes backend names separated by commas (backends: {', '.join(BACKENDS)})")
    unknown = [n for n in names if n not in BACKENDS]
    if unknown:
        raise ValueError(f"--compare: unknown backend {', '.join(unknown)} (backends: {', '.join(BACKENDS)})")
    return list(dict.fromkeys([REFERENCE, *names]))


def build_report(args: argparse.Namespace, program, graph, inputs: list, rows: list[dict], values: dict) -> dict:
    """The report of `linnet run --compare` (`args`) from each backend's row and its outputs
    (`values`: backend name -> float64 arrays, for those that ran): the run, the rows, max |Δ|
    of every pair and the disagreements."""
    tolerance = tolerance_for(args)
    report = {
        "file": args.file,
        "entry": graph.name,
        "preset": program.preset,
        "dtype": args.dtype,
        "weights": args.weights or "random weights",
        "seed": args.seed,
        "inputs": [
            {"name": v.name, "shape": list(a.shape), "dtype": str(a.dtype)} for v, a in zip(graph.inputs, inputs)
        ],
        "reference": REFERENCE,
        "tolerance": tolerance,
        "backends": rows,
        "pairs": _pairs(values, tolerance),
        "disagreements": [],
    }
    _agreement(report, values)
    return report


def tolerance_for(args: argparse.Namespace) -> float:
    """`--tolerance`, else the working dtype's (`TOLERANCE`). Raises ValueError below 0 or NaN."""
    tolerance = args.tolerance if args.tolerance is not None else TOLERANCE[args.dtype]
    if not tolerance >= 0:
        raise ValueError(f"--tolerance must be a number >= 0, got {args.tolerance}")
    return tolerance


def checker_outputs(graph, sizes: dict[str, int]) -> list[dict]:
    """What the checker says each output of `graph` is under `sizes`: shape and numpy dtype name."""
    from linnet.runtimes.formats.checkpoints import numpy_dtype
    from linnet.runtimes.model import concrete_dim

    return [
        {"shape": [concrete_dim(d, sizes) for d in v.dims], "dtype": numpy_dtype(v.dtype.name).name}
        for v in graph.outputs
    ]


def unavailable(backend, device: str, dtype: str) -> str | None:
    """Why `backend` (a registry record) cannot run here on `device` in `dtype`, or None."""
    why = backend.unavailable(device, probe=True)
    if why is None and dtype == "stored" and not backend.stored:
        why = f"{backend.name} does not run --dtype stored (GGUF weights kept quantized)"
    elif why is None and dtype != "stored" and dtype not in backend.dtypes:
        why = f"{backend.name} runs {', '.join(backend.dtypes)}, not {dtype}"
    return why


def row(backend, status: str = "ok", reason: str | None = None) -> dict:
    """A backend's row: registry name, label, status ("ok", "unavailable", "failed") and why."""
    return {"backend": backend.name, "label": backend.label, "status": status, "reason": reason, "outputs": [],
            "disagreements": []}  # fmt: skip


def ran(out_row: dict, model, outs: list, elapsed_s: float, expected: list[dict]) -> list:
    """Fill the row of a backend that ran (`outs`: [(shape, dtype name, float64 values)] per
    output, as `_run_entry` returns them) with its outputs next to the checker's (`expected`), its
    time and notes, and any disagreement with the checker. Returns the outputs' values."""
    name = out_row["backend"]
    out_row |= {"time_ms": elapsed_s * 1000, "load_s": model.load_s, "notes": list(model.notes)}
    for i, ((shape, dtype, _), want) in enumerate(zip(outs, expected)):
        out_row["outputs"].append(
            {"shape": shape, "dtype": dtype, "checker_shape": want["shape"], "checker_dtype": want["dtype"]}
        )
        if shape != want["shape"]:
            out_row["disagreements"].append(f"output {i}: the checker says shape {want['shape']}, {name} gave {shape}")
        if dtype != want["dtype"]:
            out_row["disagreements"].append(f"output {i}: the checker says dtype {want['dtype']}, {name} gave {dtype}")
    if len(outs) != len(expected):
        out_row["disagreements"].append(f"the checker says {len(expected)} output(s), {name} gave {len(outs)}")
    return [values for _, _, values in outs]


def max_abs_diff(a: list, b: list) -> float | None:
    """The largest |a - b| over every output (float64 arrays), or None when the outputs' number or
    shapes differ (the shape disagreement is reported instead). NaN where either side has one."""
    import numpy as np

    if len(a) != len(b) or any(x.shape != y.shape for x, y in zip(a, b)):
        return None
    worst = 0.0
    for x, y in zip(a, b):
        if x.size:
            d = float(np.max(np.abs(x - y)))
            if np.isnan(d) or d > worst:
                worst = d
    return worst


def _pairs(values: dict[str, list], tolerance: float) -> list[dict]:
    """max |Δ| between every two backends that ran, in row order."""
    names = list(values)
    out = []
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            d = max_abs_diff(values[a], values[b])
            out.append({"a": a, "b": b, "max_abs_diff": d, "agree": d is not None and d <= tolerance})
    return out


def _agreement(report: dict, values: dict[str, list]) -> None:
    """Fill each row's `max_abs_diff` against the reference and `max_abs`, and the report's
    disagreements (the rows' own and every pair beyond the tolerance)."""
    import numpy as np

    ref = values.get(REFERENCE)
    for row in report["backends"]:
        outs = values.get(row["backend"])
        if outs is None:
            continue
        row["max_abs"] = max((float(np.max(np.abs(x))) for x in outs if x.size), default=0.0)
        row["max_abs_diff"] = max_abs_diff(outs, ref) if ref is not None else None
        report["disagreements"].extend(row["disagreements"])
    for pair in report["pairs"]:
        if pair["max_abs_diff"] is None:
            report["disagreements"].append(f"{pair['a']} and {pair['b']} give outputs of different shapes")
        elif not pair["agree"]:
            report["disagreements"].append(
                f"{pair['a']} and {pair['b']} differ by {pair['max_abs_diff']:.3g}, more than {report['tolerance']:g}"
            )


def format_text(report: dict) -> str:
    """The report as a terminal table: one line per backend, then max |Δ| per pair."""
    inputs = ", ".join(f"{i['name']}{i['shape']}" for i in report["inputs"])
    preset = f", preset {report['preset']}" if report["preset"] else ""
    lines = [
        f"{report['file']}: entry {report['entry']}{preset} ({report['dtype']}, {report['weights']}, "
        f"seed {report['seed']}), inputs {inputs}"
    ]
    width = max(len(r["backend"]) for r in report["backends"])
    for r in report["backends"]:
        if r["status"] != "ok":
            lines.append(f"  {r['backend']:<{width}}  {r['status']}: {r['reason']}")
            continue
        outs = "; ".join(f"{o['shape']} {o['dtype']}" for o in r["outputs"])
        delta = delta_to_reference(report, r)
        delta = delta if delta == "reference" else f"max |Δ| {delta}"
        scale = f"max |out| {r['max_abs']:.3g}"
        lines.append(f"  {r['backend']:<{width}}  {outs}  {scale}  {delta}  ({r['time_ms']:.2f} ms)")
    if report["pairs"]:
        lines.append(f"max |Δ| between backends (tolerance {report['tolerance']:g}):")
        for p in report["pairs"]:
            mark = "" if p["agree"] else "  disagree"
            lines.append(f"  {p['a']} vs {p['b']}: {format_delta(p['max_abs_diff'])}{mark}")
    lines.extend(f"disagreement: {d}" for d in report["disagreements"])
    return "\n".join(lines)


def delta_to_reference(report: dict, row: dict) -> str:
    """A row's max |Δ| against the reference for a person: "reference" on the reference's own row, "- (no
    reference)" where the reference did not run (`--dtype stored`: its None is not "shapes differ"), else
    `format_delta`."""
    if row["backend"] == report["reference"]:
        return "reference"
    if not any(r["backend"] == report["reference"] and r["status"] == "ok" for r in report["backends"]):
        return "- (no reference)"
    return format_delta(row.get("max_abs_diff"))


def format_delta(value: float | None) -> str:
    """A max |Δ| for a person: three significant digits, or "shapes differ" (None)."""
    return "shapes differ" if value is None else f"{value:.3g}"
