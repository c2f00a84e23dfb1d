"""`python -m tests.porting.tally [--markdown] [--out bench/results/zoo_porting.json [--tree TEXT]]`: run every row of
the porting catalogue through every layer this tree has (check, verify, diff) and print which layers catch it and
the count per layer; `--out` writes them as JSON (`--tree`: what was measured, default the commit), from which
docs/zoo.md's "Porting mistakes caught" section is generated (linnet/zoo_page.py, `make docs`). A layer this tree
lacks is reported as missing, not as catching nothing."""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

from tests.porting.catalogue import MUTATIONS
from tests.porting.checkpoints import FAMILIES, build, source
from tests.porting.layers import LayerMissing, check_findings, diff_findings, mutated_source, verify_findings

LAYERS = ("check", "verify", "diff")


def tally() -> tuple[list[dict], dict[str, bool]]:
    """One row per mutation: {id, family, expected, caught: {layer: bool}}; and which layers ran."""
    import torch

    torch.set_num_threads(1)
    root = Path(tempfile.mkdtemp(prefix="linnet-porting-"))
    made: dict = {}
    rows, available = [], dict.fromkeys(LAYERS, True)
    for i, m in enumerate(MUTATIONS):
        if m.family not in made:
            folder = root / m.family
            model = build(m.family, folder)
            made[m.family] = (folder, model, check_findings(source(m.family), folder))
        folder, model, baseline = made[m.family]
        path = mutated_source(m, root / f"m{i}")
        caught = {"check": bool(check_findings(path, folder, baseline))}
        try:
            caught["verify"] = bool(verify_findings(path, folder, unrunnable_ok=True))
        except LayerMissing:
            available["verify"] = False
        caught["diff"] = bool(diff_findings(path, folder, FAMILIES[m.family][0], model))
        rows.append({"id": m.id, "family": m.family, "expected": m.layer, "needs": m.needs, "why": m.why,
                     "caught": caught})  # fmt: skip
    return rows, available


def summary(rows: list[dict], available: dict[str, bool]) -> list[str]:
    """Lines: the count each layer catches, the count caught by any, the rows caught by none."""
    n = len(rows)
    lines = []
    for layer in LAYERS:
        if not available[layer]:
            lines.append(f"{layer}: not in this tree")
            continue
        lines.append(f"{layer}: {sum(r['caught'].get(layer, False) for r in rows)} of {n}")
    caught = [r for r in rows if any(r["caught"].values())]
    lines.append(f"any layer: {len(caught)} of {n}")
    lines += [f"caught by none: {r['id']} (expected: {r['expected']})" for r in rows if r not in caught]
    return lines


def markdown(rows: list[dict], available: dict[str, bool]) -> str:
    """The table for docs/zoo.md: one row per mutation, a column per layer."""
    cols = [layer for layer in LAYERS if available[layer]]
    out = ["| mutation | family | expected | " + " | ".join(cols) + " |", "|---|---|---|" + "---|" * len(cols)]
    for r in rows:
        marks = " | ".join("caught" if r["caught"][layer] else "" for layer in cols)
        out.append(f"| `{r['id']}` | {r['family']} | {r['expected']} | {marks} |")
    return "\n".join(out)


def _commit() -> str:
    """The measured tree: its commit, and "with changes" when the work tree differs from it."""
    import subprocess

    root = Path(__file__).resolve().parents[2]
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True).stdout.strip()
    return f"commit {head.stdout.strip()}" + (" with changes" if dirty else "")


def main() -> int:
    t0 = time.perf_counter()
    rows, available = tally()
    if "--markdown" in sys.argv:
        print(markdown(rows, available))
    else:
        for r in rows:
            got = ", ".join(layer for layer, hit in r["caught"].items() if hit) or "none"
            print(f"{r['id']:<42} expected {r['expected']:<7} caught by {got}")
    print("\n".join(summary(rows, available)))
    elapsed_s = time.perf_counter() - t0
    print(f"({len(rows)} mutations in {elapsed_s:.0f} s)")
    if "--out" in sys.argv:
        out = Path(sys.argv[sys.argv.index("--out") + 1])
        written = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
        tree = sys.argv[sys.argv.index("--tree") + 1] if "--tree" in sys.argv else _commit()
        record = {"written": written, "written_by": "python -m tests.porting.tally --out ...", "tree": tree,
                  "layers": available, "seconds": round(elapsed_s), "rows": rows}  # fmt: skip
        out.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
