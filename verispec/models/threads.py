"""torch's threads when a model of the decode runs in llama.cpp on the same cores (BENCHMARKS.md §3, "The two
thread pools").

torch's OpenMP workers keep spinning for a while after each parallel operation, and llama.cpp's pool needs every
core right after. So when one model of a decode runs its own thread pool (`own_thread_pool`, the llama.cpp backend),
torch gets all its threads only inside a torch model's forward, where they pay, and one thread for the rest of the
round (sampling, verification): no torch worker is then left spinning when llama.cpp starts. The round's work runs on
one thread in every decode anyway (`verispec.models.openmp`), so this changes no token.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from verispec.models.protocol import CausalLM, ForwardOutput


@contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run the block with `n` torch threads, then restore the previous count."""
    before = torch.get_num_threads()
    if n == before:
        yield
        return
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class ThreadedForward:
    """A torch model whose forwards run with `threads` torch threads; every other attribute is the model's own."""

    def __init__(self, model: CausalLM, threads: int) -> None:
        self.wrapped, self.threads = model, threads

    def forward(self, tokens: Sequence[int], n_logits: int = 1, return_hidden: bool = False,
                parents: Sequence[int] | None = None) -> ForwardOutput:
        """The model's forward (`CausalLM.forward`) with this object's thread count."""
        with torch_threads(self.threads):
            return self.wrapped.forward(tokens, n_logits, return_hidden, parents)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.wrapped, name)


def runs_own_threads(model: CausalLM | None) -> bool:
    """Return whether `model` computes on a thread pool of its own (not torch's)."""
    return model is not None and model.own_thread_pool


@contextmanager
def shared_cores(*models: CausalLM | None) -> Iterator[tuple[Any, ...]]:
    """Yield `models` for one decode: unchanged when none runs its own thread pool; otherwise, for the duration,
    torch runs single-threaded and each torch model (None stays None) is wrapped to run its forwards with the
    thread count torch had on entry."""
    if not any(runs_own_threads(model) for model in models):
        yield models
        return
    threads = torch.get_num_threads()
    wrapped = tuple(model if model is None or runs_own_threads(model) else ThreadedForward(model, threads)
                    for model in models)
    with torch_threads(1):
        yield wrapped
