"""`lsprotocol.types` imported lazily: its classes are built when first used, not all of them at import.

lsprotocol.types defines the whole LSP 3.17 in one generated module: 554 attrs classes, 44 enums and the type aliases
over them, ~90 ms of a start's CPU (attrs building each class; `-X importtime`), and its converter then resolves the
forward references of all of them (~10 ms). A language server start reaches about a third of them (the messages of
a start, the client's capabilities it reads, the server's it writes, the diagnostics it publishes). Here the
module's own source runs statement by statement, as Python would run it, except that each statement defining one
name (a class, a function, a type alias, a list) runs the first time that name is looked up: through the module's
`__getattr__` (PEP 562: `types.Range`, `from lsprotocol.types import Range`, pickle), or as a forward reference
resolved in `Resolver`. A statement first builds the names it uses that the file defines before it (what Python
had defined when it ran), and afterwards those it uses that the file defines later (what its functions look up when
called). Each attrs class has its forward references resolved as it is built (`attrs.resolve_types`, as lsprotocol's
converter does for every class at once), so cattrs finds them as before. `METHOD_TO_TYPES` and `ALL_TYPES_MAP` are
`LazyDict`s: a dict whose values are built when looked up, and all of them when it is iterated.

`lazy_types(plan_file)` installs the import hook for a block (`linnet.lsp.startup.load_server`); `prefer_lazy_types`
tells lsprotocol's converter not to resolve every class (it has a flag for "done already"). The statements' code
objects (the file parsed with `ast` and each statement compiled, ~0.25 s) are kept between starts, marshalled, under
the file's size, modification time and Python's version; a file of another lsprotocol is planned afresh.
Where lsprotocol's module does not fit this plan (a name defined twice, a statement of several names), those
statements run at import as before.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.machinery
import marshal
import os
import sys
import threading
from pathlib import Path
from types import CodeType, ModuleType
from typing import Any, Callable, Iterator

from .cachefile import read_intact, write_atomic

MODULE = "lsprotocol.types"
PLAN_VERSION = 1  # bump when the plan's layout changes


def statement_names(node: ast.stmt) -> list[str]:
    """The module-level names `node` binds: a class's or function's, an assignment's plain targets."""
    if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
        return [node.name]
    if isinstance(node, ast.Assign):
        return [n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)]
    if isinstance(node, (ast.AnnAssign, ast.AugAssign)) and isinstance(node.target, ast.Name):
        return [node.target.id]
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return [(a.asname or a.name).split(".")[0] for a in node.names]
    return [n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)]


def used_names(node: ast.AST) -> list[str]:
    """The names `node` reads, in order, once each (string annotations are not read: they resolve later)."""
    return list(dict.fromkeys(n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)))


def plan(source: str, filename: str) -> dict:
    """The plan of a module's source: `eager`, its statements that run at import, in order, as (code, names used);
    `lazy`, name -> (statement index, code, names used) of each statement that binds one name, run when that name
    is first looked up; `dicts`, name -> (statement index, annotation code or None, [(key code, value code)], names
    used) of each dict display bound to one name, made at import with its values computed on lookup (`LazyDict`);
    `order`, the public names in the order the module binds them."""
    tree = ast.parse(source, filename)
    bound: dict[str, int] = {}
    for node in tree.body:
        for name in statement_names(node):
            bound[name] = bound.get(name, 0) + 1
    lazy, dicts, eager, order = {}, {}, [], []

    def code(nodes: list[ast.stmt]) -> CodeType:
        return compile(ast.Module(nodes, []), filename, "exec", dont_inherit=True)

    for index, node in enumerate(tree.body):
        if index and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # a type alias's docstring: no effect (compiled alone it would become the module's __doc__)
        names = statement_names(node)
        order += [n for n in names if not n.startswith("_") and n not in order]
        one = len(names) == 1 and bound[names[0]] == 1 and not isinstance(node, (ast.Import, ast.ImportFrom))
        value = getattr(node, "value", None)
        if one and isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(value, ast.Constant):
            one = False  # a constant (a method's name): cheaper to bind than to defer
        if one and isinstance(value, ast.Dict) and None not in value.keys:
            annotation = getattr(node, "annotation", None)
            pairs = [
                (compile(ast.Expression(k), filename, "eval"), compile(ast.Expression(v), filename, "eval"))
                for k, v in zip(value.keys, value.values)
            ]
            ann = compile(ast.Expression(annotation), filename, "eval") if annotation is not None else None
            dicts[names[0]] = (index, ann, pairs, used_names(value))
        elif one:
            lazy[names[0]] = (index, code([node]), used_names(node))
        else:
            eager.append((index, code([node]), used_names(node)))
    return {"version": PLAN_VERSION, "eager": eager, "lazy": lazy, "dicts": dicts, "order": order}


