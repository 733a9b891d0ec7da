"""Anthropic's Messages API (`POST /v1/messages`), text, thinking and tool use, for Anthropic
clients (the `anthropic` SDK, Claude Code).

deepseek-recipe converts the request (system, messages, thinking, tools, tool_use / tool_result
blocks) into the same conversation a chat request becomes and writes Anthropic's events (thinking
block, then text block, then a tool_use block per call with `input_json_delta`s; stop reason, usage);
the engine path is the chat route's (recipe_stream.py). This module checks what the recipe would
accept silently or reject without naming the field (the tool checks are tool_calls.py's, shared with
chat), gives the calls Anthropic's `toolu_` ids, and answers errors in Anthropic's shape.
`tool_choice` any / a named tool is a 400 until grammar-constrained decoding exists;
`tool_choice.disable_parallel_tool_use: true` returns at most the first call (single_call.py).

`POST /v1/messages/count_tokens` (Anthropic's token counting, which Claude Code calls) takes the
same body without the generation fields and answers `{"input_tokens": N}`: the length of the prompt
the same conversion and encoding give /v1/messages, so N is what a /v1/messages call with that body
reports as `usage.input_tokens` plus `usage.cache_read_input_tokens` (the prefix cache's share).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
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
from .single_call import MESSAGES_ITEMS, FirstCallOnly
from .tool_calls import check_forced_choice, check_function, check_tool_list

MESSAGES_PATH = "/v1/messages"
COUNT_TOKENS_PATH = "/v1/messages/count_tokens"
ANTHROPIC_PATHS = (MESSAGES_PATH, COUNT_TOKENS_PATH)  # errors in Anthropic's shape

MESSAGES_FIELDS = frozenset(
    "model messages system max_tokens temperature top_p top_k stop_sequences stream thinking output_config"
    " metadata tools tool_choice".split()
)
# What Anthropic's count_tokens reads (the conversation, not the generation's settings); the other
# fields of /v1/messages are a 400 naming them there, as Anthropic's API answers.
COUNT_TOKENS_FIELDS = frozenset("model messages system thinking output_config tools tool_choice".split())
# Anthropic's `output_config.effort` values; the recipe maps them as chat's `reasoning_effort` (medium: high).
EFFORTS = ("low", "medium", "high", "xhigh", "max")
# The keys of a custom tool (Anthropic's tool definition); `type` is absent or "custom".
TOOL_KEYS = frozenset("type name description input_schema cache_control".split())
MESSAGES_USAGE = UsageKeys("output_tokens", None, None)
# Anthropic's error types by status (https://docs.anthropic.com/en/api/errors).
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    415: "invalid_request_error",
    429: "rate_limit_error",
    503: "overloaded_error",
}


class AnthropicError(ApiError):
    """An ApiError in Anthropic's shape: {"type": "error", "error": {"type", "message"}}."""

    @property
    def type(self) -> str:
        return _ANTHROPIC_TYPES.get(self.status, "api_error")

    def body(self) -> dict[str, Any]:
        return {"type": "error", "error": {"type": self.type, "message": self.message}}


def as_anthropic(err: ApiError) -> AnthropicError:
    if isinstance(err, AnthropicError):
        return err
    return AnthropicError(err.status, err.message, err.param, err.code)


@contextmanager
def anthropic_errors() -> Iterator[None]:
    """The ApiErrors raised inside, in Anthropic's shape (the app's handler writes `body()`)."""
    try:
        yield
    except ApiError as err:
        raise as_anthropic(err) from None


def _extra_key(block: dict, allowed: set[str], where: str) -> None:
    # cache_control is a hint this server satisfies anyway: prefix caching is automatic.
    extra = set(block) - allowed - {"type", "cache_control"}
    if extra:
        key = sorted(extra)[0]
        raise ApiError(400, f"'{where}.{key}' is not supported by this server", where)


def _check_tool_result_content(content: Any, where: str) -> None:
    if content is None or isinstance(content, str):
        return
    if not isinstance(content, list):
        raise ApiError(400, f"'{where}.content' must be a string or a list of text blocks", where)
    for k, part in enumerate(content):
        _check_block(part, f"{where}.content[{k}]", ("text",))


