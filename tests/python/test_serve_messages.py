"""Anthropic's Messages API (`POST /v1/messages`) end to end: a live server on the built-in tiny
model (CPU, behind an API key) driven by the official `anthropic` client and raw HTTP: streamed and
not, thinking on and off, max_tokens and stop sequences as stop reasons, both key headers, and a 400
in Anthropic's error shape naming the field for what the route does not apply (tool use:
test_serve_tools_apis.py); `/v1/messages/count_tokens` against /v1/messages' usage."""

from __future__ import annotations

import json
import os
import threading

import anthropic
import httpx
import pytest
from serve_harness import LiveServer

MODEL = "dsv41rt-tiny-v41"
KEY = "sk-messages-test"
CONFIG = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "tiny-cpu.yaml")
USER_HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("builtin") / "tiny-v41-seed0")


@pytest.fixture(scope="module")
def server(tiny_dir):
    s = LiveServer("--config", CONFIG, "--api-key", KEY, model_dir=tiny_dir)
    yield s
    assert s.stop() == 0, s.output()


@pytest.fixture(scope="module")
def client(server):
    from anthropic import Anthropic

    return Anthropic(base_url=server.url, api_key=KEY, max_retries=0)


def _post(server, body: dict, **headers: str) -> httpx.Response:
    return httpx.post(server.url + "/v1/messages", json=body, headers={"x-api-key": KEY, **headers}, timeout=60)


def test_not_streamed_thinking_on_and_off(client) -> None:
    # anthropic 2.16 has no sampling arguments any more; the server still reads them (extra_body).
    r = client.messages.create(model=MODEL, max_tokens=5, messages=USER_HI, extra_body={"temperature": 0.5})
    assert r.type == "message" and r.role == "assistant" and r.model == MODEL and r.id.startswith("msg_")
    # Thinking is the server's default: the tiny model does not close its reasoning within 5 tokens.
    assert [b.type for b in r.content] == ["thinking"] and r.content[0].thinking
    assert r.stop_reason == "max_tokens" and r.stop_sequence is None
    # Anthropic's input_tokens leaves out what the prefix cache served.
    assert r.usage.output_tokens == 5 and r.usage.input_tokens + r.usage.cache_read_input_tokens > 5
    r = client.messages.create(
        model=MODEL,
        max_tokens=4,
        system=[{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            # An earlier turn as Claude Code sends it back: its thinking block, then its text.
            {
                "role": "assistant",
                "content": [{"type": "thinking", "thinking": "hm", "signature": "s"}, {"type": "text", "text": "yo"}],
            },
            {"role": "user", "content": "again"},
        ],
        thinking={"type": "disabled"},
        extra_body={"top_k": 5, "top_p": 0.9},
    )
    assert [b.type for b in r.content] == ["text"] and r.content[0].text
    assert r.stop_reason == "max_tokens" and r.usage.output_tokens == 4
    # The effort maps as chat's reasoning_effort does (the recipe renders it into the system prompt).
    for effort in ("low", "max"):
        r = client.messages.create(model=MODEL, max_tokens=1, messages=USER_HI, output_config={"effort": effort})
        assert r.content[0].type == "thinking" and r.usage.output_tokens == 1


def test_streamed_thinking_on_and_off(client) -> None:
    thinking = {"type": "enabled", "budget_tokens": 1024}
    for mode, block in ((thinking, "thinking"), ({"type": "disabled"}, "text")):
        with client.messages.stream(model=MODEL, max_tokens=5, messages=USER_HI, thinking=mode) as stream:
            events = list(stream)
            final = stream.get_final_message()
        kinds = [e.type for e in events]
        assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"], kinds
        assert kinds[1] == "content_block_start" and "content_block_stop" in kinds
        deltas = [e.delta.type for e in events if e.type == "content_block_delta"]
        assert f"{block}_delta" in deltas, deltas
        assert [b.type for b in final.content] == [block] and final.stop_reason == "max_tokens"
        assert final.usage.output_tokens == 5 and final.usage.input_tokens > 0


def test_stop_sequence_is_the_stop_reason(server, client) -> None:
    """Greedy decoding twice: the second request stops on a piece of the first one's text."""
    base = {"model": MODEL, "max_tokens": 8, "messages": USER_HI, "thinking": {"type": "disabled"}}
    greedy = {"temperature": 0}
    with client.messages.stream(**base, extra_body=greedy) as stream:  # type: ignore[arg-type]
        pieces = [e.delta.text for e in stream if e.type == "content_block_delta" and e.delta.type == "text_delta"]
    stop = next(p for p in pieces[2:] if p.strip())
    r = client.messages.create(**base, stop_sequences=[stop], extra_body=greedy)  # type: ignore[arg-type]
    assert r.stop_reason == "stop_sequence" and r.stop_sequence == stop, r
    assert stop not in r.content[0].text and r.content[0].text == "".join(pieces)[: len(r.content[0].text)]


def test_api_key_in_either_header(server) -> None:
    body = {"model": MODEL, "max_tokens": 1, "messages": USER_HI}
    assert _post(server, body).status_code == 200
    r = httpx.post(server.url + "/v1/messages", json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=60)
    assert r.status_code == 200, r.text
    for headers in ({}, {"x-api-key": "wrong"}, {"x-api-key": "", "Authorization": "Bearer wrong"}):
        r = httpx.post(server.url + "/v1/messages", json=body, headers=headers, timeout=60)
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error", r.text
        assert r.json()["type"] == "error"
    # The other routes take x-api-key too, and keep OpenAI's error shape.
    chat = {"model": MODEL, "max_tokens": 1, "messages": USER_HI}
    assert httpx.post(server.url + "/v1/chat/completions", json=chat, headers={"x-api-key": KEY}).status_code == 200
    r = httpx.post(server.url + "/v1/chat/completions", json=chat, headers={"x-api-key": "wrong"})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error" and "type" not in r.json()


REJECTED = [  # (extra fields, what the message names); tools: test_serve_tools_apis.py
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "messages[0].content[0]"),
    ({"messages": [{"role": "user", "content": [{"type": "thinking", "thinking": "x"}]}]}, "messages[0].content[0]"),
    ({"messages": [{"role": "system", "content": "x"}]}, "messages[0].role"),
    ({"messages": []}, "messages"),
    ({"service_tier": "auto"}, "service_tier"),
    ({"made_up_field": 1}, "made_up_field"),
    ({"max_tokens": None}, "max_tokens"),
    ({"max_tokens": "5"}, "max_tokens"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"temperature": 1.5}, "temperature"),
    ({"top_p": "x"}, "top_p"),
    ({"top_k": -5}, "top_k"),
    ({"stop_sequences": "x"}, "stop_sequences"),
    ({"stream": "yes"}, "stream"),
    ({"thinking": {"type": "sometimes"}}, "thinking"),
    ({"thinking": {"type": "enabled", "budget_tokens": "lots"}}, "budget_tokens"),
    ({"system": 5}, "system"),
    ({"system": [{"type": "text", "text": "x", "citations": []}]}, "system[0].citations"),
    ({"metadata": "x"}, "metadata"),
    ({"output_config": {"format": {"type": "json_schema", "schema": {}}}}, "output_config"),
    ({"output_config": {"effort": "ultra"}}, "output_config.effort"),
]


