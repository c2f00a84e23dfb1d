"""Differential test of the incremental analysis: random edit sequences applied through `Workspace().open(path,
text).analyze(preset)` (as the language server does), each analysis compared with a fresh workspace's analysis of
the same text: diagnostics (code, severity, message, range, labels, notes, fixes, presets), hover, definition and
inlay hints at sampled offsets, and with `--lower` the root model's Core IR (`lower_analysis`: what the cost hover
and inlay hints compile; the error text when it does not lower). Prints the first difference of each sequence (with
the edits that led to it). A file that others import (`IMPORTERS`: llama.linnet's) has its importers analysed after
each edit in the same workspace and compared too.

    python bench/diff_incremental.py [--seed N] [--sequences N] [--steps N] [--files llama,gpt2,...] [--bigdoc N]
        [--lower]
"""

from __future__ import annotations

import argparse
import random
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from linnet.lsp.hints import inlay_hints  # noqa: E402
from linnet.lsp.hover import hover_markdown  # noqa: E402
from linnet.lsp.navigation import definition  # noqa: E402
from linnet.semantics.program import Document, Workspace  # noqa: E402
from linnet.syntax import ast as A  # noqa: E402
from linnet.syntax.items import split_items  # noqa: E402

SNIPPETS = ["x", " + 1.0", "\n", "let q = x\n", "}", "{", "(", ")", "c.hidden_size", "#", "fn ", "  ", "[B, S]", ","]
SNIPPETS += ["let unused_probe = x\n", "x + y", "q_proj", "v_proj", "c.head_dim", "1.0 / 0", ": [B]", "2", "0"]


def diag_key(d):
    def loc(x):
        return (x.path, x.start.offset, x.end.offset, x.start.line, x.start.character, x.end.line, x.end.character)

    return (
        d.code,
        d.severity,
        d.message,
        loc(d.location),
        d.label,
        tuple((loc(lb.location), lb.message) for lb in d.labels),
        tuple(d.notes),
        tuple((f.message, tuple((loc(e.location), e.new_text) for e in f.edits)) for f in d.fixes),
        d.presets,
        tuple(d.tags),
    )


def loc_key(x):
    return None if x is None else (x.path, x.start.offset, x.end.offset)


def lowered(analysis, preset) -> str:
    """The root model's Core IR under `preset`, or why it does not lower."""
    from linnet.errors import LinnetError
    from linnet.ir import format_program
    from linnet.ir.build import lower_analysis

    if analysis.model is None:
        return "no model"
    try:
        return format_program(lower_analysis(analysis, preset))
    except (LinnetError, ValueError) as err:
        return f"{type(err).__name__}: {err}"


def views(analysis, text, preset, offsets, lower=False):
    out = {"diagnostics": sorted(map(repr, map(diag_key, analysis.diagnostics)))}
    if lower:
        out["lowered"] = lowered(analysis, preset)
    out["hints"] = [(h.offset, h.label, h.kind) for h in inlay_hints(analysis, 0, len(text), preset, 120)]
    for at in offsets:
        out[f"hover@{at}"] = hover_markdown(analysis, at, preset)
        out[f"def@{at}"] = loc_key(definition(analysis, at))
        t = analysis.type_at(at)
        out[f"type@{at}"] = t and (t.symbolic, t.concrete)
    return out


# ----- structure of a text, from a fresh parse


def structure(text):
    """(modules, fns): modules as (name, start, end, body_start); fns as dicts with absolute spans."""
    doc = Document("probe.linnet", text)
    mods, fns, fields, cfgs = [], [], [], []
    for item in doc.items:
        tree = item.ast
        if tree is None:
            continue
        o = item.offset
        if isinstance(tree, A.ModuleDef):
            mods.append((tree.name.id, o + tree.span.start, o + tree.span.end, tree.is_model))
            for m in A.flat_members(tree.members):
                if isinstance(m, A.FnDef):
                    fns.append(
                        dict(
                            module=tree.name.id,
                            model=tree.is_model,
                            name=m.name.id,
                            start=o + m.span.start,
                            end=o + m.span.end,
                            body=(o + m.body.span.start + 1, o + m.body.span.end - 1),
                            params=[(p.name.id, o + p.name.span.start, o + p.name.span.end) for p in m.params],
                            sig=(o + m.span.start, o + m.body.span.start),
                        )
                    )
                else:
                    fields.append((o + m.span.start, o + m.span.end))
        elif item.kind in ("config", "preset"):
            cfgs.append((o + tree.span.start, o + tree.span.end))
    return mods, fns, fields, cfgs


def line_start(text, at):
    return text.rfind("\n", 0, at) + 1


