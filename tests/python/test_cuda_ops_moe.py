"""CUDA MoE / Engram / sampling kernels vs their CPU references in dsv41rt._core.ops.

Fresh random inputs each run (seed printed and in every assertion); device outputs are poisoned.
Bounds and why:
- moe_route: selections EXACTLY equal. The GPU computes the gate logits with the CPU's 8-lane FP32
  summation order without FMA contraction, and softplus through FP64 (correctly rounded exp /
  log1p), so scores agree bit for bit except for a possible last-ulp exp/log1p difference, which
  can only flip a selection at an exact 1-ulp near-tie (probability ~1e-7 per token here).
  Weights <= 1e-5 relative (same arithmetic; slack for that last ulp).
- moe_forward: <= 1e-5 relative to the output's scale (FP32 dot products in a different order
  than the CPU; |error| is a few ulp of the summed magnitudes).
- engram_hash_rows: EXACTLY equal (integer arithmetic). engram_forward: <= 1e-5 relative on Y and
  on the update Y - X (the three reductions in FP64 on both sides; FP32 kv projection in a
  different order). Masked rows are bit-identical to X.
- sampling_probs: <= 1e-5 absolute (+ 1e-5 relative) and the same support; sample_token: tokens
  EXACTLY equal (the order-sensitive FP64 sums are sequential in the CPU's order, the uniform is the
  CPU's counter-based generator), top ids exactly equal, logprobs <= 1e-5 absolute.
"""

from __future__ import annotations

import numpy as np
import pytest
from dsv41rt import _core
from numerics import rel

pytestmark = pytest.mark.cuda


