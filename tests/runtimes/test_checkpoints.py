"""Checkpoint reading: Hugging Face folders, GGUF (SmolLM2 against transformers, and a synthetic file written in
llama.cpp's layout), the embedded all-MiniLM, config normalisation, and errors that name the path. Tensors come
back as numpy arrays (bf16 as ml_dtypes.bfloat16), compared here with torch's through `to_torch`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from linnet.runtimes.formats import embedded
from linnet.runtimes.formats.checkpoints import CheckpointError, normalize_config, open_checkpoint
from linnet.runtimes.formats.embedded import EmbeddedError, resolve_embedded
from tests.runtimes.gguf_writing import TO_GGUF, llamacpp_permute

ROOT = Path(__file__).resolve().parents[2]


def _embedded_path(embedded_id: str) -> Path:
    try:
        return resolve_embedded(embedded_id)[0]
    except EmbeddedError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def smollm2():
    _embedded_path("smollm2-135m-instruct")
    with open_checkpoint("smollm2-135m-instruct") as ckpt:
        yield ckpt


@pytest.fixture(scope="module")
def minilm():
    _embedded_path("all-minilm-l6-v2")
    with open_checkpoint("all-minilm-l6-v2") as ckpt:
        yield ckpt


# -- config normalisation ------------------------------------------------------------------------------------


def test_normalize_rope_parameters():
    cfg = {
        "hidden_size": 8,
        "rope_parameters": {
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    }
    out = normalize_config(cfg)
    assert out == {
        "hidden_size": 8,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    }
    assert "rope_parameters" in cfg  # input untouched


@pytest.mark.parametrize(
    ("cfg", "expected"),
    [
        ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}}, {"rope_theta": 1e4, "rope_scaling": None}),
        (
            {"rope_theta": 1e4, "rope_scaling": {"type": "linear", "factor": 2.0}},
            {"rope_theta": 1e4, "rope_scaling": {"rope_type": "linear", "factor": 2.0}},
        ),
        ({"rope_theta": 1e4, "rope_scaling": {"type": "default"}}, {"rope_theta": 1e4, "rope_scaling": None}),
        ({"rope_theta": 1e4, "rope_scaling": None}, {"rope_theta": 1e4, "rope_scaling": None}),
        (
            {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}},
            {"rope_theta": 1e4, "rope_scaling": None, "partial_rotary_factor": 0.5},
        ),
        (
            {"rope_parameters": {"full_attention": {"rope_theta": 1e6}, "sliding_attention": {"rope_theta": 1e4}}},
            {"rope_parameters": {"full_attention": {"rope_theta": 1e6}, "sliding_attention": {"rope_theta": 1e4}}},
        ),
        ({"n_embd": 32}, {"n_embd": 32}),
    ],
)
def test_normalize_other_spellings(cfg, expected):
    assert normalize_config(cfg) == expected


@pytest.mark.torch
def test_rope_scaling_and_rope_parameters_that_disagree_are_refused(tmp_path):
    """transformers 5 reads `rope_scaling` when both keys are set; Linnet read `rope_parameters` (logits off by
    ~8 in the trial). Disagreeing duplicates are an error naming both keys and the file; agreeing ones load."""
    transformers = pytest.importorskip("transformers")
    _tiny_llama(tmp_path)
    cfg_path = tmp_path / "config.json"
    cfg = json.loads(cfg_path.read_text())
    params = cfg["rope_parameters"]
    cfg["rope_scaling"] = {"rope_type": "linear", "factor": 4.0}
    cfg_path.write_text(json.dumps(cfg))
    # what transformers does with the file: rope_scaling wins
    assert transformers.AutoConfig.from_pretrained(tmp_path).rope_parameters["rope_type"] == "linear"
    with pytest.raises(CheckpointError) as e:
        open_checkpoint(tmp_path)
    msg = str(e.value)
    assert str(cfg_path) in msg and "`rope_scaling`" in msg and "`rope_parameters`" in msg and "disagree" in msg

    # the same scaling but a rope_theta transformers would not read
    cfg["rope_scaling"] = {k: v for k, v in params.items() if k != "rope_theta"}
    cfg["rope_theta"] = 10000.0
    cfg_path.write_text(json.dumps(cfg))
    assert transformers.AutoConfig.from_pretrained(tmp_path).rope_parameters["rope_theta"] == 10000.0
    with pytest.raises(CheckpointError, match="rope_theta"):
        open_checkpoint(tmp_path)

    # agreeing duplicates (also in transformers 4's `type` spelling) are fine
    cfg["rope_theta"] = params["rope_theta"]
    cfg["rope_scaling"] = {("type" if k == "rope_type" else k): v for k, v in params.items()}
    cfg_path.write_text(json.dumps(cfg))
    with open_checkpoint(tmp_path) as ckpt:
        assert ckpt.config["rope_theta"] == 500000.0 and ckpt.config["rope_scaling"]["rope_type"] == "llama3"
    # a null rope_scaling defers to rope_parameters, in transformers as in Linnet
    cfg["rope_scaling"] = None
    cfg_path.write_text(json.dumps(cfg))
    with open_checkpoint(tmp_path) as ckpt:
        assert ckpt.config["rope_scaling"]["factor"] == 8.0


# -- Hugging Face folders ------------------------------------------------------------------------------------


def _tiny_llama(tmp_path: Path, **save_kwargs):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=80,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
        tie_word_embeddings=True,
    )
    model = transformers.LlamaForCausalLM(config)
    model.save_pretrained(tmp_path, **save_kwargs)
    return model


def _torch(a):
    """A numpy array from a checkpoint as a torch tensor (bf16 kept), to compare with transformers'."""
    from linnet.runtimes.backends.torch_backend import to_torch

    assert isinstance(a, np.ndarray), type(a)
    return to_torch(a)


