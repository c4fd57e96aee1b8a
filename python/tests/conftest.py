import importlib
import os

import pytest

# Polars 1.x loads Arrow extension types (pyarrow's fixed_shape_tensor) as their storage unless
# told otherwise, once per process; 2.x keeps them by default. The tests run on both lines.
os.environ.setdefault("POLARS_UNKNOWN_EXTENSION_TYPE_BEHAVIOR", "load_as_extension")
# On a GPU machine jax takes 75% of the GPU's memory at its first use unless told not to, and
# the CUDA tests share the GPU between jax, torch, cupy and dlframe in one process.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

HINTS = {
    "torch": "install the 'torch' extra (DLFRAME_TORCH=1 bash scripts/test.sh)",
    "cupy": "cupy needs a CUDA machine",
    "dpctl": "pip install dpctl intel-opencl-rt",
    "moto": "pip install -r python/requirements-test.txt (moto[s3], flask, flask-cors)",
}


def optional(name: str):
    """Imports an optional consumer or skips the test, printing why (shown by pytest -ra)."""
    try:
        return importlib.import_module(name)
    except ImportError as e:  # depends on the environment
        pytest.skip(f"{name} is not installed ({e}); {HINTS.get(name, 'install it to run this test')}")
