"""The zoo index (`linnet generate --weights DIR` without a source file) and token ids in and out
(`--prompt-ids`, `--print-ids`) for a checkpoint without a tokenizer, against transformers' own
greedy `generate`."""

from __future__ import annotations

import json
import shutil

import pytest

from linnet.runtimes import zoo
from tests.cli.test_backends import run_cli
from tests.conftest import EXAMPLES, ROOT

PROMPT = [5, 17, 42, 9, 3]

# Real configs (the fields config.json sets that the sources read), to pick presets by.
TINYLLAMA = {
    "model_type": "llama", "vocab_size": 32000, "hidden_size": 2048, "intermediate_size": 5632,
    "num_hidden_layers": 22, "num_attention_heads": 32, "num_key_value_heads": 4,
    "max_position_embeddings": 2048, "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "rope_scaling": None,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2,
}  # fmt: skip
SMOLLM2_135M = {
    "model_type": "llama", "vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536,
    "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "max_position_embeddings": 8192,
    "rms_norm_eps": 9.999999747378752e-06, "rope_theta": 100000.0, "tie_word_embeddings": True,
}  # fmt: skip


def test_the_index_is_the_examples_folder_by_file_name():
    known = zoo.known_sources()
    assert zoo.examples_dir() == EXAMPLES.resolve()
    assert set(known) == {p.stem for p in EXAMPLES.glob("*.linnet")}
    assert known["llama"].name == "llama.linnet"


def test_a_new_example_joins_the_index_without_code(tmp_path):
    shutil.copy(EXAMPLES / "llama.linnet", tmp_path / "qwen2.linnet")
    assert list(zoo.known_sources(tmp_path)) == ["qwen2"]


def test_examples_ship_in_the_wheel():
    """Installed, `linnet/examples/*.linnet` sits beside `linnet/runtimes/` as it sits beside `linnet/runtimes/`
    here."""
    import tomllib

    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert tool["package-dir"]["linnet.examples"] == "examples"
    assert "linnet.examples" in tool["packages"]
    assert tool["package-data"]["linnet.examples"] == ["*.linnet"]


@pytest.mark.parametrize(
    ("config", "preset"), [(TINYLLAMA, "tinyllama_1_1b"), (SMOLLM2_135M, "smollm2_135m")], ids=["tinyllama", "smollm2"]
)
def test_a_real_config_picks_its_preset_with_no_difference(config, preset):
    choice = zoo.closest_preset(EXAMPLES / "llama.linnet", config, "llama")
    assert (choice.preset, choice.differences) == (preset, ())
    assert choice.compared >= 9
    assert choice.describe("examples/llama.linnet") == (
        f"using examples/llama.linnet, preset {preset} (closest: equal in all {choice.compared} fields the "
        "checkpoint's config sets)"
    )


def test_a_shrunk_config_picks_the_preset_it_differs_least_from_and_names_the_differences():
    shrunk = SMOLLM2_135M | {"num_hidden_layers": 2, "hidden_size": 64}
    choice = zoo.closest_preset(EXAMPLES / "llama.linnet", shrunk, "llama")
    assert choice.preset == "smollm2_135m"
    assert choice.differences == (("hidden_size", 64, 576), ("num_hidden_layers", 2, 30))
    assert "2 of" in choice.describe() and "hidden_size 64 (preset 576)" in choice.describe()


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    """A random-init (seeded, perturbed) 2-layer Llama saved by transformers, with no tokenizer, and its greedy
    continuation of PROMPT by `generate` (EOS off, so that all 12 tokens come)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from tests.runtimes.conftest import perturb

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5, rope_theta=100000.0,
        tie_word_embeddings=True, bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(config).eval()
    perturb(model, seed=1)
    folder = tmp_path_factory.mktemp("tiny-llama")
    model.save_pretrained(folder)
    with torch.inference_mode():
        out = model.generate(torch.tensor([PROMPT]), max_new_tokens=12, do_sample=False, pad_token_id=0)
    return folder, out[0, len(PROMPT) :].tolist()


def _config(folder):
    return json.loads((folder / "config.json").read_text())


def generate_ids(*args: str):
    """`linnet generate ARGS` on PROMPT's ids, 12 new tokens; the finished process (exit 0 asserted)."""
    ids = ",".join(map(str, PROMPT))
    r = run_cli("generate", *args, "--prompt-ids", ids, "--max-new-tokens", "12", "--max-positions", "32")
    assert r.returncode == 0, r.stderr
    return r


