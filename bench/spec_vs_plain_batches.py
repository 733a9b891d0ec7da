"""Where speculative decoding departs from plain decoding, per batch size (diagnosis).

For each batch size: plain greedy decoding with decode graphs (the reference), plain eager, DSpark
speculation with random drafts (draft_source: tokens 3..999, so every verify rejects; the verify
forward alone is under test) and the real DSpark drafter, k drafts per step. Prints each run's
wall time and steps, and how many requests' greedy tokens differ from the reference (and from which
token). On the CPU, and on CUDA in fp32, every run must equal the reference; on CUDA in fp8 a verify
forward of more than 64 rows takes other kernels (bench/row_invariance_check.py).

Usage: python bench/spec_vs_plain_batches.py CHECKPOINT PRECISION BATCHES K [NEW [PROMPT]] (DEV=cpu|cuda)
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np


def main() -> None:
    from dsv41rt.runtime import Runtime
    from spec_decode_engine_bench import differences  # bench/ is the script's directory

    path, prec, k = sys.argv[1], sys.argv[2], int(sys.argv[4])
    batches = [int(b) for b in sys.argv[3].split(",")]
    new = int(sys.argv[5]) if len(sys.argv) > 5 else 12
    prompt_len = int(sys.argv[6]) if len(sys.argv) > 6 else 64
    dev = os.environ.get("DEV", "cuda")
    kw = dict(precision=prec, kv_memory=8 << 30, max_num_seqs=max(batches))
    spec = {"method": "dspark", "num_speculative_tokens": k}
    draft_rng = np.random.default_rng(1)

    def random_drafts(request_id: int, tokens: list[int], n: int) -> list[int]:
        return [int(t) for t in draft_rng.integers(3, 1000, n)]

    def run(rt, prompts: list[list[int]]) -> tuple[list[list[int]], float, int]:
        ids = [rt.add_request(p, new, ignore_eos=True) for p in prompts]
        index = {r: i for i, r in enumerate(ids)}
        out: list[list[int]] = [[] for _ in prompts]
        steps, start = 0, time.perf_counter()
        while rt.has_unfinished():
            for o in rt.step():
                out[index[o.request_id]].extend(o.new_tokens)
            steps += 1
        return out, time.perf_counter() - start, steps

    prompts = {
        b: [[int(t) for t in np.random.default_rng(b).integers(3, 129000, prompt_len)] for _ in range(b)]
        for b in batches
    }
    runtimes = {
        "plain graphs": lambda: Runtime(path, dev, **kw),
        "plain eager": lambda: Runtime(path, dev, enforce_eager=True, **kw),
        "random drafts": lambda: Runtime(path, dev, speculative_config=spec, draft_source=random_drafts, **kw),
        "real drafter": lambda: Runtime(path, dev, speculative_config=spec, **kw),
    }
    reference: dict[int, list[list[int]]] = {}
    for name, make in runtimes.items():
        rt = make()
        for b in batches:
            run(rt, prompts[b][:2])  # warm-up
            out, seconds, steps = run(rt, prompts[b])
            line = f"{name:14s} B {b:3d}: {seconds * 1e3:8.1f} ms, {steps} steps"
            if name == "plain graphs":
                reference[b] = out
            else:
                differing, first = differences(out, reference[b])
                line += f", {differing} differ (first at {first})"
            print(line, flush=True)
        rt.close()


if __name__ == "__main__":
    main()
