"""`linnet generate` on an encoder-decoder (Whisper, saved shrunk by transformers) refuses, exit 2 with one line
naming the cache its `step` reads and the entry that fills it, instead of decoding from an empty encoder output and
printing tokens (which it did, exit 0). A decoder still generates."""

from __future__ import annotations

import pytest

from tests.cli.test_cli_errors import linnet, one_line
from tests.conftest import EXAMPLES

pytest.importorskip("torch")
pytest.importorskip("transformers")

pytestmark = pytest.mark.torch


def test_generate_refuses_an_encoder_decoder(tmp_path):
    from tests.runtimes.whisper_checkpoint import SOT, save_small_whisper

    save_small_whisper(tmp_path)
    whisper = EXAMPLES / "whisper.linnet"
    r = linnet("generate", str(whisper), "--weights", str(tmp_path), "--prompt-ids", str(SOT), "--max-new-tokens", "3")
    line = one_line(r, 2)
    assert line == (
        f"linnet generate: {whisper} is an encoder-decoder (`step` reads model.decoder.layers.0.cross_k_cache, "
        "model.decoder.layers.0.cross_v_cache and more, which `prefill_encoder` writes): `linnet generate` feeds the "
        "decoder token ids only and cannot feed its encoder; transcribe speech with `linnet transcribe`"
    )