def _assert_same_tensors(ckpt, state_dict, skip=()):
    torch = pytest.importorskip("torch")
    assert set(ckpt.tensor_names) == set(state_dict) - set(skip)
    for name in ckpt.tensor_names:
        expected = state_dict[name]
        got = _torch(ckpt.load(name))
        assert ckpt.shape(name) == tuple(expected.shape), name
        assert got.dtype == expected.dtype, name
        assert torch.equal(got, expected), f"{name} differs"


@pytest.mark.torch
def test_hf_llama_tied_llama3_rope(tmp_path):
    model = _tiny_llama(tmp_path)
    with open_checkpoint(tmp_path) as ckpt:
        assert ckpt.format == "hf" and ckpt.source == str(tmp_path) and ckpt.path == tmp_path
        assert "lm_head.weight" not in ckpt.tensor_names and "lm_head.weight" not in ckpt
        _assert_same_tensors(ckpt, model.state_dict(), skip={"lm_head.weight"})
        cfg = ckpt.config
        assert cfg["tie_word_embeddings"] is True
        assert cfg["num_attention_heads"] == 8 and cfg["num_key_value_heads"] == 2
        assert cfg["rope_theta"] == 500000.0
        assert cfg["rope_scaling"] == {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        }
        assert "rope_parameters" not in cfg
        assert ckpt.dtype("model.norm.weight") == "f32"
        assert ckpt.buffer_names == set()
        assert ckpt.tokenizer() is None  # no tokenizer.json saved


