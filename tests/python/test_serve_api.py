"""`dsv41rt serve` end to end: a live server process on the built-in tiny model (CPU), driven by the
official `openai` client and raw HTTP: chat (streamed and not, thinking on/off), completions,
models, tokenize/detokenize, metrics that parse and move, client disconnect freeing the pool,
SIGTERM drain."""

from __future__ import annotations

import json
import os
import threading
import time

import httpx
import pytest
from serve_harness import LiveServer

MODEL = "dsv41rt-tiny-v41"
CONFIG = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "tiny-cpu.yaml")  # the README's server


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("builtin") / "tiny-v41-seed0")


@pytest.fixture(scope="module")
def server(tiny_dir):
    s = LiveServer("--config", CONFIG, "--max-request-bytes", "65536", model_dir=tiny_dir)
    yield s
    assert s.stop() == 0, s.output()


def test_chat_max_completion_tokens_is_applied(server) -> None:
    """Issue 23 D3: `max_completion_tokens` (OpenAI's current name) was ignored (asked 3, got 256); it
    wins over `max_tokens`, as in vLLM, and a bad value is a 400 naming it."""
    url = server.url + "/v1/chat/completions"
    base = {"model": MODEL, "messages": [{"role": "user", "content": "go"}], "ignore_eos": True}
    for extra in ({"max_completion_tokens": 3}, {"max_completion_tokens": 3, "max_tokens": 9}):
        r = httpx.post(url, json={**base, **extra}, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 3
    r = httpx.post(url, json={**base, "max_completion_tokens": "3"}, timeout=60)
    assert r.status_code == 400 and "max_completion_tokens" in r.text


# Seed 243 on "hi" samples 10679 ("\u00e8\u013a": the first two bytes of a 3-byte character) as the
# 4th token: the recipe's stream processor holds back text ending mid-character and, at the
# finish, dropped it together with its count (completion_tokens 3 of 4). Unseeded, about 1 request
# in 100 ended on such a byte token: the flaky 3 in test_stream_usage_only_when_asked.
SEED_LAST_TOKEN_MID_CHARACTER = 243


def test_chat_usage_counts_a_last_token_that_ends_mid_character(server) -> None:
    url = server.url + "/v1/chat/completions"
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4,
        "ignore_eos": True,
        "seed": SEED_LAST_TOKEN_MID_CHARACTER,
    }
    r = httpx.post(url, json=body, timeout=60)
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    assert r.json()["choices"][0]["finish_reason"] == "length"
    assert usage["completion_tokens"] == 4 and usage["total_tokens"] == usage["prompt_tokens"] + 4, usage
    assert usage["completion_tokens_details"]["reasoning_tokens"] == 4, usage  # still thinking
    stream = {**body, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", url, json=stream, timeout=60) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    assert chunks[-1]["usage"]["completion_tokens"] == 4, chunks[-1]


def test_chat_applies_the_requests_temperature_and_top_p(tiny_dir, server) -> None:
    """Issue 23 D6: chat sampled at temperature 1 (top_p 0.95) in thinking mode whatever the request
    said, and dropped top_p in non-thinking mode (the recipe's conversion); both now apply, as in
    vLLM, and bad values are a 400 naming the field."""
    from dsv41rt.serve.protocol import ApiError, ChatProtocol, Tokenizers

    tok = Tokenizers(tiny_dir)
    chat = ChatProtocol(tok, (MODEL,), True, tok.hf.get_vocab_size())
    base = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    for thinking in (True, False):
        mode = {} if thinking else {"thinking": {"type": "disabled"}}
        s = chat.prepare({**base, **mode, "temperature": 0.3, "top_p": 0.6}, 4096, 256, 4096).sampling
        assert (s.temperature, s.top_p) == (0.3, 0.6), (thinking, s)
        s = chat.prepare({**base, **mode, "temperature": 0}, 4096, 256, 4096).sampling
        assert (s.temperature, s.top_p) == (0.0, 1.0), (thinking, s)
        s = chat.prepare({**base, **mode}, 4096, 256, 4096).sampling
        assert (s.temperature, s.top_p) == (1.0, 1.0), (thinking, s)
        for bad in ({"top_p": 1.5}, {"top_p": "x"}, {"temperature": -1}):
            with pytest.raises(ApiError) as e:
                chat.prepare({**base, **mode, **bad}, 4096, 256, 4096)
            assert e.value.status == 400 and next(iter(bad)) in e.value.message, (bad, e.value.message)


def test_chat_usage_counts_held_back_tail_tokens(tiny_dir, server) -> None:
    """The same without sampling: the recipe's processor, fed as the chat route feeds it, with
    token streams that end mid-character (one at a time, and all in one chunk, where the recipe
    counted none of the 4); count_held_tail restores the engine's count."""
    import deepseek_recipe as dr
    from dsv41rt.serve.protocol import ChatProtocol, Tokenizers, count_held_tail

    tok = Tokenizers(tiny_dir)
    chat = ChatProtocol(tok, (MODEL,), True, tok.hf.get_vocab_size())
    word, byte = tok.encode(" there")[0], tok.hf.token_to_id("\u013d")  # "\u013d": one byte, 0xC5
    think_end = tok.hf.token_to_id("</think>")
    assert tok.decode([byte]).endswith("\ufffd") and not tok.decode([word]).endswith("\ufffd")
    cases = [  # (chunks, thinking, reasoning tokens expected)
        ([[word], [word], [word], [byte]], True, 4),
        ([[word, word, word, byte]], True, 4),
        ([[word], [think_end], [word], [byte]], True, 1),  # the tail is content
        ([[word], [word], [word], [byte]], False, None),
    ]
    for chunks, thinking, reasoning in cases:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        if not thinking:
            body["thinking"] = {"type": "disabled"}
        prep = chat.prepare(body, 4096, 256, 4096)
        proc = chat.processor(prep, "chatcmpl-test", MODEL)
        out = proc.push(dr.InferenceChunk.ready(prompt_usage=dr.PromptUsage(prompt_tokens=len(prep.prompt))))
        for c in chunks:
            out += proc.push(dr.InferenceChunk.tokens(c))
        out += proc.push(dr.InferenceChunk.finish(dr.InferenceFinishReason.Length)) + proc.finish()
        usage = json.loads(out[-1].to_json())["usage"]
        count_held_tail(usage, 4, prep)
        assert usage["completion_tokens"] == 4 and usage["total_tokens"] == len(prep.prompt) + 4, (chunks, usage)
        assert usage.get("completion_tokens_details", {}).get("reasoning_tokens") == reasoning, (chunks, usage)


def test_openai_client_chat_streamed_and_not(server) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=server.url + "/v1", api_key="unused")
    assert [m.id for m in client.models.list().data] == [MODEL]
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello!"}]
    # Thinking mode (the default) samples at temperature 1 unless the request says otherwise; a seed
    # makes it reproducible.
    r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, seed=7)
    assert r.object == "chat.completion" and r.choices[0].finish_reason == "length"
    msg = r.choices[0].message.model_dump()
    assert msg["role"] == "assistant" and isinstance(msg["reasoning_content"], str)  # thinking on by default
    assert r.usage.completion_tokens == 8 and r.usage.prompt_tokens > 5
    stream = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=6, stream=True, extra_body={"thinking": {"type": "disabled"}}
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text and chunks[-1].choices[0].finish_reason == "length"
    again = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, seed=7)
    assert again.choices[0].message.model_dump()["reasoning_content"] == msg["reasoning_content"]


