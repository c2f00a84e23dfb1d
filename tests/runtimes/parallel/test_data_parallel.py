"""Data parallel (DDP) and FSDP2 training across two processes give the one-process losses with the global batch.
The documented form runs: `torchrun --standalone --nproc-per-node 2 -m linnet train ... [--fsdp]` (gloo on CPU)
in a subprocess, 1 row a rank a micro-batch, 2 micro-batches a step; the reference is `linnet.train` in this
process with 2 rows a micro-batch. Full fine-tuning of the training tests' shrunk Llama (2 layers, hidden 32,
seed 0, f32), 5 steps with warmup, linear decay, clipping and weight decay. Rank 0 alone writes the output:
metrics.jsonl holds the global steps' records, and the FSDP2 run's model (gathered from the shards) equals the
one-process one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.runtimes.train.conftest import LLAMA, id_rows, write_jsonl

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import linnet  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_torch_thread")]

ROOT = Path(__file__).parents[3]
# a bound, not a timing: on a machine shared by many test runs, importing torch alone has taken 80 s
SUBPROCESS_TIMEOUT_S = 900
STEPS = 5
SCHEDULE = dict(learning_rate=1e-3, warmup_steps=1, max_grad_norm=1.0, weight_decay=0.01)
CLI = ["--lr", "1e-3", "--warmup-steps", "1", "--max-grad-norm", "1.0", "--weight-decay", "0.01"]
# f32 on both sides; the ranks' partial sums add in another order than one process's (seen: 2e-7)
LOSS_ATOL = 1e-5


def torchrun_train(folder: Path, data: Path, out: Path, *extra: str) -> list[dict]:
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        "-m", "linnet", "train", str(LLAMA), "--weights", str(folder), "--method", "full", "--data", str(data),
        "-o", str(out), "--max-steps", str(STEPS), "--batch-size", "1", "--gradient-accumulation-steps", "2",
        "--no-shuffle", "--quiet", *CLI, *extra,
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=SUBPROCESS_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow  # two processes start torch and train: about 40 s each on an idle core
@pytest.mark.parametrize("engine", ["ddp", "fsdp"])
def test_two_processes_give_the_one_process_losses(engine, tiny_llama, tmp_path):
    rows = [{"input_ids": r["prompt_ids"] + r["completion_ids"]} for r in id_rows(12)]
    data = write_jsonl(tmp_path / "lm.jsonl", rows)
    one = linnet.train(
        LLAMA, tiny_llama, data=data, method="full", output=tmp_path / "one", shuffle=False, progress=False,
        max_steps=STEPS, per_device_train_batch_size=2, gradient_accumulation_steps=2, **SCHEDULE,
    )  # fmt: skip
    two = torchrun_train(tiny_llama, data, tmp_path / "two", *(["--fsdp"] if engine == "fsdp" else []))
    assert [r["step"] for r in two] == list(range(1, STEPS + 1))  # rank 0 alone wrote its records
    for key in ("loss", "grad_norm", "num_loss_tokens", "num_tokens"):
        ours, theirs = [r[key] for r in two], [r[key] for r in one.history]
        delta = max(abs(a - b) for a, b in zip(ours, theirs))
        print(f"{engine} over 2 processes vs one, {key}: max |diff| {delta:.2e}")
        assert delta < LOSS_ATOL, (key, ours, theirs)
    from safetensors.numpy import load_file

    mine = load_file(tmp_path / "two" / "model.safetensors")
    reference = load_file(tmp_path / "one" / "model.safetensors")
    assert mine.keys() == reference.keys()
    assert max(float(np.abs(mine[k] - reference[k]).max()) for k in mine) < 1e-5


def test_rows_that_leave_a_rank_empty_are_refused(monkeypatch):
    from linnet.errors import TrainError
    from linnet.runtimes.train import torch_dp

    monkeypatch.setattr(torch_dp, "init_mesh", lambda device: None)
    monkeypatch.setattr(torch_dp.dist, "get_rank", lambda: 0)
    monkeypatch.setattr(torch_dp.dist, "get_world_size", lambda: 4)

    class Config:
        per_device_train_batch_size, gradient_accumulation_steps, shuffle, seed = 2, 1, False, 0

    class Policy:
        device = torch.device("cpu")

    with pytest.raises(TrainError, match="leave a last micro-batch of 3, fewer than the ranks"):
        torch_dp.data_parallel(Policy(), list(range(11)), Config())
