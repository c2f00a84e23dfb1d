"""`linnet/showIR`, `linnet/showGenerated`, `linnet/backends` and the `linnet.run` command.

Backends, their labels and their code views come from the registry
(`linnet.runtimes.backends`, which imports no framework). The Core IR and the generated
PyTorch and JAX sources are made in the server's process: the code generators emit text
without importing their framework. StableHLO (needs jax), the ONNX graph (needs onnx) and runs
(need torch, jax or onnxruntime) go to a worker: the `linnet` CLI in a subprocess
(`linnet stablehlo`, `linnet onnx --text`, `linnet run --format json`), run on a copy of the
editor's text, so unsaved edits count and the server never imports a framework. The copy sits
in a temporary folder, or, when the text imports files (found relative to it), next to the
original as a hidden file, deleted after. The files it imports are read as the editor holds them
too (`buffers`: the open documents' texts, by path), as diagnostics and hovers read them: in this
process through `linnet.ir.analyses.buffers`, in a worker from a JSON file of them
(`linnet --buffers FILE ...`).
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

from linnet.errors import LinnetError

# How each code view is made: in this process (a code generator, no framework) or by a worker's
# `linnet` command. The views offered are the registry's (`CODE_VIEWS`, `TARGETS`).
IN_PROCESS_VIEWS = ("torch", "jax")
WORKER_VIEWS = {"stablehlo": ["stablehlo"], "onnx": ["onnx", "--text"]}
WORKER_TIMEOUT_S = 600.0


def __getattr__(name: str):
    """`BACKENDS`, `CODE_VIEWS` and `TARGETS`: the backend registry's, imported on first use (it imports numpy:
    ~0.1 s of the server's start, before any lens or view is asked for)."""
    if name in ("BACKENDS", "CODE_VIEWS", "TARGETS"):
        from linnet.runtimes.backends import BACKENDS, CODE_VIEWS

        return BACKENDS if name == "BACKENDS" else CODE_VIEWS
    raise AttributeError(name)


def _registry():
    from linnet.runtimes.backends import BACKENDS, CODE_VIEWS

    return BACKENDS, CODE_VIEWS


def backend_list() -> list[dict]:
    """`linnet/backends`: every backend of the registry with its label, code view, dtypes, devices
    and numerics, and whether the worker's Python can run it on the CPU (judged from what is
    installed in this one, without importing a framework)."""
    return [b.describe("cpu", probe=False) for b in _registry()[0].values()]


def backend_label(name: str) -> str:
    backends = _registry()[0]
    return backends[name].label if name in backends else name


class ViewError(Exception):
    """The source cannot be shown or run as asked; the message says why (shown to the user)."""


def _program(path: str, text: str, preset: str | None, buffers: dict[str, str] | None):
    from linnet.ir.analyses import buffers as reading
    from linnet.ir.build import bind_config, check_source, lower_program

    try:
        with reading(buffers or {}):
            info = check_source(path, text, preset)
            return lower_program(bind_config(info, {}))
    except LinnetError as err:
        raise ViewError(str(err)) from err


def show_ir(path: str, text: str, preset: str | None, buffers: dict[str, str] | None = None) -> str:
    """The Core IR of the file's root model under `preset` (`linnet ir`), the files it imports read from
    `buffers` (path -> text) where given. Raises ViewError."""
    from linnet.ir import format_program

    return format_program(_program(path, text, preset, buffers))


def show_generated_in_process(
    path: str, text: str, target: str, preset: str | None, buffers: dict[str, str] | None = None
) -> str:
    """Generated PyTorch or JAX source (`linnet torch`, `linnet jax`), as `show_ir`. Raises ViewError."""
    program = _program(path, text, preset, buffers)
    if target == "torch":
        from linnet.compiler.torch.codegen import generate
    else:
        from linnet.compiler.jax.codegen import generate
    try:
        return generate(program)
    except LinnetError as err:
        raise ViewError(str(err)) from err


@dataclass
class WorkerResult:
    returncode: int
    stdout: str
    stderr: str


async def run_worker(
    interpreter: str | None,
    args: list[str],
    path: str,
    text: str,
    timeout: float,
    buffers: dict[str, str] | None = None,
) -> WorkerResult:
    """Run `python -m linnet ARGS...` on a temporary copy of `text` named like `path` (the
    placeholder `{file}` in `args`), with the copy's path replaced by `path` in the output; the
    files it imports are read from `buffers` (path -> text) where given. Raises ViewError when the
    interpreter cannot start or the run exceeds `timeout` seconds."""
    name = Path(path).name if path.endswith(".linnet") else "source.linnet"
    import tempfile  # here: with shutil, ~10 ms of a start that never runs a view

    with tempfile.TemporaryDirectory(prefix="linnet-lsp-") as tmp:
        copy = Path(tmp) / name
        beside = Path(path).parent
        if _imports_files(text) and beside.is_dir():
            copy = beside / f".{Path(name).stem}.linnet-lsp-{uuid.uuid4().hex[:8]}.linnet"
        copy.write_text(text, encoding="utf-8")
        given = None
        if buffers:
            given = Path(tmp) / "buffers.json"
            given.write_text(json.dumps(buffers), encoding="utf-8")
        try:
            return await _run(interpreter, args, path, copy, timeout, given)
        finally:
            if copy.parent != Path(tmp):
                copy.unlink(missing_ok=True)


