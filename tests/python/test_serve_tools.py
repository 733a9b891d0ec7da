"""Tool calls on /v1/chat/completions (issue 23): DSML parsing robust to every split of the markup
(recorded outputs at every split point, and in multi-token steps of the real tokenizer's tokens),
the encoding round trip of past calls and tool results, the chat route's streaming of tool-call
deltas through a fake engine, and the HTTP surface with the official `openai` client."""

from __future__ import annotations

import asyncio
import json
import random
from types import SimpleNamespace

import deepseek_recipe as dr
import httpx
import openai
import pytest
from dsv41rt.serve.protocol import ApiError, ChatProtocol
from dsv41rt.serve.tool_calls import ParsedOutput, ToolCallAccumulator, ToolSettings, parse_output
from serve_harness import LiveServer

MODEL = "dsv41rt-tiny-v41"
D = "｜DSML｜"

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather of a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search",
            "parameters": {"type": "object", "properties": {"query": {"type": "string"}, "filters": {}}},
        },
    },
]


def _call(name: str, *params: tuple[str, str, bool]) -> str:
    body = "".join(f'<{D} parameter name="{k}" string="{str(s).lower()}">{v}</{D} parameter>\n' for k, v, s in params)
    return f'<{D} invoke name="{name}">\n{body}</{D} invoke>\n'


def _calls(*calls: str) -> str:
    return f"\n\n<{D} calls>\n" + "".join(calls) + f"</{D} calls>"


NESTED = {"filters": {"tags": ['a"b', "ü", "<", "</"], "max": 2.5, "deep": [[{"x": None}]]}, "ok": True}

# Recorded outputs in the V4.1 format (as deepseek-recipe renders an assistant turn; the model emits
# the same): (name, thinking mode, the text generated after the prompt, the parsed result).
RECORDED = [
    (
        "reasoning then one call",
        True,
        "The user asks for the weather in Paris; I should call get_weather.</think>"
        + _calls(_call("get_weather", ("city", "Paris", True))),
        (
            "The user asks for the weather in Paris; I should call get_weather.",
            "",
            [("get_weather", {"city": "Paris"})],
        ),
    ),
    (
        "text before two parallel calls",
        True,
        "Two cities.</think>I'll look both up."
        + _calls(
            _call("get_weather", ("city", "Paris", True)),
            _call("get_weather", ("city", "Tōkyō", True), ("days", "3", False)),
        ),
        (
            "Two cities.",
            "I'll look both up.",
            [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Tōkyō", "days": 3})],
        ),
    ),
    (
        "nested JSON, unicode, escaped quotes",
        True,
        "Search with filters.</think>"
        + _calls(
            _call(
                "search",
                ("query", 'He said "hi" \\ 你好 <b> a < b', True),
                ("filters", json.dumps(NESTED["filters"], ensure_ascii=False), False),
            )
        ),
        (
            "Search with filters.",
            "",
            [("search", {"query": 'He said "hi" \\ 你好 <b> a < b', "filters": NESTED["filters"]})],
        ),
    ),
    (
        "no thinking: text, then a call",
        False,
        "Let me search for that: x < y and <tags> stay text." + _calls(_call("search", ("query", "dsml", True))),
        ("", "Let me search for that: x < y and <tags> stay text.", [("search", {"query": "dsml"})]),
    ),
    (
        "a call without arguments",
        True,
        "No query needed.</think>" + _calls(f'<{D} invoke name="search">\n\n</{D} invoke>\n'),
        ("No query needed.", "", [("search", {})]),
    ),
    (
        "no call at all",
        True,
        "Just thinking < here.</think>The answer is 4 <3.",
        ("Just thinking < here.", "The answer is 4 <3.", []),
    ),
]


def _body(thinking: bool, **extra) -> dict:
    mode = {} if thinking else {"thinking": {"type": "disabled"}}
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS, **mode, **extra}


def _conversation(chat: ChatProtocol, thinking: bool, **extra) -> dr.ConversationRequest:
    return chat.prepare(_body(thinking, **extra), 1 << 20, 64, 1 << 20).conversation


def _key(p: ParsedOutput) -> tuple:
    """What must not depend on the chunking (the call ids are random)."""
    return (p.reasoning_content, p.content, [(c.name, c.arguments) for c in p.tool_calls], p.finish_reason)


