"""An engine request whose tokens go through deepseek-recipe's StreamProcessor: what the chat,
Responses and Messages routes share. The recipe writes each protocol's events (chunks, the
reasoning / content split, stop strings, usage); a route differs only in how it frames an event as
SSE, how it shapes an error and which response object accumulates the events."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import deepseek_recipe as dr
from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from ..sampling import Grammar, SamplingParams
from .engine_loop import Tracked
from .protocol import FINISH, ApiError, PreparedChat, UsageKeys, count_held_tail, tokens_chunk


class ClientGone(Exception):
    pass


DISCONNECT_CHECK_S = 0.25  # how often a non-streaming request looks for its client
_NOTHING = object()  # no output within DISCONNECT_CHECK_S


@dataclass(frozen=True)
class _Tokens:
    """The part of an engine output a `tokens` chunk carries (protocol.tokens_chunk)."""

    new_tokens: list[int]
    logprobs: list[float]
    top_logprobs: list[dict[int, float]]


async def outputs(req: Tracked, request: Request | None) -> AsyncIterator[Any]:
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


def stream_error(err: Exception) -> ApiError:
    """A mid-stream failure as an error event: an ApiError as it is (e.g. the 503 of a request the
    shutdown aborted), anything else a 500."""
    return err if isinstance(err, ApiError) else ApiError(500, str(err))


@dataclass(frozen=True)
class SseFraming:
    """How a protocol writes its stream: `frames` turns one recipe event into SSE text, `closing`
    is what follows the last event of a stream that ended well, `error_frame` the event of a
    mid-stream failure, and `done` what ends every stream (chat's `[DONE]`; None: nothing)."""

    frames: Callable[[Any], Iterable[str]]
    closing: Callable[[], Iterable[str]]
    error_frame: Callable[[ApiError], str]
    done: str | None = None


# The app's admission: (prompt, max_tokens, sampling, stop token ids, ignore_eos) -> the submitted
# request, or a 503 when the queue is full.
Admit = Callable[[list[int], int, SamplingParams, list[int], bool, Grammar | None], Tracked]
ChunkGenerator = dr.ChatCompletionChunkGenerator | dr.ResponsesChunkGenerator | dr.MessagesChunkGenerator


class RecipeRun:
    """One engine request, admitted on construction, and the recipe processor its tokens go through
    (`generator` writes the protocol's events). Counts as active from construction until its stream
    or response ends, then is cancelled (a no-op when the engine finished it; otherwise the client
    left, or a stop string ended it early, and its pages are freed at once)."""

    def __init__(self, state: Any, admit: Admit, prep: PreparedChat, generator: ChunkGenerator, usage: UsageKeys):
        self.state, self.prep, self.usage_keys = state, prep, usage
        self.proc = dr.StreamProcessor(generator, prep.conversation.parsing_options, state.tok.recipe)
        self.req = admit(
            prep.prompt, prep.max_tokens, prep.sampling, prep.stop_token_ids, prep.ignore_eos, prep.grammar
        )
        self.started = False  # the `ready` chunk (the prompt's usage) was pushed
        self.generated = 0  # tokens pushed to the processor (it may not count a held-back tail)
        # The tokens that end a request with "stop": not output (vLLM's default), else the recipe
        # would decode the end-of-sequence token into the content.
        self.stops = set(prep.stop_token_ids) | (set() if prep.ignore_eos else {state.chat.eos_id})
        stage = prep.conversation.parsing_options.thinking_initial_stage
        self.in_reasoning = stage is not None and stage.starts_in_reasoning()
        self.reasoning_tokens = 0  # generated before `</think>` (which counts as content)
        state.active += 1

    def fix_usage(self, usage: Any) -> None:
        """A final usage object, corrected: the tokens the processor held back are counted
        (count_held_tail), and `reasoning_tokens` is the count of generated tokens before `</think>`:
        the recipe re-encodes the reasoning text to count them, which gave e.g. 7 reasoning tokens
        of 5 generated for text that tokenizes differently on its own."""
        if not isinstance(usage, dict):
            return
        count_held_tail(usage, self.generated, self.prep, self.usage_keys)
        details = usage.get(self.usage_keys.details) if self.usage_keys.details else None
        if isinstance(details, dict) and "reasoning_tokens" in details:
            details["reasoning_tokens"] = self.reasoning_tokens

    def _count_reasoning(self, tokens: list[int]) -> None:
        for token in tokens:
            if token == self.state.chat.thinking_end_id:
                self.in_reasoning = False
                return
            self.reasoning_tokens += 1

    def _ready(self, cached: int) -> list:
        # The usage of the prompt, sent once its cached part is known: with the first output.
        if self.started:
            return []
        self.started = True
        usage = dr.PromptUsage(prompt_tokens=len(self.prep.prompt), prompt_cache_hit_tokens=max(cached, 0))
        return self.proc.push(dr.InferenceChunk.ready(prompt_usage=usage))

    def _events_of(self, item: Any) -> list:
        self.generated += len(item.new_tokens)
        if self.in_reasoning:
            self._count_reasoning(item.new_tokens)
        out = self._ready(item.cached_tokens)
        shown: Any = item
        if item.finish_reason == "stop" and item.new_tokens and item.new_tokens[-1] in self.stops:
            n = len(item.new_tokens) - 1  # counted in the usage, not output
            shown = _Tokens(item.new_tokens[:n], item.logprobs[:n], (item.top_logprobs or [])[:n])
        out += self.proc.push(tokens_chunk(shown, self.prep.logprobs)) if shown.new_tokens else []
        if item.finished and item.finish_reason in FINISH and not self.proc.finished:
            out += self.proc.push(dr.InferenceChunk.finish(FINISH[item.finish_reason]))
            out += self.proc.finish()
        return out

    async def events(self, request: Request | None) -> AsyncIterator[Any]:
        """The recipe's events for the engine's outputs, up to the processor's end."""
        async for item in outputs(self.req, request):
            for event in self._events_of(item):
                yield event
            if self.proc.finished:
                return

    def _release(self) -> None:
        self.state.active -= 1
        self.state.engine.cancel(self.req)

    def stream(self, framing: SseFraming) -> StreamingResponse:
        async def body() -> AsyncIterator[str]:
            try:
                async for event in self.events(None):
                    for frame in framing.frames(event):
                        yield frame
                for frame in framing.closing():
                    yield frame
            except Exception as err:  # mid-stream failure: the protocol's error event
                yield framing.error_frame(stream_error(err))
            finally:
                self._release()
            if framing.done is not None:
                yield framing.done

        return StreamingResponse(body(), media_type="text/event-stream")

    async def respond(self, request: Request, response: Any, finish: Callable[[dict], None]) -> Response:
        """The non-streamed answer: every event accumulated into the recipe's `response` object;
        `finish` completes its JSON (usage, fields the recipe does not echo). 499 when the client
        left."""
        try:
            async for event in self.events(request):
                response.accumulate(event)
            for event in self._ready(0):  # ended before any output
                response.accumulate(event)
            d = json.loads(response.to_json())
            finish(d)
            return Response(json.dumps(d), media_type="application/json")
        except ClientGone:
            return Response(status_code=499)
        finally:
            self._release()


def named_event_frames(
    response_type: Any,
    rewrite: Callable[[dict], None],
    keys_to_rewrite: tuple[str, ...],
    keep: Callable[[dict], bool] | None = None,
) -> Callable[[Any], Iterable[str]]:
    """SSE with an `event:` line naming each event (Responses and Messages). An event whose JSON
    holds one of `keys_to_rewrite` is parsed and passed to `rewrite` (usage, echoed fields); the
    others go out as the recipe wrote them. With `keep` every event is parsed and passed to it
    first: False drops the event (no frame), True sends it as `keep` left it (single_call.py)."""

    def frames(event: Any) -> Iterable[str]:
        text = event.to_json()
        if keep is not None or any(f'"{key}"' in text for key in keys_to_rewrite):
            d = json.loads(text)
            if keep is not None and not keep(d):
                return ()
            rewrite(d)
            text = json.dumps(d)
        return (f"event: {response_type.sse_event_name(event)}\ndata: {text}\n\n",)

    return frames
