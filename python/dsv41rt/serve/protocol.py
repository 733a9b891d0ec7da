"""Request parsing and response building for the OpenAI-compatible API.

Chat completions go through DeepSeek's own `deepseek-recipe` (request conversion, prompt encoding,
thinking / reasoning-effort handling, streamed output parsing into `reasoning_content` and
`content`, stop strings, logprobs, usage), so prompts are rendered exactly as DeepSeek renders them.
The encoding is the checkpoint's model's (`ChatFormat`, from config.json's `model_type`): V4.1's
`DeepseekV41Encoding`, or V4's `DeepseekV4Encoding` for a `deepseek_v4` checkpoint.
Text completions encode the prompt with the checkpoint's tokenizer and decode incrementally.
"""

from __future__ import annotations

import math
import os
import random
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import deepseek_recipe as dr

from ..sampling import Grammar, SamplingParams
from .config import V4_MODEL_TYPE, model_type_of

EOS_TOKEN = "<｜end▁of▁sentence｜>"
# Tokens the V4.1 chat encoding needs as single added tokens (checked at start).
REQUIRED_SPECIAL_TOKENS = (
    "<｜begin▁of▁sentence｜>",
    EOS_TOKEN,
    "<｜System｜>",
    "<｜User｜>",
    "<｜Assistant｜>",
    "<think>",
    "</think>",
)
# V4's encoding has no system token (the system prompt follows the BOS as plain text; V4's
# tokenizer has no `<｜System｜>`); the others are the same.
V4_REQUIRED_SPECIAL_TOKENS = tuple(t for t in REQUIRED_SPECIAL_TOKENS if t != "<｜System｜>")


@dataclass(frozen=True)
class ChatFormat:
    """What the chat path takes from the checkpoint's model: deepseek-recipe's prompt encoding and
    the model version its conversion targets, the tokens the encoding needs as single added tokens,
    and how the DSML tool-call block is spelled (grammar.py writes it for a forced call; the
    recipe's stream parser reads either spelling). `model_type`: config.json's."""

    model_type: str
    family: str  # for messages: "DeepSeek-V4.1"
    version: dr.ModelVersion
    encoding: Callable[[], Any]  # dr.DeepseekV41Encoding / dr.DeepseekV4Encoding
    special_tokens: tuple[str, ...]
    dsml_block: str  # the block's name: V4.1 `<｜DSML｜ calls>`, V4 `<｜DSML｜tool_calls>`
    dsml_space: str  # between the marker and the element name: V4.1 " ", V4 ""


V41_FORMAT = ChatFormat(
    "deepseek_v41",
    "DeepSeek-V4.1",
    dr.ModelVersion.DeepseekV41Flash,
    dr.DeepseekV41Encoding,
    REQUIRED_SPECIAL_TOKENS,
    "calls",
    " ",
)
V4_FORMAT = ChatFormat(
    V4_MODEL_TYPE,
    "DeepSeek-V4",
    dr.ModelVersion.DeepseekV4Pro,
    dr.DeepseekV4Encoding,
    V4_REQUIRED_SPECIAL_TOKENS,
    "tool_calls",
    "",
)
CHAT_FORMATS = {f.model_type: f for f in (V41_FORMAT, V4_FORMAT)}


def chat_format(checkpoint: str) -> ChatFormat:
    """The chat format of a checkpoint's model: V4's for `model_type: deepseek_v4`, else V4.1's
    (a config the runtime cannot read, or a model type it does not know, is refused by its load)."""
    return CHAT_FORMATS.get(model_type_of(checkpoint) or "", V41_FORMAT)


