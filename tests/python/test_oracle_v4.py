"""End-to-end agreement of the DeepSeek-V4 forward with transformers 5.23 (FP32, CPU).

Three tiny-v4 checkpoints (seeds 1-3: SWA, SWA, CSA ratio 4, HCA ratio 128, CSA, HCA; layers 0-2
hash-routed), prompts of 1, 7, 37 and 200 tokens (crossing the window of 8, many CSA groups, the
indexer's top-k of 8 and, at 200, one HCA group), then GEN greedy tokens decoded through our caches.
transformers' `DeepseekV4ForCausalLM` (tests/python/oracle/transformers_v4.py) runs one forward over
prompt + those tokens (causal, so every position's logits equal its own greedy steps while the tokens
agree) plus two embedding jitters for its noise floor.

Numerics: both sides in FP32 with FP32 caches (our kv_cache_dtype="float32"; transformers has no
cache quantisation). No BF16 cast is applied on either side: transformers in FP32 has none (the
official reference's BF16 cast of the pooled compressor vector belongs with the quantised cache
mode, docs/design/v4.md), so the comparison checks all of the arithmetic at FP32 level.

Tolerance and divergent decisions: the V4.1 oracle's rule, imported from test_oracle_v41 (per position
1e-4 + 3 x the reference's noise, the noise capped at 1e-2 before the reference's first unstable
position, uncapped after it, where an indexer top-k or routing decision may flip on either side).
Negative controls: the same comparison with transformers' q_b_norm removed, or its CSA/HCA layers on
the main rope instead of the compress rope, must fail the rule.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from conftest import require_oracle_packages
from test_oracle_v41 import bound_violations, check_greedy, prompt_of
from v4_oracle_util import greedy_through_caches

pytestmark = pytest.mark.oracle

SEEDS = (1, 2, 3)
LENGTHS = (1, 7, 37, 200)
GEN = 32


def _runtime(ck: str) -> Any:  # dsv41rt.runtime.Runtime
    from dsv41rt.runtime import Runtime

    # V4 runs with FP32 caches and without the prefix cache so far (docs/design/v4.md).
    return Runtime(ck, kv_cache_dtype="float32", enable_prefix_caching=False)


def _checkpoint(tmp_path_factory: pytest.TempPathFactory, seed: int) -> str:
    from dsv41rt.checkpoint.generator import make_checkpoint
    from dsv41rt.config.presets import preset_config_json

    ck = str(tmp_path_factory.mktemp(f"oracle-v4-seed{seed}"))
    make_checkpoint(preset_config_json("tiny-v4"), ck, seed)
    return ck


@pytest.fixture(scope="module", params=SEEDS, ids=[f"seed{s}" for s in SEEDS])
def results(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict[int, tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]]:
    require_oracle_packages()
    from oracle.transformers_v4 import build_model, reference

    ck = _checkpoint(tmp_path_factory, request.param)
    model = build_model(ck)
    rt = _runtime(ck)
    out = {}
    for n in LENGTHS:
        seq, ours, greedy = greedy_through_caches(rt, n, GEN)
        out[n] = (reference(model, seq), ours, greedy)
    return out


@pytest.mark.parametrize("n", LENGTHS)
def test_prompt_logits_match_transformers(results: dict, n: int) -> None:
    ref, ours, _ = results[n]
    print(f"n={n}: max |ours - ref| over the prompt {np.abs(ours[:n] - ref['logits'][:n]).max():.3g}")
    why = bound_violations(ours, ref, np.arange(n))
    assert why is None, why


@pytest.mark.parametrize("n", LENGTHS)
def test_greedy_decode_matches_transformers(results: dict, n: int) -> None:
    ref, ours, greedy = results[n]
    check_greedy(ref, ours, greedy, n, GEN, "transformers")


def test_decode_and_chunks_through_the_caches_equal_one_shot_prefill(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Our own promise, bitwise: the CPU's rows do not depend on the batch and the compressors'
    decode form is their prefill form (docs/design/v4.md), so a prompt fed in uneven chunks and then
    one token at a time (crossing CSA groups and the HCA group boundary at 128) gives exactly the
    logits of one forward over the whole sequence."""
    ck = _checkpoint(tmp_path_factory, 1)
    rt = _runtime(ck)
    seq = prompt_of(140)
    whole = rt.score(seq)
    h = rt.new_handle()
    parts, at = [], 0
    for size in (5, 50, 66, 1, 1, 1):  # to 124, then single tokens over 124..140
        parts.append(rt.forward_tokens(h, seq[at : at + size]))
        at += size
    while at < len(seq):
        parts.append(rt.forward_tokens(h, seq[at : at + 1]))
        at += 1
    rt.release_handle(h)
    chunked = np.concatenate(parts)
    assert chunked.shape == whole.shape
    diff = np.abs(chunked - whole).max(-1)
    assert np.array_equal(chunked, whole), f"positions {np.flatnonzero(diff)[:10].tolist()} differ by {diff.max()}"


