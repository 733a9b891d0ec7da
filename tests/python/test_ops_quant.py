"""Quant ops (dsv41rt._core.ops) against NeMo Automodel's cache quantiser and torch weight decoding.

The cache QDQ must equal NeMo's `quantize_cache` bit for bit: the runtime reproduces the reference's
cache rounding exactly (spec 0.3, 5.3). Every random test draws a fresh seed and prints it on failure.
"""

from __future__ import annotations

import secrets

import numpy as np
import pytest
from conftest import require_oracle_packages
from dsv41rt._core import ops

# (op name, NeMo format, block size, packed row bytes per dim)
FORMATS = [
    ("fp8_window", "fp8", 32, lambda d: d + d // 32),
    ("nvfp4", "nvfp4", 16, lambda d: d // 2 + d // 16),
    ("mxfp4", "mxfp4", 32, lambda d: d // 2 + d // 32),
]
SHAPES = [(1, 32), (3, 64), (2, 5, 128), (17, 512), (4, 1024)]


def _seed() -> int:
    return secrets.randbits(63)


def _random_rows(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Normal values with a random magnitude per block row, a few exact zeros, tiny and huge rows."""
    x = rng.standard_normal(shape).astype(np.float32)
    mags = np.exp2(rng.integers(-40, 40, size=shape[:-1] + (1,))).astype(np.float32)
    x = x * mags
    x[rng.random(shape) < 0.05] = 0.0
    x[rng.random(shape) < 0.02] *= np.float32(-0.0)
    flat = x.reshape(-1, shape[-1])
    if flat.shape[0] > 1:
        flat[0] *= np.float32(1e-30)  # below every amax floor
        flat[-1, :16] = 0.0  # an all-zero block
    return x


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def _nemo_qdq(x: np.ndarray, fmt: str, block: int) -> np.ndarray:
    import torch
    from nemo_automodel.components.models.deepseek_v41.quantization import quantize_cache

    return quantize_cache(torch.from_numpy(x.copy()), format=fmt, block_size=block).numpy()


def _assert_bitwise(ours: np.ndarray, ref: np.ndarray, msg: str) -> None:
    assert ours.shape == ref.shape, msg
    diff = np.flatnonzero(_bits(ours) != _bits(ref))
    assert diff.size == 0, (
        f"{msg}: {diff.size} mismatching elements, first at flat {diff[0]}: "
        f"ours {ours.reshape(-1)[diff[0]]!r} ref {ref.reshape(-1)[diff[0]]!r}"
    )


@pytest.mark.parametrize("name,fmt,block,row_bytes", FORMATS, ids=[f[0] for f in FORMATS])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_qdq_matches_nemo_bitwise(name, fmt, block, row_bytes, shape):
    require_oracle_packages()
    seed = _seed()
    x = _random_rows(np.random.default_rng(seed), shape)
    ours = getattr(ops, f"{name}_qdq")(x)
    ref = _nemo_qdq(x, fmt, block)
    _assert_bitwise(ours, ref, f"{name} shape {shape} seed {seed}")
    # Packed storage reproduces the QDQ values exactly.
    packed = getattr(ops, f"{name}_pack")(x)
    assert packed.dtype == np.uint8 and packed.shape == shape[:-1] + (row_bytes(shape[-1]),)
    _assert_bitwise(getattr(ops, f"{name}_unpack")(packed), ours, f"{name} unpack seed {seed}")


@pytest.mark.parametrize("name,fmt,block,row_bytes", FORMATS, ids=[f[0] for f in FORMATS])
def test_qdq_edge_values_match_nemo(name, fmt, block, row_bytes):
    """Exact level/midpoint values, scale boundaries, saturation, signed zeros, subnormals."""
    require_oracle_packages()
    seed = _seed()
    rng = np.random.default_rng(seed)
    levels = np.array([0, 0.25, 0.5, 0.75, 1, 1.25, 1.5, 1.75, 2, 2.5, 3, 3.5, 4, 5, 6], np.float32)
    amaxes = np.array([448, 6, 6.375, 1, 3.5, 2784, 3000, 1e-4, 1e-6, 1e-40, 0], np.float32)
    rows = []
    for amax in amaxes:
        for _ in range(8):
            pick = rng.choice(levels, size=block) * rng.choice([-1, 1], size=block).astype(np.float32)
            row = (pick * np.float32(max(amax, 1e-30) / 6)).astype(np.float32)
            row[rng.integers(block)] = amax * rng.choice([-1, 1])
            rows.append(row)
    x = np.stack(rows).astype(np.float32)
    x = np.concatenate([x, np.nextafter(x, np.float32(np.inf)), np.nextafter(x, np.float32(-np.inf))])
    ours = getattr(ops, f"{name}_qdq")(x)
    _assert_bitwise(ours, _nemo_qdq(x, fmt, block), f"{name} edge values seed {seed}")
    _assert_bitwise(getattr(ops, f"{name}_unpack")(getattr(ops, f"{name}_pack")(x)), ours, f"{name} pack")


@pytest.mark.parametrize("name,fmt,block,row_bytes", FORMATS, ids=[f[0] for f in FORMATS])
def test_qdq_non_finite_matches_nemo(name, fmt, block, row_bytes):
    """inf/NaN follow NeMo's arithmetic (compared up to NaN payloads)."""
    require_oracle_packages()
    x = np.random.default_rng(_seed()).standard_normal((6, 2 * block)).astype(np.float32)
    x[0, 3] = np.inf
    x[1, 0] = -np.inf
    x[2, 5] = np.nan
    x[3, 1] = 0.0
    x[3, 2] = np.nan
    x[4, :block] = 0.0
    x[4, 7] = np.inf
    ours = getattr(ops, f"{name}_qdq")(x)
    ref = _nemo_qdq(x, fmt, block)
    nan = np.isnan(ref)
    np.testing.assert_array_equal(np.isnan(ours), nan)
    _assert_bitwise(ours[~nan], ref[~nan], f"{name} non-finite")


def test_packed_layout():
    x = np.zeros((1, 32), np.float32)
    x[0, :4] = [0.5, -1.0, 6.0, -0.0]
    b = ops.mxfp4_pack(x)
    assert b.shape == (1, 17)
    assert b[0, 0] == 0xA1  # channel 0 (0.5, code 1) low nibble, channel 1 (-1, code 10) high
    assert b[0, 1] == 0x87  # channel 2 (6, code 7) low, channel 3 (-0, code 8) high
    assert b[0, 16] == 127  # scale 2^0 after the 16 data bytes
    w = np.zeros((2, 512), np.float32)
    w[1, 0] = 448.0
    f8 = ops.fp8_window_pack(w)
    assert f8.shape == (2, 528) and f8[1, 0] == 0x7E and f8[1, 512] == 127
    nv = ops.nvfp4_pack(w)
    assert nv.shape == (2, 288) and nv[1, 256] == 105  # 448/6 = 74.67 -> E4M3 72 = 1.125 * 2^6 -> code (13 << 3) | 1
    assert ops.fp8_window_unpack(f8).shape == (2, 512)


def test_bad_dims_raise():
    with pytest.raises(Exception, match="multiple"):
        ops.fp8_window_qdq(np.zeros((2, 48), np.float32))
    with pytest.raises(Exception, match="multiple"):
        ops.nvfp4_pack(np.zeros((2, 24), np.float32))
    with pytest.raises(Exception, match="packed row size"):
        ops.mxfp4_unpack(np.zeros((2, 70), np.uint8))
    with pytest.raises(Exception, match="scales have shape"):
        ops.dequant_fp8_blocks(np.zeros((4, 4), np.uint8), np.zeros((2, 2), np.uint8), 32, 32)
    with pytest.raises(Exception, match="scales have shape"):
        ops.dequant_fp4_rows(np.zeros((4, 32), np.uint8), np.zeros((4, 1), np.uint8))


def _torch_fp8_blocks(codes: np.ndarray, scales: np.ndarray, br: int, bc: int) -> np.ndarray:
    import torch

    w = torch.from_numpy(codes).view(torch.float8_e4m3fn).float()
    s = torch.from_numpy(scales).view(torch.float8_e8m0fnu).float()
    s = s.repeat_interleave(br, 0).repeat_interleave(bc, 1)[: w.shape[0], : w.shape[1]]
    return (w * s).numpy()


@pytest.mark.parametrize("rows,cols,br,bc", [(64, 96, 32, 32), (70, 45, 32, 32), (300, 260, 128, 128), (5, 7, 2, 3)])
def test_dequant_fp8_blocks_matches_torch(rows, cols, br, bc):
    require_oracle_packages()
    seed = _seed()
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 256, size=(rows, cols), dtype=np.uint8)
    codes[codes & 0x7F == 0x7F] = 0x10  # no NaN codes (payloads differ)
    scales = rng.integers(0, 255, size=(-(-rows // br), -(-cols // bc)), dtype=np.uint8)
    ours = ops.dequant_fp8_blocks(codes, scales, br, bc)
    _assert_bitwise(ours, _torch_fp8_blocks(codes, scales, br, bc), f"fp8 blocks seed {seed}")


def test_dequant_fp8_blocks_matches_nemo_adapter():
    require_oracle_packages()
    import torch
    from nemo_automodel.components.models.deepseek_v41.state_dict_adapter import dequantize_checkpoint_weight

    seed = _seed()
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 256, size=(70, 100), dtype=np.uint8)
    codes[codes & 0x7F == 0x7F] = 0x21
    scales = rng.integers(100, 150, size=(3, 4), dtype=np.uint8)
    ref = dequantize_checkpoint_weight(
        torch.from_numpy(codes).view(torch.float8_e4m3fn),
        torch.from_numpy(scales).view(torch.float8_e8m0fnu),
        dtype=torch.float32,
    ).numpy()
    _assert_bitwise(ops.dequant_fp8_blocks(codes, scales, 32, 32), ref, f"seed {seed}")


@pytest.mark.parametrize("rows,cols", [(8, 64), (33, 256), (3, 40)])
def test_dequant_fp4_rows_matches_nemo_and_torch(rows, cols):
    require_oracle_packages()
    import torch
    from nemo_automodel.components.models.deepseek_v41.state_dict_adapter import dequantize_checkpoint_weight

    seed = _seed()
    rng = np.random.default_rng(seed)
    packed = rng.integers(-128, 128, size=(rows, cols // 2), dtype=np.int8)
    scales = rng.integers(0, 255, size=(rows, -(-cols // 32)), dtype=np.uint8)
    ours = ops.dequant_fp4_rows(packed, scales)
    _assert_bitwise(ops.dequant_fp4_rows(packed.view(np.uint8), scales), ours, "uint8 input")
    ref = dequantize_checkpoint_weight(
        torch.from_numpy(packed), torch.from_numpy(scales).view(torch.float8_e8m0fnu), dtype=torch.float32
    ).numpy()
    _assert_bitwise(ours, ref, f"fp4 rows vs NeMo seed {seed}")
    # Independent torch decode: E2M1 code table (code 8 decodes to +0 as in NeMo) times E8M0.
    table = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, 0, -0.5, -1, -1.5, -2, -3, -4, -6])
    raw = torch.from_numpy(packed.view(np.uint8)).long()
    codes = torch.stack([raw & 15, raw >> 4], dim=-1).reshape(rows, cols)
    s = torch.from_numpy(scales).view(torch.float8_e8m0fnu).float().repeat_interleave(32, 1)[:, :cols]
    _assert_bitwise(ours, (table[codes] * s).numpy(), f"fp4 rows vs torch seed {seed}")
