"""Training never loses its work (linnet/runtimes/train/checkpoints.py, outdir.py): `--save-steps` checkpoints laid
out as transformers' `Trainer` writes them, `--resume` giving the losses of an uninterrupted run (after a stop at
`--max-steps`, and after a real signal to a real `linnet train` process), SIGTERM/SIGHUP/SIGINT saving a checkpoint
and exiting 128 + the signal, and the output folder claimed by a lock (a second run refused before it trains, a
stale lock of a killed run taken over), on the shrunk Llama of this folder's conftest."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.runtimes.train import toy_pref
from tests.runtimes.train.conftest import LLAMA, id_rows, write_jsonl

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import linnet  # noqa: E402
from linnet.cli import main  # noqa: E402
from linnet.errors import TrainError  # noqa: E402
from linnet.runtimes.train import LoraSettings  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_torch_thread")]

LOCK = ".linnet-train.lock"
# warmup then linear decay, two micro-batches a step, LoRA dropout: the scheduler, the data position and the RNG
# state all matter to the losses after a resume (12 rows of 2 a micro-batch: an epoch is 3 steps)
SCHEDULED = ["--batch-size", "2", "--gradient-accumulation-steps", "2", "--lr", "1e-3", "--warmup-steps", "3",
             "--lora-dropout", "0.1", "--seed", "3"]  # fmt: skip
SCHEDULED_OPTIONS = dict(per_device_train_batch_size=2, gradient_accumulation_steps=2, learning_rate=1e-3,
                         warmup_steps=3, seed=3)  # fmt: skip


STARTED: list[subprocess.Popen] = []


@pytest.fixture(autouse=True)
def no_process_outlives_its_test():
    """A test that fails while a `linnet train` of 100000 steps runs kills it (by its pid) rather than leave it."""
    yield
    while STARTED:
        proc = STARTED.pop()
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=60)


def start(weights: Path, data: Path, out: Path, *args: str) -> subprocess.Popen:
    """`linnet train` on the tiny Llama as a real process (stderr piped)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "linnet", "train", str(LLAMA), "--weights", str(weights), "--data", str(data),
               "-o", str(out), "--quiet", *args]  # fmt: skip
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
    STARTED.append(proc)
    return proc


def steps_done(out: Path) -> int:
    try:
        return (out / "metrics.jsonl").read_text().count("\n")
    except FileNotFoundError:
        return 0


