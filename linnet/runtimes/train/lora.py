"""LoRA as a source-level transform, and PEFT's adapter format.

The transform rewrites the model's own source: each chosen `Linear` member (`q_proj: Linear(a, b, use_bias=c)`)
becomes `q_proj: LoraLinear(a, b, use_bias=c, r=8, scaling=1.0)`, and the module `LoraLinear` (below) is appended
to the text. `LoraLinear` keeps the base weight under the member's own checkpoint name and adds two `Linear`s,
`lora_A` [r, in] and `lora_B` [out, r], computing PEFT's LoRA forward (peft/tuners/lora/layer.py,
`Linear.forward`: `result = base_layer(x); result = result + lora_B(lora_A(dropout(x))) * scaling`, with
`scaling = lora_alpha / r`; Hu et al. 2021, "LoRA", eq. 3). The transformed source is checked and lowered like any
other, so every backend runs it, and its parameter paths are PEFT's tensor names without PEFT's prefix:
`model.layers.0.self_attn.q_proj.lora_A.weight` is saved as `base_model.model.model.layers.0.self_attn.q_proj.
lora_A.weight`, as `PeftModel.save_pretrained` writes it.

Choosing the members. `targets` is matched against each `Linear` member's checkpoint path
(`model.layers.0.self_attn.q_proj`) as PEFT matches `target_modules` (peft/tuners/tuners_utils.py,
`check_target_module_exists`): a comma-separated list of names matches a path that is a name or ends with
`.name`; anything else is a regular expression that must match the whole path (`re.fullmatch`); `all-linear` is
every `Linear` but the output head. None takes PEFT's default for the family
(`TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING`: `q_proj`, `v_proj` for Llama, Mistral, Qwen2, Qwen3).
The transform rewrites a declaration, so it adapts a member in every instance of its module (all layers): a
pattern that picks some layers' `q_proj` but not others is refused, naming them.

Initialisation (PEFT's `init_lora_weights=True`, `LoraLayer.reset_lora_parameters`): A ~ kaiming_uniform_(a=√5),
i.e. U(-1/√in, 1/√in), B = 0, so step 0 computes exactly the base model. The base weights stay frozen.

Dropout on the adapter's input (`lora_dropout` > 0): `LoraLinear` takes `lora_dropout` and computes
`lora_B(lora_A(dropout(x, lora_dropout)))`, as PEFT's `lora_dropout` module does (an `nn.Dropout`: active while
training, the identity in inference). With `lora_dropout` = 0 (PEFT's default) the transformed source is the one
without dropout (`LORA_LINEAR_SOURCE`), as PEFT uses `nn.Identity` then. On JAX the masks come from a key per
micro-batch (`jax_trainer`), not from PyTorch's generator.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from linnet.errors import BackendError, TrainError

from .config import LoraSettings

__all__ = [
    "LORA_MODULE",
    "LinearMember",
    "LoraAdapters",
    "linear_members",
    "select_members",
    "lora_source",
    "prepare_with_adapters",
    "load_with_adapters",
    "save_adapter",
    "read_adapter",
    "adapters_disabled",
    "merged_weights",
    "export_merged",
    "DEFAULT_TARGETS",
]

LORA_MODULE = "LoraLinear"

# PEFT's `lora.Linear` forward; the adapter's input is `dropout(x, lora_dropout)` when the adapters have dropout,
# else `x` (PEFT's `nn.Identity`), so that a source without dropout stays as it was.
_LORA_LINEAR = string.Template("""
## LoRA (added by `linnet train`): PEFT's `lora.Linear` forward, `base(x) + lora_B(lora_A($doc_input)) * scaling`
## (peft/tuners/lora/layer.py, `Linear.forward`); the base weight keeps the member's checkpoint name.
module LoraLinear(in_features: int, out_features: int, use_bias: bool = true, r: int = 8, scaling: float = 1.0$params) {
    weight: [out_features, in_features]
    if use_bias {
        bias: [out_features]
    }
    lora_A: Linear(in_features, r, use_bias=false)
    lora_B: Linear(r, out_features, use_bias=false)