def random_edit(rng, text, original, history):
    """One edit: (kind, new text)."""
    mods, fns, fields, cfgs = structure(text)
    kinds = ["body"] * 6 + ["delete_body"] * 3 + ["boundary", "signature", "member", "config", "brace", "move"]
    kinds += ["rename", "duplicate", "delete_fn", "paste_other", "undo", "anywhere"]
    kind = rng.choice(kinds)
    if not fns and kind not in ("undo", "anywhere", "brace", "config"):
        kind = "anywhere"
    if kind == "undo" and history:
        back = rng.choice(history + [original])
        return kind, back
    if kind in ("body", "delete_body"):
        f = rng.choice(fns)
        lo, hi = f["body"]
        at = rng.randint(lo, max(lo, hi))
        if kind == "body":
            return kind, text[:at] + rng.choice(SNIPPETS) + text[at:]
        end = min(hi, at + rng.randint(1, 15))
        return kind, text[:at] + text[end:]
    if kind == "boundary":
        f = rng.choice(fns)
        at = rng.randint(max(0, f["end"] - 10), f["end"])
        end = min(len(text), f["end"] + rng.randint(0, 30))
        return kind, text[:at] + rng.choice(["", "}", "\n", " x\n"]) + text[end:]
    if kind == "signature":
        f = rng.choice(fns)
        lo, hi = f["sig"]
        at = rng.randint(lo, hi)
        end = min(hi, at + rng.randint(0, 6))
        return kind, text[:at] + rng.choice(["", "x", ", y: [B]", "c.hidden_size", "2", "[..., 4]"]) + text[end:]
    if kind == "member" and fields:
        lo, hi = rng.choice(fields)
        at = rng.randint(lo, hi)
        end = min(hi, at + rng.randint(0, 6))
        return kind, text[:at] + rng.choice(["", "x", "2", "c.hidden_size", "Linear(", ", bias = false"]) + text[end:]
    if kind == "config" and cfgs:
        lo, hi = rng.choice(cfgs)
        nums = [m for m in re.finditer(r"\d+", text[lo:hi])]
        if nums and rng.random() < 0.7:
            m = rng.choice(nums)
            return kind, text[: lo + m.start()] + str(rng.choice([1, 2, 3, 7, 64, 100])) + text[lo + m.end() :]
        at = rng.randint(lo, hi)
        return kind, text[:at] + rng.choice(["", "x", "\n", "}"]) + text[at + rng.randint(0, 4) :]
    if kind == "brace":
        at = rng.randint(0, len(text))
        if rng.random() < 0.5:
            return kind, text[:at] + rng.choice(["{", "}", "{\n", "(", "fn f("]) + text[at:]
        braces = [m.start() for m in re.finditer(r"[{}]", text)]
        if braces:
            b = rng.choice(braces)
            return kind, text[:b] + text[b + 1 :]
    if kind == "move":
        f = rng.choice(fns)
        chunk = text[line_start(text, f["start"]) : f["end"]] + "\n"
        rest = text[: line_start(text, f["start"])] + text[f["end"] + 1 :]
        others = [g for g in structure(rest)[1] if g["module"] == f["module"]] or structure(rest)[1]
        if others:
            g = rng.choice(others)
            at = line_start(rest, g["start"]) if rng.random() < 0.5 else g["end"] + 1
            return kind, rest[:at] + ("\n" if at > g["end"] else "") + chunk + rest[at:]
    if kind == "rename" and any(f["params"] for f in fns):
        f = rng.choice([f for f in fns if f["params"]])
        name, _, _ = rng.choice(f["params"])
        new = rng.choice([name + "2", "y", "x", "h"])
        seg = text[f["start"] : f["end"]]
        seg = re.sub(rf"\b{re.escape(name)}\b", new, seg)
        return kind, text[: f["start"]] + seg + text[f["end"] :]
    if kind == "duplicate":
        f = rng.choice(fns)
        chunk = text[line_start(text, f["start"]) : f["end"]]
        return kind, text[: f["end"]] + "\n\n" + chunk + text[f["end"] :]
    if kind == "delete_fn":
        f = rng.choice(fns)
        return kind, text[: line_start(text, f["start"])] + text[f["end"] + 1 :]
    if kind == "paste_other" and len(mods) > 1:
        f = rng.choice(fns)
        chunk = text[line_start(text, f["start"]) : f["end"]]
        target = rng.choice([m for m in mods if m[0] != f["module"]])
        at = target[2] - 1  # before the module's closing brace
        return kind, text[:at] + "\n" + chunk + "\n" + text[at:]
    at = rng.randint(0, len(text))
    end = min(len(text), at + rng.randint(0, 20))
    return "anywhere", text[:at] + rng.choice(SNIPPETS + [""]) + text[end:]


def changed_region(old, new):
    i = 0
    n = min(len(old), len(new))
    while i < n and old[i] == new[i]:
        i += 1
    return i


IMPORTERS = {"llama.linnet": ["mistral.linnet", "qwen3.linnet"]}
REUSED = [0, 0]  # (function-level rechecks that gave a result, that gave up)


def _count_reuse():
    from linnet.semantics import fn_reuse

    inner = fn_reuse.recheck_body

    def counted(*a, **k):
        out = inner(*a, **k)
        REUSED[out is None] += 1
        return out

    fn_reuse.recheck_body = counted


