"""linnet/lsp/lazytypes.py: `lsprotocol.types` imported lazily answers as the module imported as usual. Every request,
notification and response of the LSP spec (lsprotocol's METHOD_TO_TYPES) round-trips through pygls's converter over
each module, to the same JSON; the public names, METHOD_TO_TYPES and ALL_TYPES_MAP agree. Real lsprotocol, pygls and
cattrs, each module in its own process."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from linnet.lsp.lazytypes import LazyDict, plan
from tests.conftest import ROOT

# every message type of the spec as JSON: each of its fields filled (the first arm of a union, one element of a list),
# structured by pygls's converter and written again, which must give the same JSON
ROUND_TRIPS = textwrap.dedent(
    """
    import enum, json, sys, typing
    from pathlib import Path
    import attrs

    if sys.argv[1] == "lazy":
        from linnet.lsp.lazytypes import lazy_types, prefer_lazy_types
        with lazy_types(Path(sys.argv[2])):
            from lsprotocol import types as T
        import lsprotocol.converters
        prefer_lazy_types()
        assert T.__lazy_types__.built < 50, T.__lazy_types__.built  # nothing built before it is asked for
    else:
        from lsprotocol import types as T
    from pygls.protocol import default_converter

    converter = default_converter()
    PRIMITIVES = {int: 1, str: "s", bool: True, float: 1.5, type(None): None, object: None}

    def sample(t, depth=0):
        if t in PRIMITIVES:
            return PRIMITIVES[t]
        origin, args = typing.get_origin(t), typing.get_args(t)
        if origin is typing.Union:
            arms = [a for a in args if a is not type(None)] or [type(None)]
            if depth > 5:  # (LSPAny is a union of itself): the first arm that is not a container
                arms = [a for a in arms if a in PRIMITIVES or isinstance(a, type) and issubclass(a, enum.Enum)] or arms
            return sample(arms[0], depth + 1)
        if origin is typing.Literal:
            return args[0]
        if origin in (list, tuple) and origin is tuple and args and args[-1] is not Ellipsis:
            return tuple(sample(a, depth + 1) for a in args)
        if origin in (list, tuple) or str(origin) in ("<class 'collections.abc.Sequence'>",):
            return [sample(args[0], depth + 1)] if depth < 8 else []
        if origin in (dict,) or str(origin) == "<class 'collections.abc.Mapping'>":
            return {"k": sample(args[1], depth + 1)} if depth < 8 else {}
        if isinstance(t, type) and issubclass(t, enum.Enum):
            return next(iter(t))
        if isinstance(t, type) and attrs.has(t):
            values = {}
            for f in attrs.fields(t):
                if f.default is not attrs.NOTHING and (depth > 8 or isinstance(f.default, str)):
                    continue  # (a string default is a tag: `kind = "full"`, `jsonrpc = "2.0"`)
                values[f.alias or f.name] = sample(f.type, depth + 1)
            return t(**values)
        return None

    out = {}
    for method in sorted(T.METHOD_TO_TYPES):
        for kind, t in zip(("message", "response", "params", "options"), T.METHOD_TO_TYPES[method]):
            if t is None:
                continue
            key = f"{method} {kind} {getattr(t, '__name__', t)}"
            try:
                written = converter.unstructure(sample(t), t)
                again = converter.unstructure(converter.structure(written, t), t)
            except Exception as err:
                out[key] = f"error: {type(err).__name__}: {err}"
                continue
            out[key] = written if again == written else {"differs": [written, again]}
    public = sorted(n for n in dir(T) if not n.startswith("_"))
    print(json.dumps({
        "round_trips": out,
        "public": public,
        "methods": list(T.METHOD_TO_TYPES),
        # (lsprotocol's converter resolves forward references with ALL_TYPES_MAP as globals: eval adds __builtins__)
        "all_types": {k: getattr(v, "__name__", None) for k, v in T.ALL_TYPES_MAP.items() if k != "__builtins__"},
    }, default=str))
    """
)


def run_round_trips(mode: str, tmp_path) -> dict:
    run = subprocess.run(
        [sys.executable, "-c", ROUND_TRIPS, mode, str(tmp_path / "plan.marshal")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout)


def test_every_message_of_the_spec_round_trips_through_the_lazy_module_as_through_the_module(tmp_path):
    eager = run_round_trips("eager", tmp_path)
    lazy = run_round_trips("lazy", tmp_path)  # makes the plan
    again = run_round_trips("lazy", tmp_path)  # reads it back
    trips = eager["round_trips"]
    assert len(trips) > 300 and len(eager["methods"]) > 80  # requests, notifications, their params and responses
    failed = {k: v for k, v in trips.items() if isinstance(v, str) or isinstance(v, dict) and "differs" in v}
    # lsprotocol's converter has no structure hook for one registration option's `Union[str, Sequence[str], None]`
    assert list(failed) == ["workspace/didChangeConfiguration options DidChangeConfigurationRegistrationOptions"]
    assert "StructureHandlerNotFoundError" in failed[next(iter(failed))]
    assert lazy["round_trips"] == trips and again["round_trips"] == trips
    for field in ("public", "methods", "all_types"):
        assert lazy[field] == eager[field] and again[field] == eager[field]


def test_a_plan_runs_each_statement_when_its_name_is_first_used():
    source = textwrap.dedent(
        """
        import enum
        log = []
        class Base:
            log.append("Base")
        class Child(Base):
            log.append("Child")
            def make(self):
                return Later()
        class Later:
            log.append("Later")
        TABLE = {"child": Child, "later": Later}
        NAME = "constant"
        """
    )
    from types import ModuleType

    from linnet.lsp.lazytypes import LazyModule

    module = ModuleType("planned")
    the_plan = plan(source, "<planned>")
    LazyModule(module, the_plan).run(the_plan)
    assert module.log == [] and module.NAME == "constant"
    assert module.Child.__bases__ == (module.Base,)  # what it uses from before it, first
    assert module.log == ["Base", "Child", "Later"]  # and what its functions use, after
    assert isinstance(module.Child().make(), module.Later)
    assert isinstance(module.TABLE, LazyDict) and list(module.TABLE) == ["child", "later"]


def test_a_lazy_dict_builds_values_on_lookup_and_all_of_them_to_iterate():
    made = []

    def maker(value):
        return lambda: made.append(value) or value

    d = LazyDict({"a": maker(1), "b": maker(2), "c": maker(3)})
    assert "b" in d and "z" not in d and made == []
    assert d["b"] == 2 and d.get("z") is None and made == [2]
    assert list(d.items()) == [("a", 1), ("b", 2), ("c", 3)] and made == [2, 1, 3]  # the first order
    assert len(d) == 3 and dict(d) == {"a": 1, "b": 2, "c": 3}


def test_threads_building_the_same_names_get_the_same_classes():
    """A worker thread may look a class up while the event loop's thread builds it: each name is built once."""
    import threading
    from types import ModuleType

    from linnet.lsp.lazytypes import LazyModule

    source = "\n".join(f"class C{i}:\n    peer = {'C%d' % (i - 1) if i else 'None'}" for i in range(200))
    module = ModuleType("threaded")
    the_plan = plan(source, "<threaded>")
    runner = LazyModule(module, the_plan)
    runner.run(the_plan)
    seen: list[list] = []

    def look():
        seen.append([getattr(module, f"C{i}") for i in reversed(range(200))])

    threads = [threading.Thread(target=look) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert runner.built == 200 and all(row == seen[0] for row in seen)
    assert module.C5.peer is module.C4


def test_a_damaged_or_foreign_plan_file_only_means_planning_again(tmp_path):
    """The plan is kept like the other start caches (an intact file, under the module's size, time and Python): a
    file altered on disk, or made for another file, is planned again, never run."""
    import lsprotocol.types

    from linnet.lsp.cachefile import read_intact, write_atomic
    from linnet.lsp.lazytypes import load_plan

    origin, path = lsprotocol.types.__file__, tmp_path / "plan.marshal"
    first = load_plan(origin, path)
    assert path.exists() and set(first["lazy"]) >= {"Range", "Diagnostic", "InitializeParams"}
    data = path.read_bytes()
    path.write_bytes(data[:100] + bytes([data[100] ^ 0xFF]) + data[101:])  # one byte altered
    assert read_intact(path) is None and load_plan(origin, path)["stamp"] == first["stamp"]
    import marshal

    write_atomic(path, marshal.dumps({"stamp": "another lsprotocol", "lazy": {}, "eager": [], "dicts": {}}))
    assert set(load_plan(origin, path)["lazy"]) == set(first["lazy"])


def test_without_a_cache_folder_lsprotocol_is_imported_as_usual():
    """LINNET_NO_CACHE: no plan can be kept, and making one at every start would cost more than it saves."""
    from linnet.lsp.lazytypes import lazy_types

    before = list(sys.meta_path)
    with lazy_types(None):
        assert sys.meta_path == before
