"""Many sequences decoded at once on one pair of loaded models: per-sequence views of a model (`SlotLM`, each with
its own KV cache) whose forwards a `ForwardBatcher` runs together.

Why: a server decoding one request at a time leaves the others waiting, and a decode pass of one token reads all
of a model's weights for one row of arithmetic. Each sequence here runs the engine's own decode loop, unchanged, in
a thread of its own; its model calls block until every sequence in flight is waiting on one, and then the batcher
runs the waiting passes of one model as one pass over all their rows (`LeanDecoder.run_segments`: every linear over
all rows at once, attention per sequence over its own cache). Every kernel of that pass computes each row on its
own, so a sequence's logits are the bits of its pass alone: its tokens are those of the same request decoded alone,
whatever else shares the batch (tested). Passes that cannot share a call (a prompt longer than the decode kernels
take, a model off verispec's kernels) run one at a time, between the batched ones.

Scheduling: while any waiting pass is for a model of lower `priority` (the draft's 0 before the target's 1), those
run first, so the target's passes of all sequences meet in one call: the target's weights are read once per round
for every sequence, which is what batching buys most.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from verispec.models.hf import HFCausalLM
from verispec.models.kv_cache import InPlaceKVCache
from verispec.models.openmp import openmp_threads
from verispec.models.protocol import ForwardOutput
from verispec.models.tree import CacheTree


class SlotLM(HFCausalLM):
    """One sequence's view of a loaded `HFCausalLM`: the same weights and decoder loop, a KV cache of its own (kept
    across requests, so a slot's buffers are reused), forwards run by a `ForwardBatcher`."""

    def __init__(self, shared: HFCausalLM, batcher: ForwardBatcher | None, priority: int = 0) -> None:
        """`batcher`: runs the slot's forwards; None for a slot whose passes a caller runs with `forward_together`."""
        if shared.reduced_head is not None:
            raise ValueError("a model with a reduced head keeps per-sequence state in its head: it cannot be shared")
        self.__dict__.update(shared.__dict__)  # weights, decoder loop, tokenizer, name: shared, never written here
        self.shared, self.batcher, self.priority = shared, batcher, priority
        self._cache = self._new_cache()
        self._tree = CacheTree.chain(0)

    def reset(self) -> None:
        """Empty the cache, keeping its buffers for the slot's next sequence."""
        if isinstance(self._cache, InPlaceKVCache):
            self._cache.crop(0)
        else:
            self._cache = self._new_cache()
        self._tree = CacheTree.chain(0)

    def _run(self, tokens: Sequence[int], n_logits: int, return_hidden: bool,
             tree: tuple[torch.Tensor, torch.Tensor] | None) -> ForwardOutput:
        if self.batcher is None:
            raise RuntimeError("this slot has no batcher: run its passes with forward_together")
        return self.batcher.submit(Pass(self, list(tokens), n_logits, return_hidden, tree))

    def batchable(self, length: int) -> bool:
        """Return whether a pass over `length` new tokens can share a decoder-stack call with other sequences'."""
        return self._lean is not None and self._lean.stacks(length, self._cache)

    def run_alone(self, p: Pass) -> ForwardOutput:
        """Compute pass `p` on its own (the model's usual forward)."""
        return HFCausalLM._run(self, p.tokens, p.n_logits, p.return_hidden, p.tree)


@dataclass(eq=False)
class Pass:
    """One forward a sequence waits on."""

    slot: SlotLM
    tokens: list[int]
    n_logits: int
    return_hidden: bool
    tree: tuple[torch.Tensor, torch.Tensor] | None
    result: ForwardOutput | None = None
    error: BaseException | None = None
    done: bool = False

    @property
    def rows(self) -> int:
        """Return the number of new tokens the pass runs over."""
        return len(self.tokens)