    fn forward(x: [..., in_features]) -> [..., out_features] {
        let y = x @ transpose(weight)
        let base = if use_bias { y + bias } else { y }
        base + lora_B(lora_A($adapter_input)) * scaling
    }
}
""")
LORA_LINEAR_SOURCE = _LORA_LINEAR.substitute(doc_input="x", params="", adapter_input="x")
LORA_LINEAR_DROPOUT_SOURCE = _LORA_LINEAR.substitute(
    doc_input="dropout(x)", params=", lora_dropout: float = 0.0", adapter_input="dropout(x, lora_dropout)"
)

# PEFT's TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING (peft/utils/constants.py, peft 0.21.2) for the zoo's
# families, by Hugging Face model_type.
DEFAULT_TARGETS: dict[str, list[str]] = {
    "llama": ["q_proj", "v_proj"],
    "mistral": ["q_proj", "v_proj"],
    "qwen2": ["q_proj", "v_proj"],
    "qwen3": ["q_proj", "v_proj"],
    "gpt2": ["c_attn"],
    "bert": ["query", "value"],
    "roberta": ["query", "value"],
}

_NAME_LIST = re.compile(r"[A-Za-z_][\w.]*(\s*,\s*[A-Za-z_][\w.]*)*")


@dataclass(frozen=True)
class LinearMember:
    """One `Linear` instance of a model: `path` its checkpoint path (`model.layers.0.self_attn.q_proj`), declared as
    member `member` of module `module` (defined at `origin`, "file:line"), `in_features` and `out_features`."""

    path: str
    module: str
    member: str
    origin: str
    in_features: int
    out_features: int


@dataclass
class LoraAdapters:
    """The adapters a model was loaded with: `settings`, `members` adapted, `target_modules` as PEFT's
    adapter_config.json spells them, and the base (`source`, `weights`, `preset`, `config`) the merged export
    reloads."""

    settings: LoraSettings
    members: list[LinearMember]
    target_modules: list[str] | str
    source: str
    weights: str | None
    preset: str | None = None
    config: dict[str, Any] | None = None
    model_type: str | None = None
    notes: list[str] = field(default_factory=list)

    def paths(self) -> list[str]:
        """The adapter parameters' paths, A then B per member."""
        return [f"{m.path}.{ab}.weight" for m in self.members for ab in ("lora_A", "lora_B")]


def linear_members(program: Any) -> list[LinearMember]:
    """Every `Linear` instance of a lowered program (`linnet.ir.core.Program`), in parameter order."""
    out: list[LinearMember] = []
    modules = program.modules

    def visit(key: str, prefix: str) -> None:
        cls = modules[key]
        for name, (child, count) in cls.children.items():
            child_cls = modules[child]
            if child_cls.name == "Linear" and child_cls.std:
                out_f, in_f = (d.as_int() for d in child_cls.params["weight"].shape.dims)
                out.append(LinearMember(prefix + name, cls.name, name, cls.origin, in_f, out_f))
            elif count is None:
                visit(child, f"{prefix}{name}.")
            else:
                for i in range(count):
                    visit(child, f"{prefix}{name}.{i}.")

    visit(program.root, "")
    order = {p.path: i for i, p in enumerate(program.params)}
    return sorted(out, key=lambda m: order.get(m.path + ".weight", len(order)))


def _head(program: Any) -> str | None:
    """The output head's member path (`lm_head`), left out of `all-linear` as PEFT leaves it out."""
    return "lm_head" if program.param("lm_head.weight") is not None else None


