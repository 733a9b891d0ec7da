"""The server's request guard as a pure ASGI middleware: API key, draining, JSON-only POST bodies,
body size, and an OpenAI-style 500 for a bug. Pure ASGI (not `@app.middleware("http")`, a
BaseHTTPMiddleware) so that routes read the client's own receive channel: behind a
BaseHTTPMiddleware `Request.is_disconnected()` never turned true and a non-streaming request whose
client had gone ran to max_tokens (issue 23 D1)."""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .messages_api import ANTHROPIC_PATHS, as_anthropic
from .protocol import ApiError

log = logging.getLogger("dsv41rt.serve")
# Outside the API key and the drain: probes, and the API's schema (what client generators read, as
# vLLM serves it).
OPEN_PATHS = ("/health", "/ready", "/metrics", "/version", "/openapi.json")


def error_response(err: ApiError) -> JSONResponse:
    headers = {"Retry-After": "1"} if err.status == 503 else None
    return JSONResponse(err.body(), status_code=err.status, headers=headers)


def _as_is(err: ApiError) -> ApiError:
    return err


def internal_error(err: Exception, path: str, shaped: Callable[[ApiError], ApiError] = _as_is) -> JSONResponse:
    """A bug: logged (once, with its traceback) and answered with a 500 (OpenAI-style, or as
    `shaped` makes it) naming only the exception's type."""
    log.error("internal error on %s", path, exc_info=err)
    return error_response(shaped(ApiError(500, f"internal error: {type(err).__name__}")))


def key_ok(authorization: str, x_api_key: str, keys: tuple[str, ...]) -> bool:
    """`Authorization: Bearer <key>` (the scheme in any case, RFC 9110) or Anthropic's
    `x-api-key: <key>` against every key, in constant time: both headers are compared with every
    key, whichever is present (no short-circuit)."""
    scheme, _, key = authorization.partition(" ")
    given = [(scheme.lower() == "bearer", key.strip().encode()), (bool(x_api_key), x_api_key.strip().encode())]
    matches = [present & secrets.compare_digest(value, k.encode()) for present, value in given for k in keys]
    return any(matches)


def is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


class Guard:
    """Checks a request before the routes see it (state: the server's ServerState)."""

    def __init__(self, app: ASGIApp, state: Any) -> None:
        self.app, self.state = app, state

    async def _refusal(self, request: Request) -> ApiError | None:
        cfg, state = self.state.cfg, self.state
        if request.url.path in OPEN_PATHS:
            return None
        headers = request.headers
        if cfg.api_key and not key_ok(headers.get("authorization", ""), headers.get("x-api-key", ""), cfg.api_key):
            return ApiError(401, "missing or invalid API key (Authorization: Bearer <key>, or x-api-key: <key>)")
        if state.draining:
            state.metrics.rejected("draining")
            return ApiError(503, "the server is shutting down")
        if not state.engine.alive:  # e.g. a parallel worker process died: nothing can run here
            state.metrics.rejected("engine_failed")
            return ApiError(503, f"the engine failed: {state.engine.error}")
        has_body = request.headers.get("content-length", "0") != "0" or "transfer-encoding" in request.headers
        if request.method == "POST" and has_body and not is_json(request.headers.get("content-type", "")):
            # A text/plain or form POST is what a browser may send cross-site without a
            # preflight: only JSON bodies run (issue 23, hygiene).
            return ApiError(415, "the body must be sent as Content-Type: application/json")
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > cfg.max_request_bytes):
            # Read (and drop) a moderately oversized body so the client sees the 413 instead of a
            # reset connection; far larger ones are cut off.
            if length.isdigit() and int(length) <= 64 * cfg.max_request_bytes:
                async for _ in request.stream():
                    pass
            return ApiError(413, f"request body exceeds {cfg.max_request_bytes} bytes")
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        # The one place a bug becomes a 500 (the app has no exception handler for Exception: behind
        # it Starlette re-raises, and the server would log the error a second time).
        # Anthropic's Messages routes answer in Anthropic's error shape, their refusals too.
        shaped = as_anthropic if scope.get("path") in ANTHROPIC_PATHS else _as_is
        try:
            refusal = await self._refusal(Request(scope, receive))
            if refusal is not None:
                await error_response(shaped(refusal))(scope, receive, tracked_send)
                return
            await self.app(scope, receive, tracked_send)
        except Exception as err:  # a bug: an OpenAI-style 500 when nothing was sent, the server keeps serving
            response = internal_error(err, scope.get("path", ""), shaped)
            if not started:
                await response(scope, receive, send)
