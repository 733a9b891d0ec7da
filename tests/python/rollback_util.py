"""Shared by the rollback tests through the bindings (test_rollback.py: V4.1, test_rollback_v4.py:
V4): token text, and one case — a prefix, k kept and r other positions fed undoably, rolled back by r
(and r2); the handle then holds the pages of the kept length and continues bitwise as a fresh
handle fed only the kept tokens."""

from __future__ import annotations

from typing import Any

import numpy as np


def ids(n: int, seed: int, high: int) -> list[int]:
    """Deterministic token ids in [3, high)."""
    return [int(t) for t in np.random.default_rng(seed).integers(3, high, n)]


def check_rollback_continues(rt: Any, a: int, k: int, r: int, r2: int, high: int) -> None:
    kept = a + k - r2
    text = ids(kept + 4, seed=a, high=high)
    h = rt.new_handle()
    rt.forward_tokens(h, text[:a], all_logits=False)
    pages_before = rt.stats()["pages_used"]
    rt.forward_tokens(h, text[a : a + k] + ids(r, seed=1000 + r, high=high), all_logits=False, undoable=True)
    assert rt.rollback_limit(h) == k + r
    rt.rollback_handle(h, r)
    if r2:
        rt.rollback_handle(h, r2)
    rt.check_invariants()
    page = rt.stats()["page_size"]
    assert rt.stats()["pages_used"] == pages_before + -(-kept // page) - -(-a // page)
    after = rt.forward_tokens(h, text[kept:])
    fresh = rt.new_handle()
    rt.forward_tokens(fresh, text[:kept], all_logits=False)
    assert np.array_equal(after, rt.forward_tokens(fresh, text[kept:]))
    rt.release_handle(h)
    rt.release_handle(fresh)
    assert rt.stats()["pages_used"] == 0
