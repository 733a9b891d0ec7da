"""Speculative decoding under context parallelism (virtual ranks over LocalComm, CPU) against
CP = 1, bitwise. A forward kept undoable or giving the drafter its features runs as any other:
context-parallel when it has a prefill chunk, else replicated. Every rank writes the same state,
so rank 0's undo record takes every rank's slot back; the drafter's features of a
context-parallel forward come from the rank that computed each row and are merged into rank
0's, whose drafter drafts for the group. So the drafted blocks (tokens and confidences), the
verified tokens and every logit after a rollback are those of one rank."""

from __future__ import annotations

import numpy as np
from dsv41rt.runtime import Runtime
from test_context_parallel import prompt_of

KW = dict(kv_memory=64 << 20, max_num_seqs=4)


def _direct(rt: Runtime) -> list:
    """A 201-token prefill (context-parallel under CP), the drafter's block, a verify of that block
    with its third token wrong, an undoable forward of 5 tokens taken back by 3, then the next
    logits: everything a group's speculation path touches, as values."""
    out: list = []
    h = rt.new_handle()
    logits = rt.forward_tokens(h, prompt_of(201))
    last = int(np.argmax(logits[-1]))
    block = rt.draft_greedy(h, last)
    out += [logits, block.tokens, block.confidence]
    draft = list(block.tokens[:2]) + [(block.tokens[2] + 1) % 1000 + 3] + list(block.tokens[3:5])
    kept = rt.verify_greedy(h, last, draft)
    out.append(kept)
    more = prompt_of(9)[1:6]
    out.append(rt.forward_tokens(h, more, undoable=True))
    rt.rollback_handle(h, 3)
    out.append(rt.forward_tokens(h, [kept[-1]]))
    out.append(rt.draft_greedy(h, 7).tokens)
    rt.release_handle(h)
    return out


def test_drafts_verifies_and_rollbacks_equal_one_rank(tiny_v41_dir: str) -> None:
    want = _direct(Runtime(tiny_v41_dir, load_drafter=True, **KW))
    for cp in (2, 3):
        rt = Runtime(tiny_v41_dir, load_drafter=True, context_parallel_size=cp, **KW)
        got = _direct(rt)
        for i, (a, b) in enumerate(zip(got, want, strict=True)):
            assert np.array_equal(np.asarray(a), np.asarray(b)), (cp, i)
        assert rt.backend_stats()["cp_forwards"] >= 1  # the prefill ran context-parallel
        rt.close()


def test_the_engine_speculates_under_context_parallelism(tiny_v41_dir: str) -> None:
    """Greedy outputs with DSpark drafts under CP 2 and 3 are plain decoding's, bitwise, with the
    same drafting counters as CP 1 (the drafter saw the same features)."""
    prompts = [prompt_of(n) for n in (5, 37, 130, 201)]
    kw = dict(max_num_batched_tokens=64, **KW)
    plain = Runtime(tiny_v41_dir, **kw).generate(prompts, max_new_tokens=24)
    spec = '{"method": "dspark", "num_speculative_tokens": 3}'
    counters = None
    for cp in (1, 2, 3):
        rt = Runtime(tiny_v41_dir, speculative_config=spec, context_parallel_size=cp, **kw)
        assert rt.generate(prompts, max_new_tokens=24) == plain, cp
        got = {k: v for k, v in rt.stats().items() if k.startswith("spec_decode")}
        assert got["spec_decode_drafts"] > 0
        counters = counters or got
        assert got == counters, cp
        if cp > 1:
            assert rt.backend_stats()["cp_forwards"] > 0  # prefill chunks still split
        rt.close()
