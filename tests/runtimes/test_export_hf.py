"""`linnet export hf` checked by transformers itself: each export loads with `AutoModelForCausalLM.from_pretrained`
with no missing, unexpected or mismatched weights and computes what Linnet computes; HF -> Linnet -> HF gives the
same tensors bit for bit and the same config.json; the embedded SmolLM2 GGUF -> HF gives transformers Linnet's
logits, greedy tokens and token ids (tokenizer rebuilt from the GGUF metadata, its bos/eos the file's own), and
loads back into Linnet with the GGUF's logits; what Hugging Face cannot express is an ExportError that leaves
nothing on disk."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.runtimes.conftest import EXAMPLES, LLAMA, hf_greedy, linnet_greedy, max_abs_diff, record
from tests.runtimes.zoo_decoders import save_seeded

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import linnet  # noqa: E402
import linnet.export  # noqa: E402
from linnet.errors import ExportError  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_torch_thread")]

VOCAB = 256
MAX_POSITIONS = 64
COMMON = dict(vocab_size=VOCAB, num_hidden_layers=2, initializer_range=0.1, bos_token_id=0, eos_token_id=1)
DECODER = dict(hidden_size=64, intermediate_size=128, num_attention_heads=8, num_key_value_heads=2, rms_norm_eps=1e-5)
# One tiny seeded model per decoder family of examples/ (2 layers, 8 query heads over 2 key/value heads where the
# family has GQA), each with what makes the family's config.json differ: llama3 rope scaling, a tied head, biases,
# q/k norms, a sliding window, phi3's longrope and fused projections, gpt2's own field names.
FAMILIES = {
    "llama": DECODER | dict(head_dim=8, max_position_embeddings=128, tie_word_embeddings=True, eos_token_id=[1, 2],
        rope_parameters={"rope_type": "llama3", "rope_theta": 100.0, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 32}),
    "mistral": DECODER | dict(head_dim=8, max_position_embeddings=128, sliding_window=16,
                              rope_parameters={"rope_type": "default", "rope_theta": 100.0}),
    "qwen2": DECODER | dict(max_position_embeddings=128, tie_word_embeddings=True, rope_theta=100.0),
    "qwen3": DECODER | dict(hidden_size=48, intermediate_size=96, head_dim=8, max_position_embeddings=128,
                            tie_word_embeddings=False, rope_theta=100.0),
    "phi3": DECODER | dict(intermediate_size=96, max_position_embeddings=MAX_POSITIONS, pad_token_id=None,
                           original_max_position_embeddings=16, rope_theta=100.0, partial_rotary_factor=0.5,
                           rope_scaling={"type": "longrope", "short_factor": [1.0, 1.7], "long_factor": [2.5, 9.0]}),
    "gpt2": dict(n_embd=64, n_layer=2, n_head=4, n_positions=MAX_POSITIONS),
    "gpt_oss": DECODER | dict(intermediate_size=32, head_dim=8, num_local_experts=4, num_experts_per_tok=2,
        sliding_window=16, max_position_embeddings=128, layer_types=["sliding_attention", "full_attention"],
        pad_token_id=None, rope_parameters={"rope_type": "yarn", "rope_theta": 100.0, "factor": 4.0,
            "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 32}),
}  # fmt: skip


def seeded_folder(folder: Path, model_type: str, seed: int = 0):
    """(folder, transformers model): a seeded model of `model_type`'s tiny config, saved with save_pretrained."""
    values = COMMON | FAMILIES[model_type]
    if model_type == "gpt2":
        values.pop("num_hidden_layers")
    config = transformers.AutoConfig.for_model(model_type, **values)
    return folder, save_seeded(config, folder, seed)


def read_json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def tensors(folder: Path) -> dict[str, np.ndarray]:
    """Every tensor of a folder's safetensors files (sharded or not), as stored."""
    from safetensors.numpy import load_file

    out: dict[str, np.ndarray] = {}
    for file in sorted(folder.glob("*.safetensors")):
        out |= load_file(file)
    return out


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


