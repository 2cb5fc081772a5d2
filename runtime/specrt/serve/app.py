"""The ASGI app: OpenAI's /v1/completions, /v1/chat/completions, /v1/models, and /health.

At most ``max_concurrent`` generations run at once; a request over the limit is answered 429
with ``Retry-After`` at once (never queued). Each generation step runs on a worker thread; a
client that disconnects (streaming or not) cancels its generation (:mod:`specrt.cancel`), which
stops within one forward pass, even during a long prefill, then frees its KV cache and its slot.
A request's deadline (its ``specrt.timeout_s``, else the server's ``request_timeout_s``) stops it
the same way; its answer then ends with the text generated so far and finish_reason "timeout".
"""

from __future__ import annotations

import json
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from specrt.errors import InvalidRequestError, SpecrtError
from specrt.logprobs import TokenLogprob
from specrt.model import SpecModel
from specrt.serve.errors import ApiError
from specrt.serve.generation import Generation
from specrt.serve.requests import GenerationRequest, Speculation, parse_request

log = logging.getLogger(__name__)

RETRY_AFTER_S = 1  # what a 429 tells the client to wait


@dataclass(frozen=True)
class ServeConfig:
    model_id: str  # the name /v1/models lists and responses carry
    speculation: Speculation  # the default of requests that send no "specrt" object
    max_concurrent: int  # generations running at once; more are answered 429
    request_timeout_s: float | None = None  # the deadline of a request that names none (seconds); None: none


class Slots:
    """The count of running generations. Touched only from the event loop, so it needs no lock."""

    def __init__(self, limit: int):
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise InvalidRequestError(f"max_concurrent must be an int >= 1, got {limit!r}")
        self.limit = limit
        self.in_flight = 0

    def take(self) -> None:
        if self.in_flight >= self.limit:
            raise ApiError(429, f"the server is running {self.limit} generations, its limit; retry shortly",
                           type="rate_limit_error", code="too_many_requests")
        self.in_flight += 1

    def give_back(self) -> None:
        self.in_flight -= 1


class _ClosingStream(StreamingResponse):
    """A streaming response that closes its body generator however the response ends (a cancelled
    response would otherwise leave it for the garbage collector)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.body_iterator.aclose()  # type: ignore[union-attr]


def _sse(payload: dict[str, Any] | str) -> str:
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n"


class Server:
    """The app's handlers over one loaded model."""

    def __init__(self, model: SpecModel, config: ServeConfig):
        self.model = model
        self.config = config
        self.slots = Slots(config.max_concurrent)
        limit = config.request_timeout_s
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, (int, float))
                                  or not math.isfinite(limit) or limit <= 0):
            raise InvalidRequestError(f"request_timeout_s must be a positive finite number of seconds or None, "
                                      f"got {limit!r}")

    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok", "in_flight": self.slots.in_flight,
                             "max_concurrent": self.slots.limit})

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [
            {"id": self.config.model_id, "object": "model", "created": 0, "owned_by": "specrt"}]})

    async def completions(self, request: Request) -> Response:
        return await self._generate(request, chat=False)

    async def chat(self, request: Request) -> Response:
        return await self._generate(request, chat=True)

    async def _generate(self, request: Request, *, chat: bool) -> Response:
        try:
            body = json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ApiError(400, f"the request body is not valid JSON: {e}") from None
        req = parse_request(body, chat=chat, model=self.model, default=self.config.speculation,
                            has_draft=self.model.draft_graph is not None,
                            default_timeout_s=self.config.request_timeout_s)
        self.slots.take()
        try:
            gen = await anyio.to_thread.run_sync(Generation, self.model, req)
        except BaseException:
            self.slots.give_back()
            raise
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        if req.stream:
            return _ClosingStream(self._stream(gen, req, rid), media_type="text/event-stream",
                                  headers={"Cache-Control": "no-cache"})
        try:
            text = await self._run(gen, request)
        finally:
            await _close(gen)
            self.slots.give_back()
        if text is None:  # the client went away: nobody reads this
            return Response(status_code=499)
        choice = ({"index": 0, "message": {"role": "assistant", "content": text}} if chat
                  else {"index": 0, "text": text})
        choice.update(logprobs=_logprobs(gen, gen.take_logprobs(), chat, 0), finish_reason=gen.finish_reason)
        return JSONResponse(self._envelope(rid, chat, chunk=False) | {
            "choices": [choice], "usage": gen.usage(), "specrt": gen.report()})

    async def _run(self, gen: Generation, request: Request) -> str | None:
        """The whole text, or None when the client disconnected: a watcher cancels the generation
        at once, so a step in progress (a long prefill included) ends within one forward pass."""
        pieces = []

        async def watch() -> None:
            while (await request.receive())["type"] != "http.disconnect":
                pass
            gen.cancel()

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(watch)
            while not gen.done:
                pieces.append(await anyio.to_thread.run_sync(gen.step))
            tasks.cancel_scope.cancel()
        if gen.cancelled:
            log.info("client gone: stopped after %d tokens", len(gen.token_ids))
            return None
        return "".join(pieces)

    def _envelope(self, rid: str, chat: bool, *, chunk: bool) -> dict[str, Any]:
        kind = ("chat.completion.chunk" if chunk else "chat.completion") if chat else "text_completion"
        return {"id": rid, "object": kind, "created": int(time.time()), "model": self.config.model_id}

    async def _stream(self, gen: Generation, req: GenerationRequest, rid: str) -> AsyncIterator[str]:
        chat = req.chat

        offset = 0  # completions' text_offset of the next token

        def chunk(delta: str | None, finish_reason: str | None = None) -> dict[str, Any]:
            nonlocal offset
            if chat:
                choice = {"index": 0, "delta": {} if delta is None else {"content": delta}}
            else:
                choice = {"index": 0, "text": delta or ""}
            logprobs = _logprobs(gen, gen.take_logprobs(), chat, offset)
            if logprobs is not None and not chat:
                offset += sum(len(t) for t in logprobs["tokens"])
            choice.update(logprobs=logprobs, finish_reason=finish_reason)
            return self._envelope(rid, chat, chunk=True) | {"choices": [choice]}

        released = False

        async def release() -> None:  # before the last events: a client that reads [DONE] finds its slot free
            nonlocal released
            if not released:
                released = True
                await _close(gen)
                self.slots.give_back()

        try:
            if chat:
                first = chunk("")
                first["choices"][0]["delta"] = {"role": "assistant", "content": ""}
                yield _sse(first)
            while not gen.done:
                try:  # a disconnect cancels this await at once; the step is then cancelled below
                    piece = await anyio.to_thread.run_sync(gen.step, abandon_on_cancel=True)
                except SpecrtError as e:
                    log.exception("generation failed")
                    await release()
                    yield _sse(ApiError(500, str(e), type="server_error").body())
                    yield _sse("[DONE]")
                    return
                if piece:
                    yield _sse(chunk(piece))
            await release()
            yield _sse(chunk(None, gen.finish_reason) | {"specrt": gen.report()})
            if req.include_usage:
                yield _sse(self._envelope(rid, chat, chunk=True) | {"choices": [], "usage": gen.usage()})
            yield _sse("[DONE]")
        finally:
            if not released:
                gen.cancel()
                with anyio.CancelScope(shield=True):
                    await release()
                log.info("client gone: stopped after %d tokens", len(gen.token_ids))


