"""Tensor-core kernels of the `precision="bf16"` GPU path vs float64 references.

Fresh random inputs each run (seed printed and in every assertion); device outputs and workspaces
are poisoned. Bounds and why:
- gemm_bf16_tc: the kernel rounds x and w to BF16 and accumulates in FP32, so against a float64
  product of the BF16-ROUNDED inputs the only error is FP32 accumulation: <= 1e-5 relative to the
  output's scale (K <= 4096 here). Against the unrounded FP32 inputs the BF16 rounding itself
  shows: <= 2e-2 (a sanity bound that a wrong operand layout would miss by orders of magnitude).
- moe_grouped_bf16: against a float64 emulation of the same roundings (x, weights and the hidden
  units entering the down projection rounded to BF16): <= 1e-3 relative, because a hidden unit
  that sits on a BF16 rounding boundary may round the other way after FP32 vs float64 gate
  sums (one BF16 ulp, 2^-8, on a few units); against the FP32 CPU reference: <= 3e-2.
"""

from __future__ import annotations

import numpy as np
import pytest
from dsv41rt import _core
from numerics import rel

pytestmark = pytest.mark.cuda


def bf16(a: np.ndarray) -> np.ndarray:
    """Round to BF16 (nearest even) and back to FP32."""
    u = np.asarray(a, np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32)


@pytest.mark.parametrize(
    "M,N,K,G",
    [
        (1, 5, 8, 1),
        (64, 128, 32, 1),
        (200, 300, 136, 1),
        (37, 96, 44, 1),
        (9, 130, 7, 1),
        (70, 64, 96, 4),
        (3, 24, 40, 8),
    ],
)
def test_gemm_bf16_tc(rng, M: int, N: int, K: int, G: int) -> None:
    g, seed = rng
    x = g.standard_normal((M, G * K)).astype(np.float32)
    w = (g.standard_normal((G, N, K)) / np.sqrt(K)).astype(np.float32)
    got = _core.cuda_ops.gemm_bf16_tc(x, w)
    xr = bf16(x).astype(np.float64).reshape(M, G, K)
    want = np.einsum("mgk,gnk->mgn", xr, bf16(w).astype(np.float64)).reshape(M, G * N)
    assert np.isfinite(got).all(), seed
    assert rel(got, want) <= 1e-5, (seed, rel(got, want))
    exact = np.einsum("mgk,gnk->mgn", x.reshape(M, G, K).astype(np.float64), w).reshape(M, G * N)
    assert rel(got, exact) <= 2e-2, (seed, rel(got, exact))
    y0 = g.standard_normal((M, G * N)).astype(np.float32)
    acc = _core.cuda_ops.gemm_bf16_tc(x, w, y0)
    assert rel(acc, want + y0) <= 1e-5, (seed, rel(acc, want + y0))


def test_gemm_bf16_tc_rows_do_not_depend_on_the_batch(rng) -> None:
    """A row's result is bitwise the same alone, in a full tile, or at a different tile offset."""
    g, seed = rng
    x = g.standard_normal((150, 256)).astype(np.float32)
    w = g.standard_normal((1, 200, 256)).astype(np.float32)
    full = _core.cuda_ops.gemm_bf16_tc(x, w)
    for rows in (slice(0, 1), slice(5, 6), slice(63, 130), slice(149, 150)):
        part = _core.cuda_ops.gemm_bf16_tc(np.ascontiguousarray(x[rows]), w)
        assert np.array_equal(part, full[rows]), (seed, rows)


def _silu_glu(gate, up, limit):
    if limit > 0:
        gate = np.minimum(gate, limit)
        up = np.clip(up, -limit, limit)
    return gate / (1.0 + np.exp(-gate)) * up


def _emulate(x, idx, wt, w1, w3, w2, shared, limit):
    """float64 MoE with the kernel's BF16 roundings (inputs of every GEMM)."""
    xb = bf16(x).astype(np.float64)
    y = np.zeros_like(xb)
    for t in range(x.shape[0]):
        for j in range(idx.shape[1]):
            e = idx[t, j]
            h = _silu_glu(bf16(w1[e]) @ xb[t], bf16(w3[e]) @ xb[t], limit) * wt[t, j]
            y[t] += bf16(w2[e]).astype(np.float64) @ bf16(h)
    if shared[0] is not None:
        s1, s3, s2 = shared
        h = _silu_glu(xb @ bf16(s1).T.astype(np.float64), xb @ bf16(s3).T.astype(np.float64), limit)
        y += bf16(h).astype(np.float64) @ bf16(s2).T.astype(np.float64)
    return y


@pytest.mark.parametrize(
    "S,H,inter,E,k", [(40, 64, 32, 8, 2), (9, 48, 24, 16, 6), (130, 96, 40, 4, 3), (3, 300, 70, 4, 4)]
)
def test_moe_grouped_bf16(rng, S: int, H: int, inter: int, E: int, k: int) -> None:
    g, seed = rng
    x = (g.standard_normal((S, H)) * 2).astype(np.float32)
    gw = (g.standard_normal((E, H)) * 0.2).astype(np.float32)
    w1 = (g.standard_normal((E, inter, H)) * 0.3).astype(np.float32)
    w3 = (g.standard_normal((E, inter, H)) * 0.3).astype(np.float32)
    w2 = (g.standard_normal((E, H, inter)) * 0.3).astype(np.float32)
    s1 = (g.standard_normal((inter + 8, H)) * 0.3).astype(np.float32)
    s3 = (g.standard_normal((inter + 8, H)) * 0.3).astype(np.float32)
    s2 = (g.standard_normal((H, inter + 8)) * 0.3).astype(np.float32)
    idx, wt = _core.ops.moe_route(x, gw, None, k, 1.5)
    idx[0] = idx[0, 0]  # one token sends every slot to the same expert
    for shared, limit in (((s1, s3, s2), 10.0), ((None, None, None), 10.0), ((s1, s3, s2), 0.0)):
        got = _core.cuda_ops.moe_grouped_bf16(x, idx, wt, w1, w3, w2, *shared, limit)
        assert np.isfinite(got).all(), seed
        want = _emulate(x, idx, wt, w1, w3, w2, shared, limit)
        assert rel(got, want) <= 1e-3, (seed, limit, rel(got, want))
        ref = _core.ops.moe_forward(x, idx, wt, w1, w3, w2, *shared, limit)
        assert rel(got, ref) <= 3e-2, (seed, limit, rel(got, ref))
