"""A real `linnet serve` process on loopback for the load, soak and scale-out tests, and the tiny model it serves.

`write_tiny_llama(folder)` saves a seeded 2-layer Llama (hidden 64) with `save_pretrained` and the embedded
SmolLM2's tokenizer (its `tokenizers` backend, EOS `<|im_end|>` and chat template), so a server answers text
prompts in milliseconds per token while tokenizing, stopping and templating exactly as the real model does.

`LiveServer` starts `python -m linnet serve ...` (the CLI users run; `live_server.start_server`) and reads its
state from outside, as an operator would: `/metrics` (Prometheus text, parsed with `prometheus_client`) and the
process's threads, open files and RSS (`psutil`).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from tests.runtimes.serve.live_server import start_server, stop_server

ROOT = Path(__file__).resolve().parents[3]
VOCAB = 49152  # SmolLM2's tokenizer


def write_tiny_llama(folder: Path, seed: int = 0) -> Path:
    """A seeded 2-layer Llama (hidden 64, 4 heads over 2 KV heads, tied head) with SmolLM2's vocabulary, tokenizer
    and chat template, saved as a Hugging Face folder; returns `folder`. Weights are drawn with std 0.2 (not
    transformers' 0.02) so greedy continuations differ from prompt to prompt instead of repeating one token."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from linnet.runtimes.formats.checkpoints import open_checkpoint

    tokenizer = open_checkpoint("smollm2-135m-instruct").tokenizer()
    eos = tokenizer.backend.id_to_token(sorted(tokenizer.eos_token_ids)[0])
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        initializer_range=0.2,
        bos_token_id=tokenizer.backend.token_to_id("<|im_start|>"),
        eos_token_id=sorted(tokenizer.eos_token_ids),
    )
    torch.manual_seed(seed)
    LlamaForCausalLM(config).eval().save_pretrained(folder)
    tokenizer.backend.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"eos_token": eos, "chat_template": tokenizer.chat_template, "backend": "tokenizers"})
    )
    return folder


class LiveServer:
    """`linnet serve ARGS` in its own process on a free loopback port (`live_server.start_server`, whose log
    file is in `folder`), with what an operator reads from outside: `/metrics` and the process's resources.

    `url`: its base URL. Fails the test (with the log) when it does not start."""

    def __init__(self, folder: Path, *args: str) -> None:
        self.proc, self.url, self.log = start_server(folder, *args)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def metrics(self) -> dict[str, float]:
        """`/metrics`' samples by name (labels dropped; one model, so one sample per name and label set that
        matters here; histograms' `_count` and `_sum` kept)."""
        import urllib.request

        from prometheus_client.parser import text_string_to_metric_families

        with urllib.request.urlopen(f"{self.url}/metrics", timeout=10) as response:
            text = response.read().decode()
        values: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                values[sample.name] = values.get(sample.name, 0.0) + sample.value
        return values

    def process_state(self) -> dict[str, float]:
        """The server process's threads, open file descriptors and resident memory (MiB)."""
        import psutil

        p = psutil.Process(self.pid)
        return {"threads": p.num_threads(), "fds": p.num_fds(), "rss_mib": p.memory_info().rss / 2**20}

    def wait_idle(self, timeout_s: float = 30.0) -> dict[str, float]:
        """Wait until no request runs or waits and no cache row is in use; returns the last `/metrics`. Raises
        AssertionError naming the gauges when they do not reach zero in time."""
        deadline = time.monotonic() + timeout_s
        while True:
            m = self.metrics()
            busy = {k: m.get(k) for k in IDLE_GAUGES if m.get(k) != 0}
            if not busy:
                return m
            if time.monotonic() > deadline:
                raise AssertionError(f"the server is still busy {timeout_s} s after the last client: {busy}")
            time.sleep(0.2)

    def stop(self) -> None:
        """SIGTERM (a clean shutdown), once."""
        if self.proc.poll() is None:
            stop_server(self.proc, self.log)


IDLE_GAUGES = ("linnet:num_requests_running", "linnet:num_requests_waiting", "linnet:cache_rows_in_use")


def solo_runner(folder: Path, max_positions: int):
    """The reference: `Generator` (what `linnet generate` runs) over the same checkpoint on the torch backend, one
    request at a time; returns (generator, tokenizer)."""
    from linnet.runtimes.backends import get_backend
    from linnet.runtimes.generation import Generator

    model = get_backend("torch").load(
        ROOT / "examples" / "llama.linnet", weights=folder, max_positions=max_positions, progress=False
    )  # fmt: skip
    tokenizer = model.tokenizer()
    return Generator(model.step_model(), tokenizer), tokenizer
