"""Linear layers: recognising them, and fusing the weights of those that share an input.

`recognize_linear`: `x @ transpose(w)` with a 2-d `w` whose transpose nothing else reads is
the `linear(x, w)` op (what `torch.nn.functional.linear` computes), so every backend contracts
the weight in the layout it is stored in, without materialising its transpose.

`fuse_linear_weights`: linear layers of one input whose weights are parameters that nothing
else reads (q, k and v; gate and up) become one `linear` over their weights concatenated along
the output dim, and a `split` of its result. The concatenated weight is a tensor the program
makes at load (`Program.param_transforms`), named `fused_key(names)`
(`model.layers.0.self_attn.{q,k,v}_proj.weight`). Each output column is the same dot product
as before; on XLA's and ONNX Runtime's CPU backends one larger product is faster than several
small ones at batch 1 (a SmolLM2 decode step: 33 ms against 37 on XLA, measured when the JAX
backend did this itself).

`concat_linear_weights`: the same groups as one `linear` over a `concat` of the weights, each parameter keeping its
name (the PyTorch module's `state_dict()` keys are the checkpoint's): the backend lays the group out in one buffer
and runs the concat as a view of it.
"""

from __future__ import annotations

import os
import re
from collections import Counter

from ..types.dims import Dim
from .core import LOOP_PLACEHOLDER, Graph, Op, ParamTransform, Program, Value, tensor_type


def recognize_linear(program: Program) -> None:
    """Turn `matmul(x, transpose(w))` into `linear(x, w)` in every graph (in place; the
    transposes left unread are removed by the next dead-code pass)."""
    for g in program.graphs():
        _recognize(g)


def _recognize(g: Graph) -> None:
    uses = Counter(id(v) for op in g.ops for v in op.inputs())
    uses.update(id(v) for v in list(g.outputs) + list(g.state_updates.values()))
    for op in g.ops:
        if op.name == "loop":
            _recognize(op.body)
        if op.name != "matmul":
            continue
        t = op.args["y"].producer
        if (
            t is not None
            and t.name == "transpose"
            and t.args["x"].rank == 2
            and {t.args["dim0"], t.args["dim1"]} in ({-2, -1}, {0, 1})
            and uses[id(op.args["y"])] == 1
        ):
            op.name = "linear"
            op.args = {"x": op.args["x"], "weight": t.args["x"]}


# ----------------------------------------------------------------------------- weight fusion


def fused_key(names: list[str]) -> str:
    """The name of weights fused for one dot: their names as `prefix{a,b,c}suffix`
    (`model.layers.0.self_attn.{q,k,v}_proj.weight`); `fused_names` reads it back."""
    prefix = os.path.commonprefix(names)
    suffix = os.path.commonprefix([n[len(prefix) :][::-1] for n in names])[::-1]
    middles = [n[len(prefix) : len(n) - len(suffix)] for n in names]
    return f"{prefix}{{{','.join(middles)}}}{suffix}"


def split_fused_key(key: str) -> tuple[str, list[str], str] | None:
    """`prefix{a,b,c}suffix` as (prefix, [a, b, c], suffix); None for a plain name."""
    m = re.fullmatch(r"([^{}]*)\{([^{}]*)\}([^{}]*)", key)
    return None if m is None else (m[1], m[2].split(","), m[3])


def fused_names(key: str) -> list[str] | None:
    """The names of a `fused_key`, in order (concatenated along dim 0); None for a plain name."""
    parts = split_fused_key(key)
    return None if parts is None else [parts[0] + middle + parts[2] for middle in parts[1]]


