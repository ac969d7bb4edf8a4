"""The OpenAI-compatible HTTP app: parse, check, queue into the model worker, stream back.

The event loop parses and tokenizes requests, submits them to the :class:`ModelWorker` (one
thread runs the model) and turns the pieces the worker hands back into responses or
server-sent events. Each request has an ``asyncio.Queue``; the worker fills it through
``loop.call_soon_threadsafe``. A client that goes away mid-request has its request cancelled
in the engine (freed at the next step boundary).

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions``, ``GET /v1/models``,
``GET /health``, ``GET /metrics``. Errors are OpenAI's JSON errors with 4xx statuses
(:class:`~specgraft.serve.schemas.APIError`); a full queue is a 429.

    app = create_app(decoder, ServerConfig(model_name="smollm2"))
    uvicorn.run(app, host="127.0.0.1", port=8000)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any, AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException

from specgraft.api import SpecDecoder
from specgraft.batch import QueueFull
from specgraft.budget.policy import BudgetPolicy
from specgraft.config import GenerationConfig
from specgraft.serve.metrics import ServerMetrics
from specgraft.serve.schemas import (
    DESCRIBES_INPUT, APIError, ChatCompletionRequest, CompletionRequest, ResponseHead, SamplingFields, Usage, completion_prompt,
    refuse_unsupported,
)
from specgraft.serve.worker import ModelWorker, Piece, WorkerFailed

log = logging.getLogger("specgraft.serve")

@dataclass(frozen=True)
class ServerConfig:
    """What ``specgraft serve`` serves and how much it takes at once."""

    model_name: str
    """The model id clients send (``model``) and ``/v1/models`` lists; others get a 404."""
    max_batch: int = 8
    """Sequences decoded together (one target forward per step)."""
    max_queue: int | None = 64
    """Requests waiting for a place in the batch; one more is refused with 429 (None = no limit)."""
    default_max_tokens: int = 256
    """``max_tokens`` when a request gives none, capped by what the context window leaves."""
    budget: int | None = None
    """Tree nodes verified per step and sequence (None: the method's default budget); a
    ``BudgetPolicy`` may lower it per batch size."""

    def __post_init__(self) -> None:
        if not self.model_name:
            raise ValueError("model_name must not be empty")
        if not isinstance(self.max_batch, int) or self.max_batch < 1:
            raise ValueError(f"max_batch must be an integer >= 1, got {self.max_batch!r}")
        if self.max_queue is not None and (not isinstance(self.max_queue, int) or self.max_queue < 0):
            raise ValueError(f"max_queue must be an integer >= 0 or None, got {self.max_queue!r}")
        if not isinstance(self.default_max_tokens, int) or self.default_max_tokens < 1:
            raise ValueError(f"default_max_tokens must be an integer >= 1, got {self.default_max_tokens!r}")
        if self.budget is not None and (not isinstance(self.budget, int) or self.budget < 1):
            raise ValueError(f"budget must be an integer >= 1 or None, got {self.budget!r}")


def create_app(decoder: SpecDecoder, config: ServerConfig, policy: BudgetPolicy | None = None) -> FastAPI:
    """The app over ``decoder``; its worker thread starts and stops with the app's lifespan
    (``app.state.worker``)."""
    decoder.resolve(decoder.make_config(budget=config.budget))  # a budget the method refuses fails now, not per request
    metrics = ServerMetrics(decoder.method)
    worker = ModelWorker(decoder, config.max_batch, config.max_queue, policy, metrics)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        worker.start()
        log.info("serving %s with method %s, max_batch %d, max_queue %s", config.model_name, decoder.method, config.max_batch, config.max_queue)
        yield
        # the connections are closed (their requests finished, or were cancelled after the
        # grace period: run.py); anything left is cancelled here, off the event loop
        await asyncio.to_thread(worker.close)
        log.info("model worker stopped")

    app = FastAPI(title="specgraft", lifespan=lifespan)
    app.state.worker = worker
    app.state.config = config
    server = _Server(decoder, config, worker, metrics)

    @app.exception_handler(APIError)
    async def api_error(request: Request, e: APIError) -> JSONResponse:
        if request.url.path.startswith("/v1/") and request.method == "POST" and 400 <= e.status < 500 and e.status != 429:
            metrics.observe_rejected("invalid")
        return JSONResponse(e.body(), status_code=e.status)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, e: HTTPException) -> JSONResponse:
        return JSONResponse(APIError(e.status_code, str(e.detail)).body(), status_code=e.status_code)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, e: Exception) -> JSONResponse:
        log.exception("%s %s failed", request.method, request.url.path)
        return JSONResponse(APIError(500, f"internal error: {type(e).__name__}: {e}").body(), status_code=500)

    @app.get("/health")
    async def health() -> JSONResponse:
        if not worker.alive:
            raise APIError(503, worker.failure or "the model worker is not running", code="worker_not_running")
        return JSONResponse({"status": "ok", "running": worker.batch.num_running, "waiting": worker.batch.num_waiting})

    @app.get("/metrics")
    async def get_metrics() -> PlainTextResponse:
        return PlainTextResponse(metrics.render(worker.batch), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {
            "id": config.model_name, "object": "model", "created": server.created, "owned_by": "specgraft",
            "max_model_len": decoder.target.max_positions,
        }
        return {"object": "list", "data": [card]}

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        body = await _parse(request, CompletionRequest)
        server.check_request(body)
        prompt = completion_prompt(body)
        vocab = decoder.target.vocab_size
        bad = [t for t in prompt if not 0 <= t < vocab] if not isinstance(prompt, str) else []
        if bad:  # the engine would fail the whole batch on it
            raise APIError(400, f"token id {bad[0]} is outside the vocabulary [0, {vocab})", param="prompt")
        try:
            ids = decoder.encode(prompt)
        except ValueError as e:
            raise APIError(400, str(e), param="prompt") from e
        return await server.generate(request, body, ids, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        body = await _parse(request, ChatCompletionRequest)
        server.check_request(body)
        messages = body.conversation()
        try:
            ids = decoder.encode_messages(messages)
        except Exception as e:  # the template's own errors (jinja2 TemplateError, e.g. roles that must alternate)
            raise APIError(400, f"the chat template refused the messages: {e}", param="messages") from e
        return await server.generate(request, body, ids, chat=True)

    return app


async def _parse(request: Request, model: type[BaseModel]) -> Any:
    """The body as ``model``; 400 for a body that is not JSON or not a valid request."""
    raw = await request.body()
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise APIError(400, f"the body is not valid JSON: {e}", code="invalid_json") from e
    if not isinstance(data, dict):
        raise APIError(400, f"the body must be a JSON object, got {type(data).__name__}", code="invalid_json")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise validation_error(e) from e


def field_path(loc: tuple[str | int, ...]) -> str | None:
    """A pydantic error location as a JSON path in words.

    >>> field_path(("messages", 0, "content")), field_path(("max_tokens",)), field_path(())
    ('messages[0].content', 'max_tokens', None)
    """
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path or None


def validation_error(e: ValidationError, most: int = 80) -> APIError:
    """The 400 for a body pydantic refused: its first error, naming the field and what was sent
    (cut to ``most`` characters), e.g. ``max_tokens: Input should be a valid integer (got True)``."""
    first = e.errors()[0]
    param = field_path(first["loc"])
    got = ""
    if first["type"] != "missing" and first["type"] not in DESCRIBES_INPUT:
        sent = repr(first["input"])
        got = f" (got {sent if len(sent) <= most else sent[: most - 3] + '...'})"
    where = f"{param}: " if param else ""
    return APIError(400, f"{where}{first['msg']}{got}", param=param, code=first["type"])


class _Server:
    """The request path shared by both endpoints."""

    def __init__(self, decoder: SpecDecoder, config: ServerConfig, worker: ModelWorker, metrics: ServerMetrics):
        self.decoder = decoder
        self.config = config
        self.worker = worker
        self.metrics = metrics
        self.created = int(time.time())

    def check_request(self, body: SamplingFields) -> None:
        if body.model != self.config.model_name:
            raise APIError(404, f"the model {body.model!r} does not exist; this server serves {self.config.model_name!r}",
                           param="model", code="model_not_found")
        refuse_unsupported(body)

    def generation_config(self, body: SamplingFields, prompt_tokens: int) -> GenerationConfig:
        """400 for a prompt or ``max_tokens`` beyond the context window (``max_tokens`` may not
        exceed what the prompt leaves of it)."""
        context = self.decoder.target.max_positions
        room = context - prompt_tokens
        param = "messages" if isinstance(body, ChatCompletionRequest) else "prompt"
        if room < 1:
            raise APIError(400, f"the prompt has {prompt_tokens} tokens but the model's context window is {context} tokens",
                           param=param, code="context_length_exceeded")
        asked = body.max_new_tokens() if isinstance(body, ChatCompletionRequest) else body.max_tokens
        if asked is not None and asked > room:
            raise APIError(
                400, f"max_tokens is {asked} but the prompt has {prompt_tokens} tokens and the context window is {context} tokens "
                f"(at most {room} new tokens)", param="max_tokens", code="context_length_exceeded",
            )
        max_new = asked if asked is not None else min(self.config.default_max_tokens, room)
        try:
            return self.decoder.make_config(
                max_new_tokens=max_new, temperature=body.temperature, top_p=body.top_p, top_k=body.top_k, seed=body.seed,
                stop=body.stop_strings(), stop_on_eos=not body.ignore_eos, budget=self.config.budget,
            )
        except ValueError as e:
            raise APIError(400, str(e)) from e

    async def generate(self, request: Request, body: SamplingFields, ids: list[int], chat: bool) -> Response:
        config = self.generation_config(body, len(ids))
        request_id = uuid.uuid4().hex
        queue: asyncio.Queue[Piece] = asyncio.Queue()
        loop = asyncio.get_running_loop()

        def sink(piece: Piece) -> None:  # on the worker thread
            with contextlib.suppress(RuntimeError):  # the loop is closed: the server is gone
                loop.call_soon_threadsafe(queue.put_nowait, piece)

        try:
            self.worker.submit(ids, config, sink, request_id)
        except QueueFull as e:
            self.metrics.observe_rejected("queue_full")
            raise APIError(429, f"the server is busy: {e}; retry later", code="queue_full", type="rate_limit_error") from e
        except WorkerFailed as e:
            raise APIError(503, str(e), code="unavailable") from e
        except ValueError as e:
            raise APIError(400, str(e)) from e
        head = ResponseHead.new(request_id, self.config.model_name, chat)
        if body.stream:
            return StreamingResponse(
                self._stream(head, queue, request_id, len(ids), body.include_usage),
                media_type="text/event-stream", headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
        return await self._respond(request, head, queue, request_id, len(ids))

    async def _respond(self, request: Request, head: ResponseHead, queue: asyncio.Queue[Piece], request_id: str, prompt_tokens: int) -> Response:
        watcher = asyncio.ensure_future(self._cancel_on_disconnect(request, request_id))
        text: list[str] = []
        finished = False
        try:
            while not finished:
                piece = await queue.get()
                text.append(piece.text)
                finished = piece.finished
        finally:
            watcher.cancel()
            if not finished:  # cancelled by uvicorn (a shutdown past its grace period)
                self.worker.cancel(request_id)
        _raise_for(piece)
        return JSONResponse(head.response("".join(text), piece.finish_reason, Usage(prompt_tokens, piece.completion_tokens)))

    async def _cancel_on_disconnect(self, request: Request, request_id: str) -> None:
        """Cancel the request when its client goes away (the body is read: the next ASGI message
        is the disconnect)."""
        while (await request.receive())["type"] != "http.disconnect":
            pass
        self.worker.cancel(request_id)

    async def _stream(self, head: ResponseHead, queue: asyncio.Queue[Piece], request_id: str, prompt_tokens: int, include_usage: bool) -> AsyncIterator[str]:
        """Server-sent events: text chunks, the last chunk with the finish reason, the usage chunk
        if asked, ``[DONE]``. An engine failure or a shutdown ends the stream with an error event.
        Leaving early (the client disconnected: Starlette cancels this generator) cancels the
        request."""
        finished = False
        try:
            if head.chat:
                yield _sse(head.chunk("", role=True))
            while True:
                piece = await queue.get()
                if piece.text:
                    yield _sse(head.chunk(piece.text))
                if piece.finished:
                    finished = True
                    break
            try:
                _raise_for(piece)
            except APIError as e:
                yield _sse(e.body())
            else:
                yield _sse(head.chunk(None, piece.finish_reason))
                if include_usage:
                    yield _sse(head.usage_chunk(Usage(prompt_tokens, piece.completion_tokens)))
            yield "data: [DONE]\n\n"
        finally:
            if not finished:
                self.worker.cancel(request_id)


def _raise_for(piece: Piece) -> None:
    """An APIError for a request that did not end with ``stop`` or ``length``."""
    if piece.finish_reason == "cancelled":
        raise APIError(503, "the request was cancelled: the server is shutting down", code="cancelled")
    if piece.finish_reason not in ("stop", "length"):
        raise APIError(500, f"generation failed: {piece.error or piece.finish_reason}", code="generation_failed")


def _sse(data: dict[str, Any]) -> str:
    return f"data: {json.dumps(data, separators=(',', ':'))}\n\n"
