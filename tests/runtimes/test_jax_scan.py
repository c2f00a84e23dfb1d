"""A decoder's layers run as one `lax.scan` over their parameters and KV caches stacked at load
(`linnet.compiler.jax.scan`, `load(scan_layers=...)`), against the same model with the layers unrolled, as before.

Tolerance: the scanned layer is one XLA computation inside a while loop, which XLA fuses on its own, so a value may
differ from the unrolled program's in its last bits. `forward` (no cache) measured bit for bit equal; the cached
`step` ~4e-7 in f32 logits of ~0.3 (Llama, 2 layers, the CPU). The tests allow 1e-5 in f32 (the conformance
suite's ATOL against torch-interpret) and require the greedy tokens to be the same.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from tests.conftest import EXAMPLES
from tests.runtimes.conftest import LLAMA

jax = pytest.importorskip("jax")
pytestmark = pytest.mark.jax

import linnet.jax as lj  # noqa: E402
from linnet.compiler.jax.module import compile_program, export_entry  # noqa: E402
from linnet.compiler.jax.scan import stacked_lists  # noqa: E402
from linnet.runtimes.generation import Generator  # noqa: E402
from linnet.runtimes.loading import LoadOptions, prepare  # noqa: E402
from linnet.runtimes.model_weights import model_weights  # noqa: E402
from linnet.runtimes.sampling import SamplingParams  # noqa: E402

SMALL = {
    "vocab_size": 96, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 3,
    "num_attention_heads": 8, "num_key_value_heads": 2,
}  # fmt: skip
ATOL = 1e-5
PROMPT = [5, 17, 3, 42, 8, 11, 60, 2, 9]


def load(mode: str, scan: bool, **options):
    opts = {"max_positions": 64, "max_batch": 2, "random_weights": True, "seed": 4, "progress": False, **options}
    return lj.load(LLAMA, config=SMALL, mode=mode, scan_layers=scan, **opts)


@pytest.fixture(scope="module", params=["generated", "stablehlo"])
def pair(request):
    return load(request.param, False), load(request.param, True)


def test_the_layers_are_held_stacked_once_at_load(pair):
    unrolled, scanned = pair
    assert "model.layers.0.mlp.down_proj.weight" in unrolled.params
    assert not any(".layers.0." in k for k in scanned.params)
    stacked = scanned.params["model.layers.*.mlp.down_proj.weight"]
    assert stacked.shape == (3, 64, 128)
    np.testing.assert_array_equal(
        np.asarray(stacked[1]), np.asarray(unrolled.params["model.layers.1.mlp.down_proj.weight"])
    )
    fused = scanned.params["model.layers.*.self_attn.{q,k,v}_proj.weight"]
    assert fused.shape == (3, 64 + 2 * 16, 64)  # the fused q, k, v rows of each layer, stacked
    assert {k for k in scanned.state} == {"model.layers.*.self_attn.k_cache", "model.layers.*.self_attn.v_cache"}
    assert scanned.state["model.layers.*.self_attn.k_cache"].shape[0] == 3


def test_scanned_logits_equal_the_unrolled_ones(pair):
    unrolled, scanned = pair
    ids = np.array([PROMPT, PROMPT[::-1]], dtype=np.int64)
    np.testing.assert_allclose(scanned.forward(ids), unrolled.forward(ids), rtol=0, atol=ATOL)
    rows = np.array([1, 0], dtype=np.int64)
    for m in (unrolled, scanned):
        m.reset_state()
    a, b = (m.step_model(decode_loop=False) for m in pair)
    zero = np.zeros(2, np.int64)
    np.testing.assert_allclose(b.step(ids, zero, rows), a.step(ids, zero, rows), rtol=0, atol=ATOL)
    nxt = np.array([[7], [1]], dtype=np.int64)
    at = np.full(2, len(PROMPT), np.int64)
    np.testing.assert_allclose(b.step(nxt, at, rows), a.step(nxt, at, rows), rtol=0, atol=ATOL)


@pytest.mark.parametrize("decode_loop", [False, True])
def test_greedy_tokens_are_the_same(pair, decode_loop):
    params = SamplingParams(max_new_tokens=40)
    tokens = [Generator(m.step_model(decode_loop=decode_loop), None).generate(PROMPT, params).token_ids for m in pair]
    assert tokens[0] == tokens[1]


def test_exports_read_the_layers_unstacked(pair):
    unrolled, scanned = pair
    a, b = model_weights(unrolled), model_weights(scanned)
    assert list(a) == list(b)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def _while_and_dots(layers: int, scan: bool) -> tuple[int, int]:
    """(while loops, dot_generals) in the StableHLO of `step` of Llama with `layers` layers."""
    options = LoadOptions(config={**SMALL, "num_hidden_layers": layers}, random_weights=True, max_positions=64)
    program = prepare(LLAMA, None, options).program
    text = export_entry(compile_program(program, scan_layers=scan), "step").mlir_module()
    return len(re.findall(r"stablehlo\.while", text)), len(re.findall(r"stablehlo\.dot_general", text))


def test_the_stablehlo_holds_one_layer_in_a_while_loop():
    """Scanned, the exported step holds the layer's dots once, whatever the number of layers, in one more while loop
    (the scan; the others are the prelude's cache writes'); unrolled, it holds them once per layer."""
    whiles_2, dots_2 = _while_and_dots(2, scan=True)
    assert _while_and_dots(5, scan=True) == (whiles_2, dots_2)
    unrolled_whiles, unrolled_dots = _while_and_dots(5, scan=False)
    assert unrolled_dots > dots_2
    layer_dots = (unrolled_dots - dots_2) // 4  # a layer's dots: 5 unrolled layers less the 1 scanned layer
    assert unrolled_dots == dots_2 + 4 * layer_dots and layer_dots >= 4
    assert whiles_2 < unrolled_whiles


STACK_SOURCE = """
config C {
    width: int = 8
}

