"""Throughput of the tensor-core GEMM (kernels/cuda/gemm_tc.cu) at the bench-40 projection shapes,
next to the bf16 dense ceiling (790 TFLOP/s on the H200). Median of CUDA-event times over random
device-resident inputs.

  python bench/gemm_tc_bench.py [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import sys

CEILING = 790e12
# (name, N, K) of bench-40's projections (hidden 5120, q_lora 1280, 64 x 512 heads, o_lora 1024
# in 8 groups, experts 2304 wide).
SHAPES = [
    ("wq_a", 1280, 5120),
    ("wq_b", 32768, 1280),
    ("wkv", 512, 5120),
    ("wo_a group", 1024, 4096),
    ("wo_b", 5120, 8192),
    ("expert w1/w3", 2304, 5120),
    ("expert w2", 5120, 2304),
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", default="64,1024,8192")
    ap.add_argument("--out")
    args = ap.parse_args()
    from dsv41rt import _core

    rows = []
    for m in (int(x) for x in args.rows.split(",")):
        for name, n, k in SHAPES:
            ms = _core.cuda_ops.gemm_bf16_tc_time_ms(m, n, k, 10)
            tflops = 2 * m * n * k / (ms * 1e-3) / 1e12
            rows.append({"M": m, "N": n, "K": k, "name": name, "median_ms": ms, "tflops": tflops})
            pct = 100 * tflops * 1e12 / CEILING
            print(f"M {m:5d} {name:13s} N {n:6d} K {k:5d}: {ms:8.3f} ms {tflops:7.1f} TFLOP/s ({pct:4.1f}% of 790)")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
