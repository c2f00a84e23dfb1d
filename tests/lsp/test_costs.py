"""`linnet/lsp/costs.py` without a client: what it says when lowering raises (the hovers through a real client
are in test_cost_hover.py)."""

from __future__ import annotations

import pytest

from linnet.ir.verify import VerifyError
from linnet.lsp import costs
from linnet.semantics.program import Document

from .conftest import EXAMPLES


def test_what_lowering_raises_is_said_or_left_to_the_guard(monkeypatch):
    """Bad input (LinnetError, ValueError) and Core IR that breaks an invariant (VerifyError, a bug) are said; any
    other exception is a bug the request's guard logs, not swallowed here."""

    def raising(err):
        def lower(analysis, preset):
            raise err

        return lower

    text = (EXAMPLES / "mlp.linnet").read_text(encoding="utf-8")
    analysis = Document(str(EXAMPLES / "mlp.linnet"), text).analyze()
    monkeypatch.setattr(costs, "lower_analysis", raising(VerifyError("op 3 uses %x before it is defined")))
    assert costs.costs_of(analysis, "tiny") is None
    assert costs.not_lowered(analysis, "tiny") == (
        "the Core IR it lowers to is not valid (op 3 uses %x before it is defined): a bug in Linnet; please report it"
    )
    monkeypatch.setattr(costs, "lower_analysis", raising(KeyError("a bug")))
    with pytest.raises(KeyError):
        costs.costs_of(analysis, None)
