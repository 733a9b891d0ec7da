"""Prefill/decode disaggregation end to end on the CPU (issue 26): `dsv41rt router` over a prefill
server and a decode server (`dsv41rt serve --disaggregation-mode ...`, built-in tiny model), each
its own process, the state moved with NIXL (the default handoff-transport; one pair with http).
The router's answers equal a single server's (the decode server asked directly,
without a handoff), bitwise in tokens and logprobs; the OpenAI client sees one ordinary server;
failures are clear errors."""

from __future__ import annotations

import subprocess
import sys
import time

import httpx
import numpy as np
import pytest
from serve_harness import LiveServer, free_port

MODEL = "dsv41rt-tiny-v41"
LENGTHS = [1, 2, 3, 5, 8, 9, 16, 17, 31, 40, 64, 100, 129, 200, 257, 300]


def Router(prefill: list[str], decode: list[str]) -> LiveServer:  # noqa: N802 (reads as the process it starts)
    return LiveServer("--prefill", *prefill, "--decode", *decode, command="router")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("builtin") / "tiny-v41-seed0")


@pytest.fixture(scope="module")
def cluster(tiny_dir):
    prefill = LiveServer("--disaggregation-mode", "prefill", model_dir=tiny_dir)
    decode = LiveServer("--disaggregation-mode", "decode", model_dir=tiny_dir)
    router = Router([prefill.url], [decode.url])
    yield prefill, decode, router
    router.stop()
    assert decode.stop() == 0, decode.output()
    assert prefill.stop() == 0, prefill.output()


def _tokens_and_logprobs(body: dict) -> tuple:
    c = body["choices"][0]
    lp = c["logprobs"]
    return c["text"], lp["tokens"], lp["token_logprobs"], lp["top_logprobs"], c["finish_reason"]


def assert_routed_equals_direct(
    router: LiveServer, decode: LiveServer, lengths, seed: int, max_tokens: int, logprobs: int
) -> None:
    """Greedy completions of random prompts of `lengths` tokens through the router equal the decode
    server's own answers bitwise (text, tokens, logprobs, top logprobs, finish reason)."""
    rng = np.random.default_rng(seed)
    for n in lengths:
        prompt = [int(t) for t in rng.integers(3, 1000, n)]
        body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "logprobs": logprobs}
        body["ignore_eos"] = True
        direct = httpx.post(decode.url + "/v1/completions", json=body, timeout=120)
        routed = httpx.post(router.url + "/v1/completions", json=body, timeout=120)
        assert direct.status_code == 200 and routed.status_code == 200, (direct.text, routed.text)
        assert _tokens_and_logprobs(routed.json()) == _tokens_and_logprobs(direct.json()), f"prompt of {n}"


def metric(server: LiveServer, name: str) -> float:
    for line in httpx.get(server.url + "/metrics", timeout=10).text.splitlines():
        if line.startswith(f"dsv41rt:{name}{{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no metric {name}")


def test_completions_through_the_router_equal_a_single_server(cluster) -> None:
    """16 prompts of 1..300 tokens, greedy with logprobs: text, tokens, logprobs and top logprobs
    equal the decode server's own answers, bitwise (JSON floats round-trip exactly). The prompt
    runs on the prefill server only: the decode server computes the 7 decode positions alone."""
    prefill, decode, router = cluster
    rng = np.random.default_rng(26)
    handoffs = metric(decode, "handoff_transfer_seconds_count")
    for n in LENGTHS:
        prompt = [int(t) for t in rng.integers(3, 1000, n)]
        body = {"model": MODEL, "prompt": prompt, "max_tokens": 8, "temperature": 0, "logprobs": 3, "ignore_eos": True}
        direct = httpx.post(decode.url + "/v1/completions", json=body, timeout=120)
        computed = metric(decode, "model_tokens_computed_total")
        routed = httpx.post(router.url + "/v1/completions", json=body, timeout=120)
        assert direct.status_code == 200 and routed.status_code == 200, (direct.text, routed.text)
        assert _tokens_and_logprobs(routed.json()) == _tokens_and_logprobs(direct.json()), f"prompt of {n}"
        assert routed.json()["usage"]["completion_tokens"] == 8
        assert metric(decode, "model_tokens_computed_total") - computed == 7, f"prompt of {n}"
    assert metric(decode, "handoff_transfer_seconds_count") - handoffs == len(LENGTHS)
    assert metric(decode, "handoff_received_bytes_total") > 0
    # The state moved with NIXL (the default transport).
    text = httpx.get(decode.url + "/metrics", timeout=10).text
    assert f'handoff_transfer_seconds_count{{model_name="{MODEL}",transport="nixl"}} {handoffs + len(LENGTHS)}' in text
    # Each READ's notification frees its state on the prefill server (reaped every 0.5 s).
    deadline = time.monotonic() + 10
    while metric(prefill, "handoff_lent_states") != 0:
        assert time.monotonic() < deadline, "the prefill server still holds lent states"
        time.sleep(0.1)


