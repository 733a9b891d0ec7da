"""The server's OpenAPI document (served at /openapi.json).

The routes read their bodies as raw JSON (app.py `_read_json`) so that every invalid request is a
400 OpenAI error object naming the field, never FastAPI's 422; their request and response schemas
are therefore written here by hand, as JSON Schema, and laid over what FastAPI derives from the
routes. The document is what schema fuzzers (tests/python/test_serve_schema.py, bench/schema_fuzz.py)
and client generators read: it describes the server that serves it (its model names, vocabulary,
max-tokens limit and API key setting), so a generated client or test case sees the real bounds.

A route that has no description here (a route added to app.py without one) still appears, with
FastAPI's generic 200 and the error responses the guard can give every route.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from .guard import OPEN_PATHS
from .openapi_responses import CHAT_CHUNK, CHAT_RESPONSE, COMPLETION_CHUNK, COMPLETION_RESPONSE

JsonSchema = dict[str, Any]
FLOAT32_MIN_NORMAL = 1.1754943508222875e-38


@dataclass(frozen=True)
class ServedApi:
    """What the document depends on in a running server."""

    model_names: tuple[str, ...]
    vocab: int  # token ids are in [0, vocab)
    max_tokens_limit: int  # the largest max_tokens a request may ask for
    context_limit: int
    needs_api_key: bool


# ---- shared pieces -------------------------------------------------------------------------------

ERROR_BODY: JsonSchema = {
    "type": "object",
    "description": "An OpenAI error object (every error the server answers, whatever the route).",
    "required": ["error"],
    "additionalProperties": False,
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "additionalProperties": False,
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"], "description": "the request field at fault, when one is"},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}

# Why each status is answered (guard.py, app.py, protocol.py, completions.py).
ERROR_REASONS = {
    "400": "Invalid request: not JSON, not an object, a bad or unsupported field (named in `param`).",
    "401": "Missing or invalid API key (`Authorization: Bearer <key>`).",
    "404": "The model is not served (`code`: model_not_found).",
    "413": "The body exceeds the server's max-request-bytes.",
    "415": "A POST body not sent as `Content-Type: application/json`.",
    "500": "A server bug (logged); the server keeps serving.",
    "503": "The waiting queue is full, the server is shutting down, or its engine failed (e.g. a parallel"
    " worker process died); retry after `Retry-After` seconds (elsewhere, for a failed engine).",
}


ANTHROPIC_ERROR_BODY: JsonSchema = {
    "type": "object",
    "description": "Anthropic's error object: every error of the /v1/messages routes (messages_api.py).",
    "required": ["type", "error"],
    "additionalProperties": False,
    "properties": {
        "type": {"const": "error"},
        "error": {
            "type": "object",
            "required": ["type", "message"],
            "additionalProperties": False,
            "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
        },
    },
}


def _error(status: str, error_schema: str | None = "Error") -> JsonSchema:
    """An error answer whose body is the components schema `error_schema` (None: not described, for
    a route not described here)."""
    response: JsonSchema = {"description": ERROR_REASONS[status]}
    if error_schema is not None:
        response["content"] = {"application/json": {"schema": {"$ref": f"#/components/schemas/{error_schema}"}}}
    if status == "503":
        response["headers"] = {"Retry-After": {"required": True, "schema": {"type": "string", "pattern": "^[0-9]+$"}}}
    return response


def _json(schema: JsonSchema, description: str = "OK") -> JsonSchema:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _json_or_events(description: str, schema: JsonSchema, event: JsonSchema) -> JsonSchema:
    """An answer that is one JSON object, or server-sent events each described by `event`."""
    return {
        "description": description,
        "content": {"application/json": {"schema": schema}, "text/event-stream": {"schema": event}},
    }


def _text_part(part_type: str) -> JsonSchema:
    """A text content part (`{"type": <part_type>, "text": ...}`) of a message's content array."""
    return {
        "type": "object",
        "required": ["type", "text"],
        "additionalProperties": False,
        "properties": {"type": {"const": part_type}, "text": {"type": "string"}},
    }


