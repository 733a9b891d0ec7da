"""Runtime.verify_greedy through the bindings (tests/cpp/test_verify_greedy.cc covers the draft
kinds and lengths in depth): a speculative loop with the true continuation, a wrong draft and
random drafts yields plain greedy decoding's tokens."""

from __future__ import annotations

import numpy as np
import pytest
from dsv41rt.errors import Dsv41rtError
from numerics import plain_greedy


@pytest.fixture(scope="module")
def rt(tiny_v41_dir):
    from dsv41rt.runtime import Runtime

    runtime = Runtime(tiny_v41_dir)
    yield runtime
    runtime.close()


def test_speculative_loop_is_plain_greedy(rt) -> None:
    gen = np.random.default_rng(11)
    prompt = [int(t) for t in gen.integers(3, 129000, 37)]
    greedy = plain_greedy(rt, prompt, 20)
    h = rt.new_handle()
    stream = [int(np.argmax(rt.forward_tokens(h, prompt, all_logits=False)[0]))]
    kinds = ["oracle", "wrong", "random"]
    step = 0
    while len(stream) < 13:
        kind, k, at = kinds[step % 3], 1 + step % 6, len(stream)
        draft = greedy[at : at + k]
        if kind == "wrong":
            draft[k // 2] = (draft[k // 2] + 1) % rt.config.vocab_size
        elif kind == "random":
            draft = [int(t) for t in gen.integers(3, 129000, k)]
        out = rt.verify_greedy(h, stream[-1], draft)
        if kind == "oracle":
            assert len(out) == k + 1
        elif kind == "wrong":
            assert len(out) == k // 2 + 1
        rt.check_invariants()
        stream += out
        step += 1
    assert stream == greedy[: len(stream)]
    with pytest.raises(Dsv41rtError) as e:
        rt.verify_greedy(h, stream[-1], [5] * 8)  # 9 positions > the 8-row window
    assert e.value.code == "invalid_argument"
    rt.release_handle(h)
    assert rt.stats()["pages_used"] == 0
