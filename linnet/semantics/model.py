"""The root `model`: its parameter tree (checkpoint names and shapes) and its entry functions.

ARCHITECTURE.md, "Models and entry points": a loadable file declares one root `model`;
decoders (models with `state`, i.e. a KV cache) implement `forward(input_ids: i64[B, S]) ->
[B, S, vocab]` and `step(input_ids: i64[B, S], positions: i64[B], rows: i64[B]) -> [B, vocab]`;
encoders implement `forward(input_ids: i64[B, S], attention_mask: i64[B, S]) -> [B, S, hidden]`;
encoder-decoders (Whisper: a decoder with an `encode` entry) implement `encode`, `forward(<encoder inputs>,
decoder_input_ids: i64[B, S]) -> [B, S, vocab]`, `prefill_encoder(<encoder inputs>, rows: i64[B])` (fills the
cross-attention cache of each row) and the decoder's `step`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..syntax import ast as A
from ..syntax.items import Item
from ..types.core import I64, UNKNOWN, ModuleListT, ModuleT, ScalarT, TensorT, Type, UnknownT, format_type
from ..types.dims import Dim, format_dim
from .checker import ItemChecker
from .diagnostics import Finding, SymbolAnchor, symbol
from .names import Binder
from .scope import Binding, Instance, Scope

MAX_TENSORS = 1_000_000  # a model tree's parameters and state, listed one by one
# An encoder-decoder's entries beside `forward` and `step`: the encoder alone, and the encoder writing each row's
# cross-attention cache.
ENCODE_ENTRY, PREFILL_ENCODER_ENTRY = "encode", "prefill_encoder"


@dataclass(slots=True)
class TensorInfo:
    """A parameter or state tensor of the model tree.

    path: the checkpoint name (`model.layers.0.self_attn.q_proj.weight`).
    type: its Linnet type; dims hold config atoms whose values are known under a preset.
    anchor: where it is declared.
    """

    path: str
    type: TensorT
    anchor: SymbolAnchor
    kind: str  # "param" | "state"

    def shape(self) -> tuple[int | None, ...]:
        """Concrete dims (None where not known, e.g. load-time dims of state)."""
        return tuple(d.as_int() if d is not None else None for d in self.type.shape.dims)

    def numel(self) -> int | None:
        n = 1
        for d in self.shape():
            if d is None:
                return None
            n *= d
        return n


@dataclass
class ModelTree:
    """The elaborated tree of the root model under one config."""

    params: list[TensorInfo] = field(default_factory=list)
    state: list[TensorInfo] = field(default_factory=list)
    entries: dict[str, A.FnDef] = field(default_factory=dict)

    @property
    def is_decoder(self) -> bool:
        return bool(self.state)

    @property
    def is_encoder_decoder(self) -> bool:
        """A decoder whose `step` attends an encoder's output, which `encode` computes (Whisper)."""
        return self.is_decoder and ENCODE_ENTRY in self.entries

    def param_count(self) -> int | None:
        total = 0
        for p in self.params:
            n = p.numel()
            if n is None:
                return None
            total += n
        return total


def elaborate(
    checker: ItemChecker,
    inst: Instance,
    prefix: str = "",
    tree: ModelTree | None = None,
    findings: list | None = None,
    open_modules: tuple = (),
) -> ModelTree:
    """Walk the module tree from `inst`: every parameter and state tensor with its path."""
    tree = tree if tree is not None else ModelTree()
    if inst.item in open_modules:
        return tree  # a module that contains itself (reported where it is declared)
    open_modules = open_modules + (inst.item,)
    members = checker.members(inst, report=False)
    for info in members.order:
        if info.present is False:
            continue
        name = info.checkpoint_name or info.name
        path = f"{prefix}{name}"
        anchor = symbol(inst.item, "member", info.name)
        if info.kind == "param" and isinstance(info.type, TensorT):
            tree.params.append(TensorInfo(path, info.type, anchor, "param"))
        elif info.kind == "state" and isinstance(info.type, TensorT):
            tree.state.append(TensorInfo(path, info.type, anchor, "state"))
        elif info.kind == "submodule" and isinstance(info.type, ModuleT):
            elaborate(checker, info.type.instance, path + ".", tree, findings, open_modules)
        elif info.kind == "list" and isinstance(info.type, ModuleListT):
            count = info.type.count.as_int() if info.type.count is not None else None
            if count is None or count < 0:
                continue
            if info.type.element is not None:  # elements that receive their index differ
                if len(tree.params) + len(tree.state) + count > MAX_TENSORS:
                    if findings is not None:
                        findings.append(
                            Finding(
                                "L111", f"`{path}` makes the model tree larger than {MAX_TENSORS:,} tensors", anchor
                            )
                        )
                    continue
                for i in range(count):
                    element = info.type.at(i)
                    if element is not None:
                        elaborate(checker, element, f"{path}.{i}.", tree, findings, open_modules)
                continue
            sub = elaborate(checker, info.type.instance, "", ModelTree(), findings, open_modules)
            size = count * (len(sub.params) + len(sub.state))
            if len(tree.params) + len(tree.state) + size > MAX_TENSORS:
                if findings is not None:
                    findings.append(
                        Finding(
                            "L111",
                            f"`{path}` makes the model tree larger than {MAX_TENSORS:,} "
                            f"tensors ({count:,} copies of {len(sub.params) + len(sub.state)})",
                            anchor,
                        )
                    )
                continue
            for i in range(count):
                for p in sub.params:
                    tree.params.append(TensorInfo(f"{path}.{i}.{p.path}", p.type, p.anchor, "param"))
                for s in sub.state:
                    tree.state.append(TensorInfo(f"{path}.{i}.{s.path}", s.type, s.anchor, "state"))
    return tree


