"""A loaded model written in the formats other engines read: a Hugging Face folder (`hf`: transformers, vLLM,
TGI), a GGUF file (`gguf`: llama.cpp, Ollama), a Triton Inference Server model repository (`triton`). The public
entry points are `linnet.export.hf`, `.gguf` and `.triton`."""
