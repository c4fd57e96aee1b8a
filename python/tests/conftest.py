import importlib

import pytest


def optional(name: str):
    """Imports an optional consumer or skips the test, printing why (shown by pytest -ra)."""
    try:
        return importlib.import_module(name)
    except ImportError as e:  # pragma: no cover - depends on the environment
        pytest.skip(f"{name} is not installed ({e}); install the 'torch' extra to run this test")
