"""The outputs of the leaf modules Linnet inlines (linear layers, norms, embeddings, convolutions), for `linnet diff`.

Linnet's generated code computes a linear layer or a norm inside its parent's method (`linear(x, self.q_proj.weight)`,
`self.input_layernorm.weight * F.rms_norm(h, ...)`), so there is no module call to wrap. A torch function mode sees
every op instead: an op from `LEAF_OPS` whose arguments hold every checkpoint tensor of one leaf (its weight, and bias
or running statistics where it has them) computes that leaf's output, which is recorded under the leaf's checkpoint
path (`model.layers.0.self_attn.q_proj`), to be compared with the reference's module of that name. A leaf whose
tensors no single op takes together (a bias added by a later op) is not recorded: its parent shows a difference.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

# the ops that compute a leaf's output from its tensors (the weight-times-normalised product of RMSNorm included)
LEAF_OPS = frozenset(
    {
        F.linear, F.embedding, F.layer_norm, F.group_norm, F.batch_norm, F.conv1d, F.conv2d, F.conv_transpose2d,
        torch.addmm, torch.mul, torch._C.TensorBase.mul,  # `weight * x`: the mode sees TensorBase.mul
    }
)  # fmt: skip


def leaf_tensors(root, modules: set[str]) -> dict[str, frozenset[int]]:
    """Leaf path -> the ids of its checkpoint tensors (floating point), for every holder of tensors under `root` that
    is not one of the generated `modules` (those are wrapped as modules)."""
    out: dict[str, set[int]] = {}
    for name, t in root.state_dict(keep_vars=True).items():
        leaf = name.rpartition(".")[0]
        if leaf and leaf not in modules and t.is_floating_point():
            out.setdefault(leaf, set()).add(id(t))
    return {leaf: frozenset(ids) for leaf, ids in out.items()}


class LeafOutputs(TorchFunctionMode):
    """While active, record into `recorder` (`Recorder.add`) the output of each op of LEAF_OPS that takes all of a
    leaf's tensors (`leaves`: `leaf_tensors`), under that leaf's path."""

    def __init__(self, leaves: dict[str, frozenset[int]], recorder) -> None:
        super().__init__()
        self.leaves = leaves
        self.recorder = recorder
        self.owners: dict[int, list[str]] = {}
        for leaf, ids in leaves.items():
            for i in ids:
                self.owners.setdefault(i, []).append(leaf)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func in LEAF_OPS and isinstance(out, torch.Tensor):
            ids = {id(a) for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)}
            for leaf in {owner for i in ids for owner in self.owners.get(i, ())}:
                if self.leaves[leaf] <= ids:
                    self.recorder.add(leaf, out)
        return out
