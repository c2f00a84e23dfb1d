"""Imports in the editor, through a real client: definitions, references and rename across
files (tests/lsp/workspace/imports: `tower.linnet` and `aliased.linnet` import
`shared.linnet`'s `FeedForward`, the second as `Block`), importers' diagnostics following an
imported file's edits and its changes on disk, completion of paths and importable names, and
links on import paths."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from lsprotocol import types as T

from .conftest import TIMEOUT_S, WORKSPACE, open_doc

pytestmark = pytest.mark.asyncio(loop_scope="module")

IMPORTS = WORKSPACE / "imports"


def _uri(name: str) -> str:
    return (IMPORTS / name).as_uri()


def _line_text(uri: str, rng: T.Range) -> str:
    path = Path(uri.removeprefix("file://"))
    return path.read_text(encoding="utf-8").split("\n")[rng.start.line][rng.start.character : rng.end.character]


async def _next_publish(client, doc, after: int) -> list[T.Diagnostic]:
    """The diagnostics of the first publish for `doc` after the first `after` publishes."""
    for _ in range(int(TIMEOUT_S / 0.02)):
        for p in client.published[after:]:
            if p.uri == doc.uri:
                return list(p.diagnostics)
        await asyncio.sleep(0.02)
    raise AssertionError(f"no new diagnostics for {doc.uri}")


async def test_definition_and_hover_reach_into_the_imported_file(client):
    tower = await open_doc(client, IMPORTS / "tower.linnet")
    found = await client.text_document_definition_async(T.DefinitionParams(tower.id, tower.pos("FeedForward(c)")))
    (loc,) = found if isinstance(found, list) else [found]
    assert loc.uri == _uri("shared.linnet") and _line_text(loc.uri, loc.range) == "FeedForward"
    hover = await client.text_document_hover_async(T.HoverParams(tower.id, tower.pos("FeedForward(c)", 2)))
    assert "module FeedForward(c: Shared)" in hover.contents.value and "A feed-forward block." in hover.contents.value
    # a config field through the imported config, under this file's preset
    hover = await client.text_document_hover_async(T.HoverParams(tower.id, tower.pos("second(first(x))", 13)))
    assert "[B, c.hidden_size]" in hover.contents.value and "[B, 32]" in hover.contents.value
    tower.close()


async def test_references_cover_the_definition_and_every_importer(client):
    tower = await open_doc(client, IMPORTS / "tower.linnet")
    params = T.ReferenceParams(
        context=T.ReferenceContext(include_declaration=True),
        text_document=tower.id,
        position=tower.pos("FeedForward(c)"),
    )
    found = await client.text_document_references_async(params)
    places = sorted((loc.uri.rsplit("/", 1)[-1], loc.range.start.line, _line_text(loc.uri, loc.range)) for loc in found)
    assert places == [
        ("aliased.linnet", 1, "Block"),  # the alias of
        ("aliased.linnet", 1, "FeedForward"),  # the imported name
        ("aliased.linnet", 4, "Block"),  # a use through the alias
        ("shared.linnet", 8, "FeedForward"),  # the definition
        ("tower.linnet", 0, "FeedForward"),
        ("tower.linnet", 5, "FeedForward"),
        ("tower.linnet", 6, "FeedForward"),
    ]
    tower.close()


async def test_rename_of_an_imported_module_renames_its_definition_and_every_importer(client):
    tower = await open_doc(client, IMPORTS / "tower.linnet")
    ready = await client.text_document_prepare_rename_async(
        T.PrepareRenameParams(tower.id, tower.pos("FeedForward(c)"))
    )
    assert ready is not None
    edit = await client.text_document_rename_async(T.RenameParams(tower.id, tower.pos("FeedForward(c)"), "Mlp"))
    assert edit is not None
    changes = {uri.rsplit("/", 1)[-1]: edits for uri, edits in edit.changes.items()}
    assert sorted(changes) == ["aliased.linnet", "shared.linnet", "tower.linnet"]
    assert [e.range.start.line for e in changes["tower.linnet"]] == [0, 5, 6]
    assert [e.range.start.line for e in changes["shared.linnet"]] == [8]
    # the importer that aliases it keeps its alias and its uses: only the imported name changes
    (aliased,) = changes["aliased.linnet"]
    assert _line_text(_uri("aliased.linnet"), aliased.range) == "FeedForward"
    # renaming through the alias renames the alias, in its own file only
    other = await open_doc(client, IMPORTS / "aliased.linnet")
    edit = await client.text_document_rename_async(T.RenameParams(other.id, other.pos("Block(c)"), "Ffn"))
    assert list(edit.changes) == [other.uri]
    assert sorted(e.range.start.line for e in edit.changes[other.uri]) == [1, 4]
    # a name the importer already uses is refused
    with pytest.raises(Exception, match="already a name"):
        await client.text_document_rename_async(T.RenameParams(tower.id, tower.pos("FeedForward(c)"), "Tower"))
    other.close()
    tower.close()


async def test_an_importer_is_checked_again_when_the_imported_file_is_edited(client):
    tower = await open_doc(client, IMPORTS / "tower.linnet")
    opened = len(client.published)
    shared = await open_doc(client, IMPORTS / "shared.linnet")
    # opening the imported file checks its importer again: wait for that publish (clean), or a slow
    # machine delivers it after the edit below and it is taken for the edit's
    assert await _next_publish(client, tower, opened) == []
    before = len(client.published)
    at = shared.pos("fn forward(x: [B, c.hidden_size])", len("fn forward(x: [B, "))
    await shared.change(at, at, "2 * ")
    found = await _next_publish(client, tower, before)
    assert [(d.code, d.range.start.line) for d in found] == [("L203", 9)]
    before = len(client.published)
    await shared.change(at, shared.at(shared.offset(at) + len("2 * ")), "")
    assert await _next_publish(client, tower, before) == []
    shared.close()
    tower.close()


async def test_an_importer_is_checked_again_when_the_imported_file_changes_on_disk(client, tmp_path):
    # the server registers its file watcher once `initialized` came: wait for it (run alone, this test came first)
    for _ in range(500):
        if any(r.method == T.WORKSPACE_DID_CHANGE_WATCHED_FILES for r in client.registrations):
            break
        await asyncio.sleep(0.01)
    assert any(r.method == T.WORKSPACE_DID_CHANGE_WATCHED_FILES for r in client.registrations)
    lib = tmp_path / "lib.linnet"
    lib.write_text("fn double(x: [N]) -> [N] {\n    x * 2.0\n}\n")
    main = tmp_path / "main.linnet"
    main.write_text('from "lib.linnet" import double\n\nfn quad(x: [N]) -> [N] {\n    double(double(x))\n}\n')
    doc = await open_doc(client, main)
    assert await doc.diagnostics() == []
    before = len(client.published)
    lib.write_text("fn double(x: [N, M]) -> [N, M] {\n    x * 2.0\n}\n")
    client.workspace_did_change_watched_files(
        T.DidChangeWatchedFilesParams([T.FileEvent(lib.as_uri(), T.FileChangeType.Changed)])
    )
    found = await _next_publish(client, doc, before)
    assert [d.code for d in found] == ["L203"]
    before = len(client.published)
    lib.unlink()
    client.workspace_did_change_watched_files(
        T.DidChangeWatchedFilesParams([T.FileEvent(lib.as_uri(), T.FileChangeType.Deleted)])
    )
    found = await _next_publish(client, doc, before)
    assert [(d.code, d.range.start.line) for d in found] == [("L120", 0)]
    doc.close()


async def test_an_importer_is_checked_again_when_the_file_it_could_not_find_is_created(client, tmp_path):
    """An import of a file that does not exist (L120) is checked again when the client reports the file created:
    the importer's last analysis read no file there, but what it found depends on there being none."""
    main = tmp_path / "main.linnet"
    main.write_text('from "lib.linnet" import double\n\nfn quad(x: [N]) -> [N] {\n    double(double(x))\n}\n')
    doc = await open_doc(client, main)
    assert [d.code for d in await doc.diagnostics()] == ["L120"]
    before = len(client.published)
    lib = tmp_path / "lib.linnet"
    lib.write_text("fn double(x: [N]) -> [N] {\n    x * 2.0\n}\n")
    client.workspace_did_change_watched_files(
        T.DidChangeWatchedFilesParams([T.FileEvent(lib.as_uri(), T.FileChangeType.Created)])
    )
    assert await _next_publish(client, doc, before) == []
    doc.close()


