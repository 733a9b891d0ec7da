"""The FastAPI application: OpenAI-compatible routes over the engine thread.

Routes: /v1/chat/completions, /v1/completions (SSE streaming and not), /v1/models, /tokenize,
/detokenize, /health, /ready, /metrics, /version. Errors are OpenAI-style bodies with the status the
conventions give (400 invalid, 401 key, 404 model, 413 body size, 503 queue full or draining with
Retry-After). A client that disconnects cancels its request, which frees its pages at once.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from .. import __version__
from .completions import CompletionProtocol, CompletionStream
from .engine_loop import EngineLoop, Tracked
from .guard import Guard, error_response
from .protocol import FINISH, ApiError, ChatProtocol, Tokenizers, count_held_tail, include_usage, tokens_chunk


class ClientGone(Exception):
    pass


DISCONNECT_CHECK_S = 0.25  # how often a non-streaming request looks for its client
_NOTHING = object()  # no output within DISCONNECT_CHECK_S


class ServerState:
    def __init__(
        self, cfg, engine: EngineLoop, tok: Tokenizers, names: tuple[str, ...], metrics, vocab: int, context_limit: int
    ) -> None:
        self.cfg, self.engine, self.tok, self.names, self.metrics = cfg, engine, tok, names, metrics
        self.chat = ChatProtocol(tok, names, cfg.thinking, vocab)
        self.completions = CompletionProtocol(tok, vocab, self.chat.check_model)
        self.vocab, self.context_limit = vocab, context_limit
        self.draining = False
        self.active = 0
        self.server: Any = None  # the uvicorn.Server, for the drain to stop it


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


def _stream_error(err: Exception) -> ApiError:
    """A mid-stream failure as an error event: an ApiError as it is (e.g. the 503 of a request the
    shutdown aborted), anything else a 500."""
    return err if isinstance(err, ApiError) else ApiError(500, str(err))


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


async def _outputs(req: Tracked, request: Request | None) -> AsyncIterator[Any]:
    """A request's engine outputs; raises ClientGone when a non-streaming client disconnects. The
    client is checked every DISCONNECT_CHECK_S, also while outputs keep coming (a request that
    streams tokens into its queue never left the wait below; issue 23 D1)."""
    checked = time.monotonic()
    while True:
        try:
            item = await asyncio.wait_for(req.out.get(), timeout=DISCONNECT_CHECK_S)
        except asyncio.TimeoutError:
            item = _NOTHING
        if request is not None and time.monotonic() - checked >= DISCONNECT_CHECK_S:
            checked = time.monotonic()
            if await request.is_disconnected():
                raise ClientGone() from None
        if item is _NOTHING:
            continue
        if item is None:
            return
        if isinstance(item, Exception):
            raise item
        yield item


def create_app(state: ServerState) -> FastAPI:
    app = FastAPI(title="dsv41rt", version=__version__, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.s = state
    cfg = state.cfg

    # key, draining, JSON bodies, sizes; a bug anywhere below it is its logged 500 (guard.py)
    app.add_middleware(Guard, state=state)

    @app.exception_handler(ApiError)
    async def api_error(_: Request, err: ApiError):
        return error_response(err)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, err: StarletteHTTPException):
        """Unknown routes (404) and wrong methods (405) as OpenAI-style error bodies too."""
        what = "no route" if err.status_code == 404 else f"status {err.status_code}"
        return error_response(ApiError(err.status_code, f"{what}: {request.method} {request.url.path} ({err.detail})"))

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

    def admit(prompt: list[int], max_tokens: int, sampling, stops: list[int], ignore_eos: bool) -> Tracked:
        s = state.engine.stats
        if s.get("waiting", 0) >= cfg.max_num_queued_reqs:
            state.metrics.rejected("queue_full")
            raise ApiError(503, f"too many waiting requests ({s.get('waiting', 0)}); retry later")
        req = Tracked(prompt, max_tokens, sampling, stops, ignore_eos, asyncio.Queue(), asyncio.get_running_loop())
        state.engine.submit(req)
        return req

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await _read_json(request, cfg.max_request_bytes)
        with_usage = include_usage(body)  # checked first: the recipe's message would not name it
        prep = state.chat.prepare(body, state.context_limit, cfg.default_max_tokens, cfg.max_tokens_limit)
        model = body["model"]
        rid = f"chatcmpl-{uuid.uuid4().hex}"
        req = admit(prep.prompt, prep.max_tokens, prep.sampling, prep.stop_token_ids, prep.ignore_eos)
        proc = state.chat.processor(prep, rid, model)
        import deepseek_recipe as dr

        started = False
        generated = 0  # tokens pushed to the processor (it may not count a held-back tail)

        def fix_usage(usage: dict) -> None:
            count_held_tail(usage, generated, prep)

        def ready(cached: int) -> list:
            # The usage of the prompt, sent once its cached part is known: with the first output.
            nonlocal started
            if started:
                return []
            started = True
            usage = dr.PromptUsage(prompt_tokens=len(prep.prompt), prompt_cache_hit_tokens=max(cached, 0))
            return proc.push(dr.InferenceChunk.ready(prompt_usage=usage))

        def chunks_of(item) -> tuple[list, bool]:
            nonlocal generated
            generated += len(item.new_tokens)
            out = ready(item.cached_tokens)
            out += proc.push(tokens_chunk(item, prep.logprobs)) if item.new_tokens else []
            if item.finished and item.finish_reason in FINISH and not proc.finished:
                out += proc.push(dr.InferenceChunk.finish(FINISH[item.finish_reason]))
                out += proc.finish()
            return out, proc.finished

        state.active += 1
        if prep.stream:

            async def events() -> AsyncIterator[str]:
                usage_chunk = None
                try:
                    async for item in _outputs(req, None):
                        out, done = chunks_of(item)
                        for c in out:
                            text, extra = _stream_usage(c.to_json(), with_usage, fix_usage)
                            usage_chunk = extra or usage_chunk
                            yield f"data: {text}\n\n"
                        if done:
                            break
                    if usage_chunk is not None:
                        yield f"data: {usage_chunk}\n\n"
                except Exception as err:  # mid-stream failure: an error event, then [DONE]
                    yield f"data: {json.dumps(_stream_error(err).body())}\n\n"
                finally:
                    state.active -= 1
                    # Client gone, or a stop string ended it early: free the pages now (a no-op
                    # when the engine already finished it).
                    state.engine.cancel(req)
                yield "data: [DONE]\n\n"

            return StreamingResponse(events(), media_type="text/event-stream")
        try:
            response = dr.ChatCompletionResponse(rid, model, int(time.time()), len(prep.prompt), 0)
            async for item in _outputs(req, request):
                out, done = chunks_of(item)
                for c in out:
                    response.accumulate(c)  # type: ignore[arg-type]  # chat chunks only, for a chat request
                if done:
                    break
            for c in ready(0):  # ended before any output
                response.accumulate(c)  # type: ignore[arg-type]
            d = json.loads(response.to_json())
            if isinstance(d.get("usage"), dict):
                fix_usage(d["usage"])
            return Response(json.dumps(d), media_type="application/json")
        except ClientGone:
            return Response(status_code=499)
        finally:
            state.active -= 1
            state.engine.cancel(req)  # no-op when it already finished

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
