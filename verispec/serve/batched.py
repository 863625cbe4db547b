"""The server's batched engine: up to `max_batch` requests decoded at once, each by the engine's own decode loop
in a slot of its own, their model passes run together (`verispec.models.batched`).

A slot is a pair of per-sequence model views (target and draft) with their own KV caches, kept for the server's
life: a finished request frees its slot and the next request reuses the buffers. A request beyond `max_batch` waits
in the queue (429 once the queue is full, as with one slot). Each request's tokens are those of the same request
decoded alone (`verispec generate`, the same seed), whatever else shares its batch: every kernel of a batched pass
computes each row on its own.
"""

from __future__ import annotations

import queue
import threading
from typing import Any

from verispec.config import DecodeConfig
from verispec.engine import Engine
from verispec.errors import ConfigError
from verispec.methods import get_method
from verispec.models.batched import ForwardBatcher, SlotLM
from verispec.serve.config import ServeConfig
from verispec.serve.metrics import ServerMetrics
from verispec.serve.worker import EngineWorker, Job, log

PRIORITY = {"draft": 0, "target": 1}  # the draft's passes first, so that the target's meet in one call


class BatchedWorker(EngineWorker):
    """A `Backend` that decodes up to `config.max_batch` requests at once on one `Decoder`'s models.

    The engine thread, which loaded the models, runs every batched pass and decodes one request itself (its passes
    run where it waits on them: a lone request is decoded as by `EngineWorker`); the other requests run on helper
    threads, one per further slot, to which the engine thread hands queued requests between passes."""

    def __init__(self, decoder: Any, config: ServeConfig, metrics: ServerMetrics) -> None:
        super().__init__(decoder, config, metrics)
        self.batcher: ForwardBatcher | None = None
        self._helpers: list[Helper] = []

    def _run(self) -> None:
        if not self._load():
            return
        # The passes run on this thread, which loaded the models (`ForwardBatcher`'s `own_thread`).
        self.batcher = batcher = ForwardBatcher(own_thread=False, between=self._dispatch)
        models = self.decoder.loaded_models()

        def engines() -> SlotEngines:
            slots = {role: SlotLM(model, batcher, PRIORITY[role]) for role, model in models.items()}
            return SlotEngines(self.decoder, slots, batcher, self.config.load_gamma)

        own = engines()
        shared = [role for role, slot in own.slots.items() if slot.batchable(1)]
        alone = [role for role in own.slots if role not in shared]
        chunk = self.config.defaults.prompt_chunk
        log.info("decoding up to %d requests at once; batched passes: %s%s; prompts read %s", self.config.max_batch,
                 ", ".join(shared) or "none",
                 f" ({', '.join(alone)}: off verispec's kernels, one pass at a time)" if alone else "",
                 f"in passes of at most {chunk} tokens (as `verispec generate --prompt-chunk {chunk}` reads them)"
                 if chunk else "in one pass")
        self._helpers = [Helper(engines()) for _ in range(self.config.max_batch - 1)]
        for index, helper in enumerate(self._helpers, 1):
            threading.Thread(target=self._help, args=(helper,), name=f"verispec-slot-{index}", daemon=True).start()
        try:
            while not self._draining.is_set():
                job = self._take_job(0.1 if batcher.active == 0 else 0.0)  # this thread's own slot first
                if job is not None:
                    self._handle(job, own)
                elif batcher.active:
                    batcher.run_once()
            while batcher.active or any(helper.busy for helper in self._helpers):  # the running ones end
                batcher.run_once()
        finally:
            batcher.close()
            self._reject_waiting()
            self._drained.set()

    def _dispatch(self) -> None:
        """Hand queued requests to free helper slots (on the engine thread, between passes)."""
        for helper in self._helpers:
            if not helper.busy and not self._draining.is_set():
                job = self._take_job(0.0)
                if job is None:
                    return
                helper.busy = True
                helper.jobs.put(job)

    def _help(self, helper: Helper) -> None:
        """A helper slot's thread: decode the requests handed to it until draining."""
        while True:
            try:
                job = helper.jobs.get(timeout=0.1)
            except queue.Empty:
                if self._draining.is_set():
                    return
                continue
            try:
                self._handle(job, helper.engines)
            finally:
                helper.busy = False

    def _serve(self, job: Job, engine_for: Any) -> None:
        assert self.batcher is not None
        self.batcher.enter()  # from here on, batches wait for this sequence's passes
        try:
            super()._serve(job, engine_for)
        finally:
            self.batcher.leave()


class Helper:
    """A slot decoded on a thread of its own: its engines and the request handed to it."""

    def __init__(self, engines: SlotEngines) -> None:
        self.engines = engines
        self.jobs: queue.Queue[Job] = queue.Queue()
        self.busy = False


class SlotEngines:
    """`engine_for` of one slot: the decoder's `Engine` for a request's config, over the slot's model views, its
    adaptive draft length following the load where `load_gamma` allows (`load_follows`)."""

    def __init__(self, decoder: Any, slots: dict[str, SlotLM], batcher: ForwardBatcher, load_gamma: str) -> None:
        self.decoder, self.slots, self.batcher, self.load_gamma = decoder, slots, batcher, load_gamma

    def __call__(self, config: DecodeConfig) -> Engine:
        if config.draft_vocab is not None:
            raise ConfigError("draft_vocab is not served with --max-batch above 1 (a sliced draft head keeps "
                              "per-sequence state): ask without it, or run the server with --max-batch 1")
        load = (lambda: self.batcher.active) if load_follows(config, self.load_gamma) else None
        return self.decoder.engine(config, self.slots, load)


def load_follows(config: DecodeConfig, load_gamma: str) -> bool:
    """Return whether a request's adaptive draft length follows the server's load under `load_gamma`: "always";
    "invariant" where that cannot change its tokens (a lossless method at T = 0 emits the target's greedy tokens
    whatever the draft length, and with keyed draws a seed's tokens at any temperature: verispec.verify.keyed);
    "off" never (every request's tokens are those it gets alone, at any temperature)."""
    if load_gamma == "always":
        return True
    invariant = config.sampling.temperature == 0 or config.keyed_draws
    return load_gamma == "invariant" and invariant and get_method(config.method).lossless
