"""CUDA attention-side kernels vs their CPU references (fresh random inputs, poisoned outputs).

Bounds:
- sparse_attention, compress_pool, indexer_scores (FP32 values): max |gpu - cpu| / max |cpu|
  <= 1e-5. The GPU reduces dot products and exp-sums in a different order than the CPU loops
  (warp-shuffle trees, fused multiply-adds, CUDA expf vs libm exp, and an online-softmax rescale
  when a query has more than 1024 keys), which moves results by a few ulp of the largest term.
- candidate_blocks and topk_select (discrete outputs): exactly equal to the CPU on the same input
  scores, including ties (lower index wins), -0.0 vs +0.0, -inf / +inf entries and -1 padding.
"""

from __future__ import annotations

import numpy as np
import pytest
from dsv41rt import _core
from numerics import rel

pytestmark = pytest.mark.cuda

cpu = _core.ops


def gpu():
    return _core.cuda_ops


@pytest.mark.parametrize(
    "S,H,D,T,K",
    [(9, 4, 64, 30, 12), (5, 8, 512, 300, 640), (3, 2, 128, 5000, 2500), (4, 3, 100, 50, 33)],
)
def test_sparse_attention(rng, S: int, H: int, D: int, T: int, K: int) -> None:
    g, seed = rng
    q = g.standard_normal((S, H, D), dtype=np.float32)
    kv = g.standard_normal((T, D), dtype=np.float32)
    sink = (g.standard_normal(H) * 2).astype(np.float32)
    idx = np.stack([g.choice(T, K, replace=K > T) for _ in range(S)]).astype(np.int32)
    idx[g.random((S, K)) < 0.3] = -1
    idx[0] = -1  # a query with no key at all: zero output
    scale = D**-0.5
    got = gpu().sparse_attention(q, kv, idx, sink, scale)
    ref = cpu.sparse_attention(q, kv, idx, sink, scale)
    assert got.shape == ref.shape
    assert np.isfinite(got).all(), seed
    assert np.all(got[0] == 0), seed
    assert rel(got, ref) <= 1e-5, (seed, rel(got, ref))

    # Out-of-range indices (device data the launcher cannot check) are skipped like -1.
    bad = idx.copy()
    bad[:, 0] = T + 5
    bad[:, -1] = -7
    cleaned = np.where((bad >= 0) & (bad < T), bad, -1).astype(np.int32)
    got = gpu().sparse_attention(q, kv, bad, sink, scale)
    ref = cpu.sparse_attention(q, kv, cleaned, sink, scale)
    assert rel(got, ref) <= 1e-5, (seed, rel(got, ref))


@pytest.mark.parametrize("G,m,D", [(7, 2, 64), (5, 4, 512), (3, 128, 100), (0, 4, 16)])
def test_compress_pool(rng, G: int, m: int, D: int) -> None:
    g, seed = rng
    values = g.standard_normal((G * m, D), dtype=np.float32)
    scores = (g.standard_normal((G * m, D)) * 4).astype(np.float32)
    got = gpu().compress_pool(values, scores, m)
    ref = cpu.compress_pool(values, scores, m)
    assert got.shape == ref.shape == (G, D)
    assert np.isfinite(got).all(), seed
    assert rel(got, ref) <= 1e-5, (seed, rel(got, ref))


def test_compress_pool_rejects_partial_groups() -> None:
    values = np.zeros((3, 16), np.float32)
    with pytest.raises(_core.Error, match="not a whole number of groups"):
        gpu().compress_pool(values, values, 2)


def visible_counts(g, S: int, T: int, causal: bool) -> np.ndarray:
    if causal:
        return np.minimum(np.arange(S) + 1, T).astype(np.int64)
    n_vis = g.integers(0, T + 1, S).astype(np.int64)
    n_vis[:4] = [0, T, T + 7, -3][: min(4, S)]
    return n_vis


