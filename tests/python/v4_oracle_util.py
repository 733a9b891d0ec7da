"""The DeepSeek-V4 oracles' shared run (test_oracle_v4.py, test_oracle_v4_quant.py): a prompt, then
greedy tokens decoded one at a time through our caches."""

from __future__ import annotations

from typing import Any

import numpy as np
from test_oracle_v41 import prompt_of


def greedy_through_caches(rt: Any, n: int, gen: int) -> tuple[list[int], np.ndarray, np.ndarray]:
    """prompt_of(n), then `gen` greedy tokens through `rt`'s caches (a dsv41rt.runtime.Runtime).

    Returns (seq, ours, greedy): seq is the prompt + the first gen - 1 greedy tokens (the sequence the
    reference runs in one forward), ours our logits at seq's positions [n + gen - 1, vocab] (prompt
    forward, then one forward per decoded token), greedy the gen tokens chosen."""
    p = prompt_of(n)
    h = rt.new_handle()
    forwards = [rt.forward_tokens(h, p)]
    greedy = []
    for _ in range(gen):
        greedy.append(int(np.argmax(forwards[-1][-1])))
        forwards.append(rt.forward_tokens(h, [greedy[-1]]))
    rt.release_handle(h)
    ours = np.concatenate(forwards)[: n + gen - 1]
    return p + greedy[:-1], ours, np.asarray(greedy)
