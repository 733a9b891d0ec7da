"""The numpy-free direct-code stream (checkpoint/direct_stream.py) equals numpy's bytes.

This is the specification the C++ reference and the CUDA kernel of synthetic weights follow, so it
is checked on odd sizes (a call's leftover bytes are dropped), odd uint32 counts (the second
`integers` call starts on the high half of a 64-bit output) and multi-word seeds.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from dsv41rt.checkpoint import direct_stream as ds

SIZES = (1, 2, 3, 5, 6, 7, 8, 13, 64, 250, 1026)
SEEDS = (0, 1, 7, 2**32 + 5)
NAMES = ("layers.0.ffn.experts.3.w1.weight", "head.weight")


def _numpy_fp8(seed: int, crc: int, chunk: int, n: int) -> bytes:
    rng = np.random.default_rng([seed, crc, chunk])
    bits = rng.integers(0, 256, n, dtype=np.uint8)
    exp_field = rng.integers(5, 9, n, dtype=np.uint8)
    return ((bits & 0x87) | (exp_field << 3)).tobytes()


def _numpy_fp4(seed: int, crc: int, chunk: int, n: int) -> bytes:
    codes = np.random.default_rng([seed, crc, chunk]).integers(0, 16, n, dtype=np.uint8)
    return ((codes[0::2] & 0xF) | (codes[1::2] << 4)).tobytes()


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("chunk", (0, 3))
def test_codes_equal_numpy(seed: int, name: str, chunk: int) -> None:
    crc = zlib.crc32(name.encode())
    for n in SIZES:
        assert ds.fp8_codes(seed, crc, chunk, n) == _numpy_fp8(seed, crc, chunk, n), n
        if n % 2 == 0:
            assert ds.fp4_packed(seed, crc, chunk, n) == _numpy_fp4(seed, crc, chunk, n), n


def test_state_equals_numpy() -> None:
    entropy = [3, zlib.crc32(b"w"), 2]
    state, inc = ds.pcg64_init(entropy)
    bg = np.random.PCG64(np.random.SeedSequence(entropy))
    numpy_state = bg.state["state"]
    assert inc == numpy_state["inc"]
    # numpy's state is before its first output: ours too.
    assert state == numpy_state["state"]
    assert ds.pcg64_output(ds.pcg64_advance(state, inc, 5)) == [bg.random_raw() for _ in range(5)][-1]


def test_bad_input() -> None:
    with pytest.raises(ValueError, match="non-negative"):
        ds.pcg64_init([-1, 0, 0])
    with pytest.raises(ValueError, match="pairs"):
        ds.fp4_packed(0, 0, 0, 3)


def test_make_checkpoint_writes_these_bytes(tmp_path) -> None:
    """A tiny checkpoint with a small --direct-codes-min-numel holds exactly these codes."""
    from dsv41rt.checkpoint.generator import make_checkpoint
    from dsv41rt.checkpoint.reader import open_checkpoint
    from dsv41rt.checkpoint.synthetic import manifest_entries
    from dsv41rt.config.presets import preset_config_json

    out = str(tmp_path / "ck")
    make_checkpoint(preset_config_json("tiny-v4"), out, 5, tokenizer=False, direct_codes_min_numel=1024)
    opened = open_checkpoint(out)
    entries = manifest_entries(opened.plan, 5, 1024)
    for storage in ("fp8", "fp4"):
        e = next(e for e in entries if e["storage"] == storage)
        n = e["rows"] * e["cols"]  # one chunk at tiny widths
        sample = ds.fp8_codes if storage == "fp8" else ds.fp4_packed
        want = sample(5, zlib.crc32(e["name"].encode()), 0, n)
        assert opened.tensors.array(e["name"]).tobytes() == want, e["name"]
        assert set(opened.tensors.array(e["scale"]).reshape(-1).tolist()) == {e["scale_exponent"] + 127}
