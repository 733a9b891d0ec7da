"""DeepSeek-V4's MTP layer `mtp.0` (spec 4.3) against the independent reference, NeMo Automodel
0.7.0's `DeepseekV4MTPBlock` (FP32, CPU; tests/python/oracle/nemo_v4_mtp.py).

Two tiny-v4 checkpoints (seeds 1, 2), prompts of 7 and 37 tokens (inside and across the MTP's own
window of 8). Ours: a Runtime loaded with load_drafter=True runs the prompt in one forward; the MTP
layer reads the final hyper-connection streams (before the hyper-head) and each position's next
token (the prompt's, then the greedy token the forward sampled), and Decisions keep the streams fed
in and the MTP logits of every position. NeMo's block gets the same streams and the embeddings of
the same next tokens, its own sliding-window mask, and its prediction goes through NeMo's FP32
head, so the comparison covers e_proj / h_proj / enorm / hnorm, the m = 0 block (window attention
with sink, score-routed MoE, per-sublayer mHC), the MTP's hyper-head and norm, and the loader of
`mtp.0.*` (NeMo decodes the checkpoint with its own state-dict adapter).

Tolerance: the rule of test_oracle_v41 (`bound_violations`) per position, max_v |ours - ref| <= 1e-4
+ 3 * min(noise, 1e-2), the noise being the reference's own change under two relative-1e-6
jitters of the input streams. Measured: max |ours - ref| 5.3e-6 ... 8.6e-6 with max |ref| ~16,
noise 9.5e-6 ... 1.4e-5.

Negative controls, which must fail the rule: NeMo's block without the E term (the next token's
embedding dropped), and with the embedding of x_t instead of x_{t+1} (the token shift off by one).

Our own promise, bitwise (not oracle): the MTP's window ring continues through decode steps and
through the engine's prefill chunks exactly as one forward over the whole sequence computes it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from conftest import require_oracle_packages
from test_oracle_v41 import bound_violations, prompt_of

SEEDS = (1, 2)
LENGTHS = (7, 37)


def _checkpoint(tmp_path_factory: pytest.TempPathFactory, seed: int) -> str:
    from dsv41rt.checkpoint.generator import make_checkpoint
    from dsv41rt.config.presets import preset_config_json

    ck = str(tmp_path_factory.mktemp(f"oracle-v4-mtp-seed{seed}"))
    make_checkpoint(preset_config_json("tiny-v4"), ck, seed)
    return ck


def _runtime(ck: str) -> Any:  # dsv41rt.runtime.Runtime
    from dsv41rt.runtime import Runtime

    return Runtime(ck, kv_cache_dtype="float32", enable_prefix_caching=False, record_decisions=True, load_drafter=True)


def _ours(rt: Any, prompt: list[int]) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """Streams fed in, MTP logits and next tokens of a prompt run in one forward."""
    h = rt.new_handle()
    logits = rt.forward_tokens(h, prompt)
    rt.release_handle(h)
    streams, mtp = rt.mtp_outputs()[0]
    return streams, mtp, prompt[1:] + [int(np.argmax(logits[-1]))]


@pytest.fixture(scope="module", params=SEEDS, ids=[f"seed{s}" for s in SEEDS])
def case(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    require_oracle_packages()
    from oracle.nemo_v4_mtp import build_model

    ck = _checkpoint(tmp_path_factory, request.param)
    return _runtime(ck), build_model(ck)


@pytest.mark.oracle
@pytest.mark.parametrize("n", LENGTHS)
def test_mtp_logits_match_nemo(case: tuple[Any, Any], n: int) -> None:
    from oracle.nemo_v4_mtp import reference

    rt, model = case
    streams, ours, nxt = _ours(rt, prompt_of(n))
    assert streams.shape == (n, model.config.hc_mult * model.config.hidden_size)
    ref = reference(model, streams, nxt)
    diff = np.abs(ours - ref["logits"]).max(-1)
    print(f"n={n}: max |ours - ref| {diff.max():.3g}, noise {ref['noise'].max():.3g}")
    why = bound_violations(ours, ref, np.arange(n))
    assert why is None, why


@pytest.mark.oracle
@pytest.mark.parametrize("kind", ["no-e-term", "e-of-x_t"])
def test_rule_rejects_a_mutated_reference(case: tuple[Any, Any], kind: str) -> None:
    from oracle.nemo_v4_mtp import reference

    rt, model = case
    p = prompt_of(37)
    streams, ours, nxt = _ours(rt, p)
    # no-e-term: the next tokens' embeddings dropped; e-of-x_t: each row's own token's embedding
    ref = reference(model, streams, nxt, use_e=False) if kind == "no-e-term" else reference(model, streams, p)
    why = bound_violations(ours, ref, np.arange(len(p)))
    print(f"{kind}: {why}")
    assert why is not None, f"the bound accepts a reference with {kind}"


def test_mtp_decode_through_its_ring_equals_one_shot(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Bitwise: the MTP rows of 12 decode steps after a 7-token prompt (the ring of 8 wrapping)
    equal the rows of one forward over prompt + the decoded tokens."""
    rt = _runtime(_checkpoint(tmp_path_factory, 1))
    p = prompt_of(7)
    h = rt.new_handle()
    logits = rt.forward_tokens(h, p)
    rows = [rt.mtp_outputs()[0][1]]
    greedy = [int(np.argmax(logits[-1]))]
    for _ in range(12):
        logits = rt.forward_tokens(h, [greedy[-1]])
        rows.append(rt.mtp_outputs()[0][1])
        greedy.append(int(np.argmax(logits[-1])))
    rt.release_handle(h)
    stepped = np.concatenate(rows)
    _, whole, nxt = _ours(rt, p + greedy[:-1])
    assert nxt[-1] == greedy[-1]
    assert stepped.shape == whole.shape == (len(p) + 12, rt.config.vocab_size)
    diff = np.abs(stepped - whole).max(-1)
    assert np.array_equal(stepped, whole), f"positions {np.flatnonzero(diff)[:10].tolist()} differ by {diff.max()}"


def test_mtp_ring_through_engine_chunks_equals_one_shot(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Bitwise: a 37-token prompt prefilled by the engine in chunks of 16 (the MTP's last row of a
    chunk reads the next prompt token, BatchItem::mtp_next) leaves in its last chunk the MTP rows of
    one forward over the prompt."""
    from dsv41rt.runtime import Runtime
    from dsv41rt.sampling import GREEDY

    ck = _checkpoint(tmp_path_factory, 1)
    p = prompt_of(37)
    rt = Runtime(
        ck,
        kv_cache_dtype="float32",
        enable_prefix_caching=False,
        record_decisions=True,
        load_drafter=True,
        max_num_batched_tokens=16,
    )
    out = rt.generate([p], max_new_tokens=1, sampling=GREEDY)
    _, chunked = rt.mtp_outputs()[0]
    _, whole, nxt = _ours(_runtime(ck), p)
    assert out == [[nxt[-1]]]
    assert chunked.shape == (37 - 32, rt.config.vocab_size)  # chunks 16, 16, 5
    assert np.array_equal(chunked, whole[32:])


def test_the_dspark_drafter_refuses_the_v4_mtp_layer(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The standalone DSpark drafter loads drafts as the runtime does; V4's MTP layer is none."""
    from dsv41rt import _core

    with pytest.raises(Exception, match="has no DSpark drafter"):
        _core.DSparkDrafter(_checkpoint(tmp_path_factory, 1), False)
