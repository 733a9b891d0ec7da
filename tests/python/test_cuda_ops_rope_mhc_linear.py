"""CUDA RoPE, mHC and linear kernels vs their CPU references (dsv41rt._core.ops). Fresh random
inputs (seed printed), poisoned device outputs.

Bounds and why:
- apply_rope: max|gpu - cpu| <= 2e-6 * max|cpu| per call. Same FP32 angle (pos * inv_freq), same
  complex-multiply rounding (each product rounded, no FMA); only device cosf/sinf differ from glibc
  by <= 2 ulp (~2.4e-7 absolute), scaled by |a| + |b|. The leading head_dim - rope_dim channels are
  bitwise untouched.
- hc_collapse / hc_expand: BITWISE (same products, same stream-ascending FP32 sum, no FMA).
- hc_mix: Σ f² is summed in double like the CPU, but the projection f·fn^T (n·H terms) sums in a
  different order (warp-strided FMA vs the CPU's 8-lane dot), so each logit differs by up to
  ~2·u·c with c = max_j Σ_k |f_k fn_jk| · r · |scale_j| (u = 2^-24; both sides are ~u·c from the
  exact value); sigmoid and Sinkhorn carry a logit error into log(output) with gain <= ~3, and
  device expf adds <= 2 ulp. Bound: |log(gpu) - log(cpu)| <= 2e-6 + 8·u·c per token; with fn = 0
  (mixer logits exact) that is 2e-6.
- linear / grouped_linear: max|gpu - cpu| <= 1e-5 * max|cpu| (FP32 accumulation of k products in a
  different order: ~u·sqrt(k) relative to the largest output for random data). Rows are
  batch-invariant (bitwise equal whether computed alone or in a batch).
"""

from __future__ import annotations

import numpy as np
import pytest
from dsv41rt import _core
from numerics import rel

pytestmark = pytest.mark.cuda

U = 2.0**-24


# ---- RoPE -----------------------------------------------------------------------------------

TINY_YARN = {"factor": 16.0, "original_max_position_embeddings": 65536, "beta_fast": 32.0, "beta_slow": 1.0}


@pytest.mark.parametrize(
    "rows,heads,head_dim,rope_dim,base,yarn",
    [
        (1, 1, 2, 2, 10000.0, None),
        (37, 3, 40, 16, 10000.0, None),
        (19, 8, 192, 64, 160000.0, TINY_YARN),
        (5, 2, 64, 64, 10000.0, None),
        (300, 16, 128, 64, 160000.0, TINY_YARN),
    ],
)
@pytest.mark.parametrize("inverse", [False, True])
def test_apply_rope(rng, rows, heads, head_dim, rope_dim, base, yarn, inverse):
    g, seed = rng
    x = (g.standard_normal((rows, heads, head_dim)) * g.uniform(0.1, 10)).astype(np.float32)
    pos = g.integers(0, 1 << 20, size=rows).astype(np.int64)
    pos[: min(rows, 3)] = [0, 1, 65535][: min(rows, 3)]
    inv_freq = _core.ops.rope_inv_freq(rope_dim, base, yarn)
    ref = _core.ops.apply_rope(x, pos, inv_freq, inverse)
    got = _core.cuda_ops.apply_rope(x, pos, inv_freq, inverse)
    assert got.shape == x.shape and np.isfinite(got).all(), seed
    np.testing.assert_array_equal(
        got[..., : head_dim - rope_dim], x[..., : head_dim - rope_dim], err_msg=f"seed {seed}"
    )
    assert rel(got, ref) <= 2e-6, (seed, rel(got, ref))
    back = _core.cuda_ops.apply_rope(got, pos, inv_freq, not inverse)
    assert np.max(np.abs(back - x)) <= 1e-5 * (1 + np.max(np.abs(x))), seed


def test_apply_rope_rejects_bad_shapes():
    x = np.zeros((2, 1, 8), np.float32)
    with pytest.raises(ValueError, match="positions for"):
        _core.cuda_ops.apply_rope(x, np.zeros(3, np.int64), np.ones(2, np.float32), False)
    with pytest.raises(ValueError, match="bad shape|rope_dim"):
        _core.cuda_ops.apply_rope(x, np.zeros(2, np.int64), np.ones(5, np.float32), False)