@contextlib.contextmanager
def _reference_mutation(model: Any, kind: str) -> Iterator[None]:
    """Within: transformers' attention without q_b_norm, or every layer's attention on the main rope."""
    import torch

    layers = model.model.layers
    saved = [(layer.self_attn.q_b_norm, layer.self_attn.rope_layer_type) for layer in layers]
    for layer in layers:
        if kind == "no-q-b-norm":
            layer.self_attn.q_b_norm = torch.nn.Identity()
        else:  # CSA / HCA attention on the main rope instead of the compress rope
            layer.self_attn.rope_layer_type = "main"
    try:
        yield
    finally:
        for layer, (norm, rope) in zip(layers, saved, strict=True):
            layer.self_attn.q_b_norm, layer.self_attn.rope_layer_type = norm, rope


@pytest.mark.parametrize("kind", ["no-q-b-norm", "main-rope-everywhere"])
def test_rule_rejects_a_mutated_reference(tmp_path_factory: pytest.TempPathFactory, kind: str) -> None:
    """Negative controls: the rule must see q_b_norm and the per-layer rope."""
    require_oracle_packages()
    from oracle.transformers_v4 import build_model, reference

    ck = _checkpoint(tmp_path_factory, 1)
    model = build_model(ck)
    p = prompt_of(37)
    ours = _runtime(ck).score(p)
    with _reference_mutation(model, kind):
        ref = reference(model, p)
    why = bound_violations(ours, ref, np.arange(len(p)))
    print(f"{kind}: {why}")
    assert why is not None, f"the bound accepts a reference with {kind}"


def test_decisions_match_transformers(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Layer by layer, the same CSA indexer top-k sets and routed experts (hash-routed and
    score-routed layers) as transformers on a 200-token prompt: at ~1e-5 agreement in logits no
    decision of these random weights sits that close to its boundary, so every one must match; a
    mismatch pinpoints the first layer that goes wrong."""
    require_oracle_packages()
    from dsv41rt.runtime import Runtime
    from oracle.transformers_v4 import build_model, decisions

    ck = _checkpoint(tmp_path_factory, 4)
    rt = Runtime(ck, kv_cache_dtype="float32", enable_prefix_caching=False, record_decisions=True)
    p = prompt_of(200)
    ref = decisions(build_model(ck), p)
    rt.score(p)
    ours = rt.decisions()
    assert set(ours) == set(ref) == {f"topk_L{i}" for i in (2, 4)} | {f"experts_L{i}" for i in range(6)}
    for key in sorted(ref, key=lambda k: int(k.split("_L")[1])):
        # Sets of selected entries (-1 = none): transformers selects min(k, width) entries, we
        # always return k with -1 padding.
        for t, (o, r) in enumerate(zip(ours[key], ref[key], strict=True)):
            assert set(o[o >= 0]) == set(r[r >= 0]), (
                f"{key} position {t}: ours {sorted(o[o >= 0])} ref {sorted(r[r >= 0])}"
            )
