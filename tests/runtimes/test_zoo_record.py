"""`record` (tests/runtimes/conftest.py): the parity tests' distances kept for docs/zoo.md."""

from __future__ import annotations

import json

from tests.runtimes import conftest


def recorded(path):
    return [(r["model"], r["backend"], r["what"], r["max_abs_diff"]) for r in json.loads(path.read_text())["rows"]]


def test_without_the_variable_nothing_is_written(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv(conftest.RECORD_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    conftest.record("logits", 1e-6, model="mistral", backend="torch", checkpoint="seeded")
    assert list(tmp_path.iterdir()) == []
    assert "max|Δ| logits: 1.000e-06" in capsys.readouterr().out


def test_rows_are_kept_and_a_rerun_of_a_test_file_replaces_its_rows(tmp_path, monkeypatch):
    out = tmp_path / "zoo.json"
    monkeypatch.setenv(conftest.RECORD_ENV, str(out))
    monkeypatch.setattr(conftest, "_recorded_files", set())
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "tests/runtimes/test_parity_a.py::test_x[torch] (call)")
    conftest.record("logits", 2e-6, model="a", backend="torch", checkpoint="seeded")
    conftest.record("step", 1e-7, model="a", backend="torch", checkpoint="seeded", against="forward")
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "tests/runtimes/test_parity_b.py::test_y (call)")
    conftest.record("logits", 3e-6, model="b", backend="jax", checkpoint="seeded")
    # sorted by model, checkpoint, backend, reference (the cache against `forward` first), what
    assert recorded(out) == [("a", "torch", "step", 1e-7), ("a", "torch", "logits", 2e-6), ("b", "jax", "logits", 3e-6)]
    row = json.loads(out.read_text())["rows"][1]
    assert row["test"] == "tests/runtimes/test_parity_a.py::test_x[torch]" and row["against"] == "transformers"

    # Another process reruns test_parity_a.py: its old rows go (the renamed "step" row does not linger), b's stay.
    monkeypatch.setattr(conftest, "_recorded_files", set())
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "tests/runtimes/test_parity_a.py::test_x[torch] (call)")
    conftest.record("logits", 4e-6, model="a", backend="torch", checkpoint="seeded")
    assert recorded(out) == [("a", "torch", "logits", 4e-6), ("b", "jax", "logits", 3e-6)]