@pytest.mark.parametrize("extra,named", REJECTED, ids=[n for _, n in REJECTED])
def test_what_is_not_applied_is_a_400_naming_it(server, extra, named) -> None:
    r = _post(server, {"model": MODEL, "max_tokens": 2, "messages": USER_HI, **extra})
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error", body
    assert named in body["error"]["message"], body


def test_errors_before_the_route_are_in_anthropic_shape(server) -> None:
    r = _post(server, {"model": "nope", "max_tokens": 2, "messages": USER_HI})
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error", r.text
    r = httpx.post(
        server.url + "/v1/messages",
        content=b"{not json",
        headers={"x-api-key": KEY, "content-type": "application/json"},
        timeout=60,
    )
    assert r.status_code == 400 and r.json()["type"] == "error" and "JSON" in r.json()["error"]["message"]
    r = httpx.post(server.url + "/v1/messages", content=b"hi", headers={"x-api-key": KEY, "content-type": "text/plain"})
    assert r.status_code == 415 and r.json()["type"] == "error", r.text


COUNT_TOKENS_REJECTED = [  # (the body's changes, what the message names): the generation's fields too
    ({"max_tokens": 5}, "max_tokens"),
    ({"stream": True}, "stream"),
    ({"temperature": 0.5}, "temperature"),
    ({"messages": []}, "messages"),
    ({"messages": None}, "messages"),
    ({"system": 5}, "system"),
    ({"thinking": {"type": "sometimes"}}, "thinking"),
    ({"tools": [{"name": "a b", "input_schema": {"type": "object"}}]}, "tools[0].name"),
    ({"tool_choice": {"type": "any"}}, "tool_choice"),
]


