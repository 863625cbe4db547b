"""The torch device the tests put their tiny Hugging Face models on: `VERISPEC_TEST_DEVICE` (default "cpu").

`VERISPEC_TEST_DEVICE=cuda python -m pytest -m "not slow"` runs the adapter, decoder-loop and engine tests with the
models on a GPU: the adapter returns CPU logits, so verification and sampling stay on the CPU as in production.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch

TEST_DEVICE = os.environ.get("VERISPEC_TEST_DEVICE", "cpu")


def check_test_device() -> None:
    """Stop the run with a clear message when the requested device does not exist here."""
    try:
        device = torch.device(TEST_DEVICE)
    except RuntimeError as exc:
        pytest.exit(f"VERISPEC_TEST_DEVICE={TEST_DEVICE!r} is not a torch device: {exc}", returncode=4)
    if device.type == "cuda" and not torch.cuda.is_available():
        pytest.exit(f"VERISPEC_TEST_DEVICE={TEST_DEVICE!r}, but this torch sees no CUDA device", returncode=4)


def device_is_cpu() -> bool:
    """Whether the test device is the CPU (call after `check_test_device`, which conftest runs first)."""
    return torch.device(TEST_DEVICE).type == "cpu"


def on_test_device(model: Any) -> Any:
    """Move a torch module to the test device; return it."""
    return model.to(TEST_DEVICE)
