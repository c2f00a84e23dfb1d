"""TRL 1.16 + PEFT reference runs for the DPO and GRPO tests: DPOTrainer / GRPOTrainer with a fresh LoRA adapter
(PEFT's defaults: r 8, alpha 8, dropout 0, q_proj and v_proj for Llama) on a folder saved by
`toy_pref.save_tiny_llama`, f32 on CPU, no shuffling (`train_sampling_strategy="sequential"` for DPO,
`shuffle_dataset=False` for GRPO), seeded, and every step logged.

Each run returns what the Linnet side needs to replay it: per-step losses and metrics, and for GRPO the batch TRL
trained on at each step (prompt ids, sampled completion ids and masks, rewards, advantages), so Linnet's loss can be
computed on exactly those completions. Nothing here imports torch, transformers, peft or trl at import time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class ReferenceRun:
    """Per-step records of one TRL run: `losses[i]` and `metrics[i]` (TRL's logged names) of optimizer step i;
    `batches[i]` the GRPO generation batch of step i (numpy arrays); `adapter` the saved adapter folder."""

    losses: list[float] = field(default_factory=list)
    metrics: list[dict] = field(default_factory=list)
    batches: list[dict] = field(default_factory=list)
    adapter: Path | None = None


def _lora_config(r: int = 8, alpha: int = 8):
    from peft import LoraConfig

    return LoraConfig(r=r, lora_alpha=alpha, lora_dropout=0.0, task_type="CAUSAL_LM")  # targets: PEFT's Llama default


def peft_model(model_dir: Path, seed: int = 1):
    """A PeftModel of `model_dir` with a new adapter (PEFT's defaults; A drawn after `torch.manual_seed(seed)`,
    B = 0). Saved, it is the initial adapter Linnet starts from (`adapter=`), so both sides start equal."""
    import torch
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    torch.manual_seed(seed)
    return get_peft_model(base, _lora_config())


def _common_args(out: Path, steps: int, batch_size: int, learning_rate: float) -> dict:
    """The TrainingArguments every reference run shares (a trainer's `config` overrides any of them, e.g.
    `use_cpu=False, bf16=True` on a GPU)."""
    return dict(
        output_dir=str(out),
        max_steps=steps,
        per_device_train_batch_size=batch_size,
        learning_rate=learning_rate,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        seed=0,
        bf16=False,
        use_cpu=True,
        activation_checkpointing=False,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )


def _collect(trainer, run: ReferenceRun) -> None:
    """Move the trainer's logged rows (one per step, logging_steps=1) into `run.metrics` / `run.losses`."""
    for row in trainer.state.log_history:
        if "loss" in row:
            run.losses.append(float(row["loss"]))
            run.metrics.append(dict(row))


def _model(model_dir: Path, lora: Any):
    """The model TRL trains: the given `PeftModel`, or `model_dir` loaded in f32 (with `lora=True` TRL wraps it)."""
    import torch
    from transformers import AutoModelForCausalLM

    return lora if not isinstance(lora, bool) else AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)


def _sequential_trainer(kind: str, model_dir: Path, rows: list[dict], out: Path, steps: int, batch_size: int,
                        lora: Any, config: dict):  # fmt: skip
    """TRL's `{kind}Trainer` with its `{kind}Config`, rows in order (`train_sampling_strategy="sequential"`)."""
    import trl
    from datasets import Dataset
    from transformers import AutoTokenizer

    config.setdefault("learning_rate", 1e-3)  # TRL's 2e-5 / 1e-6 would not move a test model in a few steps
    common = _common_args(out, steps, batch_size, config.pop("learning_rate"))
    args = getattr(trl, f"{kind}Config")(**{**common, "train_sampling_strategy": "sequential", **config})
    return getattr(trl, f"{kind}Trainer")(
        model=_model(model_dir, lora),
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=AutoTokenizer.from_pretrained(model_dir),
        peft_config=_lora_config() if lora is True else None,
    )


