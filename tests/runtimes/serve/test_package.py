"""The serving engine is backend-neutral: importing it imports no framework (the HTTP server and Triton's model.py
import it before they pick a backend)."""

from __future__ import annotations

import subprocess
import sys


def test_importing_the_engine_imports_no_framework():
    code = (
        "import sys, linnet.runtimes.serve\n"
        "loaded = sorted({'torch', 'jax', 'onnxruntime', 'transformers'} & set(sys.modules))\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
