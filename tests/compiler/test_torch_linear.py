"""The generated module's `linear` (linnet/compiler/torch/prelude.py): up to 16 rows of f32 on the CPU run as
blocks in one `torch.bmm` (of the weight's rows, or of K for a weight held transposed), one row of bf16 as
`torch.mv`. Blocks of rows and torch.mv must give F.linear's values bit for bit, so they run only where the kernels
give the same bits for those shapes (`_same_bits`, decided once a process on random rows); everything else must
be F.linear itself. The function is the prelude's, which a generated module (a one-layer llama here) imports and
a standalone one carries."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

LLAMA = dict(num_hidden_layers=1, hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=64)  # fmt: skip


@pytest.fixture(scope="module")
def source() -> str:
    from linnet.compiler.torch.codegen import generate
    from linnet.ir import build
    from tests.conftest import EXAMPLES

    return generate(build(EXAMPLES / "llama.linnet", config=LLAMA))


@pytest.fixture(scope="module")
def namespace(source) -> dict:
    """The prelude's globals: `linear` and what it reads (`_same_bits`, its cache `_SAME_BITS`, ...)."""
    from linnet.compiler.torch import prelude

    generated: dict = {}
    exec(compile(source, "generated", "exec"), generated)
    assert generated["linear"] is prelude.linear
    return vars(prelude)


@pytest.fixture(scope="module")
def linear(namespace):
    return namespace["linear"]


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def bmm_calls(monkeypatch):
    """The calls the generated `linear` makes to torch.bmm (the module looks `torch.bmm` up at each call)."""
    calls = []
    real = torch.bmm

    def spy(*args):
        calls.append(args)
        return real(*args)

    monkeypatch.setattr(torch, "bmm", spy)
    return calls


def test_the_module_imports_linear_and_its_layers_call_it(source):
    from linnet.compiler.torch.codegen import generate
    from linnet.ir import build
    from tests.conftest import EXAMPLES

    imports = [line for line in source.splitlines() if line.startswith("from linnet.compiler.torch.prelude import ")]
    assert len(imports) == 1 and "linear" in imports[0].split(" import ")[1].split(", ")
    standalone = generate(build(EXAMPLES / "llama.linnet", config=LLAMA), standalone=True)
    assert standalone.count("\ndef linear(x, weight):") == 1 and "linnet" not in standalone.split('"""')[2]
    mlp = source[source.index("class LlamaMLP") :]
    assert "linear(" in mlp and "F.linear(" not in mlp[: mlp.index("\nclass ")]


@pytest.mark.parametrize(
    ("n", "k", "lead"),
    [(64, 32, (1, 1)), (1536, 576, (1, 1)), (576, 1536, (1,)), (4098, 64, ()), (576, 576, (2, 1)), (192, 576, (4, 4))],
)
def test_up_to_16_f32_rows_give_f_linear_bits_as_blocks_where_the_kernels_agree(
    namespace, linear, two_threads, bmm_calls, n, k, lead
):
    generator = torch.Generator().manual_seed(n + k)
    x = torch.randn(*lead, k, generator=generator)
    weight = torch.nn.Parameter(torch.randn(n, k, generator=generator) / k**0.5, requires_grad=False)
    linear(x, weight)  # the first call of its kind decides, on random rows, whether blocks give F.linear's bits
    assert bmm_calls  # the check ran (a draw or more)
    bmm_calls.clear()
    y = linear(x * 3, weight)
    exact = namespace["_same_bits"](namespace["_blocks_of_n"], x, weight)  # the decision, as cached
    assert len(bmm_calls) == (1 if exact else 0)  # blocks where they agree, F.linear elsewhere
    assert y.shape == (*lead, n) and y.dtype == torch.float32
    # the decision holds for other values: the order of the sums is the kernels', not the data's
    assert torch.equal(y, F.linear(x * 3, weight))


