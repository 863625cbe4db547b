"""The engine side of the server: one thread runs one generation at a time, first come first served.

The HTTP layer talks to a `Backend` only: it encodes prompts, submits `Job`s and reads their events (an asyncio
queue fed from the engine thread). `EngineWorker` is the one-request-at-a-time implementation over a `Decoder`; a
batched engine can replace it by implementing the same small interface.

Shutting down drains the backend: new and waiting requests get 503, the running generation may go on for a grace
period and then ends at its next round boundary with finish_reason "shutdown" (outside OpenAI's values, so that a
client can tell it from max_tokens and retry elsewhere).
"""

from __future__ import annotations

import asyncio
import logging
import math
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from verispec.engine import DecodeConfig
from verispec.errors import VerispecError
from verispec.serve.config import ServeConfig
from verispec.serve.logprobs import Entry, LogprobStream, TokenText, token_text
from verispec.serve.metrics import ServerMetrics
from verispec.serve.prompts import chat_prompt_ids, context_limit, raw_prompt_ids
from verispec.serve.schemas import APIError, Message, error_param
from verispec.serve.streaming import TextStream
from verispec.trace import Trace

log = logging.getLogger("verispec.serve")

SHUTTING_DOWN = "the server is shutting down"


@dataclass
class Started:
    """The engine took the job: the models it needs are there and generation begins."""


@dataclass
class Delta:
    """Text that became final this round (never empty)."""

    text: str
    logprobs: list[Entry] | None = None  # the entries of the tokens this text completes; None: not asked for


@dataclass
class Finished:
    """Generation ended; `text` is what was not sent yet as a Delta."""

    text: str
    finish_reason: str  # "stop" (EOS or a stop string), "length" (max_tokens or the time limit) or "shutdown"
    prompt_tokens: int
    completion_tokens: int
    trace: Trace
    timed_out: bool
    logprobs: list[Entry] | None = None  # the entries not sent yet, up to the last kept token; None: not asked for


@dataclass
class Failed:
    error: APIError


Event = Started | Delta | Finished | Failed


@dataclass
class Job:
    """One generation request on its way through the engine."""

    prompt_ids: list[int]
    config: DecodeConfig
    stop: tuple[str, ...] = ()
    arrival: float = field(default_factory=time.perf_counter)
    cancelled: threading.Event = field(default_factory=threading.Event)
    _loop: asyncio.AbstractEventLoop | None = None
    _events: asyncio.Queue | None = None

    def bind(self) -> None:
        """Attach the job to the running event loop (call from the loop, before submitting)."""
        self._loop, self._events = asyncio.get_running_loop(), asyncio.Queue()

    def send(self, event: Event) -> None:
        """Hand `event` to the waiting request (thread-safe; dropped if the loop is gone)."""
        try:
            self._loop.call_soon_threadsafe(self._events.put_nowait, event)
        except RuntimeError:  # the event loop closed: the server is shutting down
            pass

    def cancel(self) -> None:
        """Ask the engine to stop this job at the next round boundary (or to skip it if still queued)."""
        self.cancelled.set()

    async def events(self) -> AsyncIterator[Event]:
        """Yield the job's events until it finishes or fails."""
        while True:
            event = await self._events.get()
            yield event
            if isinstance(event, (Finished, Failed)):
                return


class Backend(Protocol):
    """What the HTTP layer needs from an engine."""

    metrics: ServerMetrics
    ready: bool
    load_error: str | None

    def encode_chat(self, messages: Sequence[Message]) -> list[int]: ...
    def encode_completion(self, prompt: str | list[str]) -> list[int]: ...
    def context_limit(self, config: DecodeConfig) -> int | None: ...
    def submit(self, job: Job) -> None: ...
    def retry_after(self) -> int: ...
    def start(self) -> None: ...
    def drain(self, grace: float) -> None: ...
    def draining(self) -> bool: ...
    def drained(self) -> bool: ...
    def stop(self) -> None: ...