@pytest.mark.parametrize("name,thinking,text,expected", RECORDED, ids=[r[0] for r in RECORDED])
def test_dsml_parse_is_independent_of_the_split(chat, tok, name, thinking, text, expected) -> None:
    conv = _conversation(chat, thinking)
    whole, chunks = parse_output(conv, tok.recipe, [text])
    reasoning, content, calls = expected
    assert (whole.reasoning_content, whole.content) == (reasoning, content), whole
    assert [(c.name, json.loads(c.arguments)) for c in whole.tool_calls] == calls
    assert whole.finish_reason == ("tool_calls" if calls else "stop")
    for c in whole.tool_calls:
        assert c.id.startswith("call_") and len(c.id) > len("call_")
    assert len({c.id for c in whole.tool_calls}) == len(calls)
    for delta in (ch["choices"][0]["delta"] for ch in chunks if ch["choices"]):  # no markup leaks
        for field in ("content", "reasoning_content"):
            assert D not in (delta.get(field) or ""), delta
    expect = _key(whole)
    for cut in range(1, len(text)):  # every split point, two chunks
        assert _key(parse_output(conv, tok.recipe, [text[:cut], text[cut:]])[0]) == expect, (cut, text[:cut])
    ids = tok.encode(text)  # the real tokenizer's tokens, 1..8 per engine step (speculative decoding)
    rng = random.Random(hash(name) & 0xFFFF)
    for _ in range(40):
        steps, i = [], 0
        while i < len(ids):
            n = rng.randint(1, 8)
            steps.append(ids[i : i + n])
            i += n
        assert _key(parse_output(conv, tok.recipe, steps)[0]) == expect, steps
    one_by_one = [[t] for t in ids]
    assert _key(parse_output(conv, tok.recipe, one_by_one)[0]) == expect
    for cut in range(1, len(ids)):  # every split point in token space too
        assert _key(parse_output(conv, tok.recipe, [ids[:cut], ids[cut:]])[0]) == expect, cut


def _history(parsed: ParsedOutput, thinking: bool) -> list[dict]:
    """The parsed turn as a client sends it back, followed by each call's result."""
    turn: dict = {
        "role": "assistant",
        "content": parsed.content,
        "tool_calls": [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in parsed.tool_calls
        ],
    }
    if thinking:
        turn["reasoning_content"] = parsed.reasoning_content
    results = [
        {"role": "tool", "tool_call_id": c.id, "content": f'{{"result": {i}}}'} for i, c in enumerate(parsed.tool_calls)
    ]
    return [turn, *results]


@pytest.mark.parametrize(
    "name,thinking,text,expected", [r for r in RECORDED if r[3][2]], ids=[r[0] for r in RECORDED if r[3][2]]
)
def test_parsed_calls_round_trip_byte_exactly(chat, tok, name, thinking, text, expected) -> None:
    """A call parsed from the model's output, sent back with its results, renders into the next
    prompt exactly as the model produced it; the prompt is the one deepseek-recipe renders for the
    same conversation built from its own message types (the route adds nothing)."""
    conv = _conversation(chat, thinking)
    parsed, _ = parse_output(conv, tok.recipe, [text])
    body = _body(thinking)
    body["messages"] = body["messages"] + _history(parsed, thinking)
    prep = chat.prepare(body, 1 << 20, 64, 1 << 20)
    prompt = chat.encoding.render_conversation(prep.conversation.conversation).prompt
    opened = "<｜Assistant｜><think>" if thinking else "<｜Assistant｜></think>"
    assert opened + text + "<｜end▁of▁sentence｜>" in prompt, prompt[prompt.index("<｜Assistant｜>") :]
    for i in range(len(parsed.tool_calls)):
        assert f'{{"result": {i}}}' in prompt
    # The same conversation from deepseek-recipe's own types renders to the same prompt and ids.
    tools = [
        dr.ToolDefinition(t["function"]["name"], t["function"].get("description"), t["function"]["parameters"])
        for t in TOOLS
    ]
    calls = [dr.ToolCall(c.id, c.name, c.arguments) for c in parsed.tool_calls]
    messages = [
        dr.UserMessage("hi"),
        dr.AssistantMessage(parsed.content, parsed.reasoning_content if thinking else None, calls),
        *[dr.ToolMessage(f'{{"result": {i}}}', c.id) for i, c in enumerate(parsed.tool_calls)],
    ]
    direct = dr.Conversation(messages, thinking_mode=thinking, tools=tools)
    assert chat.encoding.render_conversation(direct).prompt == prompt
    assert chat.encoding.encode(direct) == prep.prompt


