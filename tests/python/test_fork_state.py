"""Prefix sharing by copy (Executor::copy_state through Runtime.fork_handle) and batched handle
decode, on the CPU executor and (marked `cuda`) on the GPU executor. A forked handle must continue
bit for bit as its source does, and as a fresh handle prefilled with the same tokens."""

from __future__ import annotations

import numpy as np
import pytest


def prompt_of(n: int, seed: int = 7) -> list[int]:
    return [0] + [int(t) for t in np.random.default_rng(seed).integers(3, 129000, n - 1)]


def check_fork_continues_like_source(rt) -> None:
    p = prompt_of(150)  # crosses pages (64 positions) and compression groups
    src = rt.new_handle()
    rt.forward_tokens(src, p)
    forks = [rt.fork_handle(src) for _ in range(2)]
    fresh = rt.new_handle()
    rt.forward_tokens(fresh, p)
    handles = [src, *forks, fresh]
    tokens = [5, 77, 1234, 9, 100000, 42]
    for t in tokens:
        batched = rt.decode_handles(handles, [t] * len(handles))
        for row in batched[1:]:
            assert np.array_equal(row, batched[0])
    alone = rt.new_handle()
    rt.forward_tokens(alone, p + tokens[:-1])
    last = rt.forward_tokens(alone, tokens[-1:])
    assert np.array_equal(last[0], batched[0])
    for h in [*handles, alone]:
        rt.release_handle(h)
    assert rt.stats()["pages_used"] == 0


def test_fork_continues_like_source_cpu(tiny_v41_dir) -> None:
    from dsv41rt.runtime import Runtime

    check_fork_continues_like_source(Runtime(tiny_v41_dir))


@pytest.mark.cuda
def test_fork_continues_like_source_cuda(tiny_v41_dir) -> None:
    from dsv41rt.runtime import Runtime

    check_fork_continues_like_source(Runtime(tiny_v41_dir, "cuda"))


def check_greedy_decode_is_the_logits_argmax(rt) -> None:
    """decode_handles_greedy draws on the device what decode_handles' logits say (argmax, raw
    log_softmax within FP32 rounding of the reference below), and leaves the state as decode_handles
    does: the next step's logits of a handle stepped each way are bitwise equal."""
    p = prompt_of(90)
    a, b = rt.new_handle(), rt.new_handle()
    rt.forward_tokens(a, p)
    rt.forward_tokens(b, p[:40])  # a second handle of another length in the same batch
    c, d = rt.fork_handle(a), rt.fork_handle(b)
    token = [11, 4242]
    for _ in range(3):
        logits = rt.decode_handles([a, b], token)
        nxt, lps = rt.decode_handles_greedy([c, d], token)
        assert nxt.dtype == np.int32 and lps.dtype == np.float32 and nxt.shape == lps.shape == (2,)
        want = logits.argmax(-1)
        assert nxt.tolist() == want.tolist()
        ref = logits.astype(np.float64)
        ref = ref - ref.max(-1, keepdims=True)
        ref = ref - np.log(np.exp(ref).sum(-1, keepdims=True))
        assert np.abs(lps - ref[np.arange(2), want]).max() <= 1e-5
        token = nxt.tolist()
    assert np.array_equal(rt.decode_handles([a, b], token), rt.decode_handles([c, d], token))
    with pytest.raises(Exception, match="given twice"):
        rt.decode_handles_greedy([a, a], [1, 2])
    for h in (a, b, c, d):
        rt.release_handle(h)


def test_greedy_decode_is_the_logits_argmax_cpu(tiny_v41_dir) -> None:
    from dsv41rt.runtime import Runtime

    check_greedy_decode_is_the_logits_argmax(Runtime(tiny_v41_dir))


@pytest.mark.cuda
def test_greedy_decode_is_the_logits_argmax_cuda(tiny_v41_dir) -> None:
    from dsv41rt.runtime import Runtime

    check_greedy_decode_is_the_logits_argmax(Runtime(tiny_v41_dir, "cuda"))


def test_fork_and_decode_errors(tiny_v41_dir) -> None:
    from dsv41rt.errors import Dsv41rtError
    from dsv41rt.runtime import Runtime

    rt = Runtime(tiny_v41_dir, kv_memory=8 << 20, max_num_seqs=4)
    h = rt.new_handle()
    rt.forward_tokens(h, prompt_of(20))
    with pytest.raises(Dsv41rtError, match="unknown sequence handle 999"):
        rt.fork_handle(999)
    with pytest.raises(Dsv41rtError, match="given twice"):
        rt.decode_handles([h, h], [1, 2])
    with pytest.raises(Dsv41rtError, match="2 handles and 1 tokens"):
        rt.decode_handles([h, rt.new_handle()], [1])
    with pytest.raises(Dsv41rtError, match="token"):
        rt.decode_handles([h], [10**9])
