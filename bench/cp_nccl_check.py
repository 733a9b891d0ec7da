"""CP over real NCCL ranks, one GPU each (issue 9): logits of CP = N equal CP = 1 for prompts of
37, 201 and 1000 tokens on tiny-v41 and tiny-v41-released-schedule, followed by identical decode.

  NCCL_NVLS_ENABLE=0 python bench/cp_nccl_check.py --cp-size 2
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np


def run(rt, prompt: list[int], steps: int = 6):
    h = rt.new_handle()
    logits = rt.forward_tokens(h, prompt)
    tokens, outs = [], []
    for _ in range(steps):
        tokens.append(int(np.argmax((outs[-1] if outs else logits)[-1])))
        outs.append(rt.forward_tokens(h, tokens[-1:]))
    rt.release_handle(h)
    return logits, tokens, np.concatenate(outs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--cp-size", type=int, default=2)
    ap.add_argument("--processes", action="store_true", help="one process per GPU (dsv41rt.cp_launch)")
    args = ap.parse_args()
    from dsv41rt.checkpoint.generator import make_checkpoint
    from dsv41rt.config.presets import preset_config_json
    from dsv41rt.runtime import Runtime

    ok = True
    for preset in ("tiny-v41", "tiny-v41-released-schedule"):
        ck = os.path.join(tempfile.mkdtemp(), preset)
        make_checkpoint(preset_config_json(preset), ck, 1)
        kw = dict(kv_memory=256 << 20, max_num_seqs=4)
        one = Runtime(ck, "cuda:0", **kw)
        if args.processes:
            from dsv41rt.cp_launch import cp_processes
            from dsv41rt.options import RuntimeOptions

            opts = RuntimeOptions(device="cuda:0", context_parallel_size=args.cp_size, **kw)
            launched = cp_processes(ck, opts)
            cp = launched.__enter__()
        else:
            cp = Runtime(ck, "cuda", context_parallel_size=args.cp_size, context_parallel_backend="nccl", **kw)
        cp.set_switch("cp_timing", True)
        for n in (37, 201, 1000):
            p = [0] + [int(t) for t in np.random.default_rng(4000 + n).integers(3, 129000, n - 1)]
            a, b = run(one, p), run(cp, p)
            same = np.array_equal(a[0], b[0]) and a[1] == b[1] and np.array_equal(a[2], b[2])
            s = cp.backend_stats()
            ok &= same
            print(
                f"{preset} prompt {n:4d}: NCCL CP {args.cp_size} == CP 1 (prefill logits + 6 decode steps): {same}"
                f" (max |Δ| prefill {np.abs(a[0] - b[0]).max():.3g}); rank 0: all-gather {s['cp_all_gather_us']} us,"
                f" Q projection {s['cp_q_projection_us']} us, both running {s['cp_overlap_us']} us"
            )
        print(f"{preset}: {cp.backend_stats()}")
        del one, cp
        if args.processes:
            launched.__exit__(None, None, None)
    print("ALL EQUAL" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