@pytest.mark.torch
def test_generate_picks_the_example_and_prints_the_ids_transformers_generates(tiny_llama):
    folder, expected = tiny_llama
    assert not (folder / "tokenizer.json").exists()
    r = generate_ids("--weights", str(folder), "--print-ids")
    assert r.stdout == ",".join(map(str, expected)) + "\n"
    assert "using examples/llama.linnet, preset smollm2_135m (closest: " in r.stderr
    assert "hidden_size 32 (preset 576)" in r.stderr


@pytest.mark.torch
def test_a_gguf_without_tokenizer_picks_the_example_by_its_architecture(tiny_llama, tmp_path):
    """`general.architecture` names the example; the file has no `tokenizer.ggml.*`, so ids go in and out."""
    import transformers

    from tests.runtimes.gguf_writing import write_llama_gguf

    folder, expected = tiny_llama
    path = tmp_path / "tiny.gguf"
    write_llama_gguf(path, transformers.LlamaForCausalLM.from_pretrained(folder))
    assert zoo.choose(path).source == zoo.known_sources()["llama"]
    r = generate_ids("--weights", str(path), "--print-ids")
    assert r.stdout == ",".join(map(str, expected)) + "\n"
    assert "using examples/llama.linnet, preset smollm2_135m (closest: " in r.stderr


@pytest.mark.torch
def test_generate_stops_at_the_config_eos_without_a_tokenizer(tiny_llama, tmp_path):
    """config.json's eos_token_id ends generation as in transformers (the stop token itself is not printed);
    without --print-ids the ids are printed anyway, with a note that says why."""
    folder, expected = tiny_llama
    eos = expected[4]
    copy = tmp_path / "eos"
    shutil.copytree(folder, copy)
    (copy / "config.json").write_text(json.dumps(_config(folder) | {"eos_token_id": eos}))
    r = generate_ids(str(EXAMPLES / "llama.linnet"), "--weights", str(copy))
    assert r.stdout == ",".join(map(str, expected[: expected.index(eos)])) + "\n"
    assert "has no tokenizer: printing token ids" in r.stderr
    assert "(stop)" in r.stderr.splitlines()[-1]


@pytest.mark.torch
def test_a_folder_without_tokenizer_asks_for_prompt_ids(tiny_llama):
    folder, _ = tiny_llama
    r = run_cli("generate", "--weights", str(folder), "--prompt", "hello", "--max-positions", "32")
    assert r.returncode == 2
    last = r.stderr.strip().splitlines()[-1]
    assert f"{folder} has no tokenizer (no tokenizer.json): give the prompt as token ids, --prompt-ids 1,2,3" in last


@pytest.mark.torch
def test_an_unknown_model_type_is_named_with_the_known_ones(tiny_llama, tmp_path):
    folder, _ = tiny_llama
    copy = tmp_path / "falcon"
    shutil.copytree(folder, copy)
    (copy / "config.json").write_text(json.dumps(_config(folder) | {"model_type": "falcon"}))
    r = run_cli("generate", "--weights", str(copy), "--prompt-ids", "1,2")
    assert r.returncode == 1
    known = ", ".join(sorted(p.stem for p in EXAMPLES.glob("*.linnet")))
    assert r.stderr.strip().splitlines()[-1] == (
        f"linnet generate: {copy}: no example for model_type 'falcon' (known model types: {known}); "
        "give a source file for it"
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--weights", "x", "--prompt-ids", "1,a"], "takes token ids >= 0 separated by commas (1,2,3), got 'a'"),
        (["--weights", "x", "--prompt-ids", "1", "--prompt", "hi"], "give the prompt as text (--prompt) or as"),
        (["--weights", "x"], "give the prompt as text (--prompt) or as token ids"),
        (["--prompt-ids", "1"], "give a source FILE, or --weights alone"),
        (["--weights", "x", "--prompt-ids", "1", "--chat"], "--chat renders a text prompt"),
    ],
    ids=["bad-id", "both-prompts", "no-prompt", "no-file-nor-weights", "chat-with-ids"],
)
def test_usage_errors(args, message):
    r = run_cli("generate", *args)
    assert r.returncode == 2
    assert message in r.stderr.strip().splitlines()[-1]
