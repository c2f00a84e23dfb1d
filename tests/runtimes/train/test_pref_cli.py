"""`linnet train --method dpo|grpo` (linnet/cli/train.py) with the preference options (--beta, --reward,
--num-generations, --max-completion-length, --temperature), in-process on the tiny Llama of `toy_pref`
(tests/runtimes/train/test_cli.py runs `linnet train` as a real process)."""

from __future__ import annotations

import pytest

from tests.runtimes.train import toy_pref
from tests.runtimes.train.conftest import LLAMA, write_jsonl

pytest.importorskip("torch")
pytest.importorskip("transformers")

from linnet.cli import main  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_torch_thread")]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return toy_pref.save_tiny_llama(tmp_path_factory.mktemp("tiny_llama"))


def test_cli_grpo_and_dpo(model_dir, tmp_path, capsys):
    """`linnet train --method grpo --reward module:function --num-generations G --beta B`, then `--method dpo
    --beta` (in-process; tests/runtimes/train/test_cli.py runs `linnet train` as a real process): exit 0, the
    adapter and one metrics line a step with the method's metrics."""
    import json

    prompts = write_jsonl(tmp_path / "g.jsonl", toy_pref.multiplication_prompts(2))
    pairs = write_jsonl(tmp_path / "p.jsonl", toy_pref.multiplication_preferences(4))
    for method, data, extra in (
        ("grpo", prompts, ["--reward", "tests.runtimes.train.toy_pref:exact_product_reward", "--num-generations",
                           "2", "--max-completion-length", "4", "--beta", "0.04", "--batch-size", "1"]),
        ("dpo", pairs, ["--beta", "0.2", "--batch-size", "2"]),
    ):  # fmt: skip
        out = tmp_path / method
        status = main(["train", str(LLAMA), "--weights", str(model_dir), "--method", method, "--data", str(data),
                       "--max-steps", "2", "--lr", "1e-3", "-o", str(out), "--quiet", *extra])  # fmt: skip
        err = capsys.readouterr().err
        assert status == 0, err
        assert "trained 2 steps: loss" in err.splitlines()[-1]
        metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        key = "reward" if method == "grpo" else "rewards/margins"
        assert [m["step"] for m in metrics] == [1, 2] and all(key in m for m in metrics)
        assert (out / "adapter_model.safetensors").is_file()


def test_cli_refuses_an_option_of_another_method(model_dir, tmp_path, capsys):
    data = write_jsonl(tmp_path / "g.jsonl", [{"prompt_ids": [1, 5], "completion_ids": [6]}])
    status = main(["train", str(LLAMA), "--weights", str(model_dir), "--data", str(data), "-o", str(tmp_path / "o"),
                   "--reward", "m:f", "--quiet"])  # fmt: skip
    err = capsys.readouterr().err
    assert status == 2 and "--reward is an option of --method grpo, not sft" in err


@pytest.mark.parametrize(
    "option, value, message",
    [
        # TRL's log-probabilities divide the logits by the temperature: 0 made the loss NaN (a run of NaN adapters)
        ("--temperature", "0", "GRPO's --temperature must be a number > 0 (its log-probabilities divide the logits "
                               "by it), got 0.0"),
        ("--temperature", "nan", "GRPO's --temperature must be a number > 0 (its log-probabilities divide the logits "
                                 "by it), got nan"),
        ("--beta", "nan", "--beta must be 0 or more for GRPO, got nan"),  # -1 was refused, NaN passed
    ],
)  # fmt: skip
def test_grpo_values_that_make_the_loss_nan_are_usage_errors(model_dir, tmp_path, capsys, option, value, message):
    data = write_jsonl(tmp_path / "g.jsonl", toy_pref.multiplication_prompts(2))
    out = tmp_path / "o"
    status = main(["train", str(LLAMA), "--weights", str(model_dir), "--method", "grpo", "--data", str(data),
                   "--reward", "tests.runtimes.train.toy_pref:exact_product_reward", "--num-generations", "2",
                   "--max-completion-length", "4", "--max-steps", "1", "-o", str(out), "--quiet",
                   option, value])  # fmt: skip
    err = capsys.readouterr().err
    assert status == 2 and err == f"linnet train: {message}\n", err
    assert not out.exists()


def test_grpo_on_jax_is_refused_before_anything_is_drawn_or_loaded(model_dir, tmp_path, capsys):
    # JAX does not train GRPO: the refusal came from the JAX trainer, after the output folder was claimed, the model
    # loaded and the progress bar drawn (its `training` line and the loader's on stderr before the message)
    pytest.importorskip("jax")
    data = write_jsonl(tmp_path / "g.jsonl", toy_pref.multiplication_prompts(2))
    out = tmp_path / "o"
    capsys.readouterr()
    status = main(["train", str(LLAMA), "--weights", str(model_dir), "--method", "grpo", "--backend", "jax",
                   "--reward", "tests.runtimes.train.toy_pref:exact_product_reward", "--data", str(data),
                   "--max-steps", "1", "-o", str(out)])  # fmt: skip
    err = capsys.readouterr().err
    assert status == 2
    assert err == "linnet train: method grpo does not train on JAX yet (JAX trains: sft, full, dpo)\n"
    assert not out.exists()
