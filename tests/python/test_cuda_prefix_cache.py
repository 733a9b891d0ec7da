"""Prefix caching on the GPU in the fp32 mode: a conversation (a prompt, the same prompt again, then the
next turn, which hits inside the first answer) gives the same tokens and logprobs, bitwise, with the
cache as without it, and the hits land where they do on the CPU (tests/python/test_prefix_cache.py).

Marked `cuda`: skipped without a GPU, run on the H200 by bench/device_session.sh (step `suite`)."""

from __future__ import annotations

import pytest
from dsv41rt import Runtime
from test_prefix_cache import _conversation

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