@pytest.mark.torch
def test_hf_gpt2_untied_sharded(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(1)
    config = transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=4, vocab_size=100, n_positions=64, tie_word_embeddings=False
    )
    model = transformers.GPT2LMHeadModel(config)
    model.save_pretrained(tmp_path, max_shard_size="20KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    with open_checkpoint(tmp_path) as ckpt:
        assert "lm_head.weight" in ckpt.tensor_names
        _assert_same_tensors(ckpt, model.state_dict())
        assert ckpt.config["n_embd"] == 32 and ckpt.config["tie_word_embeddings"] is False
        assert "rope_theta" not in ckpt.config and "rope_scaling" not in ckpt.config
        half = ckpt.load("transformer.wte.weight", "f16")
        assert half.dtype == np.float16
        assert torch.equal(_torch(half), model.state_dict()["transformer.wte.weight"].half())


@pytest.mark.torch
def test_single_file_beside_an_index_is_refused(tmp_path):
    """model.safetensors beside model.safetensors.index.json: transformers reads model.safetensors, Linnet read
    the shards (22.5 apart in the trial, where the shards held other weights). An error names both files."""
    transformers = pytest.importorskip("transformers")
    sharded = tmp_path / "sharded"
    model = _tiny_llama(sharded, max_shard_size="20KB")
    assert (sharded / "model.safetensors.index.json").is_file()
    single = tmp_path / "single"
    model.save_pretrained(single)
    (sharded / "model.safetensors").write_bytes((single / "model.safetensors").read_bytes())
    ref = transformers.LlamaForCausalLM.from_pretrained(sharded)  # transformers opens it, reading one of the two
    assert ref.config.hidden_size == 64
    with pytest.raises(CheckpointError) as e:
        open_checkpoint(sharded)
    msg = str(e.value)
    assert str(sharded) in msg and "model.safetensors and model.safetensors.index.json" in msg, msg


@pytest.mark.torch
@pytest.mark.parametrize("shard", ["../outside.safetensors", "sub/../../outside.safetensors", "/abs/x.safetensors"])
def test_index_path_outside_the_folder_is_refused(tmp_path, shard):
    folder = tmp_path / "ckpt"
    _tiny_llama(folder)
    (tmp_path / "outside.safetensors").write_bytes((folder / "model.safetensors").read_bytes())
    (folder / "model.safetensors").unlink()
    index = {"metadata": {}, "weight_map": dict.fromkeys(_safetensors_keys(tmp_path / "outside.safetensors"), shard)}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="outside the checkpoint folder") as e:
        open_checkpoint(folder)
    assert str(folder / "model.safetensors.index.json") in str(e.value) and shard in str(e.value)


@pytest.mark.torch
def test_index_shard_in_a_subfolder_and_symlinked_shard_load(tmp_path):
    """Paths that stay in the folder load, also through a symlink out of it (the Hugging Face cache's layout)."""
    folder = tmp_path / "ckpt"
    model = _tiny_llama(folder)
    blob = tmp_path / "blobs" / "abc"
    blob.parent.mkdir()
    (folder / "model.safetensors").rename(blob)
    (folder / "sub").mkdir()
    (folder / "sub" / "shard.safetensors").symlink_to(blob)
    index = {"metadata": {}, "weight_map": dict.fromkeys(_safetensors_keys(blob), "sub/shard.safetensors")}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with open_checkpoint(folder) as ckpt:
        _assert_same_tensors(ckpt, model.state_dict(), skip={"lm_head.weight"})


def _safetensors_keys(path: Path) -> list[str]:
    """The tensor names of one safetensors file, read with the safetensors library."""
    from safetensors import safe_open

    with safe_open(str(path), framework="numpy") as f:
        return list(f.keys())


@pytest.mark.torch
def test_hf_bf16_and_integer_buffers(tmp_path):
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    tensors = {
        "embeddings.position_ids": torch.arange(16).unsqueeze(0),
        "embeddings.word_embeddings.weight": torch.randn(10, 4).to(torch.bfloat16),
        "step": torch.tensor([3], dtype=torch.int32),
    }
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with open_checkpoint(tmp_path / "config.json") as ckpt:  # config.json itself names its folder
        assert ckpt.buffer_names == {"embeddings.position_ids", "step"}
        assert ckpt.dtype("embeddings.position_ids") == "i64" and ckpt.shape("embeddings.position_ids") == (1, 16)
        assert ckpt.dtype("embeddings.word_embeddings.weight") == "bf16"
        words = ckpt.load("embeddings.word_embeddings.weight")
        assert words.dtype.name == "bfloat16"
        assert torch.equal(_torch(words), tensors["embeddings.word_embeddings.weight"])
        ids = ckpt.load("embeddings.position_ids", "f32")  # integer tensors are never cast
        assert ids.dtype == np.int64 and torch.equal(_torch(ids), tensors["embeddings.position_ids"])
        # read as stored: a read-only view of the memory-mapped file; a cast makes a fresh array
        assert not ids.flags.writeable and ckpt.load("embeddings.word_embeddings.weight", "f32").flags.writeable


