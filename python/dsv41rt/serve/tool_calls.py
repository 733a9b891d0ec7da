"""Tool calls on /v1/chat/completions (issue 23): the request's tool settings, checked, and the
model's DSML tool-call markup as OpenAI tool calls.

Encoding and parsing are deepseek-recipe's, as for the rest of the chat path: its conversion renders
`tools` and past assistant `tool_calls` / `role: "tool"` results in the V4.1 encoding (the
`<｜DSML｜ calls>` block; a V4 checkpoint's encoding: `<｜DSML｜tool_calls>`), and its stream
processor (`parse_tool_calls`, either spelling) turns the model's block back into `tool_calls`
deltas and `finish_reason: "tool_calls"`, keeping the markup out of `content` and
`reasoning_content`. Its parser is incremental on the decoded text and holds back a possible
markup prefix, so any split of the markup across chunks or multi-token steps gives the same calls
(test_serve_tools.py feeds recorded outputs at every split point). This module adds what the
recipe leaves to the server:

- `ToolSettings.of`: the checks of `tools`, `tool_choice` and `parallel_tool_calls`, each a 400
  naming its field (the recipe's messages name some, not all, and accept names over 64 chars);
  `tool_choice` "required" or a named function forces a call: the recipe reports it as
  `inference_options.output_constraint`, grammar.py holds the output to a DSML calls block.
- `parallel_tool_calls: false`: at most the first call is returned (`ToolSettings.chunk` drops the
  deltas of later calls from a stream, `ToolSettings.response` trims a whole response); the same
  rule on Responses and Messages is single_call.py's.
- `parse_output` / `ToolCallAccumulator`: the parsed result as frozen dataclasses, for tests and
  callers that want the calls rather than the protocol's chunks.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import deepseek_recipe as dr

from .protocol import ApiError

TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def _bad(param: str, message: str) -> ApiError:
    return ApiError(400, f"'{param}' {message}", param)


def check_function(where: str, fn: dict, params_key: str = "parameters", params_required: bool = False) -> str:
    """The checks of one function declaration at `where` (its name, description, parameter schema
    under `params_key` and strict flag), shared by chat, Responses and Messages; returns its name."""
    name = fn.get("name")
    if not isinstance(name, str) or not TOOL_NAME.match(name):
        raise _bad(f"{where}.name", f"must match ^[a-zA-Z0-9_-]{{1,64}}$, got {name!r}")
    if fn.get("description") is not None and not isinstance(fn["description"], str):
        raise _bad(f"{where}.description", "must be a string")
    if params_required and fn.get(params_key) is None:
        raise _bad(f"{where}.{params_key}", "is required (a JSON Schema object)")
    if fn.get(params_key) is not None and not isinstance(fn[params_key], dict):
        raise _bad(f"{where}.{params_key}", "must be a JSON Schema object")
    if fn.get("strict") is not None and not isinstance(fn["strict"], bool):
        raise _bad(f"{where}.strict", "must be a boolean")
    return name


def check_tool_list(tools: Any, check: Callable[[str, Any], str], what: str = "function tools") -> None:
    """`tools` a list whose entries pass `check(where, tool)` (which returns the tool's name), no
    name twice."""
    if not isinstance(tools, list):
        raise _bad("tools", f"must be a list of {what}")
    names = [check(f"tools[{i}]", tool) for i, tool in enumerate(tools)]
    dup = next((n for i, n in enumerate(names) if n in names[:i]), None)
    if dup is not None:
        raise _bad("tools", f"names the function {dup!r} twice")


def check_forced_choice(tools: Any, name: Any, named: bool) -> None:
    """A `tool_choice` that forces a call (any / required, or a named tool, `name`): there must be
    tools, and a named one among them; the same on every route."""
    if not tools:
        raise _bad("tool_choice", "forces a tool call but 'tools' is empty or missing")
    if named:
        if not isinstance(name, str):
            raise _bad("tool_choice", "must name the function to call")
        names = [(t.get("function") or t).get("name") for t in tools if isinstance(t, dict)]
        if name not in names:
            raise _bad("tool_choice", f"names {name!r}, which is not among 'tools'")


def _check_chat_tool(where: str, tool: Any) -> str:
    if not isinstance(tool, dict):
        raise _bad(where, "must be an object")
    if tool.get("type") != "function":
        raise _bad(f"{where}.type", f'must be "function", got {tool.get("type")!r}')
    fn = tool.get("function")
    if not isinstance(fn, dict):
        raise _bad(f"{where}.function", "must be an object")
    return check_function(f"{where}.function", fn)


@dataclass(frozen=True)
class ToolSettings:
    """A chat request's tool settings. `offered`: tools are rendered into the prompt and calls are
    parsed (tools given and `tool_choice` not "none"; with "none" the recipe neither renders the
    tools nor parses markup, which then stays text). `parallel`: more than one call may be
    returned."""

    offered: bool
    parallel: bool

    @staticmethod
    def of(body: dict) -> ToolSettings:
        tools = body.get("tools")
        if tools is not None:
            check_tool_list(tools, _check_chat_tool)
        choice = body.get("tool_choice")
        if isinstance(choice, dict):
            if choice.get("type") != "function" or not isinstance(choice.get("function"), dict):
                raise _bad("tool_choice", 'must be {"type": "function", "function": {"name": ...}}')
            check_forced_choice(tools, choice["function"].get("name"), named=True)
        elif choice == "required":
            check_forced_choice(tools, None, named=False)
        elif choice not in (None, "auto", "none"):
            raise _bad("tool_choice", f'must be "auto", "none", "required" or a named function, got {choice!r}')
        parallel = body.get("parallel_tool_calls")
        if parallel is not None and not isinstance(parallel, bool):
            raise _bad("parallel_tool_calls", f"must be a boolean, got {parallel!r}")
        return ToolSettings(offered=bool(tools) and choice != "none", parallel=parallel is not False)

    def chunk(self, d: dict) -> bool:
        """Drop (in place) the tool-call deltas of calls after the first from a streamed chat chunk
        when parallel calls are off; False when nothing is left worth sending."""
        if self.parallel:
            return True
        keep = False
        for choice in d.get("choices") or []:
            delta = choice.get("delta") or {}
            calls = delta.get("tool_calls")
            if calls is not None:
                calls[:] = [c for c in calls if c.get("index", 0) == 0]
                if not calls:
                    del delta["tool_calls"]
            keep = (
                keep
                or choice.get("finish_reason") is not None
                or bool(choice.get("logprobs"))
                or any(v is not None for v in delta.values())
            )
        return keep or not d.get("choices") or d.get("usage") is not None

    def response(self, d: dict) -> None:
        """Trim (in place) a whole chat response to its first call when parallel calls are off."""
        if self.parallel:
            return
        for choice in d.get("choices") or []:
            calls = (choice.get("message") or {}).get("tool_calls")
            if calls:
                del calls[1:]


@dataclass(frozen=True)
class ParsedToolCall:
    id: str
    name: str
    arguments: str  # a JSON object, as text


@dataclass(frozen=True)
class ParsedOutput:
    content: str
    reasoning_content: str
    tool_calls: tuple[ParsedToolCall, ...]
    finish_reason: str | None


@dataclass
class _Call:
    id: str
    name: str
    arguments: list[str] = field(default_factory=list)


class ToolCallAccumulator:
    """Streamed chat chunks (their JSON as dicts) accumulated into a ParsedOutput, checking the
    OpenAI delta shape on the way: a call's first delta has its index (the next one), id, type
    "function" and name; later deltas of it only argument fragments."""

    def __init__(self) -> None:
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.calls: list[_Call] = []
        self.finish_reason: str | None = None

    def add(self, chunk: dict) -> None:
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            self.content.append(delta.get("content") or "")
            self.reasoning.append(delta.get("reasoning_content") or "")
            for call in delta.get("tool_calls") or []:
                self._add_call(call)
            self.finish_reason = choice.get("finish_reason") or self.finish_reason

    def _add_call(self, call: dict) -> None:
        index, fn = call["index"], call.get("function") or {}
        if index == len(self.calls):
            if call.get("type") != "function" or not call.get("id") or not fn.get("name"):
                raise ValueError(f"the first delta of call {index} lacks its id, type or name: {call}")
            self.calls.append(_Call(call["id"], fn["name"]))
        elif index != len(self.calls) - 1 or "id" in call or "name" in fn:
            raise ValueError(f"a delta out of order, or repeating a call's header: {call}")
        self.calls[index].arguments.append(fn.get("arguments") or "")

    def result(self) -> ParsedOutput:
        calls = tuple(ParsedToolCall(c.id, c.name, "".join(c.arguments)) for c in self.calls)
        return ParsedOutput("".join(self.content), "".join(self.reasoning), calls, self.finish_reason)


def parse_output(
    conversation: dr.ConversationRequest,
    tokenizer: dr.Tokenizer,
    steps: Iterable[str | Sequence[int]],
    finish: dr.InferenceFinishReason = dr.InferenceFinishReason.Stop,
) -> tuple[ParsedOutput, list[dict]]:
    """The model's output, given as steps (decoded text, or token ids as one engine step emits
    them), parsed as the chat route parses it: the recipe's stream processor with the request's
    parsing options. Returns the result and the streamed chunks it came from."""
    gen = dr.ChatCompletionRequest.chunk_generator(conversation, "chatcmpl-parse", "model")
    proc = dr.StreamProcessor(gen, conversation.parsing_options, tokenizer)
    events = proc.push(dr.InferenceChunk.ready(prompt_usage=dr.PromptUsage(prompt_tokens=0)))
    for step in steps:
        chunk = dr.InferenceChunk.text(step, 1) if isinstance(step, str) else dr.InferenceChunk.tokens(list(step))
        events += proc.push(chunk)
    events += proc.push(dr.InferenceChunk.finish(finish))
    events += proc.finish()
    chunks = [json.loads(e.to_json()) for e in events]
    acc = ToolCallAccumulator()
    for c in chunks:
        acc.add(c)
    return acc.result(), chunks
