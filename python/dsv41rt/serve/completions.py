"""`/v1/completions` (OpenAI's text completions), beside the chat protocol (protocol.py): request
checks, incremental detokenization with stop strings, the legacy logprobs block and the response
objects. The route in app.py only moves outputs from the engine to the client.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from ..sampling import SamplingParams
from .protocol import (
    COMPLETION_FIELDS,
    ApiError,
    Tokenizers,
    _num,
    check_fields,
    generation_room,
    include_usage,
    sampling_extras,
)

COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


class StopStringDetokenizer:
    """Text of a growing token list, emitted in deltas: it holds back an incomplete UTF-8 sequence
    and any suffix that may be the start of a stop string, and cuts the text at the first stop
    string (which then finishes the request)."""

    def __init__(self, tok: Tokenizers, stop: list[str]) -> None:
        self.tok, self.stop = tok, stop
        self.tokens: list[int] = []
        self.emitted = 0  # characters already returned

    def _held_back(self, text: str) -> int:
        for n in range(min(len(text), max((len(x) for x in self.stop), default=0)), 0, -1):
            if any(x.startswith(text[-n:]) for x in self.stop):
                return n
        return 0

    def push(self, tokens: list[int], reason: str | None) -> tuple[str, str | None]:
        """The new text after `tokens` and the finish reason (`reason`, or "stop" at a stop string)."""
        self.tokens.extend(tokens)
        text = self.tok.decode(self.tokens)
        hits = [(text.find(x), x) for x in self.stop if x in text]
        if hits:
            text, reason = text[: min(hits)[0]], "stop"
        if reason is None:
            if text.endswith("\ufffd"):
                return "", None  # an incomplete UTF-8 sequence: wait for the next token
            text = text[: len(text) - self._held_back(text)]
        delta = text[self.emitted :]
        self.emitted = max(self.emitted, len(text))
        return delta, reason


@dataclass
class PreparedCompletion:
    model: str
    prompt: list[int]
    max_tokens: int
    sampling: SamplingParams
    stop: list[str]
    ignore_eos: bool
    stream: bool
    include_usage: bool
    logprobs: bool  # the legacy block: the chosen tokens' logprobs (+ top alternatives)


@dataclass
class CompletionStream:
    """One request's response state: text deltas, logprobs since the last chunk, usage."""

    prep: PreparedCompletion
    tok: Tokenizers
    id: str = field(default_factory=lambda: f"cmpl-{uuid.uuid4().hex}")
    created: int = 0
    _lp: list[tuple[int, float, dict[int, float]]] = field(default_factory=list)
    cached_tokens: int = 0  # prompt tokens the prefix cache served (known with the first output)

    def __post_init__(self) -> None:
        self.detok = StopStringDetokenizer(self.tok, self.prep.stop)

    def advance(self, item: Any) -> tuple[str, str | None]:
        """New text of an engine output and the finish reason (a stop string ends it here)."""
        self.cached_tokens = max(self.cached_tokens, item.cached_tokens)
        if self.prep.logprobs:
            tops = item.top_logprobs or [{}] * len(item.new_tokens)
            self._lp.extend(zip(item.new_tokens, item.logprobs, tops, strict=True))
        return self.detok.push(item.new_tokens, item.finish_reason if item.finished else None)

    def usage(self) -> dict:
        n_prompt, n_gen = len(self.prep.prompt), len(self.detok.tokens)
        return {
            "prompt_tokens": n_prompt,
            "completion_tokens": n_gen,
            "total_tokens": n_prompt + n_gen,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
            # DeepSeek's API names, as the chat route reports them (through the recipe)
            "prompt_cache_hit_tokens": self.cached_tokens,
            "prompt_cache_miss_tokens": n_prompt - self.cached_tokens,
        }

    def _logprobs_block(self) -> dict | None:
        """OpenAI's legacy completions logprobs for the tokens since the last call."""
        if not self.prep.logprobs:
            return None
        block: dict = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for t, lp, alts in self._lp:
            block["tokens"].append(self.tok.decode([t]))
            block["token_logprobs"].append(lp)
            block["top_logprobs"].append({self.tok.decode([a]): v for a, v in alts.items()})
            block["text_offset"].append(sum(len(x) for x in block["tokens"][:-1]))
        self._lp.clear()
        return block

    def _object(self, choices: list[dict], **extra: Any) -> dict:
        obj = {"id": self.id, "object": "text_completion", "created": self.created, "model": self.prep.model}
        return {**obj, "choices": choices, **extra}

    def chunk(self, text: str, reason: str | None) -> dict:
        choice = {"index": 0, "text": text, "logprobs": self._logprobs_block(), "finish_reason": reason}
        return self._object([choice])

    def usage_chunk(self) -> dict:
        return self._object([], usage=self.usage())

    def response(self, text: str, reason: str | None) -> dict:
        return {**self.chunk(text, reason or "length"), "usage": self.usage()}


