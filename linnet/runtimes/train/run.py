"""`linnet.train(...)` and `linnet train`: claim the output folder, load a model, read the data, train (with
checkpoints, resumable), write the result.

`output` is claimed before anything loads (`outdir.claim_output`: created, locked; a second run with the same
folder is refused, and so is a folder that holds files, unless the run resumes from its checkpoints). While the
run trains, `checkpoint-N` folders appear in it (`checkpoints`: `--save-steps`, and on SIGTERM, SIGHUP or
SIGINT, which stop the run after the step in progress); `metrics.jsonl` grows a line a step. At the end the result
is written into a hidden `.result.*.partial` folder inside `output` and its files moved into place. An error, or a
signal before the first step, leaves `output` as it was (but for checkpoints already written). What the result
holds:
- `metrics.jsonl`: one JSON object per optimizer step (`Trainer`'s records);
- `train_config.json`: the `TrainConfig` of the run, with the source, weights, data and backend;
- full fine-tuning: the model as a Hugging Face folder (`export_hf`: config.json, model.safetensors,
  tokenizer), which transformers and Linnet load;
- LoRA: the adapters in PEFT's format (`adapter_config.json`, `adapter_model.safetensors`), which
  `PeftModel.from_pretrained(base, output)` and `lora.load_with_adapters(..., adapter=output)` load; with
  `save_merged`, also `merged/`: the adapters merged into the base as a Hugging Face folder.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from linnet.errors import LoadError, TrainError, TrainInterrupted

from .checkpoints import Checkpointer, check_resumable, resolve_resume
from .config import LoraSettings, TrainConfig
from .data import read_jsonl
from .objectives import objective_for
from .outdir import Interrupt, OutputClaim, StopSignals, checkpoint_dirs, claim_output

__all__ = ["train", "TrainResult", "load_for_training", "check_trains"]


@dataclass
class TrainResult:
    """What `train` returns: `history` the per-step records, `model` the trained `TorchModel` (adapters in
    place for LoRA), `output` the folder written (or None)."""

    history: list[dict[str, Any]]
    model: Any
    output: Path | None = None
    notes: list[str] = field(default_factory=list)


def load_for_training(
    source: str | Path,
    weights: str | Path | None,
    *,
    backend: str = "torch",
    lora: LoraSettings | None = None,
    adapter: str | Path | None = None,
    preset: str | None = None,
    config: dict[str, Any] | None = None,
    seed: int = 42,
    progress: bool = False,
    max_batch: int = 1,
    device: str = "cpu",
    dtype: str = "f32",
):
    """Load `source` with `weights` on `backend` (one that trains) in `dtype` (f32; bf16 for JAX's mixed
    precision, `jax_trainer`) on `device`, with LoRA adapters when `lora` is given (fresh, or read from the PEFT
    folder `adapter`), and `max_batch` KV-cache rows (for GRPO's sampling).
    Returns (the `TorchModel`, the checkpoint paths to train).
    Raises TrainError, LoadError, BackendError."""
    from ..backends import get_backend

    check_trains(backend)
    if lora is None and adapter is None:
        b = get_backend(backend)
        trainer = b.trainer_module()
        model = b.load(
            source, weights, preset=preset, config=config, dtype=dtype, max_batch=max_batch, device=device,
            progress=progress, **trainer.LOAD_OPTIONS,
        )  # fmt: skip
        return model, trainer.trainable_paths(model)
    from .lora import load_with_adapters

    return load_with_adapters(
        source, weights, lora, adapter=adapter, backend=backend, preset=preset, config=config, seed=seed,
        progress=progress, max_batch=max_batch, device=device, dtype=dtype,
    )  # fmt: skip


def in_torchrun() -> bool:
    """Whether this process is one of several started by torchrun (WORLD_SIZE > 1)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def check_trains(backend: str) -> None:
    """Refuse a backend that cannot train (the registry's `can_train`). Raises TrainError naming those that can."""
    from ..backends import BACKENDS, get_backend

    b = get_backend(backend)
    if not b.can_train:
        can = ", ".join(name for name, x in BACKENDS.items() if x.can_train)
        raise TrainError(f"backend {b.name} does not train ({b.label} runs inference only); backends that train: {can}")


def _check_backend_trains(backend: str, method: str) -> None:
    """Refuse, before the output folder is claimed, the model loaded or any progress drawn, a backend that does not
    train or does not train `method` (its trainer module's `check_method`: JAX and GRPO). Raises TrainError."""
    from ..backends import get_backend

    check_trains(backend)
    check_method = getattr(get_backend(backend).trainer_module(), "check_method", None)
    if check_method is not None:
        check_method(method)


def train(
    source: str | Path,
    weights: str | Path | None = None,
    *,
    data: str | Path,
    output: str | Path | None = None,
    method: str = "sft",
    backend: str = "torch",
    lora: LoraSettings | None = None,
    adapter: str | Path | None = None,
    preset: str | None = None,
    config: dict[str, Any] | None = None,
    progress: bool = True,
    save_merged: bool = False,
    device: str = "cpu",
    resume: str | Path | bool | None = None,
    **options: Any,
) -> TrainResult:
    """Train `source` with `weights` on the JSONL `data` by `method` and write the result to `output`.

    Args:
        source, weights, preset, config: as `linnet.load` takes them (the model is loaded in f32).
        data: a JSONL file of rows in the method's shape (`linnet.runtimes.train.data`).
        output: the folder to write, claimed for the run (`outdir.claim_output`: it must not exist, be empty, or,
            with `resume`, hold the run's checkpoints); None writes nothing.
        method: `sft` (LoRA adapters, PEFT's defaults unless `lora` says otherwise), `full` (every parameter),
            or a registered method (`dpo`, `grpo`).
        backend: a backend whose registry record `can_train` (`torch`, `torch-interpret`, `jax`: under
            `jax.grad` with optax, `jax_trainer`).
        device: where the model and the training run (`cpu`, `cuda`, `cuda:1`; `tpu` on the `jax` backend).
        lora: LoRA settings for `sft` (None: `LoraSettings()`, r=8, lora_alpha=8, q_proj and v_proj).
        adapter: a PEFT adapter folder to start from (training goes on from its weights).
        progress: a progress bar on stderr (loss, tokens/s, ETA).
        save_merged: with LoRA, also write the adapters merged into the base as a Hugging Face folder,
            `output/merged` (`lora.export_merged`).
        resume: continue from a checkpoint (`checkpoints.resolve_resume`): True the latest `checkpoint-N` of
            `output`, or a `checkpoint-N` folder or a run folder; the run's settings must be the checkpoint's but
            `max_steps` and `save_steps`. `history` then holds the checkpoint's steps too.
        options: `TrainConfig` fields (`max_steps`, `learning_rate`, `gradient_accumulation_steps`, `save_steps`,
            ...).

    Returns a `TrainResult`. Raises TrainError (bad data row: file:line and field; a LoRA target pattern that
    matches nothing; an output folder in use or that exists; a checkpoint of other settings), LoadError,
    BackendError; on error `output` is left as it was, but for the checkpoints written. With an `output`, SIGTERM,
    SIGHUP and SIGINT save a checkpoint after the step in progress and raise TrainInterrupted.
    """
    unknown = sorted(set(options) - set(TrainConfig.__dataclass_fields__))
    if unknown:
        raise TrainError(f"unknown training option {', '.join(unknown)}")
    if method == "full" and (lora is not None or adapter is not None or save_merged):
        raise TrainError("--method full trains every parameter: it takes no LoRA options (use --method sft)")
    if method != "full" and lora is None:
        lora = LoraSettings()
    cfg = TrainConfig(method=method, lora=lora if method != "full" else None, **options)
    cfg.check()
    objective = objective_for(cfg.method, **cfg.method_options)  # an unknown method, a bad option: refused here
    _check_backend_trains(backend, objective.name)
    if cfg.fsdp and not in_torchrun():
        raise TrainError("--fsdp shards across the processes torchrun starts, and this is one process: run it under "
                         "torchrun (docs/distributed.md) or drop --fsdp")  # fmt: skip
    if in_torchrun() and (cfg.save_steps or resume):
        raise TrainError("checkpoints (--save-steps, --resume) are written and read by one process: under torchrun, "
                         "train without them")  # fmt: skip
    writes = output is not None and os.environ.get("RANK", "0") == "0"  # under torchrun, rank 0 writes
    stop = StopSignals(enabled=writes)  # before the claim: a signal never finds OUT claimed and no handler
    claims: list[OutputClaim] = []
    savers: list[Checkpointer] = []
    finished = False
    try:
        with stop:
            claim = claim_output(output, resuming=bool(resume)) if writes else None
            claims += [claim] if claim is not None else []
            for note in claim.notes if claim is not None else []:
                print(f"linnet train: {note}", file=sys.stderr)
            inputs = dict(source=source, weights=weights, data=data, backend=backend, adapter=adapter, preset=preset,
                          config=config, progress=progress, device=device)  # fmt: skip
            result = _train_claimed(cfg, objective, inputs, claim, stop, resume, output, save_merged, savers)
            finished = True
            return result
    except Interrupt as sig:
        raise _interrupted(sig.signum, savers[0] if savers else None) from None
    finally:
        for claim in claims:
            claim.release(keep=finished or bool(checkpoint_dirs(claim.path)))


def _train_claimed(
    cfg: TrainConfig, objective: Any, inputs: dict[str, Any], claim: OutputClaim | None, stop: StopSignals,
    resume: Any, output: str | Path | None, save_merged: bool, savers: list,
) -> TrainResult:  # fmt: skip
    """`train` once `output` is claimed (`claim`, None when this process writes nothing): read, load, restore a
    checkpoint when resuming, train `objective` (`cfg.method`'s) with checkpoints, write the result."""
    from ..backends import get_backend

    source, weights, backend = inputs["source"], inputs["weights"], inputs["backend"]
    target = claim.path if claim is not None else None
    checkpoint = resolve_resume(resume, Path(output) if output is not None else None) if resume else None
    rows = read_jsonl(inputs["data"])
    trainer_module = get_backend(backend).trainer_module() if get_backend(backend).can_train else None
    if trainer_module is not None and trainer_module.DATA_PARALLEL:  # PyTorch's trainers (JAX trains without torch)
        import torch

        torch.manual_seed(cfg.seed)
    try:
        rows_sampled = getattr(objective, "generation_rows", None)  # GRPO samples a micro-batch's completions at once
        model, trainable = load_for_training(
            source, weights, backend=backend, lora=cfg.lora, adapter=inputs["adapter"], preset=inputs["preset"],
            config=inputs["config"], seed=cfg.seed, progress=inputs["progress"],
            max_batch=rows_sampled(cfg) if rows_sampled else 1, device=inputs["device"],
            dtype=getattr(trainer_module, "load_dtype", lambda cfg: "f32")(cfg),
        )  # fmt: skip
    except LoadError as err:
        other = _other_family(source, weights)
        if other is not None:
            raise TrainError(f"{other}:\n{err}") from err
        raise
    if getattr(model, "lora", None) is not None:
        cfg.lora = model.lora.settings  # an --adapter's own r, alpha and targets
    record = _run_record(cfg, inputs)
    step = check_resumable(checkpoint, record) if checkpoint is not None else 0
    policy, trainer_class = trainer_module.policy_and_trainer(model, trainable, cfg)
    token_rows = objective.token_rows(rows, policy.tokenizer, policy.vocab_size, cfg.max_length)
    hooks, is_main = _distributed(trainer_module, policy, token_rows, cfg)
    saver = Checkpointer(target, cfg, record, model, len(token_rows), stop)
    savers.append(saver)
    with _Progress(cfg.max_steps, inputs["progress"] and is_main, target) as report:
        on_step = hooks.pop("on_step", lambda wrap: wrap)(lambda r: (report(r), saver.on_step(r)))
        trainer = trainer_class(policy, objective, token_rows, cfg, on_step=on_step, **hooks)
        saver.trainer = trainer
        if hasattr(trainer, "deliver_now"):  # JAX fetches a step's record late unless a signal's checkpoint follows
            trainer.deliver_now = lambda step: bool(stop.signum)
        if checkpoint is not None:
            saver.restore(checkpoint, step)
            report.restart(saver.history)
            print(f"linnet train: resuming from {checkpoint} (step {step} of {cfg.max_steps})", file=sys.stderr)
        # from here a signal saves a checkpoint after the step in progress (one process: ranks would not agree)
        stop.deferring = target is not None and not in_torchrun()
        trainer.train()
    _gather_full_parameters(model)
    if target is not None:
        _publish(target, lambda folder: _write_result(folder, model, cfg, record, save_merged))
    return TrainResult(saver.history, model, target)


def _run_record(cfg: TrainConfig, inputs: dict[str, Any]) -> dict[str, Any]:
    """What train_config.json holds: the inputs' locations, their contents' identity (the data's and the source's
    sha256, the weights' resolved path and its files' sizes and times, the trainer's kind), and the `TrainConfig`."""
    import hashlib

    from linnet.ir.build import read_source

    from ..backends import get_backend
    from .checkpoints import weights_files

    weights = inputs["weights"]
    held = Path(str(weights)) if weights is not None else None
    _, text = read_source(inputs["source"])
    return {
        "source": str(inputs["source"]), "weights": str(weights), "data": str(inputs["data"]),
        "adapter": str(inputs["adapter"]) if inputs["adapter"] is not None else None, "backend": inputs["backend"],
        "data_sha256": hashlib.sha256(Path(inputs["data"]).read_bytes()).hexdigest(),
        "source_sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(),
        "weights_path": str(held.resolve()) if held is not None and held.exists() else str(weights),
        "weights_files": weights_files(weights),
        "trainer": get_backend(inputs["backend"]).trainer_module().__name__.rsplit(".", 1)[-1],
        **asdict(cfg),
    }  # fmt: skip


def _interrupted(signum: int, saver: Checkpointer | None) -> TrainInterrupted:
    """The error of a run a signal stopped at once (before training, or a second signal during a step)."""
    import signal

    name = signal.Signals(signum).name
    if saver is None or not saver.history:
        return TrainInterrupted(f"interrupted by {name} before the first step: nothing to save", signum=signum)
    step = saver.history[-1]["step"]
    last = f"the last checkpoint is {saver.saved}" if saver.saved is not None else "no checkpoint was saved"
    return TrainInterrupted(f"interrupted by {name} during step {step + 1}, stopped at once: {last}",
                            signum=signum, step=saver.saved_step, checkpoint=saver.saved)  # fmt: skip


def _distributed(trainer: Any, policy: Any, token_rows: list, cfg: TrainConfig) -> tuple[dict[str, Any], bool]:
    """Under torchrun (WORLD_SIZE > 1): DDP or FSDP2 around the torch policy (`train.torch_dp`), and the
    trainer's hooks (this rank's micro-batches, the all-reduced normaliser, records summed over the ranks);
    whether this process writes (rank 0). One process: no hooks, it writes."""
    if not in_torchrun():
        return {}, True
    from .torch_dp import data_parallel, global_record

    if not trainer.DATA_PARALLEL:
        raise TrainError("under torchrun, train on a PyTorch backend; JAX shards over its devices in one process")
    run = data_parallel(policy, token_rows, cfg, fsdp=cfg.fsdp)

    def on_step(report):
        def each(record):
            record.update(global_record(record, run.reduce_sum))  # every rank takes part; the history gets it too
            if run.is_main:
                report(record)

        return each

    return {"reduce_sum": run.reduce_sum, "micro_batches": run.micro_batches, "on_step": on_step}, run.is_main


def _gather_full_parameters(model: Any) -> None:
    """After an FSDP2 run, every rank holds its shards: all-gather each parameter (a collective: every rank
    calls this) and bind it whole, so the result is written and returned like one process's."""
    module = getattr(model, "module", None)
    if module is None or not hasattr(module, "reshard"):  # not an FSDPModule
        return
    import torch

    for path, (owner, leaf) in module._leaves.items():
        current = getattr(owner, leaf)
        if hasattr(current, "full_tensor"):
            owner.register_parameter(leaf, torch.nn.Parameter(current.detach().full_tensor(), requires_grad=False))
            module.tensors[path] = getattr(owner, leaf)


def _other_family(source: str | Path, weights: str | Path | None) -> str | None:
    """ "W holds a gpt2 model ..." when a Hugging Face folder's config.json names another `model_type` than the
    source's root model has (export_hf's FAMILIES), else None: the loader's error then says enough."""
    import re

    from linnet.ir.build import read_source
    from linnet.runtimes.export.hf import FAMILIES

    try:
        stored = json.loads((Path(str(weights)) / "config.json").read_text(encoding="utf-8")).get("model_type")
        path, text = read_source(source)
    except (OSError, ValueError, TypeError):
        return None
    root = re.search(r"^model\s+(\w+)", text, re.M)
    family = FAMILIES.get(root.group(1)) if root else None
    if stored is None or family is None or stored == family:
        return None
    return f"{weights} holds a {stored} model (its config.json's model_type), and {path} is {root.group(1)} ({family})"


def _publish(target: Path, write) -> None:
    """Write the run's result into a hidden `target/.result.*.partial` folder (`write(folder)`), then move each of
    its entries into `target` (replacing an earlier run's: a resumed run's result replaces the one it goes on
    from). An error or a signal meanwhile removes the temporary folder."""
    tmp = Path(tempfile.mkdtemp(prefix=".result.", suffix=".partial", dir=target))
    try:
        write(tmp)
        for entry in sorted(tmp.iterdir()):
            final = target / entry.name
            if final.is_dir() and not final.is_symlink():
                shutil.rmtree(final)  # `merged/` of the run this one resumed
            os.replace(entry, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _write_result(folder: Path, model: Any, cfg: TrainConfig, record: dict[str, Any], save_merged: bool) -> None:
    if cfg.lora is None:
        from linnet.runtimes.export.hf import export_hf

        export_hf(model, folder / "model")  # its own temporary folder, renamed into ours
        for f in (folder / "model").iterdir():
            os.replace(f, folder / f.name)
        (folder / "model").rmdir()
    else:
        from .lora import export_merged, save_adapter

        save_adapter(model, folder, cfg.lora, base_model=record["weights"])
        if save_merged:
            export_merged(model, folder / "merged")
    text = json.dumps(record, indent=2, default=_callable_name)  # method options may hold functions (GRPO's reward)
    (folder / "train_config.json").write_text(text + "\n", encoding="utf-8")


def _callable_name(value: Any) -> str:
    """A function given as a method option, by its import path `module:qualname`."""
    if callable(value):
        return f"{getattr(value, '__module__', '?')}:{getattr(value, '__qualname__', repr(value))}"
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


class _Progress:
    """The progress bar (tqdm on stderr: step, loss, tokens/s and tqdm's ETA) and `metrics.jsonl` in `folder`."""

    def __init__(self, total: int, show: bool, folder: Path | None):
        self.total, self.show, self.folder = total, show, folder
        self.bar = None
        self.metrics = None

    def __enter__(self):
        from tqdm import tqdm

        self.bar = tqdm(total=self.total, desc="training", unit="step", file=sys.stderr, disable=not self.show)
        if self.folder is not None:
            self.metrics = open(self.folder / "metrics.jsonl", "w", encoding="utf-8")
        return self

    def restart(self, history: list[dict[str, Any]]) -> None:
        """A resumed run: `metrics.jsonl` starts again with the checkpoint's records, the bar at its step."""
        if self.metrics is not None:
            self.metrics.writelines(json.dumps(r) + "\n" for r in history)
            self.metrics.flush()
        self.bar.update(len(history))

    def __call__(self, record: dict[str, Any]) -> None:
        if self.metrics is not None:
            self.metrics.write(json.dumps(record) + "\n")
            self.metrics.flush()
        self.bar.set_postfix(loss=f"{record.get('loss', float('nan')):.4f}", tok_s=f"{record['tokens_per_s']:.0f}")
        self.bar.update(1)

    def __exit__(self, *exc):
        self.bar.close()
        if self.metrics is not None:
            self.metrics.close()
        return False
