"""Token sampler (kernels/sampling.h) vs an independent numpy implementation of its documented semantics.

(1) sampling_probs == the numpy filtered distribution for many random parameter combinations;
(2) chi-square goodness of fit of >= 20,000 draws per parameter set against that distribution, with a
    critical value at p = 1e-4 (Wilson-Hilferty); the same test must reject deliberately wrong
    distributions, so it has the power to catch a sampler drawing from the wrong one;
(3) determinism: a token depends only on (seed, step, logits, history), not on call order or on
    other requests in between.
Fresh seed per run, printed (pytest -s shows it; it is also in every assertion message).
"""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest
from dsv41rt import _core

ops = _core.ops

DEFAULTS = {
    "temperature": 1.0,
    "top_k": 0,
    "top_p": 1.0,
    "min_p": 0.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "repetition_penalty": 1.0,
    "seed": 0,
    "top_logprobs": 0,
}
FLOAT_FIELDS = ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty")


def ref_probs(logits, params, prompt=(), output=()) -> np.ndarray:
    """The documented pipeline: penalties -> temperature -> top-k -> top-p -> min-p, renormalised."""
    p = {**DEFAULTS, **params}
    for k in FLOAT_FIELDS:  # the kernel holds the parameters as float32
        p[k] = float(np.float32(p[k]))
    x = np.asarray(logits, np.float64).copy()
    V = x.size
    prompt = np.asarray(prompt, np.int64)
    output = np.asarray(output, np.int64)
    if p["repetition_penalty"] != 1.0:
        seen = np.zeros(V, bool)
        seen[prompt] = True
        seen[output] = True
        rp = p["repetition_penalty"]
        x[seen] = np.where(x[seen] > 0, x[seen] / rp, x[seen] * rp)
    counts = np.bincount(output, minlength=V)
    gen = counts > 0
    x[gen] -= p["frequency_penalty"] * counts[gen] + p["presence_penalty"]
    if p["temperature"] < 1e-5:
        one_hot = np.zeros(V)
        one_hot[np.argmax(x)] = 1.0  # first maximum: ties -> lowest id
        return one_hot
    w = np.exp((x - x.max()) / p["temperature"])
    order = np.lexsort((np.arange(V), -w))  # probability descending, id ascending
    keep = np.zeros(V, bool)
    n = p["top_k"] if 1 <= p["top_k"] < V else V
    cand = order[:n]
    if p["top_p"] < 1.0:
        cum = np.cumsum(w[cand])
        before = cum - w[cand]
        cand = cand[before < p["top_p"] * cum[-1]]
    keep[cand] = True
    if p["min_p"] > 0:
        keep &= w >= p["min_p"]  # w = p / p_max
    w = np.where(keep, w, 0.0)
    return w / w.sum()


def random_params(g: np.random.Generator, V: int) -> dict:
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
    return d


