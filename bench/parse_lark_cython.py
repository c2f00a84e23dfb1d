"""lark-cython against lark on Linnet's grammar (issue 45): writes bench/results/parse_lark_cython.{json,md}.

lark-cython (PyPI `lark-cython`, a lark plugin: `Lark(..., _plugins=lark_cython.plugins)`) reimplements lark's LALR
parser loop and basic lexer in Cython. Linnet's parser (linnet/syntax/lalr.py) uses two things the plugin lacks:

- a post-lexer (`_NewlinePostLex`: newlines inside ( ) and [ ] dropped, runs of newlines collapsed). The plugin's
  README says post-lexers are not implemented; with lark 1.3.1 the plugin's `LexerThread.from_text` asks lark's
  `PostLexConnector` for `make_lexer_state`, which it has not: every parse raises AttributeError (`plain`, below).
- keywords demoted to names where the parser cannot take them (`_KeywordLexer`, a subclass of lark's pure-Python
  `BasicLexer`): the plugin's parser takes only its own `Token` class, which lark's lexer does not make.

So this script gives the plugin a `LexerThread` of its own (`_LinnetThread`, the plugin's one extension point that is
Python): it pulls tokens from the plugin's Cython lexer and does both jobs in Python, one call per token. The
plugin's tokens are not `str` subclasses (`builder.py` checks `isinstance(x, Token)`): for the comparison the
builder is told of that class too. Every item of the document (bench/bigdoc_source.py's `--copies` copies of
llama.linnet, and examples/*.linnet) is parsed both ways: the ASTs built (their `repr`) and the errors (type and
position) must be equal, and each way's CPU seconds (best of `--repeat`, `time.process_time`, the collector off)
are recorded for lark's parse alone and for the parse plus the AST build, with the CPU wait (Linux PSI avg10)
around each. Needs `pip install lark-cython==0.0.17`; without it the script says so and stops.

What bounds the gain (2026-12-06, 100 copies): lark's Python tree builder runs once per reduction whatever drives it.
With every token kept in Cython (the plugin's contextual lexer, and the post-lexer's work done on the text first:
newlines inside ( ) and [ ] and comments blanked) lark's parse was still only 1.36x faster. lark-rust 0.2.1 (a
plugin of the same shape) is no way out: with this thread it lexed a string literal as a FLOAT, and all but 5 of
the 1,238 items failed to parse.

Run: `python bench/parse_lark_cython.py [--copies 100] [--repeat 3] [--out PATH]`. Timings live here, never in tests.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

from bigdoc_source import big_source  # noqa: E402


class _LinnetThread:
    """lark-cython's `LexerThread` with Linnet's post-lexer and contextual keywords (linnet/syntax/lalr.py)."""

    keywords: frozenset = frozenset()

    def __init__(self, lexer, state):
        self.lexer, self.state, self.stack, self.last_nl = lexer, state, [], True

    @classmethod
    def from_text(cls, lexer, text):
        return cls(lexer, lexer.make_lexer_state(text))

    def next_token(self, parser_state):
        while True:
            tok = self.lexer.next_token(self.state, parser_state)
            kind = tok.type
            if kind == "_NL":
                if (self.stack and self.stack[-1] != "LBRACE") or self.last_nl:
                    continue
                self.last_nl = True
                return tok
            self.last_nl = False
            if kind in self.keywords:
                actions = parser_state.parse_conf.parse_table.states[parser_state.position]
                if kind not in actions and "NAME" in actions:
                    tok.type = "NAME"
            elif kind in ("LPAR", "LSQB", "LBRACE"):
                self.stack.append(kind)
            elif kind in ("RPAR", "RSQB", "RBRACE") and self.stack:
                self.stack.pop()
            return tok


def parsers():
    """(lark's parser as Linnet builds it, the lark-cython one with `_LinnetThread`, the plain plugin's failure)."""
    import lark_cython
    from lark import Lark

    from linnet.syntax import lalr

    grammar = lalr.GRAMMAR_PATH.read_text()
    common = {"parser": "lalr", "start": "item_source", "maybe_placeholders": True, "cache": True}
    cython = Lark(grammar, lexer="basic", _plugins=dict(lark_cython.plugins, LexerThread=_LinnetThread), **common)
    _LinnetThread.keywords = frozenset(
        t.name for t in cython.terminals if t.pattern.type == "str" and t.pattern.value.isidentifier()
    )
    plain = Lark(grammar, lexer="basic", postlex=lalr._NewlinePostLex(), _plugins=lark_cython.plugins, **common)
    try:
        plain.parse("fn f() {\n}\n")
        plain_error = None
    except Exception as err:  # noqa: BLE001 - what the plain plugin does is the finding
        plain_error = f"{type(err).__name__}: {err}"
    return lalr.lark_parser(), cython, plain_error


def item_texts(copies: int) -> list[str]:
    from linnet.syntax.items import split_items
    from linnet.syntax.positions import lexable

    sources = [big_source(copies)] + [
        p.read_text(encoding="utf-8") for p in sorted((ROOT / "examples").glob("*.linnet"))
    ]
    return [lexable(text) for source in sources for _, text in split_items(source)]


def run(parser, texts: list[str]) -> tuple[float, list, list]:
    """Parse every text: (CPU seconds, the trees of those that parsed, each text's error or None)."""
    trees, errors = [], []
    t0 = time.process_time()
    for text in texts:
        try:
            trees.append(parser.parse(text))
            errors.append(None)
        except Exception as err:  # noqa: BLE001 - lark's errors, compared between the two
            token = getattr(err, "token", None)
            errors.append((type(err).__name__, getattr(token, "type", None), getattr(err, "pos_in_stream", None)))
    return time.process_time() - t0, trees, errors


def measure(copies: int, repeat: int) -> dict:
    from lark_cython import lark_cython as compiled
    from lsp_latency import pressure_snapshot

    from linnet.syntax import builder

    gc.disable()
    texts = item_texts(copies)
    pure, cython, plain_error = parsers()
    builder.Token = (builder.Token, compiled.Token)  # the plugin's tokens are no `str`: the builder checks both
    rows = {}
    for name, parser in (("lark", pure), ("lark_cython", cython)):
        best_parse = best_total = float("inf")
        before = pressure_snapshot()
        for _ in range(repeat):
            parse_s, trees, errors = run(parser, texts)
            t0 = time.process_time()
            built = [repr(builder.build(t)) for t in trees]
            best_parse, best_total = min(best_parse, parse_s), min(best_total, parse_s + time.process_time() - t0)
        rows[name] = {
            "parse_cpu_s": best_parse,
            "parse_and_build_cpu_s": best_total,
            "parsed": len(trees),
            "failed": sum(e is not None for e in errors),
            "pressure_before": before,
            "pressure_after": pressure_snapshot(),
            "_built": built,
            "_errors": errors,
        }
    same_trees = rows["lark"].pop("_built") == rows["lark_cython"].pop("_built")
    same_errors = rows["lark"].pop("_errors") == rows["lark_cython"].pop("_errors")
    return {
        "copies": copies,
        "items": len(texts),
        "repeat": repeat,
        "plain_plugin_error": plain_error,
        "same_trees": same_trees,
        "same_errors": same_errors,
        "rows": rows,
        "parse_speedup": rows["lark"]["parse_cpu_s"] / rows["lark_cython"]["parse_cpu_s"],
        "parse_and_build_speedup": rows["lark"]["parse_and_build_cpu_s"] / rows["lark_cython"]["parse_and_build_cpu_s"],
    }


def markdown(result: dict) -> str:
    lines = [
        "# lark-cython against lark on Linnet's grammar",
        "",
        f"Written by `bench/parse_lark_cython.py` ({result['when']}) at {result['git']['commit'][:10]}, lark "
        f"{result['versions']['lark']}, lark-cython {result['versions']['lark_cython']}. Machine: "
        f"{result['machine'].get('processor')}, {result['machine'].get('cpus')} CPUs. {result['items']} items "
        f"({result['copies']} copies of the big document's llama.linnet, and examples/), CPU seconds, best of "
        f"{result['repeat']}; CPU wait is Linux PSI avg10 before / after each row.",
        "",
        f"The plugin as its README says to use it, with Linnet's post-lexer: `{result['plain_plugin_error']}`. "
        f"With `_LinnetThread`: the same trees {result['same_trees']}, the same errors {result['same_errors']}.",
        "",
        "| parser | items parsed | items failing | lark's parse s | parse and AST build s | CPU wait % |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for name, r in result["rows"].items():
        wait = f"{r['pressure_before'].get('avg10', '?')} / {r['pressure_after'].get('avg10', '?')}"
        lines.append(
            f"| {name} | {r['parsed']} | {r['failed']} | {r['parse_cpu_s']:.2f} | {r['parse_and_build_cpu_s']:.2f} "
            f"| {wait} |"
        )
    lines += [
        "",
        f"lark-cython is {result['parse_speedup']:.2f}x lark on the parse, {result['parse_and_build_speedup']:.2f}x "
        "on the parse and the build.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "parse_lark_cython.json")
    args = parser.parse_args()
    try:
        import lark_cython  # noqa: F401
    except ImportError:
        raise SystemExit("lark-cython is not installed: pip install lark-cython==0.0.17") from None
    from importlib.metadata import version

    from generate_speed import machine
    from lsp_latency import git_state

    result = {
        "machine": machine(),
        "git": git_state(),
        "when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "versions": {"lark": version("lark"), "lark_cython": version("lark-cython")},
        **measure(args.copies, args.repeat),
    }
    print(json.dumps(result, indent=2))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    args.out.with_suffix(".md").write_text(markdown(result), encoding="utf-8")


if __name__ == "__main__":
    main()