async def _complete(client, doc, needle: str) -> dict[str, T.CompletionItem]:
    position = doc.pos(needle, len(needle))
    result = await client.text_document_completion_async(T.CompletionParams(doc.id, position))
    items = result.items if isinstance(result, T.CompletionList) else result
    return {i.label: i for i in items}


async def test_completion_of_paths_std_modules_and_importable_names(client):
    doc = await open_doc(client, IMPORTS / "new.linnet", 'from "sha\n')
    items = await _complete(client, doc, 'from "sha')
    assert {"shared.linnet", "tower.linnet", "aliased.linnet"} <= set(items)
    assert items["shared.linnet"].kind == T.CompletionItemKind.File
    assert items["shared.linnet"].text_edit.range == T.Range(doc.pos("sha"), doc.pos("sha", 3))
    await doc.change(doc.at(0), doc.at(len(doc.text)), 'from "shared.linnet" import Shared, \n')
    items = await _complete(client, doc, "import Shared, ")
    assert list(items) == ["FeedForward"]  # `Shared` is imported already
    assert items["FeedForward"].detail == "module FeedForward(c: Shared)"
    await doc.change(doc.at(0), doc.at(len(doc.text)), "from std.\n")
    items = await _complete(client, doc, "from std.")
    assert {"std.nn", "std.functional", "std.rope", "std.attention"} == set(items)
    await doc.change(doc.at(0), doc.at(len(doc.text)), "from std.nn import \n")
    assert {"Linear", "Embedding", "RMSNorm", "LayerNorm"} <= set(await _complete(client, doc, "import "))
    doc.close()
    # imported names are completed like the file's own
    tower = await open_doc(client, IMPORTS / "tower.linnet")
    where = tower.pos("    second: FeedForward(c)")
    await tower.change(where, where, "    third: Fee\n")
    items = await _complete(client, tower, "third: Fee")
    assert items["FeedForward"].kind == T.CompletionItemKind.Class
    tower.close()


async def test_import_paths_are_links(client):
    tower = await open_doc(client, IMPORTS / "tower.linnet")
    (link,) = await client.text_document_document_link_async(T.DocumentLinkParams(tower.id))
    assert link.target == _uri("shared.linnet")
    assert tower.slice(link.range) == '"shared.linnet"'
    tower.close()
