"""`linnet.train(...)` and `linnet train`: load a model, read the data, train, write the result atomically.

What a run writes into `output` (created whole at the end: everything goes into a hidden temporary folder
beside it, renamed to `output` once training and writing have succeeded; a failure or an interrupt leaves
nothing behind, and an existing non-empty `output` is refused before anything runs):
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

from linnet.errors import LoadError, TrainError

from .config import LoraSettings, TrainConfig
from .data import read_jsonl
from .objectives import objective_for

__all__ = ["train", "TrainResult", "load_for_training"]


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
):
    """Load `source` with `weights` on `backend` (one that trains) in f32 on `device`, with LoRA adapters when
    `lora` is given (fresh, or read from the PEFT folder `adapter`), and `max_batch` KV-cache rows (for GRPO's
    sampling).
    Returns (the `TorchModel`, the checkpoint paths to train).
    Raises TrainError, LoadError, BackendError."""
    from ..backends import get_backend
    from .policy import check_trains

    check_trains(backend)
    if lora is None and adapter is None:
        b = get_backend(backend)
        trainer = b.trainer_module()
        model = b.load(
            source, weights, preset=preset, config=config, dtype="f32", max_batch=max_batch, device=device,
            progress=progress, **trainer.LOAD_OPTIONS,
        )  # fmt: skip
        return model, trainer.trainable_paths(model)
    from .lora import load_with_adapters

    return load_with_adapters(
        source, weights, lora, adapter=adapter, backend=backend, preset=preset, config=config, seed=seed,
        progress=progress, max_batch=max_batch, device=device,
    )  # fmt: skip


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
    **options: Any,
) -> TrainResult:
    """Train `source` with `weights` on the JSONL `data` by `method` and write the result to `output`.

    Args:
        source, weights, preset, config: as `linnet.load` takes them (the model is loaded in f32).
        data: a JSONL file of rows in the method's shape (`linnet.runtimes.train.data`).
        output: the folder to write (must not exist, or be empty); None writes nothing.
        method: `sft` (LoRA adapters, PEFT's defaults unless `lora` says otherwise), `full` (every parameter),
            or a registered method (`dpo`, `grpo`).
        backend: a backend whose registry record `can_train` (`torch`, `torch-interpret`, `jax`: under
            `jax.grad` with optax, `jax_trainer`).
        device: where the model and the training run (`cpu`, `cuda`, `cuda:1`).
        lora: LoRA settings for `sft` (None: `LoraSettings()`, r=8, lora_alpha=8, q_proj and v_proj).
        adapter: a PEFT adapter folder to start from (training goes on from its weights).
        progress: a progress bar on stderr (loss, tokens/s, ETA).
        save_merged: with LoRA, also write the adapters merged into the base as a Hugging Face folder,
            `output/merged` (`lora.export_merged`).
        options: `TrainConfig` fields (`max_steps`, `learning_rate`, `gradient_accumulation_steps`, ...).

    Returns a `TrainResult`. Raises TrainError (bad data row: file:line and field; a LoRA target pattern that
    matches nothing; an output folder that exists), LoadError, BackendError; nothing is written on error.
    """
    import torch

    from ..backends import get_backend

    unknown = sorted(set(options) - set(TrainConfig.__dataclass_fields__))
    if unknown:
        raise TrainError(f"unknown training option {', '.join(unknown)}")
    if method == "full" and (lora is not None or adapter is not None or save_merged):
        raise TrainError("--method full trains every parameter: it takes no LoRA options (use --method sft)")
    if method != "full" and lora is None:
        lora = LoraSettings()
    cfg = TrainConfig(method=method, lora=lora if method != "full" else None, **options)
    cfg.check()
    target = _check_output(output) if output is not None else None
    objective = objective_for(method, **cfg.method_options)
    rows = read_jsonl(data)
    torch.manual_seed(cfg.seed)
    try:
        rows_sampled = getattr(objective, "generation_rows", None)  # GRPO samples a micro-batch's completions at once
        model, trainable = load_for_training(
            source, weights, backend=backend, lora=cfg.lora, adapter=adapter, preset=preset, config=config,
            seed=cfg.seed, progress=progress, max_batch=rows_sampled(cfg) if rows_sampled else 1, device=device,
        )  # fmt: skip
    except LoadError as err:
        other = _other_family(source, weights)
        if other is not None:
            raise TrainError(f"{other}:\n{err}") from err
        raise
    if getattr(model, "lora", None) is not None:
        cfg.lora = model.lora.settings  # an --adapter's own r, alpha and targets
    trainer_module = get_backend(backend).trainer_module()  # loading checked that the backend trains
    policy, trainer_class = trainer_module.policy_and_trainer(model, trainable, cfg)
    token_rows = objective.token_rows(rows, policy.tokenizer, policy.vocab_size, cfg.max_length)
    hooks, is_main = _distributed(trainer_module, policy, token_rows, cfg)
    tmp = _temporary_folder(target) if target is not None and is_main else None
    try:
        with _Progress(cfg.max_steps, progress and is_main, tmp) as report:
            on_step = hooks.pop("on_step", lambda wrap: wrap)(report)
            history = trainer_class(policy, objective, token_rows, cfg, on_step=on_step, **hooks).train()
        _gather_full_parameters(model)
        if tmp is not None:
            run = dict(source=str(source), weights=str(weights), data=str(data), backend=backend)
            _write_result(tmp, model, cfg, run, save_merged)
            if target.exists():
                target.rmdir()  # empty: checked before training
            os.replace(tmp, target)
    except BaseException:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    return TrainResult(history, model, target)


def _distributed(trainer: Any, policy: Any, token_rows: list, cfg: TrainConfig) -> tuple[dict[str, Any], bool]:
    """Under torchrun (WORLD_SIZE > 1): DDP or FSDP2 around the torch policy (`train.torch_dp`), and the
    trainer's hooks (this rank's micro-batches, the all-reduced normaliser, records summed over the ranks);
    whether this process writes (rank 0). One process: no hooks, it writes."""
    from .torch_dp import data_parallel, global_record, in_torchrun

    if not in_torchrun():
        return {}, True
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


def _check_output(output: str | Path) -> Path:
    target = Path(output)
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise TrainError(f"{target}: already exists and is not an empty folder; remove it or pick another")
    return target


def _temporary_folder(target: Path) -> Path:
    target.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent))


def _write_result(folder: Path, model: Any, cfg: TrainConfig, run: dict[str, str], save_merged: bool) -> None:
    if cfg.lora is None:
        from linnet.runtimes.export.hf import export_hf

        export_hf(model, folder / "model")  # its own temporary folder, renamed into ours
        for f in (folder / "model").iterdir():
            os.replace(f, folder / f.name)
        (folder / "model").rmdir()
    else:
        from .lora import export_merged, save_adapter

        save_adapter(model, folder, cfg.lora, base_model=run["weights"])
        if save_merged:
            export_merged(model, folder / "merged")
    record = {**run, **asdict(cfg)}
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
