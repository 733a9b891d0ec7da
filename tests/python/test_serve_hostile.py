"""Malformed and hostile requests against a live server: every one gets the right status and an
OpenAI-style error body, and the server stays healthy (and still answers correctly) afterwards."""

from __future__ import annotations

import random
import time

import httpx
import pytest
from serve_harness import LiveServer

MODEL = "dsv41rt-tiny-v41"
KEY = "sk-test-key"
CHAT, COMP = "/v1/chat/completions", "/v1/completions"
LIMIT = 65536


def _chat(**kw) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **kw}


def _comp(**kw) -> dict:
    return {"model": MODEL, "prompt": "hi", "max_tokens": 2, **kw}


JUNK = [None, True, "x", -1, 1.5, 1e308, -1e308, 2**64, [], {}, [1, "a"], {"a": 1}, "\u0000\ud7ff\uffff"]


def _cases() -> list[tuple[str, str, bytes | dict, int]]:
    """(name, path, body, expected status); a dict body is sent as JSON."""
    cases: list[tuple[str, str, bytes | dict, int]] = []
    raw = [
        b"",
        b"{",
        b"}",
        b"[",
        b"null",
        b"42",
        b'"str"',
        b"[]",
        b"{'a': 1}",
        b'{"model": }',
        b"\xff\xfe\xfd",
        b'{"model": "dsv41rt-tiny-v41", "messages": [}',
        b"\x00" * 10,
        '{"k": "\ud800"}'.encode("utf-8", "replace"),
    ]
    for i, b in enumerate(raw):
        for path in (CHAT, COMP, "/tokenize", "/detokenize"):
            cases.append((f"raw{i}{path}", path, b, 400))
    # Wrong types and out-of-range values, field by field.
    chat_fields = [
        "max_tokens",
        "temperature",
        "top_p",
        "n",
        "stream",
        "logprobs",
        "top_logprobs",
        "seed",
        "presence_penalty",
        "frequency_penalty",
        "stop",
        "messages",
        "top_k",
        "min_p",
        "repetition_penalty",
        "ignore_eos",
        "stop_token_ids",
    ]
    # Junk values that are valid for a field (None = the default; booleans where a flag is expected).
    text = JUNK[12]
    valid_chat = {
        "stream": (None, False, True),
        "logprobs": (None, False, True),
        "stop": (None, "x", [], text),
        "n": (None,),
        "ignore_eos": (None, False, True),
        "stop_token_ids": (None, []),
        "top_k": (None, -1),
        "temperature": (None, 1.5),
        "presence_penalty": (None, -1, 1.5),
        "frequency_penalty": (None, -1, 1.5),
        "repetition_penalty": (None, 1.5),
    }
    for f in chat_fields:
        for j, v in enumerate(JUNK):
            if any(v is w or (type(v) is type(w) and v == w) for w in valid_chat.get(f, (None,))):
                continue
            cases.append((f"chat.{f}={j}", CHAT, _chat(**{f: v}), 400))
    valid_comp = {
        "stop": (None, "x", [], text),
        "echo": (None, False),
        "stream": (None, False, True),
        "prompt": ("x", text),
        "temperature": (None, 1.5),
    }
    for f in ("max_tokens", "temperature", "top_p", "logprobs", "seed", "stop", "prompt", "n", "echo", "stream"):
        for j, v in enumerate(JUNK):
            if any(v is w or (type(v) is type(w) and v == w) for w in valid_comp.get(f, (None,))):
                continue
            cases.append((f"comp.{f}={j}", COMP, _comp(**{f: v}), 400))
    # Specific ones.
    cases += [
        ("negative max_tokens", CHAT, _chat(max_tokens=-5), 400),
        ("zero max_tokens", COMP, _comp(max_tokens=0), 400),
        ("huge max_tokens", COMP, _comp(max_tokens=10**12), 400),
        ("huge max_tokens chat", CHAT, _chat(max_tokens=10**9), 400),
        ("unknown model chat", CHAT, _chat(model="gpt-4"), 404),
        ("unknown model comp", COMP, _comp(model="gpt-4"), 404),
        ("model missing", CHAT, {"messages": [{"role": "user", "content": "x"}]}, 400),
        ("model not a string", COMP, _comp(model=7), 400),
        ("no messages", CHAT, {"model": MODEL}, 400),
        ("empty messages", CHAT, _chat(messages=[]), 400),
        ("bad role", CHAT, _chat(messages=[{"role": "wizard", "content": "x"}]), 400),
        ("content not text", CHAT, _chat(messages=[{"role": "user", "content": 12}]), 400),
        ("empty prompt", COMP, _comp(prompt=""), 400),
        ("prompt ids out of vocab", COMP, _comp(prompt=[1, 2, 10**9]), 400),
        ("negative prompt id", COMP, _comp(prompt=[-1]), 400),
        ("n=2", COMP, _comp(n=2), 400),
        ("echo", COMP, _comp(echo=True), 400),
        ("suffix", COMP, _comp(suffix="x"), 400),
        ("too many stops", COMP, _comp(stop=["a"] * 17), 400),
        ("bad stop_token_ids", CHAT, _chat(stop_token_ids=[10**9]), 400),
        ("detokenize junk", "/detokenize", {"tokens": ["a"]}, 400),
        ("detokenize out of vocab", "/detokenize", {"tokens": [10**9]}, 400),
        ("tokenize nothing", "/tokenize", {}, 400),
        ("reasoning_effort junk", CHAT, _chat(reasoning_effort="ultra-mega"), 400),
        ("thinking junk", CHAT, _chat(thinking={"type": "sideways"}), 400),
        ("prompt too long", COMP, _comp(prompt=[5] * 200_000), 413),  # over the body limit as JSON
        # Issue 23 D5: these were 500s.
        ("top_p 0 comp", COMP, _comp(top_p=0), 400),
        ("top_p 0 in float32 comp", COMP, _comp(top_p=1e-50), 400),
        ("top_p 0 chat", CHAT, _chat(top_p=0, thinking={"type": "disabled"}), 400),
    ]
    head = b'{"model": "dsv41rt-tiny-v41", "max_tokens": 2, '
    for path, field in ((CHAT, b'"messages": [{"role": "user", "content": "hi"}]'), (COMP, b'"prompt": "hi"')):
        cases += [
            (f"nested 130 deep {path}", path, head + field + b', "x": ' + b"[" * 130 + b"]" * 130 + b"}", 400),
            (f"nested 1000 deep {path}", path, head + field + b', "x": ' + b"[" * 1000 + b"]" * 1000 + b"}", 400),
            (f"5000-digit integer {path}", path, head + field + b', "seed": ' + b"9" * 5000 + b"}", 400),
        ]
    cases += [
        ("lone surrogate comp", COMP, head + b'"prompt": "a\\ud800b"}', 400),
        ("lone surrogate chat", CHAT, head + b'"messages": [{"role": "user", "content": "\\udfff"}]}', 400),
        ("lone surrogate tokenize", "/tokenize", b'{"model": "dsv41rt-tiny-v41", "prompt": "\\ud800"}', 400),
        ("nested tokenize", "/tokenize", b'{"prompt": "hi", "x": ' + b"[" * 200 + b"]" * 200 + b"}", 400),
    ]
    # Unicode junk in text fields is valid input: it must be served (200), not crash anything.
    rng = random.Random(0)
    for i in range(12):
        junk = "".join(
            chr(rng.choice([rng.randrange(0x20, 0xD7FF), rng.randrange(0xE000, 0x10FFFF)])) for _ in range(40)
        )
        cases.append((f"unicode chat {i}", CHAT, _chat(messages=[{"role": "user", "content": junk}]), 200))
        cases.append((f"unicode comp {i}", COMP, _comp(prompt=junk), 200))
    cases.append(("oversized body", CHAT, b'{"model": "' + b"a" * (LIMIT + 10) + b'"}', 413))
    cases.append(("oversized comp", COMP, _comp(prompt="word " * 20000), 413))
    return cases


