"""docs/zoo.md (`linnet.zoo_page`): the tables it builds from recorded rows, and the recorded file against the
parity tests (tests/test_docs.py holds the page itself to what the generator makes of the examples)."""

from __future__ import annotations

import json

from linnet import zoo_page
from tests.conftest import EXAMPLES, ROOT


def row(model, backend, delta, against="transformers", checkpoint="seeded 2-layer"):
    return dict(model=model, checkpoint=checkpoint, backend=backend, against=against, what="", test="t.py::x",
                max_abs_diff=delta)  # fmt: skip


RECORDED = zoo_page.distances(
    [
        row("mistral", "onnxruntime", 3e-6),
        row("mistral", "torch", 2e-6),
        row("mistral", "torch", 5e-6),
        row("mistral", "jax", 9e-1, against="forward"),  # a cache row: not a distance from transformers
        row("gpt2", "torch", 1e-6, checkpoint="other"),
    ]
)


def test_presets_table_names_backends_in_registry_order_and_the_largest_distance():
    lines = zoo_page.presets_table(RECORDED)
    mistral = [line for line in lines if line.startswith("| `mistral` |")]
    assert mistral == [
        "| `mistral` | `mistral_7b_instruct_v0_3` | 7,248,023,552 | torch, onnxruntime | 5.0e-06 |",
        "| `mistral` | `mistral_7b_v0_1` | 7,241,732,096 | torch, onnxruntime | 5.0e-06 |",
    ]
    assert any(line.startswith("| `llama` | `smollm2_135m` | 134,515,008 | — | — |") for line in lines)
    assert not any(line.startswith("| `mlp` |") for line in lines)  # a teaching example, not a zoo entry


def test_distance_table_has_a_column_per_backend_run_and_a_row_per_reference():
    lines = zoo_page.distance_table(RECORDED)
    assert lines[0] == "| model | checkpoint measured | against | torch | jax | onnxruntime |"
    assert "| `mistral` | seeded 2-layer | transformers | 5.0e-06 | — | 3.0e-06 |" in lines
    assert "| `mistral` | seeded 2-layer | cached decode vs forward | — | 9.0e-01 | — |" in lines
    assert zoo_page.distance_table({}) == [f"No distances recorded yet (`{zoo_page.PARITY}` is missing or empty)."]


def test_every_zoo_source_is_listed_with_each_preset():
    page = (ROOT / "docs" / "zoo.md").read_text(encoding="utf-8")
    for path in zoo_page.zoo_sources():
        assert f"| `{path.stem}` |" in page
    assert {p.stem for p in zoo_page.zoo_sources()} >= {"llama", "gpt2", "bert", "mistral", "phi3"}


def test_every_family_with_parity_tests_has_recorded_distances():
    """A family's parity tests call `record` (tests/runtimes/conftest.py), and the committed results hold their
    rows: a new test_parity_<model_type>.py must record, and its rows be recorded before the page is regenerated
    (`LINNET_RECORD_ZOO=bench/results/zoo_parity.json pytest tests/runtimes -m ""`, then `make docs`)."""
    rows = json.loads((ROOT / zoo_page.PARITY).read_text(encoding="utf-8"))["rows"]
    recorded = {r["model"] for r in rows}
    families = {p.stem.removeprefix("test_parity_") for p in (ROOT / "tests" / "runtimes").glob("test_parity_*.py")}
    assert {f for f in families if (EXAMPLES / f"{f}.linnet").is_file()} <= recorded
    assert recorded <= {p.stem for p in zoo_page.zoo_sources()}
    for r in rows:
        assert set(r) == {"model", "checkpoint", "backend", "against", "what", "test", "max_abs_diff"}
        assert r["test"].startswith("tests/runtimes/test_parity_"), r["test"]
