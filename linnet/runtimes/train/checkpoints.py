"""Training checkpoints as transformers' `Trainer` (and so TRL's trainers) lays them out, and resuming from one.

`--save-steps N` writes `OUT/checkpoint-K/` after every optimizer step K that is a multiple of N and after the last
step (transformers' `save_strategy="steps"`, which also saves at the end); a stopping signal writes one after the
step in progress (`outdir.StopSignals`). Each is written into a hidden `OUT/.checkpoint-K.*.partial` folder,
fsynced, and renamed to `checkpoint-K` (a `checkpoint-K` already there, from a run resumed from an earlier
checkpoint, is replaced), so a `checkpoint-K` folder is always complete. It holds:

- the trained parameters: `adapter_model.safetensors` and `adapter_config.json` (LoRA, PEFT's format), or
  `model.safetensors` (every trained parameter by checkpoint name, f32), on every backend;
- the optimizer: `optimizer.pt`, `torch.optim.AdamW.state_dict()` (`torch.save`); on JAX `optimizer.safetensors`,
  the optax state's leaves by tree path (`jax.tree_util.keystr`: `[1].inner_state[0].mu['...lora_A.weight']`);
- the scheduler: `scheduler.pt`, the `LambdaLR` `state_dict()`; on JAX `scheduler.json`, its `last_epoch` (steps
  taken) and `base_lrs` and the schedule;
- the RNG states: `rng_state.pth`, the python, numpy, torch CPU (and CUDA) generators under transformers' keys; on
  JAX `rng_state.json`, the dropout key (each micro-batch's key is drawn from it, the step and its index);
- the progress: `trainer_state.json`, transformers' `TrainerState` fields (`global_step`, `epoch`, `log_history`
  with every step's record, `max_steps`, `save_steps`, ...), which `TrainerState.load_from_json` reads;
- the data position: `data_state.json`, the micro-batches consumed, the epoch, the rows, the data's sha256;
- the settings: `train_config.json`, the run's `TrainConfig`, source, weights, data and backend (transformers
  pickles its `TrainingArguments` into `training_args.bin`).

Resuming (`--resume [DIR]`): DIR a `checkpoint-K` folder, or a run folder whose latest `checkpoint-K` is taken
(transformers' `get_last_checkpoint`); without DIR, the latest in `OUT`. The run's settings must be the
checkpoint's (every `TrainConfig` field, the same data and source by sha256, the same weights and backend kind),
except `max_steps` and `save_steps`; the model loads from its weights as a new run does (and builds what the
objective needs from the start, DPO's reference), then the checkpoint's trained values, optimizer and scheduler
state, RNG states and data position (K · accumulation micro-batches skipped) are restored, so steps K + 1, ...
compute what an uninterrupted run computes. `metrics.jsonl` is rewritten from the checkpoint's `log_history`
before the first new step.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from linnet.errors import TrainError

from .outdir import StopSignals, checkpoint_dirs, fsync_tree

__all__ = ["Checkpointer", "resolve_resume", "check_resumable", "read_checkpoint", "RESUMABLE_CHANGES"]

TRAINER_STATE = "trainer_state.json"
DATA_STATE = "data_state.json"
TRAIN_CONFIG = "train_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
MODEL_WEIGHTS = "model.safetensors"
PEFT_PREFIX = "base_model.model."
# the settings a resumed run may change: how far it goes and how often it saves
RESUMABLE_CHANGES = ("max_steps", "save_steps")
# what names the run's inputs in train_config.json; resuming compares their contents (`identity`) instead
LOCATIONS = ("source", "data", "weights", "adapter")


def resolve_resume(resume: str | Path | bool, output: Path | None) -> Path:
    """The checkpoint folder `--resume` names: `resume` True takes the latest `checkpoint-K` of `output`; a path is
    a `checkpoint-K` folder or a folder holding some (the latest is taken). Raises TrainError when there is none."""
    if resume is True:
        if output is None:
            raise TrainError("--resume without DIR takes the latest checkpoint of -o OUT: give -o (or --resume DIR)")
        where = output
    else:
        where = Path(resume)
        if (where / TRAINER_STATE).is_file():
            return where
        if not where.is_dir():
            raise TrainError(f"--resume {where}: no such folder")
    found = checkpoint_dirs(where)
    if not found:
        raise TrainError(f"{where}: no checkpoint-N folder to resume from (a run writes them with --save-steps N, "
                         "or when a signal stops it)")  # fmt: skip
    return found[-1]


def _read_json(path: Path) -> dict[str, Any]:
    """The JSON object in `path`. Raises TrainError for a missing file, one that is not JSON, or not an object."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise TrainError(f"{path.parent}: not a complete checkpoint (no {path.name})") from None
    except (OSError, ValueError) as err:
        raise TrainError(f"{path}: cannot read it ({err})") from None
    if not isinstance(value, dict):
        raise TrainError(f"{path}: expected a JSON object, found {type(value).__name__}: not a checkpoint's file")
    return value


