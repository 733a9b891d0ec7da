"""Parallel tool calls switched off (issue 23) on the three APIs: chat `parallel_tool_calls: false`,
Responses `parallel_tool_calls: false`, Messages `tool_choice.disable_parallel_tool_use: true`. The
server's own app (create_app, every route as served) with a scripted engine that emits a recorded
V4.1 output holding two DSML calls in multi-token steps (the tiny random model almost never calls a
tool), driven by the official `openai` and `anthropic` clients, streamed and not: the first call is
returned, no delta or event of the second is sent, and the streams stay well-formed (contiguous
indices and sequence numbers). Also /v1/messages/count_tokens against the same app: it counts the
prompt /v1/messages reports as `usage.input_tokens` (the scripted engine has no prefix cache)."""

from __future__ import annotations

import json
import random
from types import SimpleNamespace

import anthropic
import openai
import pytest
from dsv41rt.serve.app import ServerState, create_app
from starlette.testclient import TestClient
from test_serve_tools import RECORDED, TOOLS, D

MODEL = "dsv41rt-tiny-v41"
ANTHROPIC_TOOLS = [
    {"name": t["function"]["name"], "description": "", "input_schema": t["function"]["parameters"]} for t in TOOLS
]
RESPONSES_TOOLS = [{"type": "function", **t["function"]} for t in TOOLS]
_, THINKING, TWO_CALLS, (REASONING, CONTENT, CALLS) = RECORDED[1]  # text, then two get_weather calls
assert THINKING and len(CALLS) == 2
SEEDS = range(3)  # splits of the output into engine steps of 1..8 tokens


class ScriptedEngine:
    """The engine loop's interface (submit, cancel, stats, alive), answering every request with
    `text`'s tokens in random steps of 1..8 (speculative decoding's multi-token steps), the last
    one finishing with "stop"."""

    alive = True

    def __init__(self, tok) -> None:
        self.tok, self.stats, self.seed = tok, {}, 0

    def submit(self, req) -> None:
        ids, rng, i = self.tok.encode(TWO_CALLS), random.Random(self.seed), 0
        while i < len(ids):
            step = ids[i : i + rng.randint(1, 8)]
            i += len(step)
            last = i >= len(ids)
            reason = "stop" if last else None
            req.out.put_nowait(SimpleNamespace(new_tokens=step, cached_tokens=0, finished=last, finish_reason=reason))
        req.out.put_nowait(None)

    def cancel(self, req) -> None:
        pass


@pytest.fixture(scope="module")
def app(tok):
    cfg = SimpleNamespace(
        thinking=True,
        api_key=None,
        max_tokens_limit=4096,
        default_max_tokens=1024,
        max_request_bytes=1 << 20,
        max_num_queued_reqs=8,
    )
    metrics = SimpleNamespace(rejected=lambda reason: None, render=lambda: "")
    state = ServerState(cfg, ScriptedEngine(tok), tok, (MODEL,), metrics, tok.hf.get_vocab_size(), 1 << 16)
    with TestClient(create_app(state)) as client:
        yield SimpleNamespace(http=client, engine=state.engine)


@pytest.fixture(scope="module")
def oai(app) -> openai.OpenAI:
    return openai.OpenAI(base_url="http://testserver/v1", api_key="none", max_retries=0, http_client=app.http)


@pytest.fixture(scope="module")
def claude(app) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url="http://testserver", api_key="none", max_retries=0, http_client=app.http)


def _first_call_only(name: str, arguments: str | dict) -> None:
    args = json.loads(arguments) if isinstance(arguments, str) else arguments
    assert (name, args) == CALLS[0]


USER = [{"role": "user", "content": "weather in Paris and Tokyo?"}]


@pytest.mark.parametrize("seed", SEEDS)
def test_chat_parallel_tool_calls_false(app, oai, seed) -> None:
    app.engine.seed = seed
    both = oai.chat.completions.create(model=MODEL, messages=USER, tools=TOOLS)  # type: ignore[arg-type]
    assert len(both.choices[0].message.tool_calls or []) == 2  # the control: the output holds two calls
    r = oai.chat.completions.create(model=MODEL, messages=USER, tools=TOOLS, parallel_tool_calls=False)  # type: ignore[arg-type]
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == CONTENT
    [call] = choice.message.tool_calls or []
    _first_call_only(call.function.name, call.function.arguments)  # type: ignore[union-attr]
    chunks = list(
        oai.chat.completions.create(
            model=MODEL,
            messages=USER,
            tools=TOOLS,  # type: ignore[arg-type]
            parallel_tool_calls=False,
            stream=True,
        )
    )
    deltas = [c for chunk in chunks for ch in chunk.choices for c in ch.delta.tool_calls or []]
    assert deltas and {c.index for c in deltas} == {0}, deltas  # no delta of the second call
    assert [c.id for c in deltas if c.id] == [deltas[0].id]
    _first_call_only(deltas[0].function.name, "".join(c.function.arguments or "" for c in deltas))  # type: ignore[arg-type, union-attr]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert D not in "".join(ch.delta.content or "" for chunk in chunks for ch in chunk.choices)


