"""The training tests' shrunk Llama (`tiny_llama`), shared with the distributed training tests here."""

from tests.runtimes.train.conftest import tiny_llama  # noqa: F401 (a fixture)
