"""Weights held in host memory and streamed to the device ahead of use (`cpu_offload_gb`, `--cpu-offload-gb`): what
lets a model larger than the device run on it (Llama-3.1-8B in bf16, 16 GB, on a 15.7 GiB TPU v5e), as vLLM's
`--cpu-offload-gb` does on a GPU. The name and unit are vLLM's: the GiB of weights to hold in host memory.

What is offloaded. The decoder's list of identical layers (the list its loops run over: `model.layers`, found as
`linnet.compiler.jax.scan` finds the lists it can scan) is split: its first layers stay on the device, the last
`ceil(cpu_offload_gb / layer size)` are held in host memory (pinned host memory where the device has it, as
`jax.device_put(..., sharding.with_memory_kind("pinned_host"))` puts it; numpy otherwise), one layer a group. The
embeddings, the head, the other parameters and every KV cache stay on the device.

How an entry runs (`SegmentedEntry`). The generated code is run as three programs, each the entry itself traced with
the layer loop (`scan_layers`) cut: *head* runs everything before the loop and the resident layers and returns the
loop's carry (the hidden states); *group* runs one offloaded layer on a carry, its parameters renamed to those of
layer 0 so that every group is the same program (one compile per input shape); *tail* runs what follows the loop
(the final norm and the head) on the last carry. Each traces the whole entry, and XLA drops what its outputs do not
read (a group's embedding lookup); what they recompute (a group's rotary tables and mask) is the same arithmetic on
the same inputs. Per call: head; then for each offloaded group, the transfer of the next group is issued
(`jax.device_put`, asynchronous) before the current group runs, so the transfer overlaps the compute, and the driver
waits for group i to finish before it issues group i + 2's, so at most two groups are on the device at once (the
device needs the resident weights plus two groups; `OffloadPlan.device_bytes`). A group's parameters are not donated
to its program (no output could reuse them: XLA would warn and ignore it); they are freed when the program that read
them is done.

Correctness: the same generated code on the same parameters; the logits equal the resident model's bit for bit on
the CPU (tests/runtimes/test_jax_offload.py), where XLA's dot and fusion choices do not depend on where a program is
cut. Not built: offload with `--dtype stored` (quantized pairs), `scan_layers`, tensor parallelism or an entry whose
loop over the layers runs more than once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from linnet.compiler.jax.x64 import x64_scoped
from linnet.errors import BackendError

GIB = 1 << 30

__all__ = ["GIB", "OffloadPlan", "plan_offload", "host_sharding", "SegmentedEntry"]


@dataclass(frozen=True)
class OffloadPlan:
    """Which layers are held in host memory.

    Fields:
        list_path: the list of layers split (`model.layers`).
        count: its layers.
        resident: the first `resident` layers stay on the device; layers resident..count-1 are offloaded, one a group.
        layer_bytes: one layer's parameters, as held.
        resident_bytes: every parameter held on the device (the resident layers and all others).
    """

    list_path: str
    count: int
    resident: int
    layer_bytes: int
    resident_bytes: int

    @property
    def offloaded(self) -> range:
        return range(self.resident, self.count)

    @property
    def offloaded_bytes(self) -> int:
        return self.layer_bytes * len(self.offloaded)

    @property
    def device_bytes(self) -> int:
        """The parameters' bytes on the device while a step runs: the resident ones and two groups in flight."""
        return self.resident_bytes + self.layer_bytes * min(2, len(self.offloaded))

    def layer_of(self, key: str) -> int | None:
        """The index of the layer holding parameter or state `key` (`model.layers.5.mlp.down_proj.weight` -> 5), or
        None for a key outside the list."""
        head = self.list_path + "."
        if not key.startswith(head):
            return None
        index, _, rest = key[len(head) :].partition(".")
        return int(index) if index.isdigit() and rest else None

    def offloads(self, key: str) -> bool:
        layer = self.layer_of(key)
        return layer is not None and layer >= self.resident

    def renamed(self, key: str, layer: int, to: int = 0) -> str:
        """`key` of layer `layer` as layer `to`'s (every group's program takes its layer as layer 0)."""
        head = f"{self.list_path}.{layer}."
        return f"{self.list_path}.{to}.{key[len(head) :]}"

    def note(self) -> str:
        return (
            f"cpu offload: layers {self.resident}..{self.count - 1} of `{self.list_path}` "
            f"({len(self.offloaded)} of {self.count}, {self.offloaded_bytes / GIB:.3g} GiB) held in host memory and "
            f"streamed to the device each step; {self.resident_bytes / GIB:.3g} GiB of weights stay on the device "
            f"(plus {min(2, len(self.offloaded)) * self.layer_bytes / GIB:.3g} GiB for the layers in flight)"
        )


