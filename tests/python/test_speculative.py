"""Greedy speculative generation (dsv41rt.speculative) on the CPU: with the DSpark drafter (random
weights accept almost nothing), with the true continuation as the draft (everything accepted)
and with drafts wrong half-way, the tokens are plain greedy decoding's, bitwise; the counts say
what the speculation did. Runtime.draft_greedy needs load_drafter."""

from __future__ import annotations

import numpy as np
import pytest
from dsv41rt.errors import Dsv41rtError
from dsv41rt.speculative import generate_greedy_speculative
from numerics import plain_greedy


@pytest.fixture(scope="module")
def rt(tiny_v41_dir):
    from dsv41rt.runtime import Runtime

    runtime = Runtime(tiny_v41_dir, load_drafter=True)
    yield runtime
    runtime.close()


@pytest.mark.parametrize("length", [1, 24, 130])
def test_speculative_generation_is_plain_greedy(rt, length: int) -> None:
    prompt = [int(t) for t in np.random.default_rng(length).integers(3, 129000, length)]
    n = 18
    want = plain_greedy(rt, prompt, n)

    dspark = generate_greedy_speculative(rt, prompt, n)
    assert list(dspark.tokens) == want
    assert dspark.drafted > 0 and 0 <= dspark.accepted <= dspark.drafted
    assert dspark.steps == n - 1 - dspark.accepted  # one target forward per step after the prompt

    oracle = generate_greedy_speculative(rt, prompt, n, draft=lambda so_far, k: want[len(so_far) : len(so_far) + k])
    assert list(oracle.tokens) == want
    assert oracle.accepted == oracle.drafted == n - 1 - oracle.steps  # every draft accepted
    assert oracle.steps == -(-(n - 1) // 6)  # 5 drafts + the bonus per step

    def wrong_half_way(so_far: list[int], k: int) -> list[int]:
        d = want[len(so_far) : len(so_far) + k]
        d[k // 2] = (d[k // 2] + 1) % rt.config.vocab_size
        return d

    wrong = generate_greedy_speculative(rt, prompt, n, num_speculative_tokens=4, draft=wrong_half_way)
    assert list(wrong.tokens) == want
    assert rt.stats()["pages_used"] == 0


def test_draft_block_and_refusals(rt, tiny_v41_dir) -> None:
    from dsv41rt.runtime import Runtime

    h = rt.new_handle()
    rt.forward_tokens(h, [5, 6, 7], all_logits=False)
    block = rt.draft_greedy(h, 8)
    assert len(block.tokens) == len(block.confidence) == rt.config.dspark.block_size
    assert block == rt.draft_greedy(h, 8)  # deterministic
    rt.release_handle(h)
    with pytest.raises(Dsv41rtError, match="num_speculative_tokens"):
        generate_greedy_speculative(rt, [5], 4, num_speculative_tokens=rt.config.sliding_window)
    plain = Runtime(tiny_v41_dir)
    h = plain.new_handle()
    plain.forward_tokens(h, [5, 6], all_logits=False)
    with pytest.raises(Dsv41rtError, match="load_drafter") as e:
        plain.draft_greedy(h, 8)
    assert e.value.code == "unsupported"
    plain.close()
