"""linnet/lsp/startup.py: `linnet lsp` imports with fewer collections, generated methods' code cached, lark's optional
modules hidden, and without the CLI's other commands. Real attrs classes and dataclasses; real processes. No timings
(bench/lsp_cold_start.py has them)."""

from __future__ import annotations

import importlib.util
import json
import marshal
import random
import shutil
import subprocess
import sys
import textwrap

import attrs
import pytest

import linnet.cli
from linnet.lsp.cachefile import read_intact, write_atomic
from linnet.lsp.parses import ParseCache
from linnet.lsp.published import PublishedCache
from linnet.lsp.startup import (
    CACHE_NAME,
    PARSES_NAME,
    PUBLISHED_NAME,
    CodeCache,
    cache_path,
    generated_code_cached,
    warm_converter,
)
from linnet.runtimes.backends import caches
from linnet.syntax.optional import without_optional
from tests.conftest import ROOT

CLASSES = textwrap.dedent(
    """
    import dataclasses
    import attrs

    @attrs.define
    class Range:
        start: int
        end: int = 0

    @attrs.frozen
    class Frozen:
        name: str

    @dataclasses.dataclass(frozen=True)
    class Span:
        start: int
        end: int
    """
)


def load_classes(tmp_path, name: str):
    """A fresh module defining attrs classes and a dataclass (its class bodies run again)."""
    path = tmp_path / f"{name}.py"
    path.write_text(CLASSES, encoding="utf-8")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_second_start_evaluates_the_generated_methods_without_compiling(tmp_path):
    first = CodeCache(tmp_path / "cache" / "codes.marshal")
    with generated_code_cached(first):
        a = load_classes(tmp_path, "classes")
    assert first.misses >= 3 and first.hits == 0  # attrs' methods of two classes, the dataclass's functions
    first.save()
    second = CodeCache(tmp_path / "cache" / "codes.marshal")
    with generated_code_cached(second):
        b = load_classes(tmp_path, "classes")  # the same module, run again
    # a frozen attrs class's __hash__ hashes a string, different in each process, not within one
    assert second.misses == 0 and second.hits == first.misses
    for m in (a, b):  # the cached code builds the same classes
        assert m.Range(1) == m.Range(1, 0) and m.Range(1) != m.Range(2)
        assert repr(m.Range(1, 2)) == "Range(start=1, end=2)"
        assert attrs.fields(m.Range).end.default == 0
        assert hash(m.Frozen("x")) == hash(m.Frozen("x")) and m.Span(1, 2) == m.Span(1, 2)
        with pytest.raises(AttributeError):
            m.Frozen("x").name = "y"
    assert not hasattr(__import__("dataclasses"), "exec"), "the builtin is dataclasses' exec again after the block"


def test_the_converter_generates_the_start_messages_functions_through_the_cache(tmp_path):
    from lsprotocol import types as T
    from pygls.protocol import default_converter

    message = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"processId": 7, "capabilities": {}}}
    caches = []
    for _ in range(2):  # two starts
        cache = CodeCache(tmp_path / "codes.marshal")
        converter = default_converter()
        with generated_code_cached(cache):
            warm_converter(converter)
        cache.save()
        caches.append(cache)
        request = converter.structure(message, T.InitializeRequest)
        assert request.params.process_id == 7 and request.params.capabilities == T.ClientCapabilities()
    assert caches[0].misses > 10 and caches[1].misses == 0 and caches[1].hits == caches[0].misses


def test_an_unreadable_or_foreign_cache_file_only_means_compiling(tmp_path):
    path = tmp_path / "codes.marshal"
    path.write_bytes(b"not marshal data")
    cache = CodeCache(path)
    with generated_code_cached(cache):
        m = load_classes(tmp_path, "classes_c")
    assert cache.hits == 0 and cache.misses >= 3 and m.Range(1) == m.Range(1)
    (tmp_path / "file").write_text("")
    unwritable = CodeCache(tmp_path / "file" / "codes.marshal")  # its folder is a file
    unwritable.misses = 1
    unwritable.save()  # no error: the next start compiles again


