"""A Core IR program as a `torch.nn.Module` in one of the backend's modes.

`compile_program(program, mode=..., numerics=..., device=...)` returns a `LinnetModule`:
parameters live in a module tree that mirrors the checkpoint names (so `state_dict()` keys
are `model.layers.0.self_attn.q_proj.weight`...), state (the KV cache) in non-persistent
buffers, and each entry is a method (`forward`, `step`) running the mode's code. Parameters
have no storage (the meta device) until `linnet.runtimes` binds real weights with `bind`.

Modes (ARCHITECTURE.md, "Backends"): "interpret" (the IR op by op), "generated" (the
generated source, eager), "inductor" (the generated source under `torch.compile`: the decode
step compiled once, with static shapes that never change between steps; prefill eager),
"cuda-graphs" (decode steps replayed as a CUDA graph; needs CUDA).
"""

from __future__ import annotations

import copy
import linecache
import threading
from typing import Callable

import torch
from torch import nn

from linnet.errors import BackendError
from linnet.ir.core import Program
from linnet.ir.fusion import concat_weight_groups

from .codegen import NUMERICS, TORCH_DTYPES, TorchModule, flat_program, module_passes, prepare
from .interpret import Interpreter
from .prelude import linears_joined_under_compile
from .quantized import QuantizedWeight

MODES = ("interpret", "generated", "inductor", "cuda-graphs")
META = torch.device("meta")  # where a parameter no checkpoint has bound yet lies


def torch_dtype(name: str) -> torch.dtype:
    return getattr(torch, TORCH_DTYPES[name].split(".")[1])