def select_members(program: Any, targets: str | None, model_type: str | None) -> tuple[list[LinearMember], Any]:
    """The `Linear` members `targets` picks (see the module docstring) and `target_modules` as PEFT's config spells
    the choice. Raises TrainError when the pattern matches no `Linear` member (listing them), when the family has
    no default, and when the pattern picks a declaration in some of its instances only."""
    members = linear_members(program)
    if targets is None:
        if model_type not in DEFAULT_TARGETS:
            raise TrainError(
                f"PEFT has no default LoRA targets for {model_type or program.model}: give --lora-targets "
                f"(Linear members: {_member_names(members)})"
            )
        names: list[str] | None = DEFAULT_TARGETS[model_type]
        spelled: Any = list(names)
    elif targets == "all-linear":
        head = _head(program)
        names = None
        spelled = "all-linear"
    elif _NAME_LIST.fullmatch(targets.strip()):
        names = [t.strip() for t in targets.split(",")]
        spelled = names
    else:
        try:
            pattern = re.compile(targets)
        except re.error as err:
            raise TrainError(f"--lora-targets {targets!r} is not a regular expression: {err}") from None
        names = None
        spelled = targets
    if targets == "all-linear":
        chosen = [m for m in members if m.path != head]
    elif names is not None:
        chosen = [m for m in members if any(m.path == n or m.path.endswith("." + n) for n in names)]
    else:
        chosen = [m for m in members if pattern.fullmatch(m.path)]
    if not chosen:
        raise TrainError(
            f"--lora-targets {targets!r} matches no Linear member of {program.model} (Linear members: "
            f"{_member_names(members)}; a list of names matches a path's last parts, anything else must match "
            "the whole path, e.g. 'model.layers.0.self_attn.q_proj')"
        )
    picked = {m.path for m in chosen}
    for decl in {(m.module, m.member) for m in chosen}:
        instances = [m for m in members if (m.module, m.member) == decl]
        left = [m.path for m in instances if m.path not in picked]
        if left:
            raise TrainError(
                f"--lora-targets {targets!r} picks {decl[0]}.{decl[1]} in some instances only (not in "
                f"{', '.join(left[:4])}{', ...' if len(left) > 4 else ''}): LoRA rewrites the member's declaration, "
                "so it adapts every instance of it"
            )
    return chosen, spelled


def _member_names(members: list[LinearMember]) -> str:
    """`q_proj, k_proj, ...` (each declaration once, with a path of it)."""
    seen: dict[tuple[str, str], str] = {}
    for m in members:
        seen.setdefault((m.module, m.member), m.path)
    return ", ".join(f"{decl[1]} ({path})" for decl, path in seen.items())


def lora_source(
    path: str, text: str, members: list[LinearMember], r: int, scaling: float, lora_dropout: float = 0.0
) -> str:
    """`text` (the source at `path`) with each of `members`' declarations rewritten to `LoraLinear(..., r=r,
    scaling=scaling)` (and `lora_dropout=p` when `lora_dropout` > 0) and `LoraLinear` appended (the one with dropout
    on the adapter's input when `lora_dropout` > 0). Raises TrainError for a member declared in another file, or a
    source that already defines `LoraLinear`."""
    from linnet.semantics.program import Document
    from linnet.syntax import ast as A

    doc = Document(path, text)
    items = {i.name: i for i in doc.items if i.kind in ("module", "model")}
    if LORA_MODULE in items:
        raise TrainError(f"{path} defines a module `{LORA_MODULE}`, the name the LoRA transform adds")
    edits: list[tuple[int, int, str]] = []
    for module, member in sorted({(m.module, m.member) for m in members}):
        item = items.get(module)
        if item is None:
            origin = next(m.origin for m in members if m.module == module)
            raise TrainError(
                f"LoRA rewrites the model's own source, and {module}.{member} is declared in {origin}, not {path}"
            )
        decl = next((d for d in _field_decls(item.ast.members, A) if d.name.id == member), None)
        if decl is None or decl.ctor is None:
            raise TrainError(f"{path}: cannot find the declaration of {module}.{member}")
        call = decl.ctor
        start, end = item.absolute(call.span)
        f_start, f_end = item.absolute(call.func.span)
        if text[end - 1] != ")":
            raise TrainError(f"{path}: cannot rewrite {module}.{member}'s constructor")
        edits.append((f_start, f_end, LORA_MODULE))
        dropout = f", lora_dropout={float(lora_dropout)!r}" if lora_dropout else ""
        edits.append((end - 1, end - 1, f", r={r}, scaling={float(scaling)!r}{dropout}"))
    for start, end, new in sorted(edits, reverse=True):
        text = text[:start] + new + text[end:]
    return text.rstrip("\n") + "\n" + (LORA_LINEAR_DROPOUT_SOURCE if lora_dropout else LORA_LINEAR_SOURCE)


