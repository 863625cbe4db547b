"""The HTTP layer: OpenAI-compatible routes over a `Backend`; every failure is an OpenAI-format JSON error."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from verispec.serve import bounds, responses
from verispec.serve.batched import BatchedWorker
from verispec.serve.config import ServeConfig
from verispec.serve.logprobs import Entry
from verispec.serve.metrics import ServerMetrics
from verispec.serve.prompts import check_logit_bias, check_memory, check_prompt_size, fit_max_tokens
from verispec.serve.schemas import APIError, ChatRequest, CompletionRequest, parse, settings
from verispec.serve.streaming import sse
from verispec.serve.worker import Backend, Delta, EngineWorker, Failed, Finished, Job

log = logging.getLogger("verispec.serve")

DISCONNECT_POLL = 0.1  # seconds between checks that a non-streaming client is still there


def create_app(decoder: Any = None, config: ServeConfig | None = None, backend: Backend | None = None) -> FastAPI:
    """Return the ASGI app serving `decoder` (a `verispec.Decoder`) with `config`; or over any `backend`.

    The models load in the background when the app starts; until then /health and the endpoints answer 503.
    """
    config = config or ServeConfig()
    if backend is None:
        if decoder is None:
            raise ValueError("create_app needs a decoder or a backend")
        # A server-wide draft_vocab slices the draft's head, which keeps per-sequence state: one at a time then.
        batched = config.max_batch > 1 and config.defaults.draft_vocab is None
        worker = BatchedWorker if batched else EngineWorker
        backend = worker(decoder, config, ServerMetrics())
    metrics = backend.metrics

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        backend.start()
        yield
        backend.stop()

    app = FastAPI(title="verispec", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.backend, app.state.config = backend, config

    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        return error_response(APIError(exc.status_code, str(exc.detail)))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(APIError(400, str(exc)))

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return error_response(APIError(500, f"internal error: {type(exc).__name__}"))

    @app.get("/health")
    async def health() -> JSONResponse:
        if backend.draining():  # a load balancer stops sending here while running answers finish
            return JSONResponse({"status": "shutting down", "error": None}, status_code=503)
        if backend.ready:
            return JSONResponse({"status": "ready", "model": config.model_name})
        status = "failed" if backend.load_error else "loading"
        return JSONResponse({"status": status, "error": backend.load_error}, status_code=503)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": config.model_name, "object": "model", "owned_by": "verispec",
                                            "created": 0}]}

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await _counted("/v1/chat/completions", _generate(request, backend, config, "chat"))

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await _counted("/v1/completions", _generate(request, backend, config, "completion"))

    async def _counted(endpoint: str, work: Any) -> Response:
        try:
            response = await work
        except APIError as exc:
            response = error_response(exc)
        metrics.requests.labels(endpoint, str(response.status_code)).inc()
        return response

    return app


def error_response(exc: APIError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


async def _generate(request: Request, backend: Backend, config: ServeConfig, kind: str) -> Response:
    """Validate, queue and answer one chat or completion request."""
    raw = await _read_body(request)
    try:
        body = json.loads(raw, parse_constant=_not_json)
        # a \ud800-\udfff escape alone decodes to a lone surrogate, which no tokenizer or response can encode
        json.dumps(body, ensure_ascii=False).encode()
    except UnicodeEncodeError as exc:
        raise APIError(400, f"the request body is not valid JSON text: {exc.object[exc.start:exc.end]!r} is a lone "
                       f"surrogate, not a Unicode character") from None
    except ValueError as exc:  # UnicodeDecodeError included
        raise APIError(400, f"the request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise APIError(400, "the request body is not valid JSON: nested too deeply") from None
    req = parse(ChatRequest if kind == "chat" else CompletionRequest, body)
    if not backend.ready:
        reason = f"loading the models failed: {backend.load_error}" if backend.load_error else "the models are loading"
        raise APIError(503, f"not ready: {reason}", headers={"Retry-After": "5"})
    if req.model is not None and req.model != config.model_name:
        raise APIError(404, f"the model {req.model!r} does not exist; this server serves {config.model_name!r}",
                       param="model")
    wanted = settings(req, config.defaults)
    stated = backend.context_limit(wanted.config)
    limit = stated if stated is not None else bounds.UNSTATED_CONTEXT
    if kind == "chat":
        check_prompt_size([message.text() for message in req.messages], limit, "messages")
        ids = backend.encode_chat(req.messages)
    else:
        check_prompt_size([req.prompt] if isinstance(req.prompt, str) else req.prompt, limit, "prompt")
        ids = backend.encode_completion(req.prompt)
    budget = fit_max_tokens(len(ids), wanted.config.max_new_tokens, limit, wanted.max_tokens_given, stated is not None)
    decoder = getattr(backend, "decoder", None)  # an EngineWorker's; other backends bound their own memory
    if decoder is not None:
        check_memory(decoder, wanted.config, len(ids), len(ids) + budget,
                     "max_tokens" if wanted.max_tokens_given else None)
        check_logit_bias(decoder, wanted.config)
    job = Job(ids, dataclasses.replace(wanted.config, max_new_tokens=budget), wanted.stop)
    job.bind()
    backend.submit(job)
    header = responses.ResponseHeader(kind, config.model_name)
    events = job.events()
    watcher = asyncio.ensure_future(_watch_disconnect(request, job))
    try:
        first = await anext(events)
        if isinstance(first, Failed):
            raise first.error
        if wanted.stream:  # from here the streaming response notices a client leaving
            return StreamingResponse(_stream(events, job, header, wanted.include_usage),
                                     media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        parts: list[str] = []
        entries: list[Entry] | None = [] if job.config.logprobs is not None else None
        async for event in events:
            if isinstance(event, Delta):
                parts.append(event.text)
                if entries is not None:
                    entries.extend(event.logprobs or [])
            elif isinstance(event, Failed):
                raise event.error
        if job.cancelled.is_set():
            raise APIError(499, "the client closed the connection")
    except BaseException:
        job.cancel()  # stop the engine at the next round boundary (or skip the job if it still waits)
        raise
    finally:
        watcher.cancel()
    usage = responses.usage(event.prompt_tokens, event.completion_tokens)
    stats = responses.verispec_block(job.config, event.trace, event.timed_out)
    if entries is not None:
        entries.extend(event.logprobs or [])
    body = responses.full_body(header, "".join(parts) + event.text, event.finish_reason, usage, stats, entries)
    return JSONResponse(body)


async def _read_body(request: Request) -> bytes:
    """Return the request's body; raise APIError 413 past `bounds.MAX_BODY_BYTES`, before reading all of it."""
    too_long = APIError(413, f"the request body is larger than {bounds.MAX_BODY_BYTES} bytes, this server's limit")
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > bounds.MAX_BODY_BYTES:
        raise too_long
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > bounds.MAX_BODY_BYTES:
            raise too_long
        chunks.append(chunk)
    return b"".join(chunks)


