"""Training on JAX: the generated JAX `forward` under `jax.value_and_grad`, the optimizer from optax, the same
data path, objectives' batches, schedule and metrics records as the PyTorch `Trainer`.

The model is a `JaxModel` loaded with `fuse_linear_weights=False`, so `params` is a dict by checkpoint name and
its gradients come back under the same names (a fused q/k/v key would give one gradient for three checkpoint
tensors). LoRA adapters are ordinary parameters of the transformed source (`lora.load_with_adapters`), so the
same code trains them, and `lora.save_adapter` writes them in PEFT's format from `params`.

One optimizer step, as `trainer.Trainer` does it on PyTorch (transformers' `Trainer` with `num_items_in_batch`):
1. `gradient_accumulation_steps` micro-batches, right-padded to a length bucket (`padded_length`: 16, 24, 32,
   48, 64, ... tokens, a power of two or 1.5 times one; extra pad tokens with loss mask 0: the `forward` entries
   are causal, so right padding changes no real token's logits) and to the most rows a micro-batch has had (an
   epoch's last, smaller micro-batch gets rows of pad tokens), so ragged data compiles a few shapes, not one a
   step;
2. `N` = the step's loss tokens over every micro-batch (`reduce_sum` over the processes of a run);
3. per micro-batch, the gradient of `sum(nll * mask) / N`, summed over micro-batches;
4. `optax.clip_by_global_norm(max_grad_norm)` then `optax.adamw` (decoupled weight decay, eps outside the
   square root: torch.optim.AdamW's update), the learning rate set each step to `learning_rate *
   lr_multiplier(step - 1)` (`optax.inject_hyperparams`), as torch's `LambdaLR` sets it. `grad_norm` is the
   norm before clipping (`optax.global_norm`), as `clip_grad_norm_` returns it. optax clips by
   `max_norm / norm` where torch uses `max_norm / (norm + 1e-6)`: a 1e-6 relative difference on clipped steps.

On an accelerator (`--device tpu`) the host must not stall the device: a step is dispatched without waiting
(each micro-batch's gradient is added to the step's sum inside its jitted call, the sum's buffers donated; the
optimizer update donates the parameters and the optimizer state), and the step's record (its loss, metrics and
gradient norm, one `jax.device_get` of them all) is fetched after the next step is dispatched, so the device
always holds a queued step. A record that a checkpoint follows (`save_steps`, a signal:
`deliver_now`) is fetched before the next step starts, so the checkpoint holds that step's values. A record's
`elapsed_s` is the time from the previous record's delivery to its own, less the next step's dispatch where that
fell inside, plus its own where it fell before: each step is charged its own host work and its wait, so the steps'
times still add up to the run's and the last step's rate is not its wait alone (on a host-bound run the last step
read 99,718 tokens/s where the others read ~5).

Mixed precision (`bf16=True`, `--bf16`): the model is loaded in bf16 (`load_dtype`: the frozen weights and the
activations, so the matmuls run on bf16 operands with f32 accumulation), the trained parameters are held in f32
(master weights, what the optimizer updates and the adapters are saved from) and cast to bf16 for each forward;
the loss, its log-softmax and the optimizer in f32. PyTorch's `--bf16` autocasts over f32 weights instead: the same
matmul operands, but its norms and softmax run in f32 where the source's own casts decide here.

Activation checkpointing (`gradient_checkpointing=True`, `--gradient-checkpointing`): each decoder layer's
`forward` under `jax.checkpoint` (`checkpoint_layers`) with `dots_with_no_batch_dims_saveable`: a layer keeps its
input and its weight matmuls' outputs (projections, adapters) for the backward pass and recomputes the rest, one
layer at a time: the attention's scores and probabilities ([B, H, S, S] in f32, most of a layer's activations at
512 tokens), the norms, rotary and activations: cheap to recompute (no weight matmul runs twice). PyTorch's
per-layer `torch.utils.checkpoint` keeps only the input and runs the whole layer again. The losses the same.

Dropout (`--lora-dropout`): the generated JAX code's dropouts draw only when the entry's `p` holds a random key
(`DROPOUT_KEY`; without one, in inference, they are the identity). Each micro-batch's forward gets
`fold_in(fold_in(PRNGKey(seed), step), micro_batch)`: other masks than PyTorch's generator draws (a run on JAX
does not reproduce a PyTorch run's dropout), the same ones for the same seed.

Objectives on JAX: the losses of `JAX_LOSSES`, keyed by the objective's `name`: `sft` and `full` (the token NLL
over loss tokens) and `dpo` (`dpo.DPO`'s sigmoid loss; its reference is the trained parameters' values before the
first step, held as a second parameter set: for fresh LoRA adapters B = 0 there, so it computes the base model
exactly, as TRL's adapters-disabled reference does; for `--adapter` and full fine-tuning it is TRL's frozen copy of
the start; with `lora_dropout` it runs with masks of its own, as on PyTorch and in TRL, whose model stays in train
mode for the reference pass). GRPO, which samples through the generation runner, raises TrainError naming what
trains.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from linnet.compiler.jax.codegen import DROPOUT_KEY
from linnet.compiler.jax.x64 import ScopedJit, x64_scoped
from linnet.errors import TrainError
from linnet.runtimes.backends.jax_backend import jax_module

from ..parallel.jax_mesh import make_mesh
from .config import TrainConfig
from .data import Batch, TokenRow, batches
from .metrics import step_record
from .objectives import Objective
from .schedule import lr_multiplier

__all__ = [
    "JaxPolicy", "JaxTrainer", "JAX_LOSSES", "token_nll_jax", "sft_loss_jax", "dpo_loss_jax", "PAD_TO",
    "LOAD_OPTIONS", "DATA_PARALLEL", "trainable_paths", "policy_and_trainer", "padded_length", "load_dtype",
]  # fmt: skip

# The hooks of a backend record's `trainer` (`linnet.runtimes.backends.Backend.trainer`), read by `train.run`:
# every weight under its checkpoint name (no fused keys), so gradients come back by name
LOAD_OPTIONS = {"fuse_linear_weights": False}
DATA_PARALLEL = False  # not across torchrun processes: JAX shards over its devices in one process


def trainable_paths(model: Any) -> list[str]:
    """The checkpoint names of every parameter of a loaded `JaxModel` (what `--method full` trains)."""
    return list(model.params)


def policy_and_trainer(model: Any, trainable: list[str], cfg: TrainConfig) -> tuple[JaxPolicy, type[JaxTrainer]]:
    """The policy being trained (`model` under `jax.value_and_grad`, `trainable` its parameters to train) and the
    loop that trains it."""
    return JaxPolicy(model, trainable), JaxTrainer


PAD_TO = 16  # the smallest length bucket


def padded_length(tokens: int) -> int:
    """The length bucket a micro-batch of `tokens` tokens is padded to: the least of PAD_TO · 2^k and 1.5 · PAD_TO ·
    2^k (16, 24, 32, 48, 64, 96, ...) that holds it, so at most a third of a padded row is padding and ragged rows
    up to 4096 tokens compile at most 17 lengths."""
    bucket = PAD_TO
    while bucket < tokens:
        if bucket * 3 // 2 >= tokens:
            return bucket * 3 // 2
        bucket *= 2
    return bucket


def load_dtype(cfg: TrainConfig) -> str:
    """The dtype the model is loaded in for `cfg`: bf16 under mixed precision (`cfg.bf16`), else f32."""
    return "bf16" if cfg.bf16 else "f32"


def token_nll_jax(logits, input_ids):
    """`objectives.token_nll` in JAX: `logits` f32[B, S, vocab], `input_ids` i64[B, S] -> f32[B, S - 1], entry s
    = -log p(input_ids[s + 1] | tokens ..s) (log-softmax in f32, then the target's entry)."""
    import jax.numpy as jnp

    logp = jax_module().nn.log_softmax(logits[:, :-1].astype(jnp.float32), axis=-1)
    return -jnp.take_along_axis(logp, input_ids[:, 1:, None], axis=-1)[..., 0]


def sft_loss_jax(logits, input_ids, loss_mask, num_items):
    """SFT's micro-batch loss (`objectives.SFT.loss`): the NLL summed over the loss tokens (`loss_mask`
    f32[B, S - 1]) divided by the step's loss tokens `num_items`; and the metrics summed over the step
    (`loss`, `num_loss_tokens`, `correct`: argmax predictions equal to their target)."""
    import jax.numpy as jnp

    loss = (token_nll_jax(logits, input_ids) * loss_mask).sum() / jnp.maximum(1, num_items)
    correct = ((jnp.argmax(logits[:, :-1], axis=-1) == input_ids[:, 1:]) * loss_mask).sum()
    return loss, {"loss": loss, "num_loss_tokens": loss_mask.sum(), "correct": correct}


def masked_logps_jax(logits, input_ids, loss_mask):
    """`dpo.masked_logps` in JAX: the summed log-probs f32[B] of the tokens `loss_mask` f32[B, S - 1] selects."""
    return -(token_nll_jax(logits, input_ids) * loss_mask).sum(axis=1)


def dpo_loss_jax(logps, ref_logps, pairs: int, beta: float, num_items):
    """`dpo.dpo_loss` in JAX, over the first 2·`pairs` rows of f32[R] summed log-probs under the trained model
    (`logps`) and the reference (`ref_logps`), chosen rows first (rows after 2·`pairs` pad the batch over the
    devices); the loss divided by the step's micro-batch count `num_items` as `DPO.loss` does. Returns (loss,
    {"sums": {"loss"}, "means": TRL's logged metrics}): Rafailov et al. 2023, trl/trainer/dpo_trainer.py."""
    jax = jax_module()
    import jax.numpy as jnp

    chosen, rejected = logps[:pairs], logps[pairs : 2 * pairs]
    chosen_logratios = chosen - ref_logps[:pairs]
    rejected_logratios = rejected - ref_logps[pairs : 2 * pairs]
    loss = -jax.nn.log_sigmoid(beta * (chosen_logratios - rejected_logratios)).mean() / jnp.maximum(1, num_items)
    chosen_rewards = jax.lax.stop_gradient(beta * chosen_logratios)
    rejected_rewards = jax.lax.stop_gradient(beta * rejected_logratios)
    means = {
        "rewards/chosen": chosen_rewards.mean(),
        "rewards/rejected": rejected_rewards.mean(),
        "rewards/accuracies": (chosen_rewards > rejected_rewards).astype(jnp.float32).mean(),
        "rewards/margins": (chosen_rewards - rejected_rewards).mean(),
        "logps/chosen": jax.lax.stop_gradient(chosen).mean(),
        "logps/rejected": jax.lax.stop_gradient(rejected).mean(),
    }
    return loss, {"sums": {"loss": loss}, "means": means}


def _sft_micro_loss(policy: JaxPolicy, objective: Objective):
    def micro_loss(params, frozen, input_ids, loss_mask, num_items, key):  # frozen: an argument, never a constant
        logits = policy.forward({**frozen, **policy.cast(params), DROPOUT_KEY: key}, {}, input_ids)
        loss, metrics = sft_loss_jax(logits, input_ids, loss_mask, num_items)
        return loss, {"sums": metrics, "means": {}}

    return micro_loss


# The DPO reference's key: `fold_in(micro-batch key, REFERENCE_STREAM)`, so its masks are drawn apart from the
# policy's (the i-th dropout of a call draws with `fold_in(its key, i)`).
REFERENCE_STREAM = 1 << 30


def _dpo_micro_loss(policy: JaxPolicy, objective: Objective):
    jax = jax_module()
    beta = objective.beta

    def micro_loss(params, frozen, input_ids, loss_mask, num_items, key, reference, pairs):
        # the reference in training mode too, with masks of its own, as the PyTorch trainer runs it (inside the
        # step's `training()`) and TRL does (its model stays in train mode for the reference pass)
        ref_key = jax.random.fold_in(key, REFERENCE_STREAM)
        ref_logits = policy.forward({**frozen, **policy.cast(reference), DROPOUT_KEY: ref_key}, {}, input_ids)
        ref_logps = jax.lax.stop_gradient(masked_logps_jax(ref_logits, input_ids, loss_mask))
        logits = policy.forward({**frozen, **policy.cast(params), DROPOUT_KEY: key}, {}, input_ids)
        return dpo_loss_jax(masked_logps_jax(logits, input_ids, loss_mask), ref_logps, pairs, beta, num_items)

    return micro_loss


# objective name -> the micro-batch loss's maker: (policy, objective) -> fn(params, frozen, input_ids, loss_mask,
# num_items, key, **extra) -> (loss, {"sums": summed over the step's micro-batches, "means": averaged})
JAX_LOSSES: dict[str, Callable] = {"sft": _sft_micro_loss, "full": _sft_micro_loss, "dpo": _dpo_micro_loss}


def check_method(method: str) -> None:
    """Refuse a training method (an objective's name: `grpo`) that JAX does not train; `train.run` asks before it
    claims the output folder, loads the model or draws its progress. Raises TrainError naming those it trains."""
    if method not in JAX_LOSSES:
        raise TrainError(f"method {method} does not train on JAX yet (JAX trains: {', '.join(JAX_LOSSES)})")


def checkpoint_layers(namespace: dict, saveable: Any) -> list[str]:
    """Run the `forward` of each module class of the generated code `namespace` whose instances make a list (a
    decoder's `layers`) under `jax.checkpoint` with the policy `saveable` (what a layer keeps for the backward pass;
    the rest is recomputed there, one layer at a time), as PyTorch's `TorchPolicy` wraps each layer in
    `torch.utils.checkpoint`. The layer's parameters (and a dropout key) are closed over: `jax.checkpoint` takes
    them as inputs. Returns the classes' names."""
    jax = jax_module()
    classes = {
        child[0]
        for value in namespace.values()
        if isinstance(value, type)
        for child in getattr(value, "CHILDREN", {}).values()
        if isinstance(child, tuple)
    }
    for cls in classes:

        def forward(self, *args, _forward=cls.forward):
            return jax.checkpoint(lambda *a: _forward(self, *a), policy=saveable)(*args)

        cls.forward = forward
    return sorted(c.__name__ for c in classes)


class JaxPolicy:
    """A `JaxModel` being trained: the pure `forward(params, {}, input_ids)` of its generated code, the trained
    parameters by checkpoint name (`trainable`), the others held fixed.

    Raises TrainError for a model with fused weights (load with `fuse_linear_weights=False`) or stacked layers
    (`scan_layers=True`; auto leaves them unrolled in that layout), without a
    `forward` entry, or an unknown trainable name."""

    @x64_scoped
    def __init__(self, model: Any, trainable: list[str]):
        import jax.numpy as jnp

        from linnet.compiler.jax.module import compile_program, jax_dtype

        fused = [k for k in model.params if "{" in k]
        if fused:
            raise TrainError(f"train a JAX model loaded with fuse_linear_weights=False (it holds `{fused[0]}`)")
        stacked = [k for k in model.params if ".*." in k]  # its layers by name: the default (auto) unrolls them
        if stacked:
            raise TrainError(f"train a JAX model loaded with scan_layers=False (it holds `{stacked[0]}` stacked)")
        program = model.prepared.program
        forward = program.entries.get("forward")
        if forward is None:
            raise TrainError(
                f"{program.source} has no `forward` entry to train (entries: {', '.join(program.entries)})"
            )
        unknown = [p for p in trainable if p not in model.params]
        if unknown:
            raise TrainError(f"no parameter {', '.join(unknown[:5])} to train")
        self.model = model
        compiled = compile_program(program, model.numerics, fuse_linear_weights=False)
        self.forward = compiled.entry_fn("forward")
        self.namespace = compiled.namespace  # the generated classes, this policy's own
        self.trainable = {k: model.params[k] for k in trainable}
        self.frozen = {k: v for k, v in model.params.items() if k not in self.trainable}
        self.tokenizer = model.tokenizer()
        pad = getattr(self.tokenizer, "eos_token_id", None) if self.tokenizer is not None else None
        self.pad_token_id = int(pad) if pad is not None else 0  # TRL pads with the EOS token when there is no PAD
        self.vocab_size = forward.outputs[0].dims[-1].as_int()
        self.device = model.device
        # the dtype the model computes in (its program's: bf16 or f32), whatever the trained values were loaded in
        # (fresh adapters come in f32): a bf16 activation times an f32 adapter would make the rest of the layer f32
        working = jax_dtype(program.dtype.name)
        self.compute_dtype = {k: working if jnp.issubdtype(v.dtype, jnp.floating) else v.dtype
                              for k, v in self.trainable.items()}  # fmt: skip

    def cast(self, params: dict) -> dict:
        """The trained `params` in the dtypes the model computes in (f32 master weights to bf16 under mixed
        precision; unchanged in f32), inside the traced step, so their gradients come back in the master's f32."""
        return {k: v.astype(self.compute_dtype[k]) for k, v in params.items()}

    def logits(self, params: dict, input_ids):
        """`forward`'s logits [B, S, vocab] with the trained `params` (a pytree by checkpoint name)."""
        return self.forward({**self.frozen, **self.cast(params)}, {}, input_ids)

    @x64_scoped
    def commit(self) -> None:
        """Put the trained parameters back into the model (its entries then run with them), in its dtypes; the
        f32 master values stay beside them as `model.master_params` (what `lora.save_adapter` writes)."""
        jax = jax_module()
        # copies (a checkpoint commits mid-run, and the next step donates the trained buffers)
        held = jax.device_put(jax.jit(lambda tree: jax.tree.map(jax.numpy.copy, tree))(self.trainable), self.device)
        self.model.params = {**self.model.params, **jax.jit(self.cast)(held)}
        self.model.master_params = held


class JaxTrainer:
    """Trains `policy` (a `JaxPolicy`) on `rows` under `objective` as `config` says: the JAX twin of
    `trainer.Trainer`, with the same arguments, hooks (`on_step`, `reduce_sum`, `micro_batches`) and records.
    `deliver_now(step)` (set by `train.run`: a signal is pending) asks for step `step`'s record before the next
    step is dispatched (see the module docstring); `state_step` is the step the trained values hold."""

    @x64_scoped
    def __init__(
        self,
        policy: JaxPolicy,
        objective: Objective,
        rows: Sequence[TokenRow],
        config: TrainConfig,
        *,
        on_step: Callable[[dict[str, Any]], None] | None = None,
        reduce_sum: Callable[[float], float] = lambda x: x,
        micro_batches: Iterator[list[TokenRow]] | None = None,
    ):
        import optax

        check_method(objective.name)
        loss_fn = JAX_LOSSES[objective.name]
        jax = jax_module()
        self.policy, self.objective, self.config = policy, objective, config
        self.on_step, self.reduce_sum = on_step, reduce_sum
        self.deliver_now: Callable[[int], bool] = lambda step: False
        self.micro_batches = micro_batches or batches(
            rows, config.per_device_train_batch_size, shuffle=config.shuffle, seed=config.seed
        )
        lr = config.learning_rate if config.learning_rate is not None else objective.default_learning_rate
        self.learning_rate = lr
        self.multiplier = lr_multiplier(config.lr_scheduler_type, config.warmup_steps, config.max_steps)
        adamw = optax.inject_hyperparams(optax.adamw)(
            learning_rate=lr * self.multiplier(0),
            b1=config.adam_beta1,
            b2=config.adam_beta2,
            eps=config.adam_epsilon,
            weight_decay=config.weight_decay,
        )
        clip = [optax.clip_by_global_norm(config.max_grad_norm)] if config.max_grad_norm else []
        self.optimizer = optax.chain(*clip, adamw)
        # the master weights: f32 (under mixed precision the model computes in bf16, `JaxPolicy.cast`)
        policy.trainable = {k: np.asarray(v, dtype=np.float32) for k, v in policy.trainable.items()}
        self.opt_state = self.optimizer.init(policy.trainable)

        # data parallel over every device of the run on the model's platform (a mesh of one on one device; `--device
        # cpu` on a TPU host trains on the CPU): the trained and frozen parameters and the optimizer state
        # replicated, each micro-batch split on its rows
        self.mesh = make_mesh(jax.devices(policy.device.platform), axis="batch")
        replicated = jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec())
        self.rows_sharding = jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec("batch"))
        policy.trainable = jax.device_put(policy.trainable, replicated)
        policy.frozen = jax.device_put(policy.frozen, replicated)
        self.opt_state = jax.device_put(self.opt_state, replicated)

        self.dropout_key = jax.device_put(jax.random.PRNGKey(config.seed), replicated)
        # DPO's reference: the trained parameters' values before the first step (see the module docstring)
        copy = jax.jit(lambda tree: jax.tree.map(jax.numpy.copy, tree))  # buffers of its own: a step donates them
        self.reference = copy(policy.trainable) if objective.name == "dpo" else None

        if config.gradient_checkpointing:
            checkpoint_layers(policy.namespace, jax.checkpoint_policies.dots_with_no_batch_dims_saveable)
        micro_loss = loss_fn(policy, objective)
        static = ("pairs",) if objective.name == "dpo" else ()
        grad = jax.value_and_grad(micro_loss, has_aux=True)

        def accumulate(grads, *args, **extra):  # the step's gradient sum so far + this micro-batch's
            (_, metrics), g = grad(*args, **extra)
            return jax.tree.map(lambda a, b: a + b, grads, g), metrics

        self._accumulate = ScopedJit(jax.jit(accumulate, static_argnames=static, donate_argnums=0))  # i64 ids
        self._zeros = jax.jit(lambda tree: jax.tree.map(jax.numpy.zeros_like, tree))
        self._apply = jax.jit(self._apply_updates, donate_argnums=(0, 2))  # the new values take the old's buffers
        self.rows_bucket = 0  # the most rows a micro-batch has had: every micro-batch is padded to it
        self.history: list[dict[str, Any]] = []
        self.first_step = 1  # a resumed run starts after its checkpoint's step (`load_state`)
        self.state_step = 0

    def _apply_updates(self, params, grads, opt_state, learning_rate):
        import optax

        opt_state[-1].hyperparams["learning_rate"] = learning_rate
        norm = optax.global_norm(grads)
        updates, opt_state = self.optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, norm

    @x64_scoped  # the ids i64
    def _padded(self, batch: Batch) -> tuple[Any, Any]:
        """The micro-batch padded to its length bucket (`padded_length`) and to `rows_bucket` rows, a multiple of
        the mesh's devices (padding rows hold pad tokens and a zero loss mask: they add nothing), split on its rows
        over the mesh. Made with `jax.make_array_from_callback`, which asks for the rows of this process's devices
        only: the same call on one host and on several (each process reads the same global batch, in the same
        order)."""
        jax = jax_module()
        b, s = batch.input_ids.shape
        self.rows_bucket = max(self.rows_bucket, -(-b // self.mesh.size) * self.mesh.size)
        rows, width = self.rows_bucket, padded_length(s)
        ids = np.full((rows, width), self.policy.pad_token_id, dtype=np.int64)
        ids[:b, :s] = batch.input_ids
        mask = np.zeros((rows, width - 1), dtype=np.float32)
        mask[:b, : s - 1] = batch.loss_mask
        return tuple(jax.make_array_from_callback(a.shape, self.rows_sharding, a.__getitem__) for a in (ids, mask))

    @x64_scoped
    def dispatch(self, step: int) -> dict[str, Any]:
        """Queue optimizer step `step` (1-based) on the device without waiting for it; returns what `record`
        turns into its record once it is done (its metrics and gradient norm still on the device)."""
        jax = jax_module()
        t0 = time.perf_counter()
        cfg, pol = self.config, self.policy
        micro = [
            self.objective.collate(next(self.micro_batches), pol.pad_token_id)
            for _ in range(cfg.gradient_accumulation_steps)
        ]
        if self.reference is None:  # DPO's `prepare_step` makes a PyTorch reference; the JAX one is `reference`
            micro = self.objective.prepare_step(pol, micro)
        num_items = np.float32(self.reduce_sum(float(sum(self.objective.num_items(b) for b in micro))))
        grads, metrics = self._zeros(pol.trainable), []
        step_key = jax.random.fold_in(self.dropout_key, step)
        for i, batch in enumerate(micro):
            ids, mask = self._padded(batch)
            key = jax.random.fold_in(step_key, i)  # the micro-batch's dropout masks
            extra = {} if self.reference is None else {"reference": self.reference, "pairs": len(batch.input_ids) // 2}
            grads, m = self._accumulate(grads, pol.trainable, pol.frozen, ids, mask, num_items, key, **extra)
            metrics.append(m)
        lr_used = self.learning_rate * self.multiplier(step - 1)
        pol.trainable, self.opt_state, grad_norm = self._apply(
            pol.trainable, grads, self.opt_state, np.float32(lr_used)
        )
        self.state_step = step
        queued = {"step": step, "micro": micro, "metrics": metrics, "grad_norm": grad_norm, "lr": lr_used, "t0": t0}
        return queued | {"dispatch_s": time.perf_counter() - t0}

    @staticmethod
    @x64_scoped
    def record(queued: dict[str, Any], since: float) -> dict[str, Any]:
        """The record of a step `dispatch` queued (`trainer.Trainer.step`'s keys), its values fetched from the
        device in one transfer (waiting for the step); its time counted from `since`."""
        jax = jax_module()
        metrics, grad_norm = jax.device_get((queued["metrics"], queued["grad_norm"]))
        sums, means = {}, {}
        for m in metrics:
            for k, v in m["sums"].items():
                sums[k] = sums.get(k, 0.0) + float(v)
            for k, v in m["means"].items():
                means[k] = means.get(k, 0.0) + float(v) / len(metrics)
        elapsed = time.perf_counter() - since
        return step_record(queued["step"], {**sums, **means}, queued["micro"], float(grad_norm), queued["lr"], elapsed)

    def step(self, step: int) -> dict[str, Any]:
        """Run optimizer step `step` (1-based) and return its record, waiting for it."""
        queued = self.dispatch(step)
        return self.record(queued, queued["t0"])

    def train(self) -> list[dict[str, Any]]:
        """Run optimizer steps `first_step` .. `config.max_steps`; returns their records (also passed to
        `on_step`), each fetched once the next step is queued (but for those a checkpoint follows: module
        docstring); the trained parameters end in the model (`JaxPolicy.commit`)."""
        cfg = self.config
        pending, since = None, time.perf_counter()
        for step in range(self.first_step, cfg.max_steps + 1):
            if pending is not None and self._due(pending["step"]):
                since = self._deliver(pending, since)
                pending = None
            queued = self.dispatch(step)
            if pending is not None:
                since = self._deliver(pending, since, next_dispatch_s=queued["dispatch_s"])
                queued["dispatched_before_since"] = True
            pending = queued
        if pending is not None:
            self._deliver(pending, since)
        self.policy.commit()
        return self.history

    def _due(self, step: int) -> bool:
        """Whether step `step`'s record is wanted before the next step changes the trained values (a checkpoint
        of that step follows it)."""
        every = self.config.save_steps
        return bool(every and step % every == 0) or self.deliver_now(step)

    def _deliver(self, queued: dict[str, Any], since: float, next_dispatch_s: float = 0.0) -> float:
        """Fetch `queued`'s record, its time counted from `since` (the previous delivery) with the dispatches moved
        to the steps they belong to (module docstring), hand it on; returns the time of this delivery."""
        own_dispatch_s = queued["dispatch_s"] if queued.get("dispatched_before_since") else 0.0
        record = self.record(queued, since + next_dispatch_s - own_dispatch_s)
        self.history.append(record)
        if self.on_step is not None:
            self.on_step(record)
        return time.perf_counter()

    # ---- checkpoints (`checkpoints.Checkpointer`): the PyTorch trainer's files, in formats JAX holds
    def trained_arrays(self) -> dict[str, np.ndarray]:
        """The trained parameters' values by checkpoint path, on the host."""
        return {k: np.asarray(v) for k, v in self.policy.trainable.items()}

    def save_state(self, folder: Path, step: int) -> None:
        """`optimizer.safetensors` (the optax state's leaves by tree path: `[1].inner_state[0].mu['model.layers.0
        .self_attn.q_proj.lora_A.weight']`), `scheduler.json` (`LambdaLR.state_dict()`'s `last_epoch` and
        `base_lrs`, and the schedule) and `rng_state.json` (the dropout key) into `folder`."""
        from safetensors.numpy import save_file

        jax = jax_module()
        leaves = jax.tree_util.tree_flatten_with_path(self.opt_state)[0]
        save_file({jax.tree_util.keystr(k): np.asarray(v) for k, v in leaves}, str(folder / "optimizer.safetensors"))
        cfg = self.config
        scheduler = {"last_epoch": step, "base_lrs": [self.learning_rate], "lr_scheduler_type": cfg.lr_scheduler_type,
                     "warmup_steps": cfg.warmup_steps, "max_steps": cfg.max_steps}  # fmt: skip
        (folder / "scheduler.json").write_text(json.dumps(scheduler, indent=2) + "\n", encoding="utf-8")
        key = {"dropout_key": np.asarray(self.dropout_key).tolist(), "seed": cfg.seed}
        (folder / "rng_state.json").write_text(json.dumps(key) + "\n", encoding="utf-8")

    @x64_scoped
    def load_state(self, folder: Path, step: int, arrays: dict[str, np.ndarray]) -> None:
        """Continue after optimizer step `step` of the checkpoint `folder`: the trained values `arrays`, the optax
        state (every leaf by its tree path, of the shape this run's state has), the dropout key and the data
        position (step x accumulation micro-batches skipped). DPO's reference was taken at construction, from the
        starting values. Raises ValueError for an optimizer state of another shape."""
        from safetensors.numpy import load_file

        jax = jax_module()
        replicated = jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec())
        saved = load_file(str(folder / "optimizer.safetensors"))
        leaves, tree = jax.tree_util.tree_flatten_with_path(self.opt_state)
        restored = []
        for path, leaf in leaves:
            name = jax.tree_util.keystr(path)
            value = saved.get(name)
            if value is None or value.shape != leaf.shape:
                raise ValueError(f"optimizer.safetensors: {name} is {None if value is None else value.shape}, "
                                 f"this run's optimizer holds {leaf.shape}")  # fmt: skip
            restored.append(value.astype(leaf.dtype))
        self.opt_state = jax.device_put(jax.tree_util.tree_unflatten(tree, restored), replicated)
        trained = {k: np.asarray(arrays[k], dtype=np.asarray(v).dtype) for k, v in self.policy.trainable.items()}
        self.policy.trainable = jax.device_put(trained, replicated)
        rng = json.loads((folder / "rng_state.json").read_text(encoding="utf-8"))
        key = np.asarray(rng["dropout_key"], dtype=np.asarray(self.dropout_key).dtype)
        self.dropout_key = jax.device_put(key, replicated)
        for _ in range(step * self.config.gradient_accumulation_steps):
            next(self.micro_batches)
        self.first_step = step + 1
        self.state_step = step