@pytest.mark.parametrize("S,H,D,T,causal", [(37, 16, 32, 37, True), (8, 64, 128, 3000, False), (5, 3, 100, 9, False)])
def test_indexer_scores(rng, S: int, H: int, D: int, T: int, causal: bool) -> None:
    g, seed = rng
    q = g.standard_normal((S, H, D), dtype=np.float32)
    keys = g.standard_normal((T, D), dtype=np.float32)
    w = (g.standard_normal((S, H)) * (D**-0.5 * H**-0.5)).astype(np.float32)
    n_vis = visible_counts(g, S, T, causal)
    got = gpu().indexer_scores(q, keys, w, n_vis)
    ref = cpu.indexer_scores(q, keys, w, n_vis)
    finite = np.isfinite(ref)
    assert np.array_equal(np.isfinite(got), finite), seed
    assert np.all(got[~finite] == -np.inf), seed
    assert rel(got[finite], ref[finite]) <= 1e-5, (seed, rel(got[finite], ref[finite]))


def tie_heavy_scores(g, S: int, T: int) -> np.ndarray:
    """Small integers (many exact ties), -0.0 next to +0.0, -inf patches and a few +inf."""
    s = g.integers(-3, 4, (S, T)).astype(np.float32)
    s[s == 0] = np.where(g.random(int((s == 0).sum())) < 0.5, -0.0, 0.0)
    s[g.random((S, T)) < 0.2] = -np.inf
    s[g.random((S, T)) < 0.002] = np.inf
    if S > 1:
        s[1] = -np.inf  # a row with nothing finite
    return s


def indexer_like_scores(g, S: int, T: int, n_vis: np.ndarray) -> np.ndarray:
    H, D = 8, 32
    q = g.standard_normal((S, H, D), dtype=np.float32)
    keys = g.standard_normal((T, D), dtype=np.float32)
    w = (g.standard_normal((S, H)) * (D**-0.5 * H**-0.5)).astype(np.float32)
    return cpu.indexer_scores(q, keys, w, n_vis)


@pytest.mark.parametrize(
    "S,T,topk_blocks,block_size",
    [(37, 37, 3, 4), (16, 5000, 8, 64), (4, 16384, 64, 1), (5, 10, 100, 3), (6, 1000, 5, 7)],
)
def test_candidate_blocks_exact(rng, S: int, T: int, topk_blocks: int, block_size: int) -> None:
    g, seed = rng
    n_vis = visible_counts(g, S, T, causal=S == T)
    for scores in (indexer_like_scores(g, S, T, n_vis), tie_heavy_scores(g, S, T)):
        got = gpu().candidate_blocks(scores, n_vis, topk_blocks, block_size)
        ref = cpu.candidate_blocks(scores, n_vis, topk_blocks, block_size)
        assert got.dtype == np.uint8 and got.shape == (S, T)
        mismatch = np.argwhere(got != ref)
        assert mismatch.size == 0, (seed, mismatch[:5].tolist())


@pytest.mark.parametrize("S,T,k", [(37, 37, 8), (8, 5000, 512), (4, 16384, 512), (3, 20000, 1), (5, 50, 80), (3, 0, 4)])
def test_topk_select_exact(rng, S: int, T: int, k: int) -> None:
    g, seed = rng
    n_vis = visible_counts(g, S, T, causal=S == T) if T else np.zeros(S, np.int64)
    cases = [tie_heavy_scores(g, S, T)]
    if T:
        scores = indexer_like_scores(g, S, T, n_vis)
        mask = cpu.candidate_blocks(scores, n_vis, 4, 16)
        cases += [scores, np.where(mask != 0, scores, -np.inf).astype(np.float32)]
    for scores in cases:
        got = gpu().topk_select(scores, k)
        ref = cpu.topk_select(scores, k)
        assert got.dtype == np.int32 and got.shape == (S, k)
        bad_rows = np.where((got != ref).any(axis=1))[0]
        assert bad_rows.size == 0, (seed, bad_rows[:5].tolist())


def test_topk_pads_with_minus_one_and_prefers_lower_index_on_ties() -> None:
    scores = np.array([[1.0, 3.0, 3.0, -np.inf, 2.0], [-np.inf] * 5], np.float32)
    assert gpu().topk_select(scores, 3).tolist() == [[1, 2, 4], [-1, -1, -1]]
    assert gpu().topk_select(scores[:1], 2).tolist() == [[1, 2]]
    assert gpu().topk_select(scores[:1], 7).tolist() == [[0, 1, 2, 4, -1, -1, -1]]
    assert gpu().topk_select(scores, 0).shape == (2, 0)
