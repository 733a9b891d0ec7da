"""The FastAPI application: OpenAI-compatible routes over the engine thread.

Routes: /v1/chat/completions, /v1/completions, /v1/responses (OpenAI's Responses API),
/v1/messages (Anthropic's Messages API; SSE streaming and not) and its /v1/messages/count_tokens,
/v1/models, /tokenize, /detokenize, /health, /ready, /metrics, /version. Errors are OpenAI-style
bodies (Anthropic's shape on the /v1/messages routes) with the status the conventions give (400
invalid, 401 key, 404 model, 413 body size, 503 queue full, draining or a failed engine, with Retry-After). A client
that disconnects cancels its request, which frees its pages at once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import deepseek_recipe as dr
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from .. import __version__
from ..runtime import StepOutput
from .completions import CompletionProtocol, CompletionStream
from .config import V4_MODEL_TYPE, v4_note
from .disaggregation import HANDOFF_ROUTE, Handoff, HandoffMiddleware, HandoffStore, PrefillTag
from .disaggregation import current as handoff_role
from .engine_loop import EngineLoop, Tracked
from .guard import Guard, error_response
from .handoff_transport import TRANSPORT_HEADER, NixlPeer, resolve_memory
from .messages_api import MessagesApi, anthropic_errors
from .openapi_schema import ServedApi, install_openapi
from .protocol import CHAT_USAGE, ApiError, ChatProtocol, Tokenizers, include_usage, reasoning_logprobs_in_content
from .recipe_stream import ClientGone, RecipeRun, SseFraming
from .recipe_stream import outputs as _outputs
from .recipe_stream import stream_error as _stream_error
from .responses_api import ResponsesApi
from .tool_calls import ToolSettings


class ServerState:
    def __init__(
        self, cfg, engine: EngineLoop, tok: Tokenizers, names: tuple[str, ...], metrics, vocab: int, context_limit: int
    ) -> None:
        self.cfg, self.engine, self.tok, self.names, self.metrics = cfg, engine, tok, names, metrics
        self.chat = ChatProtocol(tok, names, cfg.thinking, vocab)
        if self.chat.format.model_type == V4_MODEL_TYPE:  # serve/config.py resolved its options
            logging.getLogger("dsv41rt.serve").info("%s", v4_note(cfg.runtime))
        self.completions = CompletionProtocol(tok, vocab, self.chat.check_model)
        self.vocab, self.context_limit = vocab, context_limit
        self.draining = False
        self.active = 0
        self.server: Any = None  # the uvicorn.Server, for the drain to stop it
        # Disaggregation: this process's NIXL agent when the state moves with NIXL (prefill: lends
        # states; decode: reads them), and the prefill role's finished prefills.
        mode = getattr(cfg, "disaggregation_mode", "none")  # test doubles of the config: none
        uses_nixl = mode != "none" and getattr(cfg, "handoff_transport", "http") == "nixl"
        memory = getattr(cfg, "handoff_memory", "host")
        self.nixl = NixlPeer(mode, resolve_memory(memory, cfg.runtime.device)) if uses_nixl else None
        self.handoffs = HandoffStore(nixl=self.nixl if mode == "prefill" else None)


def _stream_usage(chunk: str, with_usage: bool, fix_usage: Callable[[dict], None]) -> tuple[str, str | None]:
    """OpenAI's stream usage for a chat chunk as the recipe writes it (usage on the last content
    chunk, always): without `stream_options.include_usage` no chunk has usage; with it every chunk
    has `usage: null` and the usage, corrected by `fix_usage`, comes in one more chunk with no
    choices (as vLLM and OpenAI)."""
    if '"usage"' not in chunk:
        return chunk, None
    d = json.loads(chunk)
    usage = d.pop("usage", None)
    if not with_usage:
        return json.dumps(d), None
    d["usage"] = None
    if usage is not None:
        fix_usage(usage)
    extra = json.dumps({**d, "choices": [], "usage": usage}) if usage is not None else None
    return json.dumps(d), extra


async def _read_json(request: Request, limit: int) -> dict:
    size = 0
    parts = []
    async for part in request.stream():
        size += len(part)
        if size > limit:
            raise ApiError(413, f"request body exceeds {limit} bytes")
        parts.append(part)
    try:
        body = json.loads(b"".join(parts))
    except (ValueError, RecursionError) as err:  # also: integers past Python's digit limit
        raise ApiError(400, f"the body is not valid JSON: {err}") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the body must be a JSON object")
    _check_json(body)
    return body


MAX_JSON_DEPTH = 64


def _check_json(body: dict) -> None:
    """400 for what parses but would fail deeper in (issue 23 D5): nesting past MAX_JSON_DEPTH (the
    conversion recursed until RecursionError at ~128) and strings holding lone surrogates (the
    tokenizer cannot encode them). Iterative: no recursion on hostile input."""
    stack: list[tuple[Any, int]] = [(body, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                raise ApiError(400, "the body holds a string with a lone surrogate (not valid Unicode)") from None
        elif isinstance(v, (dict, list)):
            if depth > MAX_JSON_DEPTH:
                raise ApiError(400, f"the body is nested deeper than {MAX_JSON_DEPTH} levels")
            items = list(v.items()) if isinstance(v, dict) else [(None, x) for x in v]
            for k, x in items:
                if k is not None:
                    stack.append((k, depth))
                stack.append((x, depth + 1))


def create_app(state: ServerState) -> FastAPI:
    # /openapi.json: the hand-written schema of every route (openapi_schema.py); no docs pages.
    app = FastAPI(title="dsv41rt", version=__version__, docs_url=None, redoc_url=None, openapi_url="/openapi.json")
    app.state.s = state
    cfg = state.cfg
    served = ServedApi(state.names, state.vocab, cfg.max_tokens_limit, state.context_limit, bool(cfg.api_key))
    install_openapi(app, served)

    # disaggregation: the handoff role of a request a router sent (inside the guard)
    app.add_middleware(HandoffMiddleware, state=state)
    # key, draining, JSON bodies, sizes; a bug anywhere below it is its logged 500 (guard.py)
    app.add_middleware(Guard, state=state)

    @app.exception_handler(ApiError)
    async def api_error(_: Request, err: ApiError):
        return error_response(err)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, err: StarletteHTTPException):
        """Unknown routes (404) and wrong methods (405) as OpenAI-style error bodies too."""
        what = "no route" if err.status_code == 404 else f"status {err.status_code}"
        message = f"{what}: {request.method} {request.url.path} ({err.detail})"
        response = error_response(ApiError(err.status_code, message))
        response.headers.update(err.headers or {})  # a 405's Allow (RFC 9110 requires it; schema fuzzing)
        return response

    @app.get("/health")
    async def health():
        ok = state.engine.alive and not state.draining
        return Response(status_code=200 if ok else 503)

    @app.get("/ready")
    async def ready():
        ok = state.engine.alive and not state.draining
        return JSONResponse({"ready": ok}, status_code=200 if ok else 503)

    @app.get("/version")
    async def version():
        return {"version": __version__}

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(state.metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models():
        now = int(time.time())
        return {
            "object": "list",
            "data": [
                {
                    "id": n,
                    "object": "model",
                    "created": now,
                    "owned_by": "dsv41rt",
                    "max_model_len": state.context_limit,
                }
                for n in state.names
            ],
        }

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache():
        """Forget every cached prompt prefix (vLLM's admin route; behind the API key when one is set)."""
        await asyncio.to_thread(state.engine.rt.reset_prefix_cache)
        return Response(status_code=200)

    @app.post("/tokenize")
    async def tokenize(request: Request):
        body = await _read_json(request, cfg.max_request_bytes)
        if "messages" in body:
            prep = state.chat.prepare({"model": body.get("model", state.names[0]), **body}, 1 << 62, 1, 1 << 30)
            ids = prep.prompt
        elif isinstance(body.get("prompt"), str):
            ids = state.tok.encode(body["prompt"])
        else:
            raise ApiError(400, "'prompt' (a string) or 'messages' is required", "prompt")
        return {"count": len(ids), "max_model_len": state.context_limit, "tokens": ids}

    @app.post("/detokenize")
    async def detokenize(request: Request):
        body = await _read_json(request, cfg.max_request_bytes)
        v = body.get("tokens")
        if not isinstance(v, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) and 0 <= t < state.vocab for t in v
        ):
            raise ApiError(400, f"'tokens' must be a list of token ids in [0, {state.vocab})", "tokens")
        return {"prompt": state.tok.decode(v)}

    def admit(
        prompt: list[int], max_tokens: int, sampling, stops: list[int], ignore_eos: bool, grammar=None
    ) -> Tracked:
        s = state.engine.stats
        if s.get("waiting", 0) >= cfg.max_num_queued_reqs:
            state.metrics.rejected("queue_full")
            raise ApiError(503, f"too many waiting requests ({s.get('waiting', 0)}); retry later")
        req = Tracked(
            prompt, max_tokens, sampling, stops, ignore_eos, asyncio.Queue(), asyncio.get_running_loop(), grammar
        )
        role = handoff_role.get()
        if isinstance(role, Handoff):  # a decode server continues the prefill server's request
            req.handoff = role
        elif isinstance(role, PrefillTag):  # a prefill server keeps it for the decode server
            handoff_id = role.handoff_id

            def keep(r: Tracked, out: StepOutput) -> None:
                if out.new_tokens:
                    state.handoffs.put(handoff_id, Handoff(r.prompt, out, out.handoff))

            req.on_handoff = keep
        state.engine.submit(req)
        return req

    @app.get(HANDOFF_ROUTE + "/{handoff_id}", include_in_schema=False)  # between servers, not an API
    async def take_handoff(handoff_id: str, request: Request):
        """A decode server takes a finished prefill's state (once): its bytes, or with NIXL the
        manifest it reads them by. Both servers must use the same handoff-transport: a mismatch is
        a 409 naming both (before the handoff is taken), which the decode server passes on."""
        asked = request.headers.get(TRANSPORT_HEADER)
        if asked != cfg.handoff_transport:
            raise ApiError(
                409,
                f"handoff-transport mismatch: this prefill server uses {cfg.handoff_transport!r}, the decode "
                f"server asked for {asked!r} ({TRANSPORT_HEADER}); set the same handoff-transport on both",
            )
        taken = state.handoffs.take(handoff_id)
        if taken is None:
            raise ApiError(404, f"no handoff {handoff_id!r} (never made here, taken already, or expired)")
        h, manifest = taken
        return Response(content=h.encode(manifest), media_type="application/octet-stream")

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await _read_json(request, cfg.max_request_bytes)
        with_usage = include_usage(body)  # checked first: the recipe's message would not name it
        prep = state.chat.prepare(body, state.context_limit, cfg.default_max_tokens, cfg.max_tokens_limit)
        tools = ToolSettings.of(body)  # checked in prepare; parallel_tool_calls: false keeps the first call
        rid = f"chatcmpl-{uuid.uuid4().hex}"
        generator = dr.ChatCompletionRequest.chunk_generator(prep.conversation, rid, body["model"])
        run = RecipeRun(state, admit, prep, generator, CHAT_USAGE)
        if prep.stream:
            usage_chunk: list[str] = []  # the usage chunk, sent last when asked (_stream_usage)

            def frames(chunk) -> list[str]:
                text = chunk.to_json()
                if not tools.parallel or (prep.logprobs and '"reasoning_content":[' in text):
                    d = json.loads(text)
                    if not tools.chunk(d):
                        return []
                    reasoning_logprobs_in_content(d)
                    text = json.dumps(d)
                text, extra = _stream_usage(text, with_usage, run.fix_usage)
                usage_chunk[:] = [f"data: {extra}\n\n"] if extra else usage_chunk
                return [f"data: {text}\n\n"]

            def error_frame(err: ApiError) -> str:
                return f"data: {json.dumps(err.body())}\n\n"

            return run.stream(SseFraming(frames, lambda: usage_chunk, error_frame, "data: [DONE]\n\n"))
        response = dr.ChatCompletionResponse(rid, body["model"], int(time.time()), len(prep.prompt), 0)

        def finish(d: dict) -> None:
            run.fix_usage(d.get("usage"))
            tools.response(d)
            reasoning_logprobs_in_content(d)

        return await run.respond(request, response, finish)

    # OpenAI's Responses and Anthropic's Messages: the same engine path as chat (their own modules).
    responses_api, messages_api = ResponsesApi(state, admit), MessagesApi(state, admit)

    @app.post("/v1/responses")
    async def responses(request: Request):
        return await responses_api.handle(await _read_json(request, cfg.max_request_bytes), request)

    @app.post("/v1/messages")
    async def messages(request: Request):
        with anthropic_errors():
            return await messages_api.handle(await _read_json(request, cfg.max_request_bytes), request)

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(request: Request):
        with anthropic_errors():
            return messages_api.count_tokens(await _read_json(request, cfg.max_request_bytes))

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await _read_json(request, cfg.max_request_bytes)
        prep = state.completions.prepare(body, state.context_limit, cfg.max_tokens_limit)
        req = admit(prep.prompt, prep.max_tokens, prep.sampling, [], prep.ignore_eos)
        out = CompletionStream(prep, state.tok, created=int(time.time()))
        state.active += 1
        if prep.stream:

            async def events() -> AsyncIterator[str]:
                try:
                    async for item in _outputs(req, None):
                        delta, reason = out.advance(item)
                        if delta or reason:
                            yield f"data: {json.dumps(out.chunk(delta, reason))}\n\n"
                        if reason:
                            break
                    if prep.include_usage:
                        yield f"data: {json.dumps(out.usage_chunk())}\n\n"
                except Exception as err:
                    yield f"data: {json.dumps(_stream_error(err).body())}\n\n"
                finally:
                    state.active -= 1
                    state.engine.cancel(req)
                yield "data: [DONE]\n\n"

            return StreamingResponse(events(), media_type="text/event-stream")
        try:
            text, reason = "", None
            async for item in _outputs(req, request):
                delta, reason = out.advance(item)
                text += delta
                if reason:
                    break
            return out.response(text, reason)
        except ClientGone:
            return Response(status_code=499)
        finally:
            state.active -= 1
            state.engine.cancel(req)

    return app