def sft_trainer(
    model_dir: Path, rows: list[dict], out: Path, steps: int, batch_size: int = 2, lora: Any = True, **config
):
    """TRL's SFTTrainer on prompt/completion rows (completion-only loss, TRL's default for them), `steps` steps in
    order; `lora` as `dpo_trainer` takes it. `config` overrides SFTConfig fields."""
    return _sequential_trainer("SFT", model_dir, rows, out, steps, batch_size, lora, config)


def dpo_trainer(
    model_dir: Path, rows: list[dict], out: Path, steps: int, batch_size: int = 2, lora: Any = True, **config
):
    """TRL's DPOTrainer, `steps` steps over `rows` in order, with ref_model=None: with `lora=True`, a new LoRA
    adapter and the reference is the model with the adapter disabled; with `lora` a `PeftModel` (of `model_dir`),
    that model is trained and TRL's reference is a frozen copy of its starting adapter; with `lora=False`, every
    parameter trains and TRL loads the checkpoint again as the frozen reference. `config` overrides DPOConfig
    fields (beta, learning_rate...)."""
    return _sequential_trainer("DPO", model_dir, rows, out, steps, batch_size, lora, config)


def trl_dpo(
    model_dir: Path, rows: list[dict], out: Path, steps: int, batch_size: int = 2, lora: Any = True, **config
) -> ReferenceRun:
    """Train `dpo_trainer(...)`; the adapter (or the model) is saved to `out / "adapter"`."""
    trainer = dpo_trainer(model_dir, rows, out, steps, batch_size, lora, **config)
    trainer.train()
    run = ReferenceRun()
    _collect(trainer, run)
    run.adapter = out / "adapter"
    trainer.model.save_pretrained(run.adapter)
    return run


def grpo_trainer(
    model_dir: Path,
    rows: list[dict],
    reward_funcs: list,
    out: Path,
    steps: int,
    run: ReferenceRun | None = None,
    num_generations: int = 4,
    max_completion_length: int = 6,
    lora: Any = True,
    **config,
):
    """TRL's GRPOTrainer with a new LoRA adapter, `steps` steps, one prompt (a group of `num_generations`
    completions) per step, prompts in order. When `run` is given, each step's generation batch is recorded into
    `run.batches`. `config` overrides GRPOConfig fields (beta, loss_type, learning_rate...)."""
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    class RecordingGRPOTrainer(GRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            batch = super()._generate_and_score_completions(inputs)
            if run is not None:
                keys = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages")
                record = {k: batch[k].detach().cpu().numpy().copy() for k in keys}
                record["prompts"] = [x["prompt"] for x in inputs]
                run.batches.append(record)
            return batch

    config.setdefault("learning_rate", 1e-3)
    common = _common_args(
        out, steps, config.pop("per_device_train_batch_size", num_generations), config.pop("learning_rate")
    )
    args = GRPOConfig(**{
        **common, "num_generations": num_generations, "max_completion_length": max_completion_length,
        "shuffle_dataset": False, "pad_to_multiple_of": None, **config,
    })  # fmt: skip
    return RecordingGRPOTrainer(
        model=_model(model_dir, lora),
        reward_funcs=reward_funcs,
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=AutoTokenizer.from_pretrained(model_dir),
        peft_config=_lora_config() if lora is True else None,
    )


def trl_grpo(model_dir: Path, rows: list[dict], reward_funcs: list, out: Path, steps: int, **config) -> ReferenceRun:
    """Train `grpo_trainer(...)`, recording every step's generation batch; the adapter is saved to
    `out / "adapter"`."""
    run = ReferenceRun()
    trainer = grpo_trainer(model_dir, rows, reward_funcs, out, steps, run=run, **config)
    trainer.train()
    _collect(trainer, run)
    run.adapter = out / "adapter"
    trainer.model.save_pretrained(run.adapter)
    return run