def test_a_cache_file_holding_other_values_than_code_is_not_run(tmp_path):
    """Review: values read back were handed to exec as they came; a file overwritten with other marshal data (here
    strings under the right keys) must only mean compiling."""
    first = CodeCache(tmp_path / "codes.marshal")
    with generated_code_cached(first):
        load_classes(tmp_path, "classes_d")
    first.save()
    keys = list(marshal.loads(read_intact(tmp_path / "codes.marshal")))
    write_atomic(tmp_path / "codes.marshal", marshal.dumps({k: "print('not code')" for k in keys}))
    cache = CodeCache(tmp_path / "codes.marshal")
    with generated_code_cached(cache):
        m = load_classes(tmp_path, "classes_e")
    assert cache.hits == 0 and m.Span(1, 2) == m.Span(1, 2)


def test_generated_methods_keep_their_annotations_as_types(tmp_path):
    """Review: compiled under startup.py's `from __future__ import annotations`, a dataclass's generated `__init__`
    got string annotations (`typing.get_type_hints` then fails); dataclasses' own exec has no future flags."""
    import typing

    cache = CodeCache(tmp_path / "codes.marshal")
    with generated_code_cached(cache):
        m = load_classes(tmp_path, "classes_f")
    assert cache.misses >= 1
    assert all(not isinstance(v, str) for v in m.Span.__init__.__annotations__.values())
    assert typing.get_type_hints(m.Span.__init__)["start"] is int


