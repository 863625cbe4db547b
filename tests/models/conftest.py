"""Helpers shared by the thread tests (test_threads.py, test_openmp.py)."""

from __future__ import annotations

import pytest
import torch

from verispec.models.tabular import TabularLM


class RecordingLM(TabularLM):
    """A tabular model that records torch's thread count at each forward (`own_pool`: it claims a thread pool of
    its own, as the llama.cpp backend does)."""

    def __init__(self, *args, own_pool: bool = False, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.own_thread_pool = own_pool
        self.threads_seen: list[int] = []

    def _run(self, tokens, n_logits, return_hidden, tree):
        self.threads_seen.append(torch.get_num_threads())
        return super()._run(tokens, n_logits, return_hidden, tree)


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)