def _history(state: dict[str, Any], step: int, path: Path) -> list[dict[str, Any]]:
    """`log_history`'s records of steps 1..`step`, one a step as a run writes them. Raises TrainError when a step's
    record is missing (the restored metrics.jsonl would lose it) or a record is not an object with an integer
    `step`."""
    records = state.get("log_history")
    if not isinstance(records, list) or not all(
        isinstance(r, dict) and isinstance(r.get("step"), int) and not isinstance(r.get("step"), bool) for r in records
    ):
        raise TrainError(f"{path}: log_history must be a list of objects with an integer step")
    kept = [dict(r) for r in records if r["step"] <= step]
    if [r["step"] for r in kept] != list(range(1, step + 1)):
        raise TrainError(f"{path}: log_history does not hold one record for each of steps 1 to {step}")
    return kept


def _jsonable(value: Any) -> Any:
    from .run import _callable_name

    return json.loads(json.dumps(value, default=_callable_name))


def weights_files(weights: Any) -> dict[str, list[int]] | None:
    """Each file of the checkpoint `weights` (a file, or the files of a folder) by name: [size in bytes, modification
    time in ns], what a resume compares to know the weights are the ones it was trained from (hashing gigabytes at
    every start would cost more than the check is worth). None for weights that are not a path (an embedded id)."""
    path = Path(str(weights)) if weights is not None else None
    if path is None or not path.exists():
        return None
    if path.is_file():
        files = [path]
    else:
        files = sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith("."))
    return {p.name: [p.stat().st_size, p.stat().st_mtime_ns] for p in files}


def check_resumable(checkpoint: Path, record: dict[str, Any]) -> int:
    """The step `checkpoint` holds, once its `train_config.json` is found to describe this run's `record`
    (train_config.json's content): every field the same but `RESUMABLE_CHANGES` and the inputs' locations
    (`LOCATIONS`: their contents are compared instead, by `data_sha256`, `source_sha256`, `weights_path` and
    `weights_files`). Raises
    TrainError naming each difference, or when the checkpoint's step leaves nothing to train under this run's
    `max_steps`."""
    saved = _read_json(checkpoint / TRAIN_CONFIG)
    state = _read_json(checkpoint / TRAINER_STATE)
    now = _jsonable(record)
    skip = set(RESUMABLE_CHANGES) | set(LOCATIONS) | {"weights_files"}
    if saved.get("weights_files") != now.get("weights_files"):
        before, after = saved.get("weights_files") or {}, now.get("weights_files") or {}
        changed = sorted(n for n in set(before) | set(after) if before.get(n) != after.get(n))
        raise TrainError(f"{checkpoint}: the weights changed since it was saved ({', '.join(changed[:4]) or 'files'}: "
                         "another size or modification time): resume from the weights it was trained from")  # fmt: skip
    diffs = [k for k in sorted(set(saved) | set(now)) if k not in skip and saved.get(k) != now.get(k)]
    if diffs:
        lines = [f"  {k}: {json.dumps(saved.get(k))} there, {json.dumps(now.get(k))} now" for k in diffs]
        raise TrainError(f"{checkpoint}: was trained with other settings than this run's; resume with the same ones "
                         "(only --max-steps and --save-steps may change):\n" + "\n".join(lines))  # fmt: skip
    step = state.get("global_step")
    if not isinstance(step, int) or isinstance(step, bool) or not 0 < step:
        raise TrainError(f"{checkpoint / TRAINER_STATE}: no global_step to resume from")
    if step >= now["max_steps"]:
        raise TrainError(f"{checkpoint} is at step {step}: --max-steps {now['max_steps']} leaves nothing to train "
                         "(give more steps to go on)")  # fmt: skip
    return step