def _json_or_stream(schema: JsonSchema, chunk: JsonSchema) -> JsonSchema:
    """A generation: one JSON object, or with `stream: true` server-sent events. Each event (as
    OpenAPI 3.1 describes an event stream: its `schema` is one event) is a `data:` line holding a
    chunk as JSON, an error object on a mid-stream failure, or the closing `[DONE]`."""
    event = {
        "type": "object",
        "required": ["data"],
        "properties": {
            "data": {
                "anyOf": [
                    {"const": "[DONE]"},
                    {
                        "type": "string",
                        "contentMediaType": "application/json",
                        "contentSchema": {"anyOf": [chunk, {"$ref": "#/components/schemas/Error"}]},
                    },
                ]
            }
        },
    }
    return _json_or_events(
        "The result (application/json), or the stream of chunks when `stream` is true.", schema, event
    )


def _json_or_named_events(schema: JsonSchema, event_error: JsonSchema) -> JsonSchema:
    """A generation of the Responses or Messages API: one JSON object, or with `stream: true`
    server-sent events with an `event:` name and a JSON object as data (an `error` event on a
    mid-stream failure); no `[DONE]`."""
    event = {
        "type": "object",
        "required": ["event", "data"],
        "properties": {
            "event": {"type": "string", "minLength": 1},
            "data": {
                "type": "string",
                "contentMediaType": "application/json",
                "contentSchema": {"anyOf": [{"type": "object", "required": ["type"]}, event_error]},
            },
        },
    }
    return _json_or_events("The result (application/json), or its events when `stream` is true.", schema, event)


def responses_request(api: ServedApi) -> JsonSchema:
    """OpenAI's Responses API as responses_api.py reads it: text and reasoning, stateless, function
    tools (tool_choice auto / none / required / a named function; the history's call items are not
    described here)."""
    text_part = _text_part("input_text")
    item = {
        "type": "object",
        "required": ["role", "content"],
        "additionalProperties": False,
        "properties": {
            "type": {"const": "message"},
            "role": {"enum": ["user", "system", "developer"]},
            "content": {"anyOf": [{"type": "string"}, {"type": "array", "items": text_part}]},
        },
    }
    return {
        "type": "object",
        "required": ["model", "input"],
        "additionalProperties": False,
        "properties": {
            "model": {"type": "string", "enum": list(api.model_names)},
            "input": {"anyOf": [{"type": "string"}, {"type": "array", "minItems": 1, "items": item}]},
            "instructions": _nullable({"type": "string"}),
            "max_output_tokens": _nullable(_int(1, api.max_tokens_limit)),
            "temperature": _nullable(_num(0.0, 2.0)),
            "top_p": _nullable(_num(FLOAT32_MIN_NORMAL, 1.0)),
            "stream": _nullable({"type": "boolean"}),
            "reasoning": _nullable(
                {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {"effort": _nullable({"enum": REASONING_EFFORTS})},
                }
            ),
            "metadata": _nullable({"type": "object", "additionalProperties": {"type": "string"}}),
            "store": _nullable({"const": False, "description": "stateless: nothing is stored"}),
            "user": _nullable({"type": "string"}),
            "tools": _nullable({"type": "array", "items": RESPONSES_TOOL}),
            "tool_choice": _openai_tool_choice({"name": {"type": "string"}}),
            "parallel_tool_calls": _nullable({"type": "boolean", "description": "false: at most one call"}),
        },
    }