class LinnetModule(nn.Module):
    """The model: parameters by checkpoint name, state buffers, and one method per entry.

    The generated source's root class builds the module tree (its submodules are this
    module's, so `state_dict()` keys are the checkpoint names). Entries take and return tensors
    on `device`: decoders' `forward(input_ids: i64[B, S]) -> [B, S, vocab]` and
    `step(input_ids: i64[B, S], positions: i64[B], rows: i64[B]) -> [B, vocab]` (the cache is
    updated in place). It is made in `eval()` mode (inference: dropout is the identity); `train()` switches
    dropout on, as in any `nn.Module`."""

    def __init__(self, program: Program, mode: str, numerics: str, device: str | torch.device):
        super().__init__()
        if mode not in MODES:
            raise BackendError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        if numerics not in NUMERICS:
            raise BackendError(f"numerics must be one of {', '.join(NUMERICS)}, got {numerics!r}")
        if mode == "cuda-graphs" and not (torch.cuda.is_available() and torch.device(device).type == "cuda"):
            raise BackendError(
                "mode cuda-graphs replays the decode step as a CUDA graph and needs a CUDA device "
                f"(device={device!r}, torch.cuda.is_available()={torch.cuda.is_available()}); "
                "use --backend torch or torch-compile on this machine"
            )
        self.program = program
        self.mode = mode
        self.numerics = numerics
        self.device_ = torch.device(device)
        prepared = prepare(program, module_passes(program, numerics, mode, self.device_.type), numerics)
        self.source = TorchModule(prepared, numerics).write()
        # the weights that one `linears` call reads joined: bound adjacently in one buffer each (`bind`)
        self.weight_groups: dict[str, tuple[str, ...]] = {
            path: group for group in concat_weight_groups(prepared) for path in group
        }
        self._group_buffers: dict[tuple[str, ...], tuple[torch.Tensor, set[str]]] = {}  # and the paths bound in it
        # the groups an inductor module's compiled entries read as one buffer each (`weight_groups_joined`)
        self._joined_groups = sorted(set(self.weight_groups.values())) if mode == "inductor" else []
        self._joined_snapshot: list | None = None  # each grouped weight's holder, name, tensor and address
        # wide linear weights held transposed for `linear` (`bind`), as the passes recorded (`module_passes`)
        self.stored_transposed = frozenset(p for p, layout in prepared.param_layouts.items() if layout == "transposed")
        namespace = self._exec_source()
        if mode == "inductor" and self.weight_groups:
            # an inductor module checks its groups before each compiled call (`weight_groups_joined`), so its traces
            # may read each group as one buffer
            namespace["linears"] = linears_joined_under_compile
        root = namespace[program.root](self.device_)
        object.__setattr__(self, "root", root)  # not a submodule: its children are ours
        for name, child in root._modules.items():
            self.add_module(name, child)
        for name, param in root._parameters.items():
            self.register_parameter(name, param)
        for name, buffer in root._buffers.items():
            self.register_buffer(name, buffer, persistent=False)
        self._leaves: dict[str, tuple[nn.Module, str]] = {}
        for path, _ in [*root.named_parameters(), *root.named_buffers()]:
            self._leaves[path] = self._owner(root, path)
        self._entries: dict[str, Callable] = {}
        self.quantized = False  # a QuantizedWeight is bound (`--dtype stored`)
        # `fast` bf16 where bf16 matmuls are emulated: prefill's linears in f32 (`_WideLinearsInF32`)
        self.wide_linears_in_f32 = (
            mode in ("generated", "inductor")
            and numerics == "fast"
            and program.dtype.name == "bf16"
            and _bf16_matmul_emulated(self.device_)
        )
        self._build_entries()
        self.tensors = self._tensor_dict()
        self.eval()  # a loaded model infers: dropout is the identity until a trainer calls `train()`

    def __deepcopy__(self, memo: dict) -> "LinnetModule":
        """A copy with its own weights and KV cache whose entries run them. The entries are closures over the module
        they were built for (the interpreter's, the compiled ones' and the checks before each compiled call), which
        `copy.deepcopy` would share with the original: the copy would run the original's weights. So everything but
        the entries is copied as `nn.Module` would be, and the entries are built anew (an inductor copy compiles
        again at its first call). The IR program and the generated source are shared: nothing changes them after
        construction. The copy is made outside inference mode (its tensors would be inference tensors, which a
        later prefill or `load_state_dict` cannot write), and the weights `bind` laid out as rows of one buffer
        are views of the copied buffer again (`nn.Parameter` copies each apart: `linears` would then run the
        group's members one by one, a last bit off the original under `fast`, holding the buffer unread)."""
        new = type(self).__new__(type(self))
        memo[id(self)] = new
        shared = {"program", "source", "_entries", "_joined_snapshot"}
        with torch.inference_mode(False), torch.no_grad():
            for name, value in self.__dict__.items():
                if name not in shared:
                    new.__dict__[name] = copy.deepcopy(value, memo)
            for group, (buffer, _) in self._group_buffers.items():
                copied = new._group_buffers[group][0]
                for path in group:
                    t = self.tensors[path]
                    if type(t) not in (torch.Tensor, nn.Parameter):  # a subclass (quantized, distributed) is in none
                        continue
                    if t.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr():
                        new.tensors[path].data = copied.as_strided(t.size(), t.stride(), t.storage_offset())
        new.__dict__.update(program=self.program, source=self.source, _entries={}, _joined_snapshot=None)
        new._build_entries()
        return new

    def train(self, mode: bool = True) -> "LinnetModule":
        """PyTorch's training switch (dropout draws masks in training mode), set on the generated root too: its
        methods read `self.training`, and it is not a submodule (its children are this module's)."""
        super().train(mode)
        self.root.train(mode)
        return self

    # ----- the parameter tree
    @staticmethod
    def _owner(root: nn.Module, path: str) -> tuple[nn.Module, str]:
        *parents, leaf = path.split(".")
        node = root
        for part in parents:
            node = node._modules[part]
        return node, leaf

    def _tensor_dict(self) -> dict[str, torch.Tensor]:
        return {path: getattr(owner, leaf) for path, (owner, leaf) in self._leaves.items()}

    def bind(self, path: str, tensor: torch.Tensor) -> None:
        """Use `tensor` (cast to the working dtype, moved to the device) as parameter `path`; a
        `QuantizedWeight` (`--dtype stored`) is bound as it is, a buffer that `F.linear` and `F.embedding`
        read through its quantized kernels. Raises KeyError for an unknown path and ValueError for a shape
        that differs. Under `fast` on the CPU the wide linear weights of a module decoding at most 2 rows at once
        are held transposed (`fusion.hold_wide_weights_transposed`): the same values, strides (1, N); weights that one
        linear layer reads joined (`codegen.module_passes`) are bound adjacently in one buffer (`_bind_in_group`)."""
        owner, leaf = self._leaves[path]
        current = getattr(owner, leaf)
        if tuple(tensor.shape) != tuple(current.shape):
            raise ValueError(f"`{path}`: the checkpoint has {list(tensor.shape)}, the model {list(current.shape)}")
        if isinstance(tensor, QuantizedWeight):
            for holder in [owner, self] if owner is self.root else [owner]:
                delattr(holder, leaf)
                holder.register_buffer(leaf, tensor)
            self.tensors[path] = tensor
            self.quantized = True
            return
        t = tensor.to(device=self.device_, dtype=current.dtype)
        if path in self.weight_groups:
            self._bind_in_group(path, t)
            return
        if path in self.stored_transposed and t.dim() == 2 and t.stride() != (1, t.shape[0]):
            t = t.t().contiguous().t()  # [K, N] in memory (`fusion.hold_wide_weights_transposed`)
        self._register(path, t)

    def _register(self, path: str, t: torch.Tensor) -> None:
        owner, leaf = self._leaves[path]
        current = getattr(owner, leaf)
        if isinstance(current, nn.Parameter):
            param = nn.Parameter(t, requires_grad=False)
            owner.register_parameter(leaf, param)
            if owner is self.root:
                self.register_parameter(leaf, param)
        else:
            current.copy_(t)
        self.tensors[path] = getattr(owner, leaf)

    def _bind_in_group(self, path: str, t: torch.Tensor) -> None:
        """Bind `t` [N, K] as its rows of its group's buffer (`weight_groups`): [sum N, K] in memory, or [K, sum N]
        where the group is held transposed (`stored_transposed`), so that `linears` reads the group as one
        weight; the parameter is the view [N, K], strides (K, 1) or (1, sum N). A weight bound a second time
        starts a new buffer, holding the others' current values (whatever set them: `bind`, `load_state_dict`), so
        no tensor handed out before changes."""
        group = self.weight_groups[path]
        rows = [getattr(*self._leaves[p]).shape[0] for p in group]
        buffer, bound = self._group_buffers.get(group, (None, set()))
        if buffer is None or path in bound:
            width = t.shape[1]
            shape = (width, sum(rows)) if path in self.stored_transposed else (sum(rows), width)
            buffer, bound = torch.empty(shape, dtype=t.dtype, device=t.device), set()
            self._group_buffers[group] = (buffer, bound)
            for other in group:
                current = getattr(*self._leaves[other])
                if other != path and type(current) in (torch.Tensor, nn.Parameter) and current.device != META:
                    view = self._group_view(group, rows, other, buffer)
                    view.copy_(current.detach())
                    self._register(other, view)
                    bound.add(other)
        view = self._group_view(group, rows, path, buffer)
        view.copy_(t)
        self._register(path, view)
        bound.add(path)

    def _group_view(self, group: tuple[str, ...], rows: list[int], path: str, buffer: torch.Tensor) -> torch.Tensor:
        """Weight `path`'s rows [N, K] of its group's `buffer` ([sum N, K], or [K, sum N] transposed)."""
        i = group.index(path)
        start, end = sum(rows[:i]), sum(rows[: i + 1])
        return buffer[:, start:end].t() if path in self.stored_transposed else buffer[start:end]

    def reset_state(self) -> None:
        """Zero the KV cache (not needed between requests: a step only reads what it wrote)."""
        for spec in self.program.state:
            self.tensors[spec.path].zero_()

    # ----- entries
    def _build_entries(self) -> None:
        if self.mode == "interpret":
            flat = flat_program(self.program, self.numerics)
            for name, g in flat.entries.items():
                interp = Interpreter(g, self.numerics)
                self._entries[name] = lambda *inputs, run=interp.run: run(self.tensors, *inputs, training=self.training)
            return
        for name in self.program.entries:
            fn = getattr(self.root, name)
            # a model without state may name an entry `decode` too (a VAE's): not a one-token step
            step = name in STEP_ENTRIES and bool(self.program.state)
            if self.wide_linears_in_f32:
                fn = _wide_linears_in_f32(fn, step)
            if self.mode == "inductor":
                fn = self._decode_compiled(fn) if step else self._compiled_unless_quantized(fn)
            elif self.mode == "cuda-graphs" and step:
                fn = _CudaGraphStep(fn)
            self._entries[name] = fn

    def _compiled_unless_quantized(self, fn: Callable) -> Callable:
        """`fn` under torch.compile, or eagerly once a `QuantizedWeight` is bound: over `DENSE_ROWS` rows its
        `F.linear` dequantizes each matrix from the int4 planes inside the graph, which traces but compiles slowly
        (a 17-row SmolLM2 decode step: 177-263 s against 124 s for one row, contended) for a matmul-bound entry.
        Generation's `step` decodes compiled, prefills eagerly."""
        compiled = LazilyCompiled(fn, fullgraph=True, dynamic=True)

        def entry(*inputs):
            return fn(*inputs) if self.quantized or not self.weight_groups_joined() else compiled(*inputs)

        return entry

    def _decode_compiled(self, fn: Callable) -> Callable:
        """`step` with decode (S = 1) under torch.compile, static shapes, compiled once per batch size; prefill
        (S > 1) runs the same generated code eagerly, so a new prompt length never recompiles (prefill is
        matmul-bound: little for inductor to win). At batch 1 the step's linears compile as reductions
        (`inductor_passes.OneRowProductsAsReductions`: MKL's sgemv runs on one thread), those sharing an input as
        one over their group's buffer (`weight_groups_joined`); on the CPU its attention compiles as reductions at
        every batch size (the flash kernel blocks for many query rows and emulates bf16 on AVX2)."""
        compiled = LazilyCompiled(fn, fullgraph=True, dynamic=False, decode_options=True)

        def step(input_ids, positions, rows):
            if input_ids.shape[1] == 1 and self.weight_groups_joined():
                return compiled(input_ids, positions, rows)
            return fn(input_ids, positions, rows)

        return step

    def weight_groups_joined(self) -> bool:
        """Whether each group of weights that a compiled trace reads as one buffer (`linears` with
        `joined_under_compile`: plain tensors of one dtype, width and strides, and no gradient wanted) lies in one
        buffer as `bind` lays them out: a trace cannot read addresses, so the compiled entries ask this before each
        call. The weights are looked up from the root as the generated code reads them (a submodule replaced is
        seen). A group that something rebound apart (`register_parameter`, `load_state_dict(..., assign=True)`,
        `.data =`, a new submodule) is laid out again in a new buffer, its values kept and each weight the same
        tensor object (its `.data` moves: handles a caller holds still reach the model); where that cannot be done
        (a weight requires grad: a trainer holds it), False, and the caller runs the entry eagerly. Cost: when
        nothing was rebound since the last call, the identity of each module on the way and the identity and
        address of each weight (SmolLM2: ~20 us against a ~21 ms bf16 step); otherwise each group's layout."""
        if self._joined_snapshot is not None and all(
            held.get(name) is t and (at is None or t.data_ptr() == at) for held, name, t, at in self._joined_snapshot
        ):
            return True
        self._joined_snapshot = None
        stable = True
        for group in self._joined_groups:
            for p in group:
                self._leaves[p] = self._owner(self.root, p)
                self.tensors[p] = getattr(*self._leaves[p])
            weights = [self.tensors[p] for p in group]
            adjacent = _adjacent(weights)
            if adjacent or not _read_joined(weights):
                stable = stable and (adjacent or not _plain_group(weights))
                continue
            if any(w.requires_grad for w in weights):
                return False
            self._group_buffers[group] = (_lay_out_in_one_buffer(weights), set(group))
            if not _adjacent(weights):
                return False
        if stable:  # every group adjacent or never read joined (as long as nothing is rebound): checked by identity
            snapshot: dict[tuple[int, str], tuple] = {}
            for path in (p for group in self._joined_groups for p in group):
                node = self.root
                *parents, leaf = path.split(".")
                for part in parents:
                    child = node._modules[part]
                    snapshot[(id(node), part)] = (node._modules, part, child, None)
                    node = child
                held = node._parameters if leaf in node._parameters else node._buffers
                snapshot[(id(node), leaf)] = (held, leaf, held[leaf], held[leaf].data_ptr())
            self._joined_snapshot = list(snapshot.values())
        return True

    def _exec_source(self) -> dict:
        filename = f"<linnet generated: {self.program.source}>"
        # Tracebacks and torch.compile show the generated lines.
        linecache.cache[filename] = (len(self.source), None, self.source.splitlines(True), filename)
        namespace: dict = {"__name__": "linnet_generated"}
        exec(compile(self.source, filename, "exec"), namespace)
        return namespace

    def entry(self, name: str) -> Callable:
        """The entry `name` as a function of tensors. Raises KeyError naming the entries."""
        if name not in self._entries:
            raise KeyError(f"no entry `{name}` (entries: {', '.join(self._entries)})")
        return self._entries[name]

    def forward(self, *inputs):
        return self._entries["forward"](*inputs)

    def step(self, input_ids, positions, rows):
        return self._entries["step"](input_ids, positions, rows)


