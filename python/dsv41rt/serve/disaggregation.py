"""Prefill/decode disaggregation on the server's side (`disaggregation-mode`; the router is
serve/router.py, the design docs/design/disaggregation.md).

A request the router sends carries a handoff id (HANDOFF_ID_HEADER):
  - on a prefill server it runs with `handoff=True`: it ends after its first token and its
    `Handoff` (prompt ids, that first output, the engine's state blob) waits in the HandoffStore
    until a decode server takes it (GET HANDOFF_ROUTE/{id}, once) or it expires;
  - on a decode server, which also gets the prefill server's address (PREFILL_URL_HEADER), the
    middleware fetches that handoff before the route runs; the route prepares the request as
    always, and the engine loop continues it from the state (Runtime.add_handoff_request) after
    giving the route the first output as if it had been generated here.
So every route (chat, completions, Responses, Messages) works unchanged on both sides. The state
travels over HTTP between the two servers (NIXL is the planned transport; see the design note).
"""

from __future__ import annotations

import contextvars
import json
import struct
import threading
import time
from dataclasses import dataclass
from typing import Any

from ..runtime import StepOutput

MODES = ("none", "prefill", "decode")
HANDOFF_ID_HEADER = "x-dsv41rt-handoff-id"
PREFILL_URL_HEADER = "x-dsv41rt-prefill-url"
HANDOFF_ROUTE = "/dsv41rt/handoff"
_LEN = struct.Struct("<Q")


@dataclass(frozen=True)
class Handoff:
    """What a decode server needs to continue a request: the prompt ids the prefill server ran,
    its first output (the first token, its logprobs, and whether the request ended there) and the
    engine's state after the prompt (None when the request ended at its first token)."""

    prompt: list[int]
    first: StepOutput
    state: bytes | None

    def encode(self) -> bytes:
        """A length-prefixed JSON header, then the state's bytes."""
        f = self.first
        head = {
            "prompt": self.prompt,
            "tokens": f.new_tokens,
            "logprobs": f.logprobs,
            "top_logprobs": [[[int(k), v] for k, v in d.items()] for d in f.top_logprobs],
            "finish_reason": f.finish_reason if self.state is None else None,
            "cached_tokens": f.cached_tokens,
            "state_bytes": len(self.state or b""),
        }
        raw = json.dumps(head).encode()
        return _LEN.pack(len(raw)) + raw + (self.state or b"")

    @staticmethod
    def decode(blob: bytes) -> Handoff:
        """The inverse of encode; ValueError naming what is wrong with a malformed blob."""
        if len(blob) < _LEN.size:
            raise ValueError(f"handoff: {len(blob)} bytes is shorter than its length prefix")
        (n,) = _LEN.unpack_from(blob)
        if _LEN.size + n > len(blob):
            raise ValueError(f"handoff: header of {n} bytes runs past the {len(blob)}-byte body")
        head = json.loads(blob[_LEN.size : _LEN.size + n])
        state = blob[_LEN.size + n :]
        if len(state) != head["state_bytes"]:
            raise ValueError(f"handoff: {len(state)} state bytes, the header says {head['state_bytes']}")
        reason = head["finish_reason"]
        first = StepOutput(
            request_id=-1,
            new_tokens=[int(t) for t in head["tokens"]],
            finished=reason is not None,
            finish_reason=reason,
            logprobs=[float(x) for x in head["logprobs"]],
            top_logprobs=[{int(k): float(v) for k, v in pairs} for pairs in head["top_logprobs"]],
            cached_tokens=int(head["cached_tokens"]),
        )
        return Handoff([int(t) for t in head["prompt"]], first, state or None)


@dataclass(frozen=True)
class PrefillTag:
    """A prefill server's request the router will hand off under `handoff_id`."""

    handoff_id: str


#: The handoff role of the request being handled (set by the middleware, read by `admit`).
current: contextvars.ContextVar[PrefillTag | Handoff | None] = contextvars.ContextVar("handoff", default=None)


