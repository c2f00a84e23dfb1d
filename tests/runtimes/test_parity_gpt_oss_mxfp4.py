"""MXFP4 checkpoints (linnet/runtimes/formats/mxfp4.py): GPT-OSS's experts stored as blocks and scales, as
openai/gpt-oss-20b ships.

The dequantization against transformers' own (`convert_moe_packed_tensors`, bit for bit, every code and scale); a
seeded small GPT-OSS whose experts are quantized with numpy and written as the release lays them out
(`*_blocks` u8[E, R, G, 16], `*_scales` u8[E, R, G], `quantization_config: {quant_method: "mxfp4"}`), loaded by
transformers (`Mxfp4Config(dequantize=True)`, its CPU path) and through the folder on every backend; what is refused
(another method, blocks without the config, a scale that overflows); and the real-size layout's headers."""

from __future__ import annotations

import json

import numpy as np
import pytest

from linnet.runtimes.backends import BACKENDS
from linnet.runtimes.formats.mxfp4 import FP4_VALUES, dequantize_mxfp4
from tests.runtimes.conftest import ALL_BACKENDS, GPT_OSS, LOGITS_ATOL, hf_greedy, linnet_greedy, max_abs_diff, record
from tests.runtimes.test_parity_gpt_oss import MAX_POSITIONS, REAL_CONFIGS, prompts, small_model

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_torch_thread")]

CHECKPOINT = "seeded 2-layer, experts 2 of 4 in MXFP4"
# openai/gpt-oss-20b's config.json quantization_config.
RELEASE_QUANTIZATION = {
    "modules_to_not_convert": [
        "model.layers.*.self_attn",
        "model.layers.*.mlp.router",
        "model.embed_tokens",
        "lm_head",
    ],
    "quant_method": "mxfp4",
}


