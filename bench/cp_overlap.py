"""Context-parallel prefill on the GPU: does the all-gather of the hidden states overlap the Q
projection? CUDA-event timing of both per layer (backend option "cp_timing"), summed.

  python bench/cp_overlap.py [--preset tiny-v41 | --checkpoint DIR] [--tokens 4096,8192]

Runs the CP data flow over a one-rank NCCL group (context_parallel_backend="nccl", cp_size 1): the all-gather is a
real NCCL collective on the main stream while the Q projection runs on a side stream. Also checks
the logits against the plain (non-CP) executor on the same prompt: bitwise equal. With
--cp-size N > 1 and N GPUs it runs N ranks instead (issue 9).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import numpy as np


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="tiny-v41")
    ap.add_argument("--checkpoint")
    ap.add_argument("--tokens", default="1024,4096")
    ap.add_argument("--cp-size", type=int, default=1)
    ap.add_argument("--kv-memory", type=int, default=4 << 30)
    ap.add_argument("--compare", action="store_true", help="also run the plain executor and compare logits")
    ap.add_argument("--out")
    args = ap.parse_args()
    from dsv41rt.runtime import Runtime

    ck = args.checkpoint
    if ck is None:
        from dsv41rt.checkpoint.generator import make_checkpoint
        from dsv41rt.config.presets import preset_config_json

        ck = os.path.join(tempfile.mkdtemp(), args.preset)
        make_checkpoint(preset_config_json(args.preset), ck, 0)
    lengths = [int(x) for x in args.tokens.split(",")]
    kw = dict(kv_memory=args.kv_memory, max_num_seqs=2, max_num_batched_tokens=max(lengths))
    rt = Runtime(ck, "cuda", context_parallel_size=args.cp_size, context_parallel_backend="nccl", **kw)
    rt.set_switch("cp_timing", True)
    rng = np.random.default_rng(0)
    rows, prompts = [], {}
    for n in lengths:
        prompts[n] = [0] + [int(t) for t in rng.integers(3, 129000, n - 1)]
        for _rep in range(2):  # the first run warms up (allocations, NCCL setup)
            h = rt.new_handle()
            logits = rt.forward_tokens(h, prompts[n])
            rt.release_handle(h)
            s = rt.backend_stats()
        q, g, o = s["cp_q_projection_us"], s["cp_all_gather_us"], s["cp_overlap_us"]
        row = {
            "tokens": n,
            "layers": s["cp_layers_timed"],
            "forward_us": s["last_forward_us"],
            "q_projection_us": q,
            "all_gather_us": g,
            "overlap_us": o,
            "gather_hidden_fraction": o / g if g else 0.0,
        }
        rows.append(row)
        print(
            f"cp {args.cp_size} prefill {n:6d}: forward {s['last_forward_us'] / 1e3:8.2f} ms; "
            f"over {row['layers']} layers "
            f"Q projection {q / 1e3:7.3f} ms, all-gather {g / 1e3:7.3f} ms, both running {o / 1e3:7.3f} ms "
            f"({100 * row['gather_hidden_fraction']:.0f}% of the all-gather hidden under the Q projection)"
        )
        prompts[n] = (prompts[n], logits)
    if args.compare:
        del rt
        plain = Runtime(ck, "cuda", **kw)
        for n in lengths:
            p, cp_logits = prompts[n]
            h = plain.new_handle()
            ref = plain.forward_tokens(h, p)
            plain.release_handle(h)
            same = bool(np.array_equal(ref, cp_logits))
            print(
                f"prefill {n}: CP logits == plain executor logits: {same} (max |Δ| {np.abs(ref - cp_logits).max():.3g})"
            )
            next(r for r in rows if r["tokens"] == n)["equal_to_plain"] = same
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
