"""linnet/lsp/published.py: the diagnostics a start published for a document as opened, kept between starts. Real
analyses (the front end, as the server runs it) and real LSP diagnostics (lsprotocol's classes); the reference is a
fresh check of the same text."""

from __future__ import annotations

import os
import pickle
import shutil

from linnet.lsp.cachefile import write_atomic
from linnet.lsp.convert import published_diagnostics
from linnet.lsp.published import PublishedCache, code_stamp, read_stamps
from linnet.semantics.program import Workspace
from tests.conftest import ROOT

WORKSPACE = ROOT / "tests" / "lsp" / "workspace"
SETTINGS = (None, "utf-16")


def never_open(path: str) -> bool:
    return False


def checked(path) -> tuple[list, list]:
    """The diagnostics a server publishes for the file at `path` as on disk, and the files its analysis read
    besides with their stamps as read (what the server records)."""
    workspace = Workspace()
    analysis = workspace.open(str(path), path.read_text(encoding="utf-8")).analyze(None)
    return published_diagnostics(analysis.diagnostics, str(path)), read_stamps(workspace, analysis.files[1:])


def importing_files(tmp_path):
    """tower.linnet and the shared.linnet it imports, with a fault planted in tower: (tower's path, its text)."""
    for name in ("tower.linnet", "shared.linnet"):
        shutil.copy(WORKSPACE / "imports" / name, tmp_path / name)
    tower = tmp_path / "tower.linnet"
    tower.write_text(tower.read_text(encoding="utf-8").replace("second(first(x))", "second(first(y))"))
    return tower, tower.read_text(encoding="utf-8")


def test_a_second_start_reads_back_what_the_first_published(tmp_path):
    tower, text = importing_files(tmp_path)
    found, files = checked(tower)
    assert any(d.code == "L101" for d in found) and [os.path.basename(f) for f, _ in files] == ["shared.linnet"]
    first = PublishedCache(tmp_path / "cache" / "published.pickle")
    assert first.get(str(tower), text, SETTINGS, never_open) is None
    first.put(str(tower), text, SETTINGS, files, found)
    first.save()
    second = PublishedCache(tmp_path / "cache" / "published.pickle")
    assert second.get(str(tower), text, SETTINGS, never_open) == found == checked(tower)[0]


def test_an_edit_another_preset_or_encoding_an_import_changed_or_open_misses(tmp_path):
    tower, text = importing_files(tmp_path)
    found, files = checked(tower)
    cache = PublishedCache(tmp_path / "published.pickle")
    cache.put(str(tower), text, SETTINGS, files, found)
    assert cache.get(str(tower), text + "\n", SETTINGS, never_open) is None
    assert cache.get(str(tower), text, ("narrow", "utf-16"), never_open) is None
    assert cache.get(str(tower), text, (None, "utf-8"), never_open) is None
    assert cache.get(str(tower), text, SETTINGS, lambda path: path.endswith("shared.linnet")) is None
    shared = tmp_path / "shared.linnet"
    shared.write_text(shared.read_text(encoding="utf-8").replace("hidden_size: int = 64", "hidden_size: int = 640"))
    assert cache.get(str(tower), text, SETTINGS, never_open) is None  # changed: checked first
    shared.unlink()
    assert cache.get(str(tower), text, SETTINGS, never_open) is None


def test_an_import_changed_after_the_check_read_it_is_not_kept_as_the_one_checked(tmp_path):
    """The stamps kept are those the imported files had when the analysis read them: a stamp taken as the entry is
    recorded would pass off a shared.linnet changed in between (saved while the first start checked) as the one
    checked, and the next start would publish the old text's findings for the new one."""
    tower, text = importing_files(tmp_path)
    found, read = checked(tower)
    shared = tmp_path / "shared.linnet"
    shared.write_text(shared.read_text(encoding="utf-8").replace("module FeedForward(", "module MLP("))
    assert checked(tower)[0] != found  # what a check of the files now finds
    cache = PublishedCache(tmp_path / "published.pickle")
    cache.put(str(tower), text, SETTINGS, read, found)
    assert cache.get(str(tower), text, SETTINGS, never_open) is None


def test_a_file_of_other_sources_or_damaged_only_means_checking_first(tmp_path):
    tower, text = importing_files(tmp_path)
    found, files = checked(tower)
    path = tmp_path / "published.pickle"
    other = PublishedCache(path, code="another checker")
    other.put(str(tower), text, SETTINGS, files, found)
    other.save()
    assert PublishedCache(path).get(str(tower), text, SETTINGS, never_open) is None
    assert PublishedCache(path, code="another checker").get(str(tower), text, SETTINGS, never_open) == found
    path.write_bytes(b"not a pickle")
    assert PublishedCache(path).entries == {}
    entries = {str(tower): (text, SETTINGS, (), b"not a pickle either")}
    write_atomic(path, pickle.dumps({"code": code_stamp(), "entries": entries}))
    assert PublishedCache(path).get(str(tower), text, SETTINGS, never_open) is None
    (tmp_path / "file").write_text("")
    unwritable = PublishedCache(tmp_path / "file" / "published.pickle")  # its folder is a file
    unwritable.put(str(tower), text, SETTINGS, files, found)
    unwritable.save()  # no error: the next start checks first


def test_the_code_stamp_follows_the_checker_s_sources(tmp_path):
    stamp = code_stamp()
    assert "semantics/checker.py:" in stamp and "std/nn.linnet:" in stamp and "lsp/convert.py:" in stamp
    assert code_stamp() == stamp


def test_a_document_too_big_to_keep_leaves_the_others_kept(tmp_path, monkeypatch):
    import linnet.lsp.published as published

    tower, text = importing_files(tmp_path)
    found, files = checked(tower)
    cache = PublishedCache(tmp_path / "published.pickle")
    cache.put(str(tower), text, SETTINGS, files, found)
    kept = len(text) + len(cache.entries[str(tower)][3])
    monkeypatch.setattr(published, "MAX_BYTES", kept)
    big = text + " " * kept  # over the limit alone
    cache.put(str(tmp_path / "big.linnet"), big, SETTINGS, [], [])  # not kept
    cache.entries[str(tmp_path / "big2.linnet")] = (big, SETTINGS, (), b"")  # as a file of a larger limit holds
    cache.save()
    again = PublishedCache(tmp_path / "published.pickle")
    assert list(again.entries) == [str(tower)] and again.get(str(tower), text, SETTINGS, never_open) == found
