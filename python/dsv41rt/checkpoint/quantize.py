"""Weight quantisers of the released formats (architecture spec §5.1), on numpy arrays.

Element encodings (RNE, saturation, nibble packing) come from the C++ core (`dsv41rt._core`), the
same code the runtime decodes with; this module only computes block scales and lays out bytes.
Scales are powers of two: 2^ceil(log2(amax / max_code)) as UE8M0, computed exactly with frexp.
"""

from __future__ import annotations

import numpy as np

from .. import _core

FP8_MAX = 448.0
FP4_MAX = 6.0
_TINY = 2.0**-126


def pow2_ceil_exponent(x: np.ndarray) -> np.ndarray:
    """Smallest integer e with 2**e >= x, for x > 0 (exact: no log2 rounding)."""
    mantissa, exponent = np.frexp(x)  # x = m * 2**e with m in [0.5, 1)
    return np.where(mantissa == 0.5, exponent - 1, exponent).astype(np.int32)


def e8m0_codes(exponent: np.ndarray) -> np.ndarray:
    return (np.clip(exponent, -127, 127) + 127).astype(np.uint8)


def to_bf16(values: np.ndarray) -> np.ndarray:
    """float32 -> bf16 codes (uint16), round to nearest even."""
    return _core.encode(np.ascontiguousarray(values, dtype=np.float32), "bf16")


def quantize_fp8_blocks(w: np.ndarray, block_rows: int, block_cols: int) -> tuple[np.ndarray, np.ndarray]:
    """FP8 E4M3 codes [r, c] (uint8) and UE8M0 scale codes [ceil(r/br), ceil(c/bc)] (uint8)."""
    r, c = w.shape
    pr, pc = -r % block_rows, -c % block_cols
    tiles = np.pad(w.astype(np.float32), ((0, pr), (0, pc)))
    tiles = tiles.reshape((r + pr) // block_rows, block_rows, (c + pc) // block_cols, block_cols)
    amax = np.abs(tiles).max(axis=(1, 3))
    exponent = pow2_ceil_exponent(np.maximum(amax / FP8_MAX, _TINY))
    scale = np.ldexp(np.float32(1.0), exponent).astype(np.float32)[:, None, :, None]
    codes = _core.encode(np.ascontiguousarray(tiles / scale, dtype=np.float32), "fp8_e4m3")
    codes = codes.reshape(r + pr, c + pc)[:r, :c]
    return np.ascontiguousarray(codes), e8m0_codes(exponent)


def quantize_fp4_rows(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Packed E2M1 [r, c/2] (int8, even column in the low nibble) and UE8M0 scales [r, c/32]."""
    r, c = w.shape
    if c % 32:
        raise ValueError(f"FP4 quantisation needs a column count divisible by 32, got {c}")
    groups = w.astype(np.float32).reshape(r, c // 32, 32)
    exponent = pow2_ceil_exponent(np.maximum(np.abs(groups).max(axis=-1) / FP4_MAX, _TINY))
    scale = np.ldexp(np.float32(1.0), exponent).astype(np.float32)[..., None]
    codes = _core.encode(np.ascontiguousarray(groups / scale, dtype=np.float32), "fp4_e2m1").reshape(r, c)
    packed = (codes[:, 0::2] & 0xF) | ((codes[:, 1::2] & 0xF) << 4)
    return packed.astype(np.uint8).view(np.int8), e8m0_codes(exponent)


def dequantize_fp8_blocks(codes: np.ndarray, scales: np.ndarray, block_rows: int, block_cols: int) -> np.ndarray:
    values = _core.decode(np.ascontiguousarray(codes), "fp8_e4m3")
    s = _core.decode(np.ascontiguousarray(scales), "e8m0")
    s = np.repeat(np.repeat(s, block_rows, axis=0), block_cols, axis=1)[: codes.shape[0], : codes.shape[1]]
    return values * s


def dequantize_fp4_rows(packed: np.ndarray, scales: np.ndarray) -> np.ndarray:
    b = packed.view(np.uint8)
    codes = np.empty((b.shape[0], b.shape[1] * 2), dtype=np.uint8)
    codes[:, 0::2], codes[:, 1::2] = b & 0xF, b >> 4
    values = _core.decode(codes, "fp4_e2m1")
    return values * np.repeat(_core.decode(np.ascontiguousarray(scales), "e8m0"), 32, axis=1)