def wait_for(condition, proc: subprocess.Popen, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert proc.poll() is None, f"linnet train ended early ({proc.returncode}): {proc.stderr.read()}"
        assert time.monotonic() < deadline, "linnet train did not get there in time"
        time.sleep(0.005)


def finish(proc: subprocess.Popen) -> tuple[int, str]:
    _, err = proc.communicate(timeout=600)
    assert "Traceback" not in err, err
    return proc.returncode, err


def losses(out: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]


def leftovers(out: Path) -> list[str]:
    """What a run must not leave in OUT: its lock file and half-written hidden folders."""
    return [p.name for p in out.iterdir() if p.name == LOCK or p.name.endswith(".partial")]


@pytest.fixture
def data(tmp_path) -> Path:
    return write_jsonl(tmp_path / "d.jsonl", id_rows(12))


def test_checkpoints_hold_what_transformers_trainer_writes(tiny_llama, data, tmp_path):
    """A LoRA run with save_steps 2 against TRL's `SFTTrainer` on a PEFT model with save_steps 2: the same file names
    for the adapter, optimizer, scheduler, RNG and trainer state; `trainer_state.json` loads in transformers'
    `TrainerState`; `optimizer.pt`, `scheduler.pt` and `rng_state.pth` hold what transformers' files hold."""
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM, TrainerState
    from transformers.trainer_pt_utils import safe_globals

    from tests.runtimes.train.conftest import trl_sft_losses

    lora = LoraSettings(r=4, lora_alpha=8)
    result = linnet.train(LLAMA, tiny_llama, data=data, output=tmp_path / "ours", lora=lora, max_steps=3,
                          save_steps=2, per_device_train_batch_size=2, progress=False)  # fmt: skip
    base = LlamaForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32)
    peft = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    trl_sft_losses(peft, id_rows(12), dict(max_steps=3, save_steps=2, per_device_train_batch_size=2), tmp_path / "t")
    theirs = tmp_path / "t" / "checkpoint-2"

    ours = tmp_path / "ours"
    both = ["checkpoint-2", "checkpoint-3"]  # every 2 steps, and the end
    assert sorted(p.name for p in ours.iterdir() if p.name.startswith("checkpoint-")) == both
    assert sorted(p.name for p in theirs.parent.iterdir() if p.is_dir()) == both
    shared = {"adapter_config.json", "adapter_model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth",
              "trainer_state.json"}  # fmt: skip
    mine = {p.name for p in (ours / "checkpoint-2").iterdir()}
    assert shared <= mine and shared <= {p.name for p in theirs.iterdir()}
    assert mine - shared == {"train_config.json", "data_state.json"}  # training_args.bin's and the data position

    state = TrainerState.load_from_json(str(ours / "checkpoint-2" / "trainer_state.json"))
    theirs_state = TrainerState.load_from_json(str(theirs / "trainer_state.json"))
    assert (state.global_step, state.max_steps, state.save_steps, state.logging_steps) == (2, 3, 2, 1)
    assert [h["loss"] for h in state.log_history] == [r["loss"] for r in result.history[:2]]
    assert theirs_state.global_step == 2
    load = dict(map_location="cpu", weights_only=True)
    opt, their_opt = (torch.load(d / "optimizer.pt", **load) for d in (ours / "checkpoint-2", theirs))
    assert len(opt["state"]) == len(their_opt["state"]) == 8  # A and B of q_proj, v_proj in 2 layers
    assert set(opt["state"][0]) == set(their_opt["state"][0]) == {"step", "exp_avg", "exp_avg_sq"}
    assert float(opt["state"][0]["step"]) == float(their_opt["state"][0]["step"]) == 2.0
    assert set(opt["param_groups"][0]) >= {"lr", "betas", "eps", "weight_decay", "params"}
    sched, their_sched = (torch.load(d / "scheduler.pt", **load) for d in (ours / "checkpoint-2", theirs))
    assert sched["last_epoch"] == their_sched["last_epoch"] == 2 and set(sched) >= {"base_lrs", "_last_lr"}
    with safe_globals():
        rng, their_rng = (torch.load(d / "rng_state.pth", weights_only=True) for d in (ours / "checkpoint-2", theirs))
    assert set(rng) == set(their_rng) == {"python", "numpy", "cpu"}


def run_in_process(weights, data, out, backend, **options):
    lora = LoraSettings(r=4, lora_alpha=8, lora_dropout=0.1)
    return linnet.train(LLAMA, weights, data=data, output=out, backend=backend, lora=lora, progress=False,
                        lr_scheduler_type="constant", **SCHEDULED_OPTIONS, **options)  # fmt: skip


@pytest.mark.parametrize("backend", ["torch", pytest.param("jax", marks=[pytest.mark.jax, pytest.mark.slow])])
def test_resume_after_max_steps_gives_the_uninterrupted_losses(backend, tiny_llama, data, tmp_path):
    """Stop at --max-steps 5 (saving checkpoint-5), resume with --max-steps 10: steps 6-10 compute what an
    uninterrupted 10-step run computes, to the bit (constant schedule: --max-steps moves a decaying one)."""
    if backend == "jax":
        pytest.importorskip("jax")
    whole = run_in_process(tiny_llama, data, tmp_path / "whole", backend, max_steps=10)
    first = run_in_process(tiny_llama, data, tmp_path / "out", backend, max_steps=5, save_steps=5)
    assert (tmp_path / "out" / "checkpoint-5" / "trainer_state.json").is_file() and len(first.history) == 5
    resumed = run_in_process(tiny_llama, data, tmp_path / "out", backend, max_steps=10, resume=True)
    expected = [(r["step"], r["loss"], r["grad_norm"], r["learning_rate"]) for r in whole.history]
    assert [(r["step"], r["loss"], r["grad_norm"], r["learning_rate"]) for r in resumed.history] == expected
    assert losses(tmp_path / "out") == losses(tmp_path / "whole")  # metrics.jsonl: the checkpoint's steps, then 6-10
    from safetensors.numpy import load_file

    got, want = (load_file(str(tmp_path / d / "adapter_model.safetensors")) for d in ("out", "whole"))
    assert all((got[k] == want[k]).all() for k in want) and set(got) == set(want)
    assert leftovers(tmp_path / "out") == []