def _bf16_matmul_emulated(device: torch.device) -> bool:
    """Whether bf16 matmuls on `device` run without bf16 dot instructions: a CPU whose oneDNN has no bf16 support
    (AVX2 without AVX-512: a 512 x 576 x 1536 bf16 matmul took 145 ms there, the same in f32 17 ms)."""
    return device.type == "cpu" and not torch.ops.mkldnn._is_mkldnn_bf16_supported()


class _WideLinearsInF32(torch.overrides.TorchFunctionMode):
    """`F.linear` over more than `ROWS` bf16 rows computed in f32 and rounded to bf16 once (`fast` numerics, where bf16
    matmuls are emulated: `_bf16_matmul_emulated`). The products are exact in f32 and oneDNN's emulated kernel also
    sums them in f32, so only the summation order differs from the bf16 kernel: results within the last bf16 bit,
    at f32 matmul speed (converting the weights costs little beside a prefill's matmul). Narrower calls (decode)
    keep the bf16 kernel, which reads half the bytes."""

    ROWS = 16

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.nn.functional.linear and not isinstance(args[1], QuantizedWeight):
            x, weight = args[0], args[1]
            bias = args[2] if len(args) > 2 else kwargs.get("bias")
            if x.dtype == torch.bfloat16 and x.numel() > self.ROWS * x.shape[-1]:
                bias = None if bias is None else bias.float()
                return func(x.float(), weight.float(), bias).to(torch.bfloat16)
        return func(*args, **kwargs)