CASES = _cases()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = LiveServer(
        "--max-request-bytes", str(LIMIT), "--api-key", KEY, model_dir=str(tmp_path_factory.mktemp("builtin") / "tiny")
    )
    yield s
    assert s.stop() == 0, s.output()


def test_at_least_200_hostile_requests_get_the_right_status_and_body(server) -> None:
    assert len(CASES) >= 200, len(CASES)
    headers = {"Authorization": f"Bearer {KEY}"}
    wrong: list[str] = []
    served: list[tuple[int, str, dict]] = []  # (max_tokens, finish_reason, usage) of each generation served
    with httpx.Client(base_url=server.url, headers=headers, timeout=60) as c:
        before = _metrics(c)
        for name, path, body, status in CASES:
            if isinstance(body, dict):
                r = c.post(path, json=body)
            else:
                r = c.post(path, content=body, headers={"content-type": "application/json"})
            if r.status_code != status:
                wrong.append(f"{name}: {r.status_code} (want {status}) {r.text[:160]}")
                continue
            if status == 200 and path in (CHAT, COMP):
                served.append((body["max_tokens"], r.json()["choices"][0]["finish_reason"], r.json()["usage"]))
            if status != 200:
                err = r.json().get("error")
                if not (isinstance(err, dict) and isinstance(err.get("message"), str) and err.get("type")):
                    wrong.append(f"{name}: error body {r.text[:160]}")
        assert not wrong, f"{len(wrong)} of {len(CASES)} wrong:\n" + "\n".join(wrong[:40])
        # Wrong or missing key.
        for h in ({}, {"Authorization": "Bearer nope"}, {"Authorization": KEY}, {"Authorization": "Basic x"}):
            r = httpx.post(server.url + CHAT, json=_chat(), headers=h, timeout=30)
            assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        # The scheme in any case (RFC 9110; `bearer` used to be refused).
        r = httpx.post(server.url + COMP, json=_comp(), headers={"Authorization": f"bearer {KEY}"}, timeout=30)
        assert r.status_code == 200, r.text
        served.append((2, r.json()["choices"][0]["finish_reason"], r.json()["usage"]))
        # Only JSON bodies run: a text/plain or form POST (cross-site without a preflight) is a 415.
        for ct in ("text/plain", "application/x-www-form-urlencoded"):
            r = c.post(COMP, content=b'{"model": "dsv41rt-tiny-v41", "prompt": "x"}', headers={"content-type": ct})
            assert r.status_code == 415 and r.json()["error"]["type"] == "invalid_request_error", r.text
        # Unknown routes and wrong methods: OpenAI-style error bodies.
        for r, status in ((c.get("/v1/nope"), 404), (c.get(COMP), 405)):
            assert r.status_code == status and isinstance(r.json()["error"]["message"], str), r.text
        # Still healthy and still correct.
        assert c.get("/health").status_code == 200
        ok = c.post(COMP, json=_comp(max_tokens=3, temperature=0))
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 3
        served.append((3, ok.json()["choices"][0]["finish_reason"], ok.json()["usage"]))
        # /metrics after the hostile traffic: it parses, nothing is left running, and the counters
        # moved by exactly the requests served (every refused request stayed out of the engine;
        # 400/401/413 are not admission rejections, which count only queue-full and draining).
        # Catches: a refused request that still reached the engine (or an extra/lost finish
        # count), a request left running or holding pages, token counters that do not match the
        # tokens served, and a /metrics page that no longer parses.
        assert len(served) == 26, len(served)  # 24 unicode requests + the lowercase-bearer one + the one above
        deadline = time.monotonic() + 10  # the engine thread publishes its stats after each step
        while True:
            after = _metrics(c)
            finished = _total(after, "dsv41rt:request_success_total") - _total(before, "dsv41rt:request_success_total")
            idle = after[("dsv41rt:num_requests_running", ())] == 0 == after[("dsv41rt:num_requests_waiting", ())]
            if (finished >= len(served) and idle) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert finished == len(served), (finished, len(served))
        assert idle and after[("dsv41rt:kv_cache_usage_perc", ())] == 0, after
        assert _total(after, "dsv41rt:request_success_total", finished_reason="abort") == _total(
            before, "dsv41rt:request_success_total", finished_reason="abort"
        )
        prompt = sum(u["prompt_tokens"] for _, _, u in served)
        assert _total(after, "dsv41rt:prompt_tokens_total") - _total(before, "dsv41rt:prompt_tokens_total") == prompt
        # A request that ends by length generated exactly max_tokens (chat's usage can report fewer:
        # deepseek-recipe drops, and does not count, a last token that ends inside a UTF-8 sequence).
        generated = sum(n if reason == "length" else u["completion_tokens"] for n, reason, u in served)
        assert (
            _total(after, "dsv41rt:generation_tokens_total") - _total(before, "dsv41rt:generation_tokens_total")
            == generated
        )
        for name in ("dsv41rt:time_to_first_token_seconds_count", "dsv41rt:e2e_request_latency_seconds_count"):
            assert _total(after, name) - _total(before, name) == len(served), name
        assert _total(after, "dsv41rt:admission_rejections_total") == _total(
            before, "dsv41rt:admission_rejections_total"
        )


