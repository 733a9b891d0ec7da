"""CUDA norm-family kernels vs their CPU references (fresh random inputs, poisoned outputs).

Bounds (FP32): the GPU reduces sums of squares in a different order than the CPU reference
(which accumulates in double), so values agree to a few ulp: relative error <= 1e-5 per row.
"""

from __future__ import annotations

import numpy as np
import pytest
from dsv41rt import _core
from numerics import rel

pytestmark = pytest.mark.cuda


@pytest.mark.parametrize("rows,dim", [(1, 64), (7, 512), (33, 5120), (3, 100)])
def test_rms_norm(rng, rows: int, dim: int) -> None:
    g, seed = rng
    x = (g.standard_normal((rows, dim)) * g.uniform(0.1, 10)).astype(np.float32)
    w = g.standard_normal(dim).astype(np.float32)
    for weight, eps in ((w, 1e-20), (None, 1e-6)):
        got = _core.cuda_ops.rms_norm(x, weight, eps)
        ref = _core.ops.rms_norm(x, weight if weight is not None else np.ones(dim, np.float32), eps)
        assert np.isfinite(got).all(), seed
        assert rel(got, ref) <= 1e-5, (seed, rel(got, ref))
