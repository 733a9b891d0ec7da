"""Tool use on /v1/messages (Anthropic) and /v1/responses (OpenAI Responses), issue 23: the routes'
own handlers fed recorded V4.1 DSML outputs by a fake engine in multi-token steps (the tiny random
model almost never calls a tool), streamed and not: a call is a `tool_use` block after the thinking
and text blocks (`stop_reason: "tool_use"`, `input_json_delta`s) or a `function_call` output item
(`response.function_call_arguments.delta` / `.done`); past calls and their results render into the
prompt deepseek-recipe renders for the same conversation; and the HTTP surface with the official
`anthropic` and `openai` clients (a request with a tool, streamed and not; a tool conversation;
`tool_choice` that would force a call and bad tool definitions as 400s naming the field)."""

from __future__ import annotations

import asyncio
import json
import random
from types import SimpleNamespace

import anthropic
import deepseek_recipe as dr
import httpx
import openai
import pytest
from dsv41rt.serve.messages_api import MessagesApi
from dsv41rt.serve.responses_api import ResponsesApi
from serve_harness import LiveServer
from test_serve_tools import RECORDED, TOOLS, D, _FakeEngine, engine_outputs

MODEL = "dsv41rt-tiny-v41"
# The chat fixtures' tools in each API's shape.
ANTHROPIC_TOOLS = [
    {
        "name": t["function"]["name"],
        "description": t["function"].get("description", ""),
        "input_schema": t["function"]["parameters"],
    }
    for t in TOOLS
]
RESPONSES_TOOLS = [{"type": "function", **t["function"]} for t in TOOLS]
# Recorded outputs with at least one call: (thinking, text, reasoning, content, calls).
WITH_CALLS = [(r[1], r[2], *r[3]) for r in RECORDED if r[3][2]]
NAMES = [r[0] for r in RECORDED if r[3][2]]


def _steps(ids: list[int], seed: int) -> list[list[int]]:
    rng, steps, i = random.Random(seed), [], 0
    while i < len(ids):
        n = rng.randint(1, 8)
        steps.append(ids[i : i + n])
        i += n
    return steps


class _NotLeaving:
    async def is_disconnected(self) -> bool:
        return False


def _run_route(api_type, chat, tok, body: dict, steps: list[list[int]]) -> tuple[list[tuple[str, dict]], int]:
    """The route's handler (`MessagesApi` / `ResponsesApi`) for `body`, its engine a fake that
    emits `steps`: the SSE events (name, data) of a stream, or ("", the JSON) of a response."""

    async def go() -> tuple[list[tuple[str, dict]], int]:
        cfg = SimpleNamespace(max_tokens_limit=1 << 20, default_max_tokens=64)
        state = SimpleNamespace(active=0, tok=tok, chat=chat, engine=_FakeEngine(), cfg=cfg, context_limit=1 << 20)
        req = engine_outputs(steps)
        response = await api_type(state, lambda *a: req).handle(body, _NotLeaving())
        if not body.get("stream"):
            return [("", json.loads(response.body))], state.active
        text = "".join([part async for part in response.body_iterator])
        events = []
        for frame in text.strip().split("\n\n"):
            name, data = frame.split("\n")
            events.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
        return events, state.active

    events, active = asyncio.run(go())
    assert active == 0
    return events


def _messages_body(thinking: bool, **extra) -> dict:
    mode = {"thinking": {"type": "enabled", "budget_tokens": 100} if thinking else {"type": "disabled"}}
    msgs = [{"role": "user", "content": "hi"}]
    return {"model": MODEL, "max_tokens": 256, "messages": msgs, "tools": ANTHROPIC_TOOLS, **mode, **extra}


def _responses_body(thinking: bool, **extra) -> dict:
    effort = {} if thinking else {"reasoning": {"effort": "none"}}
    return {"model": MODEL, "input": "hi", "tools": RESPONSES_TOOLS, **effort, **extra}