def messages_request(api: ServedApi) -> JsonSchema:
    """Anthropic's Messages API as messages_api.py reads it: text, thinking and custom tools
    (tool_choice auto / none; tool_use / tool_result blocks of a history are not described here)."""
    text_block = _text_part("text")
    message = {
        "type": "object",
        "required": ["role", "content"],
        "additionalProperties": False,
        "properties": {
            "role": {"const": "user"},
            "content": {
                "anyOf": [{"type": "string", "minLength": 1}, {"type": "array", "minItems": 1, "items": text_block}]
            },
        },
    }
    return {
        "type": "object",
        "required": ["model", "messages", "max_tokens"],
        "additionalProperties": False,
        "properties": {
            "model": {"type": "string", "enum": list(api.model_names)},
            "messages": {"type": "array", "minItems": 1, "items": message},
            "max_tokens": _int(1, api.max_tokens_limit),
            "system": _nullable({"anyOf": [{"type": "string"}, {"type": "array", "items": text_block}]}),
            "temperature": _nullable(_num(0.0, 1.0)),
            "top_p": _nullable(_num(FLOAT32_MIN_NORMAL, 1.0)),
            "top_k": _nullable(_int(-1, 1 << 30)),
            "stop_sequences": _nullable({"type": "array", "items": {"type": "string", "minLength": 1}}),
            "stream": _nullable({"type": "boolean"}),
            "thinking": _nullable(
                {
                    "type": "object",
                    "required": ["type"],
                    "additionalProperties": False,
                    "properties": {"type": {"enum": ["disabled", "adaptive"]}},
                }
            ),
            "output_config": _nullable(
                {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {"effort": _nullable({"enum": ["low", "medium", "high", "xhigh", "max"]})},
                }
            ),
            "metadata": _nullable({"type": "object"}),
            "tools": _nullable({"type": "array", "items": ANTHROPIC_TOOL}),
            "tool_choice": _nullable(
                {
                    "type": "object",
                    "required": ["type"],
                    "additionalProperties": False,
                    "properties": {
                        "type": {"enum": ["auto", "none", "any", "tool"]},
                        "name": {"type": "string", "description": "type tool: the tool to call"},
                        "disable_parallel_tool_use": _nullable({"type": "boolean", "description": "at most one call"}),
                    },
                    "description": "any / tool: the output is held to a call (grammar)",
                }
            ),
        },
    }


# The fields of a /v1/messages body that only the generation reads: not in a count_tokens body.
_GENERATION_ONLY = ("max_tokens", "temperature", "top_p", "top_k", "stop_sequences", "stream", "metadata")


def count_tokens_request(api: ServedApi) -> JsonSchema:
    """Anthropic's count_tokens: a Messages body without the generation's fields (they are a 400)."""
    messages = messages_request(api)
    fields = {k: v for k, v in messages["properties"].items() if k not in _GENERATION_ONLY}
    return {**messages, "required": ["model", "messages"], "properties": fields}


COUNT_TOKENS_RESPONSE: JsonSchema = {
    "type": "object",
    "required": ["input_tokens"],
    "additionalProperties": False,
    "properties": {"input_tokens": {"type": "integer", "minimum": 0}},
}


UNDESCRIBED_OK: JsonSchema = _json_or_events(
    "OK: JSON, or server-sent events when the request streams (not described here).", {}, {}
)


def _nullable(schema: JsonSchema) -> JsonSchema:
    """`null` is accepted wherever a field is optional (the routes read it as "not given")."""
    return {"anyOf": [schema, {"type": "null"}]}


def _openai_tool_choice(named: JsonSchema) -> JsonSchema:
    """tool_choice of the OpenAI routes: a mode, or {"type": "function", <named>} naming the function
    (chat: {"function": {"name"}}; Responses: {"name"})."""
    return _nullable(
        {
            "anyOf": [
                {"enum": ["auto", "none", "required"]},
                {
                    "type": "object",
                    "required": ["type", *named],
                    "additionalProperties": False,
                    "properties": {"type": {"const": "function"}, **named},
                },
            ],
            "description": "required / a named function: the output is held to a call (grammar)",
        }
    )


def _int(lo: int, hi: int) -> JsonSchema:
    return {"type": "integer", "minimum": lo, "maximum": hi}


def _num(lo: float, hi: float) -> JsonSchema:
    return {"type": "number", "minimum": lo, "maximum": hi}


