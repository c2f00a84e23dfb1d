"""The reference implementation of a checkpoint, for `linnet diff`: which library class its `architectures` names,
loaded from the same files Linnet loads, and how each Linnet entry maps to a call of it (as the parity tests call it).

- transformers: config.json's `architectures[0]` (a GGUF file has none: the source's root model name, which the zoo
  names after transformers' class), loaded with `from_pretrained` (`gguf_file=` for a .gguf; transformers dequantizes
  it with its own converter, an independent reader).
- diffusers: config.json's `_class_name` (`AutoencoderKL`, `UNet2DConditionModel`).
- sentence-transformers: the folder as a `SentenceTransformer`, whose first module holds the transformers model the
  checkpoint names are relative to (`0.auto_model`).

Entries and the calls they are compared with (`reference_call`): a decoder's `forward(input_ids)` is the logits; its
`step` at positions 0 is the logits at the last position of the same call; an encoder's `forward(input_ids,
attention_mask)` and a vision model's `forward(pixel_values)` are the model's first output (`logits`, else
`last_hidden_state`); an encoder-decoder's `encode(input_features)` and `prefill_encoder` are the encoder's
`last_hidden_state`; `embed_text` / `embed_image` are `get_text_features` / `get_image_features` (SigLIP) or
`get_image_embeddings` (SAM); a VAE's `decode(latents)` is `decode(...).sample`; a UNet's `forward` is the noise
prediction with the added conditions as `added_cond_kwargs`. Anything else is skipped with the reason.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

from linnet.errors import LinnetError

LIBRARIES = ("transformers", "diffusers", "sentence-transformers")


class ReferenceUnavailable(LinnetError):
    """The reference cannot run here: its library is not installed, it has no class for the checkpoint's
    architecture, or it cannot read the checkpoint (`linnet diff` exits 2 with this message)."""


class NoCall(Exception):
    """An entry with no known reference call (the reason is the message): skipped, not a difference."""


def checkpoint_files(weights: str) -> tuple[Path, str | None]:
    """The folder of `weights` and, for a GGUF checkpoint, the file's name inside it: an embedded id is resolved to
    its package's file (`linnet.runtimes.formats.embedded`). Raises ReferenceUnavailable for a path that is
    neither a folder nor a file, or an embedded id whose package is missing."""
    from linnet.runtimes.formats.embedded import EMBEDDED, resolve_embedded

    if weights in EMBEDDED:
        try:
            path, kind = resolve_embedded(weights)
        except LinnetError as err:
            raise ReferenceUnavailable(str(err)) from None
        return (path.parent, path.name) if kind == "gguf" else (path, None)
    path = Path(weights)
    if path.is_dir():
        return path, None
    if path.is_file():
        return path.parent, path.name
    raise ReferenceUnavailable(f"--weights {weights}: no such folder or file")


def architecture(folder: Path, gguf_file: str | None, library: str, root_model: str) -> str:
    """The class the reference library builds for the checkpoint: config.json's `architectures[0]` (transformers) or
    `_class_name` (diffusers); the source's root model for a GGUF file or a config.json without one."""
    config = folder / "config.json"
    data: dict[str, Any] = {}
    if gguf_file is None and config.is_file():
        try:
            data = json.loads(config.read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            raise ReferenceUnavailable(f"cannot read {config}: {err}") from None
    if library == "diffusers":
        return str(data.get("_class_name") or root_model)
    names = data.get("architectures") or [root_model]
    return str(names[0])


def load_reference(weights: str, library: str, root_model: str):
    """The reference model of `weights` in f32, in eval mode, and the name of its architecture. Raises
    ReferenceUnavailable (library not installed, no such class, a checkpoint it cannot read)."""
    if library not in LIBRARIES:
        raise ReferenceUnavailable(f"--reference must be one of {', '.join(LIBRARIES)}, got {library!r}")
    folder, gguf_file = checkpoint_files(weights)
    module_name = library.replace("-", "_")
    try:
        lib = importlib.import_module(module_name)
    except ImportError as err:
        why = f"the reference {library} cannot be imported ({err}); pip install {library}"
        raise ReferenceUnavailable(why) from None
    import torch

    _quiet_progress(library)
    arch = architecture(folder, gguf_file, library, root_model)
    try:
        if library == "sentence-transformers":
            model = lib.SentenceTransformer(str(folder), device="cpu")[0].auto_model
            arch = type(model).__name__
        else:
            cls = getattr(lib, arch, None)
            if cls is None:
                why = f"{library} {lib.__version__} has no class {arch} (the checkpoint's architecture)"
                raise ReferenceUnavailable(why)
            kwargs: dict[str, Any] = {"gguf_file": gguf_file} if gguf_file else {}
            if library == "transformers":
                kwargs["dtype"] = torch.float32
            model = cls.from_pretrained(str(folder), **kwargs)
    except ReferenceUnavailable:
        raise
    except Exception as err:  # noqa: BLE001 - a library's own failure to read the checkpoint is the reason to print
        raise ReferenceUnavailable(f"{library} cannot load {weights} as {arch}: {type(err).__name__}: {err}") from None
    return model.eval(), arch


def _quiet_progress(library: str) -> None:
    """No progress bars from the reference's loading: stderr is the report's, and the loads are quick."""
    base = "diffusers" if library == "diffusers" else "transformers"
    importlib.import_module(base).utils.logging.disable_progress_bar()


def reference_call(model, entry: str, inputs: dict[str, Any], encoder_input=None):
    """The reference's output for Linnet entry `entry` on `inputs` (name -> torch tensor, the entry's arguments):
    the tensor the entry's output is compared with; `encoder_input`: the `input_features` an encoder-decoder's
    `step` follows. Raises NoCall for an entry with no known counterpart."""
    names = set(inputs)
    if entry == "step" and names >= {"input_ids", "positions", "rows"}:
        if getattr(model.config, "is_encoder_decoder", False):
            if encoder_input is None:
                raise NoCall("a decoder step reads the encoder's cache, and the source has no `prefill_encoder`")
            out = model(input_features=encoder_input, decoder_input_ids=inputs["input_ids"])
            return out.logits[:, -1]
        return first_tensor(model(input_ids=inputs["input_ids"]))[:, -1]
    if entry in ("encode", "prefill_encoder") and "input_features" in names:
        return first_tensor(model.get_encoder()(input_features=inputs["input_features"]))
    if entry == "embed_text":
        return _normalized(first_tensor(model.get_text_features(input_ids=inputs["input_ids"]), pooled=True))
    if entry == "embed_image":
        if hasattr(model, "get_image_embeddings"):
            return first_tensor(model.get_image_embeddings(inputs["pixel_values"]))
        return _normalized(first_tensor(model.get_image_features(pixel_values=inputs["pixel_values"]), pooled=True))
    if entry == "decode" and "latents" in names:
        return model.decode(inputs["latents"]).sample
    if entry == "forward":
        if {"sample", "timestep", "encoder_hidden_states"} <= names:
            added = {k: inputs[k] for k in names - {"sample", "timestep", "encoder_hidden_states"}}
            return model(inputs["sample"], inputs["timestep"], encoder_hidden_states=inputs["encoder_hidden_states"],
                         added_cond_kwargs=added or None).sample  # fmt: skip
        out = model(**inputs)
        if {"input_ids", "pixel_values"} <= names and hasattr(out, "logits_per_image"):
            return out.logits_per_image
        return first_tensor(out)
    raise NoCall(f"no reference call is known for entry `{entry}` ({', '.join(sorted(names))})")


def _normalized(embeds):
    """Embeddings scaled to unit length, as SigLIP's forward scales them (`text_embeds`, `image_embeds`)."""
    return embeds / embeds.norm(p=2, dim=-1, keepdim=True)


def first_tensor(out, pooled: bool = False):
    """The tensor a module's output stands for: itself, the first tensor of a tuple, or a model output's first
    field (`logits`, `last_hidden_state`; `pooler_output` first when `pooled`). None when it holds no tensor."""
    import torch

    if isinstance(out, torch.Tensor):
        return out
    if pooled and getattr(out, "pooler_output", None) is not None:
        return out.pooler_output
    values = out.values() if hasattr(out, "values") and not isinstance(out, (tuple, list)) else out
    if isinstance(values, (tuple, list)) or hasattr(out, "values"):
        for v in values:
            if isinstance(v, torch.Tensor):
                return v
    return None