def plan_offload(param_specs: dict, lists: dict[str, int], cpu_offload_gb: float) -> OffloadPlan:
    """The plan holding at least `cpu_offload_gb` GiB of the layers' parameters in host memory: the last layers of the
    largest list of identical layers (`lists`: list path -> items, `scan.stacked_lists`), as many as it takes, at
    most all of them. `param_specs`: key -> a shape and dtype (ShapeDtypeStructs as the model holds them).

    Raises BackendError for a negative or non-finite size, or a model without such a list."""
    if not (isinstance(cpu_offload_gb, (int, float)) and math.isfinite(cpu_offload_gb) and cpu_offload_gb >= 0):
        raise BackendError(f"--cpu-offload-gb takes a number of GiB >= 0, got {cpu_offload_gb!r}")
    sizes = {k: int(np.prod(s.shape)) * np.dtype(s.dtype).itemsize for k, s in param_specs.items()}
    best = None
    for path, count in lists.items():
        plan = OffloadPlan(path, count, count, 0, 0)
        layer_bytes = sum(n for k, n in sizes.items() if plan.layer_of(k) == 0)
        if best is None or layer_bytes * count > best.layer_bytes * best.count:
            best = OffloadPlan(path, count, count, layer_bytes, 0)
    if best is None or best.layer_bytes == 0:
        raise BackendError(
            "--cpu-offload-gb holds a list of identical layers in host memory, and this model's entries loop over "
            "none (its layers are unrolled or receive their index)"
        )
    n = min(best.count, math.ceil(cpu_offload_gb * GIB / best.layer_bytes))
    plan = OffloadPlan(best.list_path, best.count, best.count - n, best.layer_bytes, 0)
    resident_bytes = sum(b for k, b in sizes.items() if not plan.offloads(k))
    return OffloadPlan(plan.list_path, plan.count, plan.resident, plan.layer_bytes, resident_bytes)


def host_sharding(device) -> Any:
    """Where offloaded parameters are held: `device`'s pinned host memory (a `SingleDeviceSharding` with memory kind
    `pinned_host`, which the device's DMA engines read without a staging copy) when it has one, else None (numpy
    arrays in ordinary host memory)."""
    import jax

    kinds = {m.kind for m in device.addressable_memories()}
    return jax.sharding.SingleDeviceSharding(device, memory_kind="pinned_host") if "pinned_host" in kinds else None


class _Cut(Exception):
    """Raised by the cut loop to end a trace after it: the carry and the layers that ran (whose state is wanted)."""

    def __init__(self, carry, items):
        super().__init__("cut")
        self.carry, self.items = carry, items


def _state_of(items) -> dict:
    return {k: v for item in items for k, v in item.state().items()}


