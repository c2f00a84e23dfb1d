"""Fuzz the promise "a model that checks clean under a preset lowers under it".

Each round takes an example (`examples/*.linnet`), replaces one integer literal (a config default, a preset value,
a module argument, a dim) by a nearby or small value, and checks the edited text under one of its presets (or the
config defaults). An edit that checks clean must lower (`linnet.ir.build.lower_program`); one that does not is
printed with the edit and the lowering error, and the run exits 1.

    PYTHONPATH=. python tools/lower_gap_fuzz.py [--rounds 300] [--seed 0] [--only resnet,vit]
"""

from __future__ import annotations

import argparse
import random
import re
import sys
from pathlib import Path

from linnet.errors import LinnetError
from linnet.ir.build import check_source, lower_program

INT = re.compile(r"(?<![\w.])\d+(?![\w.])")


def mutate(value: int, rng: random.Random) -> int:
    """A value near `value`, or a small one: the sizes that break windows, splits and divisions."""
    return rng.choice([0, 1, 2, 3, 5, 7, 8, 16, value - 1, value + 1, value * 2, max(value // 2, 0), value * 3])


def one_edit(text: str, rng: random.Random) -> tuple[str, str] | None:
    """The text with one integer literal outside comments replaced, and a line describing the edit."""
    spots = []
    offset = 0
    for line_no, line in enumerate(text.split("\n"), 1):
        code = line.split("#", 1)[0]
        spots += [(offset + m.start(), offset + m.end(), line_no) for m in INT.finditer(code)]
        offset += len(line) + 1
    if not spots:
        return None
    start, end, line_no = rng.choice(spots)
    old = int(text[start:end])
    new = mutate(old, rng)
    if new == old:
        return None
    return text[:start] + str(new) + text[end:], f"line {line_no}: {old} -> {new}"


def presets_of(text: str) -> list[str | None]:
    """The presets a file declares, and None (the config defaults)."""
    return [None] + re.findall(r"^preset\s+(\w+)", text, flags=re.M)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", default="", help="comma-separated example names (default: all)")
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    files = sorted(Path("examples").glob("*.linnet"))
    if args.only:
        files = [f for f in files if f.stem in args.only.split(",")]
    clean = lowered = 0
    gaps = []
    for round_no in range(args.rounds):
        path = rng.choice(files)
        text = path.read_text(encoding="utf-8")
        edit = one_edit(text, rng)
        if edit is None:
            continue
        edited, what = edit
        preset = rng.choice(presets_of(text))
        try:
            info = check_source(str(path), edited, preset)
        except LinnetError:
            continue  # the checker refuses the edit: nothing promised
        clean += 1
        try:
            lower_program(info, optimize_ir=False)
            lowered += 1
        except Exception as err:  # a LoweringError, or a crash (an IndexError) that is a gap all the same
            first = f"{type(err).__name__}: " + str(err).split("\n", 1)[0]
            gaps.append((path.name, what, preset, first))
            print(f"GAP {path.name} {what} preset={preset}: {first}", flush=True)
        if (round_no + 1) % 50 == 0:
            print(f"{round_no + 1} rounds: {clean} clean, {lowered} lowered, {len(gaps)} gaps", flush=True)
    print(f"done: {args.rounds} rounds, {clean} checked clean, {lowered} lowered, {len(gaps)} did not")
    return 1 if gaps else 0


if __name__ == "__main__":
    sys.exit(main())
