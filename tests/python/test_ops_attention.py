"""Attention-side CPU reference ops vs NeMo Automodel 0.7.0's V4.1 code (FP32, fresh random inputs).

Bounds: FP32 reductions in a different order than torch -> relative error <= 1e-5 on values;
discrete outputs (candidate masks, top-k sets) must match exactly.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import require_oracle_packages
from dsv41rt import _core

ops = _core.ops


def rel_err(a, b) -> float:
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / max(np.linalg.norm(b), 1e-30))


def test_sparse_attention_matches_nemo_eager_formula(rng) -> None:
    require_oracle_packages()
    import torch

    g, seed = rng
    S, H, D, T, K = 9, 4, 64, 30, 12
    q = g.standard_normal((S, H, D), dtype=np.float32)
    kv = g.standard_normal((T, D), dtype=np.float32)
    sink = g.standard_normal(H, dtype=np.float32)
    idx = np.stack([g.choice(T, K, replace=False) for _ in range(S)]).astype(np.int32)
    idx[g.random((S, K)) < 0.3] = -1
    idx[0] = -1  # a query with no key at all: only the sink
    out = ops.sparse_attention(q, kv, idx, sink, D**-0.5)
    # NeMo's eager path (attention.py): dense mask with a zero-valued sink column.
    allowed = np.zeros((S, T + 1), bool)
    for s in range(S):
        allowed[s, np.where(idx[s] >= 0, idx[s], T)] = True
    allowed = torch.from_numpy(allowed[:, :T])
    kvt = torch.cat((torch.from_numpy(kv), torch.zeros(1, D)))
    bias = torch.zeros(1, S, T).masked_fill(~allowed.unsqueeze(0), -torch.inf).expand(H, -1, -1)
    bias = torch.cat((bias, torch.from_numpy(sink).view(H, 1, 1).expand(-1, S, 1)), dim=-1)
    logits = torch.einsum("shd,td->hst", torch.from_numpy(q), kvt) * D**-0.5
    ref = torch.einsum("hst,td->shd", (logits + bias).softmax(-1), kvt).numpy()
    assert rel_err(out, ref) < 1e-5, seed
    assert np.all(out[0] == 0)


def test_compress_pool_matches_nemo(rng) -> None:
    require_oracle_packages()
    import torch

    g, seed = rng
    G, m, D = 7, 2, 64
    values = g.standard_normal((G * m, D), dtype=np.float32)
    scores = (g.standard_normal((G * m, D)) * 4).astype(np.float32)
    ours = ops.compress_pool(values, scores, m)
    v = torch.from_numpy(values).unflatten(0, (-1, m))
    s = torch.from_numpy(scores).unflatten(0, (-1, m))
    ref = (v * s.softmax(dim=1)).sum(dim=1).numpy()  # NeMo _Compressor.forward, ratio > 1
    assert rel_err(ours, ref) < 1e-6, seed
    with pytest.raises(_core.Error, match="not a whole number of groups"):
        ops.compress_pool(values[:3], scores[:3], 2)


def test_indexer_scores_and_selection_match_nemo(rng) -> None:
    require_oracle_packages()
    import torch
    from nemo_automodel.components.models.deepseek_v41.attention import _select_candidate_blocks

    g, seed = rng
    S, H, D, m = 37, 16, 32, 1
    T = S // m
    q = g.standard_normal((S, H, D), dtype=np.float32)
    keys = g.standard_normal((T, D), dtype=np.float32)
    w = g.standard_normal((S, H), dtype=np.float32) * (D**-0.5 * H**-0.5)
    w = w.astype(np.float32)
    n_vis = ((np.arange(S) + 1) // m).astype(np.int64)
    ours = ops.indexer_scores(q, keys, w, n_vis)
    ref = torch.einsum("shd,td->sht", torch.from_numpy(q), torch.from_numpy(keys))
    ref = (ref.relu() * torch.from_numpy(w).unsqueeze(-1)).sum(dim=1)
    allowed = torch.arange(T) < torch.from_numpy(n_vis).unsqueeze(-1)
    ref = ref.masked_fill(~allowed, -torch.inf)
    finite = np.isfinite(ref.numpy())
    assert np.array_equal(np.isfinite(ours), finite)
    assert rel_err(ours[finite], ref.numpy()[finite]) < 1e-5, seed

    # Candidate blocks: NeMo's own function on the same (our) scores, then AND visibility.
    mask = ops.candidate_blocks(ours, n_vis, 3, 4)
    vis = torch.from_numpy(n_vis).view(1, S, 1)
    ref_mask = _select_candidate_blocks(torch.from_numpy(ours)[None], vis, topk_blocks=3, block_size=4) & allowed
    assert np.array_equal(mask.astype(bool), ref_mask[0].numpy()), seed

    # Top-k selection with NeMo's rule (top min(k, width), sorted, non-finite -> -1), compared as sets.
    scores = ours.copy()
    scores[mask == 0] = -np.inf
    k = 8
    sel = ops.topk_select(scores, k)
    t = torch.from_numpy(scores)
    picked = t.topk(min(k, T), dim=-1, sorted=False).indices.sort(-1).values
    picked = torch.where(torch.isfinite(t.gather(-1, picked)), picked, -1).numpy()
    for s in range(S):
        assert set(sel[s][sel[s] >= 0]) == set(picked[s][picked[s] >= 0]), (seed, s)
        assert list(sel[s][sel[s] >= 0]) == sorted(sel[s][sel[s] >= 0])
        assert (sel[s] >= 0).sum() == min(k, int(np.isfinite(scores[s]).sum()))


def test_topk_pads_with_minus_one_and_prefers_lower_index_on_ties() -> None:
    scores = np.array([[1.0, 3.0, 3.0, -np.inf, 2.0], [-np.inf] * 5], np.float32)
    sel = ops.topk_select(scores, 3)
    assert sel.tolist() == [[1, 2, 4], [-1, -1, -1]]
    sel = ops.topk_select(scores[:1], 2)
    assert sel.tolist() == [[1, 2]]
    sel = ops.topk_select(scores[:1], 7)
    assert sel.tolist() == [[0, 1, 2, 4, -1, -1, -1]]
