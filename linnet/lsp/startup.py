"""`linnet lsp`'s cold start: what the process does before it can answer, kept short.

Before its first diagnostics the server imports pygls, lsprotocol and the front end and checks the opened file.
Measured on two shared cores (`python -X importtime`, cProfile, and `bench/lsp_cold_start.py`), these costs of a
start were not work the server needs:

- the cyclic garbage collector: about 240 collections of a heap growing to 110,000 objects while modules import
  (~0.1 s), and a full collection of it before serving (~60 ms). Here the young generation's threshold is
  `IMPORT_YOUNG_THRESHOLD` while the server's modules import (a fourteenth of the collections; with the collector
  off instead, imports' garbage piled up: +10 MB of RSS for the last ~30 ms), and `IdleCollector.start` freezes
  what they loaded without that full collection.
- compiling generated methods: attrs builds `__init__`, `__eq__`, ... of each of lsprotocol's 554 classes, and
  `dataclasses` those of the front end's ~150, from source text, compiled at every start (~0.25 s, most of
  lsprotocol's import). `generated_code_cached` keeps the code objects of that text in a per-user cache file
  (marshal, keyed by the exact text and file name, so a changed attrs or lsprotocol compiles afresh), and a
  start that finds them evaluates them without compiling.
- cattrs generating (and compiling) the functions that read and write each message type the first time one
  arrives: ~25 ms for those of a start (initialize with a client's capabilities, didOpen, publishDiagnostics,
  ...). `load_server` makes the server and has its converter generate those at once, through the same cache, each
  in the one direction the server needs (it reads a client's capabilities and never writes them).
- attrs copying the globals of a class's module into those of its generated `__init__`, for each of lsprotocol's
  554 classes (~20 ms): `attrs_init_without_module_globals`.
- building the lsprotocol classes a start never uses: of its 599 classes (and the forward references of each,
  resolved when lsprotocol's converter is made) a start to its first diagnostics uses ~320, the rest only when a
  request needs them. `linnet.lsp.lazytypes` imports lsprotocol.types with each class built on first use (~50 ms
  of a start's CPU).
- parsing: the standard library and the opened file, ~90 ms with lark's import and tables; the fast parser
  (`linnet.syntax.descent`) now parses every item without a syntax error, with no lark. The parses of a start
  are kept between starts (`linnet.lsp.parses`): a start whose items were all parsed before imports neither
  parser, and one whose items parse cleanly never imports lark (`linnet.syntax.lalr`). lark imports `regex` and
  `interegular` when they are installed, for grammars that ask for them (ours does not): hidden from lark while it
  imports (~30 ms; `linnet.syntax.optional`).
- checking the opened file (~70 ms for examples/llama.linnet), which an editor most often opens again unchanged:
  what a start published for each document as opened is kept with what it depends on (`linnet.lsp.published`),
  and a start of the same text publishes it before its check (which follows, publishing only what differs).
- modules only some requests use, imported where they are used: tempfile and shutil (views, compare), hashlib
  (compare), and ssl, which asyncio imports when it can, hidden while the server imports (it speaks over stdio).

Measured: bench/results/lsp_cold_start.md and bench/results/lsp_cold_start_published.md. A test
(tests/lsp/test_startup.py) pins what a second start has not imported, nor checked, when it first publishes
diagnostics.

The cache files are `lsp/generated-code-<python>.marshal`, `lsp/parses-<python>.pickle`,
`lsp/published-<python>.pickle` and `lsp/lazy-types-<python>.marshal` in Linnet's cache folder
(`$LINNET_CACHE_DIR`, else `$XDG_CACHE_HOME/linnet`, else `~/.cache/linnet`; `LINNET_NO_CACHE=1` turns them off, and
lsprotocol is then imported whole; `linnet cache` lists and clears them); a folder that cannot
be read or written only means compiling, parsing and checking as before.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import marshal
import os
import sys
import types
import typing
from pathlib import Path
from typing import Any, Callable, Iterator

from .cachefile import read_intact, write_atomic
from .lazytypes import lazy_types, prefer_lazy_types

CACHE_NAME = f"generated-code-{sys.implementation.cache_tag}.marshal"
PARSES_NAME = f"parses-{sys.implementation.cache_tag}.pickle"  # linnet/lsp/parses.py
PUBLISHED_NAME = f"published-{sys.implementation.cache_tag}.pickle"  # linnet/lsp/published.py
LAZY_TYPES_NAME = f"lazy-types-{sys.implementation.cache_tag}.marshal"  # linnet/lsp/lazytypes.py
# asyncio imports ssl (~8 ms) when it can, for TLS connections: the server speaks over stdio
OPTIONAL_FOR_ASYNCIO = ("ssl",)
IMPORT_YOUNG_THRESHOLD = 10_000  # generation 0's collection threshold while the server imports (CPython's: 700)
STALE_SHARE = 0.05  # the share of lookups that missed above which the cache file is written again
# what an editor sends the server, and the server the editor, from spawning to the first diagnostics and the first
# edit; the server reads the first and writes their responses, writes the second and reads their responses
FROM_CLIENT = (
    "initialize",
    "initialized",
    "textDocument/didOpen",
    "textDocument/didChange",
    "shutdown",
    "exit",
)
FROM_SERVER = ("workspace/configuration", "client/registerCapability", "textDocument/publishDiagnostics")


def cache_path(name: str = CACHE_NAME) -> Path | None:
    """The cache file `name` (default: the generated code's) in `lsp/` of Linnet's cache folder, as
    `linnet.runtimes.backends.caches` finds it (not imported: it imports tempfile and shutil, a start's worth of
    milliseconds); None when `LINNET_NO_CACHE` is set."""
    if os.environ.get("LINNET_NO_CACHE", "") not in ("", "0"):
        return None
    if os.environ.get("LINNET_CACHE_DIR"):
        root = Path(os.environ["LINNET_CACHE_DIR"]).expanduser()
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        root = (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "linnet"
    return root / "lsp" / name


class CodeCache:
    """Code objects by (file name, source text): `compile` for text met before is a dict lookup.

    `hits` and `misses` count lookups; `save()` writes what this process used (a stale entry, from an older attrs
    or lsprotocol, is dropped by the next save)."""

    def __init__(self, path: Path | None):
        self.path = path  # None: nothing is read or written
        self.codes: dict[str, Any] = {}
        self.used: dict[str, Any] = {}
        self.hits = self.misses = 0
        if path is None:
            return
        # an intact file (`cachefile`) of another Python may still hold anything: only code objects under text keys
        data = read_intact(path)  # (marshal.load(file) reads in small pieces: 5x slower)
        with contextlib.suppress(EOFError, ValueError, TypeError, MemoryError, RecursionError):
            loaded = marshal.loads(data) if data is not None else None
            if isinstance(loaded, dict):
                self.codes = {k: v for k, v in loaded.items() if isinstance(k, str) and isinstance(v, types.CodeType)}

    def compile(self, source: str, filename: str, mode: str = "exec") -> Any:
        """`compile(source, filename, mode)` ("exec" or "eval"), from the cache when this text was compiled before."""
        key = f"{filename}\0{source}" if mode == "exec" else f"{mode}\0{filename}\0{source}"
        code = self.codes.get(key)
        if code is None:
            # dont_inherit: not this module's `from __future__ import annotations` (dataclasses' own `exec` has none,
            # so its generated methods' annotations would turn into strings)
            code = compile(source, filename, mode, dont_inherit=True)
            self.misses += 1
        else:
            self.hits += 1
        self.used[key] = code
        return code

    def save(self) -> None:
        """Write the code this process used, when more than `STALE_SHARE` of it was compiled here (a first start,
        or a new attrs or lsprotocol; a few classes generate different text in each process, such as a frozen attrs
        class's `__hash__`, which hashes a string: those always miss). Atomic: a server starting at the same time
        reads the old file or the new one."""
        if self.path is None or self.misses <= STALE_SHARE * (self.hits + self.misses):
            return
        write_atomic(self.path, marshal.dumps(self.used))


@contextlib.contextmanager
def attrs_init_without_module_globals() -> Iterator[None]:
    """While the block runs, the `__init__` attrs generates for a class gets only the globals its code uses, not a
    copy of the class's module's too (attrs copies them so that `typing.get_type_hints(cls.__init__)` can resolve
    string annotations; nothing in the server asks that): lsprotocol.types defines 554 classes in one module, so
    that was 554 copies of a module of growing size, ~20 ms of its import. attrs reads the module from the class's
    `__module__` in `attr._make._make_init_script(cls, ...)`, which this calls with `__module__` set to a name no
    module has; where that function differs (another attrs), classes are made as usual."""
    import attr._make as attrs_make

    original = getattr(attrs_make, "_make_init_script", None)

    def make_init_script(cls, *args, **kwargs):
        module = cls.__module__
        cls.__module__ = "<no module: linnet.lsp.startup>"
        try:
            return original(cls, *args, **kwargs)
        finally:
            cls.__module__ = module

    if original is not None:
        attrs_make._make_init_script = make_init_script
    try:
        yield
    finally:
        if original is not None:
            attrs_make._make_init_script = original


@contextlib.contextmanager
def generated_code_cached(cache: CodeCache) -> Iterator[CodeCache]:
    """While the block runs, attrs, dataclasses and cattrs compile the code they generate through `cache`, and typing
    the expressions of forward references (`Optional["Range"]`: 310 of them in lsprotocol.types, ~10 ms); all are
    restored after. attrs compiles in `attr._make._compile_and_eval(script, globs, locs, filename)`; dataclasses
    calls the builtin `exec(text, globals, ns)`, cattrs's generators the builtin `compile` and `typing.ForwardRef`
    `compile(text, "<string>", "eval")`, each shadowed by a module global for the block. Where one differs (another
    version), it compiles as usual."""
    import attr._make as attrs_make
    import cattrs.gen

    original = getattr(attrs_make, "_compile_and_eval", None)

    def attrs_compile_and_eval(script, globs, locs=None, filename=""):
        eval(cache.compile(script, filename), globs, locs)  # noqa: S307 - attrs' own generated code

    def dataclasses_exec(source, globals_=None, locals_=None, /):
        if isinstance(source, str):
            source = cache.compile(source, "<string>")
        exec(source, globals_, locals_)  # noqa: S102 - dataclasses' own generated code

    def cattrs_compile(source, filename, mode, *args, **kwargs):
        if mode != "exec" or args or kwargs or not isinstance(source, str):
            return compile(source, filename, mode, *args, **kwargs)
        return cache.compile(source, filename)

    def typing_compile(source, filename, mode, *args, **kwargs):
        if mode != "eval" or args or kwargs or not isinstance(source, str):
            return compile(source, filename, mode, *args, **kwargs)
        return cache.compile(source, filename, "eval")

    if original is not None:
        attrs_make._compile_and_eval = attrs_compile_and_eval
    dataclasses.exec = dataclasses_exec  # a module global shadows the builtin in dataclasses' functions
    cattrs.gen.compile = cattrs_compile  # and in cattrs.gen's
    typing.compile = typing_compile  # and in typing's
    try:
        yield cache
    finally:
        del dataclasses.exec
        del cattrs.gen.compile
        del typing.compile
        if original is not None:
            attrs_make._compile_and_eval = original


def warm_converter(converter: Any) -> None:
    """Have `converter` (cattrs, pygls's) generate its functions for the messages of a start, in the direction the
    server handles each: reading `FROM_CLIENT`'s messages and writing their responses, writing `FROM_SERVER`'s and
    reading their responses (the other directions, such as writing a client's capabilities, were half the work)."""
    from lsprotocol import types as T

    for methods, message_hook, response_hook in (
        (FROM_CLIENT, converter.get_structure_hook, converter.get_unstructure_hook),
        (FROM_SERVER, converter.get_unstructure_hook, converter.get_structure_hook),
    ):
        for method in methods:
            message, response = T.METHOD_TO_TYPES[method][:2]
            message_hook(message)
            if response is not None:
                response_hook(response)


class StartCaches:
    """What a start fills and the next one reads: the generated code (`CodeCache`: attrs's, dataclasses' and
    cattrs's compile stays patched until `close`, so the functions cattrs generates while serving the first messages,
    such as those writing each concrete capability of the initialize result, ~10 ms, are cached too) and the parses
    (`linnet.lsp.parses.ParseCache`, or None). The server calls `save` once a document as opened is checked, and
    `close` when typing begins (what is typed is new text, and what the caches keep would grow with it)."""

    def __init__(self, code: CodeCache, code_block: contextlib.ExitStack, parses: Any | None, published: Any):
        self.code = code
        self.code_block = code_block  # the patch `generated_code_cached` made
        self.parses = parses
        self.published = published  # linnet.lsp.published.PublishedCache

    def save(self) -> None:
        """Write the caches (each only when it has something new)."""
        self.code.save()
        self.published.save()
        if self.parses is not None:
            self.parses.save()

    def close(self) -> None:
        """Restore the compile functions, write the parses and published diagnostics (when new) and parse without a
        cache from now on."""
        from linnet.syntax.parser import set_parse_cache

        self.code_block.close()
        self.published.save()
        if self.parses is not None:
            self.parses.save()
            set_parse_cache(None)


def load_server() -> Callable[[], int]:
    """Import the language server and make it, with fewer collections and generated code cached (see the module
    docstring); returns a function that serves on stdio (`linnet.lsp.server.main`, whose `IdleCollector.start`
    freezes what this loaded) and returns the exit status. The server holds the start's caches (`StartCaches`) until
    typing begins. Raises ImportError without pygls or lsprotocol."""
    threshold = gc.get_threshold()
    gc.set_threshold(IMPORT_YOUNG_THRESHOLD, *threshold[1:])
    cache = CodeCache(cache_path())
    code_block = contextlib.ExitStack()
    code_block.enter_context(generated_code_cached(cache))
    try:
        with attrs_init_without_module_globals():
            # imported in the block: linnet.syntax makes the AST's dataclasses (their methods' code is cached)
            from linnet.syntax.optional import without_optional

            with without_optional(OPTIONAL_FOR_ASYNCIO), lazy_types(cache_path(LAZY_TYPES_NAME)):
                from linnet.syntax.parser import set_parse_cache

                from .parses import ParseCache
                from .published import PublishedCache
                from .server import create_server, main

                prefer_lazy_types()
                server = create_server()
                warm_converter(server.protocol._converter)  # pygls keeps the converter private
    except BaseException:
        code_block.close()
        raise
    finally:
        gc.set_threshold(*threshold)
    cache.save()
    path = cache_path(PARSES_NAME)
    # LINNET_NO_CACHE: every start parses (keeping parses in memory would only cost)
    parses = ParseCache(path) if path is not None else None
    set_parse_cache(parses)
    published = PublishedCache(cache_path(PUBLISHED_NAME))
    server.start_caches = StartCaches(cache, code_block, parses, published)
    return functools.partial(main, server)