def test_probs_match_numpy_reference(rng) -> None:
    g, seed = rng
    for trial in range(400):
        V = int(g.choice([1, 2, 7, 64, 1000, int(g.integers(1, 3000))]))
        logits = (g.standard_normal(V) * g.uniform(0.1, 6)).astype(np.float32)
        if trial % 4 == 0:
            logits = (np.round(logits * 2) / 2).astype(np.float32)  # many exact ties
        if trial % 5 == 0 and V > 2:
            logits[g.choice(V, V // 3, replace=False)] = -np.inf
            logits[g.integers(V)] = 1.0
        prompt = g.integers(0, V, int(g.integers(0, 30))).astype(np.int32)
        output = g.integers(0, V, int(g.integers(0, 30))).astype(np.int32)
        params = random_params(g, V)
        got = ops.sampling_probs(logits, params, prompt, output)
        want = ref_probs(logits, params, prompt, output)
        msg = f"seed {seed} trial {trial} V {V} params {params}"
        assert got.dtype == np.float32 and got.shape == (V,), msg
        # Same support, up to float32 underflow of probabilities below ~1e-38.
        np.testing.assert_array_equal(got[want == 0], 0, err_msg=msg)
        assert np.all(got[want > 1e-30] > 0), msg
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7, err_msg=msg)
        # The draw always lands in the support; its logprob is the raw log_softmax.
        step = int(g.integers(0, 10_000))
        tok, lp, top_ids, top_lps = ops.sample_token(logits, {**params, "top_logprobs": 5}, prompt, output, step)
        assert want[tok] > 0, msg
        raw = logits.astype(np.float64) - np.logaddexp.reduce(logits.astype(np.float64))
        assert abs(lp - raw[tok]) < 1e-5 or (np.isneginf(lp) and np.isneginf(raw[tok])), msg
        n_top = min(5, V)
        np.testing.assert_array_equal(top_ids, np.lexsort((np.arange(V), -raw))[:n_top], err_msg=msg)
        np.testing.assert_allclose(top_lps, raw[top_ids], rtol=1e-5, atol=1e-5, err_msg=msg)


def chi2_test(counts: np.ndarray, q: np.ndarray) -> tuple[bool, float, float]:
    """(accepted, statistic, critical value at p = 1e-4) for observed counts against probabilities q.

    Draws outside q's support reject outright. Bins with expectation < 5 are pooled (smallest first)
    until every bin has >= 5. Critical value: Wilson-Hilferty, df (1 - 2/(9 df) + z sqrt(2/(9 df)))^3.
    """
    n = counts.sum()
    if counts[q <= 0].sum() > 0:
        return False, math.inf, 0.0
    exp = n * q[q > 0]
    obs = counts[q > 0].astype(np.float64)
    idx = np.argsort(exp, kind="stable")
    exp, obs = exp[idx], obs[idx]
    bins_e, bins_o, acc_e, acc_o = [], [], 0.0, 0.0
    for e, o in zip(exp, obs, strict=True):
        acc_e += e
        acc_o += o
        if acc_e >= 5:
            bins_e.append(acc_e)
            bins_o.append(acc_o)
            acc_e = acc_o = 0.0
    if acc_e > 0:  # leftover low-expectation mass joins the last (largest) bin
        if bins_e:
            bins_e[-1] += acc_e
            bins_o[-1] += acc_o
        else:
            bins_e.append(acc_e)
            bins_o.append(acc_o)
    bins_e, bins_o = np.array(bins_e), np.array(bins_o)
    df = len(bins_e) - 1
    if df == 0:
        return bool(bins_o[0] == n), 0.0, 0.0
    stat = float(((bins_o - bins_e) ** 2 / bins_e).sum())
    z = statistics.NormalDist().inv_cdf(1 - 1e-4)
    a = 2.0 / (9.0 * df)
    crit = df * (1 - a + z * math.sqrt(a)) ** 3
    return stat <= crit, stat, crit


def draw_histogram(logits, params, prompt, output, n, base_seed) -> np.ndarray:
    counts = np.zeros(logits.size, np.int64)
    for i in range(n):  # 400 seeds x 50 steps
        tok = ops.sample_token(logits, {**params, "seed": base_seed + i // 50}, prompt, output, i % 50)[0]
        counts[tok] += 1
    return counts


def test_chi_square_goodness_of_fit(rng) -> None:
    g, seed = rng
    V, N = 200, 20_000
    logits = (g.standard_normal(V) * 2).astype(np.float32)
    prompt = g.integers(0, V, 40).astype(np.int32)
    # Put the most likely tokens in the history so the penalties matter.
    top = np.argsort(-logits)[:10].astype(np.int32)
    output = np.concatenate([top[:5], top[:3], g.integers(0, V, 10).astype(np.int32)])
    pen = {"repetition_penalty": 1.3, "presence_penalty": 0.5, "frequency_penalty": 0.3}
    cases = [
        # (params, deliberately wrong alternatives the test must reject)
        ({"temperature": 0.7, "top_k": 50}, [{"top_k": 50}, {"temperature": 0.7}, {"temperature": 0.8, "top_k": 50}]),
        ({"top_p": 0.9}, [{}, {"top_p": 0.8}]),
        ({"min_p": 0.1}, [{}, {"min_p": 0.2}, {"min_p": 0.05}]),
        (pen, [{}, {**pen, "repetition_penalty": 1.0}, {**pen, "presence_penalty": 0.0}]),
        (
            {"temperature": 1.3, "top_p": 0.8, "min_p": 0.02, **pen},
            [{"temperature": 1.0, "top_p": 0.8, "min_p": 0.02, **pen}, {"temperature": 1.3, "top_p": 0.7, **pen}],
        ),
    ]
    for params, wrongs in cases:
        base = int(g.integers(0, 2**62))
        counts = draw_histogram(logits, params, prompt, output, N, base)
        q = ref_probs(logits, params, prompt, output)
        ok, stat, crit = chi2_test(counts, q)
        print(f"{params}: chi2 {stat:.1f} <= {crit:.1f}")
        assert ok, f"seed {seed} params {params}: chi2 {stat:.1f} > {crit:.1f}"
        n_checked = 0
        for wrong in wrongs:
            q_w = ref_probs(logits, wrong, prompt, output)
            tv = 0.5 * np.abs(q_w - q).sum()
            if tv < 0.05:  # these logits make the two coincide (e.g. both filters keep the same set)
                continue
            n_checked += 1
            ok_w, stat_w, crit_w = chi2_test(counts, q_w)
            print(f"  wrong {wrong} (TV {tv:.3f}): chi2 {stat_w:.1f} vs {crit_w:.1f}")
            assert not ok_w, f"seed {seed}: {params} draws pass as {wrong} ({stat_w:.1f} <= {crit_w:.1f})"
        assert n_checked > 0, f"seed {seed} params {params}: no wrong alternative differs enough"
        # A subtle wrong one: swap the probabilities of the two most likely tokens.
        swapped = q.copy()
        a, b = np.argsort(-q)[:2]
        swapped[a], swapped[b] = q[b], q[a]
        if q[a] - q[b] > 0.02:
            assert not chi2_test(counts, swapped)[0], f"seed {seed} params {params}: swap not detected"


def test_same_seed_same_tokens_regardless_of_order_or_batch(rng) -> None:
    g, seed = rng
    V, steps = 500, 40
    step_logits = (g.standard_normal((steps, V)) * 1.5).astype(np.float32)
    prompt = g.integers(0, V, 20).astype(np.int32)
    params = {
        "temperature": 0.9,
        "top_k": 100,
        "top_p": 0.95,
        "presence_penalty": 0.4,
        "seed": int(g.integers(0, 2**64, dtype=np.uint64)),
    }

    def generate(start_output=(), start=0, interleave=None):
        out = list(start_output)
        for step in range(start, steps):
            if interleave is not None:
                interleave(step)
            out.append(ops.sample_token(step_logits[step], params, prompt, np.array(out, np.int32), step)[0])
        return out

    alone = generate()
    # Other requests in the same "batch" (drawn between our calls, other seeds and logits).
    other = (g.standard_normal(V)).astype(np.float32)

    def noise(step):
        for s in range(3):
            ops.sample_token(other, {"seed": s * 1000 + step}, None, None, step)

    assert generate(interleave=noise) == alone, seed
    # Preemption + recompute: resume at step 17 from the kept history.
    assert generate(alone[:17], 17) == alone, seed
    # Individual (seed, step) draws in a shuffled order reproduce the same tokens.
    for step in g.permutation(steps):
        tok = ops.sample_token(step_logits[step], params, prompt, np.array(alone[:step], np.int32), int(step))[0]
        assert tok == alone[step], (seed, step)
    # Another seed gives another sequence.
    params["seed"] ^= 1
    assert generate() != alone, seed


def test_greedy_and_logprobs_by_hand() -> None:
    logits = np.array([1, 3, 3, 2], np.float32)
    tok, lp, ids, lps = ops.sample_token(logits, {"temperature": 0.0, "top_logprobs": 2}, None, None, 5)
    lse = np.log(np.exp(logits.astype(np.float64)).sum())
    assert tok == 1
    assert lp == pytest.approx(3 - lse, abs=1e-6)
    assert ids.tolist() == [1, 2]
    np.testing.assert_allclose(lps, [3 - lse, 3 - lse], atol=1e-6)
    np.testing.assert_array_equal(ops.sampling_probs(logits, {"temperature": 0}), [0, 1, 0, 0])
    # Penalties: repetition 2 on prompt token 1 flips greedy to token 2.
    assert ops.sample_token(logits, {"temperature": 0, "repetition_penalty": 2}, np.array([1], np.int32))[0] == 2


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("temperature", -1.0),
        ("temperature", float("nan")),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("min_p", -0.1),
        ("repetition_penalty", 0.0),
        ("presence_penalty", 3.0),
        ("frequency_penalty", -3.0),
        ("top_logprobs", 21),
        ("top_k", -2),
    ],
)
def test_invalid_params_name_the_field(key, value) -> None:
    logits = np.zeros(8, np.float32)
    with pytest.raises(_core.Error, match=key):
        ops.sampling_probs(logits, {key: value})
    with pytest.raises(_core.Error, match=key):
        ops.sample_token(logits, {key: value}, None, None, 0)


def test_params_dict_errors() -> None:
    logits = np.zeros(8, np.float32)
    with pytest.raises(_core.Error, match="unknown key 'temprature'"):
        ops.sampling_probs(logits, {"temprature": 0.5})
    with pytest.raises(_core.Error, match="'top_k'"):
        ops.sampling_probs(logits, {"top_k": "5"})
    with pytest.raises(_core.Error, match="'seed'"):
        ops.sample_token(logits, {"seed": -1}, None, None, 0)
    with pytest.raises(_core.Error, match="prompt"):
        ops.sampling_probs(logits, {}, np.array([8], np.int32))
    with pytest.raises(_core.Error, match="logits"):
        ops.sampling_probs(np.array([0, np.nan], np.float32), {})