def _field_decls(members: list, A: Any):
    for m in members:
        if isinstance(m, A.FieldDecl):
            yield m
        elif isinstance(m, A.MemberIf):
            yield from _field_decls(m.then, A)
            yield from _field_decls(m.orelse, A)


class _AddedTensors:
    """Makes the checkpoint view that adds the adapters' tensors (fresh or read from a PEFT folder) to the base
    checkpoint, under the program's paths."""

    def __init__(self, tensors: dict[str, np.ndarray] | None, members: list[LinearMember], r: int, seed: int):
        self.tensors = tensors
        self.members = members
        self.r = r
        self.seed = seed

    def fresh(self) -> dict[str, np.ndarray]:
        """A ~ U(-1/√in, 1/√in) (kaiming_uniform_ with a=√5, PEFT's default init), B = 0, drawn in member order from
        one Mersenne Twister seeded with `seed`: the values `torch.rand(..., generator=torch.Generator()
        .manual_seed(seed))` draws, computed without torch (`torch_rand_f32`), so JAX trains without it."""
        twister = np.random.RandomState(self.seed)
        out = {}
        for m in self.members:
            bound = np.float32(1.0 / math.sqrt(m.in_features))
            a = torch_rand_f32(twister, (self.r, m.in_features)) * np.float32(2 * bound) - bound
            out[f"{m.path}.lora_A.weight"] = a
            out[f"{m.path}.lora_B.weight"] = np.zeros((m.out_features, self.r), dtype=np.float32)
        return out

    def __call__(self, program: Any, ckpt: Any) -> Any:
        from linnet.runtimes.formats.checkpoints import Checkpoint

        tensors = self.tensors if self.tensors is not None else self.fresh()
        inner = ckpt

        class AdapterView(Checkpoint):
            def shape(self, name):
                return tuple(tensors[name].shape) if name in tensors else inner.shape(name)

            def dtype(self, name):
                return "f32" if name in tensors else inner.dtype(name)

            def load(self, name, dtype=None):
                if name in tensors:
                    return tensors[name].astype(np.float32, copy=True)
                return inner.load(name, dtype)

            def tokenizer(self):
                return inner.tokenizer()

            def close(self):
                inner.close()

        names = list(inner.tensor_names) + [n for n in tensors if n not in set(inner.tensor_names)]
        return AdapterView(inner.source, inner.format, inner.config, names, set(inner.buffer_names), inner.path)


def torch_rand_f32(twister: np.random.RandomState, shape: tuple[int, ...]) -> np.ndarray:
    """f32[shape] in [0, 1): what `torch.rand(shape, dtype=torch.float32, generator=g)` draws on the CPU from a
    generator in the state `twister` is in (both are MT19937 seeded by `init_genrand`; torch's `uniform_real` keeps
    the low 24 bits of each 32-bit output and scales them by 2^-24: aten/src/ATen/core/TransformationHelper.h)."""
    raw = twister._bit_generator.random_raw(int(np.prod(shape)))
    return ((raw & 0xFFFFFF).astype(np.float32) * np.float32(2.0**-24)).reshape(shape)


def _model_type(program: Any, checkpoint: Any) -> str | None:
    from linnet.runtimes.export.hf import FAMILIES

    stored = checkpoint.config.get("model_type") if checkpoint is not None else None
    return stored or FAMILIES.get(program.model)


