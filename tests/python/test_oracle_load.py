"""The independent V4.1 reference (NeMo Automodel 0.7.0) loads our generated checkpoint.

Checks names, shapes and release encodings against a second implementation: NeMo's adapter decodes
our FP8/FP4 + UE8M0 bytes, the strict load finds no missing or unexpected tensor, and the forward
produces finite, non-degenerate logits.
"""

from __future__ import annotations

import pytest
from conftest import require_oracle_packages

pytestmark = pytest.mark.oracle


def test_nemo_loads_generated_tiny_v41(tiny_v41_dir: str) -> None:
    require_oracle_packages()
    from oracle.nemo_v41 import build_model, logits

    model = build_model(tiny_v41_dir)
    for ids in ([0], [0, 671, 6102, 13462, 9, 9, 9, 31, 200, 4000, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20]):
        out = logits(model, ids)
        assert out.shape == (len(ids), 129280)
        assert bool(out.isfinite().all()), "non-finite logits"
        # Random well-conditioned weights give logit std around 3; a broken load (zeros, NaN scales,
        # swapped nibbles that blow up) would not.
        std = float(out.std())
        assert 0.5 < std < 30, f"logit std {std}"


def test_nemo_decodes_our_fp8_and_fp4_exactly(tiny_v41_dir: str) -> None:
    """torch (independent of our decoder) dequantises our FP8/FP4 bytes to exactly our values."""
    require_oracle_packages()
    import numpy as np
    import torch
    from dsv41rt.checkpoint import quantize as q
    from safetensors import safe_open

    with safe_open(f"{tiny_v41_dir}/model.safetensors", framework="pt") as f:
        fp8 = f.get_tensor("layers.3.attn.wq_b.weight")
        fp8_scale = f.get_tensor("layers.3.attn.wq_b.scale")
        fp4 = f.get_tensor("layers.4.ffn.experts.5.w2.weight")
        fp4_scale = f.get_tensor("layers.4.ffn.experts.5.w2.scale")
    # torch decodes FP8 E4M3 and E8M0 itself: an implementation independent of ours.
    grid = fp8_scale.float().repeat_interleave(32, 0).repeat_interleave(32, 1)
    ref8 = fp8.float() * grid[: fp8.shape[0], : fp8.shape[1]]
    ours8 = q.dequantize_fp8_blocks(fp8.view(torch.uint8).numpy(), fp8_scale.view(torch.uint8).numpy(), 32, 32)
    np.testing.assert_array_equal(ours8, ref8.numpy())
    table = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])
    b = fp4.view(torch.uint8).long()
    codes = torch.stack([b & 0xF, b >> 4], -1).flatten(1)
    ref4 = table[codes] * fp4_scale.float().repeat_interleave(32, 1)
    ours4 = q.dequantize_fp4_rows(fp4.numpy(), fp4_scale.view(torch.uint8).numpy())
    np.testing.assert_array_equal(ours4, ref4.numpy())