def _check_block(block: Any, where: str, allowed_types: tuple[str, ...]) -> None:
    if not isinstance(block, dict) or not isinstance(block.get("type"), str):
        raise ApiError(400, f"'{where}' must be a content block object with a 'type'", where)
    kind = block["type"]
    if kind not in allowed_types:
        raise ApiError(400, f"'{where}': {kind} blocks are not supported here (only {', '.join(allowed_types)})", where)
    if kind == "tool_use":  # a call of an earlier turn, sent back: the recipe renders it as DSML
        for key in ("id", "name"):
            if not isinstance(block.get(key), str) or not block[key]:
                raise ApiError(400, f"'{where}.{key}' must be a non-empty string", where)
        if not isinstance(block.get("input"), dict):
            raise ApiError(400, f"'{where}.input' must be an object", where)
        _extra_key(block, {"id", "name", "input"}, where)
    elif kind == "tool_result":  # the recipe checks that it answers a tool_use of the turn before
        if not isinstance(block.get("tool_use_id"), str) or not block["tool_use_id"]:
            raise ApiError(400, f"'{where}.tool_use_id' must be a non-empty string", where)
        _check_tool_result_content(block.get("content"), where)
        if block.get("is_error") is not None and not isinstance(block["is_error"], bool):
            raise ApiError(400, f"'{where}.is_error' must be a boolean", where)
        _extra_key(block, {"tool_use_id", "content", "is_error"}, where)
    else:
        text_key = "thinking" if kind == "thinking" else "text"
        if not isinstance(block.get(text_key), str):
            raise ApiError(400, f"'{where}.{text_key}' must be a string", where)
        _extra_key(block, {text_key, "signature"}, where)


def _check_tool(where: str, tool: Any) -> str:
    """An Anthropic custom tool: name, description, input_schema (required), as chat's function."""
    if not isinstance(tool, dict):
        raise ApiError(400, f"'{where}' must be a tool object", "tools")
    if tool.get("type") not in (None, "custom"):
        raise ApiError(
            400, f"'{where}.type': {tool['type']!r} tools are not supported (server tools); only custom tools", "tools"
        )
    _extra_key(tool, set(TOOL_KEYS), where)
    return check_function(where, tool, "input_schema", params_required=True)


def check_tools(body: dict) -> None:
    """`tools` and `tool_choice`: auto, none, any or a named tool (a forced call: grammar.py)."""
    tools = body.get("tools")
    if tools is not None:
        check_tool_list(tools, _check_tool, "tool objects")
    choice = body.get("tool_choice")
    if choice is None:
        return
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind not in ("auto", "none", "any", "tool"):
        raise ApiError(400, '\'tool_choice\' must be {"type": "auto" | "none" | "any" | "tool"}', "tool_choice")
    if kind in ("any", "tool"):
        check_forced_choice(tools, choice.get("name"), named=kind == "tool")
    extra = set(choice) - {"type", "disable_parallel_tool_use"} - ({"name"} if kind == "tool" else set())
    if extra:
        raise ApiError(400, f"'tool_choice.{sorted(extra)[0]}' is not supported", "tool_choice")
    flag = choice.get("disable_parallel_tool_use")
    if flag is not None and not isinstance(flag, bool):
        raise ApiError(400, f"'tool_choice.disable_parallel_tool_use' must be a boolean, got {flag!r}", "tool_choice")


def single_call(body: dict) -> bool:
    """`tool_choice.disable_parallel_tool_use: true` (checked): at most one call is returned."""
    choice = body.get("tool_choice")
    return isinstance(choice, dict) and choice.get("disable_parallel_tool_use") is True


def check_messages_request(body: dict, max_limit: int) -> None:
    """The 400s the recipe's conversion would not give, or not name: fields, types, tools."""
    check_known_fields(body, MESSAGES_FIELDS)
    if body.get("max_tokens") is None:  # required by Anthropic's API; the recipe would default it
        raise ApiError(400, "'max_tokens' is required", "max_tokens")
    _num(body, "max_tokens", None, 1, max_limit, integer=True)
    check_type(body, "stream", bool, "a boolean")
    check_type(body, "metadata", dict, "an object")
    stops = body.get("stop_sequences")
    if stops is not None and not (isinstance(stops, list) and all(isinstance(s, str) and s for s in stops)):
        raise ApiError(400, "'stop_sequences' must be a list of non-empty strings", "stop_sequences")
    check_conversation(body)


def check_conversation(body: dict) -> None:
    """The checks of what the prompt is rendered from (shared with count_tokens): thinking, effort,
    system, tools and messages."""
    thinking = body.get("thinking")
    if thinking is not None:
        kind = thinking.get("type") if isinstance(thinking, dict) else None
        if kind not in ("enabled", "disabled", "adaptive"):
            raise ApiError(400, '\'thinking\' must be {"type": "enabled" | "disabled" | "adaptive"}', "thinking")
        if kind == "enabled":
            _num(thinking, "budget_tokens", None, 1, 1 << 30, integer=True)
    output_config = body.get("output_config")
    if output_config is not None:
        # Only the effort: the recipe would take a `format` (structured output) and not apply it.
        if not isinstance(output_config, dict) or set(output_config) - {"effort"}:
            raise ApiError(400, "'output_config' supports only 'effort' on this server", "output_config")
        if output_config.get("effort") not in (None, *EFFORTS):
            raise ApiError(400, f"'output_config.effort' must be one of {', '.join(EFFORTS)}", "output_config")
    system = body.get("system")
    if isinstance(system, list):
        for j, block in enumerate(system):
            _check_block(block, f"system[{j}]", ("text",))
    elif system is not None and not isinstance(system, str):
        raise ApiError(400, "'system' must be a string or a list of text blocks", "system")
    check_tools(body)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "'messages' must be a non-empty list", "messages")
    for i, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ("user", "assistant"):
            raise ApiError(400, f'\'messages[{i}].role\' must be "user" or "assistant"', "messages")
        content = message.get("content")
        if isinstance(content, list):
            # Thinking blocks and tool calls come back in an assistant turn (Claude Code sends them
            # with the history), the calls' results in the user turn after it.
            kinds = ("text", "thinking", "tool_use") if role == "assistant" else ("text", "tool_result")
            for j, block in enumerate(content):
                _check_block(block, f"messages[{i}].content[{j}]", kinds)
        elif not isinstance(content, str):
            raise ApiError(400, f"'messages[{i}].content' must be a string or a list of content blocks", "messages")