@pytest.mark.parametrize("thinking,text,reasoning,content,calls", WITH_CALLS, ids=NAMES)
def test_messages_route_writes_tool_use_blocks(chat, tok, thinking, text, reasoning, content, calls) -> None:
    ids = tok.encode(text)
    for seed in range(3):
        steps = _steps(ids, seed)
        [(_, message)] = _run_route(MessagesApi, chat, tok, _messages_body(thinking), steps)
        kinds = (["thinking"] if reasoning else []) + (["text"] if content else []) + ["tool_use"] * len(calls)
        assert [b["type"] for b in message["content"]] == kinds, message
        assert message["stop_reason"] == "tool_use", message
        uses = [b for b in message["content"] if b["type"] == "tool_use"]
        assert [(u["name"], u["input"]) for u in uses] == calls
        assert all(u["id"].startswith("toolu_") and len(u["id"]) > 8 for u in uses)
        assert len({u["id"] for u in uses}) == len(uses)
        if content:
            assert message["content"][kinds.index("text")]["text"] == content
        assert D not in json.dumps(message)

        events = _run_route(MessagesApi, chat, tok, _messages_body(thinking, stream=True), steps)
        assert all(name == data["type"] for name, data in events)
        names = [name for name, _ in events]
        assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"], names
        assert events[-2][1]["delta"]["stop_reason"] == "tool_use"
        starts = [d for n, d in events if n == "content_block_start"]
        assert [s["content_block"]["type"] for s in starts] == kinds
        for start in starts:
            index, block = start["index"], start["content_block"]
            deltas = [d["delta"] for n, d in events if n == "content_block_delta" and d["index"] == index]
            assert sum(1 for n, d in events if n == "content_block_stop" and d["index"] == index) == 1
            if block["type"] != "tool_use":
                continue
            assert block["input"] == {} and block["id"].startswith("toolu_")
            assert deltas and all(d["type"] == "input_json_delta" for d in deltas)
            use = uses[starts.index(start) - len(kinds) + len(uses)]
            assert (block["name"], json.loads("".join(d["partial_json"] for d in deltas))) == (
                use["name"],
                use["input"],
            )
        # Blocks do not overlap: each stops before the next starts.
        order = [(n, d.get("index")) for n, d in events if n in ("content_block_start", "content_block_stop")]
        assert order == [(n, i) for i in range(len(kinds)) for n in ("content_block_start", "content_block_stop")]


@pytest.mark.parametrize("thinking,text,reasoning,content,calls", WITH_CALLS, ids=NAMES)
def test_responses_route_writes_function_call_items(chat, tok, thinking, text, reasoning, content, calls) -> None:
    ids = tok.encode(text)
    for seed in range(3):
        steps = _steps(ids, seed)
        [(_, response)] = _run_route(ResponsesApi, chat, tok, _responses_body(thinking), steps)
        kinds = (["reasoning"] if reasoning else []) + (["message"] if content else []) + ["function_call"] * len(calls)
        assert [o["type"] for o in response["output"]] == kinds, response
        assert response["status"] == "completed"
        fcs = [o for o in response["output"] if o["type"] == "function_call"]
        assert [(f["name"], json.loads(f["arguments"])) for f in fcs] == calls
        for f in fcs:
            assert isinstance(f["arguments"], str) and f["status"] == "completed"
            assert f["id"] and f["call_id"].startswith("call_") and f["id"] != f["call_id"]
        assert D not in json.dumps(response)

        events = _run_route(ResponsesApi, chat, tok, _responses_body(thinking, stream=True), steps)
        assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
        assert all(name == data["type"] for name, data in events)
        assert events[-1][0] == "response.completed"
        assert [o["type"] for o in events[-1][1]["response"]["output"]] == kinds
        for f in fcs:
            index = response["output"].index(f)
            mine = [(n, d) for n, d in events if d.get("output_index") == index]
            names = [n for n, _ in mine]
            assert names[0] == "response.output_item.added" and names[-1] == "response.output_item.done", names
            assert names[-2] == "response.function_call_arguments.done"
            assert set(names[1:-2]) == {"response.function_call_arguments.delta"}
            added, done = mine[0][1]["item"], mine[-1][1]["item"]
            assert added["type"] == "function_call" and added["name"] == f["name"] and added["arguments"] == ""
            streamed = "".join(d["delta"] for _, d in mine[1:-2])
            assert streamed == mine[-2][1]["arguments"] == done["arguments"]
            assert json.loads(streamed) == json.loads(f["arguments"])


def _api(api_type, chat):
    cfg = SimpleNamespace(max_tokens_limit=1 << 20, default_max_tokens=64)
    return api_type(SimpleNamespace(chat=chat, cfg=cfg, context_limit=1 << 20), None)


def _render(chat, conv: dr.ConversationRequest) -> str:
    return chat.encoding.render_conversation(conv.conversation).prompt


