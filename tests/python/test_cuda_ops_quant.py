"""CUDA quant kernels vs their CPU references (dsv41rt._core.ops): cache QDQ, packed cache rows,
release-weight dequantisation. Fresh random inputs (seed printed), poisoned device outputs.

Bound: BITWISE equality for every finite input (random rows with magnitudes over 2^-40..2^40, exact
zeros, negative zeros, rows below every amax floor, values on rounding midpoints and scale
boundaries, subnormals, values near the FP32 max). The kernels use the same scalar codecs
(core/dtype.h) and the same FP32 operations in the same order (true division, no FMA; the block
amax is a max, hence order-independent), so nothing may differ.
Non-finite inputs (inf/NaN in a block) and NaN codes: the same elements are NaN and all others are
bitwise equal (NaN payloads may differ). The kernel's x / s reproduces the x86 host's NaN results
(first NaN operand, else the negative "default NaN" for 0/0 and inf/inf) because the NaN's sign
reaches the E2M1 code (mxfp4: inf/inf -> -NaN -> -6 * inf); on a non-x86 CPU reference this test
may differ in those signs. Packed bytes of such blocks are compared through their unpacked values.
"""

from __future__ import annotations

import numpy as np
import pytest
from dsv41rt import _core

pytestmark = pytest.mark.cuda

