"""Tensor-parallel inference of a decoder on two ranks gives the one-process tokens: PyTorch under torchrun
(gloo, DTensor) and JAX on a 2-device mesh (GSPMD), on a seeded 2-layer Llama (4 query heads, 2 key/value
heads) saved with `save_pretrained`. Each run is a subprocess (torchrun's processes; JAX's forced device count
must be set before JAX starts). Also checked: each rank holds half of every split weight and KV cache, and one
`forward` runs exactly two all-reduces a layer (Megatron's split, no all-gathers); plans that do not fit are
refused with a clear error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.runtimes.conftest import LLAMA, LOGITS_ATOL, hf_greedy, linnet_greedy

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_torch_thread")]

WORKER = Path(__file__).with_name("tp_worker.py")
ROOT = Path(__file__).parents[3]
# a bound, not a timing: on a machine shared by many test runs, importing torch alone has taken 80 s
SUBPROCESS_TIMEOUT_S = 900
PROMPT = [3, 5, 7, 9]
TOKENS = 12
LAYERS = 2
HEADS, KV_HEADS, HEAD_DIM, HIDDEN, INTERMEDIATE = 4, 2, 16, 64, 128


@pytest.fixture(scope="module")
def small_llama(tmp_path_factory):
    """(folder, transformers model) of a seeded 2-layer Llama whose heads split evenly over two ranks."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=256,
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        max_position_embeddings=128,
        rope_theta=100.0,
        rms_norm_eps=1e-5,
        initializer_range=0.1,
        bos_token_id=0,
        eos_token_id=1,
    )
    model = LlamaForCausalLM(config).eval()
    folder = tmp_path_factory.mktemp("tp_llama")
    model.save_pretrained(folder)
    return folder, model


@pytest.fixture(scope="module")
def one_process(small_llama):
    """(greedy tokens, forward logits) of the one-process torch backend, checked against transformers."""
    import linnet.torch as lt

    folder, hf = small_llama
    model = lt.load(LLAMA, weights=folder, max_positions=64, progress=False)
    tokens = linnet_greedy(model, PROMPT, TOKENS)
    assert tokens == hf_greedy(hf, PROMPT, TOKENS)
    return tokens, model.forward(np.array([PROMPT]))


def run_worker(backend: str, folder: Path) -> dict:
    args = [str(WORKER), backend, str(LLAMA), str(folder), ",".join(map(str, PROMPT)), str(TOKENS)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    if backend == "torch":
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *args]
    else:
        cmd = [sys.executable, *args]
        env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
        env["JAX_PLATFORMS"] = "cpu"
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=SUBPROCESS_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1, proc.stdout  # rank 0 alone prints
    return json.loads(lines[0])


# Three processes start torch or jax (10-35 s). Torch runs in the default suite: while it was marked slow,
# prefill through F.scaled_dot_product_attention broke it (no DTensor strategy for the CPU kernel) unseen.
@pytest.mark.parametrize("backend", ["torch", pytest.param("jax", marks=[pytest.mark.jax, pytest.mark.slow])])
def test_two_ranks_give_the_one_process_tokens(backend, small_llama, one_process):
    pytest.importorskip(backend)
    folder, _ = small_llama
    tokens, logits = one_process
    got = run_worker(backend, folder)
    assert got["ranks"] == 2
    assert got["tokens"] == tokens
    assert np.abs(np.array(got["logits"]) - logits).max() < LOGITS_ATOL
    # Megatron's split: q/k/v and gate/up by rows, o_proj and down_proj by columns, caches by heads.
    shards = got["shards"]
    layer = "model.layers.0."
    assert shards[layer + "self_attn.q_proj.weight"] == [HEADS * HEAD_DIM // 2, HIDDEN]
    assert shards[layer + "self_attn.k_proj.weight"] == [KV_HEADS * HEAD_DIM // 2, HIDDEN]
    assert shards[layer + "self_attn.o_proj.weight"] == [HIDDEN, HEADS * HEAD_DIM // 2]
    assert shards[layer + "mlp.up_proj.weight"] == [INTERMEDIATE // 2, HIDDEN]
    assert shards[layer + "mlp.down_proj.weight"] == [HIDDEN, INTERMEDIATE // 2]
    assert shards[layer + "input_layernorm.weight"] == [HIDDEN]
    assert shards["model.embed_tokens.weight"] == [256, HIDDEN]
    cache = shards[layer + "self_attn.k_cache"]
    assert cache[0 if backend == "jax" else 1] == KV_HEADS // 2  # max_batch 1: [H, T, D] on jax
    # the residual stream is all-reduced after o_proj and down_proj, and nothing is gathered
    collectives = {op.replace("-", "_"): n for op, n in got["collectives"].items()}
    assert collectives.get("all_reduce") == 2 * LAYERS
    assert not collectives.get("all_gather")


def test_a_plan_that_does_not_fit_is_refused(small_llama):
    from linnet.errors import BackendError
    from linnet.runtimes.parallel.plan import check_plan

    folder, hf = small_llama
    names = [n for n, _ in hf.named_parameters()]
    with pytest.raises(BackendError, match="`num_key_value_heads` = 2 does not divide by 4"):
        check_plan(names, hf.config.to_dict(), 4)
    with pytest.raises(BackendError, match="matches no parameter"):
        check_plan(["encoder.layer.0.attention.self.query.weight"], {}, 2)


def test_torch_outside_torchrun_says_how_to_start(monkeypatch):
    from linnet.errors import BackendError
    from linnet.runtimes.parallel.torch_tp import init_mesh

    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(BackendError, match="runs under torchrun"):
        init_mesh("cpu")


@pytest.mark.slow  # torchrun starts two processes that load torch
def test_generate_tensor_parallel_under_torchrun(small_llama, one_process):
    """The documented form: `torchrun --nproc-per-node 2 -m linnet generate ... --tensor-parallel`; rank 0 alone
    prints the ids."""
    folder, _ = small_llama
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        "-m", "linnet", "generate", str(LLAMA), "--weights", str(folder), "--tensor-parallel", "--print-ids",
        "--prompt-ids", ",".join(map(str, PROMPT)), "--max-new-tokens", str(TOKENS), "--max-positions", "64",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=SUBPROCESS_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-4000:]
    printed = [line for line in proc.stdout.splitlines() if line and line[0].isdigit()]
    assert printed == [",".join(map(str, one_process[0]))]


def test_no_rank_tears_the_process_group_down_while_another_still_works(tmp_path):
    """The teardown race behind "terminate called without an active exception" (rank 1 aborted once in 46 runs of
    the two-rank test): each rank destroyed the process group at exit as soon as it was done, so rank 0 closed
    gloo's connections while rank 1 still worked. Now the exit teardown meets the other ranks at a barrier first:
    rank 0 leaves only once rank 1 is done too, and both exit 0."""
    from tests.runtimes.parallel.teardown_worker import DELAY_S

    worker = Path(__file__).with_name("teardown_worker.py")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(worker)]
    proc = subprocess.run([*cmd, str(tmp_path)], capture_output=True, text=True, env=env, timeout=SUBPROCESS_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[1]["done"] - ranks[0]["done"] > DELAY_S / 2  # rank 1 was still working when rank 0 was done
    assert ranks[0]["left"] >= ranks[1]["done"], ranks  # and rank 0 waited for it before tearing down
