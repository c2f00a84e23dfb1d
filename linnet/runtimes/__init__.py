"""What runs a model (`linnet.runtimes`): everything that touches weight files and devices. Nothing here is
imported by `linnet check`.

- `formats/`: checkpoint files read into numpy (Hugging Face folders, GGUF and its quantized types, MXFP4, the
  embedded checkpoints) and the tokenizers they carry.
- `loading.py`: a source, a preset and weights become a configured `Program` bound to checkpoint tensors
  (`LoadOptions`, `prepare`); `headers.py` the same check from the headers alone (`linnet check --weights`).
- `backends/`: the registry (one `Backend` record per `--backend`, with its hooks) and one runtime module per
  framework binding weights to what `linnet.compiler` made; `model.py` the `LoadedModel` protocol they follow.
- `generation.py`, `sampling.py`, `transcription.py`: the one backend-neutral generation runner and sampler.
- `inputs/`: what a model reads besides tokens: chat templates, images, audio.
- `export/`, `serve/`, `train/`, `parallel/`: Hugging Face, GGUF and Triton exports; the serving engine and its
  HTTP server; training; tensor parallelism.
"""
