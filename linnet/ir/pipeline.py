"""The passes a backend runs before it emits, chosen by the backend's `PassOptions`.

`prepare(program, options, numerics)` returns a new program (the given one is never changed):

1. inline the calls of layers (`inline.layer_calls`: `Linear`, `RMSNorm`, GPT-2's `Conv1D`...),
   or, with `flatten`, every call and loop (ONNX, the interpreter);
2. `linear` ops from `x @ transpose(w)` (`fusion.recognize_linear`);
3. fold, merge, drop dead code;
4. with `fuse_linear_weights`, one dot over the weights of linear layers sharing an input (with
   `concat_linear_weights`, one dot over their `concat`, each weight keeping its name); with
   `transpose_wide_weights`, the wide weights a backend holds transposed, recorded in `Program.param_layouts`
   (`fusion.hold_wide_weights_transposed`);
5. with `cache_layout`, KV caches held [max_batch * H, T, D] ("flat") or
   [max_batch, T, H * D] ("token_major") (`attention.hold_caches` says which suits what);
6. which composites run natively (`native`: composite -> the numerics under which the
   backend's native form is what the reference computes) and which attention variants apply
   (`attention.choose_attention_variants`), recorded on the ops (`attrs["native"]`,
   `attrs["variant"]`);
7. verify.

Emitters read what the passes recorded; none of them decides a rewrite or changes the program.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .attention import choose_attention_variants, hold_caches
from .core import Graph, Program
from .fusion import concat_linear_weights, fuse_linear_weights, hold_wide_weights_transposed, recognize_linear
from .inline import flatten, inline_calls, layer_calls
from .passes import optimize_program
from .verify import verify_program

NUMERICS = ("equivalent", "fast")


@dataclass(frozen=True)
class PassOptions:
    """What a backend asks of the passes. `native` maps a composite's name to the numerics
    under which the backend runs its native form; `attention` lists the attention variants it
    can emit (`attention.VARIANTS`); `decompose` names composites to run as their bodies
    whatever `native` says (tests compare the two)."""

    flatten: bool = False
    linear: bool = True
    fuse_linear_weights: bool = False
    concat_linear_weights: bool = False
    transpose_wide_weights: bool = False
    cache_layout: str | None = None  # how KV caches are held (`attention.CACHE_LAYOUTS`); None: as declared
    native: dict[str, tuple[str, ...]] = field(default_factory=dict)
    attention: tuple[str, ...] = ()
    decompose: frozenset[str] = frozenset()


def prepare(program: Program, options: PassOptions, numerics: str = "equivalent") -> Program:
    """`program` as a backend with `options` emits it, under `numerics` (see the module
    docstring). Raises ValueError for unknown numerics."""
    if numerics not in NUMERICS:
        raise ValueError(f"numerics must be one of {', '.join(NUMERICS)}, got {numerics!r}")
    p = flatten(program) if options.flatten else inline_calls(program, layer_calls(program))
    if options.linear:
        recognize_linear(p)
    optimize_program(p)
    if options.fuse_linear_weights:
        fuse_linear_weights(p)
        optimize_program(p)
    elif options.concat_linear_weights:
        concat_linear_weights(p)
    if options.transpose_wide_weights:
        hold_wide_weights_transposed(p)
    if options.cache_layout is not None:
        hold_caches(p, options.cache_layout)
    for g in p.graphs():
        _choose_native(g, options, numerics)
    choose_attention_variants(p, options.attention, numerics)
    for g in p.graphs():
        g.name_values()
    verify_program(p)
    return p


def _choose_native(g: Graph, options: PassOptions, numerics: str) -> None:
    for op in g.ops:
        if op.name == "composite":
            name = op.attrs["name"]
            op.attrs["native"] = name not in options.decompose and numerics in options.native.get(name, ())
            if not op.attrs["native"]:
                _choose_native(op.body, options, numerics)
        elif op.name == "loop":
            _choose_native(op.body, options, numerics)