def fuse_linear_weights(program: Program) -> None:
    """Fuse the weights of linear layers that share an input (see the module docstring), in
    every graph, recording the fused weights in `program.param_transforms` and in their module
    classes (in place). A weight that something else reads too (a tied embedding) is not fused,
    nor is its group; nor are the groups of a module class whose instances would fuse different
    groups (its record holds for every instance)."""
    where = instances(program)
    candidates = [
        (g, receiver, ops, paths) for g, receiver in _graphs_with_receivers(program) for ops, paths in _groups(g)
    ]
    reads = _param_reads(program, where)
    while True:
        claimed: Counter = Counter()
        groups: dict[str, set[str]] = {}
        for _, receiver, _, paths in candidates:
            for prefix in where.get(receiver, []):
                key = prefix + fused_key(paths)
                for p in paths:
                    for concrete in _expand(prefix + p, program):
                        claimed[concrete] += 1
                        groups.setdefault(concrete, set()).add(key)
        bad = {p for p, n in claimed.items() if n != reads[p] or len(groups[p]) != 1}
        uneven = _uneven_classes(program, candidates, where)
        kept = [
            c
            for c in candidates
            if _owner(program, c[1], fused_key(c[3]))[0] not in uneven
            and not any(x in bad for prefix in where.get(c[1], []) for p in c[3] for x in _expand(prefix + p, program))
        ]
        if len(kept) == len(candidates):
            break
        candidates = kept
    made: set[str] = set()
    for g, receiver, ops, paths in candidates:
        _fuse(program, g, receiver, ops, paths, where, made)


def concat_linear_weights(program: Program) -> None:
    """`fuse_linear_weights` keeping every parameter's name: linear layers of one input whose weights are parameters
    that nothing else reads become one `linear` over the `concat` of their weights along dim 0 and a `split` of its
    result (in place). A backend that lays the weights out adjacently in one buffer (`concat_weight_groups` says
    which) runs the concat as a view of it; anywhere else it is the concatenation, the same values. Groups are
    per instance (SAM's first two-way block joins its attention's q, k and v, the second only q and k); a weight is
    joined the same way wherever it is read, or not at all (two entries that would join q, k and v and only q and k
    join neither: one buffer cannot lay out both)."""
    where = instances(program)
    candidates = [
        (g, ops, [p for prefix in where.get(receiver, []) for p in _concrete_group(prefix, paths, program)])
        for g, receiver in _graphs_with_receivers(program)
        for ops, paths in _groups(g)
    ]
    group_of: dict[str, set[tuple[str, ...]]] = {}
    for _, _, groups in candidates:
        for group in groups:
            for p in group:
                group_of.setdefault(p, set()).add(group)
    for g, ops, groups in candidates:
        if all(len(group_of[p]) == 1 for group in groups for p in group):
            _concat(g, ops)


def _concrete_group(prefix: str, paths: list[str], program: Program) -> list[tuple[str, ...]]:
    """The groups of absolute paths that relative `paths` (one group, perhaps with loop placeholders) stand for in
    the instance at `prefix`: one per loop index."""
    return list(zip(*[_expand(prefix + p, program) for p in paths]))


def _concat(g: Graph, ops: list[Op]) -> None:
    weights = [op.args["weight"] for op in ops]
    reads = [w.producer for w in weights]  # `param` ops read nothing: each moves before the first layer
    g.ops = [op for op in g.ops if op not in reads]
    concat = Op("concat", {"xs": weights, "dim": 0}, [], origin=ops[0].origin)
    rows = sum(w.dims[0].as_int() for w in weights)
    concat.results = [Value(tensor_type(weights[0].dtype, [Dim.of(rows), weights[0].dims[1]]), "weight", concat)]
    _one_linear(g, ops, [*reads, concat], concat.result)


