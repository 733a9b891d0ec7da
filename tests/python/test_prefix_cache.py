"""Prefix caching through `dsv41rt.Runtime` (on by default): the same tokens and logprobs with and
without it, cached tokens per request, the counters, a reset that gives every page back, direct
handles taking storage back from the cache; and through a live server: `cached_tokens` in the
usage of completions and chat, the `/metrics` counters, `POST /reset_prefix_cache`.
With `host_cache_memory`, a prompt whose state a small pool evicted comes back from host memory.
The exactness at every kind of boundary and the randomised stress are the C++ suites
tests/cpp/test_prefix_cache*.cc."""

from __future__ import annotations

import httpx
import pytest
from dsv41rt import Runtime
from dsv41rt.sampling import SamplingParams
from serve_harness import LiveServer

MODEL = "dsv41rt-tiny-v41"


def _prompt(n: int, salt: int) -> list[int]:
    return [(i * 7919 + salt * 104729 + 13) % 120000 + 3 for i in range(n)]


def _drain(rt: Runtime) -> dict[int, tuple[list[int], list[float], int]]:
    out: dict[int, tuple[list[int], list[float], int]] = {}
    while rt.has_unfinished():
        for o in rt.step():
            tokens, lps, cached = out.get(o.request_id, ([], [], -1))
            out[o.request_id] = (tokens + o.new_tokens, lps + o.logprobs, max(cached, o.cached_tokens))
        rt.check_invariants()
    return out


def _conversation(rt: Runtime) -> list[tuple[list[int], list[float], int]]:
    """A prompt, the same prompt again, then the next turn (prompt + answer + more)."""
    sampling = SamplingParams(temperature=0.7, seed=5)
    first = rt.add_request(_prompt(37, 1), max_new_tokens=5, sampling=sampling)
    done = _drain(rt)
    again = rt.add_request(_prompt(37, 1), max_new_tokens=5, sampling=sampling)
    turn = rt.add_request(_prompt(37, 1) + done[first][0] + _prompt(6, 2), max_new_tokens=5)
    done.update(_drain(rt))
    return [done[first], done[again], done[turn]]


def test_same_tokens_with_and_without_the_cache(tiny_v41_dir) -> None:
    kw = dict(kv_memory=64 << 20, max_num_seqs=4, page_size=4, max_num_batched_tokens=16)
    off = Runtime(tiny_v41_dir, enable_prefix_caching=False, **kw)
    on = Runtime(tiny_v41_dir, **kw)  # the default
    without, with_cache = _conversation(off), _conversation(on)
    assert [r[:2] for r in without] == [r[:2] for r in with_cache]  # tokens and logprobs, exactly
    assert [r[2] for r in without] == [0, 0, 0]
    # Re-sent: the last page boundary before token 37; the next turn: 40, inside the first answer
    # (37 + 5 tokens: a snapshot taken while decoding).
    assert [r[2] for r in with_cache] == [0, 36, 40]
    s = on.stats()
    assert s["prefix_cache_queries"] == 37 + 37 + 48 and s["prefix_cache_hits"] == 36 + 40
    assert off.stats()["prefix_cache_queries"] == 0
    # Idle: only the cache holds storage, reported apart from what requests use.
    assert s["pages_used"] == 0 and s["slots_used"] == 0
    assert s["pages_cached"] > 0 and s["slots_cached"] > 0
    on.reset_prefix_cache()
    s = on.stats()
    assert s["pages_cached"] == 0 and s["slots_cached"] == 0
    on.check_invariants()
    assert _conversation(on)[1][2] == 36  # caching again after the reset


def test_direct_handles_take_storage_back_from_the_cache(tiny_v41_dir) -> None:
    rt = Runtime(tiny_v41_dir, kv_memory=64 << 20, max_num_seqs=2, page_size=4)
    for salt in (1, 2):  # the second request's snapshot takes the first's slot
        rt.add_request(_prompt(21, salt), max_new_tokens=2)
        _drain(rt)
    assert rt.stats()["slots_cached"] == 1
    handles = [rt.new_handle(), rt.new_handle()]  # the free slot, then the snapshot's
    assert rt.stats()["slots_cached"] == 0
    logits = rt.forward_tokens(handles[0], _prompt(21, 1))
    assert logits.shape[0] == 21
    for h in handles:
        rt.release_handle(h)
    both = [rt.new_handle(), rt.new_handle()]
    with pytest.raises(Exception, match="no free request slot"):  # nothing cached is left to give
        rt.new_handle()
    for h in both:
        rt.release_handle(h)


def _evict_then_resend(rt: Runtime) -> tuple[list[int], list[float], int]:
    """A prompt, three long prompts that push its pages and snapshot out of a small pool, the prompt
    again: its tokens, logprobs and cached tokens."""
    rt.add_request(_prompt(37, 1), max_new_tokens=4)
    _drain(rt)
    for salt in (2, 3, 4):
        rt.add_request(_prompt(96, salt), max_new_tokens=2)
        _drain(rt)
    again = rt.add_request(_prompt(37, 1), max_new_tokens=4)
    return _drain(rt)[again]


