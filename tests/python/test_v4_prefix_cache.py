"""The prefix cache with a DeepSeek-V4 checkpoint: the same tokens and logprobs with and without
it. A snapshot copies the whole request slot (the window ring and every compressor's pending
state: CSA's overlapping window, HCA's partial group of 128) and the shared pages hold the
compressed and index rows of whole groups, so nothing V4-specific is needed; these tests show it.
Pages hold 128 positions (HCA's group), so the prompts cross several page boundaries."""

from __future__ import annotations

import numpy as np
from dsv41rt import Runtime
from dsv41rt.sampling import SamplingParams
from test_prefix_cache import _drain, _prompt

V4 = dict(max_num_seqs=4, kv_cache_dtype="float32")


def _conversation(rt: Runtime) -> list[tuple[list[int], list[float], int]]:
    """A 300-token prompt, the same again, the next turn (prompt + answer + more), and a prompt
    sharing the first 200 tokens."""
    sampling = SamplingParams(temperature=0.7, seed=5)
    first = rt.add_request(_prompt(300, 1), max_new_tokens=40, sampling=sampling)
    done = _drain(rt)
    again = rt.add_request(_prompt(300, 1), max_new_tokens=40, sampling=sampling)
    turn = rt.add_request(_prompt(300, 1) + done[first][0] + _prompt(6, 2), max_new_tokens=40)
    other = rt.add_request(_prompt(200, 1) + _prompt(50, 3), max_new_tokens=20)
    done.update(_drain(rt))
    return [done[first], done[again], done[turn], done[other]]


def test_v4_same_tokens_with_and_without_the_cache(tiny_v4_dir: str) -> None:
    for chunk in (64, 512):  # prefill chunked at half a page, and whole prompts
        kw = dict(kv_memory=64 << 20, max_num_batched_tokens=chunk, **V4)
        without = _conversation(Runtime(tiny_v4_dir, enable_prefix_caching=False, **kw))
        on = Runtime(tiny_v4_dir, **kw)  # the default
        with_cache = _conversation(on)
        assert [r[:2] for r in without] == [r[:2] for r in with_cache], chunk  # tokens and logprobs
        # Re-sent and the next turn: the prompt's last page boundary (256); the shared 200 tokens
        # end at no snapshot (one is taken at a request's last boundary only).
        assert [r[2] for r in with_cache] == [0, 256, 256, 0], chunk
        assert on.stats()["prefix_cache_hits"] == 512


def _mixed(rt: Runtime, seed: int) -> list[tuple[list[int], list[float], int]]:
    """Rounds of six requests cut from three stems at random lengths, with random tails."""
    rng = np.random.default_rng(seed)
    stems = [_prompt(int(rng.integers(130, 400)), s) for s in range(3)]
    ids, out = [], {}
    for r in range(3):
        for i in range(6):
            stem = stems[int(rng.integers(0, 3))]
            p = stem[: int(rng.integers(1, len(stem)))] + _prompt(int(rng.integers(0, 20)), 50 + i + 10 * r)
            sampling = SamplingParams(temperature=0.8, seed=i)
            ids.append(rt.add_request(p, max_new_tokens=int(rng.integers(1, 30)), sampling=sampling))
        out.update(_drain(rt))
    return [out[i] for i in ids]


def test_v4_host_tier_brings_evicted_snapshots_back_exactly(tiny_v4_dir: str) -> None:
    kw = dict(kv_memory=8 << 20, max_num_batched_tokens=96, **V4)  # a small pool: evictions
    want = _mixed(Runtime(tiny_v4_dir, enable_prefix_caching=False, **kw), 7)
    rt = Runtime(tiny_v4_dir, host_cache_memory=64 << 20, **kw)
    got = _mixed(rt, 7)
    assert [r[:2] for r in got] == [r[:2] for r in want]
    s = rt.stats()
    assert s["prefix_cache_hits"] > 0 and s["prefix_cache_offloaded_snapshots"] > 0, s
    assert s["prefix_cache_restored_snapshots"] > 0, s