# -- all-MiniLM (embedded zip) -------------------------------------------------------------------------------


def test_minilm_names_buffers_shapes(minilm):
    assert minilm.format == "hf" and minilm.source == "all-minilm-l6-v2"
    assert "embeddings.position_ids" in minilm.buffer_names
    assert minilm.buffer_names <= set(minilm.tensor_names)
    assert minilm.shape("embeddings.word_embeddings.weight") == (30522, 384)
    assert minilm.dtype("embeddings.position_ids") == "i64" and minilm.shape("embeddings.position_ids") == (1, 512)
    assert minilm.config["model_type"] == "bert" and minilm.config["hidden_size"] == 384
    assert "encoder.layer.5.output.dense.weight" in minilm.tensor_names


def test_minilm_tokenizer(minilm):
    tok = minilm.tokenizer()
    assert tok.encode("Hello world") == [101, 7592, 2088, 102]
    assert tok.encode("Hello world", add_special_tokens=False) == [7592, 2088]
    assert tok.special_tokens["[CLS]"] == 101 and tok.bos_token_id is None
    assert tok.decode(tok.encode("Hello world")) == "hello world"


@pytest.mark.torch
@pytest.mark.slow
def test_minilm_against_sentence_transformers(minilm):
    torch = pytest.importorskip("torch")
    st = pytest.importorskip("sentence_transformers")
    model = st.SentenceTransformer(str(minilm.path), device="cpu")
    for text in ["Hello world", "A longer sentence, with punctuation: and ÜNICODE é 中文!", "  spaced   out  "]:
        assert minilm.tokenizer().encode(text) == model.tokenizer(text)["input_ids"], text
    state = model[0].auto_model.state_dict()
    # transformers does not save the non-persistent position_ids buffer; it is the only extra name
    assert set(minilm.tensor_names) - set(state) == {"embeddings.position_ids"}
    for name in state:
        assert torch.equal(_torch(minilm.load(name)), state[name]), f"{name} differs"
    assert np.array_equal(minilm.load("embeddings.position_ids")[0], np.arange(512))


# -- GGUF: SmolLM2 -------------------------------------------------------------------------------------------


def test_smollm2_config_names_dtypes(smollm2):
    assert smollm2.format == "gguf" and smollm2.source == "smollm2-135m-instruct"
    cfg = smollm2.config
    expected = {
        "model_type": "llama",
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "head_dim": 64,
        "max_position_embeddings": 8192,
        "rope_theta": 100000.0,
        "rope_scaling": None,
        "vocab_size": 49152,
        "tie_word_embeddings": True,
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    assert {k: cfg[k] for k in expected} == expected
    assert cfg["rms_norm_eps"] == pytest.approx(1e-5)
    assert len(smollm2.tensor_names) == 2 + 30 * 9 and "lm_head.weight" not in smollm2.tensor_names
    assert smollm2.buffer_names == set()
    assert smollm2.dtype("model.embed_tokens.weight") == "q8_0"
    assert smollm2.dtype("model.layers.0.self_attn.q_proj.weight") == "q4_1"
    assert smollm2.dtype("model.layers.0.input_layernorm.weight") == "f32"
    assert smollm2.shape("model.embed_tokens.weight") == (49152, 576)
    assert smollm2.shape("model.layers.0.self_attn.k_proj.weight") == (192, 576)
    assert smollm2.shape("model.layers.0.mlp.down_proj.weight") == (576, 1536)
    assert smollm2.tokenizer() is smollm2.tokenizer() and smollm2.tokenizer().eos_token_ids == {2}


@pytest.mark.torch
def test_smollm2_load_shapes_and_dtypes(smollm2):
    for name in ["model.embed_tokens.weight", "model.layers.7.self_attn.k_proj.weight", "model.norm.weight"]:
        t = smollm2.load(name)
        assert isinstance(t, np.ndarray) and t.shape == smollm2.shape(name) and t.dtype == np.float32, name
    assert smollm2.load("model.norm.weight", "bf16").dtype.name == "bfloat16"


@pytest.fixture(scope="module")
def smollm2_reference(smollm2):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(smollm2.path.parent), gguf_file=smollm2.path.name, dtype=torch.float32
    )
    return model.config, model.state_dict()


