"""`linnet train`: train a model from its source (`linnet.runtimes.train.run.train`), with a progress bar (loss,
tokens/s, ETA) on stderr, checkpoints in `-o OUT` (`--save-steps N`, and on SIGTERM, SIGHUP or SIGINT), the
metrics, adapters or weights written to `OUT` at the end; `--resume [DIR]` goes on from a checkpoint.

Bad input (a data row missing a field, a LoRA target pattern that matches nothing, a checkpoint of another model,
an output folder in use by another run or that holds files, a checkpoint of other settings) exits 2 with one
message naming the file, line, field or tensor; nothing is written. A run stopped by a signal exits 128 + the
signal's number (143 for SIGTERM, 130 for Ctrl-C) after saving its checkpoint. Imports nothing heavy until it runs.
"""

from __future__ import annotations

import argparse
import os
import sys

from linnet.cli.common import (
    BACKEND_HELP,
    BACKEND_NAMES,
    DEVICE_HELP,
    EXIT_ERRORS,
    EXIT_OK,
    EXIT_USAGE,
    UsageError,
    parse_config,
)


def cmd_train(args: argparse.Namespace) -> int:
    from linnet.errors import LinnetError, LoadError, TrainError, TrainInterrupted

    try:
        result = _train(args)
    except TrainInterrupted as err:  # a signal: the checkpoint is saved, the exit says which signal
        print(f"linnet train: {err}", file=sys.stderr)
        return 128 + err.signum
    except (TrainError, LoadError, UsageError, OSError) as err:  # bad input: data, options, checkpoint, paths
        print(f"linnet train: {err}", file=sys.stderr)
        return EXIT_USAGE
    except (LinnetError, ValueError) as err:
        print(f"linnet train: {err}", file=sys.stderr)
        return EXIT_ERRORS
    if os.environ.get("RANK", "0") != "0":  # under torchrun, rank 0 alone wrote OUT and says so (and has the history)
        return EXIT_OK
    first, last = result.history[0], result.history[-1]
    print(
        f"trained {len(result.history)} steps: loss {first['loss']:.4f} -> {last['loss']:.4f}; wrote {result.output}",
        file=sys.stderr,
    )
    return EXIT_OK


def _train(args: argparse.Namespace):
    from linnet.runtimes.backends import get_backend
    from linnet.runtimes.train import LoraSettings
    from linnet.runtimes.train.run import train

    # the compile cache and, on PyTorch, one thread per idle core, as `run` does (else training says why it cannot)
    get_backend(args.backend).setup_process()

    lora_given = any(v is not None for v in (args.lora_r, args.lora_alpha, args.lora_dropout, args.lora_targets))
    lora = None
    if args.method == "full":
        if lora_given or args.adapter:
            raise UsageError("--method full trains every parameter: it takes no --lora-* nor --adapter")
    elif not args.adapter:
        r = args.lora_r if args.lora_r is not None else 8
        lora = LoraSettings(
            r=r,
            lora_alpha=args.lora_alpha if args.lora_alpha is not None else 8.0,
            lora_dropout=args.lora_dropout or 0.0,
            targets=args.lora_targets,
        )
    elif lora_given:
        raise UsageError("--adapter takes its r, lora_alpha and targets from its adapter_config.json: no --lora-*")
    options = dict(
        max_steps=args.max_steps,
        learning_rate=args.lr,
        lr_scheduler_type=args.lr_scheduler,
        warmup_steps=args.warmup_steps,
        per_device_train_batch_size=args.batch_size,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        max_grad_norm=args.max_grad_norm,
        weight_decay=args.weight_decay,
        bf16=args.bf16,
        gradient_checkpointing=args.gradient_checkpointing,
        max_length=args.max_length,
        shuffle=not args.no_shuffle,
        seed=args.seed,
        method_options=_method_options(args),
        fsdp=args.fsdp,
        save_steps=args.save_steps,
    )
    result = train(
        args.file,
        args.weights,
        data=args.data,
        output=args.output,
        method=args.method,
        backend=args.backend,
        lora=lora,
        adapter=args.adapter,
        preset=args.preset,
        config=parse_config(args.config),
        progress=not args.quiet,
        save_merged=args.save_merged,
        resume=True if args.resume == "" else args.resume,
        device=args.device,
        **options,
    )
    return result


# The preference methods' options (linnet/runtimes/train/dpo.py, grpo.py): flag -> (option name, the methods taking it)
METHOD_FLAGS = {
    "beta": ("beta", ("dpo", "grpo")),
    "reward": ("reward", ("grpo",)),
    "num_generations": ("num_generations", ("grpo",)),
    "max_completion_length": ("max_completion_length", ("grpo",)),
    "temperature": ("temperature", ("grpo",)),
}


def _method_options(args: argparse.Namespace) -> dict:
    """The method's own options from --beta, --reward, --num-generations, --max-completion-length, --temperature.
    Raises UsageError for one the method does not take; the objective checks the values (TrainError)."""
    options = {}
    for flag, (name, methods) in METHOD_FLAGS.items():
        value = getattr(args, flag)
        if value is None:
            continue
        if args.method not in methods:
            spelled = "--" + flag.replace("_", "-")
            raise UsageError(f"{spelled} is an option of --method {' and '.join(methods)}, not {args.method}")
        options[name] = value
    if args.method == "grpo":
        options.setdefault("seed", args.seed)
    return options