class CompletionProtocol:
    def __init__(self, tok: Tokenizers, vocab: int, check_model) -> None:
        self.tok, self.vocab, self.check_model = tok, vocab, check_model

    def prepare(self, body: dict, context_limit: int, max_limit: int) -> PreparedCompletion:
        model = self.check_model(body)
        check_fields(body, COMPLETION_FIELDS)
        ids = self._prompt(body)
        for key, ok in (  # best_of: check_fields, as on the chat route
            ("n", _one),
            ("echo", lambda v: v is None or v is False),
            ("suffix", lambda v: v is None),
        ):
            if not ok(body.get(key)):
                raise ApiError(400, f"'{key}' is not supported (n = 1, no echo, no suffix)", key)
        # Without max_tokens: OpenAI's 16, within the server's limit (a limit below 16 made every such
        # request a 400 for a field it did not send; found by schema fuzzing).
        default = min(COMPLETION_DEFAULT_MAX_TOKENS, max_limit)
        max_tokens = _num(body, "max_tokens", default, 1, max_limit, integer=True)
        if len(ids) >= context_limit:
            raise ApiError(
                400,
                f"the prompt has {len(ids)} tokens; this model's context is {context_limit}",
                "prompt",
                "context_length_exceeded",
            )
        stop = body.get("stop")
        stop = [] if stop is None else [stop] if isinstance(stop, str) else stop
        if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop) or len(stop) > 16:
            raise ApiError(400, "'stop' must be a string or a list of up to 16 non-empty strings", "stop")
        top = _num(body, "logprobs", 0, 0, 20, integer=True)
        seed = body.get("seed")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 1 << 63):
            raise ApiError(400, "'seed' must be an integer in [0, 2^63)", "seed")
        sampling = sampling_extras(
            body, _num(body, "temperature", 1.0, 0.0, 2.0), _num(body, "top_p", 1.0, 0.0, 1.0), seed, top
        )
        flags = {}
        for key in ("ignore_eos", "stream"):
            flags[key] = body.get(key, False)
            if not isinstance(flags[key], bool):
                raise ApiError(400, f"'{key}' must be a boolean", key)
        asked = max_tokens if body.get("max_tokens") is not None else None  # no max_tokens: the default, clipped
        room = generation_room(asked, len(ids), context_limit, "max_tokens")
        return PreparedCompletion(
            model,
            ids,
            min(max_tokens, room),
            sampling,
            stop,
            flags["ignore_eos"],
            flags["stream"],
            include_usage(body),
            body.get("logprobs") is not None,  # 0: the chosen tokens' logprobs only
        )

    def _prompt(self, body: dict) -> list[int]:
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            ids = self.tok.encode(prompt)
        elif (
            isinstance(prompt, list)
            and prompt
            and all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < self.vocab for t in prompt)
        ):
            ids = list(prompt)
        else:
            raise ApiError(
                400, f"'prompt' must be a non-empty string or list of token ids in [0, {self.vocab})", "prompt"
            )
        if not ids:
            raise ApiError(400, "the prompt is empty", "prompt")
        return ids


def _one(v: Any) -> bool:
    return v is None or (type(v) is int and v == 1)