def _wide_linears_in_f32(fn: Callable, step: bool) -> Callable:
    """`fn` with `_WideLinearsInF32` around its eager calls with more than one new token per row (every call of
    `forward`; a `step`'s prefill), so that decode steps and compiled code run without the mode's per-op cost."""

    def entry(*inputs):
        if torch.compiler.is_compiling() or (step and inputs[0].shape[1] == 1):
            return fn(*inputs)
        with _WideLinearsInF32():
            return fn(*inputs)

    return entry


# The KV-cached entries generation runs (`step`, and a decoder's optional one-token `decode`): compiled per batch
# size for decode, captured as CUDA graphs.
STEP_ENTRIES = ("step", "decode")


def _lay_out_in_one_buffer(weights: list[torch.Tensor]) -> torch.Tensor:
    """Copy `weights` (a plain group: `_plain_group`) into the rows of one new buffer [sum N_i, K] and point each
    weight's `.data` at its rows, so that every tensor object, and any handle to it, stays the model's; returns the
    buffer. It is an ordinary tensor even when this runs under `torch.inference_mode` (the step model's), so the
    weights can still be loaded into and trained afterwards."""
    first = weights[0]
    with torch.inference_mode(False), torch.no_grad():
        buffer = torch.empty((sum(w.shape[0] for w in weights), first.shape[1]), dtype=first.dtype, device=first.device)
        start = 0
        for w in weights:
            rows = buffer[start : start + w.shape[0]]
            rows.copy_(w)
            w.data = rows
            start += w.shape[0]
    return buffer