def quantize_mxfp4(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(blocks u8[E, R, G, 16], scales u8[E, R, G]) of an expert weight w[E, G * 32, R]: each block of 32 inputs of
    an output row scaled by the power of two that brings its largest magnitude into [4, 8), each value rounded to the
    nearest FP4 magnitude (6 at most), the sign in bit 3, two codes a byte, the first in the low nibble."""
    e, n, r = w.shape
    rows = w.transpose(0, 2, 1).reshape(e, r, n // 32, 32)
    exponents = np.floor(np.log2(np.maximum(np.abs(rows).max(-1), 2.0**-100))).astype(np.int32) - 2
    scaled = rows / np.ldexp(1.0, exponents)[..., None]
    codes = np.abs(np.abs(scaled)[..., None] - FP4_VALUES[:8]).argmin(-1).astype(np.uint8)
    codes |= (scaled < 0).astype(np.uint8) << 3
    return (codes[..., 0::2] | codes[..., 1::2] << 4).astype(np.uint8), (exponents + 127).astype(np.uint8)


def is_expert_weight(name: str) -> bool:
    return name.endswith(("experts.gate_up_proj", "experts.down_proj"))


def write_mxfp4_folder(folder, model, quantization=RELEASE_QUANTIZATION, edit=None) -> None:
    """`model` saved as the release is: config.json with `quantization_config`, the expert weights as MXFP4 blocks
    and scales, every other tensor as it is (f32). `edit(tensors)` may change the tensors before they are written."""
    from safetensors.numpy import save_file

    model.config.save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    if quantization is not None:
        config["quantization_config"] = quantization
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    tensors = {}
    for name, value in model.state_dict().items():
        value = value.detach().numpy()
        if is_expert_weight(name):
            tensors[name + "_blocks"], tensors[name + "_scales"] = quantize_mxfp4(value)
        else:
            tensors[name] = np.ascontiguousarray(value)
    if edit is not None:
        edit(tensors)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})


@pytest.fixture(scope="module")
def mxfp4_gpt_oss(tmp_path_factory):
    """(folder, transformers model loaded from it, the unquantized original) of the seeded small GPT-OSS."""
    original = small_model()
    folder = tmp_path_factory.mktemp("gpt_oss_mxfp4")
    write_mxfp4_folder(folder, original)
    ref = transformers.GptOssForCausalLM.from_pretrained(
        folder, quantization_config=transformers.Mxfp4Config(dequantize=True), attn_implementation="eager"
    ).eval()
    return folder, ref, original


def load(backend: str, folder, **kwargs):
    if (why := BACKENDS[backend].unavailable("cpu")) is not None:
        pytest.skip(why)
    return BACKENDS[backend].load(GPT_OSS, weights=folder, max_batch=2, max_positions=MAX_POSITIONS, progress=False,
                                  **kwargs)  # fmt: skip


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_dequantize_is_transformers_bit_for_bit(dtype):
    """Every byte (both nibbles: all 16 codes) under scales from 2**-127 to 2**127, against transformers'
    `convert_moe_packed_tensors` in the same dtype: equal bit for bit, shape [E, G * 32, R]."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    rng = np.random.default_rng(0)
    blocks = rng.integers(0, 256, (3, 40, 4, 16), dtype=np.uint8)
    blocks[0, 0, :, :] = np.arange(256, dtype=np.uint8).reshape(16, 16)[:4]
    scales = rng.integers(0, 255, (3, 40, 4), dtype=np.uint8)
    torch_dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[dtype]
    theirs = convert_moe_packed_tensors(torch.from_numpy(blocks), torch.from_numpy(scales), dtype=torch_dtype)
    ours = dequantize_mxfp4(blocks, scales, dtype)
    assert ours.shape == tuple(theirs.shape) == (3, 4 * 32, 40)
    assert np.array_equal(ours.astype(np.float32), theirs.float().numpy())
    assert np.array_equal(np.signbit(ours.astype(np.float32)), np.signbit(theirs.float().numpy()))  # -0.0 kept


def test_dequantize_refuses_another_layout():
    with pytest.raises(ValueError, match=r"u8\[E, R, G, 16\]"):
        dequantize_mxfp4(np.zeros((2, 4, 1, 8), np.uint8), np.zeros((2, 4, 1), np.uint8))


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_logits_and_greedy_tokens(mxfp4_gpt_oss, backend):
    """The MXFP4 folder on every backend against transformers loading the same folder: logits at every position and
    32 greedy tokens; quantizing moved the logits far from the unquantized original, so the expert weights checked
    are the dequantized ones."""
    folder, ref, original = mxfp4_gpt_oss
    m = load(backend, folder)
    ids = prompts(2, 24, seed=3)
    (ours,) = m.run("forward", ids.numpy())
    with torch.inference_mode():
        theirs = ref(input_ids=ids).logits
        assert max_abs_diff(original(input_ids=ids).logits, theirs) > 100 * LOGITS_ATOL
    delta = max_abs_diff(ours, theirs)
    record(f"small GPT-OSS, MXFP4 experts ({backend}) logits [2, 24, 256], every position", delta,
           model="gpt_oss", backend=backend, checkpoint=CHECKPOINT)  # fmt: skip
    assert delta < LOGITS_ATOL
    prompt = ids[0, :12].tolist()
    assert linnet_greedy(m, prompt, 32) == hf_greedy(ref, prompt, 32)


def test_another_quant_method_is_refused(mxfp4_gpt_oss, tmp_path):
    """`quant_method` is a one-value field: a checkpoint quantized otherwise is L401 naming the key, not loaded."""
    from linnet.runtimes.loading import LoadError

    _, _, original = mxfp4_gpt_oss
    write_mxfp4_folder(tmp_path, original, quantization={"quant_method": "fp8"})
    with pytest.raises(LoadError, match=r"L401\]: `quant_method` can only be \"mxfp4\"; got \"fp8\"") as err:
        load("torch", tmp_path)
    assert "mxfp4" in str(err.value)


def test_blocks_without_the_quantization_config_are_refused(mxfp4_gpt_oss, tmp_path):
    """Blocks and scales in a checkpoint whose config does not say MXFP4: the names do not match (L502), naming the
    stored pair and the parameter that has no tensor."""
    from linnet.runtimes.loading import LoadError

    _, _, original = mxfp4_gpt_oss
    write_mxfp4_folder(tmp_path, original, quantization=None)
    with pytest.raises(LoadError, match=r"experts.gate_up_proj_blocks") as err:
        load("torch", tmp_path)
    assert err.value.code == "L502" and "model.layers.0.mlp.experts.gate_up_proj`" in str(err.value)


def test_an_overflowing_scale_is_refused(mxfp4_gpt_oss, tmp_path):
    """A scale byte of 255 (2**128) makes Inf weights: refused at load naming the tensor and the stored pair."""
    from linnet.runtimes.loading import LoadError

    _, _, original = mxfp4_gpt_oss

    def overflow(tensors):
        tensors["model.layers.1.mlp.experts.down_proj_scales"][2, 5, 0] = 255

    write_mxfp4_folder(tmp_path, original, edit=overflow)
    message = r"down_proj_scales`\): tensor .model.layers.1.mlp.experts.down_proj. holds Inf"
    with pytest.raises(LoadError, match=message):
        load("torch", tmp_path)


def test_a_pair_of_another_layout_is_refused(mxfp4_gpt_oss, tmp_path):
    from linnet.runtimes.loading import LoadError

    _, _, original = mxfp4_gpt_oss

    def wrong(tensors):
        tensors["model.layers.0.mlp.experts.down_proj_blocks"] = np.zeros((4, 64, 2, 8), np.uint8)

    write_mxfp4_folder(tmp_path, original, edit=wrong)
    with pytest.raises(LoadError, match=r"down_proj_blocks. u8\[4, 64, 2, 8\].*not MXFP4"):
        load("torch", tmp_path)


def release_header(folder, config, model, down_proj_rows: int | None = None) -> None:
    """A header-only model.safetensors laid out as openai/gpt-oss-20b's: the expert weights as u8 blocks and scales
    (`gate_up_proj_blocks` [32, 5760, 90, 16] ...), every other tensor bf16; the data a hole of the real size."""
    config.save_pretrained(folder)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(cfg | {"quantization_config": RELEASE_QUANTIZATION}))
    header, offset = {}, 0

    def add(name, dtype, shape, itemsize):
        nonlocal offset
        size = int(np.prod(shape)) * itemsize
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size

    for name, p in model.named_parameters():
        if is_expert_weight(name):
            e, n, r = p.shape
            if down_proj_rows is not None and name.endswith("down_proj"):
                r = down_proj_rows
            add(name + "_blocks", "U8", (e, r, n // 32, 16), 1)
            add(name + "_scales", "U8", (e, r, n // 32), 1)
        else:
            add(name, "BF16", tuple(p.shape), 2)
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(folder / "model.safetensors", "wb") as f:
        f.write(len(raw).to_bytes(8, "little") + raw)
        f.truncate(8 + len(raw) + offset)


@pytest.mark.parametrize("preset", sorted(REAL_CONFIGS))
def test_the_release_layout_fits_every_parameter(preset, tmp_path):
    """`linnet check --weights` (headers only) against gpt-oss-20b's layout: 459 tensors, the 48 expert weights as
    MXFP4 pairs (96 u8 tensors); clean, and one expert pair of the wrong width is L501 naming the dequantized tensor
    and both shapes."""
    from linnet.runtimes.headers import check_weights

    config = transformers.GptOssConfig(**REAL_CONFIGS[preset])
    with torch.device("meta"):
        model = transformers.GptOssForCausalLM(config)
    release_header(tmp_path, config, model)
    with open(tmp_path / "model.safetensors", "rb") as f:  # the header only: the data is a hole of ~13 GB
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    assert header["model.layers.0.mlp.experts.gate_up_proj_blocks"]["shape"] == [32, 5760, 90, 16]
    assert len(header) == 24 * 17 + 3 + 24 * 2
    report = check_weights(str(GPT_OSS), GPT_OSS.read_text(), str(tmp_path), preset)
    assert report.diagnostics == []

    release_header(tmp_path, config, model, down_proj_rows=2881)
    report = check_weights(str(GPT_OSS), GPT_OSS.read_text(), str(tmp_path), preset)
    assert [d.code for d in report.diagnostics] == ["L501"] * 24
    assert "experts.down_proj` in" in report.diagnostics[0].message and "2881" in report.diagnostics[0].message


def test_export_writes_the_dequantized_weights(mxfp4_gpt_oss, tmp_path):
    """`linnet export-hf` of a model loaded from MXFP4 writes the expert weights dequantized and no
    `quantization_config` (transformers would look for blocks and scales): transformers loads the export plain and
    computes the same logits as from the MXFP4 folder."""
    from linnet.runtimes.export.hf import export_hf

    folder, ref, _ = mxfp4_gpt_oss
    export_hf(load("torch", folder), tmp_path)
    assert "quantization_config" not in json.loads((tmp_path / "config.json").read_text())
    exported = transformers.GptOssForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    ids = prompts(2, 24, seed=3)
    with torch.inference_mode():
        assert max_abs_diff(exported(input_ids=ids).logits, ref(input_ids=ids).logits) == 0.0
