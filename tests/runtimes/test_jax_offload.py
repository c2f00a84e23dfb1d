"""Layers held in host memory and streamed to the device each step (`cpu_offload_gb`, `--cpu-offload-gb`;
linnet/runtimes/backends/jax_offload.py), against the same model with every layer on the device: a tiny Llama
whose last layers are offloaded by a cap smaller than its layers.

Tolerance: none. The offloaded model runs the same generated code on the same parameters, cut into programs at the
layer loop; on the CPU XLA computes each op the same whether the program is whole or cut (measured: equal bit for
bit, f32 and bf16, `forward` and `step`), so the tests require equal logits and equal greedy tokens.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.cli.test_backends import run_cli
from tests.runtimes.conftest import LLAMA

jax = pytest.importorskip("jax")
pytestmark = pytest.mark.jax

import linnet.jax as lj  # noqa: E402
from linnet.errors import BackendError  # noqa: E402
from linnet.runtimes.backends.jax_offload import GIB, plan_offload  # noqa: E402
from linnet.runtimes.generation import Generator  # noqa: E402
from linnet.runtimes.loading import LoadOptions, prepare, random_params  # noqa: E402
from linnet.runtimes.sampling import SamplingParams  # noqa: E402

SMALL = {
    "vocab_size": 96, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
    "num_attention_heads": 8, "num_key_value_heads": 2,
}  # fmt: skip
# one layer of SMALL: q, k, v, o (64 x 64, 2 x 16 x 64, 64 x 64), gate, up, down (3 x 64 x 128), in f32 (a bf16
# model's matrices too, as the CPU holds them: jax_backend's docstring), and two norms of 64 in the working dtype
MATRIX_BYTES = 4 * (64 * 64 + 2 * 16 * 64 + 64 * 64 + 3 * 64 * 128)
LAYER_BYTES = {"f32": MATRIX_BYTES + 2 * 64 * 4, "bf16": MATRIX_BYTES + 2 * 64 * 2}
THREE_LAYERS_GB = 2.5 * LAYER_BYTES["f32"] / GIB  # rounds up to three layers in either dtype
PROMPT = [5, 17, 3, 42, 8, 11, 60, 2, 9]


def load(dtype: str = "f32", mode: str = "generated", **options):
    """SMALL's Llama; the resident one (no `cpu_offload_gb`) with its layers unrolled, as the offloaded one runs them
    (the CPU scans them by default: the same values up to ~4e-7, tests/runtimes/test_jax_scan.py)."""
    opts = {"max_positions": 64, "max_batch": 2, "random_weights": True, "seed": 4, "progress": False}
    if "cpu_offload_gb" not in options:
        opts["scan_layers"] = False
    return lj.load(LLAMA, config=SMALL, dtype=dtype, mode=mode, **opts | options)


# the jax backend (generated JAX under jit) and xla (the three programs exported with symbolic dims); two of the four
# in the slow set (`make test-all`): each backend and each dtype stays in the default run
@pytest.fixture(
    scope="module",
    params=[
        ("generated", "f32"),
        pytest.param(("generated", "bf16"), marks=pytest.mark.slow),
        pytest.param(("stablehlo", "f32"), marks=pytest.mark.slow),
        ("stablehlo", "bf16"),
    ],
)
def pair(request):
    mode, dtype = request.param
    return load(dtype, mode), load(dtype, mode, cpu_offload_gb=THREE_LAYERS_GB)


def test_the_last_layers_are_held_in_host_memory(pair):
    resident, offloaded = pair
    plan = offloaded.offload
    assert (plan.list_path, plan.count, plan.resident) == ("model.layers", 4, 1)
    layer_bytes = LAYER_BYTES[offloaded.prepared.program.dtype.name]
    assert plan.layer_bytes == layer_bytes and plan.offloaded_bytes == 3 * layer_bytes
    kinds = {k: v.sharding.memory_kind for k, v in offloaded.params.items()}
    assert kinds["model.layers.0.mlp.down_proj.weight"] == "device"
    assert kinds["model.embed_tokens.weight"] == "device"
    for i in (1, 2, 3):
        assert kinds[f"model.layers.{i}.mlp.down_proj.weight"] == "pinned_host"
        assert kinds[f"model.layers.{i}.self_attn.{{q,k,v}}_proj.weight"] == "pinned_host"
    assert all(v.sharding.memory_kind == "device" for v in offloaded.state.values())  # KV caches stay
    assert set(offloaded.state) == set(resident.state)
    assert any("cpu offload: layers 1..3 of `model.layers` (3 of 4" in n for n in offloaded.notes)


def test_forward_logits_equal_the_resident_models(pair):
    resident, offloaded = pair
    ids = np.random.default_rng(0).integers(0, 96, (2, 12))
    np.testing.assert_array_equal(offloaded.forward(ids), resident.forward(ids))


def test_prefill_and_decode_logits_equal_the_resident_models(pair):
    ids = np.asarray([PROMPT])
    got = []
    for model in pair:
        steps = model.step_model()
        prefill = steps.step(ids, np.array([0]), np.array([1]))
        decode = steps.step(np.array([[7], [30]]), np.array([len(PROMPT), 0]), np.array([1, 0]))
        got.append((prefill, decode, {k: np.asarray(v) for k, v in model.state.items()}))
    (p0, d0, s0), (p1, d1, s1) = got
    np.testing.assert_array_equal(p1, p0)
    np.testing.assert_array_equal(d1, d0)
    for key in s0:  # every cache, the offloaded layers' too, written as the resident model writes it
        np.testing.assert_array_equal(s1[key], s0[key], err_msg=key)


def test_greedy_tokens_equal_the_resident_models(pair):
    params = SamplingParams(max_new_tokens=12)
    tokens = [Generator(m.step_model(), None).generate(PROMPT, params).token_ids for m in pair]
    assert tokens[0] == tokens[1] and len(tokens[0]) == 12


def test_each_layer_is_put_before_the_one_before_it_runs_and_two_at_most_are_on_the_device(pair):
    # The overlap: layer i + 1's transfer is issued before layer i's program, and layer i + 2's only once the driver
    # has waited for layer i's program (its weights then freed), so at most two offloaded layers are on the device.
    _, offloaded = pair
    entry = offloaded.functions["forward"]
    events, live = [], []
    put, wait = entry._put, entry._wait

    def recording_put(host):
        events.append("put")
        live.append(len(events))
        assert len(live) <= 2, events
        return put(host)

    def recording_wait(carry):
        events.append("wait")
        live.pop(0)  # the layer that ran: done, its weights freed
        return wait(carry)

    entry._put, entry._wait = recording_put, recording_wait
    try:
        offloaded.forward(np.asarray([PROMPT]))
    finally:
        del entry._put, entry._wait  # the methods again
    # layers 1, 2, 3 offloaded: 1 and 2 put before 1 runs, 3 once 1 is done; no wait after the last
    assert events == ["put", "put", "wait", "put", "wait"]


def test_nothing_asked_offloads_nothing_and_too_much_offloads_every_layer():
    program = prepare(LLAMA, None, LoadOptions(config=SMALL, random_weights=True)).program
    specs = {k: jax.ShapeDtypeStruct(a.shape, a.dtype) for k, a in random_params(program).items()}
    assert plan_offload(specs, {"model.layers": 4}, 0).resident == 4
    assert plan_offload(specs, {"model.layers": 4}, 1000).resident == 0
    with pytest.raises(BackendError, match="loop over none"):
        plan_offload(specs, {}, 1)


def test_zero_gib_loads_the_resident_model():
    assert load(cpu_offload_gb=0).offload is None


def test_offload_unrolls_the_layers_the_cpu_would_scan():
    model = load(cpu_offload_gb=THREE_LAYERS_GB)  # scan_layers left to its default, which scans on the CPU
    assert "model.layers.0.mlp.down_proj.weight" in model.params and not any(".*." in k for k in model.params)


def test_offload_with_scanned_layers_is_refused():
    with pytest.raises(BackendError, match="not built for scan_layers"):
        load(cpu_offload_gb=THREE_LAYERS_GB, scan_layers=True)


def test_the_variable_asking_for_scanned_layers_is_refused_as_scan_layers_is(monkeypatch):
    """`LINNET_SCAN_LAYERS=1` (scan, docs/backends.md) under offload was ignored without a word, the layers unrolled,
    and any other value ("maybe", refused everywhere else) passed unread; `0` asks for what offload does."""
    from linnet.runtimes.backends.jax_backend import SCAN_LAYERS_ENV

    monkeypatch.setenv(SCAN_LAYERS_ENV, "1")
    with pytest.raises(BackendError, match=f"not built for scan_layers .*{SCAN_LAYERS_ENV}=1"):
        load(cpu_offload_gb=THREE_LAYERS_GB)
    monkeypatch.setenv(SCAN_LAYERS_ENV, "maybe")
    with pytest.raises(BackendError, match=f"{SCAN_LAYERS_ENV} must be 0 or 1"):
        load(cpu_offload_gb=THREE_LAYERS_GB)
    monkeypatch.setenv(SCAN_LAYERS_ENV, "0")
    assert load(cpu_offload_gb=THREE_LAYERS_GB).offload is not None


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A Hugging Face folder of SMALL's Llama with seeded random weights (numpy and safetensors; no tokenizer)."""
    from safetensors.numpy import save_file

    out = tmp_path_factory.mktemp("offload-llama")
    program = prepare(LLAMA, None, LoadOptions(config=SMALL, random_weights=True)).program
    save_file(random_params(program, seed=7), str(out / "model.safetensors"), metadata={"format": "pt"})
    config = {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], **SMALL, "max_position_embeddings": 128,
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False, "torch_dtype": "float32",
    }  # fmt: skip
    (out / "config.json").write_text(json.dumps(config))
    return out


