"""DeepSeek-V4's quantised caches (spec §2.6.4, §2.7.1, §5.4) emulated inside transformers 5.23's
`DeepseekV4ForCausalLM`, in torch written from the spec (nothing of dsv41rt is used).

transformers stores no quantised cache; the official reference QDQs every cached vector right
after RoPE. Within `quantised_caches(model)`:

* the attention's window KV and every CSA / HCA compressor entry become their 584-byte row's values:
  channels 0..447 FP8 E4M3 with one power-of-two scale per 64 channels
  (`2^ceil(log2(max(amax, 1e-4) * f32(1/448)))`, values clamped to ±448, round to nearest even),
  channels 448..511 rounded to BF16 (nearest even);
* the CSA indexer's keys (its compressor's entries) and queries are Walsh-Hadamard rotated
  (Sylvester order, scale dim^-0.5, computed in float64) and then MXFP4 QDQ'd (blocks of 32,
  scale `2^ceil(log2(max(amax, 6·2^-126) * f32(1/6)))`, E2M1 levels, ties to the even code).

How: the module-level `apply_rotary_pos_emb` is wrapped; a forward hook on the `kv_norm` of an
attention or compressor (or the indexer's `q_b_proj`) marks the next RoPE call as that vector's,
and the wrapper QDQs its output. In each of those forwards the marked vector's RoPE is the next
call after that module (the query's RoPE comes before `kv_norm` in the attention, the output's
inverse RoPE after the KV's).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

_E2M1_LEVELS = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def _pow2_ceil(v: Any) -> Any:
    """Smallest power of two >= v (v > 0, float32), exactly (frexp, not log2)."""
    import torch

    m, e = torch.frexp(v)  # v = m * 2^e, m in [0.5, 1)
    e = torch.where(m == 0.5, e - 1, e)
    return torch.ldexp(torch.ones_like(v), e)


def v4_row_qdq(x: Any) -> Any:
    """[..., 512] -> the values of V4's 584-byte row (FP8 nope in blocks of 64, BF16 rope tail)."""
    import torch

    assert x.shape[-1] == 512, x.shape
    x = x.float()
    nope = x[..., :448].reshape(*x.shape[:-1], 7, 64)
    amax = nope.abs().amax(-1, keepdim=True)
    s = _pow2_ceil(amax.clamp(min=1e-4) * torch.tensor(1.0 / 448.0, dtype=torch.float32))
    q = (nope / s).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).float() * s
    tail = x[..., 448:].to(torch.bfloat16).float()
    return torch.cat([q.reshape(*x.shape[:-1], 448), tail], dim=-1)


def mxfp4_qdq(x: Any) -> Any:
    """[..., D] (D a multiple of 32) -> E2M1 values with one power-of-two scale per 32."""
    import torch

    x = x.float()
    blocks = x.reshape(*x.shape[:-1], -1, 32)
    amax = blocks.abs().amax(-1, keepdim=True)
    floor = torch.tensor(6.0 * 2.0**-126, dtype=torch.float32)
    s = _pow2_ceil(torch.maximum(amax, floor) * torch.tensor(1.0 / 6.0, dtype=torch.float32))
    v = (blocks / s).clamp(-6.0, 6.0)
    levels = torch.tensor(_E2M1_LEVELS, dtype=torch.float32)
    d = (v.abs().unsqueeze(-1) - levels).abs()
    tied = d == d.amin(-1, keepdim=True)
    code = torch.arange(len(_E2M1_LEVELS))
    # Among the nearest levels take the even code (a tie has one even and one odd neighbour).
    pick = torch.where(tied, code % 2, 2).argmin(-1)
    q = torch.copysign(levels[pick], v) * s
    return q.reshape(x.shape)


def hadamard(x: Any) -> Any:
    """x · H_D · D^-0.5 over the last dim (Sylvester H, D a power of two), in float64."""
    import torch

    dim = x.shape[-1]
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < dim:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    assert h.shape[0] == dim, dim
    return (x.double() @ h * dim**-0.5).float()


def _index_qdq(x: Any) -> Any:
    return mxfp4_qdq(hadamard(x))


@contextlib.contextmanager
def quantised_caches(model: Any) -> Iterator[None]:
    """Within: `model` (DeepseekV4ForCausalLM) runs with V4's quantised caches emulated."""
    from transformers.models.deepseek_v4 import modeling_deepseek_v4 as mod

    pending: list[Any] = []
    original = mod.apply_rotary_pos_emb

    def rope(x: Any, cos: Any, sin: Any, unsqueeze_dim: int = 1) -> Any:
        y = original(x, cos, sin, unsqueeze_dim)
        return pending.pop()(y) if pending else y

    def mark(fn: Any) -> Any:
        def hook(module: Any, args: Any, out: Any) -> None:
            assert not pending, "a marked RoPE call did not happen"
            pending.append(fn)

        return hook

    hooks = []
    for layer in model.model.layers:
        attn = layer.self_attn
        hooks.append(attn.kv_norm.register_forward_hook(mark(v4_row_qdq)))
        compressor = attn.compressor
        if compressor is not None:
            hooks.append(compressor.kv_norm.register_forward_hook(mark(v4_row_qdq)))
            indexer = getattr(compressor, "indexer", None)
            if indexer is not None:
                hooks.append(indexer.kv_norm.register_forward_hook(mark(_index_qdq)))
                hooks.append(indexer.q_b_proj.register_forward_hook(mark(_index_qdq)))
    mod.apply_rotary_pos_emb = rope
    try:
        yield
        assert not pending, "a marked RoPE call did not happen"
    finally:
        mod.apply_rotary_pos_emb = original
        for h in hooks:
            h.remove()
