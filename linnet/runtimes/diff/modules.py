"""`linnet diff FILE --weights W`: Linnet against the reference implementation of the checkpoint, module by module.

    report = diff_model("examples/llama.linnet", "smollm2-135m-instruct")
    report.first        # the first module, in the reference's execution order, whose output differs (or None)

The same seeded inputs go through each entry of the source on Linnet's PyTorch backend (generated code, the weights
loaded through the real loading path) and through the reference's call for that entry
(`linnet.runtimes.diff.reference`).
Every module of both records its outputs: the reference through forward hooks on its `nn.Module`s, Linnet by
wrapping the `forward` and `step` methods of its generated module tree, whose paths are the checkpoint's names; so
`model.layers.0.self_attn` is one key on both sides, and its k-th call on one side is compared with its k-th call
on the other. A Linnet `step` at positions 0 computes what the reference's `forward` does on the same tokens, so a
step's modules are compared with the reference's forward. Linnet inlines the linear layers and norms into their
parent's code (parameters of the parent, not modules): their outputs are recorded from the op that takes their
tensors (`linnet.runtimes.diff.leaves`), and a leaf no single op computes is compared through its parent.

Outputs agree when max |Δ| <= tolerance * max(1, max |reference|) (relative where activations are large). A
module whose shapes differ between the two (a reference returning its heads unmerged) is listed as not compared,
except each entry's output, where a shape difference is a difference. Differences are sorted by the reference's
execution order: the first is the innermost module that diverged first.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from linnet.runtimes.diff.leaves import LeafOutputs, leaf_tensors
from linnet.runtimes.diff.reference import NoCall, ReferenceUnavailable, load_reference, reference_call

__all__ = ["DiffReport", "ModuleDiff", "ReferenceUnavailable", "TOLERANCE", "diff_model", "diff_traces"]

TOLERANCE = 1e-4  # f32 against the reference in f32: ARCHITECTURE.md's "about 1e-4 on logits"
# dims of the random inputs other than an image's (the config's image_size): batch, tokens, texts (SigLIP), the
# time ids of SDXL's added conditions (six: original size, crop, target size); SAM's prompts per image (P)
SIZES = {"B": 2, "S": 8, "T": 2, "N": 6, "P": 2}


@dataclass
class ModuleDiff:
    """One module output compared: `name` its checkpoint path ("" for the entry's output), `call` which call of it
    in `entry`, `order` its place in the reference's execution, max |Δ| (None: shapes differ), `scale` max
    |reference|, both shapes, and `location` where the source declares the member (path, line, column; 1-based)."""

    name: str
    entry: str
    call: int
    order: int
    max_abs_diff: float | None
    scale: float
    ours_shape: list[int]
    ref_shape: list[int]
    location: tuple[str, int, int] | None = None
    agree: bool = True

    @property
    def label(self) -> str:
        return self.name or f"<output of {self.entry}>"

    def to_json(self) -> dict:
        return {"name": self.name, "entry": self.entry, "call": self.call, "max_abs_diff": self.max_abs_diff,
                "scale": self.scale, "ours_shape": self.ours_shape, "ref_shape": self.ref_shape,
                "location": list(self.location) if self.location else None, "agree": self.agree}  # fmt: skip


@dataclass
class DiffReport:
    """What `linnet diff` found: the reference and its architecture, the tolerance, each entry's inputs, every
    module compared (`modules`, in execution order per entry), entries skipped with the reason, modules found on
    one side only, and modules not compared (shapes differ)."""

    file: str
    weights: str
    reference: str
    architecture: str
    tolerance: float
    inputs: dict[str, list[dict]] = field(default_factory=dict)
    modules: list[ModuleDiff] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    only_linnet: list[str] = field(default_factory=list)
    not_compared: list[str] = field(default_factory=list)

    @property
    def differences(self) -> list[ModuleDiff]:
        return [m for m in self.modules if not m.agree]

    @property
    def first(self) -> ModuleDiff | None:
        diffs = self.differences
        return diffs[0] if diffs else None

    def to_json(self) -> dict:
        return {"file": self.file, "weights": self.weights, "reference": self.reference,
                "architecture": self.architecture, "tolerance": self.tolerance, "inputs": self.inputs,
                "modules": [m.to_json() for m in self.modules], "skipped": self.skipped,
                "only_linnet": self.only_linnet, "not_compared": self.not_compared,
                "first": self.first.to_json() if self.first else None,
                "differences": len(self.differences)}  # fmt: skip


class Recorder:
    """Outputs per module path, in call order, and the order each path was first seen (post-order: a module
    finishes after its children)."""

    def __init__(self) -> None:
        self.outputs: dict[str, list[Any]] = {}
        self.order: dict[str, int] = {}
        self.sequence: list[tuple[str, int]] = []  # (name, its call) of every output, in the order recorded

    def add(self, name: str, value) -> None:
        from linnet.runtimes.diff.reference import first_tensor

        tensor = first_tensor(value)
        if tensor is None:
            return
        calls = self.outputs.setdefault(name, [])
        self.sequence.append((name, len(calls)))
        calls.append(tensor.detach().double().cpu())
        self.order.setdefault(name, len(self.order))

    def clear(self) -> None:
        self.outputs.clear()
        self.order.clear()
        self.sequence.clear()


def hook_reference(model, recorder: Recorder) -> list:
    """Forward hooks on every submodule of the reference `model` writing into `recorder` by name; returns their
    handles (a reference model reused by several diffs is unhooked after each)."""
    return [
        module.register_forward_hook(lambda _m, _args, out, name=name: recorder.add(name, out))
        for name, module in model.named_modules()
        if name
    ]


def match_modules(
    ref, root, paths: set[str], leaves: set[str] = frozenset()
) -> tuple[dict[str, str], set[str], set[str]]:
    """Reference module name -> Linnet module path. Where transformers names its modules as the checkpoint does
    the names are equal; transformers 5 renames some on load (ViT's `vit.encoder.layer.0` is its `vit.layers.0`), so
    a module is also matched by its parameters: the reference module whose parameters hold the same values as the
    Linnet module's (both loaded from one checkpoint), when that pairing is one to one. Modules without parameters
    match by name alone, and so do the `leaves` (the inlined layers, `leaves.leaf_tensors`), where the parameters
    agree too. Returns (the pairs, the reference names matched by parameters, the reference names of modules without
    parameters, the leaves)."""
    theirs = _parameter_sets(ref.named_modules(), _checkpoint_tensors(ref))
    ours = _parameter_sets(((p, None) for p in paths | leaves), _checkpoint_tensors(root))
    by_set: dict[frozenset, list[str]] = {}
    for name, key in theirs.items():
        if key:
            by_set.setdefault(key, []).append(name)
    out: dict[str, str] = {}
    renamed: set[str] = set()
    for path in paths:
        key = ours.get(path, frozenset())
        if path in theirs and theirs[path] == key:
            out[path] = path
            continue
        candidates = by_set.get(key, []) if key else []
        mine = [p for p in paths if ours.get(p) == key]
        if len(candidates) == 1 and len(mine) == 1 and candidates[0] not in out:
            out[candidates[0]] = path
            renamed.add(candidates[0])
    for leaf in leaves:
        if leaf in theirs and leaf not in out and theirs[leaf] == ours[leaf]:
            out[leaf] = leaf
    return out, renamed, {name for name, key in theirs.items() if not key}, set(leaves)


def _checkpoint_tensors(module) -> list:
    """(name, tensor) of what a checkpoint holds for `module`: its parameters and persistent buffers (BatchNorm's
    running statistics are buffers in torch, parameters on Linnet's side), floating point only (not BatchNorm's
    step count)."""
    return [(n, t) for n, t in module.state_dict(keep_vars=True).items() if t.is_floating_point()]


def _parameter_sets(modules, parameters) -> dict[str, frozenset]:
    """Module name -> the fingerprints (shape and a few values) of the parameters under it."""
    params = [(name, _fingerprint(t)) for name, t in parameters]
    sets = {}
    for name, _ in modules:
        prefix = name + "." if name else ""
        sets[name] = frozenset(f for p, f in params if p.startswith(prefix))
    return sets


def _fingerprint(t) -> tuple:
    """A parameter's shape and values at a few places, as stored (rows of a transposed one differ: not matched)."""
    flat = t.detach().reshape(-1)
    n = flat.numel()
    picks = flat[:: max(1, n // 16)][:16] if n else flat
    return (tuple(t.shape), tuple(round(float(v), 6) for v in picks.double()))


def hook_linnet(root, recorder: Recorder) -> list[str]:
    """Wrap the `forward` and `step` methods of every generated module under `root` (a LinnetModule's tree) so
    each call's output goes into `recorder` by checkpoint path. Returns the paths wrapped."""
    paths = []
    for name, module in root.named_modules():
        methods = [m for m in ("forward", "step") if m in type(module).__dict__]
        if not name or not methods:
            continue  # the root (the entry's output is compared as such), parameter holders, lists
        paths.append(name)
        for method in methods:
            bound = getattr(module, method)

            def wrapped(*args, _bound=bound, _name=name, **kwargs):
                out = _bound(*args, **kwargs)
                recorder.add(_name, out)
                return out

            object.__setattr__(module, method, wrapped)  # an instance attribute: the generated code calls it
    return paths


def diff_model(
    source: str | Path,
    weights: str,
    reference: str = "transformers",
    preset: str | None = None,
    config: dict | None = None,
    tolerance: float = TOLERANCE,
    seed: int = 0,
    reference_model=None,
) -> DiffReport:
    """Run every entry of `source` on `weights` through Linnet's PyTorch backend and through the reference
    (`reference`: "transformers", "diffusers" or "sentence-transformers"; `reference_model`: one already loaded,
    reused), on the same seeded inputs, and compare every module both have.

    Returns a DiffReport. Raises ReferenceUnavailable when the reference library is missing, has no class for the
    checkpoint's architecture or cannot read it; LinnetError when Linnet cannot load the source on the weights."""
    from linnet.runtimes.backends import get_backend

    source = str(source)
    model = get_backend("torch").load(source, weights, preset=preset, config=config, max_batch=SIZES["B"],
                                      max_positions=64, progress=False)  # fmt: skip
    program = model.module.program
    if reference_model is None:
        ref, arch = load_reference(weights, reference, program.root)
    else:
        ref, arch = reference_model, type(reference_model).__name__
    report = DiffReport(source, str(weights), reference, arch, tolerance)
    ours, theirs = Recorder(), Recorder()
    wrapped = hook_linnet(model.module.root, ours)
    leaves = leaf_tensors(model.module.root, set(wrapped))
    match = match_modules(ref, model.module.root, set(wrapped), set(leaves))
    hooks = hook_reference(ref, theirs)
    ran: set[str] = set()  # the modules of ours that ran without a counterpart
    try:
        for entry in program.entries:
            ours.clear()
            theirs.clear()
            if not _run_entry(model, ref, entry, program, seed, ours, theirs, report, leaves):
                continue
            diff_traces(report, entry, ours, theirs, match)
            ran |= set(ours.outputs) - set(match[0].values())
    finally:
        for hook in hooks:
            hook.remove()
    report.only_linnet = [p for p in wrapped if p in ran]
    _locate(report, source, preset)
    return report


def _run_entry(model, ref, entry, program, seed, ours, theirs, report, leaves) -> bool:
    """Run `entry` on both sides into the recorders (the entry's outputs under ""); False when skipped. An
    encoder-decoder's decoder `step` runs after its `prefill_encoder` on the same audio (the cache it reads), against
    the reference's forward on that audio and those decoder tokens."""
    import torch

    before = "prefill_encoder" if entry == "step" and "prefill_encoder" in program.entries else None
    tensors = _inputs(program, entry, seed)
    report.inputs[entry] = [{"name": n, "shape": list(t.shape), "dtype": str(t.dtype)} for n, t in tensors.items()]
    prefill = _inputs(program, before, seed) if before else {}
    with torch.inference_mode():
        try:
            expected = reference_call(ref, entry, dict(tensors), prefill.get("input_features"))
        except NoCall as why:
            report.skipped.append(f"{entry}: {why}")
            return False
        theirs.add("", expected)
        model.reset_state()
        with LeafOutputs(leaves, ours):  # the linear layers and norms the generated code inlines
            if before:
                model.module.entry(before)(*prefill.values())
            out = model.module.entry(entry)(*tensors.values())
        model.reset_state()
        ours.add("", out)
    return True


def _inputs(program, entry: str, seed: int) -> dict:
    """The seeded random inputs of `entry` by name, as torch tensors (`SIZES`; images at the config's size)."""
    import torch

    from linnet.runtimes.model import random_inputs

    config = program.config
    graph = program.entries[entry]
    image = config.get("image_size") or config.get("vision_config", {}).get("image_size") or 32
    arrays = random_inputs(graph, SIZES | {"H": image, "W": image}, seed, config.get("vocab_size", 100))
    return {v.name: torch.from_numpy(a) for v, a in zip(graph.inputs, arrays)}


def diff_traces(report: DiffReport, entry: str, ours: Recorder, theirs: Recorder, match) -> None:
    """Compare the outputs of every module both recorders hold for `entry` (`match`: `match_modules`' pairs, the
    names matched by parameters and the parameter-free ones), in the reference's order (the entry's output last),
    into `report.modules` and `report.not_compared`. A module matched by its parameters may end where the reference
    splits it (ViT's `intermediate` is its `fc1` then `activation_fn`): its output also agrees with the output of
    the parameter-free modules the reference runs right after. An inlined leaf's op may run in another layout than
    the reference's module (Qwen3's q_norm over [B, heads, S, d] where transformers has [B, S, heads, d]): a leaf's
    outputs are compared as sorted values, layout aside (its parent compares the layout)."""
    pairs, renamed, parameter_free, leaves = match
    pairs = {**pairs, "": ""}
    names = sorted((n for n in theirs.outputs if n in pairs and pairs[n] in ours.outputs),
                   key=lambda n: (n == "", theirs.order[n]))  # fmt: skip
    for name in names:
        path = pairs[name]
        for call, a in enumerate(ours.outputs[path]):
            if call >= len(theirs.outputs[name]):
                break
            options = [theirs.outputs[name][call]]
            if name in renamed:
                options += _following(theirs, name, call, parameter_free)
            compared = (_compare(a, b, entry == "step", path in leaves) for b in options)
            best = min(compared, key=lambda r: (r[0] is None, r[0] or 0.0))
            delta, scale, b = best
            if delta is None and path:
                report.not_compared.append(f"{path} ({entry}): shapes {list(a.shape)} and {list(b.shape)}")
                continue
            agree = delta is not None and delta <= report.tolerance * max(1.0, scale)  # NaN never agrees
            report.modules.append(ModuleDiff(path, entry, call, theirs.order[name], delta, scale, list(a.shape),
                                             list(b.shape), agree=agree))  # fmt: skip


def _compare(a, b, step: bool = False, layout_free: bool = False) -> tuple[float | None, float, Any]:
    """(max |a - b| or None when the shapes differ, max |b|, b). In a `step` (`step`), where `a` is `b` without its
    second dim, `a` is the last position's (the head applied to each row's last token): compared with `b[:, -1]`.
    `layout_free`: the values compared sorted, whatever the shapes, when there are as many."""
    if step and a.dim() == b.dim() - 1 >= 1 and a.shape[0] == b.shape[0] and a.shape[1:] == b.shape[2:]:
        b = b[:, -1]
    scale = float(b.abs().max()) if b.numel() else 0.0
    if layout_free and a.numel() == b.numel() and a.numel():
        return float((a.flatten().sort().values - b.flatten().sort().values).abs().max()), scale, b.reshape(a.shape)
    if tuple(a.shape) != tuple(b.shape):
        return None, scale, b
    return (float((a - b).abs().max()) if a.numel() else 0.0), scale, b


def _following(theirs: Recorder, name: str, call: int, parameter_free: set[str]) -> list:
    """The outputs of the parameter-free modules the reference ran right after call `call` of `name`."""
    i = theirs.sequence.index((name, call)) + 1
    out = []
    while i < len(theirs.sequence) and theirs.sequence[i][0] in parameter_free:
        other, k = theirs.sequence[i]
        out.append(theirs.outputs[other][k])
        i += 1
    return out


def _locate(report: DiffReport, source: str, preset: str | None) -> None:
    """Set each compared module's `location`: its member's declaration in `source` (the root model's name for an
    entry's output or a module declared in another file)."""
    from linnet.semantics.member_paths import member_location
    from linnet.semantics.program import Document

    text = Path(source).read_text(encoding="utf-8")
    analysis = Document(source, text).analyze(preset)
    model = analysis.model
    root = model.resolve(model.ast.name.span) if model is not None else None
    for m in report.modules:
        found = member_location(analysis, source, m.name) if m.name else None
        found = found or root
        if found is not None:
            m.location = (found.path, found.line, found.column)
