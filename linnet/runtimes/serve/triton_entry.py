"""The `model.py` of a repository written by `linnet export triton` (copied there as is; docs/triton.md).

Triton's Python backend runs this file in its stub process, an embedded CPython (the system's libpython3.11) that
ignores PYTHONPATH and knows nothing of Linnet's environment, and the stub imports `triton_python_backend_utils`
(which imports numpy) right after this module, before `initialize`. So on import, this module puts the environment
on sys.path from two parameters of the model's config.pbtxt (the folder above this file): `python_path` goes
first (the numpy < 2 folder of tools/tritonserver.sh: the stub's pybind11 reads numpy arrays with numpy 1's struct
layout), then `site_packages` is added with `site.addsitedir` (which also runs its .pth files: editable installs).
The work is then `linnet.runtimes.serve.triton.LinnetModel`'s. Only the standard library is imported here.
"""

import json
import re
import site
import sys
from pathlib import Path


def _parameter(config_text, key):
    """The string value of parameter `key` in config.pbtxt's text ("" when absent)."""
    pattern = r'key:\s*"' + key + r'"\s*value:\s*\{\s*string_value:\s*("(?:[^"\\]|\\.)*")'
    found = re.search(pattern, config_text)
    return json.loads(found.group(1)) if found else ""


def _use_linnet_environment():
    config = Path(__file__).resolve().parent.parent / "config.pbtxt"
    if not config.is_file():  # imported from the installed package (tests), not run by the stub
        return
    config_text = config.read_text(encoding="utf-8")
    first = [p for p in _parameter(config_text, "python_path").split(":") if p and p not in sys.path]
    sys.path[:0] = first
    if _parameter(config_text, "site_packages"):
        site.addsitedir(_parameter(config_text, "site_packages"))


_use_linnet_environment()


class TritonPythonModel:
    """Triton's entry points, handed to `linnet.runtimes.serve.triton.LinnetModel`."""

    def initialize(self, args):
        import triton_python_backend_utils as pb_utils

        from linnet.runtimes.serve.triton import LinnetModel

        self.model = LinnetModel(args, json.loads(args["model_config"]), pb_utils)

    def execute(self, requests):
        return self.model.execute(requests)

    def finalize(self):
        self.model.finalize()