def test_completions_and_tokenize(server) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=server.url + "/v1", api_key="unused")
    r = client.completions.create(model=MODEL, prompt="Hello world", max_tokens=5, temperature=0)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 5
    parts = client.completions.create(model=MODEL, prompt="Hello world", max_tokens=5, temperature=0, stream=True)
    assert "".join(p.choices[0].text for p in parts if p.choices) == r.choices[0].text
    tok = httpx.post(server.url + "/tokenize", json={"prompt": "Hello world"}).json()
    assert tok["count"] == len(tok["tokens"]) == 2
    back = httpx.post(server.url + "/detokenize", json={"tokens": tok["tokens"]}).json()
    assert back["prompt"] == "Hello world"
    ids = httpx.post(server.url + "/tokenize", json={"messages": [{"role": "user", "content": "Hi"}]}).json()
    assert ids["tokens"][0] == 0 and 128803 in ids["tokens"]  # BOS, <｜User｜>


def test_health_ready_version(server) -> None:
    assert httpx.get(server.url + "/health").status_code == 200
    assert httpx.get(server.url + "/ready").json() == {"ready": True}
    assert httpx.get(server.url + "/version").json()["version"]


def _metrics(url: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for fam in text_string_to_metric_families(httpx.get(url + "/metrics").text):
        for s in fam.samples:
            key = s.name + ("{" + ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()) if k != "model_name") + "}")
            out[key] = s.value
    return out


