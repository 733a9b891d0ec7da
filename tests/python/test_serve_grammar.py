"""Grammar-constrained decoding through the server on the tiny random model (issue 23, acceptance 1):
a forced tool call (`tool_choice` "required" or a named function) always comes back as a call of
an offered tool whose arguments parse as JSON valid against its schema, streamed and not, thinking
on and off, 10 seeds each; `response_format` json_schema content is valid against the schema (10
seeds); `parallel_tool_calls: false` gives one call; Anthropic Messages (`tool_choice` any) and
Responses (`tool_choice` required) force calls too. The random weights make the model's own choice
arbitrary: only the grammar can make these outputs valid.

The grammar's construction is python/dsv41rt/serve/grammar.py; the matcher and the logits mask are
the C++ core's (tests/cpp/test_grammar.cc)."""

from __future__ import annotations

import json

import anthropic
import jsonschema_rs
import openai
import pytest
from dsv41rt import Runtime
from dsv41rt.sampling import Grammar, SamplingParams
from serve_harness import LiveServer

MODEL = "dsv41rt-tiny-v41"
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 40},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
SEARCH = {
    "type": "object",
    "properties": {
        "query": {"type": "string", "maxLength": 40},
        "exact": {"type": "boolean"},
        "lang": {"type": "string", "enum": ["en", "fr"]},
    },
    "required": ["query"],
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "search", "parameters": SEARCH}},
]
SCHEMAS = {"get_weather": WEATHER, "search": SEARCH}
ANSWER = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 30},
        "score": {"type": "integer", "minimum": 0, "maximum": 100},
        "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b", "c"]}, "maxItems": 4},
    },
    "required": ["name", "score", "tags"],
    "additionalProperties": False,
}
QUESTION = [{"role": "user", "content": "What is the weather in Paris? Answer in json."}]


@pytest.fixture(scope="module")
def server(tiny_dir):
    s = LiveServer(model_dir=tiny_dir)
    yield s
    assert s.stop() == 0, s.output()


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none")


def _thinking(on: bool) -> dict:
    return {"thinking": {"type": "enabled" if on else "disabled"}}


def _check_call(name: str, arguments: str) -> None:
    assert name in SCHEMAS, name
    args = json.loads(arguments)
    assert jsonschema_rs.validator_for(SCHEMAS[name]).is_valid(args), (name, args)


def _streamed_calls(stream) -> tuple[dict[int, list[str]], str | None]:
    calls: dict[int, list[str]] = {}
    finish = None
    for chunk in stream:
        for choice in chunk.choices:
            for d in choice.delta.tool_calls or []:
                entry = calls.setdefault(d.index, ["", ""])
                if d.function and d.function.name:
                    entry[0] += d.function.name
                if d.function and d.function.arguments:
                    entry[1] += d.function.arguments
            finish = choice.finish_reason or finish
    return calls, finish


@pytest.mark.parametrize("thinking", [False, True])
@pytest.mark.parametrize("stream", [False, True])
def test_required_tool_call_is_a_valid_call(client, thinking: bool, stream: bool) -> None:
    # One call (parallel_tool_calls false): a random model would chain parallel calls at will.
    for seed in range(10):
        kw = dict(
            model=MODEL,
            messages=QUESTION,
            tools=TOOLS,
            tool_choice="required",
            parallel_tool_calls=False,
            max_tokens=500,
            seed=seed,
            extra_body=_thinking(thinking),
        )
        if stream:
            calls, finish = _streamed_calls(client.chat.completions.create(**kw, stream=True))  # type: ignore[call-overload]
            assert len(calls) == 1 and finish == "tool_calls", (seed, calls, finish)
            for name, arguments in calls.values():
                _check_call(name, arguments)
        else:
            r = client.chat.completions.create(**kw)  # type: ignore[call-overload]
            msg = r.choices[0].message
            assert r.choices[0].finish_reason == "tool_calls" and len(msg.tool_calls or []) == 1, (seed, msg)
            assert "DSML" not in (msg.content or "")
            for call in msg.tool_calls or []:
                _check_call(call.function.name, call.function.arguments)


def test_required_parallel_calls_are_valid_until_the_budget_ends(client) -> None:
    """Parallel calls allowed: every call the model completed is valid; one cut by max_tokens
    (finish_reason "length") is the only one that may not be."""
    several = 0
    for seed in range(6):
        r = client.chat.completions.create(
            model=MODEL,
            messages=QUESTION,
            tools=TOOLS,  # type: ignore[arg-type]
            tool_choice="required",
            max_tokens=800,
            seed=seed,
            extra_body=_thinking(False),
        )
        calls, finish = r.choices[0].message.tool_calls or [], r.choices[0].finish_reason
        assert finish in ("tool_calls", "length") and calls, (seed, finish)
        for call in calls[:-1] if finish == "length" else calls:
            _check_call(call.function.name, call.function.arguments)
        several += finish == "tool_calls" and len(calls) > 1
    assert several > 0