class LazyDict(dict):
    """A dict some of whose values are computed when first looked up (`pending`: key -> function); iterating,
    measuring or copying it computes them all first, in their keys' order."""

    def __init__(self, pending: dict[Any, Callable[[], Any]], lock: threading.RLock | None = None):
        super().__init__()
        self._pending = pending
        self._order = list(pending)
        self._lock = lock or threading.RLock()  # (the module's: one lock, so no two threads wait on each other)

    def __missing__(self, key):
        with self._lock:  # (another thread may be computing it)
            if dict.__contains__(self, key):
                return dict.__getitem__(self, key)
            make = self._pending.get(key)
            if make is None:
                raise KeyError(key)
            value = make()
            dict.__setitem__(self, key, value)
            del self._pending[key]
            return value

    def get(self, key, default=None):
        try:
            return self[key]
        except KeyError:
            return default

    def __contains__(self, key) -> bool:
        return dict.__contains__(self, key) or key in self._pending

    def force(self) -> None:
        """Compute every pending value and put the keys back in their first order."""
        if not self._pending:
            return
        with self._lock:
            self._force()

    def _force(self) -> None:
        for key in list(self._pending):
            self[key]
        items = [(k, dict.__getitem__(self, k)) for k in self._order if dict.__contains__(self, k)]
        items += [(k, v) for k, v in dict.items(self) if k not in set(self._order)]
        dict.clear(self)
        dict.update(self, items)

    def __setitem__(self, key, value) -> None:
        with self._lock:
            self._pending.pop(key, None)
            dict.__setitem__(self, key, value)

    def __reduce__(self):
        self.force()
        return (dict, (dict(dict.items(self)),))


def _forcing(name: str) -> Callable:
    method = getattr(dict, name)

    def forced(self, *args, **kwargs):
        self.force()
        return method(self, *args, **kwargs)

    forced.__name__ = name
    forced.__doc__ = f"dict.{name}, with every value computed first"
    return forced


for _name in (
    "__iter__", "__len__", "__reversed__", "__repr__", "__eq__", "__ne__", "__or__", "__ror__", "__ior__",
    "__delitem__", "keys", "values", "items", "copy", "pop", "popitem", "setdefault", "update", "clear",
):  # fmt: skip
    setattr(LazyDict, _name, _forcing(_name))


class Resolver(dict):
    """The locals forward references are resolved in (`attrs.resolve_types`, over the module's globals): a name the
    module has not built yet is built when looked up (eval reads locals that are not a plain dict through
    `__getitem__`, so a dict subclass's missing keys through `__missing__`; globals it reads as a plain dict)."""

    def __init__(self, build: Callable[[str], Any]):
        super().__init__()
        self._build = build

    def __missing__(self, name: str):
        return self._build(name)  # KeyError for a name the module has not: eval then looks in builtins


class LazyModule:
    """Runs a planned module into `module`: the eager statements now, the lazy ones on first lookup."""

    def __init__(self, module: ModuleType, the_plan: dict):
        self.module = module
        self.globals = module.__dict__
        self.lazy = the_plan["lazy"]
        self.index = {name: entry[0] for name, entry in self.lazy.items()}
        self.lock = threading.RLock()
        self.building: set[str] = set()
        self.resolver = Resolver(self.build)
        self.built = 0  # statements run on first lookup (tests count them)

    def run(self, the_plan: dict) -> None:
        """Run the module: its eager statements in order (each with the lazy names it uses built around it), its
        lazy dicts made, and `__getattr__`, `__dir__` and `__all__` set (`from lsprotocol.types import *` then
        builds every name, as the whole module would have bound them)."""
        g = self.globals
        g["__getattr__"] = self.getattr
        g["__dir__"] = lambda: sorted(set(g) | set(self.lazy))
        g["__all__"] = [n for n in the_plan["order"] if n not in ("__getattr__", "__dir__")]
        g.setdefault("__annotations__", {})
        dicts = dict(the_plan["dicts"])
        steps = [(i, "eager", (code, used)) for i, code, used in the_plan["eager"]]
        steps += [(entry[0], "dict", (name, *entry[1:])) for name, entry in dicts.items()]
        for index, kind, entry in sorted(steps, key=lambda s: s[0]):
            if kind == "eager":
                code, used = entry
                self.build_all(used, before=index)
                exec(code, g)  # noqa: S102 - lsprotocol's own module, statement by statement
                self.build_all(used, after=index)
            else:
                name, ann, pairs, _used = entry
                if ann is not None:
                    with contextlib.suppress(NameError):  # (an annotation over lazy names is left out)
                        g["__annotations__"][name] = eval(ann, g)  # noqa: S307
                keys = []
                for k, _ in pairs:
                    self.build_all(k.co_names)
                    keys.append(eval(k, g))  # noqa: S307
                g[name] = LazyDict({key: self.value_of(v) for key, (_, v) in zip(keys, pairs)}, self.lock)

    def value_of(self, code: CodeType) -> Callable[[], Any]:
        """A function evaluating a lazy dict's value expression `code`, the names it uses built first."""

        def value():
            with self.lock:
                self.build_all(code.co_names)
                return eval(code, self.globals)  # noqa: S307

        return value

    def build_all(self, names, before: int | None = None, after: int | None = None) -> None:
        """Build those of `names` that are lazy and not built yet, of the statements before index `before` and
        after index `after` (None: any)."""
        for name in names:
            index = self.index.get(name)
            if index is None or name in self.globals or name in self.building:
                continue  # (one being built: what this statement uses after it, done when that one is)
            if (before is None or index < before) and (after is None or index > after):
                self.build(name)

    def build(self, name: str) -> Any:
        """The module's `name`, its statement run now if it has not run (the names it uses first); KeyError when the
        module defines no such name, NameError when it is needed while its own statement is being built (a cycle
        the module itself could not have run)."""
        g = self.globals
        if name in g:
            return g[name]
        if name not in self.lazy:
            raise KeyError(name)  # (a name the module binds at import is in `g`)
        with self.lock:
            if name in g:
                return g[name]
            if name in self.building:
                raise NameError(f"{self.module.__name__}.{name} is needed while it is being built")
            self.building.add(name)
            try:
                index, code, used = self.lazy[name]
                self.build_all(used, before=index)
                exec(code, g)  # noqa: S102 - lsprotocol's own statement
                self.built += 1
                value = g[name]
                if isinstance(value, type) and hasattr(value, "__attrs_attrs__"):
                    import attrs

                    attrs.resolve_types(value, g, self.resolver)
                self.build_all(used, after=index)
            finally:
                self.building.discard(name)
        return value

    def getattr(self, name: str) -> Any:
        """The module's `__getattr__`: a name not built yet is built."""
        if name in self.lazy:
            return self.build(name)
        raise AttributeError(f"module {self.module.__name__!r} has no attribute {name!r}")


