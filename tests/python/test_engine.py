"""The serving engine on the CPU backend: batch invariance, pool exhaustion and preemption,
sampling reproducibility across batches, abort, limits, and the generate CLI modes.

Expected equality is exact: every op computes a row independently of the other rows in the batch
(fixed reduction order), and a preempted request recomputes the same tokens, so a request's tokens
cannot depend on what it was batched with.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from dsv41rt.cli import main
from dsv41rt.errors import Dsv41rtError
from dsv41rt.runtime import Runtime
from dsv41rt.sampling import SamplingParams


def prompt(n: int, seed: int) -> list[int]:
    return [0] + [int(t) for t in np.random.default_rng(seed).integers(3, 129000, n - 1)]


@pytest.fixture(scope="module")
def alone(tiny_v41_dir: str) -> Runtime:
    return Runtime(tiny_v41_dir)


def run_all(rt: Runtime, ids: list[int]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {i: [] for i in ids}
    while rt.has_unfinished():
        for o in rt.step():
            out[o.request_id].extend(o.new_tokens)
        rt.check_invariants()
    return out


def run_with_logprobs(rt: Runtime, ids: list[int]) -> dict[int, list[tuple[int, float]]]:
    """Every request's (token, raw logprob) pairs: equal logprobs bit for bit mean equal logits
    rows up to a shift, which catches a batch- or preemption-dependent error far below the
    top-1/top-2 margin that token equality alone can see."""
    out: dict[int, list[tuple[int, float]]] = {i: [] for i in ids}
    while rt.has_unfinished():
        for o in rt.step():
            out[o.request_id] += list(zip(o.new_tokens, o.logprobs, strict=True))
        rt.check_invariants()
    return out


def solo_with_logprobs(rt: Runtime, prompts: list[list[int]], n: int, sp: SamplingParams | None = None):
    return [run_with_logprobs(rt, [rt.add_request(p, n, sp, ignore_eos=True)]).popitem()[1] for p in prompts]


def test_batch_invariance_with_staggered_arrival(tiny_v41_dir: str, alone: Runtime) -> None:
    lengths = [int(x) for x in np.linspace(1, 300, 16)]
    prompts = [prompt(n, seed=100 + i) for i, n in enumerate(lengths)]
    rt = Runtime(tiny_v41_dir, max_num_batched_tokens=96, max_num_seqs=6)
    ids, out = [], {}
    for wave in range(4):  # four waves of arrivals while earlier requests are mid-flight
        ids += [rt.add_request(p, 6, ignore_eos=True) for p in prompts[wave * 4 : wave * 4 + 4]]
        for _ in range(3):
            for o in rt.step():
                out.setdefault(o.request_id, []).extend(zip(o.new_tokens, o.logprobs, strict=True))
    for i, pairs in run_with_logprobs(rt, ids).items():
        out.setdefault(i, []).extend(pairs)
    together = [out[i] for i in ids]
    solo = solo_with_logprobs(alone, prompts, 6)
    assert together == solo  # tokens and logprobs, bit for bit
    s = rt.stats()
    assert s["finished"] == 16 and s["pages_used"] == 0 and s["slots_used"] == 0


@pytest.mark.parametrize(
    "cap",
    [{"max_prefill_tokens_while_decoding": 8}, {"max_decode_slowdown": 1.5}],
    ids=["fixed-cap", "decode-slowdown"],
)
def test_prefill_cap_while_decoding_keeps_every_request_bitwise(
    tiny_v41_dir: str, alone: Runtime, cap: dict[str, float]
) -> None:
    # Prompts arriving while others decode go in chunks of at most 8 tokens per step, or as many as
    # keep a step within 1.5 decode-only steps by the measured step times (the scheduler tests pin
    # the chunks); the tokens and logprobs must not notice.
    prompts = [prompt(n, seed=300 + i) for i, n in enumerate((5, 90, 41, 17))]
    rt = Runtime(tiny_v41_dir, max_num_batched_tokens=96, max_num_seqs=4, **cap)
    ids = [rt.add_request(prompts[0], 12, ignore_eos=True)]
    out: dict[int, list] = {}
    for p in prompts[1:]:
        for _ in range(2):
            for o in rt.step():
                out.setdefault(o.request_id, []).extend(zip(o.new_tokens, o.logprobs, strict=True))
        ids.append(rt.add_request(p, 12, ignore_eos=True))
    for i, pairs in run_with_logprobs(rt, ids).items():
        out.setdefault(i, []).extend(pairs)
    assert [out[i] for i in ids] == solo_with_logprobs(alone, prompts, 12)
    with pytest.raises(Dsv41rtError, match="max-prefill-tokens-while-decoding: must be >= 0"):
        Runtime(tiny_v41_dir, max_prefill_tokens_while_decoding=-1)
    with pytest.raises(Dsv41rtError, match=r"max-decode-slowdown: must be >= 1 \(0: off\), got 0.5"):
        Runtime(tiny_v41_dir, max_decode_slowdown=0.5)
    with pytest.raises(Dsv41rtError, match="max-decode-slowdown: expected a finite number"):
        Runtime(tiny_v41_dir, max_decode_slowdown="nan")


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "seeded-sampling"])
def test_exhausted_pool_queues_and_preempts_and_stays_correct(tiny_v41_dir: str, alone: Runtime, sampled: bool) -> None:
    probe = Runtime(tiny_v41_dir, page_size=16, max_num_seqs=8)
    st = probe.stats()
    del probe
    # Room for 8 slots but only ~2 requests' pages: each request needs ceil((40 + 24) / 16) = 4 pages.
    budget = st["scratch_bytes"] + 8 * st["slot_bytes"] + 9 * (st["page_bytes"] + st["workspace_bytes_per_page"])
    rt = Runtime(tiny_v41_dir, kv_memory=budget, page_size=16, max_num_seqs=8)
    assert rt.stats()["pages_total"] == 9
    prompts = [prompt(40, seed=200 + i) for i in range(8)]
    # A preempted request recomputes its prompt and generated tokens and draws its next token at
    # the same (seed, step): the sampled continuation must not notice the preemption.
    sp = SamplingParams(temperature=0.9, top_p=0.95, seed=5, presence_penalty=0.3) if sampled else None
    ids = [rt.add_request(p, 24, sp, ignore_eos=True) for p in prompts]
    out = run_with_logprobs(rt, ids)
    solo = solo_with_logprobs(alone, prompts, 24, sp)
    assert [out[i] for i in ids] == solo  # tokens and logprobs, bit for bit
    s = rt.stats()
    print(f"exhaustion stats: {s}")
    assert s["finished"] == 8 and s["preemptions"] > 0 and s["max_waiting_seen"] > 0
    assert s["pages_used"] == 0 and s["slots_used"] == 0


def test_same_seed_same_tokens_in_different_batches(tiny_v41_dir: str) -> None:
    sp = SamplingParams(temperature=0.8, top_p=0.9, top_k=50, seed=11, frequency_penalty=0.2)
    p = prompt(30, seed=7)
    rt = Runtime(tiny_v41_dir)
    solo = run_all(rt, [rt.add_request(p, 12, sp, ignore_eos=True)])
    others = [rt.add_request(prompt(9 + i, seed=i), 12, SamplingParams(temperature=1.0, seed=i)) for i in range(3)]
    mine = rt.add_request(p, 12, sp, ignore_eos=True)
    batched = run_all(rt, [*others, mine])
    assert batched[mine] == list(solo.values())[0]
    assert len(set(map(tuple, batched.values()))) > 1  # the sampler is not degenerate


def test_logprobs_and_stop_tokens(alone: Runtime) -> None:
    p = prompt(12, seed=3)
    greedy = alone.generate([p], max_new_tokens=4, ignore_eos=True)[0]
    rid = alone.add_request(p, 10, SamplingParams(top_logprobs=3), stop_token_ids=[greedy[2]], ignore_eos=True)
    outs = []
    while alone.has_unfinished():
        outs += [o for o in alone.step() if o.request_id == rid]
    tokens = [t for o in outs for t in o.new_tokens]
    assert tokens == greedy[:3] and outs[-1].finish_reason == "stop"
    logits = alone.score(p + greedy[:2])[-1].astype(np.float64)
    ref = logits - np.log(np.exp(logits - logits.max()).sum()) - logits.max()
    assert abs(outs[2].logprobs[0] - ref[greedy[2]]) < 1e-4
    assert max(outs[0].top_logprobs[0], key=outs[0].top_logprobs[0].get) == greedy[0]


def test_abort_frees_pages_at_once(tiny_v41_dir: str) -> None:
    rt = Runtime(tiny_v41_dir)
    rid = rt.add_request(prompt(100, seed=1), 50)
    rt.step()
    assert rt.stats()["pages_used"] > 0
    rt.abort(rid)
    assert rt.stats()["pages_used"] == 0 and rt.stats()["slots_used"] == 0
    outs = rt.step()
    assert [(o.request_id, o.finish_reason) for o in outs] == [(rid, "abort")]
    with pytest.raises(Dsv41rtError, match=f"unknown request id {rid}"):
        rt.abort(rid)


def test_limits_and_bad_requests(tiny_v41_dir: str) -> None:
    rt = Runtime(tiny_v41_dir, max_model_len=64)
    with pytest.raises(Dsv41rtError, match="64"):
        rt.add_request(prompt(60, seed=1), 10)
    with pytest.raises(Dsv41rtError, match="max_new_tokens must be an integer >= 1"):
        rt.add_request([0, 1], 0)
    with pytest.raises(Dsv41rtError, match="temperature"):
        rt.add_request([0, 1], 4, SamplingParams(temperature=-1.0))
    with pytest.raises(Dsv41rtError, match=r"stop_token_ids\[0\] = -3"):
        rt.add_request([0, 1], 4, stop_token_ids=[-3])
    with pytest.raises(Dsv41rtError, match="kv-memory: must be > 0"):
        Runtime(tiny_v41_dir, kv_memory=0)


def test_generate_cli_batched_equals_sequential(tmp_path, tiny_v41_dir: str, capsys) -> None:
    prompts = tmp_path / "p.json"
    prompts.write_text(json.dumps([prompt(n, seed=n) for n in (3, 17, 40, 90)]))
    args = ["generate", "--checkpoint", tiny_v41_dir, "--prompts", str(prompts), "--max-new-tokens", "5"]
    assert main([*args, "--out", str(tmp_path / "a.json")]) == 0
    assert main([*args, "--sequential", "--out", str(tmp_path / "b.json")]) == 0
    assert (
        main(
            [
                *args,
                "--kv-memory",
                "4M",
                "--max-num-seqs",
                "2",
                "--max-num-batched-tokens",
                "32",
                "--out",
                str(tmp_path / "c.json"),
            ]
        )
        == 0
    )
    a, b, c = (json.loads((tmp_path / f"{x}.json").read_text()) for x in "abc")
    assert a == b == c
    assert "KV pool:" in capsys.readouterr().err