def test_named_function_and_single_call(client) -> None:
    for seed in range(3):
        r = client.chat.completions.create(
            model=MODEL,
            messages=QUESTION,
            tools=TOOLS,  # type: ignore[arg-type]
            tool_choice={"type": "function", "function": {"name": "search"}},
            parallel_tool_calls=False,
            max_tokens=400,
            seed=seed,
            extra_body=_thinking(False),
        )
        calls = r.choices[0].message.tool_calls or []
        assert len(calls) == 1 and calls[0].function.name == "search", calls
        _check_call("search", calls[0].function.arguments)


@pytest.mark.parametrize("thinking", [False, True])
def test_json_schema_response_format_is_valid(client, thinking: bool) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER, "strict": True}}
    valid = jsonschema_rs.validator_for(ANSWER)
    for seed in range(10 if not thinking else 4):
        r = client.chat.completions.create(
            model=MODEL,
            messages=QUESTION,
            response_format=fmt,  # type: ignore[arg-type]
            max_tokens=400,
            seed=seed,
            extra_body=_thinking(thinking),
        )
        content = r.choices[0].message.content or ""
        assert r.choices[0].finish_reason == "stop", (seed, content)
        assert valid.is_valid(json.loads(content)), (seed, content)
    # Any JSON object: its strings are unbounded, so a random model may run out of tokens inside
    # one; what it wrote is then a prefix of an object, and a complete one parses.
    for seed in range(4):
        r = client.chat.completions.create(
            model=MODEL, messages=QUESTION, response_format={"type": "json_object"}, max_tokens=200, seed=seed
        )
        content, finish = r.choices[0].message.content or "", r.choices[0].finish_reason
        assert content.startswith("{") and finish in ("stop", "length"), (seed, content)
        if finish == "stop":
            assert isinstance(json.loads(content), dict), (seed, content)


def test_messages_any_and_responses_required_force_calls(server) -> None:
    # One call each (these routes take no seed: a random model's parallel calls could run long).
    tools = [{"name": t["function"]["name"], "input_schema": t["function"]["parameters"]} for t in TOOLS]
    a = anthropic.Anthropic(base_url=server.url, api_key="none")
    m = a.messages.create(
        model=MODEL,
        max_tokens=400,
        messages=QUESTION,
        tools=tools,
        tool_choice={"type": "any", "disable_parallel_tool_use": True},  # type: ignore[arg-type]
    )
    uses = [b for b in m.content if b.type == "tool_use"]
    assert m.stop_reason == "tool_use" and uses, m.content
    for b in uses:
        assert jsonschema_rs.validator_for(SCHEMAS[b.name]).is_valid(b.input), b
    o = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
    rtools = [
        {"type": "function", "name": t["function"]["name"], "parameters": t["function"]["parameters"]} for t in TOOLS
    ]
    r = o.responses.create(
        model=MODEL,
        input="weather in Paris?",
        tools=rtools,
        tool_choice="required",
        parallel_tool_calls=False,
        max_output_tokens=400,
    )  # type: ignore[arg-type]
    calls = [i for i in r.output if i.type == "function_call"]
    assert calls, r.output
    for c in calls:
        _check_call(c.name, c.arguments)


def test_runtime_grammar_and_its_errors(tiny_v41_dir) -> None:
    """Through dsv41rt.Runtime: the vocabulary comes from the checkpoint's tokenizer.json; a schema
    the compiler refuses raises at add_request naming the grammar."""
    rt = Runtime(tiny_v41_dir, kv_memory=64 << 20, max_num_seqs=2)
    g = Grammar("json_schema", json.dumps(ANSWER))
    out = rt.generate([[0, 5, 6]], max_new_tokens=300, sampling=SamplingParams(temperature=1.0, seed=3))
    assert out  # unconstrained still works
    rid = rt.add_request([0, 5, 6], max_new_tokens=300, sampling=SamplingParams(temperature=1.0, seed=3), grammar=g)
    tokens: list[int] = []
    while rt.has_unfinished():
        for o in rt.step():
            if o.request_id == rid:
                tokens += o.new_tokens
                last = o
    assert last.finish_reason == "stop" and tokens[-1] == rt.config.eos_token_id
    from dsv41rt.tokenizer.grammar_vocab import grammar_vocab

    vocab = grammar_vocab(f"{tiny_v41_dir}/tokenizer.json")
    text = b"".join(vocab[t] for t in tokens[:-1]).decode()
    assert jsonschema_rs.validator_for(ANSWER).is_valid(json.loads(text)), text
    with pytest.raises(Exception, match="grammar"):
        rt.add_request([0, 5, 6], grammar=Grammar("json_schema", "{not json"))
    with pytest.raises(Exception, match="grammar kind 'yaml'"):
        rt.add_request([0, 5, 6], grammar=Grammar("yaml"))
    # A field of the wrong type is named with the dictionary it belongs to.
    with pytest.raises(Exception, match="grammar: 'start_token' must be a number, got a bool"):
        rt.add_request([0, 5, 6], grammar=Grammar("json_object", start_token=True))
    with pytest.raises(Exception, match="grammar: 'start_within' has the wrong type"):
        rt.add_request([0, 5, 6], grammar=Grammar("json_object", start_within="3"))  # type: ignore[arg-type]
