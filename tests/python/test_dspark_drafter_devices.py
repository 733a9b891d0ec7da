"""The DSpark drafter (_core.DSparkDrafter, runtime/model/drafter.h) on the CUDA backend against the
CPU backend's (itself checked against NeMo in test_oracle_dspark_drafter.py), and the device
argument's errors.

Bound: max |cuda - cpu| <= 1e-4 over the logits and the confidence of every draft row, the
GPU-vs-CPU bound of test_cuda_executor.py (FP32 kernels on both sides: summation order only;
measured there <= 1.1e-5 on the backbone of tiny-v41). Both cache modes (the ring and block keys
FP8-QDQ'd or not), anchors below, at and past the window.
"""

from __future__ import annotations

import numpy as np
import pytest

ANCHORS = (0, 5, 8, 19)
CONTEXT = 24


def draft_all(drafter, cfg) -> list[tuple[np.ndarray, np.ndarray]]:
    d = cfg.dspark
    rng = np.random.default_rng(11)
    features = rng.standard_normal((CONTEXT, len(d.target_layer_ids) * cfg.hidden_size)).astype(np.float32)
    out = []
    for anchor in ANCHORS:
        ids = np.asarray([int(rng.integers(3, 129000))] + [d.noise_token_id] * (d.block_size - 1), np.int32)
        previous = rng.integers(3, 129000, d.block_size).astype(np.int32)
        out.append(drafter.draft(features, anchor, ids, previous))
    return out


@pytest.mark.cuda
@pytest.mark.parametrize("quant", [True, False], ids=["quant-on", "quant-off"])
def test_cuda_drafter_matches_cpu(tiny_v41_dir, quant: bool) -> None:
    from dsv41rt import _core
    from dsv41rt.checkpoint.reader import open_checkpoint

    cfg = open_checkpoint(tiny_v41_dir).config
    dtype = _core.KvCacheDtype.auto if quant else _core.KvCacheDtype.float32
    cpu = draft_all(_core.DSparkDrafter(tiny_v41_dir, dtype), cfg)
    gpu = draft_all(_core.DSparkDrafter(tiny_v41_dir, dtype, device="cuda"), cfg)
    for anchor, (want, got) in zip(ANCHORS, zip(cpu, gpu, strict=True), strict=True):
        assert np.isfinite(got[0]).all() and np.isfinite(got[1]).all()
        logits, conf = np.abs(got[0] - want[0]).max(), np.abs(got[1] - want[1]).max()
        print(f"anchor {anchor}: logits max |cuda - cpu| {logits:.3g}, confidence {conf:.3g}")
        assert logits <= 1e-4 and conf <= 1e-4, f"anchor {anchor}"


def test_drafter_device_errors(tiny_v41_dir) -> None:
    from dsv41rt import _core

    with pytest.raises(Exception, match="unknown device 'tpu'"):
        _core.DSparkDrafter(tiny_v41_dir, device="tpu")
    cpu = _core.DSparkDrafter(tiny_v41_dir, device="cpu")  # the default, named
    assert cpu is not None
