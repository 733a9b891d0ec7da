"""Tests of the dsv41rt._core extension: dtype codecs against independent references, and
zero-copy safetensors checkpoints written by a tiny pure-Python writer."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import numpy as np
import pytest
from dsv41rt import _core

# ---- dtype codecs --------------------------------------------------------------------------


def e4m3_reference(code: int) -> float:
    """OCP e4m3fn from the definition: bias 7, subnormals m*2^-9, S.1111.111 is NaN."""
    s, e, m = code >> 7, (code >> 3) & 15, code & 7
    if e == 15 and m == 7:
        return math.nan
    mag = math.ldexp(m, -9) if e == 0 else math.ldexp(8 + m, e - 10)
    return -mag if s else mag


FP4_TABLE = [0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6]


def test_dtype_names():
    assert _core.dtype_names() == ["f32", "bf16", "f16", "fp8_e4m3", "e8m0", "fp4_e2m1"]


def test_e4m3_all_codes_against_formula():
    codes = np.arange(256, dtype=np.uint8)
    got = _core.decode(codes, "fp8_e4m3")
    assert got.dtype == np.float32 and got.shape == (256,)
    for c in range(256):
        ref = e4m3_reference(c)
        if math.isnan(ref):
            assert math.isnan(got[c]), c
        else:
            assert got[c] == ref, c
            assert math.copysign(1.0, got[c]) == math.copysign(1.0, ref), c
    finite = ~np.isnan(got)
    assert np.array_equal(_core.encode(got[finite], "fp8_e4m3"), codes[finite])
    sat = _core.encode(np.array([449, 464, 1e9, np.inf, -np.inf, -1e9], np.float32), "fp8_e4m3")
    assert sat.tolist() == [0x7E, 0x7E, 0x7E, 0x7E, 0xFE, 0xFE]


def test_f16_matches_numpy():
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 2**32, size=200_000, dtype=np.uint64).astype(np.uint32)
    values = bits.view(np.float32)
    values = values[~np.isnan(values)]
    values = np.concatenate([values, np.float32([65504, 65519, 65520, 2**-25, 3 * 2**-26, 0.0, -0.0])])
    ours = _core.encode(values, "f16")
    assert ours.dtype == np.uint16
    with np.errstate(over="ignore"):  # numpy warns on float16 overflow to inf; we check it too
        ref16 = values.astype(np.float16)
    assert np.array_equal(ours, ref16.view(np.uint16))
    all_codes = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    ref = all_codes.view(np.float16).astype(np.float32)
    got = _core.decode(all_codes, "f16")
    nan = np.isnan(ref)
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(got[~nan].view(np.uint32), ref[~nan].view(np.uint32))


def bf16_reference(values: np.ndarray) -> np.ndarray:
    """RNE float32 -> bf16 by bit manipulation (NaN handled separately)."""
    b = values.view(np.uint32).astype(np.uint64)
    rounded = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def test_bf16_matches_bit_reference():
    rng = np.random.default_rng(1)
    values = rng.integers(0, 2**32, size=200_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    values = values[~np.isnan(values)]
    ties = np.array([0x3F808000, 0x3F818000, 0x7F7FFFFF], np.uint32).view(np.float32)
    values = np.concatenate([values, ties])
    got = _core.encode(values, "bf16")
    assert np.array_equal(got, bf16_reference(values))
    assert got[-3:].tolist() == [0x3F80, 0x3F82, 0x7F80]
    assert np.isnan(_core.decode(_core.encode(np.float32([np.nan]), "bf16"), "bf16")[0])
    codes = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    dec = _core.decode(codes, "bf16")
    assert np.array_equal(dec.view(np.uint32), codes.astype(np.uint32) << 16)


def test_fp4_table_and_ties():
    got = _core.decode(np.arange(16, dtype=np.uint8).reshape(4, 4), "fp4_e2m1")
    assert got.shape == (4, 4)
    assert [float(x) for x in got.ravel()] == FP4_TABLE
    assert math.copysign(1.0, got.ravel()[8]) == -1.0
    ties = np.float32([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0, -0.75, -100])
    assert _core.encode(ties, "fp4_e2m1").tolist() == [0, 2, 2, 4, 4, 6, 6, 7, 10, 15]
    with pytest.raises(_core.Error, match="out of range 0..15"):
        _core.decode(np.uint8([3, 16]), "fp4_e2m1")


def test_e8m0_and_shapes():
    codes = np.uint8([[0, 1], [127, 254]])
    got = _core.decode(codes, "e8m0")
    assert got.shape == (2, 2)
    assert got.ravel().tolist() == [2.0**-127, 2.0**-126, 1.0, 2.0**127]
    assert math.isnan(_core.decode(np.uint8([255]), "e8m0")[0])
    assert _core.encode(np.float32([1.0, 3.0, 1.0 + 2**-23, 0.0]), "e8m0").tolist() == [127, 129, 128, 0]
    f = np.float32([1.5, -2.0])
    assert np.array_equal(_core.decode(_core.encode(f, "f32"), "f32"), f)


def test_codec_errors():
    with pytest.raises(_core.Error, match="expects a uint16"):
        _core.decode(np.uint8([1]), "bf16")
    with pytest.raises(_core.Error, match="unknown dtype name 'f8'"):
        _core.decode(np.uint8([1]), "f8")
    with pytest.raises(ValueError):  # _core.Error subclasses ValueError
        _core.encode(np.float32([1]), "i32")


# ---- checkpoints ---------------------------------------------------------------------------


def write_safetensors(path: Path, tensors: dict[str, tuple[str, np.ndarray]], metadata=None, truncate: int = 0) -> None:
    """Minimal independent writer: u64 LE header length, JSON header, concatenated data."""
    header: dict = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    blobs, offset = [], 0
    for name, (dtype, arr) in tensors.items():
        data = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    payload = struct.pack("<Q", len(h)) + h + b"".join(blobs)
    path.write_bytes(payload[: len(payload) - truncate] if truncate else payload)


def test_checkpoint_round_trip(tmp_path: Path):
    rng = np.random.default_rng(2)
    tensors = {
        "w": ("F32", rng.standard_normal((3, 4)).astype(np.float32)),
        "w_bf16": ("BF16", rng.integers(0, 2**16, (2, 5), dtype=np.uint16)),
        "w_fp8": ("F8_E4M3", rng.integers(0, 256, (4, 4), dtype=np.uint8)),
        "scale": ("F8_E8M0", rng.integers(0, 255, (2,), dtype=np.uint8)),
        "packed": ("I8", rng.integers(-128, 128, (2, 3), dtype=np.int8)),
        "idx": ("I64", np.arange(5, dtype=np.int64)),
        "pos": ("I32", np.arange(6, dtype=np.int32).reshape(2, 3)),
        "empty": ("U8", np.zeros((0, 7), dtype=np.uint8)),
    }
    path = tmp_path / "model.safetensors"
    write_safetensors(path, tensors, metadata={"format": "pt"})
    ck = _core.Checkpoint(str(tmp_path))
    assert ck.names() == sorted(tensors)
    assert len(ck) == len(tensors)
    assert "w" in ck and "nope" not in ck
    assert ck.files() == [str(path)]
    assert ck.metadata() == {"format": "pt"}
    expected_np = {
        "F32": np.float32,
        "BF16": np.uint16,
        "F8_E4M3": np.uint8,
        "F8_E8M0": np.uint8,
        "I8": np.int8,
        "I64": np.int64,
        "I32": np.int32,
        "U8": np.uint8,
    }
    for name, (dtype, arr) in tensors.items():
        view = ck.array(name)
        assert view.dtype == expected_np[dtype], name
        assert view.shape == arr.shape, name
        assert np.array_equal(view, arr), name
        info = ck.info(name)
        assert info == {"dtype": dtype, "shape": list(arr.shape), "file": str(path), "nbytes": arr.nbytes}
    assert ck.all_info()["w_fp8"] == ("F8_E4M3", [4, 4])
    view = ck.array("w")
    assert not view.flags.writeable
    del ck  # the view keeps the mapping alive
    assert np.array_equal(view, tensors["w"][1])
    decoded = _core.decode(_core.Checkpoint(str(path)).array("w_fp8"), "fp8_e4m3")
    assert decoded.shape == (4, 4)


def test_truncated_file_names_file_and_tensor(tmp_path: Path):
    path = tmp_path / "trunc.safetensors"
    write_safetensors(
        path, {"a": ("F32", np.ones(4, np.float32)), "layers.0.w": ("F32", np.ones(8, np.float32))}, truncate=5
    )
    with pytest.raises(_core.Error) as info:
        _core.Checkpoint(str(path))
    msg = str(info.value)
    assert "trunc.safetensors" in msg and "layers.0.w" in msg and "truncated" in msg


def test_missing_tensor_and_path(tmp_path: Path):
    write_safetensors(tmp_path / "x.safetensors", {"a": ("U8", np.ones(2, np.uint8))})
    ck = _core.Checkpoint(str(tmp_path / "x.safetensors"))
    with pytest.raises(_core.Error, match="'b'"):
        ck.array("b")
    with pytest.raises(_core.Error, match="does not exist"):
        _core.Checkpoint(str(tmp_path / "missing"))