def _one_linear(g: Graph, ops: list[Op], made: list[Op], weight: Value) -> None:
    """Replace linear layers `ops` (one input) with `made` (the ops making `weight`, their weights joined along dim
    0), one `linear` over it and a `split` of its result, where the first of `ops` was (in place)."""
    rows = [op.args["weight"].dims[0].as_int() for op in ops]
    hint = _hint([op.args["weight"].producer.attrs["path"] for op in ops])
    dot = Op("linear", {"x": ops[0].args["x"], "weight": weight}, [], origin=ops[0].origin)
    dot.results = [Value(tensor_type(weight.dtype, list(ops[0].result.dims[:-1]) + [Dim.of(sum(rows))]), hint, dot)]
    split = Op("split", {"x": dot.result, "sizes": [Dim.of(n) for n in rows], "dim": -1}, [], origin=ops[0].origin)
    split.results = [Value(op.result.type, op.result.hint, split) for op in ops]
    first = g.ops.index(ops[0])
    g.ops[first:first] = [*made, dot, split]
    g.ops = [op for op in g.ops if op not in ops]
    _replace_uses(g, {id(op.result): r for op, r in zip(ops, split.results)})


def concat_weight_groups(program: Program) -> list[tuple[str, ...]]:
    """The parameters (absolute paths, in order) that `concat_linear_weights` joined for one linear layer, one tuple
    a group (`joined_linears`): each is read as a whole buffer's rows where a backend lays them out adjacently. A
    concat of parameters that the model writes itself (SAM's tokens) is not a group."""
    where = instances(program)
    out: dict[tuple[str, ...], None] = {}
    for g, receiver in _graphs_with_receivers(program):
        for concat, _, _ in dict.fromkeys(joined_linears(g).values()):
            paths = concat_param_paths(concat)
            for prefix in where.get(receiver, []):
                out.update(dict.fromkeys(_concrete_group(prefix, paths, program)))
    return list(out)


def joined_linears(g: Graph) -> dict[int, tuple[Op, Op, Op]]:
    """The groups `concat_linear_weights` made in `g` (not in its loop bodies): the id of each of a group's ops ->
    (the `concat` of the parameters, the `linear` reading it as its weight, the `split` of its result into each
    weight's rows), where nothing else reads the concat or the linear."""
    readers: dict[int, list[tuple[Op | None, str]]] = {}
    _add_readers(readers, g)
    out: dict[int, tuple[Op, Op, Op]] = {}
    for concat in g.ops:
        if concat_param_paths(concat) is None:
            continue
        (dot, arg), *more = readers.get(id(concat.result), [(None, "")])
        if more or dot is None or dot.name != "linear" or arg != "weight":
            continue
        (split, _), *more = readers.get(id(dot.result), [(None, "")])
        if more or split is None or split.name != "split" or split.args["dim"] not in (-1, dot.result.rank - 1):
            continue
        if [d.as_int() for d in split.args["sizes"]] != [w.dims[0].as_int() for w in concat.args["xs"]]:
            continue
        out[id(concat)] = out[id(dot)] = out[id(split)] = (concat, dot, split)
    return out


def _add_readers(readers: dict[int, list[tuple[Op | None, str]]], g: Graph) -> None:
    """Record in `readers` (id of a value -> (op, argument name) reading it) what reads each value of `g`: its ops,
    and None ("output") for its outputs and state updates."""
    for op in g.ops:
        for name, v in op.args.items():
            for x in v if isinstance(v, (list, tuple)) else [v]:
                if isinstance(x, Value):
                    readers.setdefault(id(x), []).append((op, name))
    for v in [*g.outputs, *g.state_updates.values()]:
        readers.setdefault(id(v), []).append((None, "output"))


def concat_param_paths(op: Op) -> list[str] | None:
    """The parameter paths a `concat` of parameters along dim 0 joins, None for any other op."""
    if op.name != "concat" or op.args["dim"] != 0:
        return None
    producers = [x.producer for x in op.args["xs"]]
    if not all(p is not None and p.name == "param" for p in producers):
        return None
    return [p.attrs["path"] for p in producers]


