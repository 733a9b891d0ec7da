"""Requests handed from a prefill runtime to a decode runtime (Runtime.add_request(handoff=True),
Runtime.add_handoff_request; the engine side is tests/cpp/test_engine_handoff.cc): the tokens and
logprobs equal one runtime's, bitwise, through the engine thread as the server runs it."""

from __future__ import annotations

import time

import numpy as np
import pytest
from dsv41rt.errors import Dsv41rtError
from dsv41rt.runtime import Runtime, StepOutput
from dsv41rt.sampling import SamplingParams

LENGTHS = [1, 2, 9, 37, 128, 300]


def runtime(path: str, **kw) -> Runtime:
    return Runtime(path, kv_memory=64 << 20, max_num_seqs=4, engine_thread=True, **kw)


def prompt(n: int) -> list[int]:
    return [0] + [int(t) for t in np.random.default_rng(n).integers(3, 1000, n - 1)]


def gather(rt: Runtime, ids: list[int], timeout: float = 120.0) -> dict[int, list[StepOutput]]:
    """Every output of `ids` until each finished."""
    got: dict[int, list[StepOutput]] = {i: [] for i in ids}
    left = set(ids)
    deadline = time.monotonic() + timeout
    while left:
        assert time.monotonic() < deadline, f"requests {sorted(left)} did not finish"
        for o in rt.await_outputs(0.5):
            if o.request_id in got:
                got[o.request_id].append(o)
                if o.finished:
                    left.discard(o.request_id)
    return got


def flat(outs: list[StepOutput]) -> tuple[list[int], list[float], list[dict[int, float]]]:
    return (
        [t for o in outs for t in o.new_tokens],
        [x for o in outs for x in o.logprobs],
        [d for o in outs for d in o.top_logprobs],
    )


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_prefill_then_decode_equals_one_runtime(tiny_v41_dir: str, temperature: float) -> None:
    single, pre, dec = runtime(tiny_v41_dir), runtime(tiny_v41_dir), runtime(tiny_v41_dir)
    try:
        sampling = [SamplingParams(temperature=temperature, seed=17 + n, top_logprobs=2) for n in LENGTHS]
        cases = list(zip(LENGTHS, sampling, strict=True))
        want = gather(single, [single.add_request(prompt(n), 6, s, ignore_eos=True) for n, s in cases])
        first_ids = [pre.add_request(prompt(n), 6, s, ignore_eos=True, handoff=True) for n, s in cases]
        firsts = gather(pre, first_ids)
        pre.check_invariants()
        dec_ids = []
        for n, s, fid in zip(LENGTHS, sampling, first_ids, strict=True):
            (f,) = firsts[fid]  # one output: the first token, finished, with the state
            assert f.finished and f.finish_reason == "length" and len(f.new_tokens) == 1
            assert f.handoff, f"prompt of {n}: no state in the prefill output"
            dec_ids.append(dec.add_handoff_request(prompt(n), f.new_tokens[0], f.handoff, 6, s, ignore_eos=True))
        rest = gather(dec, dec_ids)
        for n, fid, did, wid in zip(LENGTHS, first_ids, dec_ids, sorted(want), strict=True):
            assert flat(firsts[fid] + rest[did]) == flat(want[wid]), f"prompt of {n}"
            assert rest[did][-1].handoff is None
        dec.check_invariants()
        assert dec.stats()["pages_used"] == 0
    finally:
        for rt in (single, pre, dec):
            rt.close()


def test_bad_handoffs_are_refused_and_a_busy_runtime_queues_them(tiny_v41_dir: str) -> None:
    pre = runtime(tiny_v41_dir)
    dec = Runtime(tiny_v41_dir, kv_memory=64 << 20, max_num_seqs=1, max_model_len=50, engine_thread=True)
    try:
        p = prompt(40)
        (f,) = gather(pre, [pre.add_request(p, 10, ignore_eos=True, handoff=True)])[1]
        assert f.handoff is not None
        with pytest.raises(Dsv41rtError, match="checksum mismatch") as bad:
            dec.add_handoff_request(p, f.new_tokens[0], f.handoff[:-1] + bytes([f.handoff[-1] ^ 1]), 10)
        assert getattr(bad.value, "code", None) == "invalid_argument"
        with pytest.raises(Dsv41rtError, match="the prompt has 39 tokens"):
            dec.add_handoff_request(p[:-1], f.new_tokens[0], f.handoff, 10)
        with pytest.raises(Dsv41rtError, match="first_token"):
            dec.add_handoff_request(p, -1, f.handoff, 10)
        with pytest.raises(Dsv41rtError, match="state must be bytes"):
            dec.add_handoff_request(p, f.new_tokens[0], "state", 10)  # type: ignore[arg-type]
        with pytest.raises(Dsv41rtError, match="exceeds max_model_len 50") as never:
            dec.add_handoff_request(p, f.new_tokens[0], f.handoff, 20)
        assert getattr(never.value, "code", None) == "out_of_range"
        # max_num_seqs 1: the second waits for the first and ends alike.
        ids = [dec.add_handoff_request(p, f.new_tokens[0], f.handoff, 10, ignore_eos=True) for _ in range(2)]
        got = gather(dec, ids)
        assert flat(got[ids[0]]) == flat(got[ids[1]])
        assert len(flat(got[ids[0]])[0]) == 9
        dec.check_invariants()
    finally:
        pre.close()
        dec.close()


def test_process_groups_hand_states_off_both_ways(tiny_v41_dir: str) -> None:
    """A prefill side whose ranks are processes (CP 2 over TCP: rank 0 exports its replica of the
    state) and a decode side likewise (TP 2 x EP 2: the imported state goes to rank 0's pool and, as
    a message, to the worker's): greedy tokens and logprobs equal one runtime's, bitwise."""
    from dsv41rt.cp_launch import cp_processes
    from dsv41rt.options import RuntimeOptions

    lengths = [1, 37, 300]
    kw = dict(kv_memory=64 << 20, max_num_seqs=4)
    sampling = SamplingParams(temperature=0.0, top_logprobs=2)
    single = runtime(tiny_v41_dir)
    try:
        want = gather(single, [single.add_request(prompt(n), 6, sampling, ignore_eos=True) for n in lengths])
    finally:
        single.close()
    pre_opts = RuntimeOptions(context_parallel_size=2, **kw)
    dec_opts = RuntimeOptions(tensor_parallel_size=2, expert_parallel_size=2, **kw)
    with (
        cp_processes(tiny_v41_dir, pre_opts, comm="socket", engine_thread=True) as pre,
        cp_processes(tiny_v41_dir, dec_opts, comm="socket", engine_thread=True) as dec,
    ):
        first_ids = [pre.add_request(prompt(n), 6, sampling, ignore_eos=True, handoff=True) for n in lengths]
        firsts = gather(pre, first_ids)
        dec_ids = []
        for n, fid in zip(lengths, first_ids, strict=True):
            (f,) = firsts[fid]
            assert f.handoff, f"prompt of {n}: no state in the prefill output"
            dec_ids.append(dec.add_handoff_request(prompt(n), f.new_tokens[0], f.handoff, 6, sampling, ignore_eos=True))
        rest = gather(dec, dec_ids)
        for n, fid, did, wid in zip(lengths, first_ids, dec_ids, sorted(want), strict=True):
            assert flat(firsts[fid] + rest[did]) == flat(want[wid]), f"prompt of {n}"
        assert dec.stats()["pages_used"] == 0