def _sampling_fields(api: ServedApi) -> JsonSchema:
    """Fields both generation routes read, with the bounds protocol.py checks."""
    token_id = _int(0, api.vocab - 1)
    return {
        "model": {"type": "string", "enum": list(api.model_names), "description": "one of the served names"},
        "max_tokens": _nullable(_int(1, api.max_tokens_limit)),
        "temperature": _nullable(_num(0.0, 2.0)),
        # top_p is used as a 32-bit float and must be > 0 there (1e-50 is a 400): from float32's smallest normal
        "top_p": _nullable(_num(FLOAT32_MIN_NORMAL, 1.0)),
        "top_k": _nullable(_int(-1, 1 << 30)),
        "min_p": _nullable(_num(0.0, 1.0)),
        "presence_penalty": _nullable(_num(-2.0, 2.0)),
        "frequency_penalty": _nullable(_num(-2.0, 2.0)),
        "repetition_penalty": _nullable(_num(0.01, 10.0)),
        "seed": _nullable(_int(0, (1 << 63) - 1)),
        "stop": _nullable(
            {
                "anyOf": [
                    {"type": "string", "minLength": 1},
                    {"type": "array", "maxItems": 16, "items": {"type": "string", "minLength": 1}},
                ]
            }
        ),
        "stop_token_ids": _nullable({"type": "array", "items": token_id}),
        "stream": {"type": "boolean"},  # null: a 400 on /v1/completions
        "stream_options": _nullable(
            {"type": "object", "properties": {"include_usage": {"type": "boolean"}}, "additionalProperties": False}
        ),
        "ignore_eos": {"type": "boolean"},  # null: a 400
        "n": _nullable({"const": 1, "description": "one sequence per request"}),
        "best_of": _nullable({"const": 1}),
        "logit_bias": _nullable({"type": "object", "maxProperties": 0, "description": "not applied yet: only {}"}),
        "user": _nullable({"type": "string", "description": "accepted, changes nothing in a self-hosted server"}),
        "metadata": {"description": "accepted, changes nothing in a self-hosted server"},
        "store": _nullable({"const": False, "description": "nothing is stored"}),
    }


TOOL_CALL: JsonSchema = {
    "type": "object",
    "required": ["id", "type", "function"],
    "additionalProperties": False,
    "properties": {
        "id": {"type": "string"},
        "type": {"const": "function"},
        "function": {
            "type": "object",
            "required": ["name", "arguments"],
            "additionalProperties": False,
            "properties": {"name": {"type": "string", "minLength": 1}, "arguments": {"type": "string"}},
        },
    },
}

MESSAGE: JsonSchema = {
    "type": "object",
    "description": "A chat message as deepseek-recipe converts it (OpenAI's message shapes; a `tool` message "
    "answers a preceding assistant message's `tool_calls`).",
    "required": ["role", "content"],
    # The recipe ignores other keys; they are left out so that generated messages are ones it reads.
    "additionalProperties": False,
    "properties": {
        "role": {"enum": ["system", "user", "assistant", "tool", "latest_reminder"]},
        "content": {
            "anyOf": [
                {"type": "string"},
                {"type": "array", "items": _text_part("text")},
            ]
        },
        "name": {"type": ["string", "null"]},
        "reasoning_content": {"type": ["string", "null"]},
        "tool_calls": {"type": "array", "minItems": 1, "items": TOOL_CALL},
        "tool_call_id": {"type": "string"},
        "prefix": {"type": "boolean"},
    },
}

_FUNCTION_FIELDS: JsonSchema = {
    "name": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"},
    "description": {"type": "string"},
}
TOOL: JsonSchema = {
    "type": "object",
    "required": ["type", "function"],
    "additionalProperties": False,
    "properties": {
        "type": {"const": "function"},
        "function": {
            "type": "object",
            "required": ["name"],
            "additionalProperties": False,
            "properties": {**_FUNCTION_FIELDS, "parameters": {"type": "object"}},
        },
    },
}

