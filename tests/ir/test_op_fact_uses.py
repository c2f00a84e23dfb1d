"""The IR reads two facts of each op from its registry entry, and nowhere else: `view` (the cost
model's peak-activation estimate gives the result no bytes) and `reshapes` (generated code notes
the result's shape beside the statement). Each op, run alone, is costed and rendered as its entry
says; the sets are pinned so that changing a fact is a decision, not an accident."""

from __future__ import annotations

import numpy as np
import pytest

from linnet.ir.cost import is_view, peak_bytes
from linnet.ir.render import GraphEmitter, reshapes, shape_text
from linnet.ops import REGISTRY
from tests.compiler.op_cases import case, single_op_graph

# Layout ops and basic indexing return views of `x` in PyTorch. `concat` copies; `split` gives
# several results, which `view` (of one result) does not cover: the estimate counts its pieces.
VIEWS = {"reshape", "transpose", "permute", "unsqueeze", "squeeze", "expand", "rearrange", "select", "slice"}
# Ops whose point is their result's shape; indexing (`slice`, `select`, `take`) and
# `repeat_interleave` get no note.
RESHAPING = {"reshape", "rearrange", "expand", "permute", "transpose", "squeeze", "unsqueeze", "concat", "split"}
NOT_ACTIVATIONS = {"cache_write"}  # writes state: the estimate counts no activation for it either way


def one_op(name: str):
    """The op `name` alone in a graph, on one of its drawn cases."""
    tensors, const = case(name, np.random.default_rng(0), (2, 3))
    graph, _, _ = single_op_graph(name, tensors, const)
    (op,) = graph.ops
    return graph, op


def test_the_facts_are_the_pinned_sets():
    assert {name for name, op in REGISTRY.items() if op.view} == VIEWS
    assert {name for name, op in REGISTRY.items() if op.reshapes} == RESHAPING


def test_a_view_is_of_one_result_of_its_argument_x():
    for name in VIEWS:
        graph, op = one_op(name)
        assert len(op.results) == 1 and op.args["x"] in graph.inputs, name


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_the_cost_model_counts_an_op_as_its_entry_says(name):
    """A view adds no bytes to the peak; any other op's results are buffers of their own."""
    graph, op = one_op(name)
    assert is_view(op) == REGISTRY[name].view
    if name in NOT_ACTIVATIONS:
        return
    made = peak_bytes(graph, {})
    assert (made == 0) == REGISTRY[name].view, f"{name}: peak {made} bytes"


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_the_renderer_notes_a_shape_as_the_entry_says(name):
    """The statement of an op that reshapes ends with its result's shape (one result only); others don't."""
    _, op = one_op(name)
    assert reshapes(op) == REGISTRY[name].reshapes
    (line,) = GraphEmitter().commented(["y = f(x)"], op)
    noted = len(op.results) == 1 and REGISTRY[name].reshapes
    assert line == (f"y = f(x)  # {shape_text(op.result)}" if noted else "y = f(x)"), name