def test_the_cache_file_is_in_linnet_cache_folder_which_lists_and_clears_it(monkeypatch, tmp_path):
    monkeypatch.setenv("LINNET_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("LINNET_NO_CACHE", raising=False)
    assert cache_path().parent == caches.cache_dir("lsp") == tmp_path / "lsp"
    cache = CodeCache(cache_path())
    cache.compile("x = 1", "<test>")
    cache.save()
    assert [size for name, _, size in caches.info() if name == "lsp"][0] > 0
    assert caches.clear(("lsp",)) == [tmp_path / "lsp"] and not cache_path().exists()
    monkeypatch.setenv("LINNET_NO_CACHE", "1")
    assert cache_path() is None
    off = CodeCache(None)
    off.compile("x = 1", "<test>")
    off.save()  # nothing written anywhere
    assert off.misses == 1 and list(tmp_path.iterdir()) == []


def test_hidden_modules_cannot_be_imported_in_the_block_and_can_after():
    name = "linnet_test_optional_module"
    with without_optional((name,)):
        with pytest.raises(ImportError):
            __import__(name)
    assert name not in sys.modules


def test_the_lsp_command_skips_the_other_commands_parser(monkeypatch):
    def no_parser():
        raise AssertionError("`linnet lsp` built the whole command line")

    monkeypatch.setattr(linnet.cli, "build_parser", no_parser)
    monkeypatch.setattr(linnet.cli, "cmd_lsp", lambda args: 7)
    assert linnet.cli.main(["lsp"]) == 7


def test_the_server_imports_without_lark_extras_or_the_ir_and_restores_the_collector(tmp_path):
    script = textwrap.dedent(
        """
        import gc, sys
        from linnet.lsp.startup import load_server
        before = gc.get_threshold()
        main = load_server()
        print(gc.isenabled() and gc.get_threshold() == before, callable(main))
        unwanted = ("regex", "interegular", "linnet.ir", "linnet.summary", "linnet.cli.run")
        print(sorted(m for m in unwanted if m in sys.modules))
        from linnet.lsp.collector import FULL_THRESHOLD_OFF, IdleCollector
        IdleCollector(busy=lambda: False).start()
        # (what the imports left, frozen: ~49,000 objects with lsprotocol's classes built lazily, ~56,000 before)
        print(gc.get_threshold()[2] == FULL_THRESHOLD_OFF, gc.get_freeze_count() > 30_000)
        """
    )
    env = {"LINNET_CACHE_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    run = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == ["True True", "[]", "True True"]
    assert list(tmp_path.iterdir()), "the first start writes the generated code's cache"


# the server process as `linnet lsp` runs it, writing what it has imported when it first publishes diagnostics, and
# how many analyses it had run by then
FIRST_PUBLISH_MODULES = textwrap.dedent(
    """
    import json, os, sys
    from linnet.lsp.startup import load_server

    serve = load_server()
    server = serve.args[0]
    publish = server.text_document_publish_diagnostics
    from linnet.semantics.program import Document

    analyses = []
    analyze = Document.analyze
    Document.analyze = lambda self, *args, **kwargs: analyses.append(1) or analyze(self, *args, **kwargs)

    def first_publish(params):
        if not os.path.exists(os.environ["MODULES_OUT"]):
            with open(os.environ["MODULES_OUT"], "w") as out:
                types = vars(sys.modules["lsprotocol.types"]).values()
                built = sorted(v.__name__ for v in types if isinstance(v, type) and v.__module__ == "lsprotocol.types")
                json.dump({"modules": sorted(sys.modules), "analyses": len(analyses), "lsp_types": built}, out)
        publish(params)

    server.text_document_publish_diagnostics = first_publish
    sys.exit(serve())
    """
)
# lsprotocol's classes for requests a start does not see (linnet/lsp/lazytypes.py builds each when first used)
NOT_BUILT_BEFORE_FIRST_DIAGNOSTICS = (
    "Hover",
    "CallHierarchyItem",
    "TypeHierarchyItem",
    "SemanticTokens",
    "InlineCompletionParams",
    "WorkspaceDiagnosticReport",
    "ShowDocumentParams",
)
# what a start needs no part of before its first diagnostics (the parsers: when its items' parses are cached)
NOT_BEFORE_FIRST_DIAGNOSTICS = (
    "lark",
    "linnet.syntax.lalr",
    "linnet.syntax.builder",
    "linnet.syntax.descent",
    "regex",
    "interegular",
    "ssl",
    "tempfile",
    "shutil",
    "hashlib",
    "numpy",
    "torch",
    "jax",
    "onnxruntime",
    "linnet.ir",
    "linnet.compiler",
    "linnet.runtimes",
)


def frame(message: dict) -> bytes:
    body = json.dumps({"jsonrpc": "2.0", **message}).encode()
    return b"Content-Length: %d\r\n\r\n" % len(body) + body


def first_diagnostics(
    tmp_path, out: str, path=ROOT / "examples" / "llama.linnet", publishes: int = 1
) -> tuple[dict, list[dict]]:
    """Start the server (caches in `tmp_path`), open `path`, read up to its `publishes`-th publishDiagnostics, shut
    down; what the server had done at its first (`modules` imported, `analyses` run) with the diagnostics of each
    publish read (`published`), and those read last."""
    env = {"LINNET_CACHE_DIR": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin", "MODULES_OUT": str(tmp_path / out)}
    process = subprocess.Popen(
        [sys.executable, "-c", FIRST_PUBLISH_MODULES],
        cwd=ROOT,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    document = {"uri": path.as_uri(), "languageId": "linnet", "version": 1, "text": path.read_text(encoding="utf-8")}
    process.stdin.write(
        frame({"id": 1, "method": "initialize", "params": {"processId": None, "rootUri": None, "capabilities": {}}})
        + frame({"method": "initialized", "params": {}})
        + frame({"method": "textDocument/didOpen", "params": {"textDocument": document}})
    )
    process.stdin.flush()
    published = []
    while True:
        length = None
        while (line := process.stdout.readline()).strip():
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        assert length is not None, process.stderr.read().decode()
        message = json.loads(process.stdout.read(length))
        if message.get("method") == "textDocument/publishDiagnostics":
            published.append(message["params"]["diagnostics"])
            publishes -= 1
            if publishes == 0:
                break
    process.stdin.write(frame({"id": 2, "method": "shutdown"}) + frame({"method": "exit"}))
    process.stdin.flush()
    assert process.wait(timeout=60) == 0
    return {**json.loads((tmp_path / out).read_text()), "published": published}, published[-1]


def test_a_second_start_reaches_its_first_diagnostics_without_lark_or_what_runs_need(tmp_path):
    """Issue 45: the first start parses (the fast parser: every item of llama.linnet and the standard library, so no
    lark either) and keeps its parses; the next start reads them back and publishes the same diagnostics having
    imported none of NOT_BEFORE_FIRST_DIAGNOSTICS (the fast parser included)."""
    first, first_found = first_diagnostics(tmp_path, "first.json")
    assert "linnet.syntax.descent" in first["modules"], "the first start parses its items"
    assert "lark" not in first["modules"], "no item of a clean file needs lark's route"
    assert (tmp_path / "cache" / "lsp" / PARSES_NAME).exists()
    second, second_found = first_diagnostics(tmp_path, "second.json")
    modules = second["modules"]
    imported = sorted(
        m for m in modules if m.split(".")[0] in NOT_BEFORE_FIRST_DIAGNOSTICS or m in NOT_BEFORE_FIRST_DIAGNOSTICS
    )
    imported += sorted(m for m in modules if any(m.startswith(f"{name}.") for name in NOT_BEFORE_FIRST_DIAGNOSTICS))
    assert imported == []
    assert second_found == first_found
    from lsprotocol import types as T

    built = set(second["lsp_types"])
    assert [name for name in NOT_BUILT_BEFORE_FIRST_DIAGNOSTICS if name in built] == []
    assert len(built) < 0.6 * len([v for v in T.ALL_TYPES_MAP.values() if isinstance(v, type)])  # 320 of 599


def test_a_second_start_publishes_what_the_first_did_before_checking_unless_an_import_changed(tmp_path):
    """Issue 45: the first start checks, publishes and keeps what it published (linnet/lsp/published.py); the next
    start of the same text publishes the same diagnostics before any analysis; after an import changed on disk, a
    start checks first and publishes the new findings."""
    for name in ("tower.linnet", "shared.linnet"):
        shutil.copy(ROOT / "tests" / "lsp" / "workspace" / "imports" / name, tmp_path / name)
    tower, shared = tmp_path / "tower.linnet", tmp_path / "shared.linnet"
    tower.write_text(tower.read_text(encoding="utf-8").replace("second(first(x))", "second(first(y))"))
    first, first_found = first_diagnostics(tmp_path, "first.json", tower)
    assert first["analyses"] >= 1 and [d["code"] for d in first_found] == ["L101"]
    assert (tmp_path / "cache" / "lsp" / PUBLISHED_NAME).exists()
    second, second_found = first_diagnostics(tmp_path, "second.json", tower)
    assert second["analyses"] == 0 and second_found == first_found
    shared.write_text(shared.read_text(encoding="utf-8").replace("module FeedForward(", "module MLP("))
    third, third_found = first_diagnostics(tmp_path, "third.json", tower)
    assert third["analyses"] >= 1 and len(third_found) > 1 and "FeedForward" in third_found[0]["message"]


def test_a_start_after_a_missing_import_appeared_checks_first(tmp_path):
    """A start whose document imports a file that did not exist when the previous start published (L120 "no such
    file") must not publish that error again once the file exists: the file's absence is what it depended on."""
    shutil.copy(ROOT / "tests" / "lsp" / "workspace" / "imports" / "tower.linnet", tmp_path / "tower.linnet")
    tower = tmp_path / "tower.linnet"
    first, first_found = first_diagnostics(tmp_path, "first.json", tower)
    assert [d["code"] for d in first_found] == ["L120"] and "no such file" in first_found[0]["message"]
    second, second_found = first_diagnostics(tmp_path, "second.json", tower)
    assert second["analyses"] == 0 and second_found == first_found  # still absent: read back
    shutil.copy(ROOT / "tests" / "lsp" / "workspace" / "imports" / "shared.linnet", tmp_path / "shared.linnet")
    third, third_found = first_diagnostics(tmp_path, "third.json", tower)
    assert third["analyses"] >= 1 and third_found == []


# pickles a damaged file may turn into: one calls `append` on a str (AttributeError), one declares a frame larger
# than memory can be (OverflowError)
def hostile_marshal() -> bytes:
    """marshal data of a code object with one byte altered that marshal raises SystemError on (CPython checks a code
    object's fields as it builds it): the first such of a seeded search."""
    data, rnd = marshal.dumps({"key": compile("x = 1", "f", "exec")}), random.Random(0)
    for _ in range(5000):
        altered = bytearray(data)
        altered[rnd.randrange(len(data))] ^= rnd.randrange(1, 256)
        try:
            marshal.loads(bytes(altered))
        except SystemError:
            return bytes(altered)
        except (EOFError, ValueError, TypeError):
            pass
    raise AssertionError("no byte altered makes marshal raise SystemError")


def kept_diagnostics(cache: PublishedCache) -> dict:
    """What `cache` would publish for each document it holds, as it was opened."""
    return {k: cache.get(k, v[0], v[1], lambda path: False) for k, v in cache.entries.items()}


def test_a_damaged_cache_file_only_means_doing_the_work_again(tmp_path):
    """A start's cache file altered on disk reads as no file: neither bytes that marshal or pickle fail on outside
    their format errors (a code object's SystemError; a pickle calling `append` on a str, or declaring a frame
    larger than memory) nor a byte altered anywhere raise, or turn the kept diagnostics into others; a start with all
    three damaged publishes what a start without them does."""
    first, found = first_diagnostics(tmp_path, "first.json")
    folder = tmp_path / "cache" / "lsp"
    kinds = {CACHE_NAME: CodeCache, PARSES_NAME: ParseCache, PUBLISHED_NAME: PublishedCache}
    hostile = {
        CACHE_NAME: hostile_marshal(),
        PARSES_NAME: b"\x80\x04X\x01\x00\x00\x00aX\x01\x00\x00\x00ba.",
        PUBLISHED_NAME: b"\x80\x05\x95" + (2**63).to_bytes(8, "little") + b"N.",
    }
    kept = kept_diagnostics(PublishedCache(folder / PUBLISHED_NAME))
    assert [found] == list(kept.values())
    rnd = random.Random(45)
    for name, kind in kinds.items():
        data = (folder / name).read_bytes()
        damaged = folder / f"{name}.damaged"
        for _ in range(200):
            altered = bytearray(data)
            altered[rnd.randrange(len(data))] ^= rnd.randrange(1, 256)
            damaged.write_bytes(bytes(altered))
            cache = kind(damaged)  # raises nothing
            if kind is PublishedCache:
                assert all(d is None or d == kept[k] for k, d in kept_diagnostics(cache).items())
        (folder / name).write_bytes(hostile[name])
    damaged_start, damaged_found = first_diagnostics(tmp_path, "damaged.json")
    assert damaged_found == found


def test_forward_references_compile_through_the_cache_and_still_resolve(tmp_path):
    """typing compiles each forward reference's text (`Optional["Range"]`): a second start reads the code back, and
    the annotation resolves to the same class."""
    import typing

    caches = []
    for _ in range(2):
        cache = CodeCache(tmp_path / "codes.marshal")
        with generated_code_cached(cache):
            ref = typing.ForwardRef("Optional[Range]")
        cache.save()
        caches.append(cache)
        module = load_classes(tmp_path, f"classes_ref{len(caches)}")
        resolved = typing._eval_type(ref, {"Optional": typing.Optional, "Range": module.Range}, None)
        assert resolved == typing.Optional[module.Range]
    assert caches[0].misses == 1 and caches[1].hits == 1 and caches[1].misses == 0
    assert not hasattr(typing, "compile"), "the builtin is typing's compile again after the block"


def test_a_big_file_s_second_start_publishes_all_its_diagnostics_first(tmp_path):
    """A big file's first start publishes its first items' diagnostics, then the whole file's; the next start
    publishes the whole file's at once, before any analysis."""
    from tests.lsp.test_progressive import big_file

    path = tmp_path / "big.linnet"
    path.write_text(big_file(150, unknown_in=(1, 140)), encoding="utf-8")
    first, whole = first_diagnostics(tmp_path, "first.json", path, publishes=2)
    assert len(first["published"][0]) < len(whole)  # the first items' diagnostics, then the whole file's
    second, second_found = first_diagnostics(tmp_path, "second.json", path)
    assert second["analyses"] == 0 and second_found == whole