# (op name, block size, packed row bytes per dim)
FORMATS = [
    ("fp8_window", 32, lambda d: d + d // 32),
    ("nvfp4", 16, lambda d: d // 2 + d // 16),
    ("mxfp4", 32, lambda d: d // 2 + d // 32),
]
IDS = [f[0] for f in FORMATS]
# (33000, 512) has more elements than one capped grid covers (65535 blocks x 256 threads), so the
# grid-stride loop runs more than once.
SHAPES = [(1, 32), (3, 64), (2, 5, 128), (17, 512), (4, 1024), (33000, 512)]


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def _assert_bitwise(ours: np.ndarray, ref: np.ndarray, msg: str) -> None:
    assert ours.shape == ref.shape and ours.dtype == ref.dtype, msg
    if ours.dtype == np.float32:
        diff = np.flatnonzero(_bits(ours) != _bits(ref))
    else:
        diff = np.flatnonzero(ours.reshape(-1) != ref.reshape(-1))
    assert diff.size == 0, (
        f"{msg}: {diff.size} mismatching elements, first at flat {diff[0]}: "
        f"ours {ours.reshape(-1)[diff[0]]!r} ref {ref.reshape(-1)[diff[0]]!r}"
    )


def _assert_nan_aware(ours: np.ndarray, ref: np.ndarray, msg: str) -> None:
    """Same NaN positions, all other elements bitwise equal."""
    assert ours.shape == ref.shape, msg
    nan_o, nan_r = np.isnan(ours), np.isnan(ref)
    bad = np.flatnonzero(nan_o != nan_r)
    assert bad.size == 0, f"{msg}: NaN mismatch at flat {bad[:5]}"
    _assert_bitwise(np.where(nan_o, 0, ours).astype(np.float32), np.where(nan_r, 0, ref).astype(np.float32), msg)


def _random_rows(g: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    x = g.standard_normal(shape).astype(np.float32)
    x *= np.exp2(g.integers(-40, 40, size=shape[:-1] + (1,))).astype(np.float32)
    x[g.random(shape) < 0.05] = 0.0
    x[g.random(shape) < 0.02] *= np.float32(-0.0)
    flat = x.reshape(-1, shape[-1])
    if flat.shape[0] > 1:
        flat[0] *= np.float32(1e-30)  # below every amax floor
        flat[-1, :16] = 0.0  # an all-zero block
    return x


def _edge_values(g: np.random.Generator, rows: int, dim: int) -> np.ndarray:
    """Blocks drawn from exact levels, midpoints (ties), scale boundaries, subnormals, huge values."""
    levels = np.array([0, 0.25, 0.5, 0.75, 1, 1.25, 1.5, 1.75, 2, 2.5, 3, 3.5, 4, 5, 6], np.float32)
    fp8_mids = np.array([448, 464, 440, 416, 1.0625, 0.0009765625, 0.001953125, 0.0029296875], np.float32)
    pool = np.concatenate([levels, fp8_mids, -levels, -fp8_mids])
    x = g.choice(pool, size=(rows, dim)).astype(np.float32)
    x *= np.exp2(g.integers(-130, 118, size=(rows, 1))).astype(np.float32)  # pow2: exact
    specials = np.array(
        [
            1e-45,
            -1e-45,
            1e-40,
            1.17549435e-38,
            1e-4,
            1e-4 * 448,
            448 * 2.0**-9,
            6 * 2.0**-9,
            6 * 2.0**-126,
            3.4e38,
            -3.4028235e38,
            1.5e38,
            0.0,
            -0.0,
        ],
        np.float32,
    )
    mask = g.random((rows, dim)) < 0.1
    x[mask] = g.choice(specials, size=int(mask.sum()))
    x[0] = 0.0
    if rows > 1:
        x[1] = -0.0
    return x


@pytest.mark.parametrize("name,block,row_bytes", FORMATS, ids=IDS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_qdq_pack_unpack_bitwise(rng, name, block, row_bytes, shape):
    g, seed = rng
    x = _random_rows(g, shape)
    cuda, cpu = _core.cuda_ops, _core.ops
    ref = getattr(cpu, f"{name}_qdq")(x)
    _assert_bitwise(getattr(cuda, f"{name}_qdq")(x), ref, f"{name}_qdq {shape} seed {seed}")
    packed_ref = getattr(cpu, f"{name}_pack")(x)
    packed = getattr(cuda, f"{name}_pack")(x)
    assert packed.shape == shape[:-1] + (row_bytes(shape[-1]),)
    _assert_bitwise(packed, packed_ref, f"{name}_pack {shape} seed {seed}")
    _assert_bitwise(getattr(cuda, f"{name}_unpack")(packed_ref), ref, f"{name}_unpack {shape} seed {seed}")


@pytest.mark.parametrize("name,block,row_bytes", FORMATS, ids=IDS)
@pytest.mark.parametrize("rows,dim", [(64, 32), (200, 128)])
def test_edge_values_bitwise(rng, name, block, row_bytes, rows, dim):
    g, seed = rng
    x = _edge_values(g, rows, dim)
    cuda, cpu = _core.cuda_ops, _core.ops
    ref = getattr(cpu, f"{name}_qdq")(x)
    _assert_bitwise(getattr(cuda, f"{name}_qdq")(x), ref, f"{name}_qdq edges seed {seed}")
    _assert_bitwise(getattr(cuda, f"{name}_pack")(x), getattr(cpu, f"{name}_pack")(x), f"{name}_pack edges seed {seed}")


@pytest.mark.parametrize("name,block,row_bytes", FORMATS, ids=IDS)
def test_non_finite_blocks(rng, name, block, row_bytes):
    g, seed = rng
    x = _random_rows(g, (32, 256))
    x[g.random(x.shape) < 0.01] = np.inf
    x[g.random(x.shape) < 0.01] = -np.inf
    x[g.random(x.shape) < 0.01] = np.nan
    cuda, cpu = _core.cuda_ops, _core.ops
    ref = getattr(cpu, f"{name}_qdq")(x)
    _assert_nan_aware(getattr(cuda, f"{name}_qdq")(x), ref, f"{name}_qdq non-finite seed {seed}")
    unpack = getattr(cpu, f"{name}_unpack")
    packed = getattr(cuda, f"{name}_pack")(x)
    _assert_nan_aware(unpack(packed), unpack(getattr(cpu, f"{name}_pack")(x)), f"{name}_pack non-finite seed {seed}")


@pytest.mark.parametrize("name,block,row_bytes", FORMATS, ids=IDS)
def test_unpack_random_bytes(rng, name, block, row_bytes):
    """Every code, including NaN element and scale codes."""
    g, seed = rng
    b = g.integers(0, 256, size=(37, row_bytes(256)), dtype=np.uint8)
    ref = getattr(_core.ops, f"{name}_unpack")(b)
    _assert_nan_aware(getattr(_core.cuda_ops, f"{name}_unpack")(b), ref, f"{name}_unpack bytes seed {seed}")


@pytest.mark.parametrize("rows,cols,br,bc", [(1, 1, 1, 1), (7, 5, 2, 3), (300, 200, 128, 128), (256, 384, 128, 128)])
def test_dequant_fp8_blocks(rng, rows, cols, br, bc):
    g, seed = rng
    codes = g.integers(0, 256, size=(rows, cols), dtype=np.uint8)
    scales = g.integers(0, 256, size=(-(-rows // br), -(-cols // bc)), dtype=np.uint8)
    flat = scales.reshape(-1)
    flat[0], flat[-1] = 0, 255  # 2^-127 and NaN
    ref = _core.ops.dequant_fp8_blocks(codes, scales, br, bc)
    got = _core.cuda_ops.dequant_fp8_blocks(codes, scales, br, bc)
    _assert_nan_aware(got, ref, f"dequant_fp8_blocks seed {seed}")
    # Realistic range (no NaN codes): bitwise.
    codes[(codes & 0x7F) == 0x7F] = 0x7E
    scales = g.integers(100, 140, size=scales.shape, dtype=np.uint8)
    ref = _core.ops.dequant_fp8_blocks(codes, scales, br, bc)
    _assert_bitwise(_core.cuda_ops.dequant_fp8_blocks(codes, scales, br, bc), ref, f"seed {seed}")


@pytest.mark.parametrize("rows,cols", [(1, 2), (5, 70), (64, 256), (3, 4096)])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_dequant_fp4_rows(rng, rows, cols, dtype):
    g, seed = rng
    packed = g.integers(0, 256, size=(rows, cols // 2), dtype=np.uint8).view(dtype)
    scales = g.integers(0, 256, size=(rows, -(-cols // 32)), dtype=np.uint8)
    ref = _core.ops.dequant_fp4_rows(packed, scales)
    _assert_nan_aware(_core.cuda_ops.dequant_fp4_rows(packed, scales), ref, f"dequant_fp4_rows seed {seed}")
    scales = g.integers(0, 255, size=scales.shape, dtype=np.uint8)  # no NaN scale: bitwise
    ref = _core.ops.dequant_fp4_rows(packed, scales)
    _assert_bitwise(_core.cuda_ops.dequant_fp4_rows(packed, scales), ref, f"seed {seed}")


def test_rejects_bad_shapes():
    cuda = _core.cuda_ops
    with pytest.raises(Exception, match="multiple"):
        cuda.fp8_window_qdq(np.zeros((2, 48), np.float32))
    with pytest.raises(Exception, match="multiple"):
        cuda.nvfp4_pack(np.zeros((2, 8), np.float32))
    with pytest.raises(Exception, match="packed row size"):
        cuda.mxfp4_unpack(np.zeros((2, 7), np.uint8))
    with pytest.raises(Exception, match="scales have shape"):
        cuda.dequant_fp8_blocks(np.zeros((4, 4), np.uint8), np.zeros((1, 2), np.uint8), 4, 4)
    with pytest.raises(Exception, match="scales have shape"):
        cuda.dequant_fp4_rows(np.zeros((4, 4), np.uint8), np.zeros((4, 2), np.uint8))
