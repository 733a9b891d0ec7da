"""Tensor/expert parallelism over NCCL, one process per GPU (issue 21 run 1), against TP = EP = 1 on
one GPU: per prompt, whether the prefill logits are bitwise equal, the first prefill row whose
recorded discrete decisions (indexer top-k, routed experts) differ, the logits' relative
deviation (per row, of its max |logit|) before that row and over all rows, and whether the greedy
tokens (continuous batching: every prompt in one engine) are identical, else the step they part.

A prompt passes when no decision differs, every row is within BOUND (1e-4 at fp32, 5e-2 at fp8)
and the tokens are identical. The CUDA backend splits experts by partial sums (FP32 summation
order) and runs narrower matrices per rank; tests/python/test_tensor_expert_parallel_cuda.py
says more.

  NCCL_NVLS_ENABLE=0 python bench/tp_ep_check.py --checkpoint /tmp/bench-40 --sizes 2x1,1x2,2x2
  python bench/tp_ep_check.py --checkpoint /tmp/bench-40 --virtual   # one GPU, ranks over LocalComm
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

BOUND = {"fp32": 1e-4, "fp8": 5e-2}


def prompts(lengths: list[int]) -> list[list[int]]:
    return [[0] + [int(t) for t in np.random.default_rng(9000 + n).integers(3, 120000, n - 1)] for n in lengths]


def measure(rt, ps: list[list[int]], new_tokens: int):
    """Per prompt: prefill logits [n, V] and the prefill's recorded decisions; then greedy tokens."""
    runs = []
    for p in ps:
        logits = rt.score(p)
        runs.append((logits, rt.decisions()))
    return runs, rt.generate(ps, max_new_tokens=new_tokens, ignore_eos=True)


def first_divergent_row(a: dict, b: dict, n: int) -> int:
    """The first prefill row whose recorded decisions (indexer top-k, routed experts of any layer)
    differ between two runs; n when none do (rows before it saw the same decisions)."""
    first = n
    for key in a:
        x, y = np.asarray(a[key]).reshape(n, -1), np.asarray(b[key]).reshape(n, -1)
        differ = np.flatnonzero((x != y).any(-1))
        if differ.size:
            first = min(first, int(differ[0]))
    return first


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--sizes", default="2x1,1x2,2x2", help="TPxEP pairs, comma-separated")
    ap.add_argument("--precision", default="fp8", choices=sorted(BOUND))
    ap.add_argument("--lengths", default="64,256,512,1024")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--kv-memory", type=int, default=8 << 30)
    ap.add_argument("--virtual", action="store_true", help="virtual ranks on cuda:0 (LocalComm) instead of NCCL")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    from dsv41rt.cp_launch import cp_processes
    from dsv41rt.options import RuntimeOptions
    from dsv41rt.runtime import Runtime

    lengths = [int(n) for n in args.lengths.split(",")]
    ps = prompts(lengths)
    kw = dict(precision=args.precision, kv_memory=args.kv_memory, max_num_seqs=len(ps), record_decisions=True)
    t0 = time.time()
    one = Runtime(args.checkpoint, "cuda:0", **kw)
    want, want_tokens = measure(one, ps, args.new_tokens)
    one.close()
    print(f"TP = EP = 1 on cuda:0: {time.time() - t0:.1f} s (load + {len(ps)} prefills + generate)", flush=True)
    rows, ok = [], True
    for pair in args.sizes.split(","):
        tp, ep = (int(v) for v in pair.split("x"))
        t0 = time.time()
        if args.virtual:  # every rank on cuda:0, in this process, over LocalComm
            rt = Runtime(args.checkpoint, "cuda:0", tensor_parallel_size=tp, expert_parallel_size=ep, **kw)
            got, tokens = measure(rt, ps, args.new_tokens)
            rt.close()
        else:
            opts = RuntimeOptions(device="cuda:0", tensor_parallel_size=tp, expert_parallel_size=ep, **kw)
            with cp_processes(args.checkpoint, opts, comm="nccl") as rt:
                got, tokens = measure(rt, ps, args.new_tokens)
        for n, (a, da), (b, db), ta, tb in zip(lengths, want, got, want_tokens, tokens, strict=True):
            first = first_divergent_row(da, db, n)
            rel = np.abs(a - b).max(-1) / np.abs(a).max(-1)  # per row, of the row's max |logit|
            before = rel[:first]
            step = next((i for i, (x, y) in enumerate(zip(ta, tb, strict=True)) if x != y), None)
            good = first == n and float(rel.max()) <= BOUND[args.precision] and step is None
            ok &= good
            rows.append(
                dict(
                    tp=tp,
                    ep=ep,
                    prompt=n,
                    bitwise=bool(np.array_equal(a, b)),
                    first_divergent_decision_row=first,
                    max_rel_diff=float(rel.max()),
                    max_rel_diff_before=float(before.max()) if first else 0.0,
                    median_rel_diff_before=float(np.median(before)) if first else 0.0,
                    first_divergent_token=step,
                    tokens=len(ta),
                    ok=good,
                )
            )
            r = rows[-1]
            print(
                f"tp {tp} ep {ep} prompt {n:>5}: {'bitwise' if r['bitwise'] else 'differs'}; decisions part at row "
                f"{first} of {n}; rows before: max/median rel |Δ| {r['max_rel_diff_before']:.2g}/"
                f"{r['median_rel_diff_before']:.2g}, all rows max {r['max_rel_diff']:.2g}; {len(ta)} greedy tokens "
                f"{'identical' if step is None else f'part at step {step}'}",
                flush=True,
            )
        print(f"tp {tp} ep {ep}: {time.time() - t0:.1f} s", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            meta = dict(
                commit=os.environ.get("DSV41RT_COMMIT", "?"), date=time.strftime("%Y-%m-%d"), virtual=args.virtual
            )
            json.dump(dict(meta, checkpoint=args.checkpoint, precision=args.precision, rows=rows), f, indent=1)
    print("ALL WITHIN BOUND, TOKENS IDENTICAL" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