def test_host_tier_brings_evicted_prefixes_back(tiny_v41_dir) -> None:
    # About 40 pages of 4 positions and 4 slots: the long prompts evict the first prompt's state.
    kw = dict(kv_memory=2400 << 10, max_num_seqs=4, page_size=4, max_num_batched_tokens=24, max_model_len=128)
    reference = _evict_then_resend(Runtime(tiny_v41_dir, enable_prefix_caching=False, **kw))
    without_host = Runtime(tiny_v41_dir, **kw)
    assert without_host.stats()["pages_total"] < 60
    evicted = _evict_then_resend(without_host)
    assert evicted[2] == 0  # recomputed: nothing of it was left in the pool
    with_host = Runtime(tiny_v41_dir, host_cache_memory="1M", **kw)
    restored = _evict_then_resend(with_host)
    assert restored[2] == 36  # the last page boundary before token 37, from the host
    assert restored[:2] == evicted[:2] == reference[:2]  # tokens and logprobs, exactly
    s = with_host.stats()
    assert s["prefix_cache_offloaded_pages"] > 0 and s["prefix_cache_restored_pages"] > 0
    assert s["prefix_cache_restored_snapshots"] > 0
    assert 0 < s["prefix_cache_host_bytes"] <= 1 << 20
    with_host.check_invariants()
    with_host.reset_prefix_cache()
    s = with_host.stats()
    assert s["prefix_cache_host_bytes"] == 0 and s["prefix_cache_host_pages"] == 0
    assert s["pages_cached"] == 0 and s["slots_cached"] == 0
    with pytest.raises(Exception, match="host-cache-memory: must be >= 0"):
        Runtime(tiny_v41_dir, host_cache_memory=-1, **kw)


def test_host_tier_of_a_process_group(tiny_v41_dir) -> None:
    """A CP 2 group whose rank 1 is a worker process (TCP): pages offloaded from rank 0's replica
    and restored into every rank's (the leader's host copy sends them to the worker) give one
    runtime's tokens and logprobs exactly, and the worker's pool stays in step (a later prompt that
    runs on both ranks still matches)."""
    from dsv41rt.cp_launch import cp_processes
    from dsv41rt.options import RuntimeOptions

    kw = dict(kv_memory=2400 << 10, max_num_seqs=4, page_size=4, max_num_batched_tokens=24, max_model_len=128)
    reference = _evict_then_resend(Runtime(tiny_v41_dir, enable_prefix_caching=False, **kw))
    opts = RuntimeOptions(context_parallel_size=2, host_cache_memory=1 << 20, **kw)
    with cp_processes(tiny_v41_dir, opts, comm="socket") as rt:
        restored = _evict_then_resend(rt)
        s = rt.stats()
        turn = rt.add_request(_prompt(37, 1) + restored[0] + _prompt(9, 5), max_new_tokens=4)
        after = _drain(rt)[turn]
    assert restored[2] == 36 and restored[:2] == reference[:2]
    assert s["prefix_cache_restored_pages"] > 0
    one = Runtime(tiny_v41_dir, enable_prefix_caching=False, **kw)
    want = one.add_request(_prompt(37, 1) + reference[0] + _prompt(9, 5), max_new_tokens=4)
    assert after[:2] == _drain(one)[want][:2]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model_dir = str(tmp_path_factory.mktemp("builtin") / "tiny-v41-seed0")
    s = LiveServer("--page-size", "4", model_dir=model_dir)
    s.model_dir = model_dir  # the built-in model the server wrote (its tokenizer encodes the chats)
    yield s
    assert s.stop() == 0, s.output()


def _counter(url: str, name: str) -> float:
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith(f"dsv41rt:{name}{{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name} in /metrics")


def test_server_reports_cached_tokens_and_counts(server) -> None:
    body = {"model": MODEL, "prompt": "one two three four five six seven eight nine ten", "max_tokens": 3}
    queries, hits = _counter(server.url, "prefix_cache_queries_total"), _counter(server.url, "prefix_cache_hits_total")
    usages = [httpx.post(server.url + "/v1/completions", json=body, timeout=60).json()["usage"] for _ in range(2)]
    n = usages[0]["prompt_tokens"]
    assert usages[0]["prompt_tokens_details"]["cached_tokens"] == 0
    assert usages[1]["prompt_tokens_details"]["cached_tokens"] == (n - 1) // 4 * 4 > 0
    assert usages[1]["prompt_cache_hit_tokens"] == (n - 1) // 4 * 4
    assert usages[1]["prompt_cache_miss_tokens"] == n - (n - 1) // 4 * 4
    assert _counter(server.url, "prefix_cache_queries_total") == queries + 2 * n
    assert _counter(server.url, "prefix_cache_hits_total") == hits + (n - 1) // 4 * 4
    # The host tier is off by default: its metrics are there and stay at zero.
    assert _counter(server.url, "prefix_cache_host_offloaded_pages_total") == 0
    assert _counter(server.url, "prefix_cache_host_restored_pages_total") == 0
    assert _counter(server.url, "prefix_cache_host_restored_snapshots_total") == 0
    assert _counter(server.url, "prefix_cache_host_bytes") == 0

    chat = {"model": MODEL, "messages": [{"role": "user", "content": "tell me a long story " * 4}], "max_tokens": 2}
    first = httpx.post(server.url + "/v1/chat/completions", json=chat, timeout=60).json()["usage"]
    second = httpx.post(server.url + "/v1/chat/completions", json=chat, timeout=60).json()["usage"]
    assert first["prompt_tokens_details"]["cached_tokens"] == 0
    cached = second["prompt_tokens_details"]["cached_tokens"]
    assert cached == (second["prompt_tokens"] - 1) // 4 * 4 and second["prompt_cache_hit_tokens"] == cached

    r = httpx.post(server.url + "/reset_prefix_cache", timeout=30)
    assert r.status_code == 200
    third = httpx.post(server.url + "/v1/chat/completions", json=chat, timeout=60).json()["usage"]
    assert third["prompt_tokens_details"]["cached_tokens"] == 0


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look a fact up.",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
        },
    }
]


