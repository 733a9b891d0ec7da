"""The server's side of the engine: the C++ runtime's engine thread runs the steps (woken by each
submit, never polling); this module submits and cancels from the event loop and runs one consumer
thread that waits for outputs with the GIL released (`Runtime.await_outputs`) and hands each to its
request's asyncio.Queue.

Per request it records the times the metrics need (arrival, first forward, first token, each
token, finish).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import Dsv41rtError
from ..runtime import Runtime, StepOutput
from ..sampling import Grammar, SamplingParams
from .disaggregation import Handoff, first_output

log = logging.getLogger("dsv41rt.serve")


@dataclass
class Tracked:
    """A request the engine knows about, with what its stream consumer needs."""

    prompt: list[int]
    max_tokens: int
    sampling: SamplingParams
    stop_token_ids: list[int]
    ignore_eos: bool
    out: asyncio.Queue
    loop: asyncio.AbstractEventLoop
    grammar: Grammar | None = None
    arrival: float = field(default_factory=time.monotonic)
    first_forward: float | None = None  # when the first engine step that runs it began
    first_token: float | None = None
    last_token: float | None = None
    token_gaps: list[float] = field(default_factory=list)
    generated: int = 0
    engine_id: int = -1
    end_error: Exception | None = None  # delivered before the end when it is aborted
    # Disaggregation (serve/disaggregation.py): a decode server's request continues `handoff`; a
    # prefill server's request ends after its first token and hands its last output to `on_handoff`.
    handoff: Handoff | None = None
    on_handoff: Callable[[Tracked, StepOutput], None] | None = None


class EngineLoop:
    """Streams the outputs of `runtime` (created with engine_thread=True) to the requests' queues."""

    def __init__(self, runtime: Runtime, on_finish: Callable[[Tracked, str], None] | None = None) -> None:
        if not runtime._engine_thread:
            raise ValueError("EngineLoop needs a Runtime created with engine_thread=True")
        self.rt = runtime
        self._lock = threading.Lock()  # _live: the event loop adds, the consumer removes
        self._live: dict[int, Tracked] = {}
        self._on_finish = on_finish
        self._stop = threading.Event()
        self.alive = True
        self.error: str | None = None
        self._thread = threading.Thread(target=self._consume, name="dsv41rt-outputs", daemon=True)
        self._thread.start()

    # ---- event-loop side ---------------------------------------------------------------------
    @property
    def stats(self) -> dict[str, int]:
        try:
            return self.rt.stats()
        except (AttributeError, ValueError):  # closed
            return {}

    def submit(self, req: Tracked) -> None:
        if req.handoff is not None:
            self._continue(req, req.handoff)
            return
        with self._lock:  # registered before the consumer can see its first output
            try:
                req.engine_id = self.rt.add_request(
                    req.prompt,
                    req.max_tokens,
                    req.sampling,
                    req.stop_token_ids,
                    req.ignore_eos,
                    req.grammar,
                    handoff=req.on_handoff is not None,
                )
            except Exception as err:  # a request the engine refuses: report it, keep serving
                self._deliver(req, err)
                self._deliver(req, None)
                return
            self._live[req.engine_id] = req

    def _continue(self, req: Tracked, h: Handoff) -> None:
        """A decode server's request: the prefill server's first output, then the engine's."""
        with self._lock:  # the first output is queued before the consumer can see the second
            try:
                if h.prompt != req.prompt:
                    raise Dsv41rtError(
                        f"handoff: the prefill server ran a prompt of {len(h.prompt)} tokens, this server "
                        f"prepared {len(req.prompt)} tokens (different tokenizer or chat template?)"
                    )
                if not h.first.finished:
                    if h.state is None:
                        raise Dsv41rtError("handoff: the prefill server sent no state for an unfinished request")
                    req.engine_id = self.rt.add_handoff_request(
                        req.prompt,
                        h.first.new_tokens[0],
                        h.state,
                        req.max_tokens,
                        req.sampling,
                        req.stop_token_ids,
                        req.ignore_eos,
                        req.grammar,
                    )
                    self._live[req.engine_id] = req
            except Exception as err:
                self._deliver(req, err)
                self._deliver(req, None)
                return
            now = time.monotonic()
            req.first_forward = req.first_token = req.last_token = now
            req.generated = len(h.first.new_tokens)
            self._deliver(req, first_output(h, req.engine_id))
        if h.first.finished:  # it ended at its first token on the prefill server
            if self._on_finish:
                self._on_finish(req, h.first.finish_reason or "stop")
            self._deliver(req, None)

    def cancel(self, req: Tracked, error: Exception | None = None) -> None:
        """Abort `req` (no-op once it finished); its stream gets `error`, when given, then its end."""
        with self._lock:
            if self._live.get(req.engine_id) is not req:
                return
            req.end_error = error
        try:
            self.rt.abort(req.engine_id, wait=False)  # the end arrives through the consumer
        except Exception:  # it finished meanwhile: the consumer delivers that end
            pass

    def cancel_all(self, error: Exception | None = None) -> None:
        """Abort every request; each stream gets `error`, when given, before its end, so a client can
        tell an aborted request from a finished one."""
        with self._lock:
            live = list(self._live.values())
        for r in live:
            self.cancel(r, error)

    def in_flight(self) -> int:
        s = self.stats
        with self._lock:
            return max(len(self._live), s.get("running", 0) + s.get("waiting", 0))

    def shutdown(self) -> None:
        self._stop.set()
        self.rt.close()  # ends every request and wakes the consumer
        self._thread.join(timeout=30)

    # ---- consumer thread ---------------------------------------------------------------------
    def _deliver(self, req: Tracked, item: Any) -> None:
        req.loop.call_soon_threadsafe(req.out.put_nowait, item)

    def _dispatch(self, out: StepOutput) -> None:
        with self._lock:
            req = self._live.get(out.request_id)
            if req is None:
                return
            if out.finished:
                del self._live[out.request_id]
        now = time.monotonic()
        if req.first_forward is None and out.first_scheduled:
            req.first_forward = out.first_scheduled
        if out.new_tokens:
            if req.first_token is None:
                req.first_token = now
            elif req.last_token is not None:
                req.token_gaps.append(now - req.last_token)
            req.last_token = now
            req.generated += len(out.new_tokens)
        if out.finish_reason == "error":
            self._fail(out.error)
            self._deliver(req, RuntimeError(f"engine failure: {out.error}"))
        elif out.finish_reason == "abort" and req.end_error is not None:
            self._deliver(req, req.end_error)
        elif out.new_tokens or (out.finished and out.finish_reason != "abort"):
            self._deliver(req, out)
        if out.finished:
            if req.on_handoff is not None and out.finish_reason != "error":
                req.on_handoff(req, out)  # before the route sees the end: the router asks next
            if self._on_finish:
                self._on_finish(req, out.finish_reason or "stop")
            self._deliver(req, None)

    def _fail(self, error: str) -> None:
        if self.alive:
            log.error("engine failed: %s", error)
            self.error = error
            self.alive = False

    def _consume(self) -> None:
        while not self._stop.is_set():
            try:
                outs = self.rt.await_outputs(0.5)
            except Exception as err:  # the runtime is gone (shutdown) or broken
                if not self._stop.is_set():
                    self._fail(str(err))
                break
            for out in outs:
                self._dispatch(out)
        with self._lock:  # whatever is left ends now
            left, self._live = list(self._live.values()), {}
        for r in left:
            self._deliver(r, RuntimeError("the engine stopped"))
            self._deliver(r, None)