@pytest.mark.jax
def test_resume_on_jax_from_a_checkpoint_of_an_uninterrupted_run(tiny_llama, data, tmp_path):
    """JAX (two runs, each compiles once): a run of 8 steps saving every 4; a new run into another folder resumed
    from its checkpoint-4 gives its steps 5-8 to the bit, and its checkpoint-8 (optimizer state included)."""
    pytest.importorskip("jax")
    from safetensors.numpy import load_file

    whole = run_in_process(tiny_llama, data, tmp_path / "whole", "jax", max_steps=8, save_steps=4)
    resumed = run_in_process(tiny_llama, data, tmp_path / "out", "jax", max_steps=8, save_steps=4,
                             resume=tmp_path / "whole" / "checkpoint-4")  # fmt: skip
    assert [(r["loss"], r["grad_norm"]) for r in resumed.history] == [
        (r["loss"], r["grad_norm"]) for r in whole.history
    ]
    for name in ("optimizer.safetensors", "adapter_model.safetensors"):
        got, want = (load_file(str(tmp_path / d / "checkpoint-8" / name)) for d in ("out", "whole"))
        assert set(got) == set(want) and all((got[k] == want[k]).all() for k in want), name
    assert not (tmp_path / "out" / "checkpoint-4").exists() and leftovers(tmp_path / "out") == []
    optimizer = tmp_path / "whole" / "checkpoint-4" / "optimizer.safetensors"
    optimizer.write_bytes(optimizer.read_bytes()[:40])  # cut: safetensors' own error was a traceback
    with pytest.raises(TrainError, match=r"checkpoint-4: cannot resume from it \(SafetensorError"):
        run_in_process(tiny_llama, data, tmp_path / "again", "jax", max_steps=8, save_steps=4,
                       resume=tmp_path / "whole" / "checkpoint-4")  # fmt: skip


def resume_by_signal(backend: str, tiny_llama: Path, data: Path, tmp_path: Path) -> None:
    steps = 60
    options = [*SCHEDULED, "--backend", backend, "--max-steps", str(steps)]
    out = tmp_path / "out"
    proc = start(tiny_llama, data, out, *options, "--save-steps", "3")
    wait_for(lambda: steps_done(out) >= 5, proc)
    proc.send_signal(signal.SIGTERM)
    status, err = finish(proc)
    assert status == 128 + signal.SIGTERM, err
    stopped = steps_done(out)
    assert 5 <= stopped < steps
    assert (
        f"linnet train: interrupted by SIGTERM after step {stopped} of {steps}: saved {out}/checkpoint-{stopped}; "
        "go on with --resume" in err
    )
    state = json.loads((out / f"checkpoint-{stopped}" / "trainer_state.json").read_text())
    assert state["global_step"] == stopped and len(state["log_history"]) == stopped
    assert leftovers(out) == [] and not (out / "adapter_model.safetensors").exists()  # a checkpoint, not a result

    proc = start(tiny_llama, data, out, *options, "--resume")
    status, err = finish(proc)
    assert status == 0, err
    assert f"linnet train: resuming from {out / f'checkpoint-{stopped}'} (step {stopped} of {steps})" in err
    assert f"trained {steps} steps" in err.splitlines()[-1]
    lora = LoraSettings(r=8, lora_alpha=8, lora_dropout=0.1)
    whole = linnet.train(LLAMA, tiny_llama, data=data, backend=backend, lora=lora, max_steps=steps, progress=False,
                         **SCHEDULED_OPTIONS)  # fmt: skip
    expected = [r["loss"] for r in whole.history]
    got = losses(out)
    delta = max(abs(a - b) for a, b in zip(got, expected))
    print(f"{backend}: SIGTERM after step {stopped} of {steps}, resumed: max |loss diff| vs uninterrupted {delta:.1e}")
    assert len(got) == steps and delta < 1e-5, (got, expected)
    assert leftovers(out) == []


def test_sigterm_saves_a_checkpoint_and_resume_gives_the_uninterrupted_losses(tiny_llama, data, tmp_path):
    """A real SIGTERM to a real `linnet train` after step 5 or later of 60: exit 143, `checkpoint-K` of the step
    it finished, no lock or hidden folder left; `--resume` (the latest checkpoint of OUT) then gives every step's
    loss of an uninterrupted run (warmup and decay, accumulation, dropout, several epochs)."""
    resume_by_signal("torch", tiny_llama, data, tmp_path)


@pytest.mark.slow  # two JAX processes (each compiles) and the uninterrupted run: about 40 s
@pytest.mark.jax
def test_sigterm_and_resume_on_jax(tiny_llama, data, tmp_path):
    pytest.importorskip("jax")
    resume_by_signal("jax", tiny_llama, data, tmp_path)


