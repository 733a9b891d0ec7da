"""dsv41rt._core.ops norm ops (RMSNorm, RoPE + YaRN, mHC) against NeMo Automodel 0.7.0's own
DeepSeek-V4.1 modules (the independent reference; eager torch, FP32).

Inputs are random from a fresh seed per test run (printed in every assertion message).

Bounds (relative unless stated) and why:
- RMSNorm: 1e-6 elementwise. Same FP32 operation order as NeMo; only the sum of squares differs
  (ours: double accumulate, torch: cascade FP32 sum), so rows differ by ~1 ulp of rsqrt
  (measured <= 2.5e-7).
- RoPE frequency table: bitwise for R = 16 and 64 at bases 1e4 and 1.6e5 (with and without YaRN).
- RoPE application: bitwise (same FP32 angle, glibc cosf/sinf as torch.polar, same complex-multiply
  rounding), forward and inverse.
- hc_collapse / hc_expand: bitwise (same product and stream-ascending FP32 sum order).
- hc_mix with fn = 0 (sigmoid + Sinkhorn in isolation): 1e-6 (measured: bitwise up to 2.2e-7; torch
  uses Sleef exp/vector softmax).
- hc_mix in general: the projection f·fn^T is an FP32 dot product of n·H terms whose summation
  order differs (torch BLAS vs our 8-lane dot), so logits differ by ~u·Σ|f_k fn_jk|·r·|scale|
  (u = 2^-24; a condition-number effect, both are equally far from a float64 evaluation). Sigmoid
  and Sinkhorn carry a logit error into log(output) with gain <= ~3. Bound:
  |log(ours) - log(nemo)| <= 1e-6 + 4·u·c, c = max_j Σ_k |f_k fn_jk|·r·|scale_j| per token
  (measured <= 3·u·c at n·H = 128..256 and <= 1.2·u·c at n·H = 2048..4096).
"""

from __future__ import annotations

import random
import types

import numpy as np
import pytest
from conftest import require_oracle_packages

pytestmark = pytest.mark.oracle

SEED = random.SystemRandom().randrange(2**32)
U = 2.0**-24
TINY_YARN = {"factor": 16, "original_max_position_embeddings": 65536, "beta_fast": 32, "beta_slow": 1}


def rng(salt: int) -> np.random.Generator:
    return np.random.default_rng([SEED, salt])


def max_rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a.astype(np.float64) - b) / np.abs(b.astype(np.float64))))


def ops():
    from dsv41rt import _core

    return _core.ops


# ---- RMSNorm --------------------------------------------------------------------------------


@pytest.mark.parametrize("eps", [1e-20, 1e-6])
@pytest.mark.parametrize("dim", [1, 64, 1000, 4096])
def test_rms_norm_matches_nemo(eps: float, dim: int) -> None:
    require_oracle_packages()
    import torch
    from nemo_automodel.components.models.deepseek_v41.layers import DeepseekV41RMSNorm

    g = rng(dim)
    norm = DeepseekV41RMSNorm(dim, eps, torch.float32)
    w = g.standard_normal(dim).astype(np.float32)
    x = (g.standard_normal((3, 5, dim)) * 3).astype(np.float32)
    with torch.no_grad():
        norm.weight.copy_(torch.from_numpy(w))
        ref = norm(torch.from_numpy(x)).numpy()
    got = ops().rms_norm(x, w, eps)
    assert got.shape == x.shape and got.dtype == np.float32
    err = max_rel(got, ref)
    assert err <= 1e-6, f"seed {SEED}: rms_norm dim {dim} eps {eps} rel {err:.3g}"


def test_rms_norm_tiny_values_use_eps_1e20() -> None:
    """eps = 1e-20 is representable in FP32 and still matters for rows near 1e-10."""
    require_oracle_packages()
    import torch
    from nemo_automodel.components.models.deepseek_v41.layers import DeepseekV41RMSNorm

    x = (rng(7).standard_normal((4, 32)) * 1e-10).astype(np.float32)
    w = np.ones(32, np.float32)
    with torch.no_grad():
        ref = DeepseekV41RMSNorm(32, 1e-20, torch.float32)(torch.from_numpy(x)).numpy()
    err = max_rel(ops().rms_norm(x, w, 1e-20), ref)
    assert err <= 1e-6, f"seed {SEED}: rel {err:.3g}"


# ---- RoPE -----------------------------------------------------------------------------------


def nemo_rotary(rope_dim: int, theta: float, yarn: dict | None):
    from nemo_automodel.components.models.deepseek_v41.attention import _RotaryEmbedding

    cfg = types.SimpleNamespace(
        qk_rope_head_dim=rope_dim, rope_theta=theta, compress_rope_theta=theta, rope_scaling=yarn
    )
    return _RotaryEmbedding(cfg, compressed=yarn is not None)