def _segment(compiled, name: str, plan: OffloadPlan, role: str) -> Callable:
    """Entry `name` of `compiled` (a `JaxProgram`) as the segment `role` ("head", "group" or "tail"; the module
    docstring): a pure function `(params, state, *inputs[, carry])` returning `(carry, new state)` (head, group) or
    the entry's outputs (tail). Runs the generated source again in a namespace of its own whose `scan_layers` cuts
    the loop over `plan.list_path`."""
    namespace: dict = {"__name__": "linnet_generated_jax"}
    filename = f"<linnet generated jax: {compiled.program.source}>"
    exec(compile(compiled.source, filename, "exec"), namespace)
    plain = namespace["scan_layers"]
    held: dict = {}

    def cut_loop(items, body, carry):
        ours = isinstance(items, list) and len(items) == plan.count and items[0]._prefix == f"{plan.list_path}.0."
        if not ours:
            return plain(items, body, carry)
        if held.pop("seen", False):
            raise BackendError(f"--cpu-offload-gb: entry `{name}` loops over `{plan.list_path}` twice")
        held["seen"] = True
        carry = held.pop("carry", carry)
        run = {"head": items[: plan.resident], "group": items[:1], "tail": []}[role]
        for item in run:
            carry = body(item, carry)
        if role == "tail":
            return carry
        raise _Cut(carry, run)

    namespace["scan_layers"] = cut_loop
    fn = namespace[name]
    stateful = compiled.stateful(name)

    def segment(params, state, *inputs):
        held.clear()
        if role != "head":
            *inputs, held["carry"] = inputs
        try:
            out = fn({**params, **state}, *inputs)
        except _Cut as cut:
            return cut.carry, _state_of(cut.items)
        if not held.get("seen"):
            raise BackendError(f"--cpu-offload-gb: entry `{name}` never loops over `{plan.list_path}`")
        if not stateful:
            return out
        *outs, _ = out
        return outs[0] if len(outs) == 1 else tuple(outs)

    segment.__name__ = f"{name}_{role}"
    return segment


