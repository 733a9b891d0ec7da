"""OpenAI's Responses API (`POST /v1/responses`), text and reasoning, for the `openai` client's
`responses.create` (and agents built on it).

deepseek-recipe converts the request (input, instructions, reasoning effort) into the same
conversation a chat request becomes and writes the Responses objects and events (a `reasoning`
item with the reasoning text, then a `message` item with `output_text`; usage; `incomplete` at
max_output_tokens); the engine path is the chat route's (recipe_stream.py). This module checks what
the recipe would accept silently or reject without naming the field. The server keeps no state:
`store: true`, `previous_response_id` and `conversation` are a 400. Function tools: the recipe
renders `tools` and `function_call` / `function_call_output` items and writes a parsed call as a
`function_call` output item (streamed: `response.function_call_arguments.delta` / `.done`); the
checks of the tool fields are tool_calls.py's, shared with chat; `tool_choice` required / named is a
400 until grammar-constrained decoding exists. `parallel_tool_calls: false` returns at most the
first call (single_call.py).
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

from .grammar import split_forced_choice
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
from .single_call import RESPONSES_ITEMS, FirstCallOnly
from .tool_calls import check_forced_choice, check_function, check_tool_list

RESPONSES_FIELDS = frozenset(
    "model input instructions max_output_tokens temperature top_p stream reasoning metadata store user tools"
    " tool_choice parallel_tool_calls".split()
)
_STATELESS = "this server keeps no responses (stateless): send the whole conversation in 'input'"
_REASONS = {
    "previous_response_id": f"'previous_response_id': {_STATELESS}",
    "conversation": f"'conversation': {_STATELESS}",
    "background": "'background': this server answers in the request (nothing is stored to poll)",
}
# The recipe's reasoning efforts (it maps minimal/low to low, medium/high to high; none: no thinking).
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "ultra", "max")
INPUT_ROLES = ("user", "assistant", "system", "developer")
RESPONSES_USAGE = UsageKeys("output_tokens", "total_tokens", "output_tokens_details")
TOOL_KEYS = frozenset("type name description parameters strict".split())
ITEM_KEYS = {
    "message": frozenset("type role content id status phase".split()),
    "reasoning": frozenset("type id status content summary encrypted_content".split()),
    "function_call": frozenset("type call_id name arguments id status".split()),
    "function_call_output": frozenset("type call_id output id status".split()),
}


def _check_tool(where: str, tool: Any) -> str:
    """A function tool in the Responses shape (flat: type, name, description, parameters, strict)."""
    if not isinstance(tool, dict):
        raise ApiError(400, f"'{where}' must be a function tool object", where)
    if tool.get("type") != "function":
        raise ApiError(
            400, f"'{where}.type' must be \"function\" (no built-in tools here), got {tool.get('type')!r}", where
        )
    extra = set(tool) - TOOL_KEYS
    if extra:
        raise ApiError(400, f"'{where}.{sorted(extra)[0]}' is not supported by this server", where)
    return check_function(where, tool)


def check_tools(body: dict) -> None:
    """`tools`, `tool_choice` (auto, none, required or a named function: a forced call, grammar.py)
    and `parallel_tool_calls` (a boolean; false keeps the first call, single_call.py)."""
    tools = body.get("tools")
    if tools is not None:
        check_tool_list(tools, _check_tool)
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        if choice.get("type") != "function":
            raise ApiError(400, '\'tool_choice\' must be {"type": "function", "name": ...}', "tool_choice")
        check_forced_choice(tools, choice.get("name"), named=True)
    elif choice == "required":
        check_forced_choice(tools, None, named=False)
    elif choice not in (None, "auto", "none"):
        raise ApiError(
            400, f'\'tool_choice\' must be "auto", "none", "required" or a function, got {choice!r}', "tool_choice"
        )
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise ApiError(400, f"'parallel_tool_calls' must be a boolean, got {parallel!r}", "parallel_tool_calls")


def _check_string(item: dict, key: str, where: str, empty_ok: bool = False) -> None:
    if not isinstance(item.get(key), str) or not (empty_ok or item[key]):
        raise ApiError(400, f"'{where}.{key}' must be a {'' if empty_ok else 'non-empty '}string", "input")


def _check_input_item(item: Any, where: str) -> None:
    if not isinstance(item, dict):
        raise ApiError(400, f"'{where}' must be a message object", "input")
    kind = item.get("type", "message")
    if kind not in ITEM_KEYS:
        raise ApiError(400, f"'{where}': {kind!r} items are not supported (only {', '.join(ITEM_KEYS)})", "input")
    extra = set(item) - ITEM_KEYS[kind]
    if extra:
        raise ApiError(400, f"'{where}.{sorted(extra)[0]}' is not supported by this server", "input")
    if kind == "function_call":  # a call of an earlier response, sent back: the recipe renders it as DSML
        _check_string(item, "call_id", where)
        _check_string(item, "name", where)
        _check_string(item, "arguments", where, empty_ok=True)
        return
    if kind == "reasoning":  # an earlier response's reasoning item, sent back with its output
        for key, wanted in (("content", "reasoning_text"), ("summary", "summary_text")):
            parts = item.get(key) or []
            if not isinstance(parts, list) or not all(
                isinstance(p, dict) and p.get("type") == wanted and isinstance(p.get("text"), str) for p in parts
            ):
                raise ApiError(400, f"'{where}.{key}' must be a list of {wanted} parts with a 'text'", "input")
        return
    if kind == "function_call_output":  # the recipe checks that it answers a function_call before it
        _check_string(item, "call_id", where)
        output = item.get("output")
        if isinstance(output, list):
            for j, part in enumerate(output):
                if not (
                    isinstance(part, dict) and part.get("type") == "input_text" and isinstance(part.get("text"), str)
                ):
                    raise ApiError(400, f"'{where}.output[{j}]' must be an input_text part with a 'text'", "input")
        elif not isinstance(output, str):
            raise ApiError(400, f"'{where}.output' must be a string or a list of input_text parts", "input")
        return
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
    check_tools(body)
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
        recipe_body, forced = split_forced_choice(body)
        request = recipe_request(dr.ResponsesRequest, recipe_body)
        echo = request.echo()  # the settings the response objects report, read before conversion
        conv, prompt = state.chat.encode(request)
        budget = OutputBudget(
            body.get("max_output_tokens"), "max_output_tokens", state.context_limit, cfg.default_max_tokens
        )
        return state.chat.prepared(body, conv, prompt, asked_sampling, budget, "input", forced), echo

    async def handle(self, body: dict, request: Request) -> Response:
        prep, echo = self.prepare(body)
        model, rid = body["model"], f"resp_{uuid.uuid4().hex}"
        generator = dr.ResponsesRequest.chunk_generator(prep.conversation, rid, model).with_echo(echo)
        run = RecipeRun(self.state, self.admit, prep, generator, RESPONSES_USAGE)
        metadata = body.get("metadata") or {}
        parallel = body.get("parallel_tool_calls") is not False
        single = None if parallel else FirstCallOnly(RESPONSES_ITEMS)

        def complete(response: Any) -> None:
            # The recipe does not echo metadata, and echoes parallel_tool_calls true whatever was
            # asked; the final usage counts every generated token.
            if isinstance(response, dict):
                response["metadata"] = metadata
                response["parallel_tool_calls"] = parallel
                if response.get("status") in ("completed", "incomplete", "failed"):
                    run.fix_usage(response.get("usage"))

        if prep.stream:
            sent = [0]  # events sent: the next sequence_number (the recipe numbers them from 0)

            named = named_event_frames(
                dr.ResponsesResponse,
                lambda event: complete(event.get("response")),
                ("response",),
                single.keep if single else None,
            )

            def frames(event: Any) -> Iterable[str]:
                out = tuple(named(event))
                sent[0] += len(out)
                return out

            def error_frame(err: ApiError) -> str:
                event = {"type": "error", "code": err.code or err.type, "message": err.message, "param": err.param}
                return f"event: error\ndata: {json.dumps({**event, 'sequence_number': sent[0]})}\n\n"

            return run.stream(SseFraming(frames, tuple, error_frame))
        response = dr.ResponsesResponse(rid, model, int(time.time()), len(prep.prompt), 0)

        def finish(d: dict) -> None:
            complete(d)
            if single:
                single.trim(d)

        return await run.respond(request, response, finish)
