"""Everything about an op is on its registry entry, and what is generated from the entries is
in place: a test here fails when an op is added without its numpy reference, its case
generator, its row in docs/language.md's op table, or its keyword in the editors' grammars
(test_op_coverage.py does the backends' lowerings). The case generators draw what the rules
describe: on every drawn case the shape and dtype rules say what the reference produces."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from linnet import docgen
from linnet.ops import REGISTRY, OpDef, OpParam
from linnet.ops.registry import KINDS
from tests.compiler.op_cases import NP, case, reference, single_op_graph
from tests.conftest import ROOT

LANGUAGE_DOC = (ROOT / "docs" / "language.md").read_text(encoding="utf-8")
TEXTMATE = ROOT / "vscode-extension" / "syntaxes" / "linnet.tmLanguage.json"
VIM = ROOT / "editors" / "nvim" / "syntax" / "linnet.vim"


def textmate_builtins() -> set[str]:
    """The names the checked-in TextMate grammar highlights as builtin functions."""
    rules = docgen.grammar_rules(json.loads(TEXTMATE.read_text()))
    (pattern,) = [p for p in rules if p.get("name") == docgen.TEXTMATE_BUILTIN]
    return set(re.fullmatch(r"\\b\(\?:(.*)\)\\b", pattern["match"]).group(1).split("|"))


def vim_builtins() -> set[str]:
    """The names the checked-in Vim syntax highlights as builtins (`linnetBuiltin`)."""
    lines = [line for line in VIM.read_text().split("\n") if line.startswith(docgen.VIM_BUILTIN)]
    return {name for line in lines for name in re.search(r"\\%\((.*)\\\)\\ze", line).group(1).split("\\|")}


def missing_facts(op: OpDef) -> list[str]:
    """What the entry (or what is generated from it) lacks, one line each."""
    missing = []
    if op.reference is None:
        missing.append("a numpy reference (`reference=`): the op's living definition")
    if op.cases is None:
        missing.append("a case generator (`cases=`, see linnet/ops/cases.py): the backends' op tests draw from it")
    if len(op.doc) <= 15 or not op.doc.rstrip().endswith((".", ")")):
        missing.append("a doc of a sentence or more")
    if any(p.kind not in KINDS for p in op.params):
        missing.append(f"parameter kinds among {', '.join(KINDS)}")
    if op.docs_row() not in LANGUAGE_DOC.split("\n"):
        missing.append("its row in docs/language.md's op table: run `make docs`")
    for editor, names in (("TextMate", textmate_builtins()), ("Vim", vim_builtins())):
        if op.keyword and op.name not in names:
            missing.append(f"its keyword in the {editor} grammar: run `make docs`")
        if not op.keyword and op.name in names:
            missing.append(f"the {editor} grammar highlights it although it is no keyword: run `make docs`")
    return missing


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_op_has_its_facts(name):
    missing = missing_facts(REGISTRY[name])
    assert not missing, f"op `{name}` lacks:\n" + "\n".join(missing)


def test_an_op_without_its_facts_is_caught(monkeypatch):
    """A new entry with no reference, cases, docs row or keyword is refused, each named; once
    registered, `make docs` would write its row and keyword."""
    new = OpDef("frobnicate", [OpParam("x", "tensor")], "Frobnicates each element.", lambda a: None, lambda a: None)
    assert missing_facts(new) == [
        "a numpy reference (`reference=`): the op's living definition",
        "a case generator (`cases=`, see linnet/ops/cases.py): the backends' op tests draw from it",
        "its row in docs/language.md's op table: run `make docs`",
        "its keyword in the TextMate grammar: run `make docs`",
        "its keyword in the Vim grammar: run `make docs`",
    ]
    monkeypatch.setitem(REGISTRY, "frobnicate", new)
    assert "| `frobnicate(x: tensor)` | Frobnicates each element. |" in docgen.language_doc(LANGUAGE_DOC)
    assert "|frobnicate|" in docgen.textmate_grammar(TEXTMATE.read_text())
    assert "\\|frobnicate\\|" in docgen.vim_syntax(VIM.read_text())


def test_signatures_read_as_linnet():
    assert REGISTRY["slice"].signature() == "slice(x: tensor, dim: index, start: int = none, stop: int = none)"
    assert REGISTRY["sum"].signature() == "sum(x: tensor, dim: index = -1, keepdim: bool = false)"
    assert REGISTRY["rearrange"].signature() == "rearrange(x: tensor, pattern: str, name=size, ...)"
    assert REGISTRY["add"].docs_row() == "| `add(x: operand, y: operand)` (`+`) | Elementwise sum with broadcasting. |"


@pytest.mark.parametrize("name", sorted(REGISTRY))
@settings(max_examples=10, deadline=None)
@given(shape=st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple), seed=st.integers(0, 2**16))
def test_cases_are_what_the_rules_describe(name, shape, seed):
    """On each drawn case, the rules' result types are the reference's shapes and dtypes (no
    backend involved: this holds the generators and the rules to the numpy definition)."""
    tensors, const = case(name, np.random.default_rng(seed), shape)
    _, types, _ = single_op_graph(name, tensors, const)
    out = reference(name, tensors, const)
    outs = [np.asarray(o) for o in (out if isinstance(out, (tuple, list)) else [out])]
    assert [(tuple(d.as_int() for d in t.shape.dims), np.dtype(NP[t.dtype])) for t in types] == [
        (o.shape, o.dtype) for o in outs
    ]
