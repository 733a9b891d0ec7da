"""How far each activation format puts a V4.1 projection from its FP32 result: the official inference
numerics (spec §5.2: activations quantised to FP8 E4M3 in 1x32 blocks with power-of-two scales, "A8")
against the runtime's precision "bf16" (activations rounded to BF16, "A16"), both with the same exact
FP8 / MXFP4 weights and float64 sums, so only the activation format differs.

  python bench/a8_vs_a16_error.py --checkpoint DIR [--rows 64] [--seed 0]

Activations: the hidden states the checkpoint's own tiny forward produces are not exposed per GEMM,
so each projection gets two synthetic inputs: Gaussian rows, and heavy-tailed rows (Student t, 3
degrees of freedom: outliers as real hidden states have them). Weights: the checkpoint's stored
FP8 (32x32 blocks) and MXFP4 tensors, decoded exactly. Metric per projection: ||y - y_fp32|| /
||y_fp32|| over all rows (Frobenius).
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import sys

import numpy as np


def stored(checkpoint: str) -> dict[str, tuple[str, int, list[int], str]]:
    """name -> (file, offset, shape, dtype) of every tensor in the checkpoint's safetensors files."""
    out = {}
    for name in sorted(os.listdir(checkpoint)):
        if not name.endswith(".safetensors"):
            continue
        path = os.path.join(checkpoint, name)
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        for t, info in header.items():
            if t != "__metadata__":
                out[t] = (path, 8 + n + info["data_offsets"][0], info["shape"], info["dtype"])
    return out


def read(entry: tuple[str, int, list[int], str], dtype) -> np.ndarray:
    path, offset, shape, _ = entry
    return np.fromfile(path, dtype=dtype, count=int(np.prod(shape)), offset=offset).reshape(shape)


def weight(tensors: dict, name: str) -> np.ndarray:
    from dsv41rt._core import ops

    codes, scale = tensors[name + ".weight"], tensors[name + ".scale"]
    if codes[3] == "F8_E4M3":
        c = read(codes, np.uint8)
        s = read(scale, np.uint8)
        rb = -(-c.shape[0] // s.shape[0])
        cb = -(-c.shape[1] // s.shape[1])
        return np.asarray(ops.dequant_fp8_blocks(c, s, rb, cb), np.float64)
    c = read(codes, np.int8)
    s = read(scale, np.uint8)
    return np.asarray(ops.dequant_fp4_rows(c, s), np.float64)


def bf16(x: np.ndarray) -> np.ndarray:
    b = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) >> 16  # round to nearest even (finite inputs)
    return (b.astype(np.uint32) << 16).view(np.float32)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    from dsv41rt._core import ops

    tensors = stored(args.checkpoint)
    names = [
        "layers.2.attn.wq_a",
        "layers.2.attn.wq_b",
        "layers.2.attn.wo_b",
        "layers.2.ffn.shared_experts.w1",
        "layers.2.ffn.experts.0.w1",
        "layers.2.ffn.experts.0.w2",
    ]
    rng = np.random.default_rng(args.seed)
    print(f"# activation format error per projection, {args.checkpoint}, {args.rows} rows, seed {args.seed}")
    print("| projection | weights | inputs | A16 (BF16) rel. error | A8 (FP8 1x32) rel. error | A8 / A16 |")
    print("|---|---|---|---|---|---|")
    for name in names:
        if name + ".weight" not in tensors:
            continue
        w = weight(tensors, name)
        fmt = "FP8 32x32" if tensors[name + ".weight"][3] == "F8_E4M3" else "MXFP4"
        k = w.shape[1]
        for kind, x in (
            ("gaussian", rng.standard_normal((args.rows, k))),
            ("student-t 3", rng.standard_t(3, (args.rows, k))),
        ):
            x = np.asarray(x, np.float32)
            ref = x.astype(np.float64) @ w.T
            a16 = bf16(x).astype(np.float64) @ w.T
            a8 = np.asarray(ops.fp8_window_qdq(x), np.float64) @ w.T
            e16 = np.linalg.norm(a16 - ref) / np.linalg.norm(ref)
            e8 = np.linalg.norm(a8 - ref) / np.linalg.norm(ref)
            print(f"| {name} | {fmt} | {kind} | {e16:.2e} | {e8:.2e} | {e8 / e16:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
