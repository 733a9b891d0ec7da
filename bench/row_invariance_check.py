"""Does a row's result depend on the other rows of its forward? (diagnosis, any device/precision)

One handle holds a 128-token random prompt; its next token t is run alone (1 row, the reference)
and with n - 1 more tokens after it (undoable, rolled back after each), and row 0's logits are
compared with the reference's: equal rows say the kernels' row results do not depend on the
forward's other rows or its row count. Forwards of more than Backend::kDecodeForwardRows (64) rows
take other kernels on CUDA (the staged prefill GEMMs and the grouped MoE), which is where a
speculative verify forward of more than 64 rows can part from plain decoding in fp8.

Usage: python bench/row_invariance_check.py CHECKPOINT [--device cuda] [--precision fp8]
"""

from __future__ import annotations

import argparse

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("checkpoint")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--precision", default="fp8")
    args = ap.parse_args()
    from dsv41rt.runtime import Runtime

    rt = Runtime(args.checkpoint, args.device, precision=args.precision, kv_memory=4 << 30, max_num_seqs=4)
    vocab = min(rt.config.vocab_size, 129000)
    prompt = [int(t) for t in np.random.default_rng(5).integers(3, vocab, 128)]
    h = rt.new_handle()
    t = int(np.argmax(rt.forward_tokens(h, prompt, all_logits=False)[-1]))

    def row0(extra: list[int]) -> np.ndarray:
        out = rt.forward_tokens(h, [t] + extra, undoable=True)
        rt.rollback_handle(h, 1 + len(extra))
        return out[0].copy()

    def rnd(n: int, seed: int, hi: int = vocab) -> list[int]:
        return [int(x) for x in np.random.default_rng(seed).integers(3, hi, n)]

    ref = row0([])
    cases = {
        "6 rows, drafts A": rnd(5, 1),
        "6 rows, drafts B": rnd(5, 2),
        "64 rows": rnd(63, 3),
        "65 rows A": rnd(64, 4),
        "65 rows B": rnd(64, 5),
        "96 rows A": rnd(95, 6),
        "96 rows B": rnd(95, 7),
        "96 rows, tokens < 1000": rnd(95, 8, 1000),
        "96 rows, one token repeated": [t] * 95,
    }
    got = {}
    for name, extra in cases.items():
        got[name] = row0(extra)
        d = float(np.abs(got[name] - ref).max())
        same = int(np.argmax(got[name]) == np.argmax(ref))
        print(f"{args.precision} {name:28s}: row 0 vs 1 row: max |Δ| {d:.3g}, argmax same {same}", flush=True)
    for a, b in (
        ("65 rows A", "65 rows B"),
        ("96 rows A", "96 rows B"),
        ("96 rows A", "96 rows, tokens < 1000"),
        ("96 rows A", "96 rows, one token repeated"),
    ):
        print(f"{args.precision} {a} vs {b}: max |Δ| {float(np.abs(got[a] - got[b]).max()):.3g}")
    print(f"{args.precision} 1 row again vs first: max |Δ| {float(np.abs(row0([]) - ref).max()):.3g}")
    rt.close()


if __name__ == "__main__":
    main()
