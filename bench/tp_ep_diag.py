"""Where a tensor/expert-parallel group on one GPU (virtual ranks over LocalComm) departs from one
rank: prefill logits of decode-sized (<= 64 rows) and larger prompts, per precision and with the
executor switches (multistream, attention_in_place) off one at a time. A diagnostic for
bench/tp_ep_check.py mismatches.

  python bench/tp_ep_diag.py --checkpoint /tmp/bench-40 --sizes 2x1,1x2 --precisions fp8,fp32
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

SWITCHES = ((), ("multistream",), ("attention_in_place",), ("multistream", "attention_in_place"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--sizes", default="2x1,1x2")
    ap.add_argument("--precisions", default="fp8,fp32")
    ap.add_argument("--lengths", default="8,64,65,300")
    args = ap.parse_args()
    from dsv41rt.runtime import Runtime

    lengths = [int(n) for n in args.lengths.split(",")]
    prompts = [[0] + [int(t) for t in np.random.default_rng(9100 + n).integers(3, 120000, n - 1)] for n in lengths]
    for precision in args.precisions.split(","):
        kw = dict(precision=precision, kv_memory=2 << 30, max_num_seqs=2)
        one = Runtime(args.checkpoint, "cuda:0", **kw)
        for pair in args.sizes.split(","):
            tp, ep = (int(v) for v in pair.split("x"))
            rt = Runtime(args.checkpoint, "cuda:0", tensor_parallel_size=tp, expert_parallel_size=ep, **kw)
            for off in SWITCHES:
                for r in (one, rt):
                    for name in ("multistream", "attention_in_place"):
                        r.set_switch(name, name not in off)
                cells = []
                for n, p in zip(lengths, prompts, strict=True):
                    a, b = one.score(p), rt.score(p)
                    d = np.abs(a - b).max(axis=1)
                    bad = np.nonzero(d > 1e-3 * np.abs(a).max())[0]
                    cells.append(f"{n}: {d.max():.3g}" + (f" (row {bad[0]} first > 1e-3)" if len(bad) else ""))
                print(f"{precision} tp {tp} ep {ep} off {'+'.join(off) or '-'}: " + "; ".join(cells), flush=True)
            rt.close()
        one.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
