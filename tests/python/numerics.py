"""Error measures shared by the op tests (CUDA kernels against their CPU references)."""

from __future__ import annotations

import numpy as np


def rel(a, b) -> float:
    """max |a - b| / max |b| in float64 (0 for empty arrays): the relative-error bound the op
    tests state per dtype."""
    b = np.asarray(b, np.float64)
    if b.size == 0:
        return 0.0
    return float(np.abs(np.asarray(a, np.float64) - b).max() / max(np.abs(b).max(), 1e-30))