@pytest.mark.torch
@pytest.mark.slow
def test_smollm2_tensors_match_transformers(smollm2, smollm2_reference):
    torch = pytest.importorskip("torch")
    _, state = smollm2_reference
    assert set(smollm2.tensor_names) == set(state) - {"lm_head.weight"}
    for name in smollm2.tensor_names:
        got, expected = _torch(smollm2.load(name)), state[name]
        assert got.shape == expected.shape and got.dtype == expected.dtype, name
        if not torch.equal(got, expected):
            err = (got - expected).abs().max().item()
            assert err <= 1e-6, f"{name} differs from transformers by {err}"


@pytest.mark.torch
@pytest.mark.slow
def test_smollm2_config_matches_transformers(smollm2, smollm2_reference):
    config, _ = smollm2_reference
    cfg = smollm2.config
    for key in [
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "rms_norm_eps",
        "vocab_size",
        "tie_word_embeddings",
        "max_position_embeddings",
        "bos_token_id",
        "eos_token_id",
    ]:
        assert cfg[key] == getattr(config, key), key
    assert cfg["rope_theta"] == config.rope_parameters["rope_theta"]
    assert config.rope_parameters.get("rope_type", "default") == "default" and cfg["rope_scaling"] is None


# -- GGUF: a synthetic llama written in llama.cpp's layout ---------------------------------------------------


