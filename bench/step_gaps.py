"""Where a decode step's device sits idle: one eager bench-40 decode step of B requests under
torch.profiler (CUDA kernels and copies with their device timestamps, and the host's CUDA runtime
calls), reported as the busy time (union of device intervals over all streams) against the step's
span, the longest idle gaps with the work on each side, and the host calls that waited on the
device (synchronisations, synchronous copies) during the step.

  python bench/step_gaps.py --checkpoint DIR [--tokens 4096] [--batch 64] [--precision fp8]
"""

from __future__ import annotations

import argparse
import sys

import numpy as np


def short(name: str) -> str:
    name = name.replace("(anonymous namespace)::", "").replace("void ", "")
    return name.split("(")[0].split("<")[0].replace("dsv41rt::kernels::cuda::", "")[-48:]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--precision", default="fp8")
    ap.add_argument("--gaps", type=int, default=25)
    ap.add_argument("--kv-memory", type=int, default=8 << 30)
    args = ap.parse_args()
    import torch
    from dsv41rt.runtime import Runtime

    rt = Runtime(
        args.checkpoint,
        "cuda",
        kv_memory=args.kv_memory,
        max_num_seqs=args.batch + 1,
        max_num_batched_tokens=args.tokens,
        max_model_len=args.tokens + 16,
        precision=args.precision,
    )
    rng = np.random.default_rng(0)
    prompt = [0] + [int(t) for t in rng.integers(3, 129000, args.tokens - 1)]
    h = rt.new_handle()
    rt.forward_tokens(h, prompt, all_logits=False)
    hs = [h] + [rt.fork_handle(h) for _ in range(args.batch - 1)]
    rt.set_switch("cuda_graphs", False)
    rt.decode_handles_greedy(hs, [5] * args.batch)  # warm-up
    torch.cuda.synchronize()
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        rt.decode_handles_greedy(hs, [7] * args.batch)
        torch.cuda.synchronize()
    step_ms = rt.backend_stats()["last_forward_us"] / 1e3
    dev, host = [], []
    for e in prof.events():
        start, end = e.time_range.start, e.time_range.end  # microseconds
        if e.device_type == torch.autograd.DeviceType.CUDA:
            dev.append((start, end, short(e.name)))
        elif e.name.startswith("cuda") and not e.name.startswith("cudaLaunch"):
            host.append((start, end, e.name))
    dev.sort()
    t0, t1 = dev[0][0], max(d[1] for d in dev)
    busy, gaps, reach, last = 0.0, [], dev[0][0], dev[0][2]
    for s, e, n in dev:
        if s > reach:
            gaps.append((s - reach, reach, last, n))
        if e > reach:
            busy += e - max(s, reach)
            reach, last = e, n
    print(
        f"decode step, {args.batch} requests at context {args.tokens} ({args.precision}, eager): "
        f"executor events {step_ms:.2f} ms; device span {(t1 - t0) / 1e3:.2f} ms, busy {busy / 1e3:.2f} ms "
        f"over {len(dev)} kernels/copies, idle {(t1 - t0 - busy) / 1e3:.2f} ms in {len(gaps)} gaps"
    )
    sizes = np.array([g[0] for g in gaps]) if gaps else np.zeros(1)
    for lo, hi in ((0, 5), (5, 20), (20, 100), (100, 1e9)):
        sel = sizes[(sizes >= lo) & (sizes < hi)]
        print(f"  gaps of {lo}-{hi} us: {len(sel)}, {sel.sum() / 1e3:.2f} ms")
    print(f"longest {args.gaps} gaps (us, at ms into the step, after -> before):")
    for g, at, before, after in sorted(gaps, reverse=True)[: args.gaps]:
        print(f"  {g:8.1f}  {(at - t0) / 1e3:7.2f}  {before} -> {after}")
    waits: dict[str, list[float]] = {}
    for s, e, n in host:
        if t0 <= s <= t1:
            waits.setdefault(n, []).append(e - s)
    print("host CUDA runtime calls during the step (count, total ms, longest us):")
    for n, d in sorted(waits.items(), key=lambda kv: -sum(kv[1]))[:15]:
        print(f"  {n:40s} {len(d):6d} {sum(d) / 1e3:8.2f} {max(d):9.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