def _imports_files(text: str) -> bool:
    """Whether a source imports a file (a path relative to it), not only std modules."""
    return re.search(r'^from[ \t]+"', text, re.M) is not None


async def _run(
    interpreter: str | None, args: list[str], path: str, copy: Path, timeout: float, buffers: Path | None
) -> WorkerResult:
    """Run the worker on `copy`, reading the files the JSON file `buffers` maps from it; its output names `path`
    instead."""
    given = ["--buffers", str(buffers)] if buffers is not None else []
    argv = [interpreter or sys.executable, "-m", "linnet", *given, *[str(copy) if a == "{file}" else a for a in args]]
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            stdin=asyncio.subprocess.DEVNULL,
        )
    except OSError as err:
        raise ViewError(f"cannot start the worker `{argv[0]}`: {err}") from err
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except asyncio.TimeoutError:
        proc.kill()
        await proc.wait()
        raise ViewError(f"`linnet {args[0]}` took longer than {timeout:.0f} s and was stopped") from None
    except asyncio.CancelledError:
        proc.kill()
        await proc.wait()
        raise

    def restore(s: bytes) -> str:
        return s.decode("utf-8", "replace").replace(str(copy), path)

    return WorkerResult(proc.returncode or 0, restore(out), restore(err))


async def show_generated(
    interpreter: str | None,
    path: str,
    text: str,
    target: str,
    preset: str | None,
    buffers: dict[str, str] | None = None,
) -> str:
    """`linnet/showGenerated`: the file as `target` source, its imports read from `buffers` where given. Raises
    ViewError."""
    targets = _registry()[1]
    if target not in targets:
        raise ViewError(f"unknown target `{target}` (targets: {', '.join(targets)})")
    if target in IN_PROCESS_VIEWS:
        return await asyncio.to_thread(show_generated_in_process, path, text, target, preset, buffers)
    command, *options = WORKER_VIEWS[target]
    args = [command, "{file}", *options]
    if preset:
        args += ["--preset", preset]
    result = await run_worker(interpreter, args, path, text, WORKER_TIMEOUT_S, buffers)
    if result.returncode != 0:
        raise ViewError(result.stderr.strip() or f"`linnet {args[0]}` failed with exit code {result.returncode}")
    return result.stdout


async def run_entry(
    interpreter: str | None,
    path: str,
    text: str,
    entry: str,
    backend: str,
    preset: str | None,
    buffers: dict[str, str] | None = None,
) -> dict:
    """`linnet.run`: the entry on random inputs (and random weights) in a worker; the report of
    `linnet run --format json` (output shapes, dtypes, summary values, time in ms, and any
    disagreement between the checker's shapes and the runtime's). The files it imports are read
    from `buffers` where given. Raises ViewError."""
    backends = _registry()[0]
    if backend not in backends:
        raise ViewError(f"unknown backend `{backend}` (backends: {', '.join(backends)})")
    args = ["run", "{file}", "--entry", entry, "--backend", backend, "--format", "json"]
    if preset:
        args += ["--preset", preset]
    return await worker_report(interpreter, args, path, text, buffers)


async def worker_report(
    interpreter: str | None, args: list[str], path: str, text: str, buffers: dict[str, str] | None = None
) -> dict:
    """The JSON report a worker `linnet ARGS... --format json` prints as its last `{` line, whatever
    its exit status (a disagreement exits 1 with a report), the files it imports read from `buffers`
    where given. Raises ViewError with the worker's stderr when it prints none (a source that does
    not check, an unknown entry)."""
    result = await run_worker(interpreter, args, path, text, WORKER_TIMEOUT_S, buffers)
    lines = [ln for ln in result.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        raise ViewError(result.stderr.strip() or f"`linnet {args[0]}` failed with exit code {result.returncode}")
    try:
        return json.loads(lines[-1])
    except json.JSONDecodeError as err:
        raise ViewError(f"`linnet {args[0]}` printed something that is not its report: {err}") from err


def _output_summary(o: dict) -> str:
    """`[1, 8, 49152] float32 (mean …, std …, min …, max …)`; `(empty)` for a zero-sized dim, which `linnet run`
    reports without summary values."""
    if o.get("mean") is None:
        return f"{o['shape']} {o['dtype']} (empty)"
    return (
        f"{o['shape']} {o['dtype']} (mean {o['mean']:.4g}, std {o['std']:.4g}, min {o['min']:.4g}, max {o['max']:.4g})"
    )


def summary(report: dict) -> str:
    """One line for the editor: `forward on PyTorch: [1, 8, 49152] float32 (mean …) in 12.3 ms`."""
    outs = "; ".join(_output_summary(o) for o in report.get("outputs", []))
    backend = backend_label(report.get("backend", ""))
    preset = f" under preset `{report['preset']}`" if report.get("preset") else ""
    text = f"{report.get('entry')} on {backend}{preset}: {outs} in {report.get('time_ms', 0):.1f} ms"
    for d in report.get("disagreements", []):
        text += f"; disagreement: {d}"
    return text