def test_tool_settings_checks_name_the_field() -> None:
    ok = ToolSettings.of({"tools": TOOLS})
    assert ok == ToolSettings(offered=True, parallel=True)
    assert ToolSettings.of({"tools": TOOLS, "tool_choice": "none"}).offered is False
    assert ToolSettings.of({"tools": TOOLS, "parallel_tool_calls": False}).parallel is False
    assert ToolSettings.of({}).offered is False
    fn = TOOLS[0]["function"]
    bad = [
        ({"tools": "x"}, "tools"),
        ({"tools": [1]}, "tools[0]"),
        ({"tools": [{"type": "x", "function": fn}]}, "tools[0].type"),
        ({"tools": [{"type": "function"}]}, "tools[0].function"),
        ({"tools": [{"type": "function", "function": {**fn, "name": "a b"}}]}, "tools[0].function.name"),
        ({"tools": [{"type": "function", "function": {**fn, "name": "a" * 65}}]}, "tools[0].function.name"),
        ({"tools": [TOOLS[0], {"type": "function", "function": {"name": ""}}]}, "tools[1].function.name"),
        ({"tools": [{"type": "function", "function": {**fn, "parameters": [1]}}]}, "tools[0].function.parameters"),
        ({"tools": [{"type": "function", "function": {**fn, "description": 3}}]}, "tools[0].function.description"),
        ({"tools": [TOOLS[0], TOOLS[0]]}, "tools"),
        ({"tool_choice": "required"}, "tool_choice"),  # forces a call without tools
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "name": "search"}}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
        ({"tools": TOOLS, "parallel_tool_calls": "no"}, "parallel_tool_calls"),
    ]
    for body, param in bad:
        with pytest.raises(ApiError) as e:
            ToolSettings.of(body)
        assert e.value.status == 400 and e.value.param == param, (body, e.value.param, e.value.message)
    # A forced call (grammar-constrained decoding holds the output to a calls block: grammar.py).
    assert ToolSettings.of({"tools": TOOLS, "tool_choice": "required"}).offered
    assert ToolSettings.of(
        {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "search"}}}
    ).offered


def test_tool_choice_none_neither_offers_nor_parses(chat, tok) -> None:
    """With "none" the tools are not rendered and markup is not parsed (it stays text)."""
    prompt = chat.encoding.render_conversation(_conversation(chat, True, tool_choice="none").conversation).prompt
    assert "get_weather" not in prompt and "## Tools" not in prompt
    assert "get_weather" in chat.encoding.render_conversation(_conversation(chat, True).conversation).prompt
    text = RECORDED[0][2]
    parsed, _ = parse_output(_conversation(chat, True, tool_choice="none"), tok.recipe, [text])
    assert parsed.tool_calls == () and parsed.finish_reason == "stop" and f"<{D} calls>" in parsed.content