class _Warnings(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def from_pretrained(folder: Path, **kwargs):
    """transformers' model of `folder`, asserting that it loaded every weight the model has and no other (its
    loading info, and no warning in transformers' log about missing, unexpected or newly initialized weights)."""
    warnings = _Warnings()
    logger = logging.getLogger("transformers")
    logger.addHandler(warnings)
    try:
        model, info = transformers.AutoModelForCausalLM.from_pretrained(folder, output_loading_info=True, **kwargs)
    finally:
        logger.removeHandler(warnings)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    weights = re.compile(r"missing|unexpected|newly initialized|not (used|initialized)|mismatch", re.I)
    assert not [m for m in warnings.messages if weights.search(m)], warnings.messages
    return model.eval()


def hf_logits(model, ids: np.ndarray) -> np.ndarray:
    with torch.inference_mode():
        return model(input_ids=torch.from_numpy(ids)).logits.float().numpy()


# ---------------------------------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("model_type", list(FAMILIES))
def test_round_trip_through_linnet_is_bit_identical_and_loads_in_transformers(model_type, tmp_path):
    """save_pretrained -> Linnet -> export: the same tensors bit for bit, the same config.json and
    generation_config.json (but the transformers_version we do not claim), and transformers loads the export with
    no missing or unexpected weights and gives the original's logits exactly."""
    original, ref = seeded_folder(tmp_path / "original", model_type)
    model = linnet.load(EXAMPLES / f"{model_type}.linnet", original, max_positions=MAX_POSITIONS, progress=False)
    out = tmp_path / "export"
    linnet.export.hf(model, out)

    theirs, ours = tensors(original), tensors(out)
    assert sorted(ours) == sorted(theirs)
    assert all(same_bits(ours[n], theirs[n]) for n in theirs)
    for name in ("config.json", "generation_config.json"):
        want = read_json(original / name)
        want.pop("transformers_version")
        assert read_json(out / name) == want, name

    ids = np.random.default_rng(1).integers(2, VOCAB, (2, 12))
    exported = from_pretrained(out)
    assert np.array_equal(hf_logits(exported, ids), hf_logits(ref, ids))
    again = linnet.load(EXAMPLES / f"{model_type}.linnet", out, max_positions=MAX_POSITIONS, progress=False)
    assert again.notes == []


@pytest.mark.parametrize("model_type", ["bert", "roberta"])
def test_encoders_round_trip_with_the_pooler_they_do_not_compute(model_type, tmp_path):
    """An encoder (BertModel; RobertaModel, which `@takes_part`: no pooler) exports the same tensors bit for bit,
    the pooler carried over as stored, so `AutoModel` loads it whole and gives the original's hidden states."""
    sizes = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
    config = transformers.AutoConfig.for_model(model_type, vocab_size=VOCAB, max_position_embeddings=64, **sizes)
    torch.manual_seed(0)
    ref = transformers.AutoModel.from_config(config).eval()
    ref.save_pretrained(tmp_path / "original")
    model = linnet.load(EXAMPLES / f"{model_type}.linnet", tmp_path / "original", max_positions=64, progress=False)
    linnet.export.hf(model, tmp_path / "export")
    theirs, ours = tensors(tmp_path / "original"), tensors(tmp_path / "export")
    assert sorted(ours) == sorted(theirs) and all(same_bits(ours[n], theirs[n]) for n in theirs)
    exported, info = transformers.AutoModel.from_pretrained(tmp_path / "export", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    ids = torch.from_numpy(np.random.default_rng(4).integers(5, VOCAB, (1, 9)))
    with torch.inference_mode():
        assert torch.equal(exported.eval()(input_ids=ids).pooler_output, ref(input_ids=ids).pooler_output)


def test_an_encoder_s_tokenizer_keeps_its_cls_and_sep(tmp_path):
    """The embedded all-MiniLM-L6-v2 (a BERT folder): AutoTokenizer on the export adds [CLS] and [SEP] as Linnet's
    tokenizer does (no add_bos_token to make transformers rebuild the post-processor), and AutoModel loads it."""
    model = linnet.load(EXAMPLES / "bert.linnet", "all-minilm-l6-v2", max_positions=64, progress=False)
    linnet.export.hf(model, tmp_path / "export")
    ours, theirs = model.tokenizer(), transformers.AutoTokenizer.from_pretrained(tmp_path / "export")
    for text in TEXTS:
        assert theirs(text)["input_ids"] == ours.encode(text), text
    _, info = transformers.AutoModel.from_pretrained(tmp_path / "export", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info


def test_sharded_export_has_an_index_transformers_and_linnet_read(tmp_path):
    """Above max_shard_size the weights are split over model-0000i-of-0000N.safetensors with an index; both
    transformers and Linnet read them back to the same logits."""
    original, ref = seeded_folder(tmp_path / "original", "llama")
    model = linnet.load(LLAMA, original, max_positions=MAX_POSITIONS, progress=False)
    out = tmp_path / "export"
    linnet.export.hf(model, out, max_shard_size="40KB")
    shards = sorted(p.name for p in out.glob("*.safetensors"))
    index = read_json(out / "model.safetensors.index.json")
    assert len(shards) > 2 and not (out / "model.safetensors").exists()
    assert sorted(set(index["weight_map"].values())) == shards
    assert index["metadata"]["total_size"] == sum(a.nbytes for a in tensors(out).values())
    assert all(same_bits(a, tensors(original)[n]) for n, a in tensors(out).items())

    ids = np.random.default_rng(2).integers(2, VOCAB, (1, 10))
    assert np.array_equal(hf_logits(from_pretrained(out), ids), hf_logits(ref, ids))
    again = linnet.load(LLAMA, out, max_positions=MAX_POSITIONS, progress=False)
    assert max_abs_diff(np.array(again.forward(ids)), np.array(model.forward(ids))) == 0


@pytest.mark.parametrize("backend", ["onnxruntime", pytest.param("jax", marks=pytest.mark.jax)])
def test_every_backend_exports_the_same_weights(backend, tmp_path):
    """A model loaded on ONNX Runtime or JAX (which holds q/k/v fused for one dot) exports the same tensors as
    the checkpoint it came from."""
    pytest.importorskip("jax" if backend == "jax" else "onnxruntime")
    original, _ = seeded_folder(tmp_path / "original", "llama")
    model = linnet.load(LLAMA, original, backend=backend, max_positions=MAX_POSITIONS, progress=False)
    linnet.export.hf(model, tmp_path / "export")
    theirs = tensors(original)
    assert all(same_bits(a, theirs[n]) for n, a in tensors(tmp_path / "export").items())
    assert sorted(tensors(tmp_path / "export")) == sorted(theirs)


def test_a_model_changed_in_memory_leaves_as_it_is_now(tmp_path):
    """linnet.export.hf writes the parameters the model holds now (a fine-tuned model needs no file round trip),
    and transformers computes with them: its logits on the export equal Linnet's on the changed model."""
    original, _ = seeded_folder(tmp_path / "original", "qwen3")
    model = linnet.load(EXAMPLES / "qwen3.linnet", original, max_positions=MAX_POSITIONS, progress=False)
    with torch.no_grad():
        model.module.state_dict()["model.layers.1.mlp.down_proj.weight"].mul_(-3.0)  # the "fine-tuning"
    linnet.export.hf(model, tmp_path / "export")
    stored = tensors(original)["model.layers.1.mlp.down_proj.weight"]
    assert np.array_equal(tensors(tmp_path / "export")["model.layers.1.mlp.down_proj.weight"], stored * -3.0)
    ids = np.random.default_rng(5).integers(2, VOCAB, (1, 10))
    delta = max_abs_diff(hf_logits(from_pretrained(tmp_path / "export"), ids), np.array(model.forward(ids)))
    assert delta < 1e-4


def test_bf16_export_is_bf16_for_transformers(tmp_path):
    """--dtype bf16: BF16 tensors (rounded to nearest even, as torch's `to` does), `dtype: bfloat16` in config.json,
    and transformers loads it in bf16 with the logits of the original loaded in bf16."""
    original, ref = seeded_folder(tmp_path / "original", "qwen2")
    model = linnet.load(EXAMPLES / "qwen2.linnet", original, max_positions=MAX_POSITIONS, progress=False)
    out = tmp_path / "export"
    linnet.export.hf(model, out, dtype="bf16")
    assert read_json(out / "config.json")["dtype"] == "bfloat16"
    ours = tensors(out)
    for name, t in ref.state_dict().items():
        if name in ours:
            assert ours[name].dtype.name == "bfloat16"
            rounded = t.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
            assert np.array_equal(ours[name].view(np.uint16), rounded), name
    exported = from_pretrained(out)
    assert exported.dtype == torch.bfloat16
    ids = np.random.default_rng(3).integers(2, VOCAB, (1, 8))
    in_bf16 = from_pretrained(original, dtype=torch.bfloat16)
    assert np.array_equal(hf_logits(exported, ids), hf_logits(in_bf16, ids))


# ------------------------------------------------------------------------------------- the embedded SmolLM2 GGUF

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, 3 cats"]
CHAT = [{"role": "user", "content": "What is 2 + 2?"}]
TEXTS = [
    "Hello, world!",
    "  leading spaces and\ttabs\nnew lines",
    "numbers 1234567 and 3.14159",
    "Ünïcödé: naïve café, 日本語, emoji 🙂",
    "<|im_start|>user\nhi<|im_end|>",
    "code: for (i = 0; i < n; ++i) { x += y[i]; }",
]


# The SmolLM2 tests share one export of 135M parameters in f32 (540 MB): about 40 s in all on a shared core.
slow_smollm2 = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    """(Linnet's model of the embedded SmolLM2 GGUF, its HF export folder, transformers' model of that folder)."""
    gguf = linnet.load(LLAMA, "smollm2-135m-instruct", max_positions=MAX_POSITIONS, progress=False)
    out = tmp_path_factory.mktemp("smollm2") / "hf"
    linnet.export.hf(gguf, out)
    return gguf, out, from_pretrained(out)


@slow_smollm2
def test_gguf_export_config_and_token_ids_are_the_gguf_s(smollm2):
    """config.json and the tokenizer files carry the GGUF's own bos/eos/pad (tokenizer.ggml.*: <|im_start|>,
    <|im_end|>), no BOS added (add_bos_token false in the file), and transformers reads them so."""
    from linnet.runtimes.formats.gguf_reader import GGUFFile

    gguf, out, _ = smollm2
    with GGUFFile(gguf.prepared.checkpoint.path) as f:
        md = f.metadata
        bos, eos, pad = (md[f"tokenizer.ggml.{k}_token_id"] for k in ("bos", "eos", "padding"))
        add_bos = md.get("tokenizer.ggml.add_bos_token", False)
    config = transformers.AutoConfig.from_pretrained(out)
    assert (config.bos_token_id, config.eos_token_id, config.pad_token_id) == (bos, eos, pad)
    assert config.model_type == "llama" and config.tie_word_embeddings
    tok = transformers.AutoTokenizer.from_pretrained(out)
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (bos, eos, pad)
    assert tok.eos_token == "<|im_end|>"
    assert (tok("Hello")["input_ids"][0] == bos) == bool(add_bos)


@slow_smollm2
def test_gguf_export_runs_in_transformers_as_in_linnet(smollm2):
    """transformers on the export: logits within f32 tolerance of Linnet's on the GGUF, and the same greedy
    tokens on plain and chat prompts."""
    gguf, out, hf = smollm2
    tok = gguf.tokenizer()
    ids = np.array([tok.encode(PROMPTS[0])])
    delta = max_abs_diff(hf_logits(hf, ids), np.array(gguf.forward(ids)))
    record("SmolLM2 GGUF -> HF export, transformers vs Linnet logits", delta, model="llama", backend="torch",
           checkpoint="smollm2-135m-instruct (HF export)")  # fmt: skip
    assert delta < 1e-4
    from linnet.runtimes.inputs.chat import render_chat

    chat = render_chat(tok.chat_template, CHAT, bos_token=tok.bos_token, eos_token=tok.eos_token)
    for text in [*PROMPTS, chat]:
        prompt = tok.encode(text)
        assert hf_greedy(hf, prompt, 8) == linnet_greedy(gguf, prompt, 8), text


@slow_smollm2
def test_gguf_export_tokenizer_gives_linnet_s_ids(smollm2):
    """AutoTokenizer on the export gives Linnet's ids (and text back) on varied text, and renders the chat
    template as Linnet does."""
    from linnet.runtimes.inputs.chat import render_chat

    gguf, out, _ = smollm2
    ours = gguf.tokenizer()
    theirs = transformers.AutoTokenizer.from_pretrained(out)
    for text in TEXTS:
        assert theirs(text)["input_ids"] == ours.encode(text), text
        assert theirs.decode(ours.encode(text)) == ours.decode(ours.encode(text), skip_special_tokens=False)
    rendered = theirs.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    assert rendered == render_chat(ours.chat_template, CHAT, bos_token=ours.bos_token, eos_token=ours.eos_token)


@slow_smollm2
def test_gguf_export_loads_back_into_linnet_with_the_gguf_s_logits(smollm2):
    """GGUF -> HF -> Linnet: the same logits as the GGUF (the export holds the dequantized f32 weights)."""
    gguf, out, _ = smollm2
    back = linnet.load(LLAMA, out, max_positions=MAX_POSITIONS, progress=False)
    assert back.notes == []
    ids = np.array([gguf.tokenizer().encode(PROMPTS[1])])
    assert max_abs_diff(np.array(back.forward(ids)), np.array(gguf.forward(ids))) == 0
    assert back.tokenizer().encode(TEXTS[3]) == gguf.tokenizer().encode(TEXTS[3])


@slow_smollm2
def test_a_real_tokenizer_round_trips_through_linnet(smollm2, tmp_path):
    """HF -> Linnet -> HF with a real tokenizer (SmolLM2's export as the source folder): every file the same (the
    JSON files equal, the tensors bit for bit)."""
    _, out, _ = smollm2
    again = linnet.load(LLAMA, out, max_positions=16, progress=False)
    linnet.export.hf(again, tmp_path / "again")
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in (tmp_path / "again").iterdir())
    for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        assert read_json(tmp_path / "again" / name) == read_json(out / name), name
    theirs = tensors(out)
    assert all(same_bits(a, theirs[n]) for n, a in tensors(tmp_path / "again").items())


# ------------------------------------------------------------------------------------------------------- errors


def test_a_family_hugging_face_cannot_name_is_an_error_that_leaves_nothing(tmp_path):
    mlp = linnet.load(EXAMPLES / "mlp.linnet", random_weights=True, progress=False)
    with pytest.raises(ExportError, match=r"cannot export Mlp .*no transformers model_type .*LlamaForCausalLM"):
        linnet.export.hf(mlp, tmp_path / "out")
    assert list(tmp_path.iterdir()) == []


def test_a_field_transformers_has_no_key_for_is_an_error_naming_it():
    """Qwen2's config has no head_dim: transformers computes hidden_size / num_attention_heads, so a model whose
    head_dim differs (a `--config` override) cannot be written; at the computed value the field is left out."""
    from linnet.runtimes.export.hf import hf_config, parse_size

    fields = dict(hidden_size=64, num_attention_heads=8, head_dim=8, rope_theta=100.0, rope_scaling=None)
    written = hf_config("Qwen2ForCausalLM", fields, "f32")
    assert "head_dim" not in written and written["rope_parameters"] == {"rope_type": "default", "rope_theta": 100.0}
    with pytest.raises(ExportError, match=r"`head_dim = 16` .*qwen2 config has no `head_dim` and computes 8"):
        hf_config("Qwen2ForCausalLM", fields | {"head_dim": 16}, "f32")
    assert (parse_size("5GB"), parse_size("2GiB"), parse_size(1000)) == (5 * 10**9, 2 * 2**30, 1000)
    with pytest.raises(ExportError, match="max shard size"):
        parse_size("5 parsecs")


def test_a_weight_f16_cannot_hold_is_an_error_not_an_inf(tmp_path):
    original, _ = seeded_folder(tmp_path / "original", "qwen2")
    model = linnet.load(EXAMPLES / "qwen2.linnet", original, max_positions=MAX_POSITIONS, progress=False)
    with torch.no_grad():
        model.module.state_dict()["model.norm.weight"][3] = 1e5
    with pytest.raises(ExportError, match=r"cannot export as f16: .*'model.norm.weight' overflows .*export in a wider"):
        linnet.export.hf(model, tmp_path / "out", dtype="f16")
    assert not (tmp_path / "out").exists()
    linnet.export.hf(model, tmp_path / "out", dtype="bf16")  # bf16 has f32's range


def test_an_existing_folder_is_never_overwritten(tmp_path):
    taken = tmp_path / "out"
    taken.mkdir()
    (taken / "keep.txt").write_text("mine")
    original, _ = seeded_folder(tmp_path / "original", "qwen2")
    model = linnet.load(EXAMPLES / "qwen2.linnet", original, max_positions=MAX_POSITIONS, progress=False)
    with pytest.raises(ExportError, match="already exists and is not an empty folder"):
        linnet.export.hf(model, taken)
    assert [p.name for p in taken.iterdir()] == ["keep.txt"]


def test_a_failure_while_writing_leaves_nothing(tmp_path, monkeypatch):
    """A write that fails half way (here after the weights are on disk) removes the temporary folder."""
    from linnet.runtimes.export import hf as export_hf

    original, _ = seeded_folder(tmp_path / "original", "qwen2")
    model = linnet.load(EXAMPLES / "qwen2.linnet", original, max_positions=MAX_POSITIONS, progress=False)
    write_weights = export_hf._write_weights

    def disk_full(folder, *args):
        write_weights(folder, *args)
        assert (folder / "model.safetensors").is_file()
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(export_hf, "_write_weights", disk_full)
    with pytest.raises(OSError, match="No space left"):
        linnet.export.hf(model, tmp_path / "out", dtype="bf16")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["original"]


def test_cli_exports_and_refuses_with_one_line(tmp_path):
    """`linnet export hf` writes the folder (exit 0) with the modes the umask gives new files, as save_pretrained
    does; without FILE it picks the example for the checkpoint's model_type; an unsupported family is one line on
    stderr, exit 1, no traceback, nothing on disk."""
    original, _ = seeded_folder(tmp_path / "original", "qwen3")
    cli = [sys.executable, "-m", "linnet", "export", "hf"]
    ok = subprocess.run([*cli, str(EXAMPLES / "qwen3.linnet"), "--weights", str(original), "-o", str(tmp_path / "q")],
                        capture_output=True, text=True)  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    umask = os.umask(0)
    os.umask(umask)
    assert {p.stat().st_mode & 0o777 for p in (tmp_path / "q").iterdir()} == {0o666 & ~umask}
    assert (tmp_path / "q").stat().st_mode & 0o777 == 0o777 & ~umask
    assert all(same_bits(a, tensors(original)[n]) for n, a in tensors(tmp_path / "q").items())
    picked = subprocess.run([*cli, "--weights", str(original), "-o", str(tmp_path / "q2")], capture_output=True,
                            text=True)  # fmt: skip
    assert picked.returncode == 0 and "using examples/qwen3.linnet" in picked.stderr, picked.stderr
    assert all(same_bits(a, tensors(original)[n]) for n, a in tensors(tmp_path / "q2").items())
    mlp = str(EXAMPLES / "mlp.linnet")
    bad = subprocess.run([*cli, mlp, "-o", str(tmp_path / "m")], capture_output=True, text=True)
    assert bad.returncode == 1
    assert "Traceback" not in bad.stderr and "cannot export Mlp" in bad.stderr
    assert not (tmp_path / "m").exists()
