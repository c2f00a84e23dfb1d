"""linnet/lsp/parses.py: the language server's parse cache, kept between starts. Real items of the standard library,
parsed by lark (the reference: `parse_item` without a cache)."""

from __future__ import annotations

import pickle

import pytest

from linnet.lsp.cachefile import write_atomic
from linnet.lsp.parses import ParseCache, syntax_digest
from linnet.syntax.items import split_items
from linnet.syntax.parser import parse_item, set_parse_cache
from tests.conftest import ROOT

TEXTS = [chunk for _, chunk in split_items((ROOT / "linnet" / "std" / "nn.linnet").read_text(encoding="utf-8"))]


def shown(parses: list) -> list[str]:
    """Each parse as its dataclass repr: every field of every node (AST nodes compare by identity)."""
    return [repr(parsed) for parsed in parses]


BROKEN = "fn broken(x: [B] -> [B] {\n  let y = x +\n}\n"  # syntax errors: their problems are cached too


@pytest.fixture
def parsed_with():
    """`parse_item` of each text with `cache` set (unset after)."""

    def parse(cache: ParseCache, texts: list[str]) -> list:
        set_parse_cache(cache)
        try:
            return [parse_item(text) for text in texts]
        finally:
            set_parse_cache(None)

    yield parse
    set_parse_cache(None)


def test_a_second_start_reads_every_parse_back_equal_to_lark_s(tmp_path, parsed_with):
    texts = [*TEXTS, BROKEN]
    reference = [parse_item(text) for text in texts]
    first = ParseCache(tmp_path / "parses.pickle")
    assert shown(parsed_with(first, texts)) == shown(reference)
    assert first.hits == 0 and first.misses == len(texts)
    first.save()
    second = ParseCache(tmp_path / "parses.pickle")
    again = parsed_with(second, texts)
    assert shown(again) == shown(reference) and second.hits == len(texts) and second.misses == 0
    assert reference[-1].problems and shown(again[-1].problems) == shown(reference[-1].problems)
    # each read is a fresh copy: a checker annotating one tree leaves the next read alone
    assert second.get(texts[0]) is not second.get(texts[0])


def test_a_file_of_another_parser_or_damaged_only_means_parsing(tmp_path, parsed_with):
    path = tmp_path / "parses.pickle"
    write_atomic(path, pickle.dumps({"key": "another parser", "items": {TEXTS[0]: pickle.dumps(parse_item(TEXTS[0]))}}))
    cache = ParseCache(path)
    assert cache.stored == {} and shown(parsed_with(cache, TEXTS[:1])) == shown([parse_item(TEXTS[0])])
    path.write_bytes(b"not a pickle")
    assert ParseCache(path).stored == {}
    write_atomic(path, pickle.dumps({"key": syntax_digest(), "items": {TEXTS[0]: b"damaged"}}))
    damaged = ParseCache(path)
    assert shown(parsed_with(damaged, TEXTS[:1])) == shown([parse_item(TEXTS[0])]) and damaged.misses == 1
    (tmp_path / "file").write_text("")
    unwritable = ParseCache(tmp_path / "file" / "parses.pickle")  # its folder is a file
    parsed_with(unwritable, TEXTS[:1])
    unwritable.save()  # no error: the next start parses again


def test_nothing_is_written_when_every_parse_was_read_back(tmp_path, parsed_with):
    path = tmp_path / "parses.pickle"
    first = ParseCache(path)
    parsed_with(first, TEXTS)
    first.save()
    written = path.stat().st_mtime_ns
    path.write_bytes(path.read_bytes())  # the same bytes, a new time
    second = ParseCache(path)
    parsed_with(second, TEXTS)
    stamp = path.stat().st_mtime_ns
    second.save()
    assert path.stat().st_mtime_ns == stamp and stamp >= written