class ApiError(Exception):
    """An OpenAI-style error: HTTP status and {"error": {message, type, param, code}}."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    @property
    def type(self) -> str:
        return {
            400: "invalid_request_error",
            401: "authentication_error",
            404: "not_found_error",
            405: "invalid_request_error",
            413: "invalid_request_error",
            415: "invalid_request_error",
            503: "service_unavailable",
        }.get(self.status, "server_error")

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def _num(body: dict, key: str, default: float | None, lo: float, hi: float, integer: bool = False) -> Any:
    v = body.get(key, default)
    if v is None:
        return default
    ok = isinstance(v, int) if integer else isinstance(v, (int, float))
    if isinstance(v, bool) or not ok or (isinstance(v, float) and not math.isfinite(v)):
        raise ApiError(400, f"'{key}' must be {'an integer' if integer else 'a number'}, got {v!r}", key)
    if not lo <= v <= hi:
        raise ApiError(400, f"'{key}' must be in [{lo}, {hi}], got {v!r}", key)
    return v


def _token_list(body: dict, key: str, vocab: int) -> list[int]:
    v = body.get(key)
    if v is None:
        return []
    if not isinstance(v, list) or not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in v):
        raise ApiError(400, f"'{key}' must be a list of token ids in [0, {vocab})", key)
    return list(v)


def generation_room(asked: int | None, n_prompt: int, context_limit: int, param: str) -> int:
    """The tokens the context leaves after the prompt; a 400 naming `param` when the request asked
    for more (vLLM's 400, not a silent clip; issue 23 D6). `asked` None: nothing asked, no check."""
    room = context_limit - n_prompt
    if asked is not None and asked > room:
        raise ApiError(
            400,
            f"max_tokens is {asked}, but the prompt has {n_prompt} tokens and this model's context is "
            f"{context_limit}: at most {room} can be generated",
            param,
        )
    return room


# Request fields each route reads (issue 23 D6: a field the server does not apply is a 400 naming
# it, never silently ignored). `user`, `metadata` and `store` change nothing in a self-hosted server.
_COMMON_FIELDS = frozenset(
    "model max_tokens temperature top_p top_k min_p presence_penalty frequency_penalty repetition_penalty seed"
    " stop stop_token_ids stream stream_options logprobs ignore_eos user metadata store n".split()
)
CHAT_FIELDS = _COMMON_FIELDS | frozenset(
    "messages max_completion_tokens top_logprobs tools tool_choice parallel_tool_calls thinking reasoning_effort"
    " response_format logit_bias best_of chat_template_kwargs".split()
)
COMPLETION_FIELDS = _COMMON_FIELDS | frozenset("prompt best_of echo suffix logit_bias".split())


def check_known_fields(body: dict, allowed: frozenset[str], reasons: dict[str, str] | None = None) -> None:
    """A 400 naming the first field outside `allowed`, with its entry of `reasons` as the message
    when it has one (why the server does not apply it)."""
    for key in body:
        if key not in allowed:
            raise ApiError(400, (reasons or {}).get(key, f"'{key}' is not supported by this server"), key)


def check_type(body: dict, key: str, kind: type | tuple[type, ...], what: str) -> None:
    """A 400 naming `key` when it is present, not null and not of `kind` (`what` says which)."""
    v = body.get(key)
    if v is not None and (not isinstance(v, kind) or (isinstance(v, bool) and kind is not bool)):
        raise ApiError(400, f"'{key}' must be {what}, got {v!r}", key)


def check_fields(body: dict, allowed: frozenset[str]) -> None:
    """A 400 naming the first field this route does not apply (unknown, or a value not honoured yet)."""
    check_known_fields(body, allowed)
    check_response_format(body.get("response_format"))
    from .tool_calls import ToolSettings  # here: tool_calls imports this module

    ToolSettings.of(body)  # tools, tool_choice (a forced call: grammar.py), parallel_tool_calls
    if body.get("logit_bias") not in (None, {}):
        raise ApiError(400, "'logit_bias' is not applied yet", "logit_bias")
    if body.get("chat_template_kwargs") not in (None, {}):
        raise ApiError(
            400, "'chat_template_kwargs' is not applied: use 'thinking' or 'reasoning_effort'", "chat_template_kwargs"
        )
    if body.get("best_of") not in (None, 1):
        raise ApiError(400, "'best_of' is not supported (one sequence per request)", "best_of")
    if body.get("store") not in (None, False):
        raise ApiError(400, "'store' is not supported (nothing is stored)", "store")


def check_response_format(rf: Any) -> None:
    """`response_format`: text, json_object or json_schema ({"json_schema": {"name", "schema",
    "strict"}}), held to by grammar-constrained decoding (grammar.py); a 400 naming what is wrong."""
    if rf is None:
        return
    if not isinstance(rf, dict) or rf.get("type") not in ("text", "json_object", "json_schema"):
        raise ApiError(400, "'response_format.type' must be text, json_object or json_schema", "response_format")
    if rf["type"] != "json_schema":
        return
    js = rf.get("json_schema")
    if not isinstance(js, dict) or not isinstance(js.get("name"), str):
        raise ApiError(400, "'response_format.json_schema' must be an object with a 'name'", "response_format")
    if js.get("schema") is not None and not isinstance(js["schema"], dict):
        raise ApiError(400, "'response_format.json_schema.schema' must be a JSON Schema object", "response_format")
    if js.get("strict") is not None and not isinstance(js["strict"], bool):
        raise ApiError(400, "'response_format.json_schema.strict' must be a boolean", "response_format")


def _parallel_off(body: dict) -> bool:
    """Anthropic's `tool_choice.disable_parallel_tool_use: true` (Messages)."""
    choice = body.get("tool_choice")
    return isinstance(choice, dict) and choice.get("disable_parallel_tool_use") is True


def include_usage(body: dict) -> bool:
    """`stream_options.include_usage` (a boolean in an object), checked: a 400 naming it otherwise."""
    opts = body.get("stream_options")
    if opts is None:
        return False
    if not isinstance(opts, dict):
        raise ApiError(400, "'stream_options' must be an object", "stream_options")
    flag = opts.get("include_usage", False)
    if not isinstance(flag, bool):
        raise ApiError(400, "'stream_options.include_usage' must be a boolean", "stream_options")
    return flag


def sampling_extras(
    body: dict, temperature: float, top_p: float, seed: int | None, top_logprobs: int
) -> SamplingParams:
    """The vLLM/SGLang sampling extras on top of what conversion resolved."""
    # top_p is used as an FP32: a value that is 0 there (0, or e.g. 1e-50) would reach the sampler
    # and fail as a 500 (issue 23 D5).
    if not struct.unpack("f", struct.pack("f", top_p))[0] > 0:
        raise ApiError(400, f"'top_p' must be > 0 (as a 32-bit float), got {top_p!r}", "top_p")
    return SamplingParams(
        temperature=temperature,
        top_p=top_p,
        top_k=_num(body, "top_k", 0, -1, 1 << 30, integer=True),
        min_p=_num(body, "min_p", 0.0, 0.0, 1.0),
        presence_penalty=_num(body, "presence_penalty", 0.0, -2.0, 2.0),
        frequency_penalty=_num(body, "frequency_penalty", 0.0, -2.0, 2.0),
        repetition_penalty=_num(body, "repetition_penalty", 1.0, 0.01, 10.0),
        seed=seed if seed is not None else random.getrandbits(63),
        top_logprobs=top_logprobs,
    )


@dataclass(frozen=True)
class PreparedChat:
    conversation: dr.ConversationRequest
    prompt: list[int]
    max_tokens: int
    sampling: SamplingParams
    stop_token_ids: list[int]
    ignore_eos: bool
    stream: bool
    logprobs: bool
    grammar: Grammar | None = None  # response_format / a forced tool call (grammar.py)


@dataclass(frozen=True)
class RequestedSampling:
    """The request's own temperature and top_p (None: not given), checked before the recipe's
    conversion, which overrides them in thinking mode and rejects a wrong type without naming it."""

    temperature: float | None
    top_p: float | None

    @staticmethod
    def of(body: dict, max_temperature: float) -> RequestedSampling:
        return RequestedSampling(
            _num(body, "temperature", None, 0.0, max_temperature), _num(body, "top_p", None, 0.0, 1.0)
        )


@dataclass(frozen=True)
class OutputBudget:
    """The tokens a request may generate: what it asked (None: `default_max`) under the field
    `param` that asked it, within the context after the prompt."""

    asked: int | None
    param: str
    context_limit: int
    default_max: int


# The recipe's protocol requests: each converts to the same ConversationRequest.
RecipeRequest = dr.ChatCompletionRequest | dr.ResponsesRequest | dr.MessagesRequest


RecipeRequestT = TypeVar("RecipeRequestT", dr.ChatCompletionRequest, dr.ResponsesRequest, dr.MessagesRequest)


def recipe_request(request_type: type[RecipeRequestT], body: dict) -> RecipeRequestT:
    """The recipe's request object for `body`; a 400 for a body it cannot read (its constructor
    parses the whole body; the types the route checks itself have named fields before this)."""
    try:
        return request_type(body)
    except (dr.ConversionError, ValueError, TypeError, KeyError, OverflowError) as err:
        raise ApiError(400, f"invalid request: {err}") from None


class Tokenizers:
    """The checkpoint's tokenizer for the recipe (encoding, stream parsing) and for plain decoding,
    and the chat format of its model (`format`)."""

    def __init__(self, checkpoint: str) -> None:
        import tokenizers

        path = os.path.join(checkpoint, "tokenizer.json")
        if not os.path.exists(path):
            raise FileNotFoundError(f"{checkpoint}: no tokenizer.json (the server needs the model's tokenizer)")
        self.format = chat_format(checkpoint)
        self.recipe = dr.Tokenizer.from_file(path)
        self.hf = tokenizers.Tokenizer.from_file(path)
        missing = [t for t in self.format.special_tokens if self.hf.token_to_id(t) is None]
        if missing:
            raise ValueError(
                f"{path}: the {self.format.family} chat encoding needs these tokens as single added tokens, "
                "missing: " + ", ".join(missing)
            )

    def encode(self, text: str) -> list[int]:
        return self.hf.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self.hf.decode(ids, skip_special_tokens=False)


class ChatProtocol:
    def __init__(self, tok: Tokenizers, names: tuple[str, ...], thinking: bool, vocab: int) -> None:
        self.tok, self.names, self.vocab = tok, names, vocab
        self.format = tok.format
        opts = dr.ConversionOptions(default_thinking_mode=thinking)
        for name in names:
            opts = opts.with_model_alias(name, self.format.version)
        self.options = opts
        self.encoding = self.format.encoding().with_tokenizer(tok.recipe)
        self.thinking_end_id = tok.hf.token_to_id("</think>")  # ends the reasoning (checked at start)
        self.thinking_start_id = tok.hf.token_to_id("<think>")  # a prompt ending in it: thinking mode
        self.eos_id = tok.hf.token_to_id(EOS_TOKEN)

    def check_model(self, body: dict) -> str:
        model = body.get("model")
        if not isinstance(model, str):
            raise ApiError(400, "'model' is required and must be a string", "model")
        if model not in self.names:
            raise ApiError(
                404, f"The model '{model}' does not exist; served: {', '.join(self.names)}", "model", "model_not_found"
            )
        return model

    def prepare(self, body: dict, context_limit: int, default_max: int, max_limit: int) -> PreparedChat:
        self.check_model(body)
        check_fields(body, CHAT_FIELDS)
        # Checked before the recipe's conversion, which rejects a wrong type without naming the field.
        asked_sampling = RequestedSampling.of(body, max_temperature=2.0)
        from .grammar import split_forced_choice  # here: grammar imports this module

        recipe_body, forced = split_forced_choice(body)
        conv, prompt = self.encode(recipe_request(dr.ChatCompletionRequest, recipe_body))
        asked, param = conv.inference_options.max_tokens, "max_tokens"
        if asked is not None and asked > max_limit:
            raise ApiError(400, f"'max_tokens' must be <= {max_limit}, got {asked}", "max_tokens")
        if body.get("max_completion_tokens") is not None:  # OpenAI's current name; wins, as in vLLM
            asked, param = _num(body, "max_completion_tokens", 0, 1, max_limit, integer=True), "max_completion_tokens"
        budget = OutputBudget(asked, param, context_limit, default_max)
        return self.prepared(body, conv, prompt, asked_sampling, budget, "messages", forced)

    def encode(self, request: RecipeRequest) -> tuple[dr.ConversationRequest, list[int]]:
        """The recipe's conversion of a protocol request (chat, Responses, Messages) and the prompt's
        token ids in the model's encoding (`ChatFormat`); a 400 for what either rejects."""
        try:
            conv = request.convert(self.options)
        except (dr.ConversionError, ValueError, TypeError, KeyError, OverflowError) as err:
            raise ApiError(400, f"invalid request: {err}") from None
        try:
            prompt = self.encoding.encode(conv.conversation)
        except RuntimeError as err:
            raise ApiError(400, f"cannot encode the conversation: {err}") from None
        return conv, prompt

    def prepared(
        self,
        body: dict,
        conv: dr.ConversationRequest,
        prompt: list[int],
        asked_sampling: RequestedSampling,
        budget: OutputBudget,
        prompt_param: str,
        forced: list[dict] | None = None,
    ) -> PreparedChat:
        """The engine request of a converted conversation (any of the recipe's protocols): the
        output budget, the sampling and our extras. `prompt_param` is the field a too long prompt
        is blamed on; `forced`: the tools a forced `tool_choice` allows (grammar.split_forced_choice)."""
        context_limit = budget.context_limit
        if len(prompt) >= context_limit:
            raise ApiError(
                400,
                f"the prompt has {len(prompt)} tokens; this model's context is {context_limit}",
                prompt_param,
                "context_length_exceeded",
            )
        room = generation_room(budget.asked, len(prompt), context_limit, budget.param)
        max_tokens = min(budget.asked or budget.default_max, room)
        io = conv.inference_options
        top = io.top_logprobs or 0
        # The request's temperature and top_p apply in both modes, as in vLLM: deepseek-recipe resolves
        # thinking mode to temperature 1 / top_p 0.95 and drops top_p without it, silently (issue 23
        # D6). Without them the recipe's defaults stand.
        temperature = asked_sampling.temperature
        if temperature is None:
            temperature = io.temperature if io.temperature is not None else 1.0
        top_p = asked_sampling.top_p
        if top_p is None:
            top_p = io.top_p if io.top_p is not None else 1.0
        sampling = sampling_extras(body, float(temperature), float(top_p), io.seed, top if io.logprobs else 0)
        ignore_eos = body.get("ignore_eos", False)
        if not isinstance(ignore_eos, bool):
            raise ApiError(400, "'ignore_eos' must be a boolean", "ignore_eos")
        from .grammar import output_grammar  # here: grammar imports this module

        thinking = bool(prompt) and prompt[-1] == self.thinking_start_id
        parallel = body.get("parallel_tool_calls") is not False and not _parallel_off(body)
        grammar = output_grammar(
            body,
            io.output_constraint,
            forced,
            parallel,
            self.thinking_end_id if thinking else None,
            max_tokens,
            self.format,
        )
        return PreparedChat(
            conv,
            prompt,
            max_tokens,
            sampling,
            _token_list(body, "stop_token_ids", self.vocab),
            ignore_eos,
            conv.stream,
            bool(io.logprobs),
            grammar,
        )

    def processor(self, prep: PreparedChat, request_id: str, model: str) -> dr.StreamProcessor:
        gen = dr.ChatCompletionRequest.chunk_generator(prep.conversation, request_id, model)
        return dr.StreamProcessor(gen, prep.conversation.parsing_options, self.tok.recipe)


def tokens_chunk(out: Any, logprobs: bool) -> dr.InferenceChunk:
    """An engine step output as the recipe's `tokens` chunk (with logprobs when asked)."""
    if not logprobs:
        return dr.InferenceChunk.tokens(out.new_tokens)
    lps = [
        (float(lp), sorted(top.items(), key=lambda kv: -kv[1]))
        for lp, top in zip(out.logprobs, out.top_logprobs or [{}] * len(out.new_tokens), strict=True)
    ]
    return dr.InferenceChunk.tokens(out.new_tokens, lps)


def reasoning_logprobs_in_content(d: dict) -> None:
    """Put (in place) a chat chunk's or response's reasoning-token logprobs where vLLM puts them:
    in `logprobs.content`, before the content tokens' (generation order). The recipe writes them
    under `logprobs.reasoning_content`, a key OpenAI's logprobs object does not have, so clients
    reading `logprobs.content` missed the reasoning tokens; vLLM gives every generated token's
    logprob in `content`, reasoning or not (a thinking model's `</think>` token aside here: the
    recipe writes no logprob for it)."""
    for choice in d.get("choices") or []:
        lp = choice.get("logprobs")
        if isinstance(lp, dict) and "reasoning_content" in lp:
            reasoning = lp.pop("reasoning_content") or []
            lp["content"] = reasoning + (lp.get("content") or [])


FINISH = {"length": dr.InferenceFinishReason.Length, "stop": dr.InferenceFinishReason.Stop}


@dataclass(frozen=True)
class UsageKeys:
    """Where a protocol's usage object counts generated tokens: the output count, the total (None:
    the protocol has none) and the details object with `reasoning_tokens` (None: none)."""

    output: str
    total: str | None
    details: str | None


CHAT_USAGE = UsageKeys("completion_tokens", "total_tokens", "completion_tokens_details")


def count_held_tail(usage: dict, generated: int, prep: PreparedChat, keys: UsageKeys = CHAT_USAGE) -> None:
    """Make the recipe's `usage` count all `generated` tokens (in place).

    The recipe counts a `tokens` chunk's tokens when it emits their text; tokens whose text ends in
    an incomplete UTF-8 sequence (a byte-level token such as "Ľ", the first half of a character)
    wait for the next tokens, and at the finish those still waiting are dropped, text and count.
    So a request whose last sampled token was such a byte reported one completion token fewer than
    the engine generated (max_tokens 4, ignore_eos: completion_tokens 3, finish_reason "length").
    The missing tokens are added to the output and total counts, and to reasoning_tokens when the
    stream was still in its reasoning: it started there and every token counted so far was
    reasoning (the `</think>` that ends it is counted as content). The same for every protocol the
    recipe writes (`keys` names its fields)."""
    missing = generated - usage.get(keys.output, generated)
    if missing <= 0:
        return
    counted = usage[keys.output]
    usage[keys.output] = counted + missing
    if keys.total is not None:
        usage[keys.total] = usage.get(keys.total, 0) + missing
    details = usage.get(keys.details) if keys.details is not None else None
    stage = prep.conversation.parsing_options.thinking_initial_stage
    if isinstance(details, dict) and stage is not None and stage.starts_in_reasoning():
        if details.get("reasoning_tokens") == counted:
            details["reasoning_tokens"] = counted + missing
