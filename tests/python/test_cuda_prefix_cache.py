"""Prefix caching on the GPU in the fp32 mode: a conversation (a prompt, the same prompt again, then the
next turn, which hits inside the first answer) gives the same tokens and logprobs, bitwise, with the
cache as without it, and the hits land where they do on the CPU (tests/python/test_prefix_cache.py).

Marked `cuda`: skipped without a GPU, run on the H200 by bench/device_session.sh (step `suite`)."""

from __future__ import annotations

import pytest
from dsv41rt import Runtime
from test_prefix_cache import _conversation, _evict_then_resend

pytestmark = pytest.mark.cuda


def test_cuda_fp32_same_tokens_with_and_without_the_cache(tiny_v41_dir) -> None:
    kw = dict(kv_memory=64 << 20, max_num_seqs=4, page_size=4, max_num_batched_tokens=16, precision="fp32")
    off = Runtime(tiny_v41_dir, "cuda", enable_prefix_caching=False, **kw)
    on = Runtime(tiny_v41_dir, "cuda", **kw)
    without, with_cache = _conversation(off), _conversation(on)
    assert [r[:2] for r in without] == [r[:2] for r in with_cache]  # tokens and logprobs, exactly
    assert [r[2] for r in without] == [0, 0, 0]
    assert [r[2] for r in with_cache] == [0, 36, 40]
    on.reset_prefix_cache()
    s = on.stats()
    assert s["pages_cached"] == 0 and s["slots_cached"] == 0


def test_cuda_fp32_host_tier_gives_back_what_the_pool_evicted(tiny_v41_dir) -> None:
    # The CPU test's small pool (tests/python/test_prefix_cache.py): the long prompts push the first
    # prompt's pages and snapshot out of the device pool into pinned host memory; re-sent, it comes
    # back from there (device <- host copies) with the tokens and logprobs of a run without the cache.
    kw = dict(kv_memory=2400 << 10, max_num_seqs=4, page_size=4, max_num_batched_tokens=24, max_model_len=128)
    kw.update(precision="fp32")
    reference = _evict_then_resend(Runtime(tiny_v41_dir, "cuda", enable_prefix_caching=False, **kw))
    with_host = Runtime(tiny_v41_dir, "cuda", host_cache_memory="1M", **kw)
    restored = _evict_then_resend(with_host)
    assert restored[2] == 36  # the last page boundary before token 37, from the host
    assert restored[:2] == reference[:2]  # tokens and logprobs, exactly
    s = with_host.stats()
    assert s["prefix_cache_offloaded_pages"] > 0 and s["prefix_cache_restored_pages"] > 0
    assert s["prefix_cache_restored_snapshots"] > 0
    with_host.check_invariants()