def _differ(a: dict, b: dict, what: str, log) -> bool:
    """Log the first keys where the incremental views `a` and the fresh views `b` differ; whether they do."""
    diff = [k for k in a if a[k] != b.get(k)]
    if diff:
        log(f"DIFF {what} keys {diff[:6]}")
        for k in diff[:3]:
            log(f"  {k}\n    incremental: {str(a[k])[:1500]}\n    fresh:       {str(b[k])[:1500]}")
    return bool(diff)


def run_sequence(rng, path, original, steps, presets, n_offsets, log, trace=None, lower=False):
    """Random edits of `original` at `path` analysed in one workspace, each compared with a fresh one; None, or (the
    text, the edits, the texts before) at the first difference. `trace` (a list) gets every analysis made in the
    incremental workspace: (path, text, preset, partial), to replay. `lower`: compare the lowered model too."""
    trace = [] if trace is None else trace
    ws = Workspace()
    importers = [str(ROOT / "examples" / name) for name in IMPORTERS.get(Path(path).name, [])]
    text = original
    history = []
    edits = []
    preset = rng.choice(presets)
    ws.open(path, text).analyze(preset)
    trace.append((path, text, preset, False))
    for step in range(steps):
        kind, new = random_edit(rng, text, original, history)
        at = changed_region(text, new)
        edits.append((kind, at, len(text), len(new)))
        history.append(text)
        history = history[-6:]
        text = new
        if rng.random() < 0.15:
            preset = rng.choice(presets)
        if rng.random() < 0.2:  # several edits before one analysis (typing faster than the checker)
            continue
        if rng.random() < 0.15:  # the server's first pass over a file: its first items as if the file ended there
            cut = next((o for o, _ in split_items(text) if o >= rng.randint(0, len(text))), len(text))
            ws.open(path, text[:cut]).analyze(preset, only=lambda item: True)
            trace.append((path, text[:cut], preset, True))
            edits.append(("prefix", cut, len(text), cut))
        inc = ws.open(path, text).analyze(preset)
        trace.append((path, text, preset, False))
        fresh_ws = Workspace()
        fresh = fresh_ws.open(path, text).analyze(preset)
        for imp in importers:  # a file importing the edited one, analysed after the edit in the same workspace
            source = Path(imp).read_text()
            a = views(ws.open(imp, source).analyze(), source, None, range(0, len(source), 97), lower)
            trace.append((imp, source, None, False))
            b = views(fresh_ws.open(imp, source).analyze(), source, None, range(0, len(source), 97), lower)
            if _differ(a, b, f"importer {imp} of {path} step {step} kinds {[e[0] for e in edits]}", log):
                return text, edits, history
        offsets = sorted(
            {rng.randint(0, len(text)) for _ in range(n_offsets)}
            | set(range(max(0, at - 40), min(len(text), at + 40), 3))
        )
        a, b = views(inc, text, preset, offsets, lower), views(fresh, text, preset, offsets, lower)
        if _differ(a, b, f"{path} step {step} preset {preset} kinds {[e[0] for e in edits]}", log):
            return text, edits, history
    return None


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sequences", type=int, default=10)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--files", default="llama,gpt2,modernbert,autoencoder_kl,qwen3,whisper,bert,mistral")
    p.add_argument("--bigdoc", type=int, default=0, help="copies of the big document (0: none)")
    p.add_argument("--offsets", type=int, default=30)
    p.add_argument("--save", default="")
    p.add_argument("--lower", action="store_true", help="also compare the root model's Core IR (cost hover, hints)")
    args = p.parse_args(argv)
    _count_reuse()
    sources = [
        (str(ROOT / "examples" / f"{n}.linnet"), (ROOT / "examples" / f"{n}.linnet").read_text())
        for n in args.files.split(",")
        if n
    ]
    if args.bigdoc:
        sys.path.insert(0, str(ROOT / "bench"))
        from bigdoc_source import big_source

        sources.append(("big.linnet", big_source(args.bigdoc)))
    found = 0
    t0 = time.time()
    for seq in range(args.sequences):
        rng = random.Random(args.seed * 100003 + seq)
        path, original = rng.choice(sources)
        presets = [None] + sorted(set(re.findall(r"^preset (\w+)", original, re.M)))
        bad = run_sequence(rng, path, original, args.steps, presets, args.offsets, print, lower=args.lower)
        if bad is not None:
            found += 1
            if args.save:
                Path(args.save).mkdir(parents=True, exist_ok=True)
                text, edits, history = bad
                name = f"{args.save}/seed{args.seed}_seq{seq}"
                Path(name + ".final.linnet").write_text(text)
                for i, h in enumerate(history):
                    Path(f"{name}.prev{i}.linnet").write_text(h)
        name = Path(path).name
        print(f"seq {seq} {name} done ({time.time() - t0:.0f} s, {found} with differences, reuse {REUSED})", flush=True)
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
