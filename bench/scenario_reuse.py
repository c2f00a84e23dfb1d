"""How many item checks a cache keyed by the config values each check reads could skip (issue 45's 5 MB document,
the examples): the estimate to make before building that cache.

A module or function is checked once per binding of its config parameters (`program.Document._bindings`: one per
distinct config value across the scenarios, the config defaults and each preset). A check that reads only fields
on which two bindings agree could be reused for the second one, if the findings were the same: they are only when
the fields' values came from the same places too (a finding's labels point at the preset line or the config default
that set each value it quotes: `ConfigValue.origins`, `ConfigValue.atom`). This script records, for each check, the
config fields it reads (`ConfigValue.field_type`: field, value, origin) and counts, per item, its distinct read
sets, with and without the origins. A check's reads through a cached module instance or signature made by an
earlier check are not seen (the cache hit reads nothing), so the read sets are smaller than a dependency tracker's
would be, and the counts of reusable checks an upper bound.

Run: `python bench/scenario_reuse.py [--copies 20] [--out PATH]` (writes PATH and the same run as a table beside it,
`.md`; timings live here, never in tests).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from bigdoc_source import big_source  # noqa: E402


def count(name: str, path: str, text: str) -> dict:
    """Checks run on `text` and how many distinct config reads they make, per item summed (see the docstring)."""
    from linnet.semantics import configs, program
    from linnet.semantics.program import Workspace

    reading: list[set] = []
    checks: list[tuple[str, frozenset]] = []
    real_field_type, real_check = configs.ConfigValue.field_type, program._check_item

    def field_type(self, field, display):
        if reading:
            reading[-1].add((self.type_name, field, repr(self.values.get(field)), self.origins.get(field)))
        return real_field_type(self, field, display)

    def check_item(ctx, item, binding):
        reading.append(set())
        try:
            return real_check(ctx, item, binding)
        finally:
            checks.append((item.name, frozenset(reading.pop())))

    configs.ConfigValue.field_type, program._check_item = field_type, check_item
    try:
        Workspace().open(path, text).analyze(None, jobs=1)
    finally:
        configs.ConfigValue.field_type, program._check_item = real_field_type, real_check
    by_item: dict[str, list[frozenset]] = {}
    for item, reads in checks:
        by_item.setdefault(item, []).append(reads)
    with_origins = sum(len(set(r)) for r in by_item.values())
    values_only = sum(len({frozenset(x[:3] for x in reads) for reads in r}) for r in by_item.values())
    return {
        "file": name,
        "checks": len(checks),
        "items": len(by_item),
        "distinct_reads_with_origins": with_origins,
        "distinct_reads_values_only": values_only,
        "reusable_upper_bound": len(checks) - with_origins,
        "reusable_if_origins_did_not_matter": len(checks) - values_only,
    }


def markdown(result: dict) -> str:
    lines = [
        "# Item checks a cache keyed by the config values each check reads could skip",
        "",
        f"Written by `bench/scenario_reuse.py` ({result['when']}) at {result['git']['commit'][:10]}. Per file: the"
        " checks `linnet check --jobs 1` runs (module or function under one binding), and how many a cache keyed by"
        " the config fields each check reads could skip at most: keyed by their values and origins (findings"
        " identical), and keyed by their values only (findings would then name another preset's lines).",
        "",
        "| file | items | checks | skippable (values and origins) | skippable (values only) |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['file']} | {r['items']} | {r['checks']} | {r['reusable_upper_bound']} |"
            f" {r['reusable_if_origins_did_not_matter']} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, default=20, help="copies of the 5 MB document's llama.linnet")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "scenario_reuse.json")
    args = parser.parse_args()
    from lsp_latency import git_state

    rows = [count(f"bigdoc_source.py, {args.copies} copies", "/tmp/bigdoc.linnet", big_source(args.copies))]
    for path in sorted((ROOT / "examples").glob("*.linnet")):
        rows.append(count(f"examples/{path.name}", str(path), path.read_text(encoding="utf-8")))
    result = {"when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "git": git_state(), "rows": rows}
    args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    args.out.with_suffix(".md").write_text(markdown(result), encoding="utf-8")
    print(markdown(result))


if __name__ == "__main__":
    main()