def prepare_with_adapters(
    source: str | Path,
    weights: str | Path | None,
    lora: LoraSettings | None,
    *,
    adapter: str | Path | None = None,
    preset: str | None = None,
    config: dict[str, Any] | None = None,
    seed: int = 42,
    max_batch: int = 1,
    dtype: str = "f32",
):
    """The LoRA-transformed program prepared with its weights, for any backend: `source` with `weights`, its
    `Linear` members chosen as `lora` says (fresh adapters from `seed`), or as the PEFT folder `adapter` says (its
    r, lora_alpha and target_modules, its weights), in `dtype` (f32; bf16 for JAX's mixed precision), with
    `max_batch` KV-cache rows (GRPO samples its completions through `step`). Returns (a `loading.Prepared` whose
    checkpoint view holds the adapters' tensors, the `LoraAdapters`). A backend's `load_prepared` makes the model.

    Raises TrainError (targets, adapter folder), LoadError (source, weights)."""
    from linnet.ir.build import read_source

    from ..loading import LoadOptions, prepare

    path, text = read_source(source)
    base = prepare(path, weights, LoadOptions(preset, config, "f32"), text=text)
    tensors = None
    if adapter is not None:
        lora, targets_spelled, tensors = read_adapter(adapter)
        lora = LoraSettings(lora.r, lora.lora_alpha, lora.lora_dropout, targets_spelled)
    if lora is None:
        raise TrainError("LoRA needs settings or an adapter folder")
    lora.check()
    model_type = _model_type(base.program, base.checkpoint)
    members, spelled = select_members(base.program, lora.targets, model_type)
    if tensors is not None:
        tensors = _adapter_tensors(tensors, members, adapter)
    new_text = lora_source(path, text, members, lora.r, lora.scaling, lora.lora_dropout)
    view = _AddedTensors(tensors, members, lora.r, seed)
    options = LoadOptions(preset, config, dtype, max_batch=max_batch)
    prepared = prepare(path, base.weights, options, text=new_text, view=view)
    return prepared, LoraAdapters(lora, members, spelled, path, base.weights, preset, config, model_type)


def load_with_adapters(
    source: str | Path,
    weights: str | Path | None,
    lora: LoraSettings | None,
    *,
    adapter: str | Path | None = None,
    backend: str = "torch",
    preset: str | None = None,
    config: dict[str, Any] | None = None,
    seed: int = 42,
    progress: bool = False,
    max_batch: int = 1,
    device: str = "cpu",
    dtype: str = "f32",
):
    """`prepare_with_adapters`, loaded on `backend` (one that trains, on `device`, with its trainer's `LOAD_OPTIONS`:
    on `jax` every weight under its checkpoint name, so gradients come back by name). Returns (the `TorchModel` or
    `JaxModel`, with `.lora` its `LoraAdapters`; the adapters' paths, the parameters to train). Raises TrainError,
    LoadError, BackendError."""
    from ..backends import check_options, get_backend
    from ..loading import LoadOptions

    b = get_backend(backend)
    if not b.can_train:
        raise TrainError(f"LoRA loads on the backends that train; {backend} is {b.label}")
    check_options(b, dtype, "equivalent", device)  # what `Backend.load` checks, which this load goes around
    problem = b.runtime_module().device_problem(device)
    if problem is not None:
        raise BackendError(f"backend {b.name}: {problem}")
    prepared, adapters = prepare_with_adapters(
        source, weights, lora, adapter=adapter, preset=preset, config=config, seed=seed, max_batch=max_batch,
        dtype=dtype,
    )  # fmt: skip
    options = LoadOptions(device=device, progress=progress)
    model = b.runtime_module().load_prepared(prepared, options, b.mode, **b.trainer_module().LOAD_OPTIONS)
    model.lora = adapters
    return model, adapters.paths()


def _adapter_tensors(tensors: dict[str, np.ndarray], members: list[LinearMember], folder: Any) -> dict:
    """PEFT's names (`base_model.model.<path>.lora_A.weight`) -> the program's paths, every adapted member found."""
    out = {}
    for name, a in tensors.items():
        path = name.removeprefix("base_model.model.")
        out[path] = a
    wanted = [f"{m.path}.{ab}.weight" for m in members for ab in ("lora_A", "lora_B")]
    missing = [w for w in wanted if w not in out]
    extra = [p for p in out if p not in set(wanted)]
    if missing or extra:
        lines = [f"{folder}: the adapter's tensors don't match the members its target_modules picks"]
        if missing:
            lines.append(f"  missing: {', '.join(missing[:4])}")
        if extra:
            lines.append(f"  not an adapted member's: {', '.join(extra[:4])}")
        raise TrainError("\n".join(lines))
    return {w: out[w] for w in wanted}