def test_single_call_when_parallel_tool_calls_is_false() -> None:
    settings = ToolSettings(offered=True, parallel=False)
    header = {"index": 1, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": ""}}
    d = {"choices": [{"index": 0, "delta": {"tool_calls": [header]}, "finish_reason": None}]}
    assert settings.chunk(d) is False
    d = {"choices": [{"index": 0, "delta": {"tool_calls": [{**header, "index": 0}]}, "finish_reason": None}]}
    assert settings.chunk(d) is True and d["choices"][0]["delta"]["tool_calls"][0]["index"] == 0
    d = {"choices": [{"index": 0, "delta": {"content": ""}, "finish_reason": "tool_calls"}]}
    assert settings.chunk(d) is True
    d = {"choices": [{"index": 0, "delta": {"tool_calls": [header]}, "logprobs": {"content": [{}]}}]}
    assert settings.chunk(d) is True and "tool_calls" not in d["choices"][0]["delta"]  # the logprobs stay
    whole = {"choices": [{"message": {"tool_calls": [{"id": "a"}, {"id": "b"}]}}]}
    settings.response(whole)
    assert whole["choices"][0]["message"]["tool_calls"] == [{"id": "a"}]


class _FakeEngine:
    def __init__(self) -> None:
        self.cancelled: list = []

    def cancel(self, req) -> None:
        self.cancelled.append(req)


def engine_outputs(steps: list[list[int]]) -> SimpleNamespace:
    """A submitted request whose queue holds the engine outputs `steps` (one engine step each, the
    last one finishing with "stop"), as the engine loop would put them; call in an event loop."""
    queue: asyncio.Queue = asyncio.Queue()
    for i, step in enumerate(steps):
        last = i == len(steps) - 1
        out = SimpleNamespace(new_tokens=step, cached_tokens=0, finished=last, finish_reason="stop" if last else None)
        queue.put_nowait(out)
    queue.put_nowait(None)
    return SimpleNamespace(out=queue)


def _route_chunks(chat, tok, body: dict, steps: list[list[int]]) -> list[dict]:
    """The chat route's stream for engine outputs `steps` (one engine step each, the last one
    finishing): the route's own RecipeRun and tool-call filter, a fake engine in place of the
    model (no output can be forced on the real one)."""
    from dsv41rt.serve.recipe_stream import RecipeRun

    async def go() -> list[dict]:
        prep = chat.prepare(body, 1 << 20, 64, 1 << 20)
        state = SimpleNamespace(active=0, tok=tok, chat=chat, engine=_FakeEngine())
        req = engine_outputs(steps)
        gen = dr.ChatCompletionRequest.chunk_generator(prep.conversation, "chatcmpl-x", MODEL)
        run = RecipeRun(
            state, lambda *a: req, prep, gen, SimpleNamespace(output="completion_tokens", total=None, details=None)
        )
        settings = ToolSettings.of(body)
        sent = []
        async for event in run.events(None):
            d = json.loads(event.to_json())
            if settings.chunk(d):
                sent.append(d)
        return sent

    return asyncio.run(go())


def test_chat_route_streams_tool_call_deltas_from_multi_token_steps(chat, tok) -> None:
    name, thinking, text, expected = RECORDED[1]  # two parallel calls with text before
    ids = tok.encode(text)
    rng = random.Random(7)
    for trial in range(5):
        steps, i = [], 0
        while i < len(ids):
            n = rng.randint(1, 8)
            steps.append(ids[i : i + n])
            i += n
        for parallel in (True, False):
            body = _body(thinking, stream=True, parallel_tool_calls=parallel)
            acc = ToolCallAccumulator()
            for d in _route_chunks(chat, tok, body, steps):
                acc.add(d)
            got = acc.result()
            calls = expected[2] if parallel else expected[2][:1]
            assert [(c.name, json.loads(c.arguments)) for c in got.tool_calls] == calls, (trial, parallel)
            assert (got.reasoning_content, got.content, got.finish_reason) == (expected[0], expected[1], "tool_calls")


# --- the HTTP surface on the tiny random model ---------------------------------------------------


@pytest.fixture(scope="module")
def server(tiny_dir):
    s = LiveServer("--max-request-bytes", "65536", model_dir=tiny_dir)
    yield s
    assert s.stop() == 0, s.output()


def test_http_tools_with_the_openai_client(server) -> None:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    messages = [{"role": "user", "content": "weather in Paris?"}]
    r = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, max_tokens=8)  # type: ignore[arg-type]
    choice = r.choices[0]
    assert choice.finish_reason in ("stop", "length", "tool_calls")
    assert D not in (choice.message.content or "")
    if choice.message.tool_calls:  # a random model almost never calls; if it does, well-formed
        assert all(c.type == "function" and c.id.startswith("call_") for c in choice.message.tool_calls)
    for kw in ({"tool_choice": "auto"}, {"tool_choice": "none"}, {"parallel_tool_calls": False}):
        stream = client.chat.completions.create(
            model=MODEL,
            messages=messages,
            tools=TOOLS,
            max_tokens=8,
            stream=True,
            **kw,  # type: ignore[arg-type]
        )
        chunks = list(stream)
        assert chunks and chunks[-1].choices[0].finish_reason in ("stop", "length", "tool_calls"), kw
    history = messages + [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'},
    ]
    r = client.chat.completions.create(model=MODEL, messages=history, tools=TOOLS, max_tokens=4)  # type: ignore[arg-type]
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    with pytest.raises(openai.BadRequestError) as e:  # a named function that is not offered
        client.chat.completions.create(
            model=MODEL,
            messages=messages,
            tools=TOOLS,  # type: ignore[arg-type]
            max_tokens=4,
            tool_choice={"type": "function", "function": {"name": "nope"}},
        )
    assert e.value.status_code == 400 and "tool_choice" in str(e.value) and "nope" in str(e.value)
    bad_tools = [{"type": "function", "function": {"name": "no spaces allowed"}}]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=messages, tools=bad_tools, max_tokens=4)  # type: ignore[arg-type]
    assert "tools[0].function.name" in str(e.value)
    raw = httpx.post(
        server.url + "/v1/chat/completions",
        json={
            "model": MODEL,
            "messages": messages,
            "tools": [{"type": "function", "function": {"name": "f", "parameters": 3}}],
        },
        timeout=60,
    )
    assert raw.status_code == 400 and raw.json()["error"]["param"] == "tools[0].function.parameters", raw.text