def _write_llama_gguf(path: Path, *, extra_tensor: str | None = None, arch: str = "llama"):
    """A tiny random llama (8 query heads, 2 KV heads, q/k/v biases, untied) written as llama.cpp would: Q/K
    rows permuted, Q weights Q8_0, up_proj F16, v_proj BF16, the rest F32. Returns the HF state dict and the
    expected loaded values (Q8_0, F16 and BF16 round trips)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    gguf = pytest.importorskip("gguf")
    import numpy as np

    torch.manual_seed(2)
    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=2,
        attention_bias=True,
        tie_word_embeddings=False,
        rms_norm_eps=1e-6,
        max_position_embeddings=128,
    )
    state = {k: v.detach().clone() for k, v in transformers.LlamaForCausalLM(config).state_dict().items()}
    for k in state:  # norms are ones at init: make them distinguishable
        if k.endswith("norm.weight"):
            state[k] = torch.rand_like(state[k]) + 0.5
    w = gguf.GGUFWriter(str(path), arch)
    for key, value in {
        "context_length": 128,
        "embedding_length": 64,
        "feed_forward_length": 96,
        "block_count": 2,
        "attention.head_count": 8,
        "attention.head_count_kv": 2,
    }.items():
        w.add_uint32(f"{arch}.{key}", value)
    w.add_float32(f"{arch}.rope.freq_base", 10000.0)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_string(f"{arch}.rope.scaling.type", "linear")
    w.add_float32(f"{arch}.rope.scaling.factor", 2.0)
    expected = {}
    for name, tensor in state.items():
        data = tensor.numpy()
        if name == "model.embed_tokens.weight":
            gname = "token_embd.weight"
        elif name == "model.norm.weight":
            gname = "output_norm.weight"
        elif name == "lm_head.weight":
            gname = "output.weight"
        else:
            _, _, layer, *rest = name.split(".")
            module, suffix = ".".join(rest[:-1]), rest[-1]
            gname = f"blk.{layer}.{TO_GGUF[module]}.{suffix}"
        if ".attn_q." in gname:
            data = llamacpp_permute(data, 8, 8)
        elif ".attn_k." in gname:
            data = llamacpp_permute(data, 8, 2)
        if gname.endswith("attn_q.weight"):
            qdata = gguf.quants.quantize(np.ascontiguousarray(data), gguf.GGMLQuantizationType.Q8_0)
            w.add_tensor(gname, qdata, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
            roundtrip = gguf.quants.quantize(tensor.numpy(), gguf.GGMLQuantizationType.Q8_0)
            expected[name] = torch.from_numpy(gguf.quants.dequantize(roundtrip, gguf.GGMLQuantizationType.Q8_0))
        elif gname.endswith("ffn_up.weight"):
            w.add_tensor(gname, np.ascontiguousarray(data).astype(np.float16))
            expected[name] = tensor.half()
        elif gname.endswith("attn_v.weight"):
            bits = tensor.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint8)
            w.add_tensor(gname, bits, raw_dtype=gguf.GGMLQuantizationType.BF16)
            expected[name] = tensor.to(torch.bfloat16)
        else:
            w.add_tensor(gname, np.ascontiguousarray(data))
            expected[name] = tensor
    if extra_tensor:
        w.add_tensor(extra_tensor, np.zeros(4, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return state, expected


@pytest.mark.torch
def test_synthetic_gguf_undoes_llamacpp_layout(tmp_path):
    torch = pytest.importorskip("torch")
    state, expected = _write_llama_gguf(tmp_path / "tiny.gguf")
    with open_checkpoint(tmp_path / "tiny.gguf") as ckpt:
        assert set(ckpt.tensor_names) == set(state)
        assert ckpt.config["num_key_value_heads"] == 2 and ckpt.config["tie_word_embeddings"] is False
        assert ckpt.config["rope_scaling"] == {"rope_type": "linear", "factor": 2.0}
        assert "head_dim" not in ckpt.config  # only when the file states rope.dimension_count
        assert ckpt.dtype("model.layers.0.self_attn.q_proj.weight") == "q8_0"
        assert ckpt.dtype("model.layers.0.mlp.up_proj.weight") == "f16"
        assert ckpt.dtype("model.layers.0.self_attn.k_proj.bias") == "f32"
        assert ckpt.dtype("model.layers.0.self_attn.v_proj.weight") == "bf16"
        for name in ckpt.tensor_names:
            got = _torch(ckpt.load(name))
            assert got.dtype == expected[name].dtype, name
            assert torch.equal(got, expected[name]), f"{name} differs"
        # K uses the KV head count: with the query head count its rows come back scrambled
        assert torch.equal(
            _torch(ckpt.load("model.layers.1.self_attn.k_proj.weight")), state["model.layers.1.self_attn.k_proj.weight"]
        )
        assert ckpt.load("model.layers.0.mlp.up_proj.weight", "f32").dtype == np.float32


def test_gguf_unknown_tensor_name(tmp_path):
    pytest.importorskip("torch")
    _write_llama_gguf(tmp_path / "odd.gguf", extra_tensor="blk.0.attn_mystery.weight")
    with pytest.raises(CheckpointError, match=r"unknown GGUF tensor 'blk.0.attn_mystery.weight'") as e:
        open_checkpoint(tmp_path / "odd.gguf")
    assert str(tmp_path / "odd.gguf") in str(e.value)


def test_gguf_unsupported_architecture(tmp_path):
    pytest.importorskip("torch")
    _write_llama_gguf(tmp_path / "g.gguf", arch="gpt2")
    with pytest.raises(CheckpointError, match="architecture 'gpt2' is not supported"):
        open_checkpoint(tmp_path / "g.gguf")


def test_gguf_tensor_maps_and_the_export_share_their_transforms():
    """Each architecture's table names transforms of the vocabulary, for tensors it lists; the export permutes
    exactly what the reader un-permutes (it reads the same table), and its permutation is the reader's inverse."""
    from linnet.runtimes.export.gguf import ARCHITECTURES, llamacpp_permute
    from linnet.runtimes.formats.gguf import GGUF_TENSOR_MAPS, GGUF_TRANSFORMS, _unpermute_rows

    for tensors in GGUF_TENSOR_MAPS.values():
        assert set(tensors.transforms.values()) <= set(GGUF_TRANSFORMS)
        assert set(tensors.transforms) <= set(tensors.top) | set(tensors.block)
    llama = {"attn_q": "unpermute_rope_q", "attn_k": "unpermute_rope_k"}
    assert ARCHITECTURES["LlamaForCausalLM"].transforms == ARCHITECTURES["MistralForCausalLM"].transforms == llama
    assert all(not ARCHITECTURES[family].transforms for family in ("Qwen2ForCausalLM", "Qwen3ForCausalLM"))
    rows = np.arange(4 * 2 * 3 * 5).reshape(24, 5)
    assert np.array_equal(_unpermute_rows(llamacpp_permute(rows, 4), 4), rows)


