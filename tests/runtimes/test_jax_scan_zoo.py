"""Every zoo model on the JAX backend with its lists of identical layers scanned (`load(scan_layers=True)`:
held stacked, each loop one `lax.scan`; `linnet.compiler.jax.scan`) gives what it gives unrolled, on every entry,
at a shrunk size of its first preset (`verify_sizes.SHRUNK`: 2 layers, widths of tens), on seeded random weights and
inputs (`random_inputs`: the stateful entries write and read the KV cache from position 0).

Which lists are stacked is part of the expectation (`STACKED`): a family whose loop stops being scanned fails here
rather than silently compiling every layer. DINOv2's `encoder.layer` is reached through a module the generated code
inlines, so its items have no class of their own (their members are the model class's paths,
`encoder.layer.0.norm1.weight`): held stacked they read `None` members until the prelude's `Module` made a `Stacked`
of a class for them (`_stacked_classless`).

Tolerance: the conformance suite's 1e-5 (f32); measured 0.0 on every entry (2 layers, the CPU).
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.runtimes.verify_sizes import SHRUNK, presets, source

pytest.importorskip("jax")
pytestmark = pytest.mark.jax

import linnet.jax as lj  # noqa: E402
from linnet.runtimes.model import random_inputs  # noqa: E402

ATOL = 1e-5
DIMS = {"B": 1, "S": 4, "T": 4}  # T: SigLIP's text length
# family -> the lists held stacked when scanned (the others' loops are unrolled by the lowering: layers that differ,
# by index or by sliding window, or no list of layers at all)
STACKED = {
    "llama": {"model.layers"},
    "mistral": {"model.layers"},
    "qwen2": {"model.layers"},
    "qwen3": {"model.layers"},
    "phi3": {"model.layers"},
    "gpt2": {"transformer.h"},
    "bert": {"encoder.layer"},
    "roberta": {"encoder.layer"},
    "whisper": {"model.encoder.layers", "model.decoder.layers"},
    "vit": {"vit.encoder.layer"},
    "dinov2": {"encoder.layer"},
}
# in the default run: a decoder, an encoder, a vision model and DINOv2's classless list; the rest (4-8 s each on the
# CPU) with `make test-all`
FAST = {"llama", "gpt2", "bert", "vit", "dinov2"}
SLOW = set(SHRUNK) - FAST
CASES = [pytest.param(f, marks=pytest.mark.slow) if f in SLOW else f for f in SHRUNK]


def _run_all(family: str, scan: bool) -> tuple[set[str], dict[str, tuple[np.ndarray, ...]]]:
    config, dims = SHRUNK[family]
    m = lj.load(
        source(family), preset=presets(family)[0], config=config, random_weights=True, seed=3, progress=False,
        max_positions=32, scan_layers=scan,
    )  # fmt: skip
    stacked = {k.partition(".*.")[0] for k in m.params if ".*." in k}
    outs = {}
    for name, graph in m.prepared.program.entries.items():
        m.reset_state()
        outs[name] = m.run(name, *random_inputs(graph, {**DIMS, **dims}, seed=5, vocab_size=32))
    return stacked, outs


@pytest.mark.parametrize("family", CASES)
def test_scanned_layers_give_what_unrolled_layers_give(family):
    unrolled_lists, unrolled = _run_all(family, scan=False)
    scanned_lists, scanned = _run_all(family, scan=True)
    assert unrolled_lists == set()
    assert scanned_lists == STACKED.get(family, set())
    assert list(scanned) == list(unrolled)
    for name in unrolled:
        for a, b in zip(scanned[name], unrolled[name], strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=ATOL, err_msg=f"{family} {name}")


def test_the_standalone_module_scans_a_list_without_a_class():
    """`linnet jax` output (the prelude's definitions carried in the file) over DINOv2's layers stacked by its own
    `stack_layers`: the classless `encoder.layer` scanned gives what the plain loop over arrays by name gives."""
    from linnet.compiler.jax.codegen import generate

    config, dims = SHRUNK["dinov2"]
    m = lj.load(source("dinov2"), config=config, random_weights=True, progress=False, scan_layers=False)
    namespace: dict = {}
    exec(compile(generate(m.prepared.program, standalone=True), "standalone", "exec"), namespace)
    assert namespace["STACKED_LISTS"] == {"encoder.layer": 2}
    (x,) = random_inputs(m.prepared.program.entries["forward"], {**DIMS, **dims}, seed=5)
    plain = namespace["forward"](dict(m.params), x)
    scanned = namespace["forward"](namespace["stack_layers"](dict(m.params)), x)
    np.testing.assert_allclose(np.asarray(scanned), np.asarray(plain), rtol=0, atol=ATOL)