class SegmentedEntry:
    """An entry with offloaded layers, called as the jitted entry is (`f(params, state, *inputs)`: outputs, and for an
    entry that writes state `(outputs, new state)`, every state tensor in it); `params` holds the offloaded layers'
    parameters in host memory (`host_sharding`). `lower(*args).compile()` compiles its three programs for the
    inputs' shapes ahead of time, as `jax.jit(...).lower(...).compile()` does for one (`JaxStepModel` calls it).
    The module docstring says how it runs."""

    @x64_scoped  # the generated module is executed, and the xla programs exported, in the IR's dtypes (i64)
    def __init__(
        self, compiled, name: str, plan: OffloadPlan, device, compiler_options: dict | None = None, specs=None
    ):
        import jax

        self.jax, self.plan, self.device, self.name = jax, plan, device, name
        self.stateful = compiled.stateful(name)
        # a sharding, not the device: `device_put(x, device)` of a pinned-host array keeps its memory kind
        self.on_device = jax.sharding.SingleDeviceSharding(device)
        donate = (1,) if self.stateful else ()

        def jit(role: str, donated=donate):
            segment = _segment(compiled, name, plan, role)
            return jax.jit(segment, donate_argnums=donated, compiler_options=compiler_options)

        self.head, self.group, self.tail = jit("head"), jit("group"), jit("tail", ())
        self.__name__ = name
        if specs is not None:
            self._export(compiled, specs, compiler_options)

    def _export(self, compiled, specs: tuple[dict, dict], compiler_options: dict | None) -> None:
        """Run the three programs as `jax.export` artifacts (the xla backend), exported for the device's platform
        with the entry's batch and sequence dims symbolic (`module.input_specs`); `specs`: the parameters' and
        state's ShapeDtypeStructs (`module.param_specs`)."""
        from linnet.compiler.jax.module import exported_fn, input_specs

        jax, program = self.jax, compiled.program
        export = lambda fn, *args: jax.export.export(fn, platforms=[self.device.platform])(*args)  # noqa: E731
        inputs = input_specs(program.entries[self.name], program.max_positions if self.stateful else None)
        base, head_params, head_state, layers = self._split(specs[0], specs[1] if self.stateful else {})
        carry, _ = jax.eval_shape(self.head, head_params, head_state, *inputs)  # its dims symbolic as the inputs'
        head = export(self.head, head_params, head_state, *inputs)
        self.exported = {"head": head, "tail": export(self.tail, base, {}, *inputs, carry)}
        if layers:
            self.exported["group"] = export(self.group, {**base, **layers[0][0]}, layers[0][1], *inputs, carry)
        run = lambda role, stateful: exported_fn(self.exported[role], stateful, compiler_options)  # noqa: E731
        self.head, self.tail = run("head", self.stateful), run("tail", False)
        self.group = run("group", self.stateful) if layers else None

    def _split(self, params: dict, state: dict):
        """(the parameters every segment takes, head's parameters, head's state, then per offloaded layer: its host
        parameters and its state, each renamed to layer 0's), in one pass over the keys."""
        plan = self.plan
        base, head_params, head_state = {}, {}, {}
        layers = [({}, {}) for _ in plan.offloaded]
        for which, arrays in ((0, params), (1, state)):
            for k, v in arrays.items():
                layer = plan.layer_of(k)
                if layer is not None and layer >= plan.resident:
                    layers[layer - plan.resident][which][plan.renamed(k, layer)] = v
                    continue
                (head_params if which == 0 else head_state)[k] = v
                if which == 0 and layer is None:
                    base[k] = v
        return base, head_params, head_state, layers

    def _put(self, host_params: dict) -> dict:
        return self.jax.device_put(host_params, self.on_device)

    def _wait(self, carry) -> None:
        self.jax.block_until_ready(carry)

    @x64_scoped  # a jitted function called outside the scope would retrace with 32-bit types
    def __call__(self, params: dict, state: dict, *inputs):
        return self._run(self.head, self.group, self.tail, params, state, inputs)

    def _run(self, head, group, tail, params, state, inputs):
        plan = self.plan
        base, head_params, head_state, layers = self._split(params, state)
        pending = self._put(layers[0][0]) if layers else None  # issued first: the transfer overlaps head
        carry, new_state = head(head_params, head_state, *inputs)
        for i, (_, layer_state) in enumerate(layers):
            current, pending = pending, (self._put(layers[i + 1][0]) if i + 1 < len(layers) else None)
            carry, written = group({**base, **current}, layer_state, *inputs, carry)
            new_state.update((plan.renamed(k, 0, plan.resident + i), v) for k, v in written.items())
            del current
            if pending is not None:
                self._wait(carry)  # group i done: its weights can go before group i + 2's come
        out = tail(base, {}, *inputs, carry)
        return (out, new_state) if self.stateful else out

    def lower(self, params: dict, state: dict, *inputs) -> "_Lowered":
        """The three programs for `inputs`' shapes (arrays or ShapeDtypeStructs), to `compile()` ahead of time."""
        return _Lowered(self, params, state, inputs)


class _Lowered:
    """`SegmentedEntry.lower`'s result: `compile()` compiles head, group and tail for the shapes given and returns a
    callable running them (`SegmentedEntry.__call__`'s signature)."""

    def __init__(self, entry: SegmentedEntry, params: dict, state: dict, inputs: tuple):
        self.entry, self.params, self.state, self.inputs = entry, params, state, inputs

    @x64_scoped
    def compile(self) -> Callable:
        entry, jax = self.entry, self.entry.jax
        spec = lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=entry.on_device)  # noqa: E731
        base, head_params, head_state, layers = entry._split(self.params, self.state)
        lowered = entry.head.lower(head_params, head_state, *self.inputs)
        carry = jax.tree.map(spec, lowered.out_info[0])  # (not eval_shape: a jit with XLA options may not nest)
        head = lowered.compile()
        group = tail = None
        if layers:
            group_params = {**base, **jax.tree.map(spec, layers[0][0])}
            group = entry.group.lower(group_params, layers[0][1], *self.inputs, carry).compile()
        tail = entry.tail.lower(base, {}, *self.inputs, carry).compile()

        @x64_scoped
        def run(params: dict, state: dict, *inputs):
            return entry._run(head, group, tail, params, state, inputs)

        return run
