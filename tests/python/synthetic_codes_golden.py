"""Prints the hashes of tests/cpp/synthetic_codes_cases.h: numpy's direct-code bytes, drawn as
make-checkpoint draws them (checkpoint/generator.py _direct_codes, _row_chunks). Run it with the
project venv and paste its output when a case is added.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator

import numpy as np
from dsv41rt.checkpoint.generator import CHUNK_ELEMENTS


def phash(b: bytes) -> int:
    """sum of byte_i * P^(i+1) mod 2^64, P the FNV prime (synthetic_codes_cases.h synth_hash)."""
    a = np.frombuffer(b, np.uint8).astype(np.uint64)
    with np.errstate(over="ignore"):
        p = np.cumprod(np.full(len(a), 0x100000001B3, np.uint64))
        return int(np.sum(a * p, dtype=np.uint64))


def chunk_codes(kind: str, seed: int, crc: int, chunk: int, n: int) -> np.ndarray:
    rng = np.random.default_rng([seed, crc, chunk])
    if kind == "fp8":
        bits = rng.integers(0, 256, n, dtype=np.uint8)
        exp_field = rng.integers(5, 9, n, dtype=np.uint8)
        return (bits & 0x87) | (exp_field << 3)
    return rng.integers(0, 16, n, dtype=np.uint8)


def stored(kind: str, codes: np.ndarray) -> bytes:
    codes = codes.reshape(-1)
    return (codes if kind == "fp8" else (codes[0::2] & 0xF) | (codes[1::2] << 4)).tobytes()


def row_chunks(rows: int, cols: int, align: int) -> Iterator[tuple[int, int]]:
    step = max(align, (CHUNK_ELEMENTS // max(cols, 1)) // align * align)
    for start in range(0, rows, step):
        yield start, min(rows, start + step)


CHUNK_CASES = [
    ("fp8", 0, "a.weight", 0, 13, 0, 13),
    ("fp8", 7, "layers.1.attn.wq_b.weight", 2, 1027, 5, 1023),
    ("fp8", 2**32 + 3, "x", 1, 4096, 1000, 4096),
    ("fp4", 0, "layers.0.ffn.experts.3.w1.weight", 0, 1026, 0, 1026),
    ("fp4", 5, "y", 4, 998, 6, 994),
]
TENSOR_CASES = [
    ("fp4", 3, "layers.2.ffn.experts.7.w2.weight", 4100, 8192, 1, 1000, 4100),
    ("fp8", 9, "layers.0.attn.wq_b.weight", 2560, 7168, 128, 0, 2560),
    ("fp8", 9, "layers.0.attn.wq_b.weight", 2560, 7168, 128, 2304, 2432),
]


def enum(kind: str) -> str:
    return f"SynthCodes::k{kind.capitalize()}"


def main() -> None:
    for kind, seed, name, c, n, b, e in CHUNK_CASES:
        codes = chunk_codes(kind, seed, zlib.crc32(name.encode()), c, n)[b:e]
        print(f'{{{enum(kind)}, {seed}ULL, "{name}", {c}, {n}, {b}, {e}, 0x{phash(stored(kind, codes)):016x}ULL}},')
    for kind, seed, name, rows, cols, align, rb, re in TENSOR_CASES:
        crc = zlib.crc32(name.encode())
        parts = [
            chunk_codes(kind, seed, crc, c, (e - s) * cols).reshape(e - s, cols)
            for c, (s, e) in enumerate(row_chunks(rows, cols, align))
        ]
        codes = np.concatenate(parts)[rb:re]
        dims = f"{rows}, {cols}, {align}, {rb}, {re}"
        print(f'{{{enum(kind)}, {seed}ULL, "{name}", {dims}, 0x{phash(stored(kind, codes)):016x}ULL}},')


if __name__ == "__main__":
    main()