ROPE_CASES = [
    # ratio-0 layer: rope_theta 10000, no YaRN; compressed layer: 160000 + the tiny preset's YaRN.
    (16, 10000.0, None),
    (16, 160000.0, TINY_YARN),
    (64, 10000.0, None),
    (64, 160000.0, TINY_YARN),
]


def test_tiny_preset_rope_params_are_the_ones_tested() -> None:
    from dsv41rt.config.presets import preset_config_json

    t = preset_config_json("tiny-v41")["text_config"]
    assert t["qk_rope_head_dim"] == 16 and t["rope_theta"] == 10000.0
    assert t["compress_rope_theta"] == 160000.0
    assert {k: t["rope_scaling"][k] for k in TINY_YARN} == TINY_YARN


@pytest.mark.parametrize("rope_dim,theta,yarn", ROPE_CASES)
def test_rope_table_bitwise(rope_dim: int, theta: float, yarn: dict | None) -> None:
    require_oracle_packages()
    import torch

    ref = nemo_rotary(rope_dim, theta, yarn)(torch.ones(1, 1, dtype=torch.long))[0, 0].numpy()
    got = ops().rope_inv_freq(rope_dim, theta, yarn)
    assert got.dtype == np.float32 and got.shape == (rope_dim // 2,)
    np.testing.assert_array_equal(got, ref, err_msg=f"rope table {rope_dim} {theta} {yarn}")


def test_rope_yarn_low_high_quirk() -> None:
    """base 160000, L0 65536, factor 16, R 64: pairs 0-15 keep θ, 25-31 are θ/16."""
    plain = ops().rope_inv_freq(64, 160000.0, None)
    yarn = ops().rope_inv_freq(64, 160000.0, TINY_YARN)
    np.testing.assert_array_equal(yarn[:16], plain[:16])
    np.testing.assert_array_equal(yarn[25:], plain[25:] / np.float32(16))
    assert np.all(yarn[16:25] < plain[16:25]) and np.all(yarn[16:25] > plain[16:25] / 16)


@pytest.mark.parametrize("rope_dim,theta,yarn", ROPE_CASES)
@pytest.mark.parametrize("inverse", [False, True])
def test_apply_rope_bitwise(rope_dim: int, theta: float, yarn: dict | None, inverse: bool) -> None:
    require_oracle_packages()
    import torch
    from nemo_automodel.components.models.deepseek_v41.attention import _apply_rope

    g = rng(rope_dim + int(theta) + inverse)
    rows, heads, head_dim = 37, 3, rope_dim + 24
    x = g.standard_normal((rows, heads, head_dim)).astype(np.float32)
    pos = g.integers(0, 1 << 20, size=rows).astype(np.int64)
    pos[:3] = [0, 1, 65535]
    angles = nemo_rotary(rope_dim, theta, yarn)(torch.from_numpy(pos)[None])
    ref = _apply_rope(torch.from_numpy(x)[None], angles, inverse=inverse)[0].numpy()
    got = ops().apply_rope(x, pos, ops().rope_inv_freq(rope_dim, theta, yarn), inverse)
    assert got.shape == x.shape
    np.testing.assert_array_equal(got, ref, err_msg=f"seed {SEED}")
    back = ops().apply_rope(got, pos, ops().rope_inv_freq(rope_dim, theta, yarn), not inverse)
    assert np.max(np.abs(back - x)) <= 1e-6 * (1 + np.max(np.abs(x))), f"seed {SEED}"


def test_apply_rope_rejects_bad_shapes() -> None:
    x = np.zeros((2, 1, 8), np.float32)
    with pytest.raises(ValueError):
        ops().apply_rope(x, np.zeros(3, np.int64), np.ones(2, np.float32), False)
    with pytest.raises(ValueError):
        ops().apply_rope(x, np.zeros(2, np.int64), np.ones(5, np.float32), False)


# ---- mHC ------------------------------------------------------------------------------------


def nemo_hc(n: int, hidden: int, g: np.random.Generator, zero_fn: bool):
    import torch
    from nemo_automodel.components.models.deepseek_v41.layers import DeepseekV41HyperConnection

    cfg = types.SimpleNamespace(
        hc_mult=n,
        hc_sinkhorn_iters=20,
        hc_eps=1e-6,
        rms_norm_eps=1e-20,
        hidden_size=hidden,
        initializer_range=0.02,
    )
    hc = DeepseekV41HyperConnection(cfg)
    with torch.no_grad():  # NeMo's own init for fn (std 0.02); random base and scale
        hc.fn.copy_(torch.from_numpy((g.standard_normal(hc.fn.shape) * 0.02).astype(np.float32)))
        if zero_fn:
            hc.fn.zero_()
        hc.base.copy_(torch.from_numpy((g.standard_normal(hc.base.shape) * 0.5).astype(np.float32)))
        hc.scale.copy_(torch.from_numpy(g.uniform(0.5, 2.0, 3).astype(np.float32)))
    return hc


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("hidden", [64, 1024])
@pytest.mark.parametrize("zero_fn", [True, False])
def test_hc_mix_matches_nemo(n: int, hidden: int, zero_fn: bool) -> None:
    require_oracle_packages()
    import torch

    g = rng(100 * n + hidden + zero_fn)
    hc = nemo_hc(n, hidden, g, zero_fn)
    S = 19
    X = g.standard_normal((S, n, hidden)).astype(np.float32)
    with torch.no_grad():
        mix = hc(torch.from_numpy(X)[None])
    fn, base, scale = (t.detach().numpy() for t in (hc.fn, hc.base, hc.scale))
    pre, post, comb = ops().hc_mix(X, fn, base, scale, 1e-20, 1e-6, 20)
    assert pre.shape == (S, n) and post.shape == (S, n) and comb.shape == (S, n, n)
    refs = {"pre": mix.pre[0].numpy(), "post": mix.post[0].numpy(), "comb": mix.comb[0].numpy()}
    if zero_fn:
        for name, got in (("pre", pre), ("post", post), ("comb", comb)):
            err = max_rel(got, refs[name])
            assert err <= 1e-6, f"seed {SEED}: {name} n {n} rel {err:.3g}"
        return
    f = X.reshape(S, -1).astype(np.float64)
    r = 1 / np.sqrt((f * f).mean(-1) + 1e-20)
    c = (np.abs(f) @ np.abs(fn.astype(np.float64)).T).max(-1) * r * np.abs(scale).max()  # [S]
    tol = 1e-6 + 4 * U * c
    for name, got in (("pre", pre), ("post", post), ("comb", comb)):
        d = np.abs(np.log(got.astype(np.float64)) - np.log(refs[name].astype(np.float64)))
        d = d.reshape(S, -1).max(-1)
        worst = float(np.max(d / tol))
        assert worst <= 1, f"seed {SEED}: {name} n {n} H {hidden}: |dlog| {d.max():.3g}, {worst:.3g}x bound"
    # Sinkhorn output is ~doubly stochastic (columns are normalised last).
    assert np.allclose(comb.sum(-2), 1, atol=1e-5), f"seed {SEED}"


@pytest.mark.parametrize("n", [2, 4])
def test_hc_collapse_and_expand_bitwise(n: int) -> None:
    require_oracle_packages()
    import torch
    from nemo_automodel.components.models.deepseek_v41.layers import (
        DeepseekV41HyperConnection,
        DeepseekV41Mix,
    )

    g = rng(1000 + n)
    S, H = 23, 96
    X = g.standard_normal((S, n, H)).astype(np.float32)
    w = g.standard_normal((S, n)).astype(np.float32)
    y = g.standard_normal((S, H)).astype(np.float32)
    post = g.uniform(0, 2, (S, n)).astype(np.float32)
    comb = g.uniform(0, 1, (S, n, n)).astype(np.float32)
    tX = torch.from_numpy(X)[None]
    ref_u = DeepseekV41HyperConnection.collapse(tX, torch.from_numpy(w)[None])[0].numpy()
    np.testing.assert_array_equal(ops().hc_collapse(X, w), ref_u, err_msg=f"seed {SEED}")
    mix = DeepseekV41Mix(torch.from_numpy(w)[None], torch.from_numpy(post)[None], torch.from_numpy(comb)[None])
    ref_o = DeepseekV41HyperConnection.expand(torch.from_numpy(y)[None], tX, mix)[0].numpy()
    got_o = ops().hc_expand(X, y, post, comb)
    assert got_o.shape == (S, n, H)
    np.testing.assert_array_equal(got_o, ref_o, err_msg=f"seed {SEED}")
    # Orientation: comb[i, o] weighs input stream i into output stream o (not comb[o, i]).
    if n > 1:
        assert not np.array_equal(got_o, ops().hc_expand(X, y, post, np.ascontiguousarray(comb.transpose(0, 2, 1))))


def test_hc_rejects_bad_shapes() -> None:
    X = np.zeros((2, 2, 4), np.float32)
    with pytest.raises(ValueError):
        ops().hc_collapse(X, np.zeros((2, 3), np.float32))
    with pytest.raises(ValueError):
        ops().hc_mix(X, np.zeros((8, 7), np.float32), np.zeros(8, np.float32), np.ones(3, np.float32), 1e-20, 1e-6, 20)
    with pytest.raises(ValueError):
        fn = np.zeros((8, 8), np.float32)
        ops().hc_mix(X, fn, np.zeros(8, np.float32), np.ones(3, np.float32), 1e-20, 1e-6, 0)