def test_count_tokens_with_the_anthropic_client(server, client) -> None:
    """/v1/messages/count_tokens counts the prompt /v1/messages renders for the same body: Anthropic
    reports a prompt's tokens as input_tokens plus what the prefix cache served (cache_read)."""
    tools = [{"name": "get_weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]
    for fields in (
        {"messages": [{"role": "user", "content": "count me, a prompt never sent before"}]},
        {"messages": USER_HI, "system": "Be brief.", "thinking": {"type": "disabled"}},
        {"messages": USER_HI, "tools": tools, "tool_choice": {"type": "auto", "disable_parallel_tool_use": True}},
    ):
        counted = client.messages.count_tokens(model=MODEL, **fields)
        r = client.messages.create(model=MODEL, max_tokens=2, **fields)
        assert counted.input_tokens == r.usage.input_tokens + (r.usage.cache_read_input_tokens or 0), (fields, r.usage)
    r = httpx.post(server.url + "/v1/messages/count_tokens", json={"model": MODEL, "messages": USER_HI})
    assert r.status_code == 401 and r.json()["type"] == "error", r.text  # behind the key, in Anthropic's shape
    for change, named in COUNT_TOKENS_REJECTED:
        body = {"model": MODEL, "messages": USER_HI, **change}
        r = httpx.post(server.url + "/v1/messages/count_tokens", json=body, headers={"x-api-key": KEY}, timeout=60)
        assert r.status_code == 400, (change, r.text)
        assert r.json()["type"] == "error" and r.json()["error"]["type"] == "invalid_request_error", r.text
        assert named in r.json()["error"]["message"], (change, r.text)
    with pytest.raises(anthropic.NotFoundError):
        client.messages.count_tokens(model="nope", messages=USER_HI)  # type: ignore[arg-type]


def test_raw_stream_frames_name_their_events(server) -> None:
    body = {"model": MODEL, "max_tokens": 3, "messages": USER_HI, "stream": True}
    with httpx.stream("POST", server.url + "/v1/messages", json=body, headers={"x-api-key": KEY}, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    names = [line[7:] for line in lines if line.startswith("event: ")]
    datas = [json.loads(line[6:]) for line in lines if line.startswith("data: ")]
    assert len(names) == len(datas) and all(d["type"] == n for n, d in zip(names, datas, strict=True))
    assert datas[-2]["usage"]["output_tokens"] == 3 and datas[-2]["delta"]["stop_reason"] == "max_tokens"


class RawStream(threading.Thread):
    """A streamed request's SSE lines, read on a thread; `generating` is set at its first delta."""

    def __init__(self, url: str, body: dict) -> None:
        super().__init__(daemon=True)
        self.url, self.body = url, body
        self.lines: list[str] = []
        self.generating = threading.Event()

    def run(self) -> None:
        try:
            with httpx.stream("POST", self.url, json=self.body, timeout=120) as r:
                for line in r.iter_lines():
                    self.lines.append(line)
                    if "_delta" in line or ".delta" in line:
                        self.generating.set()
        finally:
            self.generating.set()

    def last_event(self) -> tuple[str, dict]:
        events = [line[7:] for line in self.lines if line.startswith("event: ")]
        datas = [line[6:] for line in self.lines if line.startswith("data: ")]
        return events[-1], json.loads(datas[-1])


def test_streams_the_shutdown_cuts_off_end_with_their_apis_error_event(tiny_dir) -> None:
    """SIGTERM with a 1 s drain while a Messages and a Responses stream generate (20000 tokens, far
    past the drain): each ends with its API's error event, not a stop reason; a non-streamed
    Messages request gets a 503 in Anthropic's shape."""
    s = LiveServer("--config", CONFIG, "--shutdown-timeout", "1", model_dir=tiny_dir)
    try:
        messages = {"model": MODEL, "max_tokens": 20000, "messages": USER_HI, "stream": True}
        responses = {"model": MODEL, "max_output_tokens": 20000, "input": "hi", "stream": True}
        streams = [RawStream(s.url + "/v1/messages", messages), RawStream(s.url + "/v1/responses", responses)]
        plain: dict = {}

        def post() -> None:
            r = httpx.post(s.url + "/v1/messages", json={**messages, "stream": False}, timeout=120)
            plain.update(status=r.status_code, body=r.json())

        poster = threading.Thread(target=post, daemon=True)
        for st in streams:
            st.start()
        poster.start()
        assert all(st.generating.wait(60) for st in streams)
        s.terminate()
        assert s.proc.wait(timeout=60) == 0, s.output()[-3000:]
        for st in (*streams, poster):
            st.join(10)
        name, data = streams[0].last_event()
        assert name == "error" and data["type"] == "error", data
        assert data["error"]["type"] == "overloaded_error" and "shutting down" in data["error"]["message"], data
        assert not any('"stop_reason": "max_tokens"' in line for line in streams[0].lines)
        name, data = streams[1].last_event()
        assert name == "error" and data["type"] == "error" and "shutting down" in data["message"], data
        numbers = [json.loads(line[6:])["sequence_number"] for line in streams[1].lines if line.startswith("data: ")]
        assert numbers == list(range(len(numbers))), numbers[-3:]
        assert plain["status"] == 503 and plain["body"]["error"]["type"] == "overloaded_error", plain
    finally:
        s.stop()
