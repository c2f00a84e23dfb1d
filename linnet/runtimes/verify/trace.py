"""What each module of a generated PyTorch model computes in one entry call: every method of every module of the
tree (named by checkpoint path, `model.layers.0.self_attn`) wrapped to record its tensor inputs and outputs.

The generated code calls methods by name (`self.self_attn.forward(x)`, `layer.step(h, ...)`), never through
`nn.Module.__call__`, so `register_forward_hook` would see nothing: the wrappers are set as instance attributes,
which attribute lookup finds before the class's functions, and removed when recording ends.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

# A module's methods that compute the same thing two ways (no cache, through the cache, one token): compared as one.
MAIN_METHODS = {"forward": "main", "step": "main", "decode": "main"}


@dataclass
class Call:
    """One method call of one module: `path` the module's checkpoint path ("" for the root), `method` its name,
    `key` what it is matched by across two ways (`main` for forward, step and decode), `inputs`/`outputs` its tensor
    arguments and results (f32 copies on the CPU), `parent` the index of the call that made it (None: the entry),
    `done` its rank in completion order (children before parents)."""

    path: str
    method: str
    inputs: list[torch.Tensor]
    outputs: list[torch.Tensor]
    parent: int | None
    done: int = 0

    @property
    def key(self) -> tuple[str, str]:
        return self.path, MAIN_METHODS.get(self.method, self.method)


def _tensors(value) -> list[torch.Tensor]:
    """The tensors of an argument or result (tuples and lists flattened), as f32 copies on the CPU."""
    if isinstance(value, torch.Tensor):
        return [value.detach().to("cpu", torch.float32, copy=True)]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    return []


def _own_methods(module: nn.Module) -> list[str]:
    """The methods the generated source defines for `module`'s class: those of the classes before the generated
    `Module` base in its MRO (a bare `Module`, a holder of parameters made by `owner`, has none)."""
    mro = type(module).__mro__
    base = next((i for i, cls in enumerate(mro) if cls.__name__ == "Module" and nn.Module in cls.__bases__), None)
    if base is None:
        return []
    names = {n for cls in mro[:base] for n, v in vars(cls).items() if callable(v) and not n.startswith("_")}
    return sorted(names)


class Recorder:
    """Wraps every generated method of `root`'s module tree while `recording()` is open; `calls` holds the calls
    of the current recording, in call order."""

    def __init__(self, root: nn.Module):
        self.root = root
        self.calls: list[Call] = []
        self._stack: list[int] = []
        self._done = 0

    @contextmanager
    def recording(self):
        """Record every method call until the block ends; the wrappers are removed on the way out."""
        wrapped = []
        for path, module in self.root.named_modules():
            for name in _own_methods(module):
                module.__dict__[name] = self._wrap(getattr(module, name), path, name)
                wrapped.append((module, name))
        try:
            yield self
        finally:
            for module, name in wrapped:
                module.__dict__.pop(name, None)

    def start(self) -> list[Call]:
        """Begin a new entry call's record and return its list."""
        self.calls = []
        self._stack = []
        self._done = 0
        return self.calls

    def _wrap(self, fn, path: str, name: str):
        def recorded(*args, **kwargs):
            calls = self.calls
            parent = self._stack[-1] if self._stack else None
            index = len(calls)
            calls.append(Call(path, name, _tensors(args) + _tensors(list(kwargs.values())), [], parent))
            self._stack.append(index)
            try:
                out = fn(*args, **kwargs)
            finally:
                self._stack.pop()
            calls[index].outputs = _tensors(out)
            calls[index].done = self._done
            self._done += 1
            return out

        return recorded


__all__ = ["Call", "Recorder", "MAIN_METHODS"]