def test_openapi_json_is_open_and_declares_the_key(server) -> None:
    """/openapi.json is outside the API key (what client generators and schema fuzzers read, as in
    vLLM) and says which routes need it."""
    r = httpx.get(server.url + "/openapi.json", timeout=30)
    assert r.status_code == 200, r.text[:300]
    doc = r.json()
    assert doc["components"]["securitySchemes"] == {"bearer": {"type": "http", "scheme": "bearer"}}
    chat = doc["paths"][CHAT]["post"]
    assert chat["security"] == [{"bearer": []}] and "401" in chat["responses"]
    health = doc["paths"]["/health"]["get"]
    assert "security" not in health and "401" not in health["responses"]
    assert httpx.get(server.url + "/v1/models", timeout=30).status_code == 401  # the rest is not open


def test_wrong_method_is_a_405_with_allow_and_an_openai_error(server) -> None:
    """Schema fuzzing found every 405 without `Allow` (RFC 9110 requires it): the handler that
    turns Starlette's errors into OpenAI error objects dropped the exception's headers."""
    headers = {"Authorization": f"Bearer {KEY}"}
    for method, path, allow in (("GET", COMP, "POST"), ("DELETE", "/v1/models", "GET"), ("PUT", "/health", "GET")):
        r = httpx.request(method, server.url + path, headers=headers, timeout=30)
        assert r.status_code == 405 and r.headers.get("allow") == allow, (method, path, r.headers)
        assert set(r.json()["error"]) == {"message", "type", "param", "code"}, r.text
    r = httpx.get(server.url + "/v1/nope", headers=headers, timeout=30)
    assert r.status_code == 404 and "allow" not in r.headers and r.json()["error"]["type"] == "not_found_error"


