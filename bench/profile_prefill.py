"""Where a GPU prefill and a decode step spend their time: every CUDA kernel of one prefill forward,
then of one eager decode step per batch size, summed by kernel name, with the number of kernels
the step launches (CUPTI through torch.profiler, which records all kernels of the process, ours
included).

  python bench/profile_prefill.py --checkpoint DIR [--tokens 4096] [--precision bf16] [--decode-batches 1,8]
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict

import numpy as np


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--precision", default="bf16")
    ap.add_argument("--top", type=int, default=18)
    ap.add_argument("--decode-batches", default="8")
    ap.add_argument("--kv-memory", type=int, default=8 << 30, help="bytes (a 32k prefill needs ~26 GiB)")
    args = ap.parse_args()
    import torch
    from dsv41rt.runtime import Runtime

    batches = [int(x) for x in args.decode_batches.split(",")]
    rt = Runtime(
        args.checkpoint,
        "cuda",
        kv_memory=args.kv_memory,
        max_num_seqs=max(batches) + 1,
        max_num_batched_tokens=args.tokens,
        max_model_len=args.tokens + 8,
        precision=args.precision,
    )
    rng = np.random.default_rng(0)
    prompt = [0] + [int(t) for t in rng.integers(3, 129000, args.tokens - 1)]
    h = rt.new_handle()
    rt.forward_tokens(h, prompt[:512])  # warm-up: allocations
    rt.release_handle(h)
    h = rt.new_handle()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        rt.forward_tokens(h, prompt, all_logits=False)
    summarize(prof, f"prefill {args.tokens} tokens ({args.precision})", rt, args.top)
    # One decode step of B requests at this context (eager, so every kernel is its own launch).
    rt.set_switch("cuda_graphs", False)
    for b in batches:
        hs = [rt.fork_handle(h) for _ in range(b)]
        rt.decode_handles_greedy(hs, [5] * b)  # warm-up
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            rt.decode_handles_greedy(hs, [7] * b)
        title = f"decode step, {b} requests at context {args.tokens} ({args.precision}, eager)"
        summarize(prof, title, rt, args.top)
        for x in hs:
            rt.release_handle(x)
    return 0


def summarize(prof, title: str, rt, top: int) -> None:
    import torch

    total = defaultdict(float)
    count = defaultdict(int)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            name = e.name.replace("(anonymous namespace)::", "").replace("void ", "")
            name = name.split("(")[0].split("<")[0].replace("dsv41rt::kernels::cuda::", "")[-60:]
            total[name] += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
            count[name] += 1
    grand = sum(total.values())
    print(
        f"{title}: forward {rt.backend_stats()['last_forward_us'] / 1e3:.1f} ms, "
        f"{sum(count.values())} kernels, {grand / 1e3:.1f} ms of kernel time"
    )
    for name, us in sorted(total.items(), key=lambda kv: -kv[1])[:top]:
        print(f"  {us / 1e3:9.2f} ms {100 * us / grand:5.1f}%  x{count[name]:5d}  {name}")


if __name__ == "__main__":
    sys.exit(main())
