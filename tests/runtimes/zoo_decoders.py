"""Helpers for the zoo's decoder tests (`test_parity_qwen.py`; any decoder family can use them): a source checked under
its presets at real size, against transformers' own parameter count and a header-only copy of the real checkpoint;
and a shrunk checkpoint made by transformers, loaded through its folder on every backend, compared with transformers
on logits at every position, 32 greedy tokens and cached decode against uncached.

Nothing here imports torch or transformers at import time. Nothing is fetched: the real checkpoints are described
by their config.json (transcribed from the Hugging Face repositories) and the tensor names and shapes transformers
builds from it on the `meta` device."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.runtimes.conftest import (
    ALL_BACKENDS,
    LOGITS_ATOL,
    TPU_LOGITS_ATOL,
    TPU_STATES_ATOL,
    device_label,
    hf_greedy,
    linnet_greedy,
    max_abs_diff,
    record,
    run_device,
)

BACKENDS = ALL_BACKENDS  # every CPU backend, torch-compile marked slow (tests/runtimes/conftest.py)
GREEDY_TOKENS = 32
MAX_POSITIONS = 64
PROMPT_SEED = 3


def meta_model(config_json: dict[str, Any]):
    """The transformers causal LM of `config_json` (a checkpoint's config.json) on the `meta` device: its parameters
    have shapes and no storage, so an 8B model costs nothing."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    values = dict(config_json)
    config = AutoConfig.for_model(values.pop("model_type"), **values)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


_SAFETENSORS_DTYPE = {"bfloat16": ("BF16", 2), "float16": ("F16", 2), "float32": ("F32", 4)}


def header_only_checkpoint(folder: Path, config_json: dict[str, Any]) -> Path:
    """A Hugging Face folder for the real checkpoint `config_json` describes, without its data: config.json as
    published, and a model.safetensors whose header lists the tensors `save_pretrained` would write (names and shapes
    from transformers on `meta`; a tied head is not stored) in the checkpoint's dtype. The file has the right length
    but is sparse, so it takes no disk space; only the header is ever read by name and shape checks."""
    folder.mkdir(parents=True, exist_ok=True)
    if not _sparse_files_supported(folder):
        pytest.skip(f"{folder}'s file system has no sparse files")
    model = meta_model(config_json)
    tied = config_json.get("tie_word_embeddings", False)
    code, width = _SAFETENSORS_DTYPE[config_json.get("torch_dtype", "bfloat16")]
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, tensor in model.state_dict().items():
        if tied and name == "lm_head.weight":
            continue
        nbytes = tensor.numel() * width
        header[name] = {"dtype": code, "shape": list(tensor.shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    (folder / "config.json").write_text(json.dumps(config_json, indent=2) + "\n")
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path = folder / "model.safetensors"
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little") + raw)
        f.truncate(8 + len(raw) + offset)
    return folder


def save_seeded(config, folder: Path, seed: int):
    """The transformers causal LM of `config` with seeded random init, every parameter perturbed away from its init
    (norm scales from 1, biases from 0), saved into `folder` with `save_pretrained`; returned in eval mode."""
    import torch
    from transformers import AutoModelForCausalLM

    from tests.runtimes.conftest import perturb

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).eval()
    perturb(model, seed=seed + 1)
    model.save_pretrained(folder)
    return model


class Reference:
    """transformers' outputs for a saved model, computed once: logits of `ids` [2, 24] at every position and
    `GREEDY_TOKENS` greedy tokens after the first 12 ids of row 0 (through transformers' KV cache)."""

    def __init__(self, model, vocab_size: int):
        import torch

        g = torch.Generator().manual_seed(PROMPT_SEED)
        self.ids = torch.randint(2, vocab_size, (2, 24), generator=g)
        with torch.inference_mode():
            self.logits = model(input_ids=self.ids).logits.numpy()
        self.prompt = self.ids[0, :12].tolist()
        self.greedy = hf_greedy(model, self.prompt, GREEDY_TOKENS)


def check_decoder(source: Path, folder: Path, ref: Reference, backend: str, what: str, device: str = "cpu") -> None:
    """Load `folder` with `source` on `backend` and compare with transformers: logits at every position within
    LOGITS_ATOL and the same argmax, the same `GREEDY_TOKENS` greedy tokens, and the KV cache's logits (a prefill of
    5 tokens, then one token per step) equal to the uncached forward's at every position. Prints each max |Δ|.
    `device` "tpu" runs on the device of the tests marked tpu, within their bounds (TPU_LOGITS_ATOL,
    TPU_STATES_ATOL)."""
    import linnet

    m = linnet.load(source, folder, backend=backend, device=run_device(device), max_positions=MAX_POSITIONS,
                    progress=False)  # fmt: skip
    assert m.notes == []  # every config.json key is a field or inert, every tensor is used
    logits_atol, cache_atol = (TPU_LOGITS_ATOL, TPU_STATES_ATOL) if device == "tpu" else (LOGITS_ATOL, 1e-4)
    label = device_label(backend, device)

    ours = np.array(m.forward(ref.ids.numpy()))
    delta = max_abs_diff(ours, ref.logits)
    record(f"{what} ({label}) logits {list(ours.shape)} vs transformers", delta, model=source.stem, backend=label,
           checkpoint=what)  # fmt: skip
    assert delta < logits_atol
    assert np.array_equal(ours.argmax(-1), ref.logits.argmax(-1))

    assert linnet_greedy(m, ref.prompt, GREEDY_TOKENS) == ref.greedy

    prefill, tokens = 5, ref.ids[1:, :16].numpy()
    m.reset_state()
    step = m.step_model().step
    cached = [step(tokens[:, :prefill], np.array([0]), np.array([0]))[0]]
    for p in range(prefill, tokens.shape[1]):
        cached.append(step(tokens[:, p : p + 1], np.array([p]), np.array([0]))[0])
    uncached = np.array(m.forward(tokens))[0, prefill - 1 :]
    delta = max_abs_diff(np.stack(cached), uncached)
    record(f"{what} ({label}) cached decode vs uncached forward, positions {prefill - 1}..15", delta,
           model=source.stem, backend=label, checkpoint=what, against="forward")  # fmt: skip
    assert delta < cache_atol


def check_real_checkpoint(source: Path, preset: str, folder: Path) -> None:
    """Prepare `source` on the header-only checkpoint `folder` (header_only_checkpoint) as a load would, without
    reading any data: its config.json binds, and every tensor's name and shape is the source's (else LoadError
    L501, L502, L503). The config it binds to equals preset `preset`'s, so the preset is that checkpoint's size."""
    from linnet.ir import build
    from linnet.runtimes.loading import LoadOptions, prepare

    loaded = prepare(source, folder, LoadOptions(max_positions=16))
    assert len(loaded.plan) == len(loaded.program.params)
    assert loaded.notes == []
    assert loaded.program.config == build(source, preset=preset, max_positions=16).config


def _sparse_files_supported(folder: Path) -> bool:
    """Whether `folder`'s file system stores a truncated-up file without allocating it (the header-only
    checkpoints of 8B models would otherwise write 16 GB)."""
    probe = folder / "sparse-probe"
    with open(probe, "wb") as f:
        f.truncate(1 << 30)
    allocated = os.stat(probe).st_blocks * 512
    probe.unlink()
    return allocated < (1 << 20)