def _agent_turns() -> list[tuple[list[dict], bool]]:
    """A 10-request agentic transcript: (messages sent, thinking) per request. Thinking turns call a
    tool and pass their reasoning back (V4.1 keeps earlier reasoning in the prompt: the transcript
    only grows); request 8 switches thinking off, which re-renders the whole history."""
    msgs: list[dict] = [{"role": "system", "content": "You are a careful research agent."}]
    out: list[tuple[list[dict], bool]] = []
    for turn in range(5):
        msgs = msgs + [{"role": "user", "content": f"question {turn}: what is fact number {turn * 7}?"}]
        thinking = turn < 4
        out.append((msgs, thinking))  # the model is asked; it answers with a tool call
        args = f'{{"q": "fact {turn * 7}"}}'
        call = {"id": f"call_{turn}", "type": "function", "function": {"name": "lookup", "arguments": args}}
        reasoning = f"I should look fact {turn * 7} up."
        msgs = msgs + [
            {"role": "assistant", "reasoning_content": reasoning, "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"call_{turn}", "content": f"fact {turn * 7} is {turn * 13}"},
        ]
        out.append((msgs, thinking))  # the model is asked again with the tool's result
        msgs = msgs + [{"role": "assistant", "reasoning_content": "Now I know.", "content": f"It is {turn * 13}."}]
    return out


def test_agentic_transcript_hits_the_stable_prefix(server) -> None:
    """10 requests of a tool-calling conversation through the server: each resumes from the snapshot
    of the longest earlier prompt it starts with (max_tokens 1: nothing generated is cached, so the
    expectation is exact), and a switch of thinking mode misses (the V4.1 encoding re-renders the
    system prompt and every earlier turn's reasoning); docs/design/prefix-cache.md explains."""
    import deepseek_recipe as dr
    from dsv41rt.serve.protocol import ChatProtocol, Tokenizers

    httpx.post(server.url + "/reset_prefix_cache", timeout=30).raise_for_status()
    proto = ChatProtocol(Tokenizers(server.model_dir), (MODEL,), True, 1 << 30)
    page = 4
    sent: list[list[int]] = []
    report = []
    for i, (msgs, thinking) in enumerate(_agent_turns()):
        body = {"model": MODEL, "messages": msgs, "tools": TOOLS, "max_tokens": 1, "temperature": 0}
        if not thinking:
            body["thinking"] = {"type": "disabled"}
        prompt = proto.encoding.encode(dr.ChatCompletionRequest(dict(body)).convert(proto.options).conversation)
        r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        usage = r.json()["usage"]
        assert usage["prompt_tokens"] == len(prompt)

        def common(a: list[int], b: list[int]) -> int:
            n = 0
            while n < min(len(a), len(b)) and a[n] == b[n]:
                n += 1
            return n

        # Each earlier prompt left a snapshot at its last page boundary before its last token
        # (docs/design/prefix-cache.md); this one resumes from the deepest that it starts with.
        best = max((common(prompt, old) for old in sent), default=0)
        snaps = [(len(old) - 1) // page * page for old in sent]
        usable = [s for s, old in zip(snaps, sent, strict=True) if common(prompt, old) >= s and s <= len(prompt) - 1]
        expected = max(usable, default=0)
        cached = usage["prompt_tokens_details"]["cached_tokens"]
        report.append((i, thinking, len(prompt), best, cached))
        assert cached == expected, report
        assert usage["prompt_cache_hit_tokens"] == cached
        sent.append(prompt)
    print("\nrequest, thinking, prompt tokens, common prefix with an earlier prompt, cached tokens")
    for row in report:
        print(*row)
    hits = [r[4] for r in report]
    assert all(h > 0 for i, h in enumerate(hits) if i not in (0, 8)), report  # every stable turn hits
    assert hits[8] < report[8][2] // 2, report  # thinking switched off: the history re-rendered
    assert hits[9] >= report[8][2] // page * page - page, report  # ... and cached again from there
