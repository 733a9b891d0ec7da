"""`dsv41rt router`: one OpenAI-compatible endpoint over prefill and decode servers
(`dsv41rt serve --disaggregation-mode prefill|decode`; docs/design/disaggregation.md).

Each generation request (chat, completions, Responses, Messages) gets a fresh handoff id. The
router sends the client's body to a prefill server, which runs the prompt and the first token and
keeps the request's state under that id; then the same body to a decode server, which fetches the
state from that prefill server and streams the whole answer, first token included; the router
passes that response through as it comes. The client sees one ordinary server.

Failures: a peer that cannot be reached is skipped for the next one (round robin over each side);
a decode server that cannot fetch the state (502) or dies before answering makes the router start
over with the next peers; when every attempt failed the client gets a 503 with Retry-After. A
prefill server's own answer other than 200 (e.g. a 400 for a bad request) goes to the client as it
is: both sides validate requests alike.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import uuid
from collections.abc import AsyncIterator
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
        self.handoffs = 0
        self.retries = 0

    async def generate(self, request: Request) -> Response:
        body = await request.body()
        headers = {k: v for k, v in request.headers.items() if k in _REQUEST_HEADERS}
        path = request.url.path
        failures: list[str] = []
        for _ in range(max(len(self.cfg.prefill), len(self.cfg.decode)) + 1):
            handoff_id = uuid.uuid4().hex
            prefill = next(self._prefill)
            try:
                to_prefill = {**headers, HANDOFF_ID_HEADER: handoff_id}
                r = await self.client.post(prefill + path, content=body, headers=to_prefill)
            except httpx.HTTPError as err:
                failures.append(f"prefill {prefill}: {type(err).__name__}")
                self.retries += 1
                continue
            if r.status_code != 200:  # the request's own error (both sides check alike), or a busy server
                return Response(r.content, r.status_code, headers=_passed(r.headers))
            decode = next(self._decode)
            to_decode = {**headers, HANDOFF_ID_HEADER: handoff_id, PREFILL_URL_HEADER: prefill}
            try:
                answer = await self.client.send(
                    self.client.build_request("POST", decode + path, content=body, headers=to_decode), stream=True
                )
            except httpx.HTTPError as err:
                failures.append(f"decode {decode}: {type(err).__name__}")
                self.retries += 1
                continue
            if answer.status_code == 502:  # it could not fetch the state: start over
                failures.append(f"decode {decode}: {(await answer.aread()).decode(errors='replace')[:200]}")
                await answer.aclose()
                self.retries += 1
                continue
            self.handoffs += 1
            return StreamingResponse(
                answer.aiter_raw(),
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


def _passed(headers: Any) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() in _RESPONSE_HEADERS}