def _plain_group(weights: list[torch.Tensor]) -> bool:
    """Whether `weights` are plain 2-d tensors (no subclass: a quantized or a distributed weight) of one dtype, width,
    strides and device, off the meta device: the group `linears` may read as one weight."""
    first = weights[0]
    return first.device.type != "meta" and all(
        type(w) in (torch.Tensor, nn.Parameter)
        and w.dim() == 2
        and w.stride() == first.stride()
        and w.dtype == first.dtype
        and w.shape[1] == first.shape[1]
        and w.device == first.device
        for w in weights
    )


def _read_joined(weights: list[torch.Tensor]) -> bool:
    """Whether a compiled trace of `linears` reads `weights` as one buffer: the condition `prelude.linears` checks
    with `joined_under_compile` (a plain group, and no gradient to any weight wanted); the two must agree."""
    return _plain_group(weights) and not (torch.is_grad_enabled() and any(w.requires_grad for w in weights))


def _adjacent(weights: list[torch.Tensor]) -> bool:
    """Whether `weights` (each [N_i, K]) are consecutive rows of one buffer with the same strides, the first's
    storage holding them all: what `linears` reads as one [sum N_i, K] weight."""
    if not _plain_group(weights):
        return False
    first = weights[0]
    at, step = first.data_ptr(), first.stride(0) * first.element_size()
    for w in weights:
        if w.data_ptr() != at:
            return False
        at += w.shape[0] * step
    rows = sum(w.shape[0] for w in weights)
    last = first.storage_offset() + (rows - 1) * first.stride(0) + (first.shape[1] - 1) * first.stride(1)
    return last < first.untyped_storage().nbytes() // first.element_size()


