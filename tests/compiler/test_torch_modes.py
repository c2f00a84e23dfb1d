"""The PyTorch backend's modes on a small Llama: interpret and generated agree bit for bit,
inductor compiles the decode step once, and a decode step has what a CUDA graph needs (no
host synchronisation, the cache keeps its storage)."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

import linnet.torch as lt  # noqa: E402
from linnet.compiler.torch.module import BackendError, compile_program  # noqa: E402
from linnet.ir import build  # noqa: E402
from tests.conftest import ROOT  # noqa: E402

SMALL = {
    "vocab_size": 96,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
}


def small(mode: str, **kw):
    return lt.load(
        "examples/llama.linnet", config=SMALL, mode=mode, random_weights=True, max_positions=32, progress=False, **kw
    )


def decode(model, prompt: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """Prefill then greedy decode through the torch-native entries; the logits of every step."""
    out = [model.native.step(prompt, torch.tensor([0]), torch.tensor([0]))]
    pos = prompt.shape[1]
    for _ in range(steps):
        tok = out[-1].argmax(-1, keepdim=True)
        out.append(model.native.step(tok, torch.tensor([pos]), torch.tensor([0])))
        pos += 1
    return out


def test_interpret_and_generated_agree_exactly():
    prompt = torch.tensor([[3, 14, 15, 92, 65]])
    a = decode(small("interpret"), prompt, 4)
    b = decode(small("generated"), prompt, 4)
    for x, y in zip(a, b):
        assert torch.equal(x, y)


@pytest.mark.slow
def test_inductor_compiles_the_decode_step_once():
    import torch._dynamo

    torch._dynamo.reset()
    model = small("inductor")
    reference = small("generated")
    prompt = torch.tensor([[3, 14, 15, 92, 65]])
    first = decode(model, prompt, 1)  # compiles prefill (S = 5) and decode (S = 1)
    with torch._dynamo.config.patch(error_on_recompile=True):
        rest = [model.native.step(torch.tensor([[7 + i]]), torch.tensor([6 + i]), torch.tensor([0])) for i in range(6)]
    ref = decode(reference, prompt, 1)
    ref += [reference.native.step(torch.tensor([[7 + i]]), torch.tensor([6 + i]), torch.tensor([0])) for i in range(6)]
    for x, y in zip(first + rest, ref):
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("mode", ["interpret", "generated", "inductor"])
def test_a_deep_copy_runs_its_own_weights_and_cache(mode):
    """`copy.deepcopy` of a module (a frozen reference beside a policy being trained) decodes with the copy's
    weights and KV cache: its entries are closures, which a plain deep copy shares with the original (the
    interpreter's and inductor's copies ran the original's weights)."""

    def halved(module):
        with torch.no_grad():
            for p in module.parameters():
                p.mul_(0.5)
        return module

    def step(module, token: int, position: int) -> torch.Tensor:
        return module.step(torch.tensor([[token]]), torch.tensor([position]), torch.tensor([0]))

    original = small(mode).module
    twin = halved(copy.deepcopy(original))
    tokens = [3, 14, 15, 92, 65, 35]
    got_original, got_twin = [], []
    for i, t in enumerate(tokens):  # interleaved: each step reads the cache its own module wrote
        got_original.append(step(original, t, i))
        got_twin.append(step(twin, t, i))
    fresh, fresh_halved = small(mode).module, halved(small(mode).module)
    want_original = [step(fresh, t, i) for i, t in enumerate(tokens)]
    want_twin = [step(fresh_halved, t, i) for i, t in enumerate(tokens)]
    for got, want in ((got_original, want_original), (got_twin, want_twin)):
        for x, y in zip(got, want):
            torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(got_original[-1], got_twin[-1])


LAZY_PROBE = """
import sys
import linnet.torch as lt
from linnet.runtimes.backends import caches
from tests.compiler.test_torch_modes import SMALL
assert caches.enable("torch") is not None  # as the CLI does before loading
model = lt.load("examples/llama.linnet", config=SMALL, mode="inductor", random_weights=True, max_positions=32,
                progress=False)
print("torch._dynamo" in sys.modules, "torch._inductor.pattern_matcher" in sys.modules)
"""


def test_inductor_mode_imports_the_compiler_at_the_first_call_not_at_load(tmp_path):
    """Loading is checking and binding weights; torch._dynamo and inductor's pattern matcher (~3 s of imports) come
    with the first compiled call (`module.LazilyCompiled`, below), which compiles anyway, also after the CLI has
    turned inductor's cache on (`caches.enable`)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "LINNET_CACHE_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", LAZY_PROBE], capture_output=True, text=True, cwd=ROOT, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["False", "False"]


def test_lazily_compiled_entries_make_their_compiled_function_once_and_one_at_a_time(monkeypatch):
    """Threads calling two entries for the first time together: each entry's `torch.compile` runs once, and never
    two at once (two entries importing torch._dynamo at once broke it for the process)."""
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    from linnet.compiler.torch import module

    made, running, overlapped = [], [], []

    def slow_compile(fn, **kwargs):
        running.append(1)
        overlapped.append(len(running) > 1)
        time.sleep(0.05)  # as an import would: long enough for every thread to arrive
        running.pop()
        made.append(kwargs)
        return fn

    monkeypatch.setattr(module.torch, "compile", slow_compile)
    first = module.LazilyCompiled(lambda x: x + 1, fullgraph=True, dynamic=False)
    second = module.LazilyCompiled(lambda x: x, decode_options=True, fullgraph=True)
    assert made == []  # nothing at construction
    barrier = threading.Barrier(8)

    def call(i):
        barrier.wait()
        return (first if i % 2 else second)(i)

    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(call, range(8))) == [0, 2, 2, 4, 4, 6, 6, 8]
    assert len(made) == 2 and not any(overlapped)
    assert {"fullgraph": True, "dynamic": False} in made
    assert any(kw.get("options") is module_decode_options() for kw in made)


def test_a_lazily_compiled_entry_called_inside_a_trace_runs_eagerly_and_keeps_nothing(monkeypatch):
    """Inside `torch.export` (or another compile) `torch.compile` hands back the function itself: the entry runs it
    and compiles at its next ordinary call."""
    from linnet.compiler.torch import module

    made = []
    monkeypatch.setattr(module.torch, "compile", lambda fn, **kw: made.append(kw) or fn)
    entry = module.LazilyCompiled(lambda x: x * 2)
    monkeypatch.setattr(module.torch.compiler, "is_exporting", lambda: True)
    assert entry(3) == 6 and made == [] and entry.compiled is None
    monkeypatch.setattr(module.torch.compiler, "is_exporting", lambda: False)
    assert entry(3) == 6 and len(made) == 1


def module_decode_options():
    from linnet.compiler.torch.inductor_passes import DECODE_OPTIONS

    return DECODE_OPTIONS


class _HostSyncs(torch.utils._python_dispatch.TorchDispatchMode):
    """Records ops that need the host to see device data: `.item()`, data-dependent shapes."""

    SYNCING = ("_local_scalar_dense", "nonzero", "masked_select", "unique", "_assert_async", "equal")

    def __init__(self):
        super().__init__()
        self.found: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in self.SYNCING:
            self.found.append(name)
        return func(*args, **(kwargs or {}))


def test_decode_step_is_cuda_graph_ready():
    model = small("generated", max_batch=2)
    module = model.module
    caches = {k: (t.data_ptr(), t) for k, t in module.tensors.items() if k.endswith("_cache")}
    assert len(caches) == 2 * SMALL["num_hidden_layers"]
    model.native.step(torch.tensor([[1, 2, 3]]), torch.tensor([0]), torch.tensor([1]))
    # the first two-row step also checks, once a process, which linears give F.linear's bits as blocks (`linear`)
    model.native.step(torch.tensor([[4], [5]]), torch.tensor([3, 0]), torch.tensor([1, 0]))
    with _HostSyncs() as mode:
        model.native.step(torch.tensor([[6], [7]]), torch.tensor([4, 1]), torch.tensor([1, 0]))
    # On the CPU, attention reads the cache up to the last attended key, planned once a step for every layer (one
    # `nonzero`, then its length and whether the mask can be dropped, read back); on other devices decode steps,
    # which CUDA graphs capture, read the whole cache, masked, with no host synchronisation (the meta device here).
    assert mode.found.count("nonzero") == 1 and len(mode.found) <= 4, mode.found
    attended_keys = module._exec_source()["attended_keys"]
    mask = torch.ones(2, 1, 32, dtype=torch.bool, device="meta")
    with _HostSyncs() as mode:
        keys, attend, causal = attended_keys(mask, 32)
    assert mode.found == [] and (keys, attend.shape, causal) == (32, (2, 1, 1, 32), False)
    for k, (ptr, t) in caches.items():
        assert module.tensors[k] is t and t.data_ptr() == ptr, f"{k} was reallocated"
    assert t.abs().sum() > 0  # the steps wrote into the same storage


class _Gathers(torch.utils._python_dispatch.TorchDispatchMode):
    """Records the number of elements each gather (`aten.index`, advanced indexing) made."""

    def __init__(self):
        super().__init__()
        self.sizes: list[int] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket.__name__ == "index":
            self.sizes.append(out.numel())
        return out


@pytest.mark.parametrize("rows", [[0, 1, 2], [3, 0, 2]], ids=["consecutive", "scattered"])
def test_a_batched_step_reads_only_the_attended_positions_of_its_rows(rows):
    # a serving step of B rows copied every position of each row's cache (B x max_positions) at every layer,
    # whatever the rows held: 32 rows of SmolLM2 at 768 positions, 280 MB per decode step
    model = small("generated", max_batch=4)
    for row in range(4):
        model.native.step(torch.tensor([[1, 2, 3, 4]]), torch.tensor([0]), torch.tensor([row]))
    reference = small("interpret", max_batch=4)
    for row in range(4):
        reference.native.step(torch.tensor([[1, 2, 3, 4]]), torch.tensor([0]), torch.tensor([row]))
    ids, positions = torch.tensor([[5], [6], [7]]), torch.tensor([4, 4, 4])
    with _Gathers() as mode:
        logits = model.native.step(ids, positions, torch.tensor(rows))
    whole = len(rows) * SMALL["num_key_value_heads"] * 32 * (SMALL["hidden_size"] // SMALL["num_attention_heads"])
    attended = whole * 5 // 32  # positions 0..4
    assert attended < whole and all(size <= attended for size in mode.sizes), mode.sizes
    assert bool(mode.sizes) == (rows != [0, 1, 2])  # consecutive rows are a view of the cache, no gather
    assert torch.equal(logits, reference.native.step(ids, positions, torch.tensor(rows)))


def test_cuda_graphs_without_cuda_fails_clearly():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    program = build("examples/llama.linnet", config=SMALL, max_positions=16)
    with pytest.raises(BackendError, match="needs a CUDA device"):
        compile_program(program, "cuda-graphs")


def test_fast_numerics_stay_close_to_equivalent():
    """`fast` swaps in SDPA (with enable_gqa) and fused RMS norm; the result stays within f32 rounding."""
    prompt = torch.tensor([[3, 14, 15, 92, 65]])
    exact, fast = small("generated"), small("generated", numerics="fast")
    assert "scaled_dot_product_attention" in fast.module.source and "F.rms_norm" in fast.module.source
    torch.testing.assert_close(fast.native.forward(prompt), exact.native.forward(prompt), rtol=0, atol=1e-5)
    for x, y in zip(decode(fast, prompt, 3), decode(exact, prompt, 3)):
        torch.testing.assert_close(x, y, rtol=0, atol=1e-5)


def test_wide_bf16_linears_in_f32_round_once():
    """`fast` bf16 on a CPU without bf16 dot instructions: a linear over more than 16 rows is computed in f32 and
    rounded once, which is the exact product (f64) rounded to bf16, give or take the last bit (f32 summation),
    and the bf16 kernel's result within one bf16 step; up to 16 rows (decode) it is the bf16 kernel's, untouched."""
    from linnet.compiler.torch.module import _WideLinearsInF32

    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 96, generator=g).bfloat16()
    w = torch.randn(80, 96, generator=g).bfloat16()
    exact = (x.double() @ w.double().T).bfloat16().double()
    kernel = torch.nn.functional.linear(x, w)
    with _WideLinearsInF32():
        wide = torch.nn.functional.linear(x, w)
        narrow = torch.nn.functional.linear(x[:16], w)
    assert wide.dtype == torch.bfloat16 and torch.equal(narrow, kernel[:16])
    step = 2.0**-7 * exact.abs() + 1e-30  # one bf16 step (8 significant bits) at each value
    assert ((wide.double() - exact).abs() <= step).all()
    assert ((wide.double() - kernel.double()).abs() <= 2 * step).all()


def test_fast_bf16_prefill_in_f32_matches_the_bf16_kernel(monkeypatch):
    """The whole model: `fast` bf16 with wide linears in f32 (forced on, as on an AVX2 CPU) against the same model
    with the bf16 kernels, logits at every position of a 12-token prefill and the step's: within bf16 rounding."""
    import linnet.compiler.torch.module as module

    prompt = torch.tensor([[3, 14, 15, 92, 65, 35, 89, 79, 32, 38, 46, 26]])
    logits = {}
    for emulated in (False, True):
        monkeypatch.setattr(module, "_bf16_matmul_emulated", lambda device, e=emulated: e)
        model = small("generated", dtype="bf16", numerics="fast")
        with torch.inference_mode():
            logits[emulated] = (model.native.forward(prompt), model.native.step(prompt, *[torch.tensor([0])] * 2))
    for ours, kernel in zip(logits[True], logits[False]):
        assert ours.dtype == torch.bfloat16
        torch.testing.assert_close(ours.float(), kernel.float(), rtol=0.05, atol=0.05)
    assert torch.equal(logits[True][0][:, -1], logits[True][1])  # forward and step agree with each other