def read_adapter(folder: str | Path) -> tuple[LoraSettings, str | None, dict[str, np.ndarray]]:
    """A PEFT LoRA adapter folder: (its settings, its target_modules as a `--lora-targets` string, its tensors by
    PEFT name). Raises TrainError for a missing, truncated or corrupt file, a tensor holding NaN or Inf (naming the
    file and tensor), a missing or non-numeric `r` / `lora_alpha`, another PEFT method, or options Linnet does not
    run (DoRA, rsLoRA, biases, fan_in_fan_out, per-module ranks)."""
    from math import isfinite

    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    from linnet.runtimes.formats.checkpoints import CheckpointError, check_finite

    p = Path(folder)
    try:
        cfg = json.loads((p / "adapter_config.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise TrainError(f"{p}: no adapter_config.json (a PEFT adapter folder has it)") from None
    except (OSError, json.JSONDecodeError) as err:
        raise TrainError(f"{p / 'adapter_config.json'}: cannot read it ({err})") from None
    if cfg.get("peft_type") != "LORA":
        raise TrainError(f"{p}: a {cfg.get('peft_type')} adapter; Linnet loads LORA adapters")
    unsupported = {
        "use_dora": False,
        "use_rslora": False,
        "bias": "none",
        "fan_in_fan_out": False,
        "rank_pattern": {},
        "alpha_pattern": {},
    }
    for key, default in unsupported.items():
        if cfg.get(key, default) not in (default, None):
            raise TrainError(f"{p}: adapter_config.json sets {key} = {cfg[key]!r}, which Linnet does not run yet")
    targets = cfg.get("target_modules")
    spelled = targets if isinstance(targets, str) or targets is None else ",".join(targets)
    file = p / "adapter_model.safetensors"
    try:
        tensors = load_file(str(file))
    except FileNotFoundError:
        raise TrainError(f"{p}: no adapter_model.safetensors") from None
    except (SafetensorError, OSError, TypeError, ValueError) as err:  # truncated or corrupt; a dtype numpy lacks
        raise TrainError(
            f"{file}: cannot read the adapter's tensors ({err}); the file is truncated or corrupt"
        ) from None
    out = {}
    for name, value in tensors.items():  # NaN/Inf would train to "loss nan" and exit 0
        try:
            out[name] = check_finite(np.asarray(value, dtype=np.float32), name, file)
        except CheckpointError as err:
            raise TrainError(err.message.replace("the checkpoint is corrupt", "the adapter is corrupt")) from None
    fields = {"r": cfg.get("r"), "lora_alpha": cfg.get("lora_alpha"), "lora_dropout": cfg.get("lora_dropout") or 0.0}
    bad = [k for k, v in fields.items() if isinstance(v, bool) or not isinstance(v, int | float) or not isfinite(v)]
    if bad or not float(fields["r"]).is_integer() or fields["r"] < 1:
        shown = ", ".join(f"{k} = {json.dumps(fields[k])}" for k in bad or ["r"])
        raise TrainError(f"{p / 'adapter_config.json'}: {shown}; r must be an integer >= 1, lora_alpha a number")
    settings = LoraSettings(int(fields["r"]), float(fields["lora_alpha"]), float(fields["lora_dropout"]), spelled)
    return settings, spelled, out


def _host(tensor: Any) -> np.ndarray:
    """A torch tensor or a JAX array as a numpy array on the host."""
    if type(tensor).__module__.startswith("torch"):
        from linnet.runtimes.backends.torch_backend import to_numpy

        return to_numpy(tensor)
    return np.asarray(tensor)


def save_adapter(model: Any, folder: str | Path, settings: LoraSettings | None = None, base_model: str | None = None):
    """Write `model`'s adapters (a model from `load_with_adapters`) in PEFT's format into `folder`:
    `adapter_config.json` (PEFT's LoraConfig fields, `task_type` CAUSAL_LM) and `adapter_model.safetensors` with
    PEFT's names, `base_model.model.<path>.lora_{A,B}.weight`, f32. Returns the files written."""
    from safetensors.numpy import save_file

    info: LoraAdapters = model.lora
    s = info.settings
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    held = model.module.state_dict() if hasattr(model, "module") else model.params  # torch, or JAX arrays
    # JAX's bf16 mixed precision trains f32 master values (`JaxPolicy.commit` leaves them here): PEFT's f32 adapters
    held = {**held, **getattr(model, "master_params", {})}
    tensors = {f"base_model.model.{p}": np.ascontiguousarray(_host(held[p]), dtype=np.float32) for p in info.paths()}
    save_file(tensors, str(folder / "adapter_model.safetensors"), metadata={"format": "pt"})
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model if base_model not in (None, "None") else info.weights,
        "r": s.r,
        "lora_alpha": s.lora_alpha,
        "lora_dropout": s.lora_dropout,
        "target_modules": info.target_modules,
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "init_lora_weights": True,
        "inference_mode": True,
        "modules_to_save": None,
        "layers_to_transform": None,
        "layers_pattern": None,
        "rank_pattern": {},
        "alpha_pattern": {},
    }
    (folder / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return [folder / "adapter_config.json", folder / "adapter_model.safetensors"]


@contextlib.contextmanager
def adapters_disabled(module: Any):
    """Within, the model computes its base: every `lora_B` weight reads as zeros (so each adapter adds exactly 0),
    as PEFT's `disable_adapter()`; the trained parameters are put back on exit. For forwards without gradients
    (the DPO reference)."""
    import torch
    from torch import nn

    swapped = []
    for path, (owner, leaf) in module._leaves.items():
        if path.endswith(".lora_B.weight"):
            original = getattr(owner, leaf)
            zeros = nn.Parameter(torch.zeros_like(original), requires_grad=False)
            owner.register_parameter(leaf, zeros)
            module.tensors[path] = zeros
            swapped.append((path, owner, leaf, original))
    try:
        yield
    finally:
        for path, owner, leaf, original in swapped:
            owner.register_parameter(leaf, original)
            module.tensors[path] = original


def merged_weights(model: Any) -> dict[str, np.ndarray]:
    """The base model's parameters with each adapter merged in: `W + scaling · B @ A` (PEFT's `merge_and_unload`,
    `get_delta_weight`), by path, f32."""
    from ..model_weights import model_weights

    info: LoraAdapters = model.lora
    held = model_weights(model)
    adapted = {m.path for m in info.members}
    out = {p: a for p, a in held.items() if ".lora_A." not in p and ".lora_B." not in p}
    for path in adapted:
        a, b = held[f"{path}.lora_A.weight"], held[f"{path}.lora_B.weight"]
        out[f"{path}.weight"] = (out[f"{path}.weight"] + info.settings.scaling * (b @ a)).astype(np.float32)
    return out


def export_merged(model: Any, out_dir: str | Path, dtype: str | None = None) -> list[Path]:
    """Write `model` (with adapters) merged into its base as a Hugging Face folder through `export_hf`: the base
    source is loaded again with the merged weights bound. Raises ExportError as `export_hf` does."""
    from linnet.runtimes.backends.torch_backend import load_prepared, to_torch
    from linnet.runtimes.export.hf import export_hf

    from ..loading import LoadOptions, prepare

    info: LoraAdapters = model.lora
    base = load_prepared(
        prepare(info.source, info.weights, LoadOptions(info.preset, info.config, "f32")), LoadOptions(progress=False)
    )
    for path, a in merged_weights(model).items():
        base.module.bind(path, to_torch(a))
    return export_hf(base, out_dir, dtype=dtype)
