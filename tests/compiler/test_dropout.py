"""`dropout` on the PyTorch backend, in both modes that run Linnet code (interpret, generated): PyTorch's
`F.dropout(x, p, training)` semantics, switched by the module's training flag as any `nn.Module`.

- training mode (`module.train()`): about a fraction p of a large tensor is zeroed and every survivor is scaled
  by exactly 1 / (1 - p);
- a loaded model is in eval mode, where dropout is the identity (the registry's numpy reference: the backends'
  op tests compare it in inference);
- two dropouts of one tensor draw two masks: the IR passes do not merge them (CSE), flattened or not;
- a free function that runs dropout takes the caller's flag (`training=self.training`).
"""

from __future__ import annotations

import pytest

from linnet.ir.build import build
from linnet.ir.core import walk_ops

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

from linnet.compiler.torch.codegen import flat_program, generate  # noqa: E402
from linnet.compiler.torch.module import compile_program  # noqa: E402
from tests.compiler.dropout_program import SOURCE, P  # noqa: E402


@pytest.fixture(scope="module")
def program():
    return build(SOURCE)


@pytest.mark.parametrize("mode", ["interpret", "generated"])
def test_training_mode_zeroes_p_and_scales_the_rest(program, mode):
    module = compile_program(program, mode)
    x = torch.ones(1024, 256)  # 262144 elements: the zeroed fraction is within 0.005 of p (6 standard deviations)
    assert not module.training and not module.root.training  # loaded for inference
    assert torch.equal(module.forward(x), x)
    module.train()
    assert module.training and module.root.training  # the generated root, which is not a submodule, too
    torch.manual_seed(0)
    y = module.forward(x)
    zeroed = float((y == 0).float().mean())
    assert abs(zeroed - P) < 0.005, zeroed
    survivors = y[y != 0]
    assert torch.equal(survivors, torch.full_like(survivors, 1 / (1 - P)))  # F.dropout's scale, to the last bit
    torch.manual_seed(0)
    assert torch.equal(module.forward(x), y)  # the masks come from torch's generator
    module.eval()
    assert torch.equal(module.forward(x), x)


@pytest.mark.parametrize("mode", ["interpret", "generated"])
@pytest.mark.parametrize("entry", ["twice", "free", "calls"])
def test_two_dropouts_of_one_tensor_are_two_masks(program, mode, entry):
    module = compile_program(program, mode)
    x = torch.ones(64, 256)
    assert torch.equal(module.entry(entry)(x), torch.zeros_like(x))  # eval: x - x
    module.train()
    assert bool(module.entry(entry)(x).ne(0).any())  # two masks: some element kept by one and dropped by the other


def test_passes_keep_every_dropout(program):
    """Common-subexpression elimination merges equal pure ops, never two draws (nor two calls of a function
    that draws): the flattened program keeps both dropouts of `twice` and the two of `noise_twice`, and the
    generated code calls `noise_twice` twice in `calls`."""
    flat = flat_program(program)
    for entry, count in (("twice", 2), ("free", 2), ("calls", 4)):
        assert sum(op.name == "dropout" for op in walk_ops(flat.entries[entry])) == count
    source = generate(program)
    assert source.count("noise_twice(x, training=self.training)") == 3  # in `free`, twice in `calls`
    assert "def noise_twice(x, training):" in source
    assert "F.dropout(x, 0.25, self.training)" in source