def _assert_idle_within(url: str, timeout_s: float) -> None:
    """No request running and no page held, within `timeout_s` (polled every 0.1 s)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        m = _metrics(url)
        if m["dsv41rt:num_requests_running{}"] == 0 and m["dsv41rt:kv_cache_usage_perc{}"] == 0:
            break
        time.sleep(0.1)
    assert m["dsv41rt:num_requests_running{}"] == 0 and m["dsv41rt:kv_cache_usage_perc{}"] == 0, m


def test_metrics_parse_and_move(server) -> None:
    before = _metrics(server.url)
    assert "dsv41rt:num_requests_running{}" in before and "dsv41rt:kv_cache_usage_perc{}" in before
    httpx.post(
        server.url + "/v1/completions", json={"model": MODEL, "prompt": "a b c", "max_tokens": 4}, timeout=60
    ).raise_for_status()
    after = _metrics(server.url)
    assert (
        after["dsv41rt:request_success_total{finished_reason=length}"]
        == before.get("dsv41rt:request_success_total{finished_reason=length}", 0) + 1
    )
    assert after["dsv41rt:generation_tokens_total{}"] == before.get("dsv41rt:generation_tokens_total{}", 0) + 4
    assert after["dsv41rt:time_to_first_token_seconds_count{}"] > before.get(
        "dsv41rt:time_to_first_token_seconds_count{}", 0
    )
    assert after["dsv41rt:e2e_request_latency_seconds_count{}"] >= 1


def test_client_disconnect_cancels_and_frees_pages(server) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "go"}], "max_tokens": 2000, "stream": True}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=60) as r:
        for i, _ in enumerate(r.iter_lines()):
            if i > 3:
                break  # leave mid-stream
    _assert_idle_within(server.url, 30)


UNAPPLIED = [
    ({"logit_bias": {"5": 10}}, "logit_bias"),
    ({"guided_json": {"type": "object"}}, "guided_json"),
    ({"best_of": 2}, "best_of"),
    ({"prompt_logprobs": 1}, "prompt_logprobs"),
    ({"made_up_field": 1}, "made_up_field"),
]
CHAT_UNAPPLIED = [
    ({"response_format": {"type": "json_schema"}}, "response_format"),  # without its json_schema
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"tool_choice": {"type": "function", "function": {"name": "g"}}}, "tool_choice"),  # not among the tools
    ({"chat_template_kwargs": {"enable_thinking": False}}, "chat_template_kwargs"),
    ({"echo": True}, "echo"),
]


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
def test_fields_not_applied_are_rejected(server, route) -> None:
    """Issue 23 D6: fields the server does not apply were accepted and ignored; each is now a 400
    naming it (thinking on and off), and max_tokens past the context is a 400 instead of a clip."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    if route == "/v1/completions":
        base: dict = {"model": MODEL, "prompt": "json please", "max_tokens": 2}
        cases = UNAPPLIED + [
            ({"tool_choice": "auto"}, "tool_choice"),
            ({"response_format": {"type": "json_object"}}, "response_format"),
        ]
    else:
        base = {"model": MODEL, "messages": [{"role": "user", "content": "json please"}], "max_tokens": 2}
        cases = UNAPPLIED + CHAT_UNAPPLIED
    for thinking in ({}, {"thinking": {"type": "disabled"}}) if route != "/v1/completions" else ({},):
        for extra, field in cases:
            body = {**base, **thinking, **extra}
            if "tool_choice" in extra and route != "/v1/completions":
                body["tools"] = tools
            r = httpx.post(server.url + route, json=body, timeout=60)
            assert r.status_code == 400, (extra, r.text)
            assert r.json()["error"]["param"] == field, (extra, r.text)
    ok = {"user": "u", "response_format": {"type": "text"}, "logit_bias": {}} if route != "/v1/completions" else {}
    assert httpx.post(server.url + route, json={**base, **ok, "user": "u"}, timeout=60).status_code == 200


