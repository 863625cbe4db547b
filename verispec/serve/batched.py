"""The server's batched engine: up to `max_batch` requests decoded at once, each by the engine's own decode loop
in a slot of its own, their model passes run together (`verispec.models.batched`).

A slot is a pair of per-sequence model views (target and draft) with their own KV caches, kept for the server's
life: a finished request frees its slot and the next request reuses the buffers. A request beyond `max_batch` waits
in the queue (429 once the queue is full, as with one slot). Each request's tokens are those of the same request
decoded alone (`verispec generate`, the same seed), whatever else shares its batch: every kernel of a batched pass
computes each row on its own.
"""

from __future__ import annotations

import threading
from typing import Any

from verispec.config import DecodeConfig
from verispec.engine import Engine
from verispec.errors import ConfigError
from verispec.models.batched import ForwardBatcher, SlotLM
from verispec.serve.config import ServeConfig
from verispec.serve.metrics import ServerMetrics
from verispec.serve.worker import EngineWorker, Job

PRIORITY = {"draft": 0, "target": 1}  # the draft's passes first, so that the target's meet in one call


class BatchedWorker(EngineWorker):
    """A `Backend` that decodes up to `config.max_batch` requests at once on one `Decoder`'s models."""

    def __init__(self, decoder: Any, config: ServeConfig, metrics: ServerMetrics) -> None:
        super().__init__(decoder, config, metrics)
        self.batcher: ForwardBatcher | None = None

    def _run(self) -> None:
        if not self._load():
            return
        self.batcher = ForwardBatcher()
        models = self.decoder.loaded_models()
        threads = []
        for index in range(self.config.max_batch):
            slots = {role: SlotLM(model, self.batcher, PRIORITY[role]) for role, model in models.items()}
            engine_for = SlotEngines(self.decoder, slots)
            threads.append(threading.Thread(target=self._consume, args=(engine_for,), name=f"verispec-slot-{index}",
                                            daemon=True))
        try:
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        finally:
            self._reject_waiting()
            self.batcher.close()
            self._drained.set()

    def _serve(self, job: Job, engine_for: Any) -> None:
        assert self.batcher is not None
        self.batcher.enter()  # from here on, batches wait for this sequence's passes
        try:
            super()._serve(job, engine_for)
        finally:
            self.batcher.leave()

    def stop(self) -> None:
        super().stop()
        if self.batcher is not None:
            self.batcher.close()


class SlotEngines:
    """`engine_for` of one slot: the decoder's `Engine` for a request's config, over the slot's model views."""

    def __init__(self, decoder: Any, slots: dict[str, SlotLM]) -> None:
        self.decoder, self.slots = decoder, slots

    def __call__(self, config: DecodeConfig) -> Engine:
        if config.draft_vocab is not None:
            raise ConfigError("draft_vocab is not served with --max-batch above 1 (a sliced draft head keeps "
                              "per-sequence state): ask without it, or run the server with --max-batch 1")
        return self.decoder.engine(config, self.slots)