RESPONSES_TOOL: JsonSchema = {
    "type": "object",
    "required": ["type", "name"],
    "additionalProperties": False,
    "properties": {
        "type": {"const": "function"},
        **_FUNCTION_FIELDS,
        "parameters": {"type": "object"},
        "strict": {"type": "boolean"},
    },
}
ANTHROPIC_TOOL: JsonSchema = {
    "type": "object",
    "required": ["name", "input_schema"],
    "additionalProperties": False,
    "properties": {**_FUNCTION_FIELDS, "input_schema": {"type": "object"}},
}

REASONING_EFFORTS = ["none", "minimal", "low", "medium", "high", "xhigh", "ultra", "max"]  # deepseek-recipe's


def chat_request(api: ServedApi) -> JsonSchema:
    return {
        "type": "object",
        "required": ["model", "messages"],
        # A field the server does not apply is a 400 naming it (issue 23 D6), never ignored.
        "additionalProperties": False,
        "properties": {
            **_sampling_fields(api),
            "messages": {"type": "array", "minItems": 1, "items": MESSAGE},
            "max_completion_tokens": _nullable(_int(1, api.max_tokens_limit)),
            "logprobs": _nullable({"type": "boolean"}),
            "top_logprobs": _nullable({**_int(0, 20), "description": "needs logprobs: true"}),
            "tools": _nullable({"type": "array", "items": TOOL}),
            "tool_choice": _openai_tool_choice(
                {
                    "function": {
                        "type": "object",
                        "required": ["name"],
                        "additionalProperties": False,
                        "properties": {"name": {"type": "string"}},
                    }
                }
            ),
            "parallel_tool_calls": _nullable({"type": "boolean", "description": "false: at most one call"}),
            "thinking": _nullable(
                {"type": "object", "required": ["type"], "properties": {"type": {"enum": ["enabled", "disabled"]}}}
            ),
            "reasoning_effort": _nullable({"enum": REASONING_EFFORTS}),
            "response_format": _nullable(
                {
                    "anyOf": [
                        {
                            "type": "object",
                            "required": ["type"],
                            "properties": {"type": {"enum": ["text", "json_object"]}},
                        },
                        {
                            "type": "object",
                            "required": ["type", "json_schema"],
                            "properties": {
                                "type": {"const": "json_schema"},
                                "json_schema": {
                                    "type": "object",
                                    "required": ["name"],
                                    "properties": {
                                        "name": {"type": "string"},
                                        "description": {"type": "string"},
                                        "schema": {"type": "object"},
                                        "strict": _nullable({"type": "boolean"}),
                                    },
                                },
                            },
                        },
                    ],
                    "description": "json_object / json_schema: the output is held to it (grammar)",
                }
            ),
            "chat_template_kwargs": _nullable({"type": "object", "maxProperties": 0}),
        },
        # The recipe's pairings: stream_options only with stream true, top_logprobs only with logprobs.
        "dependentSchemas": {
            "stream_options": _unless_null("stream_options", {"stream": {"const": True}}),
            "top_logprobs": _unless_null("top_logprobs", {"logprobs": {"const": True}}),
        },
    }


def _unless_null(key: str, needed: JsonSchema) -> JsonSchema:
    """`key` null, or the fields in `needed` present with those values."""
    return {"anyOf": [{"properties": {key: {"type": "null"}}}, {"required": list(needed), "properties": needed}]}


def completion_request(api: ServedApi) -> JsonSchema:
    token_ids = {"type": "array", "minItems": 1, "items": _int(0, api.vocab - 1)}
    return {
        "type": "object",
        "required": ["model", "prompt"],
        "additionalProperties": False,
        "properties": {
            **_sampling_fields(api),
            "prompt": {"anyOf": [{"type": "string", "minLength": 1}, token_ids]},
            "logprobs": _nullable({**_int(0, 20), "description": "the legacy block with this many alternatives"}),
            "echo": _nullable({"const": False}),
            "suffix": {"type": "null"},
        },
    }