@pytest.mark.parametrize("backend", ["jax", "xla"])
def test_generate_with_offloaded_layers_prints_the_resident_models_tokens(folder, backend):
    common = ["generate", str(LLAMA), "--weights", str(folder), "--backend", backend, "--print-ids"]
    common += ["--prompt-ids", ",".join(map(str, PROMPT)), "--max-new-tokens", "10", "--max-positions", "64"]
    resident = run_cli(*common)
    offloaded = run_cli(*common, "--cpu-offload-gb", f"{THREE_LAYERS_GB:.9f}")
    assert resident.returncode == 0 and offloaded.returncode == 0, resident.stderr + offloaded.stderr
    assert offloaded.stdout == resident.stdout and len(resident.stdout.split(",")) == 10
    assert "cpu offload: layers 1..3 of `model.layers`" in offloaded.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["--backend", "torch", "--cpu-offload-gb", "1"], "--cpu-offload-gb is an option of jax, xla, not of torch"),
        (["--backend", "jax", "--cpu-offload-gb", "-1"], "--cpu-offload-gb: takes a number of GiB >= 0"),
        (["--backend", "jax", "--cpu-offload-gb", "lots"], "--cpu-offload-gb: takes a number of GiB >= 0"),
    ],
)
def test_generate_refuses_offload_it_cannot_do_with_exit_2(folder, args, message):
    r = run_cli("generate", str(LLAMA), "--weights", str(folder), "--prompt-ids", "1,2", "--print-ids", *args)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr and "Traceback" not in r.stderr
