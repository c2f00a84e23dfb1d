"""The generated code's helpers as real modules (linnet/compiler/{torch,jax}/prelude.py): a generated module imports
the ones it calls, so the model's code starts within its first 30 lines; a standalone one (`linnet torch`, `linnet
jax`) carries the definition of every helper it calls, imports only its framework, and computes what the module that
imports them computes."""

from __future__ import annotations

import ast
import builtins
import importlib.util

import pytest

from linnet.compiler.jax import codegen as jax_codegen
from linnet.compiler.torch import codegen as torch_codegen
from linnet.ir import build
from tests.compiler.dropout_program import SOURCE as DROPOUT_SOURCE
from tests.compiler.test_torch_linear import LLAMA
from tests.conftest import EXAMPLES
from tests.ir.test_ir import CASES

CODEGENS = {"torch": torch_codegen, "jax": jax_codegen}


def _programs():
    """The golden examples, a bf16 `fast` llama (`one_row_attention`) and a program that runs dropout."""
    out = {name: build(EXAMPLES / f, preset=p, config=c, max_positions=16) for name, (f, p, c) in CASES.items()}
    out["llama_bf16"] = build(EXAMPLES / "llama.linnet", config=LLAMA, dtype="bf16", max_positions=16)
    out["dropout"] = build(DROPOUT_SOURCE)
    return out


PROGRAMS = _programs()
NUMERICS = {"llama_bf16": "fast"}


def _generate(backend: str, name: str, standalone: bool) -> str:
    return CODEGENS[backend].generate(PROGRAMS[name], NUMERICS.get(name, "equivalent"), standalone=standalone)


def _top_level(text: str) -> tuple[list[ast.stmt], set[str]]:
    """The module's statements and the names they define at top level."""
    body = ast.parse(text).body
    names = set()
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return body, names


@pytest.mark.parametrize("backend", sorted(CODEGENS))
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_the_model_starts_within_30_lines(backend, name):
    text = _generate(backend, name, standalone=False)
    body, _ = _top_level(text)
    first = next(node for node in body if isinstance(node, (ast.FunctionDef, ast.ClassDef)))
    assert first.lineno <= 30, (first.name, first.lineno)
    assert first.name != "Module"  # the base class is imported
    imports = [line for line in text.splitlines() if line.startswith(f"from linnet.compiler.{backend}.prelude ")]
    used = CODEGENS[backend].PRELUDE.used(text)
    assert imports == [f"from linnet.compiler.{backend}.prelude import {', '.join(used)}"]
    assert "Module" in used


@pytest.mark.parametrize("backend", sorted(CODEGENS))
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_standalone_output_defines_every_helper_it_calls(backend, name):
    text = _generate(backend, name, standalone=True)
    body, defined = _top_level(text)
    imported = {a.name for node in body if isinstance(node, ast.Import) for a in node.names}
    imported |= {node.module for node in body if isinstance(node, ast.ImportFrom)}
    assert {module.split(".")[0] for module in imported} == {backend}, imported
    prelude = CODEGENS[backend].PRELUDE
    read = {n.id for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    assert read & set(prelude.blocks) <= defined, sorted(read & set(prelude.blocks) - defined)
    assert prelude.used(text)  # at least the base class
    # the base class before the model's classes, the helpers after them
    classes = [
        node for node in body if isinstance(node, ast.ClassDef) and prelude.base in [ast.unparse(b) for b in node.bases]
    ]
    base = next(node for node in body if isinstance(node, ast.ClassDef) and node.name == prelude.base)
    assert base.lineno < classes[0].lineno
    helpers = [node for node in body if getattr(node, "name", None) in set(prelude.blocks) - {prelude.base}]
    assert all(node.lineno > classes[-1].lineno for node in helpers)


@pytest.mark.parametrize("backend", sorted(CODEGENS))
def test_every_helper_name_is_reserved(backend):
    """A local or a Linnet function of generated code never takes (shadows) a helper's name."""
    prelude = CODEGENS[backend].PRELUDE
    public = {name for name in prelude.blocks if not name.startswith("_")}
    assert public <= CODEGENS[backend].RESERVED, sorted(public - CODEGENS[backend].RESERVED)


@pytest.mark.parametrize("backend", sorted(CODEGENS))
def test_the_prelude_text_has_each_definition_of_the_module(backend):
    """What the generator reads from the prelude's text is what importing it defines."""
    if importlib.util.find_spec(backend) is None:
        pytest.skip(f"needs {backend}")
    module = importlib.import_module(f"linnet.compiler.{backend}.prelude")
    framework = {"torch", "F", "nn"} if backend == "torch" else {"jax", "jnp", "lax"}
    names = {n for n in vars(module) if not n.startswith("__")} - framework
    assert set(CODEGENS[backend].PRELUDE.blocks) == names


def _exec_without_linnet(text: str) -> dict:
    """`text` run as a module that may not import linnet."""

    def guarded(name, *args, **kwargs):
        if name.split(".")[0] == "linnet":
            raise ImportError(f"a standalone file imports {name}")
        return builtins.__import__(name, *args, **kwargs)

    namespace = {"__name__": "standalone", "__builtins__": {**vars(builtins), "__import__": guarded}}
    exec(compile(text, "standalone", "exec"), namespace)
    return namespace


def _exec(text: str) -> dict:
    namespace: dict = {"__name__": "generated"}
    exec(compile(text, "generated", "exec"), namespace)
    return namespace


@pytest.mark.torch
@pytest.mark.parametrize("name", ["llama_small", "llama_bf16"])
def test_standalone_torch_runs_as_the_importing_module(name):
    torch = pytest.importorskip("torch")
    program = PROGRAMS[name]
    dtype = getattr(torch, {"f32": "float32", "bf16": "bfloat16"}[program.dtype.name])
    generator = torch.Generator().manual_seed(0)
    tensors = {p.path: (torch.randn(p.shape, generator=generator) * 0.1).to(dtype) for p in program.params}
    ids = torch.randint(0, program.config["vocab_size"], (1, 5), generator=generator)
    outs = []
    for namespace in (_exec(_generate("torch", name, False)), _exec_without_linnet(_generate("torch", name, True))):
        model = namespace[program.root]("cpu")
        model.load_state_dict(tensors, strict=False, assign=True)
        with torch.inference_mode():
            logits = model.forward(ids)
            step = model.step(ids, torch.tensor([0]), torch.tensor([0]))
            step = model.step(ids[:, :1], torch.tensor([5]), torch.tensor([0]))  # one row: `linear`, the cache
        outs.append((logits, step))
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=0)


@pytest.mark.jax
def test_standalone_jax_runs_as_the_importing_module():
    jax = pytest.importorskip("jax")
    import numpy as np

    jax.config.update("jax_enable_x64", True)
    program = PROGRAMS["llama_small"]
    rng = np.random.default_rng(0)
    params = {p.path: (rng.standard_normal(p.shape) * 0.1).astype(np.float32) for p in program.params}
    ids = rng.integers(0, program.config["vocab_size"], (1, 5))
    outs = []
    for namespace in (
        _exec(_generate("jax", "llama_small", False)),
        _exec_without_linnet(_generate("jax", "llama_small", True)),
    ):
        outs.append(np.asarray(namespace["forward"](namespace["fuse_weights"](params), ids)))
    np.testing.assert_array_equal(outs[0], outs[1])