def _uneven_classes(program: Program, candidates, where) -> set[str]:
    """The module classes whose instances would not all fuse the same groups. A fused weight is recorded
    on its owner class (`ModuleClass.fused`), whose declarations then drop its members in every instance:
    SAM's first two-way block fuses its self-attention's q, k and v (one input), the second only q and k
    (v reads the queries without their position embedding), and the second's v_proj.weight was gone."""
    fused_at: dict[str, dict[str, set[str]]] = {}  # class -> instance prefix -> relative fused keys
    for _, receiver, _, paths in candidates:
        key = fused_key(paths)
        cls, rel = _owner(program, receiver, key)
        for prefix in where.get(receiver, []):
            for concrete in _expand(prefix + key, program):
                fused_at.setdefault(cls, {}).setdefault(concrete[: len(concrete) - len(rel)], set()).add(rel)
    return {
        cls
        for cls, by_instance in fused_at.items()
        if len({frozenset(by_instance.get(prefix, ())) for prefix in where.get(cls, [])}) > 1
    }


def _groups(g: Graph):
    """Groups of `linear` ops of `g` sharing their input, each weight a `param` read only by it."""
    uses = Counter(id(v) for op in g.ops for v in op.inputs())
    by_input: dict[int, list[Op]] = {}
    for op in g.ops:
        w = op.args.get("weight") if op.name == "linear" else None
        if (
            w is not None
            and w.producer is not None
            and w.producer.name == "param"
            and uses[id(w)] == 1
            and w.dims[0].as_int() is not None
            and not set("{},") & set(LOOP_PLACEHOLDER.sub("", w.producer.attrs["path"]))
        ):
            by_input.setdefault(id(op.args["x"]), []).append(op)
    for shared in by_input.values():
        # one input read by the layers of several elements of a module list (each decoder layer's cross-attention
        # keys and values from the one encoder output) makes one group per element: a weight fused across the
        # elements would belong to no module class
        by_owner: dict[str, list[Op]] = {}
        for op in shared:
            by_owner.setdefault(_list_element(op.args["weight"].producer.attrs["path"]), []).append(op)
        for ops in by_owner.values():
            weights = [op.args["weight"] for op in ops]
            if len(ops) >= 2 and len({(w.dims[1].key(), w.dtype.name) for w in weights}) == 1:
                yield ops, [w.producer.attrs["path"] for w in weights]


def _list_element(path: str) -> str:
    """The innermost module-list element holding parameter `path` (`model.layers.0` of
    `model.layers.0.encoder_attn.k_proj.weight`), "" when none."""
    parts = path.split(".")
    last = max((i for i, part in enumerate(parts) if part.isdigit()), default=-1)
    return ".".join(parts[: last + 1])


def _fuse(program: Program, g: Graph, receiver: str, ops: list[Op], paths: list[str], where, made: set) -> None:
    weights = [op.args["weight"] for op in ops]
    key = fused_key(paths)
    rows = [w.dims[0].as_int() for w in weights]
    fused_type = tensor_type(weights[0].dtype, [sum(rows), weights[0].dims[1]])
    read = Op("param", {}, [], {"path": key})
    read.results = [Value(fused_type, _hint(paths), read)]
    _one_linear(g, ops, [read], read.result)
    cls_key, rel = _owner(program, receiver, key)
    cls = program.modules[cls_key]
    cls.params.setdefault(rel, fused_type)
    cls.fused[rel] = [path[len(key) - len(rel) :] for path in paths]
    for prefix in where.get(receiver, []):
        for concrete in _expand(prefix + key, program):
            if concrete not in made:
                made.add(concrete)
                program.param_transforms.append(ParamTransform(concrete, fused_names(concrete)))


def _replace_uses(g: Graph, replace: dict[int, Value]) -> None:
    for op in g.ops:
        for k, v in op.args.items():
            if isinstance(v, Value) and id(v) in replace:
                op.args[k] = replace[id(v)]
            elif isinstance(v, list):
                op.args[k] = [replace.get(id(x), x) if isinstance(x, Value) else x for x in v]
    g.outputs = [replace.get(id(v), v) for v in g.outputs]
    g.state_updates = {k: replace.get(id(v), v) for k, v in g.state_updates.items()}