@pytest.mark.parametrize(("n", "k", "lead"), [(3072, 576, (1, 1)), (576, 1536, (1,)), (49152, 576, ()), (16, 32, (1,))])
def test_one_bf16_row_gives_f_linear_bits_as_torch_mv_where_the_kernels_agree(
    namespace, linear, monkeypatch, n, k, lead
):
    calls = []
    real = torch.mv
    monkeypatch.setattr(torch, "mv", lambda *args: calls.append(args) or real(*args))
    generator = torch.Generator().manual_seed(n + k)
    weight = torch.nn.Parameter((torch.randn(n, k, generator=generator) / k**0.5).bfloat16(), requires_grad=False)
    x = torch.randn(*lead, k, generator=generator).bfloat16()
    linear(x, weight)
    calls.clear()
    y = linear(x * 3, weight)
    exact = namespace["_same_bits"](namespace["_one_row_mv"], x, weight)
    assert len(calls) == (1 if exact else 0)
    assert y.shape == (*lead, n) and y.dtype == torch.bfloat16
    assert torch.equal(y, F.linear(x * 3, weight))
    calls.clear()
    two = torch.randn(2, k, generator=generator).bfloat16()  # more rows: F.linear
    assert torch.equal(linear(two, weight), F.linear(two, weight)) and calls == []


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("n", "k"), [(576, 1536), (1536, 576), (3072, 576), (576, 576), (192, 576)])
def test_where_the_check_picks_torch_mv_it_gives_f_linear_bits_on_every_row(namespace, threads, n, k):
    """The decision against the real kernels of this CPU, on many rows: where `_same_bits` says torch.mv gives
    F.linear's bits (SmolLM2's shapes), 200 plain random rows give F.linear's bits on every output; where the two
    kernels differ on any of those outputs, it said they differ (bf16 [576, 1536] on an AVX-512 EPYC: ~1.5e-4 of
    outputs, which the uniform probe of 4,096 outputs missed most runs, so one-row bf16 decode was claimed
    bit-identical to F.linear and was not). Holds on AVX2, AVX-512 and AMX machines alike: whichever kernels
    torch picks there, the check and this test read the same ones."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    generator = torch.Generator().manual_seed(n * k + threads)
    weight = (torch.randn(n, k, generator=generator) / k**0.5).bfloat16()
    namespace["_SAME_BITS"].clear()
    try:
        x = torch.randn(1, k, generator=generator).bfloat16()
        exact = namespace["_same_bits"](namespace["_one_row_mv"], x, weight)
        mismatched = 0
        for _ in range(200):
            x = torch.randn(1, k, generator=generator).bfloat16()
            mismatched += int((namespace["_one_row_mv"](x, weight) != F.linear(x, weight)).sum())
        assert not (exact and mismatched), f"torch.mv taken for F.linear, yet {mismatched} outputs of {200 * n} differ"
    finally:
        namespace["_SAME_BITS"].clear()
        torch.set_num_threads(before)


@pytest.mark.parametrize(("way", "dtype", "rows"), [("bmm", torch.float32, 1), ("mv", torch.bfloat16, 1)])
def test_kernels_that_round_otherwise_are_never_used(namespace, linear, two_threads, monkeypatch, way, dtype, rows):
    """A bmm or mv an ulp off (as a bmm on an AVX-512 Xeon for some shapes) is caught by the first call's check:
    from then on that kind of call is F.linear, bit for bit."""
    real = getattr(torch, way)
    calls = []

    def off_by_an_ulp(*args):
        calls.append(args)
        y = real(*args)
        return torch.nextafter(y, torch.full_like(y, float("inf")))

    monkeypatch.setattr(torch, way, off_by_an_ulp)
    namespace["_SAME_BITS"].clear()
    generator = torch.Generator().manual_seed(3)
    weight = torch.randn(64, 32, generator=generator).to(dtype)
    try:
        for _ in range(3):
            x = torch.randn(rows, 32, generator=generator).to(dtype)
            assert torch.equal(linear(x, weight), F.linear(x, weight))
        assert len(calls) == 1  # the check stops at its first difference, once a process
    finally:
        namespace["_SAME_BITS"].clear()


def reversed_sums(x, weight):
    """F.linear with each dot product summed in f32 from its last term to its first, rounded once to x's dtype: a
    kernel of another order, whose bf16 outputs differ from F.linear's only where rounding errors reach the last
    bit."""
    return (x.flip(-1).float() @ weight.flip(-1).float().t()).to(x.dtype)


@pytest.mark.parametrize(("n", "k"), [(576, 1536), (64, 32), (3072, 576)])
def test_a_kernel_summing_in_another_order_is_caught_though_it_rarely_differs(namespace, n, k):
    """On plain random values such a kernel gives F.linear's bf16 bits on nearly every output (the ~6e-5 that differ
    for bf16 `torch.mv` through [576, 1536] on an AVX-512 EPYC went unseen by 4,096 uniform outputs); the check's
    probes cancel, so that other orders give other outputs, and the kernel is refused. F.linear itself passes."""
    generator = torch.Generator().manual_seed(n + k)
    x = torch.randn(1, k, generator=generator).bfloat16()
    weight = (torch.randn(n, k, generator=generator) / k**0.5).bfloat16()
    plain = (reversed_sums(x, weight) != F.linear(x, weight)).float().mean().item()
    assert plain < 1e-3  # on plain values the two orders nearly always round alike (never, for [64, 32])
    namespace["_SAME_BITS"].clear()
    try:
        assert not namespace["_same_bits"](reversed_sums, x, weight)
        assert namespace["_same_bits"](lambda x, w: F.linear(x, w), x, weight)
    finally:
        namespace["_SAME_BITS"].clear()


@pytest.mark.parametrize(
    ("n", "k", "rows"), [(2, 768, 1), (2, 576, 1), (2, 1024, 1), (2, 8, 1), (2, 17, 2), (16, 32, 1)]
)
def test_few_outputs_never_pass_the_check_by_chance(namespace, linear, two_threads, n, k, rows):
    """A few outputs summed in another order agree by chance often (a [2, 768] head on one draw in five): the
    check compares thousands of outputs, on a random weight, so neither the draw nor the first weight decides."""
    generator = torch.Generator().manual_seed(n * k + rows)
    namespace["_SAME_BITS"].clear()
    try:
        for trial in range(10):
            weight = torch.randn(n, k, generator=generator)
            if trial == 0:  # a sparse first weight (one non-zero a row) agrees under any order
                weight = weight * (torch.arange(k) == 0)
            for _ in range(5):
                x = torch.randn(rows, k, generator=generator)
                assert torch.equal(linear(x, weight), F.linear(x, weight))
    finally:
        namespace["_SAME_BITS"].clear()


def test_x_laid_out_otherwise_is_f_linear(linear, two_threads, bmm_calls):
    """F.linear takes other kernels for a transposed or expanded x (other bits than for the same rows contiguous),
    which the check does not model: such an x is F.linear."""
    generator = torch.Generator().manual_seed(5)
    weight = torch.randn(576, 576, generator=generator)
    for x in (torch.randn(576, 2, generator=generator).t(), torch.randn(1, 576, generator=generator).expand(4, 576)):
        assert torch.equal(linear(x, weight), F.linear(x, weight))
    assert bmm_calls == []


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_torch_func_and_gradients_see_f_linear(linear, two_threads, dtype):
    generator = torch.Generator().manual_seed(6)
    weight = torch.randn(64, 32, generator=generator).to(dtype)
    xs = torch.randn(3, 1, 32, generator=generator).to(dtype)
    assert torch.equal(torch.func.vmap(lambda x: linear(x, weight))(xs), F.linear(xs, weight))
    x = xs[0].clone().requires_grad_()
    linear(x, weight).sum().backward()
    reference = xs[0].clone().requires_grad_()
    F.linear(reference, weight).sum().backward()
    assert torch.equal(x.grad, reference.grad)


@pytest.mark.parametrize(
    ("n", "k", "lead"), [(1536, 576, (1, 1)), (4096, 64, ()), (64, 32, (2, 1)), (96, 32, (4, 4)), (33, 8, (1, 3, 1))]
)
def test_a_weight_held_transposed_runs_as_blocks_of_k_with_f_linear_values(linear, two_threads, bmm_calls, n, k, lead):
    """A weight whose memory is [K, N] (strides (1, N), how a `fast` module holds its wide weights): each block is
    K / threads rows of that memory, the partial products summed."""
    generator = torch.Generator().manual_seed(n * k)
    x = torch.randn(*lead, k, generator=generator)
    weight = torch.nn.Parameter(torch.randn(k, n, generator=generator).t() / k**0.5, requires_grad=False)
    assert weight.stride() == (1, n)
    y = linear(x, weight)
    assert len(bmm_calls) == 1 and bmm_calls[0][1].shape == (2, k // 2, n)  # no check: `fast` only, rounds otherwise
    assert y.shape == (*lead, n) and y.dtype == torch.float32
    # the same products, summed in two halves of K and then added: f32 rounding
    torch.testing.assert_close(y, F.linear(x, weight), rtol=1e-5, atol=1e-5)


def _function_mode_case():
    seen = []

    class Recording(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    return Recording, seen


@pytest.mark.parametrize(
    "case",
    [
        "odd rows",
        "bf16, two rows",
        "f16",
        "17 rows",
        "strided weight",
        "transposed weight, odd K",
        "sparse weight",
        "one thread",
        "function mode",
        "quantized weight",
    ],
)
def test_everything_else_is_f_linear(linear, two_threads, bmm_calls, case):
    generator = torch.Generator().manual_seed(7)
    x, weight = torch.randn(1, 1, 64, generator=generator), torch.randn(128, 64, generator=generator)
    if case == "odd rows":
        weight = weight[:127]
    elif case == "bf16, two rows":
        x, weight = torch.randn(1, 2, 64, generator=generator).bfloat16(), weight.bfloat16()
    elif case == "f16":
        x, weight = x.half(), weight.half()
    elif case == "17 rows":
        x = torch.randn(1, 17, 64, generator=generator)
    elif case == "strided weight":
        weight = torch.randn(128, 128, generator=generator)[:, ::2]
    elif case == "transposed weight, odd K":  # blocks of K would not divide it
        x, weight = x[..., :63], torch.randn(63, 128, generator=generator).t()
    elif case == "sparse weight":
        weight = weight.to_sparse_csr()
    elif case == "one thread":
        torch.set_num_threads(1)
    elif case == "quantized weight":
        from tests.compiler.test_torch_quantized import packed

        weight = packed("q4_0", 128, cols=64)[1]
    if case == "function mode":
        Recording, seen = _function_mode_case()
        with Recording():
            y = linear(x, weight)
        assert F.linear in seen
    else:
        y = linear(x, weight)
    assert bmm_calls == []
    assert torch.equal(y, F.linear(x, weight))
