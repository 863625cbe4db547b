"""The learned-verifier tests train many tiny models: one intra-op thread avoids thread-sync overhead on a busy
CPU (a 20x slowdown for [256, 8] matmuls); the previous setting is restored after each module."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True, scope="module")
def _learned_tests_on_one_thread(one_thread):
    """Every module here runs on one thread (the shared `one_thread` fixture of tests/conftest.py)."""
    yield