def _direct_prompt(chat, thinking: bool, reasoning: str, content: str, calls: list, ids: list[str]) -> str:
    """The prompt deepseek-recipe renders from its own types for: user "hi", the assistant turn
    with the calls, one result per call, then user "next"."""
    tools = [
        dr.ToolDefinition(t["function"]["name"], t["function"].get("description"), t["function"]["parameters"])
        for t in TOOLS
    ]
    tool_calls = [dr.ToolCall(i, name, json.dumps(args)) for i, (name, args) in zip(ids, calls, strict=True)]
    messages = [
        dr.UserMessage("hi"),
        dr.AssistantMessage(content, reasoning if thinking else None, tool_calls),
        *[dr.ToolMessage(f"result {k}", i) for k, i in enumerate(ids)],
        dr.UserMessage("next"),
    ]
    return chat.encoding.render_conversation(dr.Conversation(messages, thinking_mode=thinking, tools=tools)).prompt


@pytest.mark.parametrize("thinking,text,reasoning,content,calls", WITH_CALLS, ids=NAMES)
def test_tool_history_renders_the_recipes_prompt(chat, tok, thinking, text, reasoning, content, calls) -> None:
    """A parsed turn sent back (Messages: thinking, text, tool_use blocks, then tool_result blocks;
    Responses: reasoning, message, function_call items, then function_call_output items) renders
    the prompt the recipe renders from its own types, and holds the model's output as it wrote it."""
    [(_, message)] = _run_route(MessagesApi, chat, tok, _messages_body(thinking), [tok.encode(text)])
    results = [
        {"type": "tool_result", "tool_use_id": b["id"], "content": f"result {k}"}
        for k, b in enumerate(b for b in message["content"] if b["type"] == "tool_use")
    ]
    body = _messages_body(thinking)
    body["messages"] = [
        *body["messages"],
        {"role": "assistant", "content": message["content"]},
        {"role": "user", "content": [*results, {"type": "text", "text": "next"}]},
    ]
    prompt = _render(chat, _api(MessagesApi, chat).prepare(body).conversation)
    ids = [r["tool_use_id"] for r in results]
    assert prompt == _direct_prompt(chat, thinking, reasoning, content, calls, ids)
    assert text.split("</think>")[-1] + "<｜end▁of▁sentence｜>" in prompt

    [(_, response)] = _run_route(ResponsesApi, chat, tok, _responses_body(thinking), [tok.encode(text)])
    outputs = [
        {"type": "function_call_output", "call_id": o["call_id"], "output": f"result {k}"}
        for k, o in enumerate(o for o in response["output"] if o["type"] == "function_call")
    ]
    body = _responses_body(thinking)
    # The output as the client got it (reasoning item included: the openai client's tool loop
    # appends `response.output` to its input), then the calls' outputs.
    history = [{"role": "user", "content": "hi"}, *response["output"], *outputs, {"role": "user", "content": "next"}]
    body["input"] = history
    prompt = _render(chat, _api(ResponsesApi, chat).prepare(body)[0].conversation)
    ids = [o["call_id"] for o in outputs]
    assert prompt == _direct_prompt(chat, thinking, reasoning, content, calls, ids)
    assert text.split("</think>")[-1] + "<｜end▁of▁sentence｜>" in prompt


# --- the HTTP surface on the tiny random model, with the official clients -----------------------


@pytest.fixture(scope="module")
def server(tiny_dir):
    s = LiveServer(model_dir=tiny_dir)
    yield s
    assert s.stop() == 0, s.output()


WEATHER_Q = [{"role": "user", "content": "weather in Paris?"}]
TOOL_TURN = [
    *WEATHER_Q,
    {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "I should look it up.", "signature": "msg_1"},
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {"city": "Paris", "days": 2}},
        ],
    },
    {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "toolu_01", "content": [{"type": "text", "text": "21C"}]}],
    },
]