def register(sub) -> None:
    p = sub.add_parser("train", help="train a model from its source (LoRA SFT, full fine-tuning, DPO, GRPO)")
    p.add_argument("file", metavar="FILE", help="a .linnet source with a root model and a `forward` entry")
    p.add_argument("--weights", metavar="W", help="HF directory, .gguf file or embedded id (default: the preset's)")
    p.add_argument("--preset", metavar="NAME", help="the preset to build (default: the first with default weights)")
    p.add_argument("--config", action="append", metavar="KEY=VALUE", help="override a config field (repeatable)")
    p.add_argument("--backend", choices=BACKEND_NAMES, default="torch", metavar="BACKEND", help=BACKEND_HELP)
    p.add_argument("--device", default="cpu", help=DEVICE_HELP)
    p.add_argument(
        "--method",
        default="sft",
        help="sft (LoRA adapters; completion-only loss on prompt/completion rows), full (every parameter), "
        "dpo, grpo (default sft)",
    )
    p.add_argument("--data", required=True, metavar="D.jsonl", help="training rows, one JSON object per line")
    p.add_argument(
        "-o", "--output", required=True, metavar="OUT",
        help="the folder to write: claimed for the run (a second run with it is refused); must not exist, be empty, "
        "or hold this run's checkpoints with --resume",
    )  # fmt: skip
    p.add_argument(
        "--save-steps", type=int, metavar="N",
        help="write OUT/checkpoint-K every N optimizer steps and after the last (SIGTERM, SIGHUP and SIGINT always "
        "write one after the step in progress)",
    )  # fmt: skip
    p.add_argument(
        "--resume", nargs="?", const="", metavar="DIR",
        help="go on from a checkpoint: DIR a checkpoint-K folder or a run folder (its latest); without DIR, the "
        "latest checkpoint-K in OUT (put --resume after FILE, or write --resume=DIR)",
    )  # fmt: skip
    p.add_argument("--max-steps", type=int, default=100, metavar="N", help="optimizer steps (100)")
    p.add_argument("--lr", type=float, metavar="LR", help="peak learning rate (default: the method's, TRL's)")
    p.add_argument("--lr-scheduler", default="linear", choices=("linear", "cosine", "constant", "constant_with_warmup"))
    p.add_argument("--warmup-steps", type=int, default=0, metavar="N")
    p.add_argument("--batch-size", type=int, default=8, metavar="N", help="rows per micro-batch (8)")
    p.add_argument("--gradient-accumulation-steps", type=int, default=1, metavar="N", help="micro-batches a step (1)")
    p.add_argument("--max-grad-norm", type=float, default=1.0, metavar="X", help="clip the gradient norm (1.0; 0: no)")
    p.add_argument("--weight-decay", type=float, default=0.0, metavar="X")
    p.add_argument("--max-length", type=int, default=1024, metavar="N", help="truncate rows to N tokens (1024)")
    p.add_argument("--seed", type=int, default=42, help="row order and LoRA init (42)")
    p.add_argument("--no-shuffle", action="store_true", help="visit the rows in the file's order")
    p.add_argument(
        "--bf16",
        action="store_true",
        help="mixed precision: bf16 autocast over f32 weights (jax: bf16 weights, f32 adapters)",
    )
    p.add_argument("--gradient-checkpointing", action="store_true", help="recompute each layer in the backward pass")
    p.add_argument("--lora-r", type=int, metavar="R", help="LoRA rank (8)")
    p.add_argument("--lora-alpha", type=float, metavar="A", help="LoRA alpha; scaling = alpha / r (8, PEFT's)")
    p.add_argument("--lora-dropout", type=float, metavar="P", help="LoRA dropout (0)")
    p.add_argument(
        "--lora-targets",
        metavar="PATTERN",
        help="Linear members to adapt: names (q_proj,v_proj), a regular expression over checkpoint paths, or "
        "all-linear (default: PEFT's for the family)",
    )
    p.add_argument("--adapter", metavar="DIR", help="start from this PEFT adapter folder")
    p.add_argument(
        "--save-merged", action="store_true", help="also write the adapters merged into the base as OUT/merged"
    )
    p.add_argument("--beta", type=float, metavar="B", help="DPO's beta (0.1) or GRPO's KL coefficient (0.0), TRL's")
    p.add_argument("--reward", metavar="MODULE:FUNCTION", help="GRPO's reward function (TRL's signature)")
    p.add_argument("--num-generations", type=int, metavar="G", help="GRPO: completions sampled per prompt (8)")
    p.add_argument("--max-completion-length", type=int, metavar="N", help="GRPO: new tokens per completion (512)")
    p.add_argument("--temperature", type=float, metavar="T", help="GRPO: sampling temperature (1.0)")
    p.add_argument(
        "--fsdp",
        action="store_true",
        help="under torchrun: shard parameters, gradients and optimizer state (FSDP2) instead of DDP's replicas",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_train)