def test_the_http_transport_and_a_mismatched_pair(cluster, tiny_dir) -> None:
    """`handoff-transport: http` carries the state in the GET answer: the same answers as one
    server. A pair whose transports differ is a clear error naming the setting, not a hang."""
    _, nixl_decode, _ = cluster
    flags = ("--handoff-transport", "http")
    prefill = LiveServer("--disaggregation-mode", "prefill", *flags, model_dir=tiny_dir)
    decode = LiveServer("--disaggregation-mode", "decode", *flags, model_dir=tiny_dir)
    router, mismatched = Router([prefill.url], [decode.url]), Router([prefill.url], [nixl_decode.url])
    try:
        assert_routed_equals_direct(router, decode, (1, 129), seed=2626, max_tokens=4, logprobs=2)
        text = httpx.get(decode.url + "/metrics", timeout=10).text
        assert 'handoff_transfer_seconds_count{model_name="dsv41rt-tiny-v41",transport="http"} 2.0' in text
        r = httpx.post(mismatched.url + "/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 4})
        assert r.status_code == 503, r.text
        assert "handoff-transport mismatch: this prefill server uses 'http'" in r.text
        assert "asked for 'nixl'" in r.text
    finally:
        router.stop()
        mismatched.stop()
        assert decode.stop() == 0, decode.output()
        assert prefill.stop() == 0, prefill.output()


def test_nixl_without_its_package_is_refused_at_start(tmp_path) -> None:
    """Without nixl_cu13, `serve` with the nixl transport (the default) stops before loading a
    model, naming the package and the extra."""
    hide = "import sys; sys.modules['nixl_cu13'] = None; from dsv41rt.cli import main; sys.exit(main())"
    cmd = [sys.executable, "-c", hide, "serve", "--disaggregation-mode", "decode", "--port", str(free_port())]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "handoff-transport: nixl needs the nixl-cu13 package" in done.stderr
    assert "pip install 'dsv41rt[disagg]'" in done.stderr


@pytest.mark.parametrize("processes", [False, True])
def test_a_context_parallel_prefill_side_equals_a_single_server(cluster, tiny_dir, processes: bool) -> None:
    """A CP 2 prefill server (two ranks in its process, or rank 1 a worker process; the prompt's
    rows split between them) hands off states the decode server continues exactly: the same
    answers as the decode server alone."""
    _, decode, _ = cluster
    extra = ("--context-parallel-processes", "true") if processes else ()
    prefill = LiveServer("--disaggregation-mode", "prefill", "--context-parallel-size", "2", *extra, model_dir=tiny_dir)
    router = Router([prefill.url], [decode.url])
    try:
        rng = np.random.default_rng(262)
        for n in (1, 17, 129, 300):
            prompt = [int(t) for t in rng.integers(3, 1000, n)]
            body = {
                "model": MODEL,
                "prompt": prompt,
                "max_tokens": 6,
                "temperature": 0,
                "logprobs": 3,
                "ignore_eos": True,
            }
            direct = httpx.post(decode.url + "/v1/completions", json=body, timeout=120)
            routed = httpx.post(router.url + "/v1/completions", json=body, timeout=120)
            assert direct.status_code == 200 and routed.status_code == 200, (direct.text, routed.text)
            assert _tokens_and_logprobs(routed.json()) == _tokens_and_logprobs(direct.json()), f"prompt of {n}"
    finally:
        router.stop()
        assert prefill.stop() == 0, prefill.output()


def test_the_openai_client_sees_one_server_streamed_or_not(cluster) -> None:
    openai = pytest.importorskip("openai")
    _, decode, router = cluster
    messages = [{"role": "user", "content": "Tell me about disaggregated serving."}]
    kw = {"model": MODEL, "messages": messages, "max_tokens": 10, "temperature": 0, "logprobs": True, "top_logprobs": 2}
    direct = openai.OpenAI(base_url=decode.url + "/v1", api_key="x").chat.completions.create(**kw)
    client = openai.OpenAI(base_url=router.url + "/v1", api_key="x")
    routed = client.chat.completions.create(**kw)
    assert routed.choices[0].message.content == direct.choices[0].message.content
    assert routed.choices[0].logprobs.model_dump() == direct.choices[0].logprobs.model_dump()
    chunks = client.chat.completions.create(**kw, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == direct.choices[0].message.content
    # One token only: the request ends on the prefill server and the decode server just answers it.
    one = client.chat.completions.create(**{**kw, "max_tokens": 1})
    assert one.choices[0].finish_reason == "length" and one.usage.completion_tokens == 1
    assert [m.id for m in client.models.list().data] == [MODEL]


def test_a_bad_request_gets_the_servers_own_error(cluster) -> None:
    _, _, router = cluster
    r = httpx.post(router.url + "/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": -1}, timeout=60)
    assert r.status_code == 400 and "max_tokens" in r.text


def test_no_decode_server_is_a_503_with_retry_after_and_the_prefill_server_keeps_serving(cluster) -> None:
    prefill, decode, _ = cluster
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    router = Router([prefill.url], [dead])
    try:
        body = {"model": MODEL, "prompt": "hi", "max_tokens": 4}
        r = httpx.post(router.url + "/v1/completions", json=body, timeout=60)
        assert r.status_code == 503, r.text
        assert r.headers.get("retry-after") == "1"
        assert "decode" in r.json()["error"]["message"]
    finally:
        router.stop()
    ok = httpx.post(prefill.url + "/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 4}, timeout=60)
    assert ok.status_code == 200, ok.text


def test_a_decode_server_refuses_foreign_or_missing_handoffs(cluster) -> None:
    prefill, decode, _ = cluster
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 4}
    headers = {"x-dsv41rt-handoff-id": "abc", "x-dsv41rt-prefill-url": "http://example.com:1"}
    r = httpx.post(decode.url + "/v1/completions", json=body, headers=headers, timeout=60)
    assert r.status_code == 400 and "not a configured prefill server" in r.text
    r = httpx.post(decode.url + "/v1/completions", json=body, headers={**headers, "x-dsv41rt-prefill-url": prefill.url})
    assert r.status_code == 502 and "answered 404" in r.text
    r = httpx.post(decode.url + "/v1/completions", json=body, headers={"x-dsv41rt-handoff-id": "a/b"}, timeout=60)
    assert r.status_code == 400 and "not a handoff id" in r.text


def _no_pages_held(server: LiveServer) -> None:
    """After the prefix cache lets go, a server holds no KV pages: nothing leaked."""
    assert httpx.post(server.url + "/reset_prefix_cache", timeout=30).status_code == 200
    assert metric(server, "kv_cache_usage_perc") == 0.0


def test_killed_servers_give_clear_errors_leak_nothing_and_the_router_keeps_serving(cluster, tiny_dir) -> None:
    prefill, decode, _ = cluster
    doomed_decode = LiveServer("--disaggregation-mode", "decode", model_dir=tiny_dir)
    doomed_prefill = LiveServer("--disaggregation-mode", "prefill", model_dir=tiny_dir)
    router = Router([prefill.url, doomed_prefill.url], [doomed_decode.url, decode.url])
    try:
        # A decode server killed mid-answer (round robin sends the first request to it): the stream
        # ends with an error event naming the failure.
        body = {"model": MODEL, "prompt": "hello", "max_tokens": 1000, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", router.url + "/v1/completions", json=body, timeout=120) as r:
            assert r.status_code == 200
            events = (line for line in r.iter_lines() if line.startswith("data: "))
            assert '"text"' in next(events)
            doomed_decode.proc.kill()
            rest = list(events)
        assert "the decode server failed mid-answer" in rest[-1], rest[-3:]
        # A prefill server killed after its prefill, before the decode server fetched the state:
        # the decode server answers 502 and takes no pages.
        handoff = {"x-dsv41rt-handoff-id": "killed-1"}
        short = {"model": MODEL, "prompt": "hi there", "max_tokens": 4, "ignore_eos": True}
        assert httpx.post(doomed_prefill.url + "/v1/completions", json=short, headers=handoff).status_code == 200
        doomed_prefill.proc.kill()
        doomed_prefill.proc.wait()
        headers = {**handoff, "x-dsv41rt-prefill-url": doomed_prefill.url}
        r2 = httpx.post(decode.url + "/v1/completions", json=short, headers=headers, timeout=60)
        assert r2.status_code == 502 and "unreachable" in r2.text
        # The router goes on over the surviving pair, skipping the dead peers.
        for _ in range(4):
            ok = httpx.post(router.url + "/v1/completions", json=short, timeout=60)
            assert ok.status_code == 200, ok.text
            assert ok.json()["usage"]["completion_tokens"] == 4
        for survivor in (prefill, decode):
            _no_pages_held(survivor)
    finally:
        router.stop()
        doomed_decode.stop()
        doomed_prefill.stop()
