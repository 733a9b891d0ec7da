"""Measures shared by the tests: relative errors, and engine outputs compared bit for bit."""

from __future__ import annotations

import numpy as np


def rel(a, b) -> float:
    """max |a - b| / max |b| in float64 (0 for empty arrays): the relative-error bound the op
    tests state per dtype."""
    b = np.asarray(b, np.float64)
    if b.size == 0:
        return 0.0
    return float(np.abs(np.asarray(a, np.float64) - b).max() / max(np.abs(b).max(), 1e-30))


def generate_with_logprobs(rt, prompts, max_new_tokens: int, sampling=None) -> list[list[tuple[int, float]]]:
    """(token, raw logprob) pairs of every prompt, submitted together (continuous batching).
    Exact-invariance tests compare these, not tokens alone: equal logprobs (bitwise) catch an
    error far below the top-1/top-2 logit margin that decides a greedy token."""
    ids = [rt.add_request(p, max_new_tokens, sampling, ignore_eos=True) for p in prompts]
    out: dict[int, list[tuple[int, float]]] = {i: [] for i in ids}
    while rt.has_unfinished():
        for o in rt.step():
            out[o.request_id] += list(zip(o.new_tokens, o.logprobs, strict=True))
    return [out[i] for i in ids]


def plain_greedy(rt, prompt: list[int], n: int) -> list[int]:
    """n greedy tokens after `prompt` on a direct handle: the prefill's argmax, then device-drawn
    decode steps (the reference the speculative paths must equal bitwise)."""
    h = rt.new_handle()
    out = [int(np.argmax(rt.forward_tokens(h, prompt, all_logits=False)[0]))]
    while len(out) < n:
        nxt, _ = rt.decode_handles_greedy([h], [out[-1]])
        out.append(int(nxt[0]))
    rt.release_handle(h)
    return out
