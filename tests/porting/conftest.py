"""The porting suite's fixtures: one torch thread per module, as the parity tests run (tests/runtimes/conftest.py)."""

from tests.runtimes.conftest import one_torch_thread  # noqa: F401