def read_checkpoint(checkpoint: Path, trainable: list[str]) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The trained values a checkpoint holds, by the model's parameter paths (`trainable`, every one found and no
    other), and its `trainer_state.json`. Raises TrainError for a missing, truncated or mismatched file."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    adapter = (checkpoint / ADAPTER_WEIGHTS).is_file()
    path = checkpoint / (ADAPTER_WEIGHTS if adapter else MODEL_WEIGHTS)
    try:
        tensors = load_file(str(path))
    except FileNotFoundError:
        raise TrainError(f"{checkpoint}: not a complete checkpoint (no {ADAPTER_WEIGHTS} or {MODEL_WEIGHTS})") from None
    except (OSError, SafetensorError, ValueError) as err:
        raise TrainError(f"{path}: cannot read it ({err})") from None
    arrays = {k.removeprefix(PEFT_PREFIX) if adapter else k: v for k, v in tensors.items()}
    missing = [p for p in trainable if p not in arrays]
    extra = [p for p in arrays if p not in set(trainable)]
    if missing or extra:
        missing_s, extra_s = ", ".join(missing[:4]) or "none", ", ".join(extra[:4]) or "none"
        raise TrainError(f"{path}: holds other parameters than this run trains (missing: {missing_s}; not trained "
                         f"here: {extra_s})")  # fmt: skip
    bad = [p for p, a in arrays.items() if not np.isfinite(a).all()]
    if bad:
        raise TrainError(f"{path}: {bad[0]} holds NaN or inf")
    return arrays, _read_json(checkpoint / TRAINER_STATE)