# -- errors --------------------------------------------------------------------------------------------------


def test_missing_path(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(CheckpointError, match="no such file or folder") as e:
        open_checkpoint(missing)
    assert str(missing) in str(e.value) and "expected" in str(e.value)


def test_folder_without_config(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(CheckpointError, match="no config.json") as e:
        open_checkpoint(tmp_path)
    assert str(tmp_path) in str(e.value)


def test_folder_with_pickle_weights_only(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "pytorch_model.bin").write_bytes(b"\x80\x04not loaded")
    with pytest.raises(CheckpointError, match="pickle") as e:
        open_checkpoint(tmp_path)
    assert str(tmp_path) in str(e.value)


def test_folder_with_bad_config(tmp_path):
    (tmp_path / "config.json").write_text("{nope")
    with pytest.raises(CheckpointError, match="config.json"):
        open_checkpoint(tmp_path)


def test_deeply_nested_config_is_a_located_error(tmp_path):
    """100 000 nested arrays ended in a RecursionError traceback from `json.loads`."""
    (tmp_path / "config.json").write_text('{"use_cache": ' + "[" * 100_000 + "]" * 100_000 + "}")
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(CheckpointError) as e:
        open_checkpoint(tmp_path)
    assert str(e.value) == f"{tmp_path / 'config.json'}: cannot read JSON (arrays or objects nested too deeply)"


def test_deeply_nested_tokenizer_config_is_a_located_error(tmp_path):
    from linnet.runtimes.formats.tokenizer import TokenizerError, _read_json

    path = tmp_path / "tokenizer_config.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(TokenizerError, match="nested too deeply") as e:
        _read_json(path)
    assert str(path) in str(e.value)


def test_cli_deeply_nested_config_override_is_a_usage_error():
    deep = "[" * 20_000 + "]" * 20_000  # deeper than the recursion limit; argv strings stop at 128 KiB
    r = subprocess.run(
        [sys.executable, "-m", "linnet", "run", "examples/mlp.linnet", "--config", f"hidden={deep}"],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-500:]
    assert "--config hidden=...: the value nests arrays or objects too deeply" in r.stderr


@pytest.mark.torch
def test_truncated_safetensors(tmp_path):
    _tiny_llama(tmp_path)
    weights = tmp_path / "model.safetensors"
    data = weights.read_bytes()
    for cut in [4, 100, len(data) - 10]:
        weights.write_bytes(data[:cut])
        with pytest.raises(CheckpointError) as e:
            open_checkpoint(tmp_path)
        assert str(weights) in str(e.value), cut


@pytest.mark.parametrize("fraction", [0.0, 1e-7, 1e-3, 0.01, 0.02, 0.5, 0.99999])
def test_truncated_gguf(smollm2, tmp_path, fraction):
    data = smollm2.path.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: int(len(data) * fraction)])
    with pytest.raises(CheckpointError) as e:
        open_checkpoint(cut)
    assert str(cut) in str(e.value)


def test_not_a_gguf(tmp_path):
    bogus = tmp_path / "model.gguf"
    bogus.write_bytes(b"PK\x03\x04" + bytes(100))
    with pytest.raises(CheckpointError, match="not a GGUF file") as e:
        open_checkpoint(bogus)
    assert str(bogus) in str(e.value)
    other = tmp_path / "weights.dat"
    other.write_bytes(bytes(100))
    with pytest.raises(CheckpointError, match="expected a Hugging Face folder"):
        open_checkpoint(other)


def test_unknown_tensor_name(smollm2):
    with pytest.raises(CheckpointError, match="no tensor named 'lm_head.weight'"):
        smollm2.shape("lm_head.weight")