def _hint(paths: list[str]) -> str:
    parts = split_fused_key(fused_key(paths))
    middles = parts[1] if parts else []
    return "_".join(middles) if middles and all(m.isidentifier() for m in middles) else "fused"


def _owner(program: Program, receiver: str, key: str) -> tuple[str, str]:
    """The module class holding the fused weight `key` (relative to `receiver`) and its name
    there: the class of the members' common parent (`self_attn.{q,k,v}_proj.weight` read in a
    decoder layer belongs to the attention's class as `{q,k,v}_proj.weight`)."""
    # the fused group's brace, not a loop's placeholder before it (`layer.{i0}.attn.{q,k,v}.weight`, a call
    # lowered in its caller's loop)
    start = next(i for i, ch in enumerate(key) if ch == "{" and not LOOP_PLACEHOLDER.match(key, i))
    prefix = key[:start]
    head, _, _ = prefix.rpartition(".")
    cls = receiver
    rel = key
    if head:
        parts = head.split(".")
        i = 0
        while i < len(parts):
            child, count = program.modules[cls].children[parts[i]]
            i += 2 if count is not None else 1
            cls = child
        rel = key[len(head) + 1 :]
    return cls, rel


# ----------------------------------------------------------------------------- instances and reads


def instances(program: Program) -> dict[str, list[str]]:
    """Module class key -> the path prefixes of its instances in the model (`""` for the
    root, `model.layers.3.self_attn.`...)."""
    out: dict[str, list[str]] = {}

    def visit(key: str, prefix: str) -> None:
        out.setdefault(key, []).append(prefix)
        for name, (child, count) in program.modules[key].children.items():
            if count is None:
                visit(child, f"{prefix}{name}.")
            else:
                for i in range(count):
                    visit(child, f"{prefix}{name}.{i}.")

    if program.root:
        visit(program.root, "")
    return out


def hold_wide_weights_transposed(program: Program) -> None:
    """Record in `program.param_layouts` the parameters a backend holds transposed ("transposed": [K, N] in memory,
    the parameter its [N, K] transpose, strides (1, N)), which its `linear` then runs as blocks of K (the PyTorch
    prelude's): in a decoder (a program with state: its steps run 1 row a request) that decodes at most 2 rows at
    once (`program.max_batch`), the f32 weights [N, K] with N > K that linear layers read and nothing else but row
    lookups (`linear_weights`), weights one linear reads joined (`concat_weight_groups`) as one [sum N, K]: q, k
    and v, gate and up, the head, an encoder's wide layers where the model has one, a LoRA adapter's B. An encoder
    alone (no state) runs any batch: it keeps the checkpoint's layout. A prompt of 3 to 16 tokens also takes the
    blocks of K, slower there. Measured on a 2-core AVX2 EPYC, each weight's memory refilled in either layout
    (bench/results/weight_layouts_amd_avx2.md): one row through SmolLM2's [1536, 576] gate 198 -> 164 us, its
    [49152, 576] head 5.7 -> 4.0 ms; two rows 328 -> 225 us and 12.7 -> 8.0 ms; from 4 rows 7-21 % slower; no gain
    where N <= K (down 198 -> 217 us); prefill (512 rows, F.linear) alike in both layouts. Its sums run in another
    order than transformers' kernel, so a backend asks for it under `fast` only (`PassOptions.transpose_wide_weights`;
    the PyTorch module's, on the CPU)."""
    if program.max_batch > 2 or not program.state:
        return
    shapes = {s.path: s.shape for s in program.params if s.type.dtype.name == "f32" and len(s.shape) == 2}
    weights = linear_weights(program)
    # a group joined for one linear (`concat_linear_weights`) is one matrix, held transposed as a whole or not at all
    groups = concat_weight_groups(program)
    grouped = {p for group in groups for p in group}
    for group in [(p,) for p in weights if p not in grouped] + groups:
        if all(p in weights and p in shapes for p in group) and len({shapes[p][1] for p in group}) == 1:
            if sum(shapes[p][0] for p in group) > shapes[group[0]][1]:
                program.param_layouts.update(dict.fromkeys(group, "transposed"))