def _not_json(constant: str) -> Any:
    """Refuse NaN and ±Infinity, which Python's json reads but JSON does not have."""
    raise ValueError(f"{constant} is not a JSON value")


async def _watch_disconnect(request: Request, job: Job) -> None:
    """Cancel `job` when the client disconnects before its response starts (or, unstreamed, before it ends)."""
    while not await request.is_disconnected():
        await asyncio.sleep(DISCONNECT_POLL)
    job.cancel()


async def _stream(events: AsyncIterator[Any], job: Job, header: responses.ResponseHeader,
                  include_usage: bool) -> AsyncIterator[bytes]:
    """Yield the job's text as Server-Sent Events in the OpenAI chunk format, then `data: [DONE]`."""
    try:
        yield sse(responses.chunk(header, "", first=True))
        async for event in events:
            if isinstance(event, Delta):
                yield sse(responses.chunk(header, event.text, logprobs=event.logprobs))
            elif isinstance(event, Failed):
                yield sse(event.error.body())
            elif isinstance(event, Finished):
                rest = event.logprobs  # the last tokens' entries go with the last text, or with the finish reason
                if event.text:
                    yield sse(responses.chunk(header, event.text, logprobs=rest))
                    rest = None
                stats = responses.verispec_block(job.config, event.trace, event.timed_out)
                last = responses.chunk(header, None, event.finish_reason, logprobs=rest or None)
                yield sse(last | {"verispec": stats})
                if include_usage:
                    usage = responses.usage(event.prompt_tokens, event.completion_tokens)
                    yield sse(responses.usage_chunk(header, usage, stats))
        yield sse("[DONE]")
    finally:
        job.cancel()  # the client went away mid-stream (or the stream ended): free the engine at the next round
