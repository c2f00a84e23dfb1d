"""The cost model against independent references: transformers' parameter count of every zoo preset (meta
device, tied weights once), the KV-cache bytes the PyTorch backend allocates and transformers' DynamicCache holds,
and the FLOPs torch.utils.flop_counter counts on the generated PyTorch module."""

from __future__ import annotations

import functools

import pytest

from linnet.ir import build
from linnet.ir.build import check_source, lower_program, preset_config, read_source
from linnet.ir.cost import program_cost
from linnet.semantics.program import Document
from tests.conftest import EXAMPLES
from tests.ir.test_ir import SMALL_LLAMA

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.torch

# transformers' class of each zoo file's root model where it is not AutoModelForCausalLM, with its arguments
ENCODERS = {
    "bert": ("BertModel", {}),
    "roberta": ("RobertaModel", {"add_pooling_layer": False}),
    "modernbert": ("ModernBertModel", {}),
    "vit": ("ViTForImageClassification", {}),
    "dinov2": ("Dinov2Model", {}),
    "resnet": ("ResNetForImageClassification", {}),
}
# Families whose checkpoints hold other names than transformers 5's modules (it renames them when it loads and back
# when it saves): their parameters are compared under the saved names.
SAVED_NAMES = {"vit", "dinov2"}
# Families with BatchNorm: the sources declare its running statistics as parameters (checkpoint tensors), transformers
# holds them as buffers; they are compared as saved tensors and counted with the parameters.
BATCH_NORM = {"resnet"}

# diffusers models (their files are named by class, not by a transformers model_type)
DIFFUSERS = {"autoencoder_kl", "unet_2d_condition"}
# Families whose config transformers cannot build from the preset's flat values (nested text/vision/prompt-encoder
# records: SigLIP, SAM; `mlp_ratio` as the float the checkpoints write: DINOv2) or whose reference is no causal LM
# (Whisper's encoder-decoder): tests/runtimes/test_parity_<stem>.py holds their names, shapes and counts equal to
# the reference's on the meta device.
OWN_COUNT_TESTS = {"dinov2", "siglip", "sam", "whisper"}


def zoo_presets() -> list[tuple[str, str]]:
    out = []
    for path in sorted(EXAMPLES.glob("*.linnet")):
        if path.stem == "mlp":  # its `tiny` preset is no published model
            continue
        if path.stem in DIFFUSERS:  # no transformers class: tests/runtimes/test_parity_<stem>.py counts on diffusers'
            continue
        if path.stem in OWN_COUNT_TESTS:
            continue
        analysis = Document(str(path), path.read_text(encoding="utf-8")).analyze()
        out += [(path.stem, preset) for preset in analysis.presets]
    return out


@pytest.mark.slow
@pytest.mark.parametrize(("model_type", "preset"), zoo_presets())
def test_parameter_count_is_transformers(model_type, preset):
    """Every zoo preset: the config transformers builds from the preset's values (field names are Hugging
    Face's), the model on the meta device; the same names and shapes and `num_parameters()`."""
    path, text = read_source(EXAMPLES / f"{model_type}.linnet")
    info = check_source(path, text, preset)
    # an empty `layer_types` is the sources' spelling of transformers' None: the config fills it in
    values = {key: value for key, value in preset_config(info, preset).items() if value != []}
    config = transformers.AutoConfig.for_model(model_type, **values)
    with torch.device("meta"):
        if model_type in ENCODERS:
            name, kwargs = ENCODERS[model_type]
            ref = getattr(transformers, name)(config, **kwargs)
        else:
            ref = transformers.AutoModelForCausalLM.from_config(config)
    program = lower_program(info)
    theirs = dict(ref.named_parameters())
    if model_type in SAVED_NAMES:
        from transformers.core_model_loading import revert_weight_conversion

        theirs = revert_weight_conversion(ref, theirs)
    shapes = {n: tuple(p.shape) for n, p in theirs.items()}
    buffers = 0
    if model_type in BATCH_NORM:
        from tests.runtimes.zoo_vision import saved_tensors

        shapes = saved_tensors(ref)
        buffers = sum(b.numel() for n, b in ref.named_buffers() if not n.endswith("num_batches_tracked"))
    assert {p.path: p.shape for p in program.params} == shapes
    assert program_cost(program).param_count == ref.num_parameters() + buffers


@functools.cache
def small_model(max_batch: int, max_positions: int):
    import linnet.torch as lt

    return lt.load(
        EXAMPLES / "llama.linnet",
        config=SMALL_LLAMA,
        random_weights=True,
        max_batch=max_batch,
        max_positions=max_positions,
        progress=False,
    )


@pytest.mark.parametrize(("max_batch", "max_positions"), [(1, 16), (3, 40)])
def test_kv_cache_is_what_the_torch_backend_allocates(max_batch, max_positions):
    model = small_model(max_batch, max_positions)
    program = model.module.program
    allocated = sum(model.module.tensors[s.path].nbytes for s in program.state)
    cost = program_cost(program)
    assert cost.kv_bytes == allocated
    assert cost.kv_bytes_per_token * max_batch * max_positions == allocated