def linear_weights(program: Program) -> set[str]:
    """The parameters (absolute paths) that linear layers read as their weight and nothing else reads but row
    lookups (`take`, a tied embedding): a backend may hold these in whichever layout its matmul kernels read
    fastest, since no other op sees their strides (the PyTorch generated module stores the wide ones transposed:
    `LinnetModule.bind`). A parameter that anything else reads (a norm, a matmul, a call, an output) is left out,
    in every instance, and so is a table that only lookups read (no matmul would gain)."""
    where = instances(program)
    readers: dict[int, list[tuple[Op | None, str]]] = {}  # id(value) -> (op, argument name) reading it
    params: list[tuple[Value, str]] = []  # each `param` op's value, with its receiver class
    for g, receiver in _graphs_with_receivers(program):
        params += [(op.result, receiver) for op in g.ops if op.name == "param"]
        _add_readers(readers, g)
    good: set[str] = set()
    bad: set[str] = set()
    linear: set[str] = set()  # read by a linear layer at least once
    for value, receiver in params:
        paths = [
            p for prefix in where.get(receiver, []) for p in _expand(prefix + value.producer.attrs["path"], program)
        ]
        # a weight joined with others for one linear layer (`concat_linear_weights`) is read through the concat
        direct = readers.get(id(value), [])
        through = [
            (reader, arg)
            for op, _ in direct
            if op is not None and concat_param_paths(op) is not None
            for reader, arg in readers.get(id(op.result), [])
        ]
        if any(op is not None and op.name == "linear" for op, _ in direct + through):
            linear.update(paths)
        only_linear = all(
            (op is not None and op.name == "linear" and name == "weight" and op.args["x"] is not value)
            or (
                op is not None
                and op.name == "take"
                and name == "x"
                and all(v is not value for k, v in op.args.items() if k != "x")
            )
            or (op is not None and concat_param_paths(op) is not None)
            for op, name in direct
        ) and all(op is not None and op.name == "linear" and name == "weight" for op, name in through)
        (good if only_linear else bad).update(paths)
    return (good - bad) & linear


def _graphs_with_receivers(program: Program):
    """Every graph and loop body with the class its paths are relative to."""

    def bodies(g: Graph):
        yield g
        for op in g.ops:
            if op.name == "loop":
                yield from bodies(op.body)

    for top in program.graphs():
        if top.receiver is not None:
            for g in bodies(top):
                yield g, top.receiver


def _param_reads(program: Program, where) -> Counter:
    """Absolute parameter path -> how many `param` ops read it, over every graph and instance."""
    reads: Counter = Counter()
    for g, receiver in _graphs_with_receivers(program):
        for op in g.ops:
            if op.name == "param":
                for prefix in where.get(receiver, []):
                    for p in _expand(prefix + op.attrs["path"], program):
                        reads[p] += 1
    return reads


def _expand(path: str, program: Program) -> list[str]:
    """A path with loop placeholders as every concrete path it stands for."""
    m = LOOP_PLACEHOLDER.search(path)
    if m is None:
        return [path]
    head = path[: m.start()].rstrip(".")
    count = _list_count(program, head)
    out = []
    for i in range(count):
        out += _expand(path[: m.start()] + str(i) + path[m.end() :], program)
    return out


def _list_count(program: Program, path: str) -> int:
    """The length of the list of submodules at absolute `path` (`model.layers`)."""
    cls = program.modules[program.root]
    parts = path.split(".")
    i = 0
    while i < len(parts):
        child, count = cls.children[parts[i]]
        if i == len(parts) - 1:
            return count or 0
        i += 2 if count is not None else 1
        cls = program.modules[child]
    return 0