def test_embedded_package_missing(monkeypatch):
    monkeypatch.setitem(embedded.EMBEDDED, "all-minilm-l6-v2", ("no_such_pkg_xyz", "model.zip", "zip", "no-such-pkg"))
    with pytest.raises(CheckpointError, match="all-minilm-l6-v2.*not installed"):
        open_checkpoint("all-minilm-l6-v2")


def test_closed_checkpoint(tmp_path):
    pytest.importorskip("torch")
    _write_llama_gguf(tmp_path / "tiny.gguf")
    ckpt = open_checkpoint(tmp_path / "tiny.gguf")
    ckpt.close()
    with pytest.raises(CheckpointError, match="closed"):
        ckpt.load("model.norm.weight")


# -- reading needs no torch -----------------------------------------------------------------------------------


def test_opening_and_loading_need_no_torch():
    _embedded_path("smollm2-135m-instruct")
    code = (
        "import sys\n"
        "from linnet.runtimes.formats.checkpoints import open_checkpoint\n"
        "c = open_checkpoint('smollm2-135m-instruct')\n"
        "c.shape('model.embed_tokens.weight'); c.tokenizer().encode('hi')\n"
        "w = c.load('model.layers.0.self_attn.q_proj.weight', 'bf16')\n"  # Q4_1, dequantized and unpermuted
        "assert w.shape == (576, 576) and w.dtype.name == 'bfloat16', (w.shape, w.dtype)\n"
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'torch imported'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_a_config_json_key_given_twice_is_refused_naming_both_lines(tmp_path):
    """`"hidden_act": "silu"` on line 11 then `"hidden_act": "relu"` on line 12: JSON readers keep the last (relu), and
    the error then cited line 11 with "got relu". Keys repeated in different objects are fine."""
    from linnet.runtimes.formats.checkpoints import CheckpointError
    from linnet.runtimes.formats.hf_folder import load_json_without_duplicate_keys
    from tests.runtimes.test_corrupt_files import write_hf_folder

    folder = write_hf_folder(tmp_path / "hf")
    config = folder / "config.json"
    lines = config.read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if '"hidden_size"' in line)
    lines[at + 1 : at + 1] = ['  "hidden_act": "silu",', '  "hidden_act": "relu",']
    config.write_text("\n".join(lines))
    with pytest.raises(CheckpointError) as e:
        open_checkpoint(folder)
    assert str(e.value) == (
        f"{config}: key 'hidden_act' is given twice (lines {at + 2} and {at + 3}); JSON readers keep one or the "
        "other: give it once"
    )
    nested = '{"rope_theta": 1.0, "rope_parameters": {"rope_theta": 1.0,\n"rope_type": "default"}}'
    assert load_json_without_duplicate_keys(nested, config)["rope_parameters"]["rope_type"] == "default"
    with pytest.raises(CheckpointError, match=r"key 'factor' is given twice \(lines 2 and 3\)"):
        load_json_without_duplicate_keys('{"factor": 1, "rope_scaling": {\n"factor": 2,\n"factor": 3}}', config)


@pytest.mark.torch
def test_batch_norm_counter_is_known_and_unused(tmp_path):
    """A PyTorch BatchNorm2d's state_dict loads into std's BatchNorm2d by its names: weight, bias and
    the running statistics are taken, `num_batches_tracked` (an i64 training counter) is a known
    buffer, not an unexpected tensor."""
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    from linnet.ir import build
    from linnet.runtimes.loading import weight_problems

    norm = torch.nn.BatchNorm2d(4)
    save_file({f"norm.{k}": v for k, v in norm.state_dict().items()}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "resnet"}))
    source = "config C { n: int = 4 }\nmodel M(c: C) {\n    norm: BatchNorm2d(c.n)\n"
    source += "    entry fn forward(x: [B, c.n, H, W]) -> [B, c.n, H, W] { norm(x) }\n}\n"
    with open_checkpoint(tmp_path) as ckpt:
        assert ckpt.buffer_names == {"norm.num_batches_tracked"}
        plan, problems = weight_problems(build(source), ckpt, [])
    assert problems == []
    assert sorted(plan.values()) == ["norm.bias", "norm.running_mean", "norm.running_var", "norm.weight"]
