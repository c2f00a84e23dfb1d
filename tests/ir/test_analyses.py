"""The analyses loading keeps (linnet/ir/analyses.py): the same text checked again in a process is not analysed
again, unless a file it imports changed on disk since; an analysis with errors is not kept."""

from __future__ import annotations

import pytest

from linnet.errors import SourceError
from linnet.ir.analyses import forget_analyses
from linnet.ir.build import bind_config, check_source, lower_program
from tests.conftest import EXAMPLES

LIB = """config MlpConfig {
    in_features: int = 16
    hidden_features: int = 64
}
"""
MODEL = """from "./lib.linnet" import MlpConfig

preset tiny = MlpConfig { in_features = 8 }

model Mlp(c: MlpConfig) {
    fc1: Linear(c.in_features, c.hidden_features)

    entry fn forward(x: [B, c.in_features]) -> [B, c.hidden_features] {
        fc1(x)
    }
}
"""


@pytest.fixture(autouse=True)
def fresh():
    forget_analyses()
    yield
    forget_analyses()


def test_the_same_text_is_analysed_once():
    text = (EXAMPLES / "mlp.linnet").read_text(encoding="utf-8")
    first = check_source("mlp.linnet", text, "tiny")
    again = check_source("mlp.linnet", text, "tiny")
    assert again.analysis is first.analysis and again is not first  # SourceInfo is the caller's to change
    assert check_source("mlp.linnet", text, None).analysis is not first.analysis  # another preset
    assert check_source("mlp.linnet", text + "\n", "tiny").analysis is not first.analysis  # another text
    bound = bind_config(first, {"hidden_features": 48})
    assert bind_config(again, {"hidden_features": 48}).analysis is bound.analysis


def test_an_import_changed_on_disk_is_read_again(tmp_path):
    (tmp_path / "lib.linnet").write_text(LIB, encoding="utf-8")
    path = str(tmp_path / "model.linnet")
    first = check_source(path, MODEL, "tiny")
    assert lower_program(first, "f32", 1, 8).config["hidden_features"] == 64
    (tmp_path / "lib.linnet").write_text(LIB.replace("= 64", "= 40"), encoding="utf-8")
    changed = check_source(path, MODEL, "tiny")
    assert changed.analysis is not first.analysis
    assert lower_program(changed, "f32", 1, 8).config["hidden_features"] == 40
    (tmp_path / "lib.linnet").unlink()  # gone: the import's error, not the kept analysis
    with pytest.raises(SourceError, match="lib.linnet"):
        check_source(path, MODEL, "tiny")


def test_an_analysis_with_errors_is_not_kept(tmp_path):
    path = str(tmp_path / "model.linnet")
    with pytest.raises(SourceError):  # lib.linnet is not there yet
        check_source(path, MODEL, "tiny")
    (tmp_path / "lib.linnet").write_text(LIB, encoding="utf-8")
    assert lower_program(check_source(path, MODEL, "tiny"), "f32", 1, 8).config["in_features"] == 8


def test_another_thread_gets_its_own_analysis():
    """The language server lowers in worker threads: two never share one analysis (lowering fills its caches)."""
    from concurrent.futures import ThreadPoolExecutor

    text = (EXAMPLES / "mlp.linnet").read_text(encoding="utf-8")
    mine = check_source("mlp.linnet", text, "tiny").analysis
    with ThreadPoolExecutor(1) as pool:
        theirs = pool.submit(lambda: check_source("mlp.linnet", text, "tiny").analysis).result()
    assert theirs is not mine and check_source("mlp.linnet", text, "tiny").analysis is mine
