"""`dsv41rt router`: one OpenAI-compatible endpoint over prefill and decode servers
(`dsv41rt serve --disaggregation-mode prefill|decode`; docs/design/disaggregation.md).

Each generation request (chat, completions, Responses, Messages) gets a fresh handoff id. The
router sends the client's body to a prefill server, which runs the prompt and the first token and
keeps the request's state under that id; then the same body to a decode server, which fetches the
state from that prefill server and streams the whole answer, first token included; the router
passes that response through as it comes. The client sees one ordinary server.

Failures: a peer that cannot be reached is skipped for the next one (round robin over each side),
and passed over for PEER_COOLDOWN_S;
a decode server that cannot fetch the state (502) or dies before answering makes the router start
over with the next peers; when every attempt failed the client gets a 503 with Retry-After. A
prefill server's own answer other than 200 (e.g. a 400 for a bad request) goes to the client as it
is: both sides validate requests alike.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from .disaggregation import HANDOFF_ID_HEADER, PREFILL_URL_HEADER

log = logging.getLogger("dsv41rt.router")
GENERATION_ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages")
# What a client's request carries that the servers need, and what their answers carry back.
_REQUEST_HEADERS = ("authorization", "x-api-key", "content-type", "anthropic-version", "anthropic-beta")
_RESPONSE_HEADERS = ("content-type", "retry-after")
PEER_COOLDOWN_S = 5.0  # a peer that failed to answer is skipped this long


@dataclass(frozen=True)
class RouterConfig:
    prefill: tuple[str, ...]
    decode: tuple[str, ...]
    timeout: float = 600.0  # seconds a server may take to answer (a prefill of a long prompt)


def _error(status: int, message: str) -> JSONResponse:
    kind = "service_unavailable" if status == 503 else "server_error"
    body = {"error": {"message": message, "type": kind, "param": None, "code": None}}
    return JSONResponse(body, status_code=status, headers={"Retry-After": "1"} if status == 503 else None)


class Router:
    def __init__(self, cfg: RouterConfig) -> None:
        if not cfg.prefill or not cfg.decode:
            raise ValueError("the router needs at least one prefill and one decode server")
        self.cfg = cfg
        self._prefill = itertools.cycle(cfg.prefill)
        self._decode = itertools.cycle(cfg.decode)
        self.client = httpx.AsyncClient(timeout=httpx.Timeout(cfg.timeout, connect=5.0))
        self._down: dict[str, float] = {}  # peer -> until when it is skipped (it failed to answer)
        self.handoffs = 0
        self.retries = 0

    def _pick(self, peers: Iterator[str], n: int) -> str:
        """The next peer in round robin that has not failed lately (any, if all have)."""
        now = time.monotonic()
        first = next(peers)
        peer = first
        for _ in range(n):
            if self._down.get(peer, 0.0) <= now:
                return peer
            peer = next(peers)
        return first

    def _failed(self, peer: str) -> None:
        self._down[peer] = time.monotonic() + PEER_COOLDOWN_S
        self.retries += 1

    async def generate(self, request: Request) -> Response:
        body = await request.body()
        headers = {k: v for k, v in request.headers.items() if k in _REQUEST_HEADERS}
        path = request.url.path
        failures: list[str] = []
        for _ in range(len(self.cfg.prefill) + len(self.cfg.decode)):
            handoff_id = uuid.uuid4().hex
            prefill = self._pick(self._prefill, len(self.cfg.prefill))
            try:
                to_prefill = {**headers, HANDOFF_ID_HEADER: handoff_id}
                r = await self.client.post(prefill + path, content=body, headers=to_prefill)
            except httpx.HTTPError as err:
                failures.append(f"prefill {prefill}: {type(err).__name__}")
                self._failed(prefill)
                continue
            if r.status_code != 200:  # the request's own error (both sides check alike), or a busy server
                return Response(r.content, r.status_code, headers=_passed(r.headers))
            decode = self._pick(self._decode, len(self.cfg.decode))
            to_decode = {**headers, HANDOFF_ID_HEADER: handoff_id, PREFILL_URL_HEADER: prefill}
            try:
                answer = await self.client.send(
                    self.client.build_request("POST", decode + path, content=body, headers=to_decode), stream=True
                )
            except httpx.HTTPError as err:
                failures.append(f"decode {decode}: {type(err).__name__}")
                self._failed(decode)
                continue
            if answer.status_code == 502:  # it could not fetch the state: start over
                failures.append(f"decode {decode}: {(await answer.aread()).decode(errors='replace')[:200]}")
                await answer.aclose()
                self.retries += 1
                continue
            if not answer.headers.get("content-type", "").startswith("text/event-stream"):
                try:  # a whole answer: read it all, so a decode server that dies meanwhile is retried
                    content = await answer.aread()
                except httpx.HTTPError as err:
                    failures.append(f"decode {decode} died while answering: {type(err).__name__}")
                    self._failed(decode)
                    continue
                finally:
                    await answer.aclose()
                self.handoffs += 1
                return Response(content, answer.status_code, headers=_passed(answer.headers))
            self.handoffs += 1
            return StreamingResponse(
                _relay(answer, decode),
                status_code=answer.status_code,
                headers=_passed(answer.headers),
                background=BackgroundTask(answer.aclose),
            )
        log.warning("no prefill/decode pair could serve %s: %s", path, "; ".join(failures))
        return _error(503, f"no prefill/decode server pair could serve the request ({'; '.join(failures)})")

    async def forward_get(self, request: Request) -> Response:
        """Model lists and the like come from a decode server (every server serves the same model)."""
        for _ in self.cfg.decode:
            decode = next(self._decode)
            try:
                r = await self.client.get(
                    decode + request.url.path,
                    headers={k: v for k, v in request.headers.items() if k in _REQUEST_HEADERS},
                )
            except httpx.HTTPError:
                continue
            return Response(r.content, r.status_code, headers=_passed(r.headers))
        return _error(503, "no decode server could be reached")

    async def health(self, _: Request) -> Response:
        return Response(status_code=200)

    def app(self) -> Starlette:
        routes = [Route(p, self.generate, methods=["POST"]) for p in GENERATION_ROUTES]
        routes += [Route(p, self.forward_get, methods=["GET"]) for p in ("/v1/models", "/version")]
        routes.append(Route("/health", self.health, methods=["GET"]))

        @contextlib.asynccontextmanager
        async def lifespan(_: Starlette) -> AsyncIterator[None]:
            yield
            await self.client.aclose()

        return Starlette(routes=routes, lifespan=lifespan)


async def _relay(answer: httpx.Response, decode: str) -> AsyncIterator[bytes]:
    """A decode server's event stream as it comes; if the server dies mid-stream, an error event
    (OpenAI's shape) ends it, so the client sees why its answer stopped."""
    try:
        async for chunk in answer.aiter_raw():
            yield chunk
    except httpx.HTTPError as err:
        log.warning("decode server %s failed mid-stream: %s", decode, err)
        message = f"the decode server failed mid-answer ({type(err).__name__}); retry the request"
        body = {"error": {"message": message, "type": "server_error", "param": None, "code": None}}
        yield f"\n\ndata: {json.dumps(body)}\n\n".encode()


def _passed(headers: Any) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() in _RESPONSE_HEADERS}