def check_model(checker: ItemChecker, item: Item) -> ModelTree | None:
    """Elaborate the root model under the checker's binding and check its entry contract.
    Findings go to the checker's result."""
    mdef: A.ModuleDef = item.ast
    scope = Scope(checker.global_scope(), "module")
    args: dict[str, Type] = {}
    for p in mdef.params:
        t = checker.param_value(p, scope)
        if isinstance(t, ScalarT) or not _is_config_param(p):
            checker.report(
                "L110",
                "a root `model` takes only configs as parameters (it is built from a preset and a checkpoint)",
                p,
            )
            return None
        args[p.name.id] = t
    # loading builds a root model from one preset's config (`linnet run` refused another, after a clean check)
    if len(mdef.params) != 1:
        checker.report(
            "L110",
            f"a root `model` takes one config (it is built from a preset and a checkpoint), got {len(mdef.params)}",
            mdef.name,
        )
    inst = Instance(item, args)
    findings: list[Finding] = []
    tree = elaborate(checker, inst, "", None, findings)
    checker.result.findings.extend(findings)
    members = checker.members(inst, report=False)
    for info in members.order:
        if info.kind == "fn" and info.node.entry and info.present is not False:
            tree.entries[info.name] = info.node
    if not tree.entries:
        checker.report(
            "L110",
            f"model `{mdef.name.id}` has no entry functions",
            mdef.name,
            notes=["mark the functions a runtime calls with `entry fn`"],
        )
        return tree
    if tree.is_decoder:
        needed = ("forward", "step", PREFILL_ENCODER_ENTRY) if tree.is_encoder_decoder else ("forward", "step")
        for name in needed:
            if name not in tree.entries:
                checker.report(
                    "L110",
                    f"model `{mdef.name.id}` has `state` (a KV cache), so it is a decoder and needs `entry fn {name}`"
                    + (" (an encoder-decoder: it has `entry fn encode`)" if tree.is_encoder_decoder else ""),
                    mdef.name,
                    notes=[_CONTRACT[name]],
                )
    for fn in tree.entries.values():
        _check_entry(checker, inst, fn, tree.is_decoder, tree.is_encoder_decoder)
    return tree


_CONTRACT = {
    "forward": "decoders: `entry fn forward(input_ids: i64[B, S]) -> [B, S, vocab_size]`; encoders: "
    "`entry fn forward(input_ids: i64[B, S], attention_mask: i64[B, S]) -> [B, S, hidden_size]`; encoder-decoders: "
    "`entry fn forward(<encode's inputs>, decoder_input_ids: i64[B, S]) -> [B, S, vocab_size]`",
    PREFILL_ENCODER_ENTRY: "encoder-decoders: `entry fn prefill_encoder(<encode's inputs>, rows: i64[B])`, which "
    "writes the cross-attention cache of row `rows[b]` from batch entry b's encoder output",
    "step": "`entry fn step(input_ids: i64[B, S], positions: i64[B], rows: i64[B]) -> [B, vocab_size]`",
    "decode": "optional, run by generation for one token a row instead of `step` (the same logits and cache writes, "
    "in the form the source chose for decode): `entry fn decode(input_ids: i64[B, 1], positions: i64[B], rows: "
    "i64[B]) -> [B, vocab_size]`",
}

_STEP_PARAMS = (("input_ids", 2), ("positions", 1), ("rows", 1))


