"""The torch training loop (linnet/runtimes/train/trainer.py, policy.py, schedule.py) on a random 2-layer Llama: the
schedules against transformers' `get_scheduler`; activation checkpointing, the interpreter and torch.compile give
the generated code's losses; bf16 autocast runs in bf16 and stays near f32."""

from __future__ import annotations

import pytest

from tests.runtimes.train.conftest import LLAMA

torch = pytest.importorskip("torch")

import linnet.torch as lt  # noqa: E402
from linnet.runtimes.train import SFT, TrainConfig, lr_multiplier  # noqa: E402
from linnet.runtimes.train.data import TokenRow  # noqa: E402
from linnet.runtimes.train.policy import TorchPolicy  # noqa: E402
from linnet.runtimes.train.trainer import Trainer  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_torch_thread")]

CONFIG = dict(
    vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2,
)  # fmt: skip
ROWS = [TokenRow([(7 * i + j) % 120 + 3 for j in range(6 + i % 4)], [0] * 3 + [1] * (3 + i % 4)) for i in range(8)]


@pytest.mark.parametrize("name", ["linear", "cosine", "constant", "constant_with_warmup"])
def test_schedules_are_transformers(name):
    from transformers import get_scheduler

    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = get_scheduler(name, opt, num_warmup_steps=3, num_training_steps=12)
    theirs = []
    for _ in range(12):
        theirs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    ours = [lr_multiplier(name, 3, 12)(t) for t in range(12)]
    assert ours == pytest.approx(theirs, abs=1e-12)


def losses(mode="generated", steps=3, **options):
    model = lt.load(LLAMA, config=CONFIG, random_weights=True, mode=mode, progress=False)
    autocast = torch.bfloat16 if options.pop("bf16", False) else None
    policy = TorchPolicy(model, [n for n, _ in model.module.named_parameters()], autocast_dtype=autocast, **options)
    config = TrainConfig(max_steps=steps, learning_rate=1e-2, per_device_train_batch_size=4, shuffle=False)
    return [r["loss"] for r in Trainer(policy, SFT(), ROWS, config).train()], policy


def test_checkpointing_and_the_interpreter_give_the_same_losses():
    plain, _ = losses()
    checkpointed, _ = losses(gradient_checkpointing=True)
    interpreted, _ = losses("interpret")
    assert checkpointed == pytest.approx(plain, abs=1e-6)
    assert interpreted == pytest.approx(plain, abs=1e-5)
    assert plain[-1] < plain[0]


def test_bf16_autocast():
    plain, _ = losses()
    mixed, policy = losses(bf16=True)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        out = policy.module.entry("forward")(torch.tensor([ROWS[0].input_ids]))
    assert out.dtype == torch.bfloat16  # the matmuls ran in bf16
    assert all(p.dtype == torch.float32 for p in policy.parameters())  # over f32 master weights
    assert mixed == pytest.approx(plain, abs=5e-2) and mixed != pytest.approx(plain, abs=1e-6)


@pytest.mark.slow  # torch.compile compiles the forward and backward graphs: minutes here
def test_torch_compile_trains():
    compiled, _ = losses("inductor")
    plain, _ = losses()
    assert compiled == pytest.approx(plain, abs=1e-5)