@pytest.mark.parametrize("signum", [signal.SIGHUP, signal.SIGINT])
def test_sighup_and_sigint_save_a_checkpoint_and_exit_cleanly(signum, tiny_llama, data, tmp_path):
    out = tmp_path / "out"
    proc = start(tiny_llama, data, out, "--max-steps", "100000", "--batch-size", "2")
    wait_for(lambda: steps_done(out) >= 2, proc)
    proc.send_signal(signum)
    status, err = finish(proc)
    stopped = steps_done(out)
    assert status == 128 + signum, err
    name = signal.Signals(signum).name
    assert f"linnet train: {name}: saving a checkpoint after the step in progress (again: stop now)" in err
    assert f"interrupted by {name} after step {stopped} of 100000" in err
    assert sorted(p.name for p in out.iterdir()) == [f"checkpoint-{stopped}", "metrics.jsonl"]
    names = {p.name for p in (out / f"checkpoint-{stopped}").iterdir()}
    assert {"adapter_model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json"} <= names


def test_a_signal_before_the_first_step_leaves_nothing(tiny_llama, data, tmp_path):
    """SIGTERM once OUT is claimed, while the model loads: exit 143, nothing saved, OUT (which the run made) gone."""
    out = tmp_path / "out"
    proc = start(tiny_llama, data, out, "--max-steps", "5")
    wait_for(lambda: (out / LOCK).exists(), proc)
    proc.send_signal(signal.SIGTERM)
    status, err = finish(proc)
    assert status == 128 + signal.SIGTERM, err
    assert "linnet train: interrupted by SIGTERM before the first step: nothing to save" in err
    assert not out.exists()


def test_a_second_run_with_the_same_output_is_refused_before_it_trains(tiny_llama, data, tmp_path, capsys):
    """While a run trains into OUT, a second `linnet train -o OUT` exits 2 naming the first's pid, without loading
    anything or touching OUT; once the first is stopped, a new run is refused (OUT holds its checkpoint) unless it
    resumes."""
    out = tmp_path / "out"
    first = start(tiny_llama, data, out, "--max-steps", "100000", "--batch-size", "2")
    wait_for(lambda: steps_done(out) >= 1, first)
    before = sorted(p.name for p in out.iterdir())
    args = [str(LLAMA), "--weights", str(tiny_llama), "--data", str(data), "-o", str(out), "--quiet",
            "--batch-size", "2"]  # fmt: skip
    capsys.readouterr()  # the second run in this process (the lock is the first process's): `linnet train`'s main
    assert main(["train", *args, "--max-steps", "3"]) == 2
    err = capsys.readouterr().err
    print(err)
    assert err.startswith(f"linnet train: {out}: in use by another `linnet train` (pid {first.pid} on "), err
    assert "wait for it to end, or pick another -o" in err
    assert first.poll() is None and sorted(p.name for p in out.iterdir()) == before
    first.send_signal(signal.SIGTERM)
    status, err = finish(first)
    assert status == 143, err
    stopped = steps_done(out)
    assert main(["train", *args, "--max-steps", "100000"]) == 2
    err = capsys.readouterr().err
    assert f"{out}: holds checkpoint-{stopped} of an earlier run: continue it with --resume" in err
    assert main(["train", *args, "--max-steps", str(stopped + 2), "--resume"]) == 0
    assert steps_done(out) == stopped + 2 and leftovers(out) == []


def test_a_stale_lock_of_a_killed_run_is_taken_over(tiny_llama, data, tmp_path, capsys):
    """SIGKILL leaves the lock file (and maybe a half-written checkpoint folder) behind; the kernel dropped the lock,
    so `--resume` takes it over, says so, removes the hidden folder and goes on from the last checkpoint."""
    out = tmp_path / "out"
    killed = start(tiny_llama, data, out, "--max-steps", "100000", "--batch-size", "2", "--save-steps", "2")
    wait_for(lambda: (out / "checkpoint-2").exists(), killed)
    killed.send_signal(signal.SIGKILL)
    killed.communicate(timeout=60)
    assert (out / LOCK).exists()
    (out / ".checkpoint-9.abc123.partial").mkdir(exist_ok=True)  # what a kill during a checkpoint's write leaves
    last = max(int(p.name.split("-")[1]) for p in out.glob("checkpoint-*"))
    capsys.readouterr()  # the run that takes over, in this process: `linnet train`'s main
    status = main(["train", str(LLAMA), "--weights", str(tiny_llama), "--data", str(data), "-o", str(out), "--quiet",
                   "--max-steps", str(last + 1), "--batch-size", "2", "--resume"])  # fmt: skip
    err = capsys.readouterr().err
    assert status == 0 and "Traceback" not in err, err
    assert f"took over the lock of a run that ended without releasing it (pid {killed.pid} on " in err
    assert "removed .checkpoint-9.abc123.partial, left half-written by a run that was killed" in err
    assert steps_done(out) == last + 1 and leftovers(out) == []