def test_kv_cache_per_token_is_what_a_dynamic_cache_holds():
    """transformers' LlamaForCausalLM of the same config after N tokens holds N positions of keys and values."""
    config = transformers.LlamaConfig(**SMALL_LLAMA)
    ref = transformers.LlamaForCausalLM(config).eval()
    n = 7
    with torch.no_grad():
        cache = ref(torch.arange(n)[None], use_cache=True).past_key_values
    held = sum(layer.keys.nbytes + layer.values.nbytes for layer in cache.layers)
    assert held == n * program_cost(build(EXAMPLES / "llama.linnet", config=SMALL_LLAMA)).kv_bytes_per_token


def counted_flops(fn, *args) -> int:
    from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

    # PyTorch's counter knows the CUDA fused attentions, not the CPU one the generated prefill and forward call:
    # counted by the same formula (its two matmuls, every query head over every key)
    def sdpa_flops(query, key, value, *args, out_shape=None, **kwargs) -> int:
        return sdpa_flop_count(query, key, value)

    cpu_attention = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: sdpa_flops}
    with torch.no_grad():  # once uncounted: a first call of each kind probes its kernels (`prelude._same_bits`)
        fn(*args)
    with FlopCounterMode(display=False, custom_mapping=cpu_attention) as counter, torch.no_grad():
        fn(*args)
    return counter.get_total_flops()


@pytest.mark.parametrize("seq_len", [1, 6])
def test_flops_are_what_torch_counts(seq_len):
    """forward at S, step as a prefill of S tokens and as a decode step: FlopCounterMode on the generated module
    (mm, addmm, bmm: 2 x multiply-adds, elementwise ops not counted) sees the same FLOPs as the Core IR. The step
    writes the cache's last positions: the IR attends over every cache position, and PyTorch drops the keys after
    the last one written (`trim_keys`), which then are none."""
    max_positions = 24
    model = small_model(2, max_positions)
    cost = program_cost(model.module.program, seq_len=seq_len, batch=2)
    ids = torch.randint(0, SMALL_LLAMA["vocab_size"], (2, seq_len))
    entries = {(e.entry, e.seq_len): e.flops for e in cost.entries}
    assert counted_flops(model.native.forward, ids) == entries["forward", seq_len]
    rows, positions = torch.tensor([0, 1]), torch.tensor([max_positions - seq_len] * 2)
    assert counted_flops(model.native.step, ids, positions, rows) == entries["step", seq_len]
    if seq_len != 1:
        last = torch.tensor([max_positions - 1] * 2)  # a decode step at the cache's last position reads it all
        assert counted_flops(model.native.step, ids[:, :1], last, rows) == entries["step", 1]


def measured_peak_bytes(module, fn, *args) -> int:
    """The most bytes of tensor storage that ops allocate and hold at once while `fn` runs (storages of the
    module's parameters, cache and the arguments excluded; views allocate nothing), tracked at the dispatcher."""
    import weakref

    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    held = {t.untyped_storage().data_ptr() for t in [*module.tensors.values(), *args]}
    state = {"live": 0, "peak": 0}

    def free(key: int, nbytes: int) -> None:
        held.discard(key)
        state["live"] -= nbytes

    class Track(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor) and (key := t.untyped_storage().data_ptr()) not in held:
                    held.add(key)
                    nbytes = t.untyped_storage().nbytes()
                    state["live"] += nbytes
                    state["peak"] = max(state["peak"], state["live"])
                    weakref.finalize(t, free, key, nbytes)
            return out

    with torch.no_grad(), Track():
        fn(*args)
    return state["peak"]


def test_peak_activations_bound_what_pytorch_holds():
    """The estimate counts each IR value as its own buffer, alive until its last use, and composites by their
    bodies (attention repeats the keys and values per query head and holds the scores; the backend's fused
    attention does neither), so it bounds what the generated module holds: never below, and for `forward` within
    2x."""
    model = small_model(2, 24)
    costs = {(e.entry, e.seq_len): e.peak_activation_bytes for e in program_cost(model.module.program, 16).entries}
    ids = torch.randint(0, SMALL_LLAMA["vocab_size"], (2, 16))
    forward = measured_peak_bytes(model.module, model.native.forward, ids)
    assert forward <= costs["forward", 16] <= 2 * forward
    rows, positions = torch.tensor([0, 1]), torch.tensor([8, 8])
    assert measured_peak_bytes(model.module, model.native.step, ids[:, :1], positions, rows) <= costs["step", 1]


CONV_MODEL = """config C { channels: int = 6 }
model M(c: C) {
    stem: Conv2d(4, c.channels, 3, stride=2, padding=1, groups=2)
    depthwise: Conv2d(c.channels, c.channels, 3, padding=2, dilation=2, groups=c.channels, use_bias=false)
    up: [c.channels, 2, 2, 2]
    entry fn forward(x: [2, 4, 9, 8]) -> [2, 4, 11, 7] {
        conv_transpose2d(depthwise(stem(x)), up, stride=2, padding=[0, 1], output_padding=1, groups=2)
    }
}
"""


def test_convolution_flops_are_what_torch_counts():
    """conv2d (grouped, strided, depthwise and dilated) and conv_transpose2d: FlopCounterMode on the
    generated module counts 2 x multiply-adds per convolution as the Core IR's cost does."""
    from tests.compiler.test_composites import Runner, passes, random_params

    program = build(CONV_MODEL)
    runner = Runner("torch", program, passes("torch"), "equivalent", random_params(program))
    (cost,) = program_cost(program, batch=2).entries
    assert counted_flops(runner.model.forward, torch.randn(2, 4, 9, 8)) == cost.flops > 0