_COMPILE_LOCK = threading.Lock()  # every `LazilyCompiled`'s: two entries' first calls importing dynamo at once deadlock


class LazilyCompiled:
    """`torch.compile(fn, **kwargs)`, made at the first call, with Linnet's decode options
    (`inductor_passes.DECODE_OPTIONS`) where `decode_options`. Importing torch._dynamo (~1.9 s here) and inductor's
    pattern matcher (~1 s) is then part of that first call, which compiles anyway, rather than of loading the model.
    Moved, not saved: torch-compile's SmolLM2 bf16 loaded by `linnet.torch.load` on the 2-core Xeon, two processes
    each, load 3.2-3.3 s and first decode step 4.9 s with the imports at load, 1.4-1.9 s and 6.6-7.1 s with them
    here (the bench's load-time goal had flagged 3.7-3.8 s against the 2.3-2.4 s recorded before the decode options
    came). The compiled function is made under one lock for all entries (two entries' first calls in two threads
    imported dynamo at once and broke it for the process); the compile itself runs outside it. Called inside
    `torch.export` or another compile, where `torch.compile` returns `fn` itself, it runs `fn` and keeps nothing."""

    def __init__(self, fn: Callable, decode_options: bool = False, **kwargs):
        self.fn, self.decode_options, self.kwargs = fn, decode_options, kwargs
        self.compiled: Callable | None = None

    def __call__(self, *inputs):
        if self.compiled is None:
            if torch.compiler.is_exporting() or torch.compiler.is_compiling():
                return self.fn(*inputs)
            with _COMPILE_LOCK:
                if self.compiled is None:
                    options = {}
                    if self.decode_options:
                        from .inductor_passes import DECODE_OPTIONS

                        options = {"options": DECODE_OPTIONS}
                    self.compiled = torch.compile(self.fn, **self.kwargs, **options)
        return self.compiled(*inputs)


class _CudaGraphStep:
    """Decode steps (S = 1) replayed from a CUDA graph captured per batch size; prefill runs
    eagerly. Inputs are copied into static tensors; the KV cache is updated in place inside
    the graph, so it keeps its storage across steps."""

    def __init__(self, fn: Callable):
        self.fn = fn
        self.graphs: dict[int, tuple] = {}

    def __call__(self, input_ids, positions, rows):
        if input_ids.shape[1] != 1:
            return self.fn(input_ids, positions, rows)
        b = input_ids.shape[0]
        entry = self.graphs.get(b)
        if entry is None:
            static = (input_ids.clone(), positions.clone(), rows.clone())
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):  # warm-up writes what the real step writes: idempotent
                    self.fn(*static)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = self.fn(*static)
            entry = self.graphs[b] = (graph, static, out)
        graph, static, out = entry
        for s, x in zip(static, (input_ids, positions, rows)):
            s.copy_(x)
        graph.replay()
        return out


def compile_program(
    program: Program, mode: str = "generated", numerics: str = "equivalent", device: str = "cpu"
) -> LinnetModule:
    """The program as a runnable `LinnetModule` (parameters empty until bound). Raises BackendError."""
    return LinnetModule(program, mode, numerics, device)