class ForwardBatcher:
    """Runs the forwards of the sequences in flight (`enter`/`leave`) on one thread, its owner: when every sequence
    in flight waits on a pass, one batch of them runs (see the module's docstring). The owner may decode a sequence
    of its own: its passes then run where it waits on them, with no hand-over between threads, so a lone sequence
    on the owner decodes as fast as without a batcher. `passes`, `rows`, `batched_rows`: how many calls ran, over
    how many rows, and how many of those rows shared a call with another sequence's."""

    def __init__(self, threads: int | None = None, own_thread: bool = True,
                 between: Callable[[], None] | None = None, poll: float = 0.05) -> None:
        """`threads`: the torch threads the passes run on (None: the creating thread's count). `own_thread`: the
        owner is a thread of the batcher's own; False: the creating thread, which runs batches in `run_once` and
        while it waits on its own passes (a server's engine thread, which loaded the models. Why: measured on a
        2-core Xeon, a target forward took 52 ms on the thread that had run the earlier ones and 60-62 ms on a
        second thread: with two OpenMP pools in the process, more threads than cores, GNU OpenMP shortens the spin
        of idle workers, and each of a forward's hundreds of parallel loops wakes them from sleep). `between`:
        called on the owner before each batch and every `poll` seconds while it waits (a server hands new
        requests to free slots there)."""
        self.threads = threads or torch.get_num_threads()
        self.between, self.poll = between, poll
        self._cond = threading.Condition()
        self._active = 0
        self._waiting: list[Pass] = []
        self._closed = False
        self.passes = self.rows = self.batched_rows = 0
        self._thread: threading.Thread | None = None
        self._owner = threading.current_thread()
        if own_thread:
            self._thread = threading.Thread(target=self._run_owned, name="verispec-batcher", daemon=True)
            self._owner = self._thread
            self._thread.start()

    def enter(self) -> None:
        """Count one more sequence in flight: batches wait for its passes from now on."""
        with self._cond:
            self._active += 1

    def leave(self) -> None:
        """Count one sequence fewer (it finished or failed): batches no longer wait for it."""
        with self._cond:
            self._active -= 1
            self._cond.notify_all()

    @property
    def active(self) -> int:
        """Return the number of sequences in flight."""
        return self._active

    def close(self) -> None:
        """Stop running passes (passes still waiting, and any submitted later, fail)."""
        with self._cond:
            self._closed = True
            for p in self._waiting:
                p.error, p.done = RuntimeError("the forward batcher closed"), True
            self._waiting = []
            self._cond.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)

    def submit(self, p: Pass) -> ForwardOutput:
        """Wait until pass `p` has run (in a batch; on the owner, running batches meanwhile); return its outputs or
        raise its error."""
        with self._cond:
            if self._closed:
                raise RuntimeError("the forward batcher is closed")
            self._waiting.append(p)
            self._cond.notify_all()
        if threading.current_thread() is self._owner:
            while not p.done:
                self.run_once(until=p)
        else:
            with self._cond:
                while not p.done:
                    self._cond.wait()
        if p.error is not None:
            raise p.error
        assert p.result is not None
        return p.result

    def run_once(self, until: Pass | None = None) -> bool:
        """On the owner: run one batch if every sequence in flight waits (else wait up to `poll` seconds for that,
        or for `until` to be done); return whether one ran."""
        if self.between is not None:
            self.between()
        with self._cond:
            if not self._ready() and not self._closed and not (until is not None and until.done):
                self._cond.wait(self.poll)
            if not self._ready() or self._closed:
                return False
            batch = self._take()
        try:
            with openmp_threads(self.threads):  # the owner may be inside a decode of its own (one thread)
                run_batch(batch)
        except BaseException as exc:  # noqa: BLE001  # handed to every waiting sequence, never lost here
            for p in batch:
                p.error = exc
        with self._cond:
            self.passes += 1
            self.rows += sum(p.rows for p in batch)
            self.batched_rows += sum(p.rows for p in batch) if len(batch) > 1 else 0
            for p in batch:
                p.done = True
            self._cond.notify_all()
        return True

    def _run_owned(self) -> None:
        if torch.get_num_threads() != self.threads:  # (setting it unchanged measured slower passes after it)
            torch.set_num_threads(self.threads)  # this thread's own OpenMP setting
        while not self._closed:
            self.run_once()

    def _ready(self) -> bool:
        return bool(self._waiting) and len(self._waiting) >= self._active

    def _take(self) -> list[Pass]:
        """Remove and return the next batch: a pass that runs alone, else every waiting batchable pass of the model
        of lowest priority."""
        alone = next((p for p in self._waiting if not p.slot.batchable(p.rows)), None)
        if alone is not None:
            self._waiting.remove(alone)
            return [alone]
        priority = min(p.slot.priority for p in self._waiting)
        first = next(p for p in self._waiting if p.slot.priority == priority)
        batch = [p for p in self._waiting if p.slot.shared is first.slot.shared]
        self._waiting = [p for p in self._waiting if p.slot.shared is not first.slot.shared]
        return batch


@torch.inference_mode()
def run_batch(batch: list[Pass]) -> None:
    """Compute the passes of `batch` (one alone, or several of one model as one stacked call); set their results."""
    if len(batch) == 1 and not batch[0].slot.batchable(batch[0].rows):
        batch[0].result = batch[0].slot.run_alone(batch[0])
        return
    lean: Any = batch[0].slot._lean
    device = batch[0].slot.device
    segments = [lean.segment(torch.as_tensor(p.tokens, dtype=torch.long, device=device).unsqueeze(0),
                             p.slot._cache, p.tree) for p in batch]
    outputs = lean.run_segments(segments, [p.n_logits for p in batch], any(p.return_hidden for p in batch))
    for p, (logits, hidden) in zip(batch, outputs, strict=True):
        p.result = p.slot._outputs(logits, hidden if p.return_hidden else None)


def forward_together(passes: Sequence[tuple[SlotLM, Sequence[int]]]) -> list[ForwardOutput]:
    """Run one chain forward per (slot, new tokens) now, on this thread, and return each one's last-position
    outputs: the passes the decode kernels take share one stacked call per model, the others (a long catch-up, a
    model off verispec's kernels) run alone, as a `ForwardBatcher` would run them. For a caller that drives several
    sequences in lock-step itself (vLLM's proposer: `verispec.vllm.draft_pool`). Slots must be distinct."""
    batch = []
    for slot, tokens in passes:
        slot._tree.extend_chain(len(tokens))  # what `TreeCachedLM.forward` records before `_run`
        batch.append(Pass(slot, list(tokens), 1, False, None))
    stacked: dict[int, list[Pass]] = {}
    for p in batch:
        if p.slot.batchable(p.rows):
            stacked.setdefault(id(p.slot.shared), []).append(p)
        else:
            run_batch([p])
    for group in stacked.values():
        run_batch(group)
    outputs = []
    for p in batch:
        assert p.result is not None
        outputs.append(p.result)
    return outputs