def test_completion_without_max_tokens_under_a_limit_below_16(tmp_path_factory) -> None:
    """Found by schema fuzzing: /v1/completions defaulted max_tokens to OpenAI's 16 and then refused
    it against the server's max-tokens-limit (here 4), so every request that did not send
    max_tokens was a 400 naming a field it had not sent. The default is now clipped to the limit."""
    limit = ("--max-tokens-limit", "4", "--default-max-tokens", "4")
    s = LiveServer(*limit, model_dir=str(tmp_path_factory.mktemp("builtin") / "tiny"))
    try:
        body = {"model": MODEL, "prompt": "hi", "ignore_eos": True}
        r = httpx.post(s.url + COMP, json=body, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 4
        r = httpx.post(s.url + COMP, json={**body, "max_tokens": 5}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens", r.text
    finally:
        assert s.stop() == 0, s.output()


def _metrics(c: httpx.Client) -> dict[tuple[str, tuple], float]:
    """/metrics parsed (the Prometheus text parser raises on a malformed page): (sample name, labels
    other than model_name) -> value."""
    from prometheus_client.parser import text_string_to_metric_families

    r = c.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain"), r.headers
    out = {}
    for fam in text_string_to_metric_families(r.text):
        for sm in fam.samples:
            assert sm.labels.get("model_name") == MODEL, sm
            out[(sm.name, tuple(sorted((k, v) for k, v in sm.labels.items() if k != "model_name")))] = sm.value
    return out


def _total(m: dict[tuple[str, tuple], float], name: str, **labels: str) -> float:
    """The sum of `name`'s samples whose labels include `labels` (0 when there are none yet)."""
    want = set(labels.items())
    return sum(v for (n, lab), v in m.items() if n == name and want <= set(lab))