def tokenize_request(api: ServedApi) -> JsonSchema:
    """A prompt string, or chat messages (rendered as the chat route renders them)."""
    chat = chat_request(api)
    return {
        "anyOf": [
            {
                "type": "object",
                "required": ["prompt"],
                "properties": {"prompt": {"type": "string"}, "model": {"type": "string"}},
            },
            {**chat, "required": ["messages"]},
        ]
    }


def _models(api: ServedApi) -> JsonSchema:
    model = {
        "type": "object",
        "required": ["id", "object", "created", "owned_by", "max_model_len"],
        "properties": {
            "id": {"enum": list(api.model_names)},
            "object": {"const": "model"},
            "created": {"type": "integer"},
            "owned_by": {"type": "string"},
            "max_model_len": {"const": api.context_limit},
        },
    }
    return {
        "type": "object",
        "required": ["object", "data"],
        "properties": {"object": {"const": "list"}, "data": {"type": "array", "items": model}},
    }


@dataclass(frozen=True)
class Operation:
    """One route's hand-written description: its body (None: it reads none), its answers other
    than errors, and the error statuses it can give beyond the guard's."""

    summary: str
    responses: dict[str, JsonSchema]
    body: JsonSchema | None = None
    errors: tuple[str, ...] = ()
    error_schema: str = "Error"  # the components schema of its error bodies


def operations(api: ServedApi) -> dict[tuple[str, str], Operation]:
    """(method, path) -> its description, for the routes of app.py."""
    empty = {"description": "OK (no body)"}
    down = {"description": "The engine is not running, or the server is draining (no body)."}
    gen_errors = ("400", "404")  # a bad field, or a model not served
    return {
        ("get", "/health"): Operation(
            "Liveness: 200 while the engine runs and the server is not draining.", {"200": empty, "503": down}
        ),
        ("get", "/ready"): Operation(
            "Readiness, as JSON.",
            {
                "200": _json({"type": "object", "required": ["ready"], "properties": {"ready": {"const": True}}}),
                "503": _json(
                    {"type": "object", "required": ["ready"], "properties": {"ready": {"const": False}}}, "Not ready"
                ),
            },
        ),
        ("get", "/version"): Operation(
            "The server's version.",
            {"200": _json({"type": "object", "required": ["version"], "properties": {"version": {"type": "string"}}})},
        ),
        ("get", "/metrics"): Operation(
            "Prometheus metrics (text exposition format 0.0.4).",
            {"200": {"description": "OK", "content": {"text/plain": {"schema": {"type": "string"}}}}},
        ),
        ("get", "/v1/models"): Operation("The served model names.", {"200": _json(_models(api))}),
        ("post", "/reset_prefix_cache"): Operation("Forget every cached prompt prefix.", {"200": empty}),
        ("post", "/tokenize"): Operation(
            "Token ids of a prompt, or of chat messages as the chat route renders them.",
            {
                "200": _json(
                    {
                        "type": "object",
                        "required": ["count", "max_model_len", "tokens"],
                        "properties": {
                            "count": {"type": "integer", "minimum": 0},
                            "max_model_len": {"const": api.context_limit},
                            "tokens": {"type": "array", "items": _int(0, api.vocab - 1)},
                        },
                    }
                )
            },
            tokenize_request(api),
            gen_errors,
        ),
        ("post", "/detokenize"): Operation(
            "The text of token ids.",
            {"200": _json({"type": "object", "required": ["prompt"], "properties": {"prompt": {"type": "string"}}})},
            {
                "type": "object",
                "required": ["tokens"],
                "properties": {"tokens": {"type": "array", "items": _int(0, api.vocab - 1)}},
            },
            ("400",),
        ),
        ("post", "/v1/chat/completions"): Operation(
            "OpenAI chat completions (DeepSeek V4.1 / V4 prompt rendering, thinking / reasoning_effort).",
            {"200": _json_or_stream(CHAT_RESPONSE, CHAT_CHUNK)},
            chat_request(api),
            gen_errors,
        ),
        ("post", "/v1/responses"): Operation(
            "OpenAI Responses API (text, reasoning and function tools; stateless).",
            {
                "200": _json_or_named_events(
                    {
                        "type": "object",
                        "required": ["id", "object", "status"],
                        "properties": {"object": {"const": "response"}},
                    },
                    {"type": "object", "required": ["type", "message"], "properties": {"type": {"const": "error"}}},
                )
            },
            responses_request(api),
            gen_errors,
        ),
        ("post", "/v1/messages"): Operation(
            "Anthropic Messages API (text, thinking and tool use); errors in Anthropic's shape.",
            {
                "200": _json_or_named_events(
                    {
                        "type": "object",
                        "required": ["id", "type", "role", "content"],
                        "properties": {"type": {"const": "message"}},
                    },
                    {"$ref": "#/components/schemas/AnthropicError"},
                )
            },
            messages_request(api),
            gen_errors,
            "AnthropicError",
        ),
        ("post", "/v1/messages/count_tokens"): Operation(
            "Anthropic's token counting: the prompt tokens /v1/messages would report for this body.",
            {"200": _json(COUNT_TOKENS_RESPONSE)},
            count_tokens_request(api),
            gen_errors,
            "AnthropicError",
        ),
        ("post", "/v1/completions"): Operation(
            "OpenAI text completions.",
            {"200": _json_or_stream(COMPLETION_RESPONSE, COMPLETION_CHUNK)},
            completion_request(api),
            gen_errors,
        ),
    }


