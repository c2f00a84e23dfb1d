"""The generated module's `linears` (linnet/compiler/torch/prelude.py): linear layers sharing their input,
one linear over their weights joined. Weights that lie adjacently in one buffer must be read as that buffer's rows by
one `linear`, its output split; any other weights (apart, out of order, strided differently, with a gap, a subclass,
needing gradients) one `linear` each. Either way the values are each `F.linear(x, w)`'s. The function is the prelude's,
which a real `fast` module's source imports and calls."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional
nn = torch.nn

LLAMA = dict(num_hidden_layers=1, hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=64)  # fmt: skip


@pytest.fixture(scope="module")
def namespace() -> dict:
    from linnet.torch import load
    from tests.conftest import EXAMPLES

    module = load(EXAMPLES / "llama.linnet", config=LLAMA, numerics="fast", max_positions=16, random_weights=True,
                  progress=False).module  # fmt: skip
    assert "q_proj, k_proj, v_proj = linears(x, (self.q_proj.weight, self.k_proj.weight, self.v_proj.weight))" in (
        module.source
    )
    from linnet.compiler.torch import prelude

    names: dict = {}
    exec(compile(module.source, "generated", "exec"), names)
    assert names["linears"] is prelude.linears
    return vars(prelude)  # the globals `linears` reads (`linear`)


@pytest.fixture
def calls(namespace, monkeypatch):
    """The weights `linears` passes to the module's `linear`, one entry a call."""
    seen = []
    real = namespace["linear"]

    def spy(x, weight):
        seen.append(weight)
        return real(x, weight)

    monkeypatch.setitem(namespace, "linear", spy)
    return seen


def rows_of(buffer: torch.Tensor, sizes: list[int], transposed: bool) -> list[torch.Tensor]:
    """Weights [n, K] that are consecutive rows of `buffer` ([K, sum n] in memory where `transposed`)."""
    out, start = [], 0
    for n in sizes:
        out.append(buffer[:, start : start + n].t() if transposed else buffer[start : start + n])
        start += n
    return [nn.Parameter(w, requires_grad=False) for w in out]


def reference(x, weights):
    return tuple((x.double() @ w.detach().double().t()).float() for w in weights)


@pytest.mark.parametrize("transposed", [True, False])
@pytest.mark.parametrize("lead", [(1,), (2,), (1, 1), (3, 5)])
def test_adjacent_weights_are_one_linear_over_their_buffer(namespace, calls, transposed, lead):
    sizes, k = [24, 8, 8], 16
    buffer = torch.randn((k, sum(sizes)) if transposed else (sum(sizes), k))
    weights = rows_of(buffer, sizes, transposed)
    x = torch.randn(*lead, k)
    with torch.inference_mode():
        y = namespace["linears"](x, tuple(weights))
    assert len(calls) == 1 and calls[0].shape == (sum(sizes), k) and calls[0].data_ptr() == weights[0].data_ptr()
    assert [t.shape for t in y] == [(*lead, n) for n in sizes]
    torch.testing.assert_close(y, reference(x, weights), rtol=1e-5, atol=1e-5)


def _apart(buffer, weights):
    return [nn.Parameter(w.clone(), requires_grad=False) for w in weights]


def _reversed(buffer, weights):
    return weights[::-1]


def _gap(buffer, weights):  # the second weight one row further on: the first's rows and the second's do not meet
    return [weights[0], nn.Parameter(buffer[25:33], requires_grad=False)]


def _other_strides(buffer, weights):
    return [weights[0], nn.Parameter(weights[1].t().contiguous().t(), requires_grad=False)]


class Subclass(torch.Tensor):
    pass


def _subclass(buffer, weights):
    return [weights[0], weights[1].detach().as_subclass(Subclass)]


def _storages_that_meet(buffer, weights):
    """Two storages whose memory happens to meet: the second weight starts where the first ends, but the first's
    storage does not hold the second's rows."""
    memory = bytearray(buffer.numel() * 4)
    first = torch.frombuffer(memoryview(memory)[: 24 * 16 * 4], dtype=torch.float32).view(24, 16)
    second = torch.frombuffer(memoryview(memory)[24 * 16 * 4 :], dtype=torch.float32).view(24, 16)
    first.copy_(buffer[:24])
    second.copy_(buffer[24:])
    return [nn.Parameter(first, requires_grad=False), nn.Parameter(second, requires_grad=False)]


@pytest.mark.parametrize("case", [_apart, _reversed, _gap, _other_strides, _subclass, _storages_that_meet])
def test_other_weights_are_one_linear_each(namespace, calls, case):
    buffer = torch.randn(48, 16)
    weights = case(buffer, rows_of(buffer, [24, 16], transposed=False))
    x = torch.randn(2, 16)
    with torch.inference_mode():
        y = namespace["linears"](x, tuple(weights))
    assert len(calls) == len(weights)
    y = tuple(t.as_subclass(torch.Tensor) for t in y)
    torch.testing.assert_close(y, reference(x, weights), rtol=1e-5, atol=1e-5)


def test_weights_that_need_gradients_are_one_linear_each_and_get_their_own(namespace, calls):
    """Under autograd a view of the buffer would send every gradient to the first weight: each weight is its own
    `linear`, its gradient F.linear's over the joined weights."""
    buffer = torch.randn(16, 40)
    weights = rows_of(buffer, [24, 16], transposed=True)
    for w in weights:
        w.requires_grad_(True)
    x = torch.randn(3, 16)
    sum(y.square().sum() for y in namespace["linears"](x, tuple(weights))).backward()
    assert len(calls) == 2
    joined = torch.cat([w.detach() for w in weights]).requires_grad_(True)
    F.linear(x, joined).square().sum().backward()
    torch.testing.assert_close(torch.cat([w.grad for w in weights]), joined.grad, rtol=1e-5, atol=1e-5)
    calls.clear()
    with torch.no_grad():  # no gradients asked for: the buffer's rows again
        namespace["linears"](x, tuple(weights))
    assert len(calls) == 1