def test_http_messages_with_the_anthropic_client(server) -> None:
    client = anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0)
    r = client.messages.create(model=MODEL, max_tokens=8, messages=WEATHER_Q, tools=ANTHROPIC_TOOLS)  # type: ignore[arg-type]
    assert r.type == "message" and r.stop_reason in ("end_turn", "max_tokens", "tool_use"), r
    for block in r.content:  # a random model almost never calls; if it does, well-formed
        assert block.type in ("thinking", "text", "tool_use")
        if block.type == "tool_use":
            assert block.id.startswith("toolu_") and isinstance(block.input, dict)
        if block.type == "text":
            assert D not in block.text
    for choice in ({"type": "auto"}, {"type": "none"}):
        with client.messages.stream(
            model=MODEL,
            max_tokens=8,
            messages=WEATHER_Q,
            tools=ANTHROPIC_TOOLS,  # type: ignore[arg-type]
            tool_choice=choice,  # type: ignore[arg-type]
        ) as stream:
            kinds = [e.type for e in stream]
            final = stream.get_final_message()
        assert kinds[0] == "message_start" and kinds[-1] == "message_stop", kinds
        assert final.stop_reason in ("end_turn", "max_tokens", "tool_use")
    # A conversation with a call and its result: accepted, rendered as the recipe renders it.
    r = client.messages.create(model=MODEL, max_tokens=4, messages=TOOL_TURN, tools=ANTHROPIC_TOOLS)  # type: ignore[arg-type]
    assert r.stop_reason in ("end_turn", "max_tokens", "tool_use")
    raw = httpx.post(server.url + "/v1/messages", json=_messages_http(TOOL_TURN, stream=True), timeout=60)
    assert raw.status_code == 200 and "event: message_stop" in raw.text, raw.text
    with pytest.raises(anthropic.BadRequestError) as e:  # a forced tool that is not offered
        client.messages.create(
            model=MODEL,
            max_tokens=4,
            messages=WEATHER_Q,
            tools=ANTHROPIC_TOOLS,  # type: ignore[arg-type]
            tool_choice={"type": "tool", "name": "nope"},
        )
    assert "tool_choice" in str(e.value) and "nope" in str(e.value)
    assert e.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]


def _messages_http(messages: list, **extra) -> dict:
    return {"model": MODEL, "max_tokens": 3, "messages": messages, "tools": ANTHROPIC_TOOLS, **extra}


