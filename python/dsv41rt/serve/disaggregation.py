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
moves with NIXL (`handoff-transport: nixl`, the default; serve/handoff_transport.py: the GET
answer carries a manifest and the decode server READs the bytes) or in the GET answer itself
(`http`).
"""

from __future__ import annotations

import contextvars
import json
import logging
import struct
import threading
import time
from dataclasses import dataclass
from typing import Any

from ..runtime import StepOutput
from .handoff_transport import TRANSPORT_HEADER, NixlManifest, NixlPeer, TransferError

MODES = ("none", "prefill", "decode")
HANDOFF_ID_HEADER = "x-dsv41rt-handoff-id"
PREFILL_URL_HEADER = "x-dsv41rt-prefill-url"
HANDOFF_ROUTE = "/dsv41rt/handoff"
_LEN = struct.Struct("<Q")
log = logging.getLogger("dsv41rt.serve")


@dataclass(frozen=True)
class Handoff:
    """What a decode server needs to continue a request: the prompt ids the prefill server ran,
    its first output (the first token, its logprobs, and whether the request ended there) and the
    engine's state after the prompt (None when the request ended at its first token)."""

    prompt: list[int]
    first: StepOutput
    state: bytes | None

    def encode(self, nixl: NixlManifest | None = None) -> bytes:
        """A length-prefixed JSON header, then the state's bytes; with `nixl`, the header carries
        the manifest of the lent state instead of its bytes."""
        f = self.first
        head = {
            "prompt": self.prompt,
            "tokens": f.new_tokens,
            "logprobs": f.logprobs,
            "top_logprobs": [[[int(k), v] for k, v in d.items()] for d in f.top_logprobs],
            "finish_reason": f.finish_reason if self.state is None else None,
            "cached_tokens": f.cached_tokens,
            "state_bytes": 0 if nixl is not None else len(self.state or b""),
        }
        if nixl is not None:
            head["nixl"] = nixl.to_json()
        raw = json.dumps(head).encode()
        return _LEN.pack(len(raw)) + raw + (b"" if nixl is not None else self.state or b"")

    def _replace_state(self, state: bytes) -> Handoff:
        return Handoff(self.prompt, self.first, state)

    @staticmethod
    def decode(blob: bytes) -> tuple[Handoff, NixlManifest | None]:
        """The inverse of encode: the handoff (without its state when it was lent) and the lent
        state's manifest, if any; ValueError naming what is wrong with a malformed blob."""
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
        manifest = NixlManifest.from_json(head["nixl"]) if "nixl" in head else None
        return Handoff([int(t) for t in head["prompt"]], first, state or None), manifest


@dataclass(frozen=True)
class PrefillTag:
    """A prefill server's request the router will hand off under `handoff_id`."""

    handoff_id: str


#: The handoff role of the request being handled (set by the middleware, read by `admit`).
current: contextvars.ContextVar[PrefillTag | Handoff | None] = contextvars.ContextVar("handoff", default=None)


class HandoffStore:
    """Finished prefills waiting for their decode server: each taken once, dropped after `ttl`
    seconds (a router or decode server that never came), at most `capacity` kept (oldest dropped).
    With a NixlPeer, each state waits in NIXL-registered memory from `put` on (its registration is
    off the decode server's path); `take` hands out its manifest, and the memory is freed when the
    reader's notification arrives (`reap`), `ttl` seconds after the take, or when it is dropped."""

    def __init__(self, ttl: float = 120.0, capacity: int = 1024, nixl: NixlPeer | None = None) -> None:
        self._ttl, self._capacity, self.nixl = ttl, capacity, nixl
        self._lock = threading.Lock()  # put from the engine's output thread, take from the loop
        self._items: dict[str, tuple[float, Handoff]] = {}
        self.expired = 0

    def put(self, handoff_id: str, h: Handoff) -> None:
        if self.nixl is not None and h.state is not None:
            try:
                self.nixl.lend(handoff_id, h.state)
            except Exception as err:  # called on the engine's output thread, which must not die
                # The state stays here unlent: its decode server gets the bytes in the GET answer.
                log.warning("handoff %s: NIXL could not lend the state (%s); it goes over HTTP", handoff_id, err)
        with self._lock:
            self._drop_old()
            self._items[handoff_id] = (time.monotonic(), h)
            while len(self._items) > self._capacity:
                self._drop(next(iter(self._items)))

    def take(self, handoff_id: str) -> tuple[Handoff, NixlManifest | None] | None:
        """The handoff (once) and, with NIXL, its lent state's manifest."""
        with self._lock:
            self._drop_old()
            item = self._items.pop(handoff_id, None)
            if item is None:
                return None
            h = item[1]
            return h, (self.nixl.manifest(handoff_id) if self.nixl is not None and h.state is not None else None)

    def reap(self) -> None:
        """Drops expired handoffs and frees lent states read since the last call (their
        notifications) or whose reader never came. Called periodically; put and take do it too."""
        with self._lock:
            self._drop_old()

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def _drop_old(self) -> None:
        now = time.monotonic()
        for k in [k for k, (t, _) in self._items.items() if now - t > self._ttl]:
            self._drop(k)
        if self.nixl is not None:
            self.nixl.reap(self._ttl)

    def _drop(self, handoff_id: str) -> None:
        del self._items[handoff_id]
        self.expired += 1
        if self.nixl is not None:
            self.nixl.release(handoff_id)


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
        transport = self.state.cfg.handoff_transport
        auth = {k: v for k, v in headers.items() if k in ("authorization", "x-api-key")}
        start = time.monotonic()
        try:
            async with httpx.AsyncClient(timeout=60) as client:
                r = await client.get(
                    f"{url.rstrip('/')}{HANDOFF_ROUTE}/{handoff_id}", headers={**auth, TRANSPORT_HEADER: transport}
                )
        except httpx.HTTPError as err:
            raise ApiError(502, f"handoff {handoff_id}: prefill server {url} unreachable ({err})") from None
        if r.status_code == 409:  # the pair's handoff-transport settings differ: its message says how
            raise ApiError(502, f"handoff {handoff_id}: prefill server {url}: {_message(r)}")
        if r.status_code != 200:
            raise ApiError(502, f"handoff {handoff_id}: prefill server {url} answered {r.status_code}")
        h, manifest = Handoff.decode(r.content)
        size = len(r.content)
        if manifest is not None:
            if self.state.nixl is None:  # a prefill server that ignored the transport header
                raise ApiError(502, f"handoff {handoff_id}: prefill server {url} lent the state over NIXL")
            try:
                state = await self.state.nixl.read(manifest, handoff_id, NIXL_READ_TIMEOUT_S)
            except TransferError as err:
                raise ApiError(502, f"handoff {handoff_id}: prefill server {url}: {err}") from None
            h, size = h._replace_state(state), size + len(state)
        # "http" also for a state the prefill server could not lend (sent in its answer instead).
        moved_by = "nixl" if manifest is not None else ("http" if h.state is not None else transport)
        self.state.metrics.handoff_received(size, time.monotonic() - start, moved_by)
        return h


#: How long a decode server waits for a NIXL read before answering 502 (the router retries).
NIXL_READ_TIMEOUT_S = 30.0


def _message(r: Any) -> str:
    try:
        return str(r.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return r.text[:200]
