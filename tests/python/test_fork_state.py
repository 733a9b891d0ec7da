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
