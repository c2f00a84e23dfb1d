"""The porting-mistake suite: every row of tests/porting/catalogue.py applied to its family's shipped source is caught
by the layer the row names (`check`, `verify` or `diff`), and a row marked "none" is caught by none of the layers this
tree has (the claim that no layer can catch it stays honest); every family's unmutated source passes all three (no
false alarm). The shrunk checkpoints are built once per family (tests/porting/checkpoints.py) and the reference model
loaded once with them.

Rows that rely on issue 40's other layers (the checker's unused-parameter warning, `linnet verify`) are skipped with
that reason until those are in the tree. `python -m tests.porting.tally` prints the count each layer catches."""

from __future__ import annotations

import pytest

from tests.porting.catalogue import MUTATIONS
from tests.porting.checkpoints import FAMILIES, source
from tests.porting.layers import (
    LayerMissing,
    check_findings,
    copied_source,
    diff_findings,
    has_unused_warning,
    mutated_source,
    verify_findings,
)

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_torch_thread")]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """family -> (folder, reference model, the unmutated source's check findings), built on first use."""
    from tests.porting.checkpoints import build

    made: dict = {}

    def get(family: str):
        if family not in made:
            if FAMILIES[family][0] == "diffusers":
                pytest.importorskip("diffusers")
            folder = tmp_path_factory.mktemp(family)
            model = build(family, folder)
            made[family] = (folder, model, check_findings(source(family), folder))
        return made[family]

    return get


def _param(m):
    marks = [pytest.mark.slow] if m.slow else []
    return pytest.param(m, id=m.id, marks=marks)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_unmutated_source_passes_every_layer(checkpoints, family, tmp_path):
    folder, model, baseline = checkpoints(family)
    path = copied_source(family, tmp_path)
    assert baseline == set(), f"{family}: linnet check finds {baseline}"
    assert diff_findings(path, folder, FAMILIES[family][0], model) == set()
    try:
        assert verify_findings(path, folder) == set()
    except LayerMissing:
        pass  # checked once `linnet verify` is in the tree


@pytest.mark.parametrize("m", [_param(m) for m in MUTATIONS])
def test_mutation_is_caught_by_its_layer(checkpoints, m, tmp_path):
    folder, model, baseline = checkpoints(m.family)
    path = mutated_source(m, tmp_path)
    if m.needs == "unused-warning" and not has_unused_warning():
        pytest.skip("needs the checker's unused-parameter warning (issue 40's layer 1, branch issue40-checker)")
    library = FAMILIES[m.family][0]
    try:
        if m.layer == "check":
            assert check_findings(path, folder, baseline), f"{m.id}: linnet check finds nothing"
        elif m.layer == "verify":
            assert verify_findings(path, folder), f"{m.id}: linnet verify finds nothing"
        elif m.layer == "diff":
            assert check_findings(path, folder, baseline) == set(), f"{m.id}: check catches it; name that layer"
            assert diff_findings(path, folder, library, model), f"{m.id}: linnet diff finds nothing"
        else:
            assert m.layer == "none" and m.why
            assert check_findings(path, folder, baseline) == set()
            assert diff_findings(path, folder, library, model) == set()
    except LayerMissing as why:
        pytest.skip(str(why))
