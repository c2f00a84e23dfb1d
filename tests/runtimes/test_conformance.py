"""Every backend of the registry against the `torch-interpret` reference, through the one `LoadedModel`
interface (numpy in, numpy out): each example (an MLP, Llama, GPT-2, BERT at tiny configs, with the same
seeded random weights on every backend), each entry, its outputs' shapes against the checker's and its
values against the reference's. An entry with a KV cache runs a prefill of two rows and then a decode step
that reads it. A backend that cannot run here is skipped with the registry's reason. JAX's backends also run on
a TPU (the tests marked tpu: `tests/runtimes/conftest.py`, `on_devices`), against the same reference computed on
the CPU."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from linnet.runtimes.backends import BACKENDS
from linnet.runtimes.model import LoadedModel, concrete_dim, random_inputs
from tests.conftest import EXAMPLES
from tests.runtimes.conftest import device_label, on_devices, record, run_device

REFERENCE = "torch-interpret"
SIZES = {"B": 2, "S": 5}
MAX_POSITIONS = 16
# f32 on every backend: the same op order under `equivalent` numerics, so only rounding differs
ATOL, RTOL = 1e-5, 1e-4
# On a TPU (f32 dots at precision "highest"; its own exp, tanh, erf, rsqrt): ten times the absolute bound. A dot at the
# chip's default precision (one bf16 pass) moves Llama's and GPT-2's outputs here by 1e-3 (measured on the CPU with
# every dot's operands rounded to bf16), which it still refuses.
TPU_ATOL = 1e-4

# example -> (file, preset, config): tiny sizes of each architecture
EXAMPLE_MODELS = {
    "mlp": ("mlp.linnet", "tiny", {}),
    "llama": (
        "llama.linnet",
        None,
        {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64},
    ),
    "gpt2": (
        "gpt2.linnet",
        None,
        {"vocab_size": 64, "n_positions": 32, "n_embd": 32, "n_layer": 2, "n_head": 4},
    ),
    "bert": (
        "bert.linnet",
        None,
        {"vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
         "intermediate_size": 48, "max_position_embeddings": 32},
    ),
}  # fmt: skip


def load(backend: str, example: str, device: str = "cpu") -> LoadedModel:
    file, preset, config = EXAMPLE_MODELS[example]
    return BACKENDS[backend].load(
        EXAMPLES / file,
        preset=preset,
        config=config,
        device=device,
        max_batch=SIZES["B"],
        max_positions=MAX_POSITIONS,
        random_weights=True,
        seed=0,
        progress=False,
    )


def calls(model: LoadedModel, entry: str) -> list[tuple[dict[str, int], list[np.ndarray]]]:
    """(sizes, inputs) of each call of `entry`: one call, or for a KV-cache step a prefill of both rows at
    position 0 and then one decode token per row (row 1's entry first, so that rows and batch order differ)."""
    graph = model.program.entries[entry]
    vocab = model.config.get("vocab_size", 100)
    inputs = random_inputs(graph, SIZES, seed=1, vocab_size=vocab)
    names = [v.name for v in graph.inputs]
    if "attention_mask" in names:
        inputs[names.index("attention_mask")][1, -2:] = 0  # row 1 padded: masking must agree too
    if not graph.uses_state:
        return [(SIZES, inputs)]
    one = {"B": SIZES["B"], "S": 1}
    decode = random_inputs(graph, one, seed=2, vocab_size=vocab)
    decode[names.index("positions")][:] = SIZES["S"]
    decode[names.index("rows")][:] = [1, 0]
    return [(SIZES, inputs), (one, decode)]


@functools.cache
def reference(example: str) -> dict[str, list[tuple[np.ndarray, ...]]]:
    """The reference outputs of every call of every entry of `example`."""
    model = load(REFERENCE, example)
    return {entry: [model.run(entry, *args) for _, args in calls(model, entry)] for entry in model.entries}


@pytest.mark.parametrize("example", list(EXAMPLE_MODELS))
@pytest.mark.parametrize("backend, device", on_devices(BACKENDS))
def test_backend_conforms(backend, device, example):
    for name, on in ((REFERENCE, "cpu"), (backend, run_device(device))):
        reason = BACKENDS[name].unavailable(on)
        if reason is not None:
            pytest.skip(reason)
    model = load(backend, example, run_device(device))
    assert isinstance(model, LoadedModel) and model.backend == backend
    assert model.entries == tuple(model.program.entries)
    expected = reference(example)
    for entry in model.entries:
        graph = model.program.entries[entry]
        for i, (sizes, args) in enumerate(calls(model, entry)):
            outs = model.run(entry, *args)
            assert isinstance(outs, tuple) and len(outs) == len(graph.outputs)
            for out, want, value in zip(outs, expected[entry][i], graph.outputs):
                assert isinstance(out, np.ndarray), type(out)
                assert list(out.shape) == [concrete_dim(d, sizes) for d in value.dims], "the checker's shape"
                assert out.dtype == want.dtype
                delta = float(np.abs(out.astype(np.float64) - want).max())
                label = device_label(backend, device)
                record(f"{example} {entry} call {i} ({label})", delta, model=example, backend=label,
                       checkpoint="random weights, seed 0", against=REFERENCE)  # fmt: skip
                atol = TPU_ATOL if device == "tpu" else ATOL
                np.testing.assert_allclose(out, want, rtol=RTOL, atol=atol, err_msg=f"{label} {example} {entry}")