def _check_entry(checker: ItemChecker, inst: Instance, fn: A.FnDef, decoder: bool, encoder_decoder: bool) -> None:
    binder = Binder("rigid", checker.generics(fn, report=False))
    scope = Scope(checker.module_scope(inst), "fn")
    sub = ItemChecker(checker.ctx, checker.item, checker.binding)
    params = {}
    for p in fn.params:
        params[p.name.id] = (p, sub.fn_param_type(p, scope, binder))
    for name, atom, _node in binder.new_dims:
        scope.bind(name, Binding(ScalarT("int", Dim.atom(atom)), "dim"))
    binder.frozen = True
    ret = sub.eval_type(fn.ret, scope, binder) if fn.ret is not None else UNKNOWN

    def bad(message, node, which):
        checker.report("L110", message, node, notes=[_CONTRACT[which]])

    _check_entry_dims(checker, fn, list(params.values()))

    # `decode` is a decoder's (generation's one-token step); a model without state may name an entry so for what
    # its reference calls `decode` (diffusers' AutoencoderKL.decode: latents to images).
    if fn.name.id == "step" or (fn.name.id == "decode" and decoder):
        which = fn.name.id
        names = [p.name.id for p in fn.params]
        if names != [n for n, _ in _STEP_PARAMS]:
            bad(f"`{which}` takes (input_ids, positions, rows), got ({', '.join(names)})", fn.name, which)
            return
        for pname, rank in _STEP_PARAMS:
            p, t = params[pname]
            if not _is_i64(t, rank):
                bad(f"`{pname}` of `{which}` is i64 of rank {rank}, got {format_type(t)}", p.type, which)
        one = params["input_ids"][1]
        if (
            which == "decode"
            and isinstance(one, TensorT)
            and len(one.shape.dims) == 2
            and (one.shape.dims[1] is None or one.shape.dims[1].as_int() != 1)
        ):
            t = format_type(one)
            bad(f"`decode` takes one token a row, `input_ids: i64[B, 1]`, got {t}", params["input_ids"][0].type, which)
        if isinstance(ret, TensorT) and len(ret.shape.dims) != 2:
            bad(f"`{which}` returns the last token's logits [B, vocab_size], got {format_type(ret)}", fn.ret, which)
    elif fn.name.id == "forward":
        for pname in ("input_ids", "attention_mask"):
            if pname in params:
                p, t = params[pname]
                if not _is_i64(t, 2):
                    bad(f"`{pname}` of `forward` is i64[B, S], got {format_type(t)}", p.type, "forward")
        if encoder_decoder:
            last = list(params)[-1:]
            if last != ["decoder_input_ids"] or not _is_i64(params["decoder_input_ids"][1], 2):
                bad("an encoder-decoder's `forward` ends with `decoder_input_ids: i64[B, S]`", fn.name, "forward")
        elif decoder and list(params) != ["input_ids"]:
            bad(f"a decoder's `forward` takes (input_ids), got ({', '.join(params)})", fn.name, "forward")
    elif fn.name.id == PREFILL_ENCODER_ENTRY and encoder_decoder:
        if list(params)[-1:] != ["rows"] or not _is_i64(params["rows"][1], 1):
            bad(f"`{PREFILL_ENCODER_ENTRY}` ends with `rows: i64[B]`", fn.name, PREFILL_ENCODER_ENTRY)
    if fn.name.id == "forward":
        # A text model's `forward` returns states or logits per position; one that also takes images
        # (SigLIP's `forward(input_ids, pixel_values)`) returns what its reference's forward does.
        text_only = set(params) <= {"input_ids", "attention_mask"}
        if "input_ids" in params and text_only and isinstance(ret, TensorT) and len(ret.shape.dims) != 3:
            bad(f"`forward` returns [B, S, ...], got {format_type(ret)}", fn.ret, "forward")


def _check_entry_dims(checker: ItemChecker, fn: A.FnDef, params: list[tuple[A.Param, Type]]) -> None:
    """A runtime reads an entry's dims from its inputs' shapes: a `...` parameter has no rank to
    read, and a dim variable that is never a whole dim of a parameter (`S` of `[B, 2 * S, n]`)
    has no axis to read it from. Reports L110 at the parameter's type or the dim."""
    whole = {
        d.key()
        for _, t in params
        if isinstance(t, TensorT)
        for d in t.shape.dims
        if d is not None and len(d.atoms()) == 1
    }
    reported: set[str] = set()
    for p, t in params:
        if not isinstance(t, TensorT) or not isinstance(p.type, A.TensorType):
            continue
        if t.shape.prefix is not None:
            checker.report(
                "L110",
                f"entry parameter `{p.name.id}` has `...`: an entry's inputs have a known rank",
                p.type,
                notes=["write each dim, as in `x: [B, S, c.hidden_size]`"],
            )
            continue
        nodes = p.type.dims if len(p.type.dims) == len(t.shape.dims) else [p.type] * len(t.shape.dims)
        for d, node in zip(t.shape.dims, nodes):
            for a in d.atoms() if d is not None else ():
                if a.kind != "var" or Dim.atom(a).key() in whole or a.name in reported:
                    continue
                reported.add(a.name)
                checker.report(
                    "L110",
                    f"the dim `{a.name}` of entry `{fn.name.id}` is never a whole dim of its parameters, "
                    "so a runtime cannot read it from the inputs' shapes",
                    node,
                    notes=[f"declare the dim as one name (as in `[B, T]`), not `{format_dim(d)}`"],
                )


def _is_i64(t: Type, rank: int) -> bool:
    if isinstance(t, UnknownT):
        return True
    return isinstance(t, TensorT) and t.dtype == I64 and t.shape.prefix is None and len(t.shape.dims) == rank


def _is_config_param(p: A.Param) -> bool:
    return isinstance(p.type, A.NamedType) and p.type.name.id not in ("int", "float", "bool", "str")