@pytest.mark.parametrize("seed", SEEDS)
def test_responses_parallel_tool_calls_false(app, oai, seed) -> None:
    app.engine.seed = seed
    both = oai.responses.create(model=MODEL, input="weather?", tools=RESPONSES_TOOLS)  # type: ignore[arg-type]
    assert [o.type for o in both.output].count("function_call") == 2 and both.parallel_tool_calls is True
    r = oai.responses.create(model=MODEL, input="weather?", tools=RESPONSES_TOOLS, parallel_tool_calls=False)  # type: ignore[arg-type]
    assert [o.type for o in r.output] == ["reasoning", "message", "function_call"], r.output
    assert r.status == "completed" and r.parallel_tool_calls is False  # echoed as asked
    _first_call_only(r.output[2].name, r.output[2].arguments)  # type: ignore[union-attr]
    events = list(
        oai.responses.create(
            model=MODEL,
            input="weather?",
            tools=RESPONSES_TOOLS,  # type: ignore[arg-type]
            parallel_tool_calls=False,
            stream=True,
        )
    )
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].type == "response.completed"
    final = events[-1].response  # type: ignore[union-attr]
    assert [o.type for o in final.output] == ["reasoning", "message", "function_call"] and not final.parallel_tool_calls
    indices = {e.output_index for e in events if hasattr(e, "output_index")}  # type: ignore[union-attr]
    assert indices == {0, 1, 2}, indices
    added = [e.item for e in events if e.type == "response.output_item.added" and e.item.type == "function_call"]  # type: ignore[union-attr]
    assert len(added) == 1
    deltas = [e for e in events if e.type == "response.function_call_arguments.delta"]
    assert {e.item_id for e in deltas} == {added[0].id}  # no delta of the second call
    _first_call_only(added[0].name, "".join(e.delta for e in deltas))  # type: ignore[union-attr]
    assert final.output[2].arguments == "".join(e.delta for e in deltas)  # type: ignore[union-attr]


@pytest.mark.parametrize("seed", SEEDS)
def test_messages_disable_parallel_tool_use(app, claude, seed) -> None:
    app.engine.seed = seed
    kw = {"model": MODEL, "max_tokens": 1024, "messages": USER, "tools": ANTHROPIC_TOOLS}
    both = claude.messages.create(**kw, tool_choice={"type": "auto"})  # type: ignore[call-overload]
    assert [b.type for b in both.content].count("tool_use") == 2
    single = {"type": "auto", "disable_parallel_tool_use": True}
    r = claude.messages.create(**kw, tool_choice=single)  # type: ignore[call-overload]
    assert [b.type for b in r.content] == ["thinking", "text", "tool_use"] and r.stop_reason == "tool_use"
    _first_call_only(r.content[2].name, r.content[2].input)  # type: ignore[union-attr]
    with claude.messages.stream(**kw, tool_choice=single) as stream:  # type: ignore[call-overload]
        events = list(stream)
        final = stream.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "text", "tool_use"] and final.stop_reason == "tool_use"
    _first_call_only(final.content[2].name, final.content[2].input)  # type: ignore[union-attr]
    starts = [e for e in events if e.type == "content_block_start"]
    assert [s.index for s in starts] == [0, 1, 2] and starts[2].content_block.type == "tool_use"
    block_events = ("content_block_start", "content_block_delta", "content_block_stop")
    indices = {e.index for e in events if e.type in block_events}  # type: ignore[union-attr]
    assert indices == {0, 1, 2}  # no event of a fourth block (the second call)
    partial = "".join(e.delta.partial_json for e in events if e.type == "content_block_delta" and e.index == 2)  # type: ignore[union-attr]
    _first_call_only(starts[2].content_block.name, partial)  # type: ignore[union-attr]


COUNTED = [  # (name, the body's fields besides model and max_tokens)
    ("one user turn", {"messages": USER}),
    ("system, thinking off", {"system": "Be brief.", "thinking": {"type": "disabled"}, "messages": USER}),
    ("tools and a tool choice", {"messages": USER, "tools": ANTHROPIC_TOOLS, "tool_choice": {"type": "auto"}}),
    (
        "a tool conversation",
        {
            "messages": [
                *USER,
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "Look it up.", "signature": "s"},
                        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
                    ],
                },
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "21C"}]},
            ],
            "tools": ANTHROPIC_TOOLS,
            "output_config": {"effort": "high"},
        },
    ),
]


@pytest.mark.parametrize("name,fields", COUNTED, ids=[n for n, _ in COUNTED])
def test_count_tokens_is_the_messages_input_tokens(claude, name, fields) -> None:
    counted = claude.messages.count_tokens(model=MODEL, **fields)
    r = claude.messages.create(model=MODEL, max_tokens=1024, **fields)
    assert r.usage.cache_read_input_tokens == 0  # the scripted engine caches nothing
    assert counted.input_tokens == r.usage.input_tokens > 0, (counted, r.usage)