# ---- mHC ------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 4, 8])
@pytest.mark.parametrize("H", [64, 1000, 4096])
@pytest.mark.parametrize("zero_fn", [False, True])
def test_hc_mix(rng, n, H, zero_fn):
    g, seed = rng
    S, W = 13, (2 + n) * n
    X = (g.standard_normal((S, n, H)) * g.uniform(0.1, 10)).astype(np.float32)
    fn = (g.standard_normal((W, n * H)) * 0.02).astype(np.float32)
    if zero_fn:
        fn[:] = 0
    base = (g.standard_normal(W) * 0.5).astype(np.float32)
    scale = g.uniform(0.5, 2.0, 3).astype(np.float32)
    for iters in (1, 20):
        ref = _core.ops.hc_mix(X, fn, base, scale, 1e-20, 1e-6, iters)
        got = _core.cuda_ops.hc_mix(X, fn, base, scale, 1e-20, 1e-6, iters)
        f = X.reshape(S, -1).astype(np.float64)
        r = 1 / np.sqrt((f * f).mean(-1) + 1e-20)
        c = (np.abs(f) @ np.abs(fn.astype(np.float64)).T).max(-1) * r * np.abs(scale).max()  # [S]
        tol = 2e-6 + 8 * U * c
        for name, a, b in zip(("pre", "post", "comb"), got, ref, strict=True):
            assert a.shape == b.shape and np.isfinite(a).all(), (seed, name)
            d = np.abs(np.log(a.astype(np.float64)) - np.log(b.astype(np.float64))).reshape(S, -1).max(-1)
            worst = float(np.max(d / tol))
            assert worst <= 1, f"seed {seed}: {name} n {n} H {H} iters {iters}: |dlog| {d.max():.3g}, {worst:.3g}x"


@pytest.mark.parametrize("n", [1, 2, 4, 7])
@pytest.mark.parametrize("S,H", [(1, 1), (23, 96), (5, 7168)])
def test_hc_collapse_expand_bitwise(rng, n, S, H):
    g, seed = rng
    X = g.standard_normal((S, n, H)).astype(np.float32)
    w = g.standard_normal((S, n)).astype(np.float32)
    y = g.standard_normal((S, H)).astype(np.float32)
    post = g.uniform(0, 2, (S, n)).astype(np.float32)
    comb = g.uniform(0, 1, (S, n, n)).astype(np.float32)
    np.testing.assert_array_equal(_core.cuda_ops.hc_collapse(X, w), _core.ops.hc_collapse(X, w), err_msg=f"seed {seed}")
    got = _core.cuda_ops.hc_expand(X, y, post, comb)
    assert got.shape == (S, n, H)
    np.testing.assert_array_equal(got, _core.ops.hc_expand(X, y, post, comb), err_msg=f"seed {seed}")


# ---- linear ---------------------------------------------------------------------------------

LINEAR_SHAPES = [(1, 1, 1), (3, 7, 5), (33, 100, 65), (64, 5120, 96), (130, 37, 257), (2, 0, 3), (7, 4096, 1)]


@pytest.mark.parametrize("m,k,n", LINEAR_SHAPES, ids=str)
def test_linear(rng, m, k, n):
    g, seed = rng
    x = g.standard_normal((m, k)).astype(np.float32)
    w = (g.standard_normal((n, k)) * g.uniform(0.01, 1)).astype(np.float32)
    ref = _core.ops.linear(x, w)
    got = _core.cuda_ops.linear(x, w)
    assert got.shape == (m, n) and np.isfinite(got).all(), seed
    if k == 0:
        np.testing.assert_array_equal(got, np.zeros((m, n), np.float32))
        return
    assert rel(got, ref) <= 1e-5, (seed, rel(got, ref))
    # Accumulate mode: y0 + x @ w.T.
    y0 = g.standard_normal((m, n)).astype(np.float32)
    acc = _core.cuda_ops.linear(x, w, y0)
    assert rel(acc, y0.astype(np.float64) + ref) <= 1e-5, seed
    # Batch invariance: every row equals the row computed alone.
    for i in {0, m - 1}:
        np.testing.assert_array_equal(_core.cuda_ops.linear(x[i : i + 1], w)[0], got[i], err_msg=f"seed {seed}")


@pytest.mark.parametrize(
    "m,groups,k_g,n_g", [(1, 1, 1, 1), (5, 8, 64, 32), (33, 3, 100, 17), (4, 16, 512, 64)], ids=str
)
def test_grouped_linear(rng, m, groups, k_g, n_g):
    g, seed = rng
    x = g.standard_normal((m, groups, k_g)).astype(np.float32)
    w = (g.standard_normal((groups, n_g, k_g)) * 0.1).astype(np.float32)
    got = _core.cuda_ops.grouped_linear(x, w)
    assert got.shape == (m, groups, n_g) and np.isfinite(got).all(), seed
    ref = np.stack([_core.ops.linear(np.ascontiguousarray(x[:, j]), w[j]) for j in range(groups)], axis=1)
    assert rel(got, ref) <= 1e-5, (seed, rel(got, ref))
