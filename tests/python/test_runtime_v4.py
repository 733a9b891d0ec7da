"""The DeepSeek-V4 forward through the runtime's other paths on the CPU (docs/design/v4.md): batched
decode, fork / export-import of a handle and the engine (rollback: tests/python/test_rollback_v4.py).

The CPU's rows do not depend on the batch and the V4 compressors' state lives in the request slot,
which fork and export copy whole, so each of these is bitwise the single-handle path; with V4's
quantised caches too (`kv_cache_dtype auto` on a tiny-v4-d512 checkpoint: the forward QDQs its own
rows with the cache codec, so rows read back from the 584-byte cache and this forward's agree).
transformers agreement itself is tests/python/test_oracle_v4.py's (test_oracle_v4_quant.py's with
quantised caches).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from test_oracle_v41 import prompt_of


@pytest.fixture(scope="module")
def rt(tiny_v4_dir: str) -> Any:  # dsv41rt.runtime.Runtime
    from dsv41rt.runtime import Runtime

    return Runtime(tiny_v4_dir, kv_cache_dtype="float32", enable_prefix_caching=False)


@pytest.fixture(scope="module", params=["float32", "auto"])
def any_rt(request: pytest.FixtureRequest, tiny_v4_dir: str, tiny_v4_d512_dir: str) -> Any:
    """FP32 caches on tiny-v4, quantised caches (auto) on tiny-v4-d512."""
    from dsv41rt.runtime import Runtime

    ck = tiny_v4_dir if request.param == "float32" else tiny_v4_d512_dir
    return Runtime(ck, kv_cache_dtype=request.param, enable_prefix_caching=False)


def _decode_alone(rt: Any, prompt: list[int], tokens: list[int]) -> np.ndarray:
    h = rt.new_handle()
    rt.forward_tokens(h, prompt)
    rows = [rt.forward_tokens(h, [t])[0] for t in tokens]
    rt.release_handle(h)
    return np.stack(rows)


def test_batched_decode_equals_each_handle_alone(any_rt: Any) -> None:
    """Three requests (125 tokens, crossing the HCA group at 128 while decoding; 30; 1) decoded in
    one batch per step give each request's own logits bitwise."""
    rt = any_rt
    prompts = [prompt_of(125), prompt_of(30), prompt_of(1)]
    tokens = [7, 8, 9, 10, 11, 12]
    alone = [_decode_alone(rt, p, tokens) for p in prompts]
    handles = [rt.new_handle() for _ in prompts]
    for h, p in zip(handles, prompts, strict=True):
        rt.forward_tokens(h, p)
    batched = np.stack([rt.decode_handles(handles, [t] * len(handles)) for t in tokens], axis=1)
    for h in handles:
        rt.release_handle(h)
    for i, a in enumerate(alone):
        assert np.array_equal(batched[i], a), f"request {i}: differs by {np.abs(batched[i] - a).max()}"


def test_fork_and_import_continue_exactly(any_rt: Any) -> None:
    """The slot (window rings and every compressor's state) and the pages travel whole."""
    rt = any_rt
    h = rt.new_handle()
    rt.forward_tokens(h, prompt_of(127))
    forked = rt.fork_handle(h)
    imported = rt.import_handle(rt.export_handle(h))
    want = rt.forward_tokens(h, [5, 6])  # completes the HCA group at 128
    for other in (forked, imported):
        assert np.array_equal(rt.forward_tokens(other, [5, 6]), want)
        rt.release_handle(other)
    rt.release_handle(h)


def test_engine_generates_the_greedy_tokens_of_the_handles(rt: Any) -> None:
    prompts = [prompt_of(37), prompt_of(130)]
    got = rt.generate(prompts, max_new_tokens=5, ignore_eos=True)
    for p, tokens in zip(prompts, got, strict=True):
        h = rt.new_handle()
        want = []
        logits = rt.forward_tokens(h, p)
        for _ in range(5):
            want.append(int(np.argmax(logits[-1])))
            logits = rt.forward_tokens(h, [want[-1]])
        rt.release_handle(h)
        assert tokens == want