@pytest.mark.parametrize("S,H,E,k", [(64, 96, 16, 4), (7, 32, 8, 1), (33, 64, 32, 6), (5, 7171, 256, 8)])
def test_moe_route(rng, S: int, H: int, E: int, k: int) -> None:
    g, seed = rng
    x = g.standard_normal((S, H), dtype=np.float32)
    gw = (g.standard_normal((E, H)) * (0.2 if H < 1000 else 0.02)).astype(np.float32)
    gw[0] *= 40.0  # past softplus' threshold (20) on some tokens
    gw[E - 1] = gw[E // 2]  # exact ties in s: the lower expert id must come first
    bias = (g.standard_normal(E) * 0.2).astype(np.float32)
    bias[E - 1] = bias[E // 2]
    for b, scale, norm in ((bias, 1.5, True), (None, 1.0, True), (bias, 2.5, False)):
        i_gpu, w_gpu = _core.cuda_ops.moe_route(x, gw, b, k, scale, norm)
        i_cpu, w_cpu = _core.ops.moe_route(x, gw, b, k, scale, norm)
        assert i_gpu.dtype == np.int32 and w_gpu.dtype == np.float32, seed
        np.testing.assert_array_equal(i_gpu, i_cpu, err_msg=f"seed {seed}")
        assert rel(w_gpu, w_cpu) <= 1e-5, (seed, rel(w_gpu, w_cpu))


def _experts(g, E, H, inter):
    w1 = (g.standard_normal((E, inter, H)) * 0.3).astype(np.float32)
    w3 = (g.standard_normal((E, inter, H)) * 0.3).astype(np.float32)
    w2 = (g.standard_normal((E, H, inter)) * 0.1).astype(np.float32)
    return w1, w3, w2


@pytest.mark.parametrize("S,H,inter,E,k", [(40, 64, 32, 8, 2), (9, 48, 24, 16, 6), (3, 300, 70, 4, 4)])
def test_moe_forward(rng, S: int, H: int, inter: int, E: int, k: int) -> None:
    g, seed = rng
    x = (g.standard_normal((S, H)) * 2).astype(np.float32)  # large enough to hit both clamps
    gw = (g.standard_normal((E, H)) * 0.2).astype(np.float32)
    w1, w3, w2 = _experts(g, E, H, inter)
    s1, s3, s2 = (a[0] for a in _experts(g, 1, H, inter + 8))
    idx, w = _core.ops.moe_route(x, gw, None, k, 1.5)
    idx[0] = idx[0, 0]  # one token sending every slot to the same expert
    for shared, limit in (((s1, s3, s2), 10.0), ((None, None, None), 10.0), ((s1, s3, s2), 0.0)):
        got = _core.cuda_ops.moe_forward(x, idx, w, w1, w3, w2, *shared, limit)
        ref = _core.ops.moe_forward(x, idx, w, w1, w3, w2, *shared, limit)
        assert np.isfinite(got).all(), seed
        assert rel(got, ref) <= 1e-5, (seed, limit, rel(got, ref))


@pytest.mark.parametrize("max_ngram,n_heads", [(3, 8), (2, 1), (5, 3)])
def test_engram_hash_rows(rng, max_ngram: int, n_heads: int) -> None:
    g, seed = rng
    S = 50
    hist = max_ngram - 1
    cols = hist * n_heads
    ids = g.integers(0, 130_000, S + hist).astype(np.int64)
    ids[:hist] = -1  # before the start of the sequence
    ids[g.choice(S + hist, 8, replace=False)] = -1  # dead positions block lookback
    mult = g.integers(-(2**62), 2**62, max_ngram).astype(np.int64)  # products wrap around
    primes = g.integers(1, 2_000_003, cols).astype(np.int64)
    offsets = np.cumsum(primes) - primes
    for pad in (0, 7):
        got = _core.cuda_ops.engram_hash_rows(ids, n_heads, mult, primes, offsets, pad)
        ref = _core.ops.engram_hash_rows(ids, n_heads, mult, primes, offsets, pad)
        assert got.dtype == np.int64 and got.shape == (S, cols), seed
        np.testing.assert_array_equal(got, ref, err_msg=f"seed {seed}")


@pytest.mark.parametrize("S,n,H,D", [(23, 4, 64, 96), (5, 1, 1000, 40), (2, 2, 7168, 64)])
def test_engram_forward(rng, S: int, n: int, H: int, D: int) -> None:
    g, seed = rng
    X = g.standard_normal((S, n, H)).astype(np.float32)
    X[min(4, S - 1)] = 0.0  # zero stream: dot exactly 0 -> the 1e-6 clamp
    emb = g.standard_normal((S, D)).astype(np.float32)
    wkv = (g.standard_normal(((n + 1) * H, D)) * 10.0 / np.sqrt(D)).astype(np.float32)
    q = (1 + 0.3 * g.standard_normal((n, H))).astype(np.float32)
    kw = (1 + 0.3 * g.standard_normal((n, H))).astype(np.float32)
    mask = g.random(S) > 0.2
    for m, eps in ((mask, 1e-20), (None, 1e-6)):
        got = _core.cuda_ops.engram_forward(X, emb, wkv, q, kw, m, eps)
        ref = _core.ops.engram_forward(X, emb, wkv, q, kw, m, eps)
        assert np.isfinite(got).all(), seed
        assert rel(got, ref) <= 1e-5, (seed, eps, rel(got, ref))
        assert rel(got - X, ref - X) <= 1e-5, (seed, eps, rel(got - X, ref - X))
        if m is not None:
            np.testing.assert_array_equal(got[~m], X[~m], err_msg=f"seed {seed}")


def _random_params(g: np.random.Generator, V: int) -> dict:
    d = {}
    if g.random() < 0.15:
        d["temperature"] = 0.0
    elif g.random() < 0.8:
        d["temperature"] = float(g.uniform(0.05, 2.5))
    if g.random() < 0.5:
        d["top_k"] = int(g.choice([-1, 0, 1, 2, int(g.integers(1, V + 5))]))
    if g.random() < 0.5:
        d["top_p"] = float(g.choice([1.0, g.uniform(0.01, 1.0), 1e-6]))
    if g.random() < 0.5:
        d["min_p"] = float(g.choice([0.0, g.uniform(0.0, 0.5), 1.0]))
    if g.random() < 0.4:
        d["presence_penalty"] = float(g.uniform(-2, 2))
    if g.random() < 0.4:
        d["frequency_penalty"] = float(g.uniform(-2, 2))
    if g.random() < 0.4:
        d["repetition_penalty"] = float(g.uniform(0.5, 2.0))
    d["seed"] = int(g.integers(0, 2**63))
    d["top_logprobs"] = int(g.integers(0, 21))
    return d


def test_sampling(rng) -> None:
    g, seed = rng
    for trial in range(150):
        V = int(g.choice([1, 2, 7, 64, 1000, int(g.integers(1, 3000)), 129280 if trial % 25 == 0 else 5]))
        logits = (g.standard_normal(V) * g.uniform(0.1, 6)).astype(np.float32)
        if trial % 4 == 0:
            logits = (np.round(logits * 2) / 2).astype(np.float32)  # many exact ties
        if trial % 5 == 0 and V > 2:
            logits[g.choice(V, V // 3, replace=False)] = -np.inf
            logits[g.integers(V)] = 1.0
        prompt = g.integers(0, V, int(g.integers(0, 30))).astype(np.int32)
        output = g.integers(0, V, int(g.integers(0, 30))).astype(np.int32)
        params = _random_params(g, V)
        msg = f"seed {seed} trial {trial} V {V} params {params}"
        got = _core.cuda_ops.sampling_probs(logits, params, prompt, output)
        want = _core.ops.sampling_probs(logits, params, prompt, output)
        assert got.dtype == np.float32 and got.shape == (V,), msg
        np.testing.assert_array_equal(got == 0, want == 0, err_msg=msg)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=msg)
        for step in (0, int(g.integers(1, 10_000))):
            t_gpu, lp_gpu, ids_gpu, lps_gpu = _core.cuda_ops.sample_token(logits, params, prompt, output, step)
            t_cpu, lp_cpu, ids_cpu, lps_cpu = _core.ops.sample_token(logits, params, prompt, output, step)
            assert t_gpu == t_cpu, (msg, step)
            assert lp_gpu == pytest.approx(lp_cpu, abs=1e-5) or lp_gpu == lp_cpu, (msg, step)
            np.testing.assert_array_equal(ids_gpu, ids_cpu, err_msg=msg)
            np.testing.assert_allclose(lps_gpu, lps_cpu, rtol=0, atol=1e-5, err_msg=msg)


def test_sampling_rejects_bad_inputs() -> None:
    logits = np.zeros(8, np.float32)
    with pytest.raises(Exception, match="top_p"):
        _core.cuda_ops.sampling_probs(logits, {"top_p": 0.0})
    bad = logits.copy()
    bad[3] = np.nan
    with pytest.raises(Exception, match="logits"):
        _core.cuda_ops.sample_token(bad, {})


def _bf16(a: np.ndarray) -> np.ndarray:
    """Round to BF16 (nearest even) and back to FP32, as the device weights are stored."""
    u = a.astype(np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32)


@pytest.mark.parametrize("S,H,inter,E,k", [(40, 64, 32, 8, 2), (9, 48, 24, 16, 6), (3, 300, 70, 4, 4)])
def test_moe_forward_split_equals_the_per_token_kernel(rng, S: int, H: int, inter: int, E: int, k: int) -> None:
    """The split (hidden, then down) kernels compute exactly what the one-block-per-token kernel
    computes (bitwise: same dot products, same slot order), in any number of passes, with FP32 or
    BF16 weights (BF16 widens exactly); against the CPU reference within 1e-5."""
    g, seed = rng
    x = (g.standard_normal((S, H)) * 2).astype(np.float32)
    gw = (g.standard_normal((E, H)) * 0.2).astype(np.float32)
    w1, w3, w2 = _experts(g, E, H, inter)
    s1, s3, s2 = (a[0] for a in _experts(g, 1, H, inter + 8))
    idx, w = _core.ops.moe_route(x, gw, None, k, 1.5)
    idx[0] = idx[0, 0]
    for shared, limit in (((s1, s3, s2), 10.0), ((None, None, None), 10.0), ((s1, s3, s2), 0.0)):
        per_token = _core.cuda_ops.moe_forward(x, idx, w, w1, w3, w2, *shared, limit)
        for chunk in (1, 3, S):
            got = _core.cuda_ops.moe_forward_split(x, idx, w, w1, w3, w2, *shared, limit, chunk)
            assert np.array_equal(got, per_token), (seed, chunk, np.abs(got - per_token).max())
        ref = _core.ops.moe_forward(x, idx, w, w1, w3, w2, *shared, limit)
        assert rel(per_token, ref) <= 1e-5, (seed, rel(per_token, ref))
        rounded = [_bf16(a) for a in (w1, w3, w2)] + [None if a is None else _bf16(a) for a in shared]
        want = _core.cuda_ops.moe_forward(x, idx, w, *rounded, limit)
        got = _core.cuda_ops.moe_forward_split(x, idx, w, w1, w3, w2, *shared, limit, 2, bf16_weights=True)
        assert np.array_equal(got, want), (seed, "bf16", np.abs(got - want).max())
