"""OpenAI's Responses API (`POST /v1/responses`), text and reasoning, for the `openai` client's
`responses.create` (and agents built on it).

deepseek-recipe converts the request (input, instructions, reasoning effort) into the same
conversation a chat request becomes and writes the Responses objects and events (a `reasoning`
item with the reasoning text, then a `message` item with `output_text`; usage; `incomplete` at
max_output_tokens); the engine path is the chat route's (recipe_stream.py). This module checks what
the recipe would accept silently or reject without naming the field. The server keeps no state:
`store: true`, `previous_response_id` and `conversation` are a 400. Tools are not supported yet.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable
from typing import Any

import deepseek_recipe as dr
from fastapi import Request
from fastapi.responses import Response

from .protocol import (
    ApiError,
    OutputBudget,
    PreparedChat,
    RequestedSampling,
    UsageKeys,
    _num,
    check_known_fields,
    check_type,
    recipe_request,
)
from .recipe_stream import Admit, RecipeRun, SseFraming, named_event_frames

RESPONSES_FIELDS = frozenset(
    "model input instructions max_output_tokens temperature top_p stream reasoning metadata store user".split()
)
_NO_TOOLS = "tool calls are not supported yet on this server"
_STATELESS = "this server keeps no responses (stateless): send the whole conversation in 'input'"
_REASONS = {
    "tools": f"'tools': {_NO_TOOLS}",
    "tool_choice": f"'tool_choice': {_NO_TOOLS}",
    "parallel_tool_calls": f"'parallel_tool_calls': {_NO_TOOLS}",
    "previous_response_id": f"'previous_response_id': {_STATELESS}",
    "conversation": f"'conversation': {_STATELESS}",
    "background": "'background': this server answers in the request (nothing is stored to poll)",
}
# The recipe's reasoning efforts (it maps minimal/low to low, medium/high to high; none: no thinking).
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "ultra", "max")
INPUT_ROLES = ("user", "assistant", "system", "developer")
RESPONSES_USAGE = UsageKeys("output_tokens", "total_tokens", "output_tokens_details")


def _check_input_item(item: Any, where: str) -> None:
    if not isinstance(item, dict):
        raise ApiError(400, f"'{where}' must be a message object", "input")
    kind = item.get("type", "message")
    if kind in ("function_call", "function_call_output", "custom_tool_call", "custom_tool_call_output"):
        raise ApiError(400, f"'{where}': {kind} items: {_NO_TOOLS}", "input")
    if kind != "message":
        raise ApiError(400, f"'{where}': {kind!r} items are not supported (only messages)", "input")
    extra = set(item) - {"type", "role", "content", "id", "status"}
    if extra:
        raise ApiError(400, f"'{where}.{sorted(extra)[0]}' is not supported by this server", "input")
    role = item.get("role")
    if role not in INPUT_ROLES:
        raise ApiError(400, f"'{where}.role' must be one of {', '.join(INPUT_ROLES)}", "input")
    content = item.get("content")
    if isinstance(content, str):
        return
    if not isinstance(content, list):
        raise ApiError(400, f"'{where}.content' must be a string or a list of text parts", "input")
    # An assistant turn from an earlier response holds output_text parts.
    kinds = ("input_text", "output_text") if role == "assistant" else ("input_text",)
    for j, part in enumerate(content):
        part_type = part.get("type") if isinstance(part, dict) else None
        if part_type not in kinds or not isinstance(part.get("text"), str):
            raise ApiError(
                400, f"'{where}.content[{j}]' must be a text part ({' or '.join(kinds)} with a 'text')", "input"
            )


def check_responses_request(body: dict, max_limit: int) -> None:
    """The 400s the recipe's conversion would not give, or not name: fields, types, state, tools."""
    check_known_fields(body, RESPONSES_FIELDS, _REASONS)
    if body.get("store") not in (None, False):
        raise ApiError(400, f"'store' must be false: {_STATELESS}", "store")
    _num(body, "max_output_tokens", None, 1, max_limit, integer=True)
    check_type(body, "stream", bool, "a boolean")
    check_type(body, "instructions", str, "a string")
    check_type(body, "user", str, "a string")
    metadata = body.get("metadata")
    if metadata is not None and not (isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())):
        raise ApiError(400, "'metadata' must be an object of string values", "metadata")
    reasoning = body.get("reasoning")
    if reasoning is not None:
        if not isinstance(reasoning, dict):
            raise ApiError(400, "'reasoning' must be an object", "reasoning")
        for key in reasoning:
            if key != "effort" and reasoning[key] is not None:
                # No summaries: the reasoning item carries the reasoning text itself.
                raise ApiError(400, f"'reasoning.{key}' is not supported by this server", "reasoning")
        if reasoning.get("effort") not in (None, *EFFORTS):
            raise ApiError(400, f"'reasoning.effort' must be one of {', '.join(EFFORTS)}", "reasoning")
    given = body.get("input")
    if isinstance(given, list):
        if not given:
            raise ApiError(400, "'input' must not be empty", "input")
        for i, item in enumerate(given):
            _check_input_item(item, f"input[{i}]")
    elif not isinstance(given, str):
        raise ApiError(400, "'input' is required: a string or a list of message items", "input")


class ResponsesApi:
    """The /v1/responses route over the server's state (ServerState) and admission."""

    def __init__(self, state: Any, admit: Admit) -> None:
        self.state, self.admit = state, admit

    def prepare(self, body: dict) -> tuple[PreparedChat, dr.ResponsesEcho]:
        state, cfg = self.state, self.state.cfg
        state.chat.check_model(body)
        check_responses_request(body, cfg.max_tokens_limit)
        asked_sampling = RequestedSampling.of(body, max_temperature=2.0)
        request = recipe_request(dr.ResponsesRequest, body)
        echo = request.echo()  # the settings the response objects report, read before conversion
        conv, prompt = state.chat.encode(request)
        budget = OutputBudget(
            body.get("max_output_tokens"), "max_output_tokens", state.context_limit, cfg.default_max_tokens
        )
        return state.chat.prepared(body, conv, prompt, asked_sampling, budget, "input"), echo

    async def handle(self, body: dict, request: Request) -> Response:
        prep, echo = self.prepare(body)
        model, rid = body["model"], f"resp_{uuid.uuid4().hex}"
        generator = dr.ResponsesRequest.chunk_generator(prep.conversation, rid, model).with_echo(echo)
        run = RecipeRun(self.state, self.admit, prep, generator, RESPONSES_USAGE)
        metadata = body.get("metadata") or {}

        def complete(response: Any) -> None:
            # The recipe does not echo metadata; the final usage counts every generated token.
            if isinstance(response, dict):
                response["metadata"] = metadata
                if response.get("status") in ("completed", "incomplete", "failed"):
                    run.fix_usage(response.get("usage"))

        if prep.stream:
            sent = [0]  # events sent: the next sequence_number (the recipe numbers them from 0)

            named = named_event_frames(
                dr.ResponsesResponse, lambda event: complete(event.get("response")), ("response",)
            )

            def frames(event: Any) -> Iterable[str]:
                sent[0] += 1
                return named(event)

            def error_frame(err: ApiError) -> str:
                event = {"type": "error", "code": err.code or err.type, "message": err.message, "param": err.param}
                return f"event: error\ndata: {json.dumps({**event, 'sequence_number': sent[0]})}\n\n"

            return run.stream(SseFraming(frames, tuple, error_frame))
        response = dr.ResponsesResponse(rid, model, int(time.time()), len(prep.prompt), 0)
        return await run.respond(request, response, complete)