class HandoffStore:
    """Finished prefills waiting for their decode server: each taken once, dropped after `ttl`
    seconds (a router or decode server that never came), at most `capacity` kept (oldest dropped)."""

    def __init__(self, ttl: float = 120.0, capacity: int = 1024) -> None:
        self._ttl, self._capacity = ttl, capacity
        self._lock = threading.Lock()  # put from the engine's output thread, take from the loop
        self._items: dict[str, tuple[float, Handoff]] = {}
        self.expired = 0

    def put(self, handoff_id: str, h: Handoff) -> None:
        with self._lock:
            self._drop_old()
            self._items[handoff_id] = (time.monotonic(), h)
            while len(self._items) > self._capacity:
                del self._items[next(iter(self._items))]
                self.expired += 1

    def take(self, handoff_id: str) -> Handoff | None:
        with self._lock:
            self._drop_old()
            item = self._items.pop(handoff_id, None)
            return item[1] if item else None

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def _drop_old(self) -> None:
        now = time.monotonic()
        for k in [k for k, (t, _) in self._items.items() if now - t > self._ttl]:
            del self._items[k]
            self.expired += 1


def first_output(h: Handoff, request_id: int) -> StepOutput:
    """The prefill server's first output as this server's output of `request_id`: finished only
    when the request ended there."""
    if h.first.finished:
        return h.first._replace(request_id=request_id)
    return h.first._replace(request_id=request_id, finished=False, finish_reason=None, handoff=None)


def handoff_id_of(headers: Any) -> str | None:
    """The handoff id header, when a router set one (ids are the router's uuid4 hex)."""
    value = headers.get(HANDOFF_ID_HEADER)
    if value is None:
        return None
    if not (1 <= len(value) <= 64 and all(c.isalnum() or c == "-" for c in value)):
        raise ValueError(f"{HANDOFF_ID_HEADER}: {value!r} is not a handoff id")
    return value


def allowed_prefill_url(url: str, peers: tuple[str, ...]) -> bool:
    """A decode server fetches state only from its configured prefill servers (`prefill-servers`),
    or, with none configured, from this host: a handoff header must not make it fetch any URL."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return False
    if peers:
        return url.rstrip("/") in {p.rstrip("/") for p in peers}
    return parts.hostname in ("127.0.0.1", "localhost", "::1")


class HandoffMiddleware:
    """Pure ASGI: sets `current` for a request a router hands off (prefill: its id; decode: the
    Handoff fetched from the prefill server). A bad header is a 400; an unreachable prefill server
    or a handoff it does not have (expired, taken) a 502, so the router can retry elsewhere."""

    def __init__(self, app: Any, state: Any) -> None:
        self.app, self.state = app, state

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        mode = getattr(self.state.cfg, "disaggregation_mode", "none")  # test doubles of the config: none
        if scope["type"] != "http" or mode == "none":
            await self.app(scope, receive, send)
            return
        from starlette.datastructures import Headers

        from .guard import error_response
        from .protocol import ApiError

        headers = Headers(scope=scope)
        try:
            handoff_id = handoff_id_of(headers)
            role: PrefillTag | Handoff | None = None
            if handoff_id is not None and mode == "prefill":
                role = PrefillTag(handoff_id)
            elif handoff_id is not None:
                role = await self._fetch(headers, handoff_id)
        except ApiError as err:
            await error_response(err)(scope, receive, send)
            return
        except ValueError as err:
            await error_response(ApiError(400, str(err)))(scope, receive, send)
            return
        token = current.set(role)
        try:
            await self.app(scope, receive, send)
        finally:
            current.reset(token)

    async def _fetch(self, headers: Any, handoff_id: str) -> Handoff:
        import httpx

        from .protocol import ApiError

        url = headers.get(PREFILL_URL_HEADER)
        if not url:
            raise ApiError(400, f"{HANDOFF_ID_HEADER} needs {PREFILL_URL_HEADER} (the prefill server's URL)")
        if not allowed_prefill_url(url, self.state.cfg.prefill_servers):
            raise ApiError(400, f"{PREFILL_URL_HEADER}: {url!r} is not a configured prefill server")
        auth = {k: v for k, v in headers.items() if k in ("authorization", "x-api-key")}
        start = time.monotonic()
        try:
            async with httpx.AsyncClient(timeout=60) as client:
                r = await client.get(f"{url.rstrip('/')}{HANDOFF_ROUTE}/{handoff_id}", headers=auth)
        except httpx.HTTPError as err:
            raise ApiError(502, f"handoff {handoff_id}: prefill server {url} unreachable ({err})") from None
        if r.status_code != 200:
            raise ApiError(502, f"handoff {handoff_id}: prefill server {url} answered {r.status_code}")
        h = Handoff.decode(r.content)
        self.state.metrics.handoff_received(len(r.content), time.monotonic() - start)
        return h