module Block(c: C) {
    fc: Linear(c.width, c.width)

    fn forward(x: [B, c.width]) -> [B, c.width] {
        x + fc(x)
    }
}

model Net(c: C) {
    blocks: [Block(c); 3]
    others: [Block(c); 3]

    entry fn forward(x: [B, c.width]) -> [B, c.width] {
        let h = x
        for block in blocks {
            h = block(h)
        }
        for block in others {
            h = block(h)
        }
        others[0](h)
    }
}
"""


def test_only_lists_every_reference_of_which_is_a_loop_are_stacked(tmp_path):
    def lists(file, config: dict | None = None) -> dict[str, int]:
        return stacked_lists(prepare(file, None, LoadOptions(config=config, random_weights=True)).program)

    assert lists(LLAMA, SMALL) == {"model.layers": 3}
    gpt2 = {"vocab_size": 64, "n_positions": 32, "n_embd": 32, "n_layer": 2, "n_head": 4}
    assert lists(EXAMPLES / "gpt2.linnet", gpt2) == {"transformer.h": 2}
    (tmp_path / "net.linnet").write_text(STACK_SOURCE)
    assert lists(tmp_path / "net.linnet") == {"blocks": 3}  # `others[0]` reads an item by index: unrolled


def test_training_and_sharding_layouts_keep_the_layers_by_name():
    """`fuse_linear_weights=False` (what the JAX trainer and the mesh load with) holds every weight by checkpoint
    name, unstacked, unless scanning is asked for."""
    m = lj.load(LLAMA, config=SMALL, fuse_linear_weights=False, random_weights=True, progress=False, max_positions=32)
    assert "model.layers.2.self_attn.q_proj.weight" in m.params


def test_sharding_and_training_refuse_stacked_layers_by_name():
    """Asked to scan in the per-name layout, tensor parallelism and the JAX trainer say what to load instead (their
    plans and adapters name each layer's weights; auto unrolls them there), not a KeyError from deep inside."""
    from linnet.errors import BackendError, TrainError
    from linnet.runtimes.parallel.jax_mesh import make_mesh, shard_model
    from linnet.runtimes.train.jax_trainer import JaxPolicy

    m = lj.load(
        LLAMA, config=SMALL, fuse_linear_weights=False, scan_layers=True, random_weights=True, progress=False,
        max_positions=32,
    )  # fmt: skip
    with pytest.raises(BackendError, match=r"loaded with scan_layers=False \(it holds `model\.layers\.\*\."):
        shard_model(m, make_mesh(jax.devices()[:1]))
    with pytest.raises(TrainError, match="loaded with scan_layers=False"):
        JaxPolicy(m, ["model.layers.0.self_attn.q_proj.weight"])


def test_a_scanned_artifact_binds_its_stacked_layers_from_checkpoint_names(tmp_path):
    """A step exported from a scanned model takes the layers stacked; `load_exported` stacks them from a checkpoint
    (or a dict) by checkpoint name, fused weights made from their members first, and runs as the model does. An item
    of the wrong shape is named."""
    import json

    from safetensors.numpy import save_file

    from linnet.errors import LoadError
    from linnet.runtimes.backends.jax_backend import save_exported

    m = load("stablehlo", True, max_batch=1)
    tensors = model_weights(m)
    save_file(tensors, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", **SMALL}))
    ids, pos = np.array([PROMPT]), np.array([0])
    want = np.asarray(m.step(ids, pos, pos))
    save_exported(m.exported["step"], tmp_path / "step.bin", {"entry": "step", "max_batch": 1, "max_positions": 64})
    for kw in ({"weights": tmp_path}, {"params": tensors}):
        e = lj.load_exported(tmp_path / "step.bin", **kw)
        assert e.params["model.layers.*.self_attn.{q,k,v}_proj.weight"].shape[0] == 3
        np.testing.assert_array_equal(np.asarray(e.step(ids, pos, pos)), want)
    wrong = {**tensors, "model.layers.2.post_attention_layernorm.weight": np.ones(63, np.float32)}
    with pytest.raises(LoadError, match=r"`model\.layers\.2\.post_attention_layernorm\.weight` is \[63\]"):
        lj.load_exported(tmp_path / "step.bin", params=wrong)


def test_the_standalone_module_scans_what_stack_layers_stacks(pair):
    """`linnet jax` output: `step(p, ...)` over `stack_layers({**params, **state})` (one scan) gives what the loaded
    model gives, and over the arrays by checkpoint name (a plain loop) too."""
    from linnet.compiler.jax.codegen import generate

    unrolled, _ = pair
    namespace: dict = {}
    exec(compile(generate(unrolled.prepared.program, standalone=True), "standalone", "exec"), namespace)
    assert "STACKED_LISTS" in namespace and "import linnet" not in generate(unrolled.prepared.program, standalone=True)
    ids, zero = np.array([PROMPT]), np.zeros(1, np.int64)
    state = {k: jax.numpy.zeros_like(v) for k, v in unrolled.state.items()}
    by_name = {**unrolled.params, **state}
    with jax.enable_x64(True):  # the module's i64, which Linnet's own calls scope (docs/backends.md, "JAX's config")
        plain, _ = namespace["step"](by_name, ids, zero, zero)
        scanned, new_state = namespace["step"](namespace["stack_layers"](by_name), ids, zero, zero)
    assert "model.layers.*.self_attn.k_cache" in new_state
    np.testing.assert_allclose(np.asarray(scanned), np.asarray(plain), rtol=0, atol=ATOL)
    unrolled.reset_state()
    want = unrolled.step_model(decode_loop=False).step(ids, zero, zero)
    np.testing.assert_allclose(np.asarray(plain)[:, :], want, rtol=0, atol=ATOL)


def test_auto_scans_on_the_cpu_unrolls_by_name_and_the_environment_turns_it_off(monkeypatch):
    """`scan_layers=None` (auto, `scans_layers`): scanned on the CPU, on an accelerator as `SCAN_ON_ACCELERATORS`
    says, never in the per-name layout (the trainer's and tensor parallelism's: they unroll); `LINNET_SCAN_LAYERS`
    overrides auto (not an explicit value), and another value of it is a clear error."""
    from linnet.errors import BackendError
    from linnet.runtimes.backends.jax_backend import SCAN_LAYERS_ENV, scans_layers

    monkeypatch.delenv(SCAN_LAYERS_ENV, raising=False)
    assert scans_layers(None, "cpu") and not scans_layers(None, "cpu", fuse_linear_weights=False)
    assert scans_layers(None, "tpu") and scans_layers(None, "gpu")  # SCAN_ON_ACCELERATORS, after the chip's numbers
    # --dtype stored's pairs through the kernels: unrolled on an accelerator (scanned, the chip's decode was 21 % of
    # streaming), scanned on the CPU (XLA's dot)
    assert not scans_layers(None, "tpu", stored=True) and scans_layers(None, "cpu", stored=True)
    assert scans_layers(True, "tpu", stored=True)
    monkeypatch.setenv(SCAN_LAYERS_ENV, "0")
    assert not scans_layers(None, "cpu") and not scans_layers(None, "tpu") and scans_layers(True, "cpu")
    m = lj.load(LLAMA, config=SMALL, random_weights=True, progress=False, max_positions=32)
    assert "model.layers.0.mlp.down_proj.weight" in m.params  # the environment turned the CPU's default off
    monkeypatch.setenv(SCAN_LAYERS_ENV, "1")
    assert scans_layers(None, "tpu") and not scans_layers(None, "cpu", fuse_linear_weights=False)
    assert scans_layers(None, "tpu", stored=True)
    monkeypatch.setenv(SCAN_LAYERS_ENV, "maybe")
    with pytest.raises(BackendError, match="LINNET_SCAN_LAYERS must be 0 or 1 \\(off or on\\), got 'maybe'"):
        scans_layers(None, "cpu")
    m = lj.load(LLAMA, config=SMALL, random_weights=True, progress=False, max_positions=32, scan_layers=False)
    assert "model.layers.0.mlp.down_proj.weight" in m.params  # an explicit value does not read the variable


def test_the_cpu_scans_by_default():
    m = lj.load(LLAMA, config=SMALL, random_weights=True, progress=False, max_positions=32)
    assert "model.layers.*.mlp.down_proj.weight" in m.params


@pytest.mark.parametrize("command, device, env, want", [
    ("serve", "tpu", None, False),  # a server's steps unrolled on an accelerator: ~8 % faster a 32-row step there
    ("serve", "tpu", "1", None),  # LINNET_SCAN_LAYERS says otherwise: auto, which reads it
    ("serve", "tpu", "", False),  # set but empty says nothing (auto reads it as unset): unrolled, not scanned
    ("serve", "cpu", None, None),  # the CPU: auto (scanned)
    ("generate", "tpu", None, None),  # a generation: auto (scanned on a TPU too)
    ("serve ray", "tpu", None, False),  # a Ray Serve replica loads as `linnet serve` does
])  # fmt: skip
def test_serve_on_an_accelerator_asks_for_the_layers_unrolled(monkeypatch, command, device, env, want):
    """`linnet serve --device tpu` loads the JAX backends' layers unrolled (`load_model(..., throughput=True)`),
    other commands leave `scan_layers` to auto; the option reaches the backend's `load`."""
    import argparse

    from linnet.cli.common import load_model
    from linnet.runtimes.backends import BACKENDS
    from linnet.runtimes.backends.jax_backend import SCAN_LAYERS_ENV

    monkeypatch.delenv(SCAN_LAYERS_ENV, raising=False)
    if env is not None:
        monkeypatch.setenv(SCAN_LAYERS_ENV, env)
    seen = {}
    backend = type(BACKENDS["xla"])  # a frozen dataclass: its methods patched on the class
    monkeypatch.setattr(backend, "setup_process", lambda self, device: "")
    monkeypatch.setattr(backend, "load", lambda self, *a, **kw: seen.update(kw))
    args = argparse.Namespace(
        file=str(LLAMA), weights=None, preset=None, config=[], dtype="f32", numerics="equivalent", device=device,
        max_batch=1, max_positions=32, provider=None, backend="xla", tensor_parallel=False,
    )  # fmt: skip
    monkeypatch.setattr("linnet.cli.common.check_paths", lambda args: None)
    if command == "serve ray":
        from linnet.cli import serve_ray

        monkeypatch.setattr(serve_ray, "build_app", lambda args, model: (None, None, ""))
        monkeypatch.setattr(serve_ray, "print_notes", lambda model: None)
        serve_ray.replica_app(args)
    else:
        load_model(args, random_weights=True, throughput=command == "serve")
    assert seen.get("scan_layers") is want