def source_stamp(origin: str) -> str:
    """What a plan of the file at `origin` was made from: its path, size, modification time, and Python's version
    (code objects are of one version). Raises OSError when the file cannot be read."""
    st = os.stat(origin)
    return f"{PLAN_VERSION}:{origin}:{st.st_size}:{st.st_mtime_ns}:{sys.version}"


def load_plan(origin: str, path: Path) -> dict:
    """The plan of the module at `origin`, read from `path` when made there for this file, else made (and written)."""
    stamp = source_stamp(origin)
    data = read_intact(path)
    with contextlib.suppress(EOFError, ValueError, TypeError, MemoryError, RecursionError, KeyError, SystemError):
        loaded = marshal.loads(data) if data is not None else None
        if isinstance(loaded, dict) and loaded.get("stamp") == stamp:
            return loaded
    the_plan = plan(Path(origin).read_text(encoding="utf-8"), origin)
    the_plan["stamp"] = stamp
    write_atomic(path, marshal.dumps(the_plan))
    return the_plan


class LazyTypesLoader:
    """The loader of `lsprotocol.types` while `lazy_types` is in effect (an `importlib.abc.Loader`, not derived
    from it: importlib.abc imports importlib.resources, tempfile and shutil, ~14 ms)."""

    def __init__(self, the_plan: dict):
        self.plan = the_plan

    def create_module(self, spec):
        return None  # the default module

    def exec_module(self, module: ModuleType) -> None:
        module.__lazy_types__ = runner = LazyModule(module, self.plan)
        runner.run(self.plan)


class LazyTypesFinder:
    """Finds `lsprotocol.types` where Python would, to be run by `LazyTypesLoader` (an
    `importlib.abc.MetaPathFinder`)."""

    def __init__(self, path: Path):
        self.path = path

    def find_spec(self, fullname, path=None, target=None):
        if fullname != MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or not spec.origin or not spec.origin.endswith(".py"):
            return None
        try:
            the_plan = load_plan(spec.origin, self.path)
        except Exception:  # noqa: BLE001 - a file this cannot plan (unreadable, another Python's syntax) imports as usual
            return None
        spec.loader = LazyTypesLoader(the_plan)
        return spec


@contextlib.contextmanager
def lazy_types(plan_file: Path | None) -> Iterator[None]:
    """While the block runs, `import lsprotocol.types` (when not imported yet) builds its names lazily, its plan kept
    in `plan_file`; None (no cache folder: the plan would be made at every start, costing more than it saves)
    imports it as usual."""
    if plan_file is None:
        yield
        return
    finder = LazyTypesFinder(plan_file)
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)


def prefer_lazy_types() -> None:
    """Have lsprotocol's converter leave the resolving of forward references to each class as it is built (it
    resolves every class of the module when it is made, building them all): only when `lsprotocol.types` is the
    lazy module, whose classes resolve their own."""
    types_module = sys.modules.get(MODULE)
    hooks = sys.modules.get("lsprotocol._hooks")
    if getattr(types_module, "__lazy_types__", None) is None or hooks is None:
        return
    if getattr(hooks, "_resolved_forward_references", None) is False:
        hooks._resolved_forward_references = True
