"""The learned-verifier tests train many tiny models: one intra-op thread avoids thread-sync overhead on a busy
CPU (a 20x slowdown for [256, 8] matmuls); the previous setting is restored after each module."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