def _logprobs(gen: Generation, items: list[TokenLogprob], chat: bool, offset: int) -> dict[str, Any] | None:
    """OpenAI's ``logprobs`` of ``items`` (one per emitted token, counted in usage; None when the
    request asked for none). A token's text is its own decoding (U+FFFD for a part of a character);
    completions' ``text_offset`` adds these lengths from ``offset``."""
    if gen.request.logprobs is None:
        return None
    if chat:
        def entry(token_id: int, logprob: float) -> dict[str, Any]:
            text = gen.token_text(token_id)
            return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

        return {"content": [entry(lp.token_id, lp.logprob) | {"top_logprobs": [entry(t, v) for t, v in lp.top]}
                            for lp in items]}
    tokens = [gen.token_text(lp.token_id) for lp in items]
    offsets = [offset + sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]
    return {"tokens": tokens, "token_logprobs": [lp.logprob for lp in items],
            "top_logprobs": [{gen.token_text(t): v for t, v in lp.top} for lp in items], "text_offset": offsets}


async def _close(gen: Generation) -> None:
    """Cancel ``gen`` and close it on a worker thread once its running step (if any) has stopped,
    shielded: the response that owns it may itself be cancelled (its client went away)."""
    gen.cancel()
    with anyio.CancelScope(shield=True):
        await anyio.to_thread.run_sync(gen.close)


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    headers = {"Retry-After": str(RETRY_AFTER_S)} if exc.status == 429 else None
    return JSONResponse(exc.body(), status_code=exc.status, headers=headers)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    error = ApiError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}",
                     code="not_found" if exc.status_code == 404 else None)
    return JSONResponse(error.body(), status_code=exc.status_code)


async def _runtime_error(request: Request, exc: Exception) -> Response:
    """A refusal from the runtime the request checks did not foresee: still the client's request."""
    return JSONResponse(ApiError(400, str(exc)).body(), status_code=400)


async def _server_error(request: Request, exc: Exception) -> Response:
    error = ApiError(500, f"internal error: {type(exc).__name__}: {exc}", type="server_error")
    return JSONResponse(error.body(), status_code=500)


def build_app(model: SpecModel, config: ServeConfig) -> Starlette:
    """The ASGI app serving ``model``."""
    server = Server(model, config)
    routes = [
        Route("/health", server.health, methods=["GET"]),
        Route("/v1/models", server.models, methods=["GET"]),
        Route("/v1/completions", server.completions, methods=["POST"]),
        Route("/v1/chat/completions", server.chat, methods=["POST"]),
    ]
    handlers = {ApiError: _api_error, HTTPException: _http_error, InvalidRequestError: _runtime_error,
                Exception: _server_error}
    app = Starlette(routes=routes, exception_handlers=handlers)
    app.state.server = server
    return app