TOOL_USE = {"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {"city": "Paris"}}
MESSAGES_REJECTED = [  # (the body's changes, what the message names)
    ({"tools": "x"}, "'tools'"),
    ({"tools": [{"name": "a b", "input_schema": {}}]}, "tools[0].name"),
    ({"tools": [{"name": "f"}]}, "tools[0].input_schema"),
    ({"tools": [{"name": "f", "input_schema": [1]}]}, "tools[0].input_schema"),
    ({"tools": [{"name": "f", "input_schema": {}, "description": 3}]}, "tools[0].description"),
    ({"tools": [{"name": "f", "input_schema": {}, "input_examples": []}]}, "tools[0].input_examples"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0].type"),
    ({"tools": [ANTHROPIC_TOOLS[0], ANTHROPIC_TOOLS[0]]}, "'tools'"),
    ({"tool_choice": "auto"}, "tool_choice"),
    ({"tool_choice": {"type": "tool", "name": "nope"}}, "tool_choice"),  # not among the tools
    ({"tool_choice": {"type": "tool"}}, "tool_choice"),  # no name
    ({"tool_choice": {"type": "sometimes"}}, "tool_choice"),
    ({"tool_choice": {"type": "auto", "disable_parallel_tool_use": "yes"}}, "disable_parallel_tool_use"),
    ({"tool_choice": {"type": "auto", "parallel": False}}, "tool_choice.parallel"),
    ({"messages": [{"role": "user", "content": [TOOL_USE]}]}, "messages[0].content[0]"),
    (
        {"messages": [{"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "t"}]}]},
        "messages[0].content[0]",
    ),
    ({"messages": [*WEATHER_Q, {"role": "assistant", "content": [{**TOOL_USE, "input": "x"}]}]}, "content[0].input"),
    ({"messages": [*WEATHER_Q, {"role": "assistant", "content": [{**TOOL_USE, "id": ""}]}]}, "content[0].id"),
    (
        {"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "nope", "content": "x"}]}]},
        "tool_use_id",
    ),
    (
        {
            "messages": [
                *TOOL_TURN[:2],
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01", "content": 5}]},
            ]
        },
        "messages[2].content[0].content",
    ),
    (
        {
            "messages": [
                *TOOL_TURN[:2],
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "toolu_01", "content": [{"type": "image", "source": {}}]}
                    ],
                },
            ]
        },
        "messages[2].content[0].content[0]",
    ),
]


@pytest.mark.parametrize("change,named", MESSAGES_REJECTED, ids=[n for _, n in MESSAGES_REJECTED])
def test_http_messages_tool_400s_name_the_field(server, change, named) -> None:
    r = httpx.post(server.url + "/v1/messages", json={**_messages_http(WEATHER_Q), **change}, timeout=60)
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error", body
    assert named in body["error"]["message"], body


def test_http_responses_with_the_openai_client(server) -> None:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    r = client.responses.create(model=MODEL, input="weather in Paris?", tools=RESPONSES_TOOLS, max_output_tokens=8)  # type: ignore[arg-type]
    assert r.status in ("completed", "incomplete")
    for item in r.output:  # a random model almost never calls; if it does, well-formed
        assert item.type in ("reasoning", "message", "function_call")
        if item.type == "function_call":
            assert item.call_id and isinstance(item.arguments, str)
    assert D not in r.output_text
    for choice in ("auto", "none"):
        events = list(
            client.responses.create(
                model=MODEL,
                input="weather in Paris?",
                tools=RESPONSES_TOOLS,  # type: ignore[arg-type]
                tool_choice=choice,  # type: ignore[arg-type]
                max_output_tokens=8,
                stream=True,
            )
        )
        assert events[0].type == "response.created" and events[-1].type in ("response.completed", "response.incomplete")
        assert [e.sequence_number for e in events] == list(range(len(events)))
    # A conversation with a call and its output, as the client's tool loop sends it back.
    history = [
        {"role": "user", "content": "weather in Paris?"},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "Look up."}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": '{"temp": 21}'},
    ]
    r = client.responses.create(model=MODEL, input=history, tools=RESPONSES_TOOLS, max_output_tokens=4)  # type: ignore[arg-type]
    assert r.status in ("completed", "incomplete")
    with pytest.raises(openai.BadRequestError) as e:  # a forced function that is not offered
        client.responses.create(
            model=MODEL,
            input="hi",
            tools=RESPONSES_TOOLS,  # type: ignore[arg-type]
            tool_choice={"type": "function", "name": "nope"},
            max_output_tokens=4,
        )
    assert e.value.status_code == 400 and "nope" in str(e.value)
    assert e.value.body["param"] == "tool_choice"  # type: ignore[index]


RESPONSES_REJECTED = [  # (the body's changes, the error's param, what the message names)
    ({"tools": "x"}, "tools", "'tools'"),
    ({"tools": [{"type": "function", "name": "a b"}]}, "tools[0].name", "tools[0].name"),
    ({"tools": [{"type": "function", "name": "f", "parameters": 3}]}, "tools[0].parameters", "tools[0].parameters"),
    ({"tools": [{"type": "function", "name": "f", "strict": "yes"}]}, "tools[0].strict", "tools[0].strict"),
    ({"tools": [{"type": "web_search"}]}, "tools[0]", "tools[0].type"),
    ({"tools": [{"type": "function", "name": "f", "function": {}}]}, "tools[0]", "tools[0].function"),
    ({"tools": [RESPONSES_TOOLS[0], RESPONSES_TOOLS[0]]}, "tools", "twice"),
    ({"tool_choice": "sometimes"}, "tool_choice", "tool_choice"),
    ({"parallel_tool_calls": "no"}, "parallel_tool_calls", "parallel_tool_calls"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f"}]}, "input", "input[0].arguments"),
    ({"input": [{"type": "function_call", "call_id": "", "name": "f", "arguments": "{}"}]}, "input", "call_id"),
    ({"input": [{"type": "function_call_output", "call_id": "c", "output": 3}]}, "input", "input[0].output"),
    ({"input": [{"type": "function_call_output", "call_id": "c", "output": "x"}]}, None, "call_id c"),
    ({"input": [{"type": "custom_tool_call", "call_id": "c", "input": "x"}]}, "input", "custom_tool_call"),
    ({"input": [{"type": "reasoning", "content": [{"type": "text", "text": "x"}]}]}, "input", "input[0].content"),
]


@pytest.mark.parametrize("change,param,named", RESPONSES_REJECTED, ids=[n for _, _, n in RESPONSES_REJECTED])
def test_http_responses_tool_400s_name_the_field(server, change, param, named) -> None:
    body = {"model": MODEL, "input": "hi", "tools": RESPONSES_TOOLS, "max_output_tokens": 3, **change}
    r = httpx.post(server.url + "/v1/responses", json=body, timeout=60)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param and named in error["message"], error
