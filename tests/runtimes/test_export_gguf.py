"""`linnet export gguf` / `linnet.export.gguf` (issue 16, items 2 and 3 for GGUF), checked against references:

- layout: a seeded GQA Llama (8 query heads, 2 KV heads) HF -> Linnet -> GGUF: the raw GGUF tensors equal llama.cpp's
  convert_hf_to_gguf.py layout (`gguf_writing.llamacpp_permute`, verbatim), and GGUF -> Linnet gives every tensor
  of the transformers model back bit for bit (k_proj needs the KV head count both ways); llama3 rope factors are
  llama.cpp's own (`gguf_writing.llamacpp_rope_freqs`).
- the engine: llama.cpp (llama-cpp-python, 2 threads; tests marked `llama_cpp`) loads each export, tokenizes as
  Linnet does, and its greedy tokens are Linnet's on the same file (f32, f16: every token; q8_0: see
  `Q8_0_AGREEMENT`).
- the embedded SmolLM2 GGUF (Q4_1) -> Linnet -> GGUF: re-exported as q4_1, every tensor is byte-identical to the
  original's; as f32, Linnet's logits on the export equal those on the original (slow).
- bad input: a family or rope type GGUF cannot express is an ExportError naming it, and no file is left behind.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from linnet.errors import ExportError
from linnet.runtimes.formats.checkpoints import open_checkpoint
from tests.runtimes.conftest import BERT, GPT2, LLAMA, MISTRAL, QWEN2, QWEN3, perturb
from tests.runtimes.gguf_writing import gguf_name, llamacpp_permute, llamacpp_rope_freqs

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

import linnet.export  # noqa: E402
import linnet.torch as lt  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_torch_thread")]

VOCAB = 384  # the model's rows; the tokenizer has TOKENIZER_VOCAB of them, the rest are written as [PAD<id>]
TOKENIZER_VOCAB = 320
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
TRAINING_TEXT = (
    "The quick brown fox jumps over the lazy dog. Linnet checks shapes before it runs a model; llama.cpp runs "
    "GGUF files on a laptop. 1234567890 +-*/ (brackets) [and] {braces}. Ünïcödé wörds, naïve café, 東京.\n\n"
)
# held-out prompts: text the tokenizer was not trained on, a chat turn, digits and spaces
PROMPTS = ["Once upon a time, a brown dog", "<|im_start|>user\nWhat runs GGUF?<|im_end|>\n", "  12 + 34 =  46 "]
GREEDY_TOKENS = 12
# q8_0: llama.cpp also rounds the activations to 8 bits before each matmul (ggml's q8_0 x q8_0 dot), Linnet runs
# the dequantized weights in f32; teacher-forced top-1 must agree on at least this share of positions.
Q8_0_AGREEMENT = 0.9


def tiny_tokenizer(folder: Path) -> None:
    """A byte-level BPE (GPT-2's pre-tokenizer) trained on TRAINING_TEXT, as tokenizer.json and
    tokenizer_config.json (eos/bos <|endoftext|>, no BOS added, a ChatML template)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([TRAINING_TEXT] * 4, trainer)
    tok.save(str(folder / "tokenizer.json"))
    config = {"bos_token": SPECIALS[0], "eos_token": SPECIALS[0], "add_bos_token": False}
    config["chat_template"] = CHAT_TEMPLATE
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")


def gqa_model(seed: int = 0, tied: bool = False, rope_scaling: dict | None = None):
    """A seeded transformers Llama: 8 query heads, 2 KV heads of 8, hidden 64, 2 layers."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=256,
        rope_theta=500.0,
        rope_scaling=rope_scaling,
        rms_norm_eps=1e-5,
        tie_word_embeddings=tied,
        initializer_range=0.2,
        bos_token_id=0,
        eos_token_id=0,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    perturb(model, seed=seed + 1, scale=0.2)
    return model


def hf_folder(folder: Path, model) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tiny_tokenizer(folder)
    return folder


@pytest.fixture(scope="module")
def gqa(tmp_path_factory):
    """(HF folder, transformers model, Linnet model) of the untied GQA model."""
    model = gqa_model()
    folder = hf_folder(tmp_path_factory.mktemp("gqa") / "hf", model)
    return folder, model, lt.load(LLAMA, weights=folder, progress=False)


@pytest.fixture(scope="module")
def exports(gqa, tmp_path_factory):
    """{type: path} of the GQA model exported as f32, f16 and q8_0."""
    out = tmp_path_factory.mktemp("gqa-gguf")
    return {t: linnet.export.gguf(gqa[2], out / f"gqa-{t}.gguf", type=t) for t in ("f32", "f16", "q8_0")}


def raw_tensors(path: Path) -> dict[str, np.ndarray]:
    reader = gguf.GGUFReader(str(path))
    return {t.name: np.array(t.data) for t in reader.tensors}


# -- layout and round trips ------------------------------------------------------------------------------------


def test_tensors_are_in_llama_cpp_layout(gqa, exports):
    _, model, _ = gqa
    c = model.config
    raw = raw_tensors(exports["f32"])
    state = {name: t.detach().numpy() for name, t in model.state_dict().items()}
    assert set(raw) == {gguf_name(n) for n in state}
    for name, value in state.items():
        if ".q_proj." in name:
            value = llamacpp_permute(value, c.num_attention_heads, c.num_attention_heads)
        elif ".k_proj." in name:
            value = llamacpp_permute(value, c.num_attention_heads, c.num_key_value_heads)
        assert raw[gguf_name(name)].dtype == np.float32
        assert np.array_equal(raw[gguf_name(name)], value), name


def test_hf_to_gguf_to_linnet_is_bit_identical(gqa, exports):
    _, model, _ = gqa
    state = {name: t.detach().numpy() for name, t in model.state_dict().items()}
    with open_checkpoint(exports["f32"]) as ckpt:
        assert set(ckpt.tensor_names) == set(state)
        for name, value in state.items():
            assert np.array_equal(ckpt.load(name), value), name
        c = model.config
        for key in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps"):
            assert ckpt.config[key] == pytest.approx(getattr(c, key)), key
        assert ckpt.config["rope_theta"] == c.rope_parameters["rope_theta"]
        assert ckpt.config["tie_word_embeddings"] is False
        assert ckpt.config["vocab_size"] == VOCAB


def test_metadata_and_tensor_types(gqa, exports):
    reader = gguf.GGUFReader(str(exports["q8_0"]))
    fields = {k: f.contents() for k, f in reader.fields.items()}
    assert fields["general.architecture"] == "llama"
    assert fields["general.file_type"] == int(gguf.LlamaFileType.MOSTLY_Q8_0)
    assert fields["llama.attention.head_count_kv"] == 2
    assert fields["tokenizer.ggml.model"] == "gpt2"
    assert fields["tokenizer.ggml.pre"] == "gpt-2"
    assert fields["tokenizer.ggml.add_bos_token"] is False
    assert fields["tokenizer.chat_template"] == CHAT_TEMPLATE
    tokens, types = fields["tokenizer.ggml.tokens"], fields["tokenizer.ggml.token_type"]
    assert len(tokens) == VOCAB and tokens[-1] == f"[PAD{VOCAB - 1}]" and types[-1] == 5
    assert [types[tokens.index(s)] for s in SPECIALS] == [3, 3, 3]
    kinds = {t.name: t.tensor_type.name for t in reader.tensors}
    assert kinds["blk.0.attn_norm.weight"] == kinds["output_norm.weight"] == "F32"
    assert kinds["blk.0.attn_k.weight"] == kinds["output.weight"] == kinds["token_embd.weight"] == "Q8_0"


def test_tied_head_is_not_written(tmp_path):
    folder = hf_folder(tmp_path / "hf", gqa_model(tied=True))
    path = linnet.export.gguf(lt.load(LLAMA, weights=folder, progress=False), tmp_path / "tied.gguf")
    assert "output.weight" not in raw_tensors(path)
    with open_checkpoint(path) as ckpt:
        assert ckpt.config["tie_word_embeddings"] is True


def test_llama3_rope_scaling_is_rope_freqs(tmp_path):
    rope = {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
    model = gqa_model(rope_scaling={**rope, "original_max_position_embeddings": 64})
    folder = hf_folder(tmp_path / "hf", model)
    path = linnet.export.gguf(lt.load(LLAMA, weights=folder, progress=False), tmp_path / "llama3.gguf")
    stored = raw_tensors(path)["rope_freqs.weight"]
    np.testing.assert_allclose(stored, llamacpp_rope_freqs(model.config), rtol=1e-6)
    assert (stored > 1).any() and (stored == 1).any()
    with open_checkpoint(path) as ckpt:
        assert ckpt.config["rope_scaling"]["rope_type"] == "llama3"
        assert ckpt.config["rope_scaling"]["factor"] == pytest.approx(4.0)


def test_tokenizer_reads_back_with_the_same_ids(gqa, exports):
    ours = gqa[2].tokenizer()
    with open_checkpoint(exports["f32"]) as ckpt:
        back = ckpt.tokenizer()
    for text in [*PROMPTS, TRAINING_TEXT, "naïve 東京 ok"]:
        assert back.encode(text) == ours.encode(text), text
    assert back.chat_template == CHAT_TEMPLATE
    assert (back.bos_token_id, back.eos_token_id, back.add_bos_token) == (0, 0, False)


# -- bad input -----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bert_folder(tmp_path_factory) -> Path:
    """A seeded one-layer BERT as a Hugging Face folder (a family GGUF export does not write)."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("bert") / "hf"
    config = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    BertModel(config).save_pretrained(folder)
    return folder


def test_unsupported_family_is_refused_and_leaves_nothing(bert_folder, tmp_path):
    model = lt.load(BERT, weights=bert_folder, progress=False)
    with pytest.raises(ExportError, match=r"BertModel has no GGUF architecture.*LlamaForCausalLM as llama"):
        linnet.export.gguf(model, tmp_path / "bert.gguf")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("rope_type", ["yarn", "dynamic", "longrope"])
def test_rope_type_llama_cpp_does_not_read_is_refused(rope_type):
    from linnet.runtimes.export.gguf import llama_metadata

    config = {"vocab_size": 8, "max_position_embeddings": 8, "hidden_size": 8, "intermediate_size": 8}
    config |= {"num_hidden_layers": 1, "num_attention_heads": 2, "rms_norm_eps": 1e-5}
    with pytest.raises(ExportError, match=f"rope_type '{rope_type}' has no GGUF form"):
        llama_metadata(config | {"rope_scaling": {"rope_type": rope_type, "factor": 2.0}}, "LlamaForCausalLM")


def test_a_failed_write_keeps_the_old_file(gqa, tmp_path, monkeypatch):
    from linnet.runtimes.export import gguf as export_gguf

    target = tmp_path / "model.gguf"
    target.write_bytes(b"old")

    def fail(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(export_gguf, "_write", fail)
    with pytest.raises(OSError, match="disk full"):
        linnet.export.gguf(gqa[2], target)
    assert target.read_bytes() == b"old" and list(tmp_path.iterdir()) == [target]


def test_unknown_pre_tokenizer_is_refused():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    from linnet.runtimes.export.gguf import tokenizer_metadata
    from linnet.runtimes.formats.tokenizer import Tokenizer as LinnetTokenizer

    backend = Tokenizer(models.BPE(vocab={"a": 0, "b": 1}, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.decoder = decoders.ByteLevel()
    with pytest.raises(ExportError, match="match no tokenizer.ggml.pre"):
        tokenizer_metadata(LinnetTokenizer(backend, source="whitespace"), 2)


def test_cli_writes_and_refuses(gqa, bert_folder, tmp_path, capsys):
    from linnet.cli import main
    from linnet.cli.export import GGUF_TYPES
    from linnet.runtimes.export.gguf import FILE_TYPES

    assert set(GGUF_TYPES) == set(FILE_TYPES)
    out = tmp_path / "cli.gguf"
    assert main(["export", "gguf", str(LLAMA), "--weights", str(gqa[0]), "-o", str(out), "--type", "f16"]) == 0
    assert gguf.GGUFReader(str(out)).fields["general.file_type"].contents() == int(gguf.LlamaFileType.MOSTLY_F16)
    assert main(["export", "gguf", str(BERT), "--weights", str(bert_folder), "-o", str(tmp_path / "bert.gguf")]) == 1
    err = capsys.readouterr().err
    assert "linnet export gguf: BertModel has no GGUF architecture" in err and "Traceback" not in err
    assert not (tmp_path / "bert.gguf").exists()


def test_cli_refuses_an_output_it_would_clobber_before_reading_weights(tmp_path, capsys):
    """An existing file is not replaced without --force (as `export hf` never overwrites a folder); a folder, an
    empty path or a missing parent folder is refused by name. The weights given do not exist: each refusal comes
    before they are read."""
    from linnet.cli import main

    notes = tmp_path / "notes.txt"
    notes.write_text("important\n")
    missing = str(tmp_path / "no-such-weights")
    cases = {
        str(notes): "already exists; remove it, pick another path, or give --force",
        str(tmp_path): "is a folder",
        "": "the output path is empty",
        str(tmp_path / "nodir" / "x.gguf"): "no such folder",
    }
    for output, message in cases.items():
        assert main(["export", "gguf", str(LLAMA), "--weights", missing, "-o", output]) == 1
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, err
    assert notes.read_text() == "important\n"


def test_cli_force_replaces_an_existing_file(gqa, tmp_path):
    from linnet.cli import main

    out = tmp_path / "model.gguf"
    out.write_text("old\n")
    assert main(["export", "gguf", str(LLAMA), "--weights", str(gqa[0]), "-o", str(out), "--force"]) == 0
    assert gguf.GGUFReader(str(out)).fields["general.architecture"].contents() == "llama"


# -- llama.cpp runs the exports --------------------------------------------------------------------------------


def llama_cpp():
    """The llama_cpp module, or a skip saying why it is missing (tools/llama_cpp_wheel.sh's reason when it
    could not build it) or why it must not run (a build with AMX, which crashes on the first decode)."""
    try:
        import llama_cpp
    except ImportError:
        reason = Path(sys.prefix) / "llama-cpp-unavailable.txt"
        why = reason.read_text(encoding="utf-8").strip() if reason.is_file() else "llama-cpp-python is not installed"
        pytest.skip(f"{why} (tools/llama_cpp_wheel.sh builds it)")
    if b"AMX_INT8 = 1" in llama_cpp.llama_print_system_info():
        pytest.skip("llama-cpp-python was built with AMX, whose matmul crashes here; rebuild: tools/llama_cpp_wheel.sh")
    return llama_cpp


def llama_cpp_model(path: Path):
    # an f32 KV cache (llama.cpp's default is f16, which moves logits by ~1e-2 and flips near-ties): the file
    # is what is compared, not llama.cpp's cache precision
    return llama_cpp().Llama(
        model_path=str(path),
        n_ctx=128,
        n_threads=2,
        n_threads_batch=2,
        logits_all=True,
        type_k=0,  # GGML_TYPE_F32
        type_v=0,
        verbose=False,
    )


def llama_cpp_argmax(llm, ids: list[int]) -> list[int]:
    """llama.cpp's top-1 next token after each prefix of `ids` (teacher forcing: one batch over all of them)."""
    llm.reset()
    llm.eval(ids)
    return [int(i) for i in np.argmax(llm.scores[: len(ids)], axis=-1)]


def llama_cpp_greedy(llm, ids: list[int], n: int) -> list[int]:
    """`n` greedy tokens from llama.cpp with its KV cache (a manual loop: no sampler, no EOS stop)."""
    llm.reset()
    llm.eval(ids)
    out: list[int] = []
    for _ in range(n):
        out.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
        llm.eval([out[-1]])
    return out


def same_greedy_tokens_and_logits(ours, path: Path, atol: float | None = None) -> None:
    """On each prompt, llama.cpp on the f32 export `path` gives Linnet's (`ours`) greedy tokens, and its logits at
    every position of prompt + continuation are Linnet's within `atol` (LOGITS_ATOL by default)."""
    from tests.runtimes.conftest import LOGITS_ATOL
    from tests.runtimes.conftest import linnet_greedy as greedy

    atol = atol or LOGITS_ATOL
    llm = llama_cpp_model(path)
    for prompt in PROMPTS:
        ids = ours.tokenizer().encode(prompt)
        continuation = greedy(ours, ids, GREEDY_TOKENS)
        assert llama_cpp_greedy(llm, ids, GREEDY_TOKENS) == continuation, prompt
        llama_cpp_argmax(llm, ids + continuation)
        theirs = np.array(llm.scores[: len(ids) + GREEDY_TOKENS])
        delta = float(np.abs(theirs - ours.forward(np.array([ids + continuation]))[0]).max())
        print(f"{path.name}: llama.cpp vs Linnet max|logits delta| {delta:.2e} ({prompt!r})")
        assert delta < atol, prompt


def linnet_greedy(path: Path, ids: list[int], n: int) -> list[int]:
    from tests.runtimes.conftest import linnet_greedy as greedy

    return greedy(lt.load(LLAMA, weights=path, max_positions=128, progress=False), ids, n)


@pytest.mark.llama_cpp
@pytest.mark.parametrize("file_type", ["f32", "f16", "q8_0"])
def test_llama_cpp_gives_linnets_greedy_tokens(gqa, exports, file_type):
    path = exports[file_type]
    llm = llama_cpp_model(path)
    tok = gqa[2].tokenizer()
    agree = total = 0
    for prompt in PROMPTS:
        ids = tok.encode(prompt)
        assert llm.tokenize(prompt.encode(), add_bos=False, special=True) == ids, prompt
        ours = linnet_greedy(path, ids, GREEDY_TOKENS)
        if file_type == "q8_0":
            theirs = llama_cpp_argmax(llm, ids + ours)[len(ids) - 1 : -1]
            agree += sum(a == b for a, b in zip(ours, theirs))
            total += len(ours)
        else:
            assert llama_cpp_greedy(llm, ids, GREEDY_TOKENS) == ours, prompt
    if file_type == "q8_0":
        print(f"q8_0: llama.cpp's top-1 is Linnet's greedy token at {agree} of {total} positions")
        assert agree >= Q8_0_AGREEMENT * total
    if file_type == "f32":
        same_greedy_tokens_and_logits(gqa[2], path)  # and the logits, against the model exported


# -- the other decoder families ----------------------------------------------------------------------------------

PHI3 = LLAMA.parent / "phi3.linnet"
PHI3_FIELDS = {"sliding_window": 96, "original_max_position_embeddings": 256, "pad_token_id": 0}
# family -> (example, transformers config class, its extra fields, llama.cpp architecture, Q/K permuted)
FAMILIES = {
    "mistral": (MISTRAL, "MistralConfig", {"sliding_window": None}, "llama", True),
    "qwen2": (QWEN2, "Qwen2Config", {}, "qwen2", False),
    "qwen3": (QWEN3, "Qwen3Config", {"head_dim": 16}, "qwen3", False),
    "phi3": (
        PHI3,
        "Phi3Config",
        {"sliding_window": 96, "original_max_position_embeddings": 256, "pad_token_id": 0},
        "phi3",
        False,
    ),
}


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory):
    """(family, transformers model, Linnet model, f32 export) of a seeded 2-layer GQA model of each family."""
    import transformers

    source, config_class, extra, _, _ = FAMILIES[request.param]
    fields = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2)
    fields |= dict(num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=256, rope_theta=500.0)
    fields |= dict(rms_norm_eps=1e-5, tie_word_embeddings=False, initializer_range=0.2, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(getattr(transformers, config_class)(**fields, **extra))
    perturb(model.eval(), seed=1, scale=0.2)
    folder = hf_folder(tmp_path_factory.mktemp(request.param) / "hf", model)
    ours = lt.load(source, weights=folder, max_positions=128, progress=False)
    path = linnet.export.gguf(ours, folder.parent / f"{request.param}.gguf")
    return request.param, model, ours, path


def llama_cpp_names(arch: str, n_blocks: int):
    """HF name -> llama.cpp name by gguf-py's own tensor map (what convert_hf_to_gguf.py uses)."""
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], n_blocks)
    return lambda hf_name: names.get_name(hf_name, try_suffixes=(".weight", ".bias"))


def test_families_are_written_as_convert_hf_to_gguf_writes_them(family):
    name, model, _, path = family
    arch, permuted = FAMILIES[name][3], FAMILIES[name][4]
    reader = gguf.GGUFReader(str(path))
    assert reader.fields["general.architecture"].contents() == arch
    assert reader.fields[f"{arch}.attention.head_count_kv"].contents() == 2
    raw = {t.name: np.array(t.data) for t in reader.tensors}
    c, to_gguf = model.config, llama_cpp_names(arch, 2)
    for hf_name, value in model.state_dict().items():
        value = value.detach().numpy()
        if permuted and ".q_proj." in hf_name:
            value = llamacpp_permute(value, c.num_attention_heads, c.num_attention_heads)
        elif permuted and ".k_proj." in hf_name:
            value = llamacpp_permute(value, c.num_attention_heads, c.num_key_value_heads)
        assert np.array_equal(raw.pop(to_gguf(hf_name)), value), hf_name
    assert raw == {}


@pytest.mark.llama_cpp
def test_llama_cpp_gives_linnets_greedy_tokens_on_each_family(family):

    _, _, ours, path = family
    same_greedy_tokens_and_logits(ours, path)


def test_a_mistral_window_survives_the_round_trip_through_gguf(tmp_path):
    """A Mistral whose sliding window (8) is shorter than the prompt: its GGUF export carries
    `llama.attention.sliding_window` (llama.cpp ignores it and stops at `context_length` = the window), so Linnet reads
    it back into examples/mistral.linnet with transformers' logits at every position past the window, and
    examples/llama.linnet, which has no window, refuses it (L503) instead of running plain causal attention."""
    import transformers

    from linnet.errors import LoadError

    config = transformers.MistralConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=8,
        num_key_value_heads=2, max_position_embeddings=256, sliding_window=8, rms_norm_eps=1e-5,
        tie_word_embeddings=False, initializer_range=0.2, bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.MistralForCausalLM._from_config(config, attn_implementation="eager").eval()
    perturb(model, seed=1, scale=0.2)
    folder = hf_folder(tmp_path / "hf", model)
    path = linnet.export.gguf(lt.load(MISTRAL, weights=folder, max_positions=64, progress=False), tmp_path / "m.gguf")
    fields = gguf.GGUFReader(str(path)).fields
    assert fields["llama.attention.sliding_window"].contents() == 8 and fields["llama.context_length"].contents() == 8

    back = lt.load(MISTRAL, weights=path, max_positions=64, progress=False)
    assert back.config["sliding_window"] == 8
    ids = torch.randint(0, VOCAB, (1, 24), generator=torch.Generator().manual_seed(5))
    with torch.inference_mode():
        (ours,) = back.run("forward", ids.numpy())
        theirs = model(input_ids=ids).logits.numpy()
    assert np.abs(ours - theirs).max() < 1e-4
    with pytest.raises(LoadError, match="sliding_window"):
        lt.load(LLAMA, weights=path, max_positions=64, progress=False)


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    """(transformers model, Linnet model, f32 export) of a seeded 2-layer GPT-2 with the tiny tokenizer."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=VOCAB, n_positions=128, n_embd=64, n_layer=2, n_head=4, initializer_range=0.2)
    model = GPT2LMHeadModel(config).eval()
    perturb(model, seed=1, scale=0.2)
    folder = hf_folder(tmp_path_factory.mktemp("gpt2") / "hf", model)
    ours = lt.load(GPT2, weights=folder, max_positions=128, progress=False)
    return model, ours, linnet.export.gguf(ours, folder.parent / "gpt2.gguf")


def test_gpt2_is_written_as_convert_hf_to_gguf_writes_it(gpt2):
    model, _, path = gpt2
    reader = gguf.GGUFReader(str(path))
    assert reader.fields["general.architecture"].contents() == "gpt2"
    assert reader.fields["gpt2.context_length"].contents() == 128
    raw = {t.name: np.array(t.data) for t in reader.tensors}
    assert "output.weight" not in raw  # tied
    to_gguf, conv1d = llama_cpp_names("gpt2", 2), (".c_attn.weight", ".c_proj.weight", ".c_fc.weight")
    for hf_name, value in model.state_dict().items():
        if hf_name == "lm_head.weight" or hf_name.endswith(".attn.bias"):  # tied; the causal mask buffer
            continue
        value = value.detach().numpy()
        assert np.array_equal(raw.pop(to_gguf(hf_name)), value.T if hf_name.endswith(conv1d) else value), hf_name
    assert raw == {}


@pytest.mark.llama_cpp
def test_llama_cpp_gives_linnets_greedy_tokens_on_gpt2(gpt2):

    _, ours, path = gpt2
    # ggml's CPU GELU reads an f16 lookup table (GGML_GELU_FP16 in ggml-cpu/vec.h): ~4e-3 on these logits, where
    # the Llama-like families agree to ~2e-5
    same_greedy_tokens_and_logits(ours, path, atol=2e-2)


# -- the embedded SmolLM2 GGUF (Q4_1) -> Linnet -> GGUF -----------------------------------------------------------

SMOLLM2 = "smollm2-135m-instruct"
SMOLLM2_CHAT = [{"role": "user", "content": "Name three rivers of Europe."}]
# the tokenizer keys of the original file the export must carry unchanged (llama-quantize's file has these too)
TOKENIZER_KEYS = (
    "tokenizer.ggml.model",
    "tokenizer.ggml.pre",
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.token_type",
    "tokenizer.ggml.merges",
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.padding_token_id",
    "tokenizer.ggml.add_bos_token",
    "tokenizer.chat_template",
)


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    """(original path, Linnet model of it, {type: export path}) for the embedded SmolLM2, exported as f32 and q4_1
    (its own type)."""
    model = lt.load(LLAMA, weights=SMOLLM2, max_positions=128, progress=False)
    out = tmp_path_factory.mktemp("smollm2")
    paths = {t: linnet.export.gguf(model, out / f"smollm2-{t}.gguf", type=t) for t in ("f32", "q4_1")}
    return model.prepared.checkpoint.path, model, paths


def chat_ids(tok) -> list[int]:
    from linnet.runtimes.inputs.chat import render_chat

    text = render_chat(tok.chat_template, SMOLLM2_CHAT, add_generation_prompt=True, bos_token=tok.bos_token)
    return tok.encode(text, add_special_tokens=False)


@pytest.mark.slow
def test_smollm2_reexported_as_q4_1_is_byte_identical(smollm2):
    original, _, paths = smollm2
    ours, theirs = raw_tensors(paths["q4_1"]), raw_tensors(original)
    assert set(ours) == set(theirs)
    for name, data in theirs.items():
        assert np.array_equal(ours[name], data), name
    ours, theirs = (gguf.GGUFReader(str(p)).fields for p in (paths["q4_1"], original))
    for key in TOKENIZER_KEYS:
        assert ours[key].contents() == theirs[key].contents(), key


@pytest.mark.slow
def test_smollm2_f32_export_gives_the_same_logits(smollm2):
    _, model, paths = smollm2
    ids = np.array([chat_ids(model.tokenizer())])
    exported = lt.load(LLAMA, weights=paths["f32"], max_positions=128, progress=False)
    np.testing.assert_allclose(exported.forward(ids), model.forward(ids), rtol=0, atol=1e-6)


@pytest.mark.slow
@pytest.mark.llama_cpp
def test_llama_cpp_runs_the_smollm2_exports_as_the_original(smollm2):
    from tests.runtimes.conftest import linnet_greedy as greedy

    original, model, paths = smollm2
    ids = chat_ids(model.tokenizer())
    ours = greedy(model, ids, GREEDY_TOKENS)
    assert llama_cpp_greedy(llama_cpp_model(paths["f32"]), ids, GREEDY_TOKENS) == ours
    assert llama_cpp_greedy(llama_cpp_model(paths["q4_1"]), ids, GREEDY_TOKENS) == llama_cpp_greedy(
        llama_cpp_model(original), ids, GREEDY_TOKENS
    )