def _recipe_body(body: dict) -> dict:
    """The body as the recipe reads it: a custom tool's `type: "custom"` (Anthropic's explicit
    spelling of the default) is dropped, the recipe takes any `type` for a server tool."""
    tools = body.get("tools")
    if not tools or all("type" not in t for t in tools):
        return body
    return {**body, "tools": [{k: v for k, v in t.items() if k != "type"} for t in tools]}


def tool_use_ids(d: dict) -> None:
    """Anthropic's `toolu_` ids for the recipe's call ids (`call_NN_<random>`), in place, in a
    content_block_start event or a whole message. The id only pairs a tool_result with its
    tool_use (the recipe checks it; the encoding has no ids), so any spelling round-trips."""
    blocks = [d.get("content_block")] if d.get("type") == "content_block_start" else d.get("content") or []
    for block in blocks:
        if isinstance(block, dict) and block.get("type") == "tool_use":
            call_id = str(block.get("id", ""))
            block["id"] = "toolu_" + (call_id[len("call_") :] if call_id.startswith("call_") else call_id)


class MessagesApi:
    """The /v1/messages route over the server's state (ServerState) and admission."""

    def __init__(self, state: Any, admit: Admit) -> None:
        self.state, self.admit = state, admit

    def encode(self, body: dict) -> tuple[dr.ConversationRequest, list[int]]:
        """The conversation of a checked body and its prompt (the same for count_tokens; a forced
        tool_choice goes to the recipe as auto: grammar.split_forced_choice)."""
        recipe_body, _ = split_forced_choice(body)
        return self.state.chat.encode(recipe_request(dr.MessagesRequest, _recipe_body(recipe_body)))

    def count_tokens(self, body: dict) -> dict[str, int]:
        """`{"input_tokens": N}`: the prompt /v1/messages would render for `body`, counted. No
        context check: a client counts to learn whether its conversation still fits."""
        self.state.chat.check_model(body)
        check_known_fields(body, COUNT_TOKENS_FIELDS)
        check_conversation(body)
        return {"input_tokens": len(self.encode(body)[1])}

    def prepare(self, body: dict) -> PreparedChat:
        state, cfg = self.state, self.state.cfg
        state.chat.check_model(body)
        check_messages_request(body, cfg.max_tokens_limit)
        # Anthropic's range: temperature in [0, 1]; they apply in both modes, as chat's do.
        asked_sampling = RequestedSampling.of(body, max_temperature=1.0)
        conv, prompt = self.encode(body)
        budget = OutputBudget(body["max_tokens"], "max_tokens", state.context_limit, cfg.default_max_tokens)
        forced = split_forced_choice(body)[1]
        return state.chat.prepared(body, conv, prompt, asked_sampling, budget, "messages", forced)

    async def handle(self, body: dict, request: Request) -> Response:
        prep = self.prepare(body)
        model, rid = body["model"], f"msg_{uuid.uuid4().hex}"
        generator = dr.MessagesRequest.chunk_generator(prep.conversation, rid, model)
        run = RecipeRun(self.state, self.admit, prep, generator, MESSAGES_USAGE)
        single = FirstCallOnly(MESSAGES_ITEMS) if single_call(body) else None

        def final_usage(d: dict) -> None:
            # message_start carries the prompt's usage (output 0); message_delta and the response
            # the final count.
            if d.get("type") in ("message_delta", "message"):
                run.fix_usage(d.get("usage"))
            tool_use_ids(d)

        if prep.stream:

            def error_frame(err: ApiError) -> str:
                return f"event: error\ndata: {json.dumps(as_anthropic(err).body())}\n\n"

            keep = single.keep if single else None
            frames = named_event_frames(dr.MessagesResponse, final_usage, ("usage", "tool_use"), keep)
            return run.stream(SseFraming(frames, tuple, error_frame))
        response = dr.MessagesResponse(rid, model, int(time.time()), len(prep.prompt), 0)

        def finish(d: dict) -> None:
            final_usage(d)
            if single:
                single.trim(d)

        return await run.respond(request, response, finish)
