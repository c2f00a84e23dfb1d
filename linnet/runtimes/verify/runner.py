"""`verify`: a source's own consistency on its weights or seeded random ones. Loads the model on a PyTorch backend,
runs every check `plan.plan_checks` finds (all of the first way's runs, the KV cache zeroed, then all of the
second's), records every module's method calls on the generated backend (`trace.Recorder`) and compares
(`compare`)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from linnet.errors import RunError
from linnet.ir.reads import tensors_read
from linnet.runtimes.verify.compare import Part, compare_lists, first_parting, rtol_for
from linnet.runtimes.verify.plan import Check, Run, plan_checks
from linnet.runtimes.verify.result import CheckResult, ModulePart, VerifyReport
from linnet.runtimes.verify.trace import Call, Recorder

BACKENDS = ("torch", "torch-interpret")  # module records need the generated module tree (`torch`)
SCALE_STD = 0.1  # of the noise on norm scales (around 1) and biases (around 0) in the random weights


class NothingToCompare(ValueError):
    """The source has no pair of computations to compare (no entry with a batch dim, no cache, no mask)."""


def verify(
    source: str | Path,
    weights: str | Path | None = None,
    *,
    preset: str | None = None,
    config: dict | None = None,
    dtype: str = "f32",
    numerics: str = "equivalent",
    backend: str = "torch",
    device: str = "cpu",
    dims: dict[str, int] | None = None,
    seed: int = 0,
    max_batch: int = 2,
    max_positions: int = 32,
) -> VerifyReport:
    """Check that every pair of computations of `source` that must agree does (`plan`): on `weights`, or on seeded
    random ones (`_random_weights`) at `preset` with `config` overrides. The KV cache has `max_batch`
    rows (the cached batch check needs 2) of `max_positions` positions; `dims` sizes dim variables other than `B`
    and `S` (8 unless given). Checks the entries suggest but cannot run are named in `report.notes`.

    Returns a `VerifyReport` (`report.agree`; per check the entries, the first position, the first module whose
    outputs part, max |Δ| and the tolerance of `dtype` under `numerics`, `compare.RTOL`). Raises ValueError for a
    backend other than `BACKENDS` or a dtype without a tolerance, NothingToCompare, and what loading raises
    (LoadError, BackendError, OSError)."""
    t0 = time.perf_counter()
    if backend not in BACKENDS:
        raise ValueError(f"verify runs on {' or '.join(BACKENDS)}, not {backend}")
    rtol = rtol_for(dtype, numerics)
    from linnet.runtimes.backends import get_backend

    model = get_backend(backend).load(
        source, weights, preset=preset, config=config, dtype=dtype, numerics=numerics, device=device,
        max_batch=max_batch, max_positions=max_positions, random_weights=weights is None, seed=seed, progress=False,
    )  # fmt: skip
    program = model.program
    checks, skipped = plan_checks(program, dims, seed)
    if not checks:
        names = ", ".join(f"`{e}`" for e in program.entries)
        raise NothingToCompare(
            f"{source}: no pair of computations to compare: entries {names} have no batch dim leading an input and "
            "an output, no `forward` with a `step` through a KV cache, and no `attention_mask`"
        )
    if weights is None:
        _random_weights(model, seed)
    recorder = Recorder(model.module.root) if model.module.mode != "interpret" else None
    results = [_run_check(model, check, recorder, rtol) for check in checks]
    return VerifyReport(
        str(source), program.preset, None if weights is None else str(weights), dtype, numerics, backend, rtol,
        results, time.perf_counter() - t0, list(model.notes) + skipped,
    )  # fmt: skip


def _random_weights(model, seed: int) -> None:
    """Seeded weights that make mistakes show: matrices N(0, 1 / fan_in) (fan_in: every axis but the first), so
    attention is not uniform and a mask or a position out of place moves the outputs, as `random_params`' N(0, 0.02)
    barely does; norm scales 1 + N(0, SCALE_STD) and biases N(0, SCALE_STD), so that a scale or a bias dropped from
    one way shows. Bound over the loaded ones (each cast to the working dtype)."""
    rng = np.random.default_rng(seed)
    for spec in model.program.params:
        if not spec.type.dtype.is_float:
            continue
        shape = spec.shape
        noise = rng.standard_normal(shape).astype(np.float32)
        if len(shape) >= 2:
            array = noise / np.sqrt(float(np.prod(shape[1:])))
        elif spec.path.endswith("bias"):
            array = noise * SCALE_STD
        else:
            array = 1 + noise * SCALE_STD
        model.module.bind(spec.path, torch.from_numpy(array))


def _run_check(model, check: Check, recorder: Recorder | None, rtol: float) -> CheckResult:
    """Run `check`'s stages (first way, KV cache zeroed, second way) and compare them stage by stage; the first stage
    whose outputs part gives the position and the module."""
    first = [_call(model, stage.a, recorder) for stage in check.stages]
    model.reset_state()
    second = []
    for stage in check.stages:
        setup = [_call(model, run, recorder) for run in stage.setup]
        second.append((setup, [_call(model, piece.run, recorder) for piece in stage.pieces]))
    model.reset_state()
    result = CheckResult(check.kind, check.ways, check.description, check.axis, agree=True)
    worst: Part | None = None
    for stage, (a_out, a_calls), (setup, pieces) in zip(check.stages, first, second):
        part = compare_lists(a_out, [p[0] for p in pieces], stage.pieces, stage.total, rtol)
        if part is None:
            continue
        if worst is None or (not worst.parts and (part.parts or part.max_delta > worst.max_delta)):
            worst = part  # the first stage that parts, else the largest difference
        if part.parts and result.agree:
            result.agree = False
            found = first_parting(
                a_calls, [p[1] for p in pieces], [c for s in setup for c in s[1]], stage.pieces, stage.total, rtol
            )
            if found is not None:
                result.module = ModulePart(
                    found.call.path, (found.call.method, found.other_method), found.part.position,
                    found.part.max_delta, found.part.tolerance, found.part.shapes, found.before,
                )  # fmt: skip
    if worst is not None:
        result.max_delta, result.tolerance, result.position = worst.max_delta, worst.tolerance, worst.position
    if check.reads:
        result.read_by_one_way = _read_by_one_way(model.program, check)
        result.agree = result.agree and not result.read_by_one_way
    return result


def _call(model, run: Run, recorder: Recorder | None) -> tuple[list[torch.Tensor], list[Call]]:
    """Run one entry call: its outputs (f32 tensors on the CPU) and the module calls recorded during it. Raises
    RunError naming the entry and its input shapes where the backend fails (a RuntimeError of torch's)."""
    calls: list[Call] = []
    try:
        if recorder is None:
            outs = model.run(run.entry, *run.inputs)
        else:
            with recorder.recording():
                calls = recorder.start()
                outs = model.run(run.entry, *run.inputs)
    except RunError:
        raise
    except RuntimeError as err:
        shapes = ", ".join(str(list(a.shape)) for a in run.inputs)
        raise RunError(f"`{run.entry}` failed on inputs {shapes}: {err}") from None
    return [torch.from_numpy(np.asarray(o, dtype=np.float32)) for o in outs], calls


def _read_by_one_way(program, check: Check) -> dict[str, list[str]]:
    """The parameters one way's entries read and the other's do not, under the name of the entry that reads them."""
    reads = []
    for entries in check.reads:
        paths: dict[str, str] = {}
        for entry in sorted(entries):
            for path in tensors_read(program, entry):
                paths.setdefault(path, entry)
        reads.append(paths)
    out: dict[str, list[str]] = {}
    for mine, theirs in ((reads[0], reads[1]), (reads[1], reads[0])):
        for path in sorted(set(mine) - set(theirs), key=_path_order):
            out.setdefault(mine[path], []).append(path)
    return out


def _path_order(path: str):
    return [int(p) if p.isdigit() else p for p in path.split(".")]


__all__ = ["verify", "NothingToCompare", "BACKENDS"]
