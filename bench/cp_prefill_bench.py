"""Prefill time with context parallelism over NCCL (one GPU per rank) vs CP = 1, with the
all-gather's device time and its overlap with the Q projection (rank 0's CUDA events, summed over
the forwards of the prompt). Issue 9 part 2.

  NCCL_NVLS_ENABLE=0 python bench/cp_prefill_bench.py --checkpoint /tmp/bench-40 --cp-size 2
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np


def prefill(rt, n: int, budget: int, rng) -> dict:
    p = np.asarray([0] + [int(t) for t in rng.integers(3, 129000, n - 1)], np.int32)
    h = rt.new_handle()
    tot = {"ms": 0.0, "gather_us": 0, "q_us": 0, "overlap_us": 0}
    for i in range(0, n, budget):
        t0 = time.perf_counter()
        rt.forward_tokens(h, p[i : i + budget], all_logits=False)
        wall_ms = (time.perf_counter() - t0) * 1e3
        s = rt.backend_stats()
        # CUDA executors time each forward with device events; the CPU smoke run has wall time only.
        tot["ms"] += s["last_forward_us"] / 1e3 if "last_forward_us" in s else wall_ms
        tot["gather_us"] += s.get("cp_all_gather_us", 0)
        tot["q_us"] += s.get("cp_q_projection_us", 0)
        tot["overlap_us"] += s.get("cp_overlap_us", 0)
    rt.release_handle(h)
    return tot


def metadata(args) -> dict:
    try:
        smi = ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"]
        gpus = subprocess.run(smi, capture_output=True, text=True).stdout.split("\n")
    except FileNotFoundError:
        gpus = ["cpu (no nvidia-smi)"]
    return {
        "device": [g for g in gpus if g],
        "commit": os.environ.get("DSV41RT_COMMIT", "?"),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "mode": "one process per GPU" if args.processes else "one thread per GPU",
        "precision": "fp32" if args.cpu else "bf16",
        "checkpoint": args.checkpoint,
        "nccl_nvls_enable": os.environ.get("NCCL_NVLS_ENABLE"),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--cp-size", type=int, default=2)
    ap.add_argument("--tokens", default="8192,32768")
    ap.add_argument("--cp1-tokens", default="8192")
    ap.add_argument("--budget", type=int, default=8192)
    ap.add_argument("--warmup", type=int, default=1024, help="tokens of the warm-up prefill")
    ap.add_argument("--repeats", type=int, default=3, help="prefills per length; the median is reported")
    ap.add_argument("--processes", action="store_true", help="one process per GPU (dsv41rt.cp_launch)")
    ap.add_argument("--cpu", action="store_true", help="smoke run on the CPU (TCP between rank processes)")
    ap.add_argument("--out")
    args = ap.parse_args()
    from dsv41rt.runtime import Runtime

    rows, meta = [], metadata(args)
    for cp, lengths in ((args.cp_size, args.tokens), (1, args.cp1_tokens)):
        if not lengths:
            continue
        kw = dict(
            kv_memory=12 << 30,
            max_num_seqs=2,
            max_num_batched_tokens=args.budget,
            max_model_len=33000,
            precision="bf16",
        )
        if args.cpu:
            kw = dict(kv_memory=256 << 20, max_num_seqs=2, max_num_batched_tokens=args.budget)
        dev = "cpu" if args.cpu else "cuda:0"
        launched = None
        if cp > 1 and args.processes:
            from dsv41rt.cp_launch import cp_processes
            from dsv41rt.options import RuntimeOptions

            opts = RuntimeOptions(device=dev, context_parallel_size=cp, **kw)
            launched = cp_processes(args.checkpoint, opts, comm="socket" if args.cpu else "nccl")
            rt = launched.__enter__()
        elif cp > 1:
            rt = Runtime(
                args.checkpoint,
                dev.split(":")[0],
                context_parallel_size=cp,
                context_parallel_backend="local" if args.cpu else "nccl",
                **kw,
            )
        else:
            rt = Runtime(args.checkpoint, dev, **kw)
        if cp > 1 and not args.cpu:
            rt.set_switch("cp_timing", True)
        rng = np.random.default_rng(0)
        prefill(rt, args.warmup, args.budget, rng)  # warm-up
        for n in (int(x) for x in lengths.split(",") if x):
            runs = [prefill(rt, n, args.budget, rng) for _ in range(args.repeats)]
            r = {k: statistics.median(x[k] for x in runs) for k in runs[0]}
            r.update({"cp": cp, "tokens": n, "tokens_per_s": n / r["ms"] * 1e3, "repeats": args.repeats})
            r["runs_ms"] = [round(x["ms"], 1) for x in runs]
            rows.append(r)
            if args.out:  # after every row: a later length that runs out of time loses only itself
                with open(args.out, "w") as f:
                    json.dump({"meta": meta, "rows": rows}, f, indent=1)
            print(
                f"CP {cp} prefill {n:6d}: {r['ms']:9.1f} ms ({r['tokens_per_s']:6.0f} tok/s, median of "
                f"{args.repeats}: {r['runs_ms']}); all-gather {r['gather_us'] / 1e3:7.2f} ms, Q projection "
                f"{r['q_us'] / 1e3:7.2f} ms, both running {r['overlap_us'] / 1e3:7.2f} ms "
                f"({100 * r['overlap_us'] / max(r['gather_us'], 1):.1f}% of the all-gather hidden; rank 0, "
                "summed over layers and chunks)",
                flush=True,
            )
        del rt
        if launched is not None:
            launched.__exit__(None, None, None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