class Checkpointer:
    """The step hook that saves checkpoints into `folder` (None: a run without an output folder saves none) and
    stops the run on a signal, and the run's whole history (restored steps first).

    Args:
        folder: `OUT`; cfg: the run's `TrainConfig`; record: train_config.json's content; model: the loaded model
        (LoRA adapters in `model.lora`); rows: the token rows' count (for the epoch); stop: the run's signals."""

    def __init__(self, folder: Path | None, cfg: Any, record: dict, model: Any, rows: int, stop: StopSignals):
        self.folder, self.cfg, self.record, self.model, self.rows, self.stop = folder, cfg, record, model, rows, stop
        self.trainer: Any = None
        self.history: list[dict[str, Any]] = []
        self.saved: Path | None = None  # the last checkpoint written (or resumed from)
        self.saved_step = 0

    def micro_batches(self, step: int) -> int:
        return step * self.cfg.gradient_accumulation_steps

    def epoch(self, step: int) -> float:
        per_epoch = -(-self.rows // self.cfg.per_device_train_batch_size)
        return self.micro_batches(step) / max(1, per_epoch)

    def restore(self, checkpoint: Path, step: int) -> None:
        """Bind the checkpoint's trained values and state into the trainer (`trainer.load_state`), and take its
        history. Raises TrainError for a file that cannot be read."""
        arrays, state = read_checkpoint(checkpoint, list(self.trainer.policy.trainable))
        data = _read_json(checkpoint / DATA_STATE)
        if data.get("micro_batches_consumed") != self.micro_batches(step):
            raise TrainError(f"{checkpoint / DATA_STATE}: {data.get('micro_batches_consumed')} micro-batches consumed "
                             f"do not make {step} steps of {self.cfg.gradient_accumulation_steps}")  # fmt: skip
        history = _history(state, step, checkpoint / TRAINER_STATE)
        from safetensors import SafetensorError

        unreadable = (OSError, RuntimeError, ValueError, KeyError, TypeError, AttributeError, EOFError, SafetensorError)
        try:
            self.trainer.load_state(checkpoint, step, arrays)
        except (*unreadable, pickle.UnpicklingError) as err:
            raise TrainError(f"{checkpoint}: cannot resume from it ({type(err).__name__}: {err})") from None
        self.history = history
        self.saved, self.saved_step = checkpoint, step

    def on_step(self, record: dict[str, Any]) -> None:
        """After each optimizer step: keep its record, save a checkpoint when one is due, stop on a signal."""
        from linnet.errors import TrainInterrupted

        self.history.append(record)
        step = record["step"]
        every = self.cfg.save_steps
        stopping = bool(self.stop.signum) and step < self.cfg.max_steps  # after the last step, the result is written
        # a record fetched after the next step was queued (JAX's `deliver_now` came too late): stop at the next one,
        # whose values the trainer then holds
        stopping = stopping and getattr(self.trainer, "state_step", step) == step
        if self.folder is not None and ((every and (step % every == 0 or step == self.cfg.max_steps)) or stopping):
            self.save(step)
        if stopping:
            saved = self.saved_step == step
            where = f"saved {self.saved}; go on with --resume" if saved else "no output folder to save it in"
            raise TrainInterrupted(
                f"interrupted by {self.stop.name()} after step {step} of {self.cfg.max_steps}: {where}",
                signum=self.stop.signum, step=step, checkpoint=self.saved if saved else None,
            )  # fmt: skip

    def save(self, step: int) -> Path:
        """Write `checkpoint-{step}` atomically (see the module docstring) and return it."""
        tmp = Path(tempfile.mkdtemp(prefix=f".checkpoint-{step}.", suffix=".partial", dir=self.folder))
        try:
            self._write_parameters(tmp)
            self.trainer.save_state(tmp, step)
            self._write_json(tmp / TRAINER_STATE, self._trainer_state(step))
            data = {"micro_batches_consumed": self.micro_batches(step), "epoch": self.epoch(step), "rows": self.rows,
                    "data": self.record.get("data"), "data_sha256": self.record.get("data_sha256")}  # fmt: skip
            self._write_json(tmp / DATA_STATE, data)
            self._write_json(tmp / TRAIN_CONFIG, _jsonable(self.record))
            fsync_tree(tmp)
            final = self.folder / f"checkpoint-{step}"
            _replace_folder(tmp, final)
        except OSError as err:  # a full disk, a folder gone: the run stops, its earlier checkpoints kept
            shutil.rmtree(tmp, ignore_errors=True)
            raise TrainError(f"{self.folder}: cannot write checkpoint-{step} ({err})") from None
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self.saved, self.saved_step = final, step
        return final

    def _write_parameters(self, folder: Path) -> None:
        from safetensors.numpy import save_file

        if getattr(self.model, "lora", None) is not None:
            from .lora import save_adapter

            commit = getattr(self.trainer.policy, "commit", None)  # JAX: the trained values into the model
            if commit is not None:
                commit()
            save_adapter(self.model, folder, self.cfg.lora, base_model=self.record.get("weights"))
            return
        arrays = {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in self.trainer.trained_arrays().items()}
        save_file(arrays, str(folder / MODEL_WEIGHTS), metadata={"format": "pt"})

    def _trainer_state(self, step: int) -> dict[str, Any]:
        """transformers' `TrainerState` fields (trainer_callback.py), so `TrainerState.load_from_json` reads it."""
        history = [r for r in self.history if r["step"] <= step]
        return {
            "best_global_step": None, "best_metric": None, "best_model_checkpoint": None,
            "epoch": self.epoch(step), "eval_steps": None, "global_step": step, "is_hyper_param_search": False,
            "is_local_process_zero": True, "is_world_process_zero": True, "log_history": history,
            "logging_steps": 1, "max_steps": self.cfg.max_steps,
            "num_input_tokens_seen": int(sum(r.get("num_tokens", 0) for r in history)),
            "num_train_epochs": int(-(-self.epoch(self.cfg.max_steps) // 1)), "save_steps": self.cfg.save_steps or 0,
            "stateful_callbacks": {}, "total_flos": 0.0, "train_batch_size": self.cfg.per_device_train_batch_size,
            "trial_name": None, "trial_params": None,
        }  # fmt: skip

    @staticmethod
    def _write_json(path: Path, value: Any) -> None:
        path.write_text(json.dumps(value, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _replace_folder(tmp: Path, final: Path) -> None:
    """Rename the complete `tmp` to `final`; a `final` already there (an earlier run's checkpoint of the same step)
    is moved aside first and removed once the new one is in place."""
    old = None
    if final.exists():
        old = final.with_name(f".{final.name}.{os.getpid()}.old.partial")
        os.replace(final, old)
    os.replace(tmp, final)
    fd = os.open(final.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
