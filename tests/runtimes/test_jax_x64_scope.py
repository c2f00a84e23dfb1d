"""Linnet leaves JAX's process-wide config alone: loading a small Llama on `jax` and `xla`, running `forward`,
generating token by token and in decode loops (one row's `GreedyLoop`, a batch's `BatchSteps`), from the main
thread and from another (as the serving engine does), leaves `jax_enable_x64` off and `jnp.arange(3)` i32 for the
caller, while the generated code still runs with its i64 (a trace with 32-bit types would warn that it truncates
i64, which the child turns into an error). The outputs are checked against the PyTorch backend (generated code,
the same seeded weights), whose parity with transformers test_parity_llama.py holds.

It runs in a fresh process: earlier tests in a pytest process may have turned x64 on themselves."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tests.conftest import ROOT
from tests.runtimes.conftest import LLAMA

pytest.importorskip("jax")
pytestmark = pytest.mark.jax

from tests.runtimes.test_jax_backend import SMALL  # noqa: E402  (8 query heads over 2 KV heads)

PROMPT = [3, 17, 42, 5, 88, 61, 9]
NEW_TOKENS = 12

CHILD = """
import json, sys, threading, warnings
# a trace under 32-bit types truncates the IR's i64 ("Explicitly requested dtype int64 ... truncated"): fail on it
warnings.filterwarnings("error", message="Explicitly requested dtype")
import jax
import jax.numpy as jnp
import numpy as np
import linnet.jax as lj
from linnet.runtimes.generation import Generator
from linnet.runtimes.sampling import SamplingParams

config, prompt, new = json.loads(sys.argv[1]), json.loads(sys.argv[2]), int(sys.argv[3])
greedy = SamplingParams(max_new_tokens=new)
out = {"x64_before": bool(jax.config.jax_enable_x64)}
for mode in ("generated", "stablehlo"):
    m = lj.load("{llama}", config=config, mode=mode, max_positions=64, max_batch=2, random_weights=True, seed=1,
                progress=False)
    (logits,) = m.run("forward", np.array([prompt]))
    row = {"forward": logits[0, -1].tolist(), "forward_dtype": str(logits.dtype)}
    row["tokens"] = Generator(m.step_model(), None).generate(prompt, greedy).token_ids
    row["loop"] = Generator(m.step_model(decode_loop=True), None).generate(prompt, greedy).token_ids
    batch = Generator(m.step_model(decode_loop=True, batch_buckets=True), None).generate_batch([prompt, prompt], greedy)
    row["batch_steps"] = [r.token_ids for r in batch]
    seen = {}
    worker = threading.Thread(target=lambda: seen.update(
        tokens=Generator(m.step_model(), None).generate(prompt, greedy).token_ids, x64=bool(jax.config.jax_enable_x64)))
    worker.start()
    worker.join()
    row["thread_tokens"], row["thread_x64_after"] = seen["tokens"], seen["x64"]
    row["x64_after"] = bool(jax.config.jax_enable_x64)
    row["arange_dtype"] = str(jnp.arange(3).dtype)
    row["float_dtype"] = str(jnp.asarray(1.0).dtype)
    out[mode] = row
print("RESULT " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def child() -> dict:
    code = textwrap.dedent(CHILD).replace("{llama}", str(LLAMA))
    args = [json.dumps(SMALL), json.dumps(PROMPT), str(NEW_TOKENS)]
    done = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))


@pytest.mark.parametrize("mode", ["generated", "stablehlo"])
def test_loading_and_generating_leave_jax_config_alone(child, mode):
    row = child[mode]
    assert child["x64_before"] is False
    assert row["x64_after"] is False and row["thread_x64_after"] is False
    assert row["arange_dtype"] == "int32" and row["float_dtype"] == "float32"
    assert row["forward_dtype"] == "float32"


@pytest.mark.parametrize("mode", ["generated", "stablehlo"])
def test_outputs_under_the_scope_match_the_pytorch_backend(child, mode):
    pytest.importorskip("torch")
    import linnet
    from linnet.runtimes.generation import Generator
    from linnet.runtimes.sampling import SamplingParams

    m = linnet.load(LLAMA, config=SMALL, backend="torch", max_positions=64, random_weights=True, seed=1, progress=False)
    (logits,) = m.run("forward", np.array([PROMPT]))
    expected = Generator(m.step_model(), None).generate(PROMPT, SamplingParams(max_new_tokens=NEW_TOKENS)).token_ids
    row = child[mode]
    delta = np.abs(np.array(row["forward"]) - logits[0, -1]).max()
    print(f"small Llama, {mode} under the x64 scope vs torch generated: last logits max |d| {delta:.2e}")
    assert delta < 1e-4
    assert row["tokens"] == expected
    assert row["loop"] == expected and row["thread_tokens"] == expected
    assert row["batch_steps"] == [expected, expected]