class EngineWorker:
    """A `Backend` over a `Decoder`: a bounded FCFS queue consumed by one engine thread."""

    def __init__(self, decoder: Any, config: ServeConfig, metrics: ServerMetrics) -> None:
        self.decoder, self.config, self.metrics = decoder, config, metrics
        self.ready = False
        self.load_error: str | None = None
        self._queue: queue.Queue[Job] = queue.Queue(maxsize=config.max_queue)
        self._draining = threading.Event()  # set once: no job is taken any more
        self._drained = threading.Event()  # set once draining and no generation runs
        self._submit_lock = threading.Lock()  # no job enters the queue after draining began (it would wait forever)
        self._cut_at = math.inf  # perf_counter time after which a running generation ends at its round boundary
        self._tokenizer_lock = threading.Lock()  # a fast tokenizer must not be used by two threads at once
        self._mean_seconds = 1.0  # moving average of a generation's duration (queue wait excluded), for Retry-After
        self._thread = threading.Thread(target=self._run, name="verispec-engine", daemon=True)

    # -- the HTTP side ------------------------------------------------------------------------------------------
    def encode_chat(self, messages: Sequence[Message]) -> list[int]:
        with self._tokenizer_lock:
            return chat_prompt_ids(self.decoder.tokenizer, messages)

    def encode_completion(self, prompt: str | list[str]) -> list[int]:
        with self._tokenizer_lock:
            return raw_prompt_ids(self.decoder.tokenizer, prompt)

    def context_limit(self, config: DecodeConfig) -> int | None:
        try:
            return context_limit(self.decoder, config)
        except VerispecError as exc:  # the models `config` needs cannot be had (e.g. no draft with its head)
            raise APIError(400, str(exc)) from None

    def submit(self, job: Job) -> None:
        """Queue `job`; raise APIError 429 (with Retry-After) when the queue is full, 503 once draining began."""
        with self._submit_lock:
            if self._draining.is_set():
                raise APIError(503, SHUTTING_DOWN)
            try:
                self._queue.put_nowait(job)
            except queue.Full:
                raise APIError(429, f"the server is busy: {self.config.max_queue} requests are already waiting",
                               headers={"Retry-After": str(self.retry_after())}) from None
        self.metrics.queue_length.set(self._queue.qsize())

    def retry_after(self) -> int:
        """Return seconds until a queue slot is likely free: the running generation ends, the head moves up."""
        return max(1, math.ceil(self._mean_seconds))

    def start(self) -> None:
        self._thread.start()

    def drain(self, grace: float) -> None:
        """Stop taking requests: new and waiting ones get 503; the running generation may go on for `grace` more
        seconds, then ends at its next round boundary with finish_reason "shutdown". A second call may shorten the
        grace, never lengthen it."""
        with self._submit_lock:
            self._draining.set()
        self._cut_at = min(self._cut_at, time.perf_counter() + grace)
        self._reject_waiting()
        if not self.ready:  # loading (or failed): no generation to wait for; the loader exits when it is done
            self._drained.set()

    def draining(self) -> bool:
        """Return True once `drain` was called: the server is shutting down."""
        return self._draining.is_set()

    def drained(self) -> bool:
        """Return True once `drain` was called and no generation runs any more."""
        return self._drained.is_set()

    def stop(self) -> None:
        """End the running generation at its next round boundary; answer the requests still waiting 503."""
        self.drain(grace=0.0)
        if self._thread.is_alive() and self.ready:  # a load in progress is not waited for: the thread is a daemon
            self._thread.join(timeout=30)

    def _reject_waiting(self) -> None:
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            job.send(Failed(APIError(503, SHUTTING_DOWN)))
        self.metrics.queue_length.set(self._queue.qsize())

    # -- the engine thread --------------------------------------------------------------------------------------
    def _run(self) -> None:
        if not self._load():
            return
        try:
            self._consume(self.decoder.engine)
        finally:
            self._reject_waiting()
            self._drained.set()

    def _load(self) -> bool:
        """Load the models now, not on some request's time; return whether they loaded (else `load_error` says
        why). Under a server-wide draft_vocab N every request that drafts with the model uses the draft with a head
        of N tokens, so that one is the draft loaded."""
        try:
            self.decoder.model("target")
            n = self.config.defaults.draft_vocab
            if n is None:
                self.decoder.model("draft")
            else:
                self.decoder.reduced_draft(n)
            self.decoder.build_prompt_copies()  # the first long prompt's set-up, not on a client's time
            self.metrics.observe_models(self.decoder)
            self.ready = True
        except Exception as exc:  # reported by /health and every request's 503, never a traceback to clients
            self.load_error = f"{type(exc).__name__}: {exc}"
            log.error("loading the models failed: %s", self.load_error)
        return self.ready

    def _consume(self, engine_for: Callable[[DecodeConfig], Any]) -> None:
        """Take jobs from the queue until draining, each decoded on an engine from `engine_for(job.config)`."""
        while not self._draining.is_set():
            job = self._take_job(0.1)
            if job is not None:
                self._handle(job, engine_for)

    def _take_job(self, timeout: float) -> Job | None:
        """Return the next queued job, waiting up to `timeout` seconds (0: not at all); None if none came."""
        try:
            job = self._queue.get(timeout=timeout) if timeout > 0 else self._queue.get_nowait()
        except queue.Empty:
            return None
        self.metrics.queue_length.set(self._queue.qsize())
        return job

    def _handle(self, job: Job, engine_for: Callable[[DecodeConfig], Any]) -> None:
        """Decode `job` on an engine from `engine_for`, unless draining began or its client left while it waited."""
        if self._draining.is_set():  # taken in the instant draining began
            job.send(Failed(APIError(503, SHUTTING_DOWN)))
            return
        if job.cancelled.is_set():  # its client left while it waited
            job.send(Failed(APIError(499, "the client closed the connection")))
            return
        self.metrics.running.inc()
        self.metrics.queue_time.observe(time.perf_counter() - job.arrival)
        try:
            self._serve(job, engine_for)
        except Exception as exc:  # a bug: this request answers 500, the engine goes on serving the others
            log.exception("serving a request failed")
            job.send(Failed(APIError(500, f"generation failed: {type(exc).__name__}: {exc}")))
        finally:
            self.metrics.running.dec()

    def _decode_text(self, ids: list[int]) -> str:
        with self._tokenizer_lock:
            return self.decoder.tokenizer.decode(ids, skip_special_tokens=True)

    def _token_text(self, token: int) -> TokenText:
        with self._tokenizer_lock:
            return token_text(self.decoder.tokenizer, token)

    def _serve(self, job: Job, engine_for: Callable[[DecodeConfig], Any]) -> None:
        method = job.config.method
        try:
            engine = engine_for(job.config)
        except VerispecError as exc:
            job.send(Failed(APIError(400, str(exc))))
            return
        job.send(Started())
        text = TextStream(self._decode_text, job.stop)
        logprobs = LogprobStream(text, self._token_text) if job.config.logprobs is not None else None
        start = time.perf_counter()
        deadline = start + self.config.time_limit
        clock = {"last": None, "timed_out": False, "cut": False}

        def on_commit(tokens: list[int]) -> bool:
            now = time.perf_counter()
            if tokens:
                if clock["last"] is None:
                    self.metrics.ttft.labels(method).observe(now - job.arrival)
                else:
                    for _ in tokens:  # the round's wait, shared by the tokens it commits
                        self.metrics.itl.labels(method).observe((now - clock["last"]) / len(tokens))
                clock["last"] = now
            delta = text.push(tokens)
            if delta:
                job.send(Delta(delta, logprobs.release() if logprobs is not None else None))
            clock["timed_out"] = now > deadline
            clock["cut"] = now >= self._cut_at  # the server is shutting down and the grace period is over
            return text.stopped or clock["timed_out"] or clock["cut"] or job.cancelled.is_set()

        try:
            out = engine.decode(job.prompt_ids, job.config, on_commit,
                                on_logprobs=logprobs.add if logprobs is not None else None)
        except VerispecError as exc:
            # The engine checks logit_bias's ids against the decoding model's vocabulary (as the app did before
            # queuing): name the field, as the app's check does; other errors here are about the server's models.
            job.send(Failed(APIError(400, str(exc), param=error_param(exc))))
            return
        except Exception as exc:  # a bug or a model failure: the server answers 500 and keeps serving
            log.exception("generation failed")
            job.send(Failed(APIError(500, f"generation failed: {type(exc).__name__}: {exc}")))
            return
        end = time.perf_counter()
        self.metrics.latency.labels(method).observe(end - job.arrival)
        self._mean_seconds = 0.8 * self._mean_seconds + 0.2 * (end - start)
        self.metrics.observe_decode(method, out.trace, len(job.prompt_ids), text.kept_tokens, job.config.gamma)
        finished = text.stopped or out.stopped_at_eos
        full = text.kept_tokens >= job.config.max_new_tokens
        reason = "stop" if finished else "shutdown" if clock["cut"] and not full else "length"
        job.send(Finished(text.finish(), reason, len(job.prompt_ids), text.kept_tokens, out.trace,
                          clock["timed_out"] and not finished and reason != "shutdown",
                          logprobs.rest() if logprobs is not None else None))
