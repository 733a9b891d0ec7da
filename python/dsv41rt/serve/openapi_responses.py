"""Response bodies of the chat and completion routes for the OpenAPI document (openapi_schema.py):
the non-streamed objects and the SSE chunks, as the routes write them (JSON Schema)."""

from __future__ import annotations

from typing import Any

JsonSchema = dict[str, Any]

USAGE: JsonSchema = {
    "type": "object",
    "required": ["prompt_tokens", "completion_tokens", "total_tokens"],
    "properties": {
        "prompt_tokens": {"type": "integer", "minimum": 0},
        "completion_tokens": {"type": "integer", "minimum": 0},
        "total_tokens": {"type": "integer", "minimum": 0},
        "prompt_tokens_details": {"type": ["object", "null"]},
        "completion_tokens_details": {"type": ["object", "null"]},
        # DeepSeek's API names for the prefix-cache split
        "prompt_cache_hit_tokens": {"type": "integer", "minimum": 0},
        "prompt_cache_miss_tokens": {"type": "integer", "minimum": 0},
    },
}

FINISH_REASON: JsonSchema = {"type": ["string", "null"], "enum": ["stop", "length", "tool_calls", None]}

# What an assistant message (a response's choice) and a delta (a chunk's) may hold.
_ASSISTANT_FIELDS: JsonSchema = {
    "role": {"const": "assistant"},
    "content": {"type": ["string", "null"]},
    "reasoning_content": {"type": ["string", "null"]},
    "tool_calls": {"type": ["array", "null"]},
}


def _chat_choice(key: str, shape: JsonSchema) -> JsonSchema:
    """A chat choice whose `key` ("message" in a response, "delta" in a chunk) is `shape` (its type
    and required keys) holding the assistant fields."""
    return {
        "type": "object",
        "required": ["index", key, "finish_reason"],
        "properties": {
            "index": {"type": "integer"},
            key: {**shape, "properties": _ASSISTANT_FIELDS},
            "logprobs": {"type": ["object", "null"]},
            "finish_reason": FINISH_REASON,
        },
    }


CHAT_RESPONSE: JsonSchema = {
    "type": "object",
    "required": ["id", "object", "created", "model", "choices", "usage"],
    "properties": {
        "id": {"type": "string"},
        "object": {"const": "chat.completion"},
        "created": {"type": "integer"},
        "model": {"type": "string"},
        "system_fingerprint": {"type": ["string", "null"]},
        "choices": {"type": "array", "items": _chat_choice("message", {"type": "object", "required": ["role"]})},
        "usage": USAGE,
    },
}

COMPLETION_RESPONSE: JsonSchema = {
    "type": "object",
    "required": ["id", "object", "created", "model", "choices", "usage"],
    "properties": {
        "id": {"type": "string"},
        "object": {"const": "text_completion"},
        "created": {"type": "integer"},
        "model": {"type": "string"},
        "choices": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["index", "text", "logprobs", "finish_reason"],
                "properties": {
                    "index": {"type": "integer"},
                    "text": {"type": "string"},
                    "logprobs": {
                        "type": ["object", "null"],
                        "required": ["tokens", "token_logprobs", "top_logprobs", "text_offset"],
                    },
                    "finish_reason": FINISH_REASON,
                },
            },
        },
        "usage": USAGE,
    },
}


CHAT_CHUNK: JsonSchema = {
    "type": "object",
    "required": ["id", "object", "created", "model", "choices"],
    "properties": {
        "id": {"type": "string"},
        "object": {"const": "chat.completion.chunk"},
        "created": {"type": "integer"},
        "model": {"type": "string"},
        "system_fingerprint": {"type": ["string", "null"]},
        "choices": {"type": "array", "items": _chat_choice("delta", {"type": "object"})},
        # null on every chunk when stream_options.include_usage asked for it, then a last chunk
        # with no choices and the usage
        "usage": {"anyOf": [USAGE, {"type": "null"}]},
    },
}

COMPLETION_CHUNK: JsonSchema = {
    "type": "object",
    "required": ["id", "object", "created", "model", "choices"],
    "properties": {
        **COMPLETION_RESPONSE["properties"],
        "usage": USAGE,  # only on the last chunk (no choices), when stream_options.include_usage asked
    },
}
