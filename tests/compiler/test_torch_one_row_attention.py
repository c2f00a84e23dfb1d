"""The generated module's `one_row_attention` (linnet/compiler/torch/prelude.py): under `fast` in
bf16,
a decode step's attention on the CPU as the flash kernel's math with f32 matmuls. Against the kernel it replaces
(within bf16 rounding) and the exact attention in f64 (as close as the kernel); the kernel's own call everywhere
else; and the whole model's decode under `fast` against `equivalent` (which keeps the kernel)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional
pytestmark = pytest.mark.torch

import linnet.torch as lt  # noqa: E402
from tests.compiler.test_torch_linear import LLAMA  # noqa: E402

BF16_STEP = 2.0**-8  # half a bf16 step (8 significant bits): the rounding of one value


def _source(dtype: str, numerics: str) -> str:
    from linnet.compiler.torch.codegen import generate
    from linnet.ir import build
    from tests.conftest import EXAMPLES

    return generate(build(EXAMPLES / "llama.linnet", config=LLAMA, dtype=dtype), numerics)


@pytest.fixture(scope="module")
def one_row_attention():
    from linnet.compiler.torch.prelude import one_row_attention

    namespace: dict = {}
    exec(compile(_source("bf16", "fast"), "generated", "exec"), namespace)
    assert namespace["one_row_attention"] is one_row_attention  # what the module calls
    return one_row_attention


def _dot_instructions(monkeypatch, present: bool) -> None:
    """oneDNN's answer to "does this CPU have bf16 / f16 dot instructions", which the helper asks at each call."""
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: present)
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_fp16_supported", lambda: present)


@pytest.fixture
def emulated(monkeypatch):
    """A CPU without bf16/f16 dot instructions (an AVX2 one, where the helper computes), whatever runs the test."""
    _dot_instructions(monkeypatch, False)


def test_only_fast_non_f32_modules_call_it():
    assert "one_row_attention(" in _source("bf16", "fast")
    for dtype, numerics in (("bf16", "equivalent"), ("f32", "fast"), ("f32", "equivalent")):
        assert "one_row_attention" not in _source(dtype, numerics), (dtype, numerics)


def _exact(q, k, v, mask, scale):
    """Attention in f64 with GQA as SDPA does it (query head h reads KV head h // G); a row with no key: zeros."""
    q, k, v = q.double(), k.double(), v.double()
    G = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(G, 1), v.repeat_interleave(G, 1)
    scores = (q @ k.transpose(-2, -1)) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, -1).nan_to_num(0.0)
    return weights @ v


@pytest.mark.parametrize("keys", [5, 600, 1100])  # 600 and 1100: past the kernel's blocks of 512 keys
@pytest.mark.parametrize("masked", [False, True])
def test_bf16_row_is_the_kernel_within_rounding(one_row_attention, emulated, keys, masked):
    generator = torch.Generator().manual_seed(keys + masked)
    q = torch.randn(3, 6, 1, 16, generator=generator).bfloat16()
    k, v = (torch.randn(3, 2, keys, 16, generator=generator).bfloat16() for _ in range(2))
    mask = None
    if masked:  # bool [B, 1, 1, T]: random keys per row; row 2 attends nothing (a padded row: zeros)
        mask = torch.rand(3, 1, 1, keys, generator=generator) < 0.7
        mask[2] = False
    ours = one_row_attention(q, k, v, mask, False, 0.25)
    kernel = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.25, enable_gqa=True)
    exact = _exact(q, k, v, mask, 0.25)
    assert ours.dtype == torch.bfloat16 and ours.shape == kernel.shape == (3, 6, 1, 16)
    scale = exact.abs().amax(-1, keepdim=True) + 1e-30  # per row: values near 0 are sums of cancelling terms
    assert ((ours.double() - exact).abs() <= 3 * BF16_STEP * scale).all()
    assert ((ours.double() - kernel.double()).abs() <= 4 * BF16_STEP * scale).all()
    if masked:
        assert torch.equal(ours[2], torch.zeros_like(ours[2])) and torch.equal(kernel[2], torch.zeros_like(kernel[2]))


@pytest.mark.parametrize(
    "case", ["f32", "f64", "two query rows", "causal", "no scale", "a mask per head", "bf16 dot instructions"]
)
def test_everything_else_is_the_kernel(one_row_attention, monkeypatch, case):
    _dot_instructions(monkeypatch, case == "bf16 dot instructions")
    generator = torch.Generator().manual_seed(3)
    rows = 2 if case in ("two query rows", "causal") else 1
    dtype = {"f32": torch.float32, "f64": torch.float64}.get(case, torch.bfloat16)
    q = torch.randn(1, 6, rows, 16, generator=generator).to(dtype)
    k, v = (torch.randn(1, 2, 7, 16, generator=generator).to(dtype) for _ in range(2))
    mask = torch.rand(1, 6, rows, 7, generator=generator) < 0.5 if case == "a mask per head" else None
    causal, scale = case == "causal", None if case == "no scale" else 0.25
    ours = one_row_attention(q, k, v, mask, causal, scale)
    kernel = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=True)
    assert torch.equal(ours, kernel)


def test_dynamic_compile_traces_the_kernel_call(one_row_attention):
    """Under torch.compile with dynamic shapes the helper is the kernel's call (a SymBool `enable_gqa` once broke
    this trace)."""
    generator = torch.Generator().manual_seed(4)
    q = torch.randn(1, 6, 1, 16, generator=generator).bfloat16()
    k, v = (torch.randn(1, 2, 9, 16, generator=generator).bfloat16() for _ in range(2))
    compiled = torch.compile(one_row_attention, fullgraph=True, dynamic=True, backend="eager")
    kernel = F.scaled_dot_product_attention(q, k, v, scale=0.25, enable_gqa=True)
    assert torch.equal(compiled(q, k, v, None, False, 0.25), kernel)


def test_fast_bf16_decode_agrees_with_equivalent(emulated):
    """The whole model, 8 greedy steps after a 5-token prompt: `fast` (this attention; decode's linears are the
    bf16 kernel's in both) against `equivalent` (the flash kernel) on the same random weights, q_proj and k_proj
    scaled up so that each query attends a few keys (with flat scores any average of the values would pass): the
    logits within bf16 rounding of each other, fed the same tokens."""
    prompt = torch.tensor([[3, 14, 15, 9, 2]])
    config = {**LLAMA, "vocab_size": 64, "max_position_embeddings": 64}
    models = {
        n: lt.load("examples/llama.linnet", config=config, dtype="bf16", numerics=n, random_weights=True, seed=0,
                   max_positions=32, progress=False)
        for n in ("fast", "equivalent")
    }  # fmt: skip
    for model in models.values():
        for name, weight in model.module.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                weight.data.mul_(8)
    row = torch.tensor([0])
    with torch.inference_mode():
        logits = {n: [m.native.step(prompt, row, row)] for n, m in models.items()}
        for position in range(5, 13):
            token = logits["equivalent"][-1].argmax(-1, keepdim=True)
            for n, m in models.items():
                logits[n].append(m.native.step(token, torch.tensor([position]), row))
    for fast, equivalent in zip(logits["fast"][1:], logits["equivalent"][1:]):
        torch.testing.assert_close(fast.float(), equivalent.float(), rtol=0.05, atol=0.05)
