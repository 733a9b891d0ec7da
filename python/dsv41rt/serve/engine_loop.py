"""The engine thread behind the server: one thread owns the Runtime (which is not thread-safe) and
runs engine steps while there is work; the asyncio side submits and cancels through a command queue
and receives each request's outputs on its own asyncio.Queue.

Per request it records the times the metrics need (arrival, first token, each token, finish).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..runtime import Runtime, StepOutput
from ..sampling import SamplingParams

log = logging.getLogger("dsv41rt.serve")


@dataclass
class Tracked:
    """A request the engine thread knows about, with what its stream consumer needs."""

    prompt: list[int]
    max_tokens: int
    sampling: SamplingParams
    stop_token_ids: list[int]
    ignore_eos: bool
    out: asyncio.Queue
    loop: asyncio.AbstractEventLoop
    arrival: float = field(default_factory=time.monotonic)
    first_token: float | None = None
    last_token: float | None = None
    token_gaps: list[float] = field(default_factory=list)
    generated: int = 0
    engine_id: int = -1


class EngineLoop:
    """Runs `runtime` on a background thread; thread-safe submit/cancel from the event loop."""

    def __init__(self, runtime: Runtime, on_finish: Callable[[Tracked, str], None] | None = None) -> None:
        self.rt = runtime
        self._commands: queue.Queue = queue.Queue()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._live: dict[int, Tracked] = {}  # engine id -> request (engine thread only)
        self._on_finish = on_finish
        self.stats: dict[str, int] = dict(runtime.stats())
        self.alive = True
        self.error: str | None = None
        self._thread = threading.Thread(target=self._run, name="dsv41rt-engine", daemon=True)
        self._thread.start()

    # ---- event-loop side ---------------------------------------------------------------------
    def submit(self, req: Tracked) -> None:
        self._commands.put(("submit", req))
        self._wake.set()

    def cancel(self, req: Tracked) -> None:
        self._commands.put(("cancel", req))
        self._wake.set()

    def cancel_all(self, error: Exception | None = None) -> None:
        """Abort every request (after the engine's current step); each stream gets `error`, when
        given, before its end, so a client can tell an aborted request from a finished one."""
        self._commands.put(("cancel_all", error))
        self._wake.set()

    def in_flight(self) -> int:
        return self.stats.get("running", 0) + self.stats.get("waiting", 0) + self._commands.qsize()

    def shutdown(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=30)

    # ---- engine thread -----------------------------------------------------------------------
    def _deliver(self, req: Tracked, item: Any) -> None:
        req.loop.call_soon_threadsafe(req.out.put_nowait, item)

    def _finish(self, req: Tracked, reason: str) -> None:
        self._live.pop(req.engine_id, None)
        if self._on_finish:
            self._on_finish(req, reason)

    def _apply(self, cmd: str, req: Any) -> None:
        if cmd == "submit":
            assert req is not None
            try:
                req.engine_id = self.rt.add_request(
                    req.prompt, req.max_tokens, req.sampling, req.stop_token_ids, req.ignore_eos
                )
            except Exception as err:  # a request the engine refuses: report it, keep serving
                self._deliver(req, err)
                return
            self._live[req.engine_id] = req
        elif cmd == "cancel":
            assert req is not None
            if self._live.get(req.engine_id) is req:
                self.rt.abort(req.engine_id)  # frees its pages at once
                self._finish(req, "abort")
                self._deliver(req, None)
        elif cmd == "cancel_all":  # here `req` is the error to deliver, or None
            for r in list(self._live.values()):
                self.rt.abort(r.engine_id)
                self._finish(r, "abort")
                if req is not None:
                    self._deliver(r, req)
                self._deliver(r, None)

    def _dispatch(self, out: StepOutput) -> None:
        req = self._live.get(out.request_id)
        if req is None:
            return
        now = time.monotonic()
        if out.new_tokens:
            if req.first_token is None:
                req.first_token = now
            elif req.last_token is not None:
                req.token_gaps.append(now - req.last_token)
            req.last_token = now
            req.generated += len(out.new_tokens)
        self._deliver(req, out)
        if out.finished:
            self._finish(req, out.finish_reason or "stop")
            self._deliver(req, None)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                while True:
                    try:
                        cmd, req = self._commands.get_nowait()
                    except queue.Empty:
                        break
                    self._apply(cmd, req)
                if not self.rt.has_unfinished():
                    self.stats = dict(self.rt.stats())
                    self._wake.wait(timeout=0.05)
                    self._wake.clear()
                    continue
                for out in self.rt.step():
                    self._dispatch(out)
                self.stats = dict(self.rt.stats())
        except Exception as err:  # the engine is dead: fail every stream, report unhealthy
            log.exception("engine thread failed")
            self.error = str(err)
            self.alive = False
            for r in list(self._live.values()):
                self._deliver(r, RuntimeError(f"engine failure: {err}"))
                self._deliver(r, None)
            self._live.clear()