def test_resume_refuses_what_would_not_continue_the_run(tiny_llama, data, tmp_path, capsys):
    # Each refusal below comes once the model is loaded; the same llama.linnet is analysed once in the process
    # (linnet/ir/analyses.py), and the checkpoint's config is bound and checked in each run
    out = tmp_path / "out"
    args = [str(LLAMA), "--weights", str(tiny_llama), "--data", str(data), "-o", str(out), "--quiet",
            "--batch-size", "2", "--lr", "1e-3"]  # fmt: skip

    def bad(*extra: str) -> str:
        capsys.readouterr()
        status = main(["train", *args, *extra])
        err = capsys.readouterr().err
        assert status == 2 and "Traceback" not in err and err.startswith("linnet train: "), err
        return err

    empty = tmp_path / "empty"  # made by the user: an error leaves it as it was
    empty.mkdir()
    bad_row = write_jsonl(tmp_path / "bad.jsonl", [{"prompt_ids": [3, 4]}])
    capsys.readouterr()
    assert main(["train", *args[:3], "--data", str(bad_row), "-o", str(empty), "--quiet"]) == 2
    assert empty.is_dir() and not any(empty.iterdir())
    (empty / "notes.txt").write_text("mine")
    assert "empty: already exists and is not an empty folder and holds no run's checkpoints" in bad(
        "--max-steps", "4", f"--resume={tmp_path / 'nowhere'}", "-o", str(empty)
    )
    assert "save_steps must be at least 1, got 0" in bad("--save-steps", "0")
    assert "seed must be in [0, 2^32), got 4294967296" in bad("--seed", "4294967296")  # was a numpy traceback
    assert f"{out}: no checkpoint-N folder to resume from" in bad("--resume")
    assert not out.exists()
    assert main(["train", *args, "--max-steps", "2", "--save-steps", "2"]) == 0
    err = bad("--max-steps", "4", "--lr", "2e-3", "--seed", "7", "--resume")
    assert f"{out}/checkpoint-2: was trained with other settings than this run's" in err
    assert "learning_rate: 0.001 there, 0.002 now" in err and "seed: 42 there, 7 now" in err
    write_jsonl(data, id_rows(12, seed=5))
    assert "data_sha256:" in bad("--max-steps", "4", "--resume")
    write_jsonl(data, id_rows(12))
    assert f"{out}/checkpoint-2 is at step 2: --max-steps 2 leaves nothing to train" in bad("--max-steps", "2",
                                                                                            "--resume")  # fmt: skip
    assert f"--resume {tmp_path / 'nowhere'}: no such folder" in bad("--max-steps", "4",
                                                                     f"--resume={tmp_path / 'nowhere'}")  # fmt: skip
    # files that are JSON but not what a run wrote: each a located refusal, no traceback (a user's report)
    ckpt = out / "checkpoint-2"
    originals = {name: (ckpt / name).read_text() for name in ("trainer_state.json", "data_state.json")}
    state = json.loads(originals["trainer_state.json"])
    for name, text, says in [
        ("trainer_state.json", "[]", "trainer_state.json: expected a JSON object, found list"),
        ("trainer_state.json", json.dumps({**state, "global_step": None}), "no global_step to resume from"),
        ("trainer_state.json", json.dumps({**state, "global_step": 2.7}), "no global_step to resume from"),
        ("trainer_state.json", json.dumps({**state, "log_history": []}), "one record for each of steps 1 to 2"),
        ("data_state.json", '"x"', "data_state.json: expected a JSON object, found str"),
    ]:
        (ckpt / name).write_text(text)
        assert says in bad("--max-steps", "4", "--resume"), (name, text)
        (ckpt / name).write_text(originals[name])
    weights = tiny_llama / "model.safetensors"  # rewritten in place (same path): the run would go on another model
    stat = weights.stat()
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert "the weights changed since it was saved (model.safetensors: another size or modification time)" in bad(
        "--max-steps", "4", "--resume"
    )
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    (ckpt / "optimizer.pt").write_bytes(b"not a torch file")
    assert "checkpoint-2: cannot resume from it" in bad("--max-steps", "4", "--resume")
    assert sorted(p.name for p in out.iterdir()) == [
        "adapter_config.json", "adapter_model.safetensors", "checkpoint-2", "metrics.jsonl", "train_config.json",
    ]  # fmt: skip