def test_max_tokens_past_the_context_is_a_400(tiny_dir) -> None:
    """Issue 23 D6: max_tokens past the context was clipped silently (vLLM: a 400)."""
    s = LiveServer("--max-model-len", "64", model_dir=tiny_dir)
    try:
        chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
        for route, body in (("/v1/completions", {"model": MODEL, "prompt": "hi"}), ("/v1/chat/completions", chat)):
            r = httpx.post(s.url + route, json={**body, "max_tokens": 64}, timeout=60)
            assert r.status_code == 400 and "at most" in r.text and "context is 64" in r.text, r.text
            r = httpx.post(s.url + route, json={**body, "max_tokens": 2}, timeout=60)
            assert r.status_code == 200, r.text
        r = httpx.post(s.url + "/v1/chat/completions", json={**chat, "max_completion_tokens": 64}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == "max_completion_tokens", r.text
    finally:
        assert s.stop() == 0, s.output()


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
def test_stream_usage_only_when_asked(server, route) -> None:
    """Issue 23 (hygiene): the chat stream carried usage in its last chunk whether or not
    `stream_options.include_usage` asked for it. Now, on both routes: no usage unless asked; when
    asked, one more chunk with no choices carries it (OpenAI's and vLLM's stream)."""
    body: dict = {"model": MODEL, "max_tokens": 4, "ignore_eos": True, "stream": True}
    if route == "/v1/completions":
        body["prompt"] = "hi"
    else:
        body["messages"] = [{"role": "user", "content": "hi"}]
    for asked in (None, False, True):
        b = dict(body) if asked is None else {**body, "stream_options": {"include_usage": asked}}
        with httpx.stream("POST", server.url + route, json=b, timeout=60) as r:
            assert r.status_code == 200
            chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
        with_usage = [c for c in chunks if c.get("usage")]
        if not asked:
            assert with_usage == [], with_usage
        else:
            assert len(with_usage) == 1 and with_usage[0] is chunks[-1] and chunks[-1]["choices"] == []
            assert with_usage[0]["usage"]["completion_tokens"] == 4
            assert any(c["choices"] and c["choices"][0]["finish_reason"] == "length" for c in chunks)
    for bad in ([], {"include_usage": "yes"}):
        r = httpx.post(server.url + route, json={**body, "stream_options": bad}, timeout=60)
        assert r.status_code == 400 and "stream_options" in r.text, r.text


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
def test_non_streaming_client_disconnect_cancels(server, route) -> None:
    """Issue 23 D1: a non-streaming client that goes away (here: a 1 s client timeout) cancels its
    request; under a BaseHTTPMiddleware the route never saw the disconnect and ran to max_tokens."""
    body: dict = {"model": MODEL, "max_tokens": 4000, "ignore_eos": True}
    if route == "/v1/completions":
        body["prompt"] = "hi"
    else:
        body["messages"] = [{"role": "user", "content": "hi"}]
    with pytest.raises(httpx.TimeoutException):
        httpx.post(server.url + route, json=body, timeout=1.0)
    _assert_idle_within(server.url, 5)


def test_sigterm_drains_in_flight_streams_refuses_new_and_exits_zero(tiny_dir) -> None:
    s = LiveServer("--shutdown-timeout", "120", "--log-level", "info", model_dir=tiny_dir)
    results: list[tuple[str | None, bool]] = [(None, False)] * 3
    started = [threading.Event() for _ in range(3)]
    ended = [threading.Event() for _ in range(3)]

    def stream(i: int) -> None:
        body = {"model": MODEL, "prompt": f"request {i}", "max_tokens": 150, "stream": True, "ignore_eos": True}
        reason, done = None, False
        with httpx.stream("POST", s.url + "/v1/completions", json=body, timeout=180) as r:
            for line in r.iter_lines():
                if line == "data: [DONE]":
                    done = True
                elif line.startswith("data: "):
                    started[i].set()
                    reason = json.loads(line[6:])["choices"][0]["finish_reason"] or reason
        started[i].set()
        ended[i].set()
        results[i] = (reason, done)

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for e in started:
        assert e.wait(timeout=120)  # every stream is under way
    s.terminate()
    in_flight = sum(not e.is_set() for e in ended)
    time.sleep(0.3)
    late = httpx.post(s.url + "/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 2}, timeout=30)
    assert late.status_code == 503 and late.headers.get("retry-after") == "1"
    assert late.json()["error"]["type"] == "service_unavailable"
    for t in threads:
        t.join(timeout=180)
    assert in_flight >= 1  # the drain had streams to finish
    assert results == [("length", True)] * 3, s.output()
    assert s.proc.wait(timeout=60) == 0, s.output()
    assert "draining" in s.output()


def test_stop_strings_logprobs_and_queue_full(server) -> None:
    """Completions: a stop string cuts the text (streamed and not, never leaking a prefix of it);
    logprobs come back per token; chat honours stop strings too."""
    base = {"model": MODEL, "prompt": "The quick brown fox", "max_tokens": 24, "temperature": 0, "ignore_eos": True}
    full = httpx.post(server.url + "/v1/completions", json=base, timeout=60).json()["choices"][0]["text"]
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    cut = full[: full.find(stop)]
    one = httpx.post(server.url + "/v1/completions", json={**base, "stop": [stop]}, timeout=60).json()
    assert one["choices"][0]["text"] == cut and one["choices"][0]["finish_reason"] == "stop"
    streamed, reason = "", None
    with httpx.stream("POST", server.url + "/v1/completions", json={**base, "stop": stop, "stream": True}) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                c = json.loads(line[6:])["choices"][0]
                streamed += c["text"]
                reason = c["finish_reason"] or reason
    assert streamed == cut and reason == "stop"
    lp = httpx.post(server.url + "/v1/completions", json={**base, "max_tokens": 4, "logprobs": 2}, timeout=60).json()
    block = lp["choices"][0]["logprobs"]
    assert len(block["token_logprobs"]) == 4 and all(v <= 0 for v in block["token_logprobs"])
    assert all(len(t) == 2 for t in block["top_logprobs"]) and "".join(block["tokens"]) == lp["choices"][0]["text"]


def test_queue_full_is_503_with_retry_after(tiny_dir) -> None:
    s = LiveServer("--max-num-seqs", "1", "--max-num-queued-reqs", "1", model_dir=tiny_dir)
    try:
        body = {"model": MODEL, "prompt": "x", "max_tokens": 400, "ignore_eos": True, "stream": True}
        started = threading.Event()

        def hold() -> None:
            with httpx.stream("POST", s.url + "/v1/completions", json=body, timeout=120) as r:
                for _ in r.iter_lines():
                    started.set()

        threads = [threading.Thread(target=hold) for _ in range(2)]
        threads[0].start()
        assert started.wait(60)  # one running
        threads[1].start()
        deadline = time.monotonic() + 30
        while _metrics(s.url)["dsv41rt:num_requests_waiting{}"] < 1 and time.monotonic() < deadline:
            time.sleep(0.05)  # the second request is queued behind the first
        r = httpx.post(s.url + "/v1/completions", json={**body, "stream": False, "max_tokens": 2}, timeout=30)
        assert r.status_code == 503 and r.headers["retry-after"] == "1", r.text
        assert "waiting" in r.json()["error"]["message"]
    finally:
        assert s.stop() == 0
        for t in threads:
            t.join(timeout=60)


def test_context_parallel_worker_processes_serve_the_same_tokens(server, tiny_dir) -> None:
    """`context-parallel-size: 2` + `cp-processes: true`: rank 1 is a `dsv41rt cp-worker` process
    (TCP on the CPU); greedy completions equal the single-rank server's, and SIGTERM ends the
    server and its worker with exit code 0."""
    cp = LiveServer("--context-parallel-size", "2", "--context-parallel-processes", "true", model_dir=tiny_dir)
    workers = _children(cp.proc.pid, "cp-worker")
    try:
        assert len(workers) == 1, workers
        for prompt in ("The quick brown fox", "context parallel " * 20):
            body = {"model": MODEL, "prompt": prompt, "max_tokens": 6, "temperature": 0, "ignore_eos": True}
            want = httpx.post(server.url + "/v1/completions", json=body, timeout=120).json()
            got = httpx.post(cp.url + "/v1/completions", json=body, timeout=120).json()
            assert got["choices"][0]["text"] == want["choices"][0]["text"], (got, want)
            assert got["usage"] == want["usage"]
    finally:
        assert cp.stop() == 0, cp.output()
    assert not [w for w in workers if os.path.exists(f"/proc/{w}")]  # the worker ended and was reaped


def _children(pid: int, word: str) -> list[int]:
    """Live child processes of `pid` whose command line contains `word` (Linux /proc)."""
    found = []
    for d in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError, IndexError):
            continue
        if ppid == pid and word in cmd:
            found.append(int(d))
    return found


def test_chat_logprobs_of_reasoning_tokens_are_in_content(server) -> None:
    """With thinking on, every generated token's logprob is in `logprobs.content` (where vLLM puts
    them, reasoning or not; the recipe wrote the reasoning tokens' under `logprobs.reasoning_content`,
    which OpenAI's object and clients do not have), in generation order; streamed and not."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 6,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 2,
        "thinking": {"type": "enabled"},
    }
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60).json()
    choice = r["choices"][0]
    message, logprobs = choice["message"], choice["logprobs"]
    assert message["reasoning_content"], r  # the tiny model does not close its reasoning in 6 tokens
    assert set(logprobs) == {"content"}, logprobs
    tokens = logprobs["content"]
    assert "".join(t["token"] for t in tokens) == message["reasoning_content"] + (message["content"] or "")
    assert tokens and all(t["logprob"] <= 0 and len(t["top_logprobs"]) == 2 for t in tokens)
    streamed = []
    with httpx.stream("POST", server.url + "/v1/chat/completions", json={**body, "stream": True}, timeout=60) as s:
        for line in s.iter_lines():
            if line.startswith("data: {"):
                for c in json.loads(line[6:])["choices"]:
                    lp = c.get("logprobs") or {}
                    assert "reasoning_content" not in lp, lp
                    text = (c["delta"].get("reasoning_content") or "") + (c["delta"].get("content") or "")
                    assert "".join(t["token"] for t in lp.get("content") or []) == text, c
                    streamed += lp.get("content") or []
    assert [t["token"] for t in streamed] == [t["token"] for t in tokens]