def _is_open(path: str) -> bool:
    return path in OPEN_PATHS


def _guard_errors(method: str, path: str, needs_api_key: bool) -> tuple[str, ...]:
    """What guard.py can answer on a route before it runs (the key, the drain, a POST body's type
    and size), and the 500 of a bug. The open routes skip the guard's checks."""
    if _is_open(path):
        return ("500",)
    key = ("401",) if needs_api_key else ()
    body = ("413", "415") if method == "post" else ()
    return (*key, *body, "500", "503")


def openapi_document(app: FastAPI, api: ServedApi) -> JsonSchema:
    """FastAPI's document of `app`'s routes with the hand-written operations laid over it."""
    doc = get_openapi(
        title=app.title,
        version=app.version,
        description="OpenAI-compatible API of dsv41rt; errors are OpenAI error objects.",
        routes=app.routes,
    )
    described = operations(api)
    for path, methods in doc.get("paths", {}).items():
        for method, op in methods.items():
            known = described.get((method, path))
            statuses = _guard_errors(method, path, api.needs_api_key)
            if known is not None:
                op["summary"] = known.summary
                op["responses"] = dict(known.responses)
                statuses = (*statuses, *known.errors)
                if known.body is not None:
                    op["requestBody"] = {"required": True, "content": {"application/json": {"schema": known.body}}}
            else:
                # Not described here: its answers are listed with their statuses, bodies undescribed
                # (a 400 for the body it reads, a 404 for a model not served).
                op["responses"] = {"200": UNDESCRIBED_OK}
                statuses = (*statuses, "400", "404") if method == "post" else statuses
            for status in sorted(statuses):
                op["responses"].setdefault(status, _error(status, known.error_schema if known else None))
            if api.needs_api_key and not _is_open(path):
                op["security"] = [{"bearer": []}]
    components = doc.setdefault("components", {})
    components.setdefault("schemas", {}).update({"Error": ERROR_BODY, "AnthropicError": ANTHROPIC_ERROR_BODY})
    if api.needs_api_key:
        components["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    return doc


def install_openapi(app: FastAPI, api: ServedApi) -> None:
    """Serve `openapi_document` at app.openapi_url (built once, at the first request: every route
    is registered by then)."""
    cache: list[JsonSchema] = []

    def document() -> JsonSchema:
        if not cache:
            cache.append(openapi_document(app, api))
        return cache[0]

    replace: Callable[[], JsonSchema] = document
    app.openapi = replace  # type: ignore[method-assign]  # FastAPI's documented way to customise it