@pytest.fixture(scope="module")
def pref_model(tmp_path_factory):
    return toy_pref.save_tiny_llama(tmp_path_factory.mktemp("tiny_llama"))


@pytest.mark.parametrize("method", ["dpo", "grpo"])
def test_resumed_preference_runs_keep_their_reference_and_sampling_seeds(method, pref_model, tmp_path):
    """Full DPO (the reference: a frozen copy of the starting weights, not of the checkpoint's) and LoRA GRPO with a
    KL term (the reference, and the sampling seeds of each step): stopped at step 2 of 4, resumed, the losses of an
    uninterrupted run."""
    if method == "dpo":  # from an adapter that has trained (B != 0): the reference is a copy of its start
        data = write_jsonl(tmp_path / "p.jsonl", toy_pref.multiplication_preferences(4))
        kwargs = dict(method="dpo", per_device_train_batch_size=2, method_options={"beta": 0.2})
        linnet.train(LLAMA, pref_model, data=data, output=tmp_path / "start", max_steps=2, learning_rate=1e-2,
                     progress=False, **kwargs)  # fmt: skip
        kwargs["adapter"] = tmp_path / "start"
    else:
        data = write_jsonl(tmp_path / "g.jsonl", toy_pref.multiplication_prompts(2))
        kwargs = dict(method="grpo", per_device_train_batch_size=1, method_options={
            "reward": "tests.runtimes.train.toy_pref:digit_share_reward", "num_generations": 4,
            "max_completion_length": 4, "beta": 0.04, "seed": 0})  # fmt: skip
    common = dict(data=data, learning_rate=1e-2, lr_scheduler_type="constant", progress=False, **kwargs)
    whole = linnet.train(LLAMA, pref_model, max_steps=4, **common)
    linnet.train(LLAMA, pref_model, output=tmp_path / "out", max_steps=2, save_steps=2, **common)
    resumed = linnet.train(LLAMA, pref_model, output=tmp_path / "out", max_steps=4, resume=True, **common)
    assert [r["loss"] for r in resumed.history] == [r["loss"] for r in whole.history]
    assert len({r["loss"] for r in whole.history}) > 1


def test_full_fine_tuning_checkpoints_hold_model_safetensors_and_resume(tiny_llama, tmp_path):
    """--method full: `checkpoint-K/model.safetensors` holds every parameter under transformers' names (it loads
    into `LlamaForCausalLM` with `strict=True`, as a Trainer checkpoint's does); a run resumed from the checkpoint-2
    of a 4-step run gives that run's steps 3 and 4 (linear decay, so the same --max-steps)."""
    from safetensors.torch import load_file
    from transformers import LlamaForCausalLM

    rows = [{"input_ids": r["prompt_ids"] + r["completion_ids"]} for r in id_rows(8, seed=1)]
    data = write_jsonl(tmp_path / "lm.jsonl", rows)
    common = dict(data=data, method="full", per_device_train_batch_size=2, learning_rate=1e-3, progress=False,
                  max_steps=4, save_steps=2)  # fmt: skip
    whole = linnet.train(LLAMA, tiny_llama, output=tmp_path / "whole", **common)
    resumed = linnet.train(
        LLAMA, tiny_llama, output=tmp_path / "out", resume=tmp_path / "whole" / "checkpoint-2", **common
    )
    assert [r["loss"] for r in resumed.history] == [r["loss"] for r in whole.history]
    assert resumed.history[2]["loss"] != resumed.history[0]["loss"]

    checkpoint = tmp_path / "whole" / "checkpoint-2"
    names = {p.name for p in checkpoint.iterdir()}
    assert "model.safetensors" in names and "adapter_model.safetensors" not in names
    model = LlamaForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32)
    state = load_file(str(checkpoint / "model.safetensors"))
    model.load_state_dict(state, strict=True)
    assert set(state) == set(model.state_dict())
