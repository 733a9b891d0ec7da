"""What DSpark speculation costs and gives at batch 1 (issue 24, acceptance 3): ms per output token
of plain greedy decoding against draft -> verify -> rollback with a fixed acceptance length and
with the real drafter, on one direct sequence of the scripting API.

  python bench/spec_decode_bench.py --checkpoint DIR [--device cuda] [--precision fp8]
      [--prompt 1024] [--new-tokens 128] [--k 5] [--acceptance 1,2,3,3.51,4,5,6] [--out r.json]

Random weights accept almost nothing, so, as public benchmarks do, a synthetic acceptance length L
(mean tokens a verify step yields: accepted drafts + the target's own token, 1 <= L <= k + 1) is
produced by drafting the known greedy continuation with a wrong token at position a of each
block, a = floor(L - 1) or ceil(L - 1) drawn so that the mean is L - 1 (fixed seed). The real
DSpark drafter's own acceptance is measured in the same run ("real"). Every speculative run must
give the plain run's tokens (checked), so only the time differs. Times are host wall clock (each
call returns to the host), medians over --repeats; per output token = (a run of --new-tokens minus
a run of one token through the same code) / (new tokens - 1): the prompt's prefill never counts.

Batch 16 / 64: bench/spec_decode_engine_bench.py (the engine, through the Runtime's draft_source hook).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time

import numpy as np


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--precision", default="fp8")
    p.add_argument("--prompt", type=int, default=1024, help="prompt tokens")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--k", type=int, default=5, help="draft tokens per verify step")
    p.add_argument("--acceptance", default="1,2,3,3.51,4,5,6", help="synthetic acceptance lengths")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--kv-memory", default="4G")
    p.add_argument("--out", default="")
    return p.parse_args()


def offsets_for(length: float, k: int, steps: int, seed: int = 0) -> list[int]:
    """Accepted drafts per verify step (the wrong token's index in the block), mean length - 1."""
    if not 1.0 <= length <= k + 1:
        raise SystemExit(f"acceptance length {length} outside [1, {k + 1}]")
    lo, frac = math.floor(length - 1), (length - 1) - math.floor(length - 1)
    rng = np.random.default_rng(seed)
    return [min(k, lo + int(rng.random() < frac)) for _ in range(steps)]


def main() -> int:
    args = parse_args()
    from dsv41rt.options import parse_size
    from dsv41rt.runtime import Runtime
    from dsv41rt.speculative import generate_greedy_speculative

    kv = parse_size(args.kv_memory, "kv-memory")
    rt = Runtime(args.checkpoint, args.device, precision=args.precision, kv_memory=kv, load_drafter=True)
    vocab = rt.config.vocab_size
    prompt = [int(t) for t in np.random.default_rng(1).integers(3, min(vocab, 129000), args.prompt)]

    def plain(n: int) -> list[int]:
        h = rt.new_handle()
        try:
            logits = rt.forward_tokens(h, prompt, all_logits=False)
            out = [int(np.argmax(logits[0]))]
            while len(out) < n:
                nxt, _ = rt.decode_handles_greedy([h], [out[-1]])
                out.append(int(nxt[0]))
            return out
        finally:
            rt.release_handle(h)

    def timed(fn) -> tuple[float, object]:
        times, result = [], None
        for _ in range(args.repeats):
            start = time.perf_counter()
            result = fn()
            times.append((time.perf_counter() - start) * 1e3)
        return statistics.median(times), result

    # Per output token after the first: a run of new_tokens minus a run of one token through the
    # same code (the prompt's prefill and the first token), so prefill never counts.
    plain_one_ms, _ = timed(lambda: plain(1))
    plain_ms, reference = timed(lambda: plain(args.new_tokens))
    decode_ms_per_token = (plain_ms - plain_one_ms) / (args.new_tokens - 1)
    spec_one_ms, _ = timed(lambda: generate_greedy_speculative(rt, prompt, 1, args.k))
    rows = [{"mode": "plain", "ms_per_token": decode_ms_per_token, "acceptance_length": 1.0}]
    print(f"# {args.checkpoint} on {rt.device}, precision {args.precision}, prompt {args.prompt}, k {args.k}")
    print(f"plain greedy: {decode_ms_per_token:.3f} ms/token ({1e3 / decode_ms_per_token:.1f} tok/s)")

    def run(label: str, draft) -> None:
        ms, result = timed(lambda: generate_greedy_speculative(rt, prompt, args.new_tokens, args.k, draft=draft))
        if list(result.tokens) != reference:
            raise SystemExit(f"{label}: speculative tokens differ from plain greedy")
        per_token = (ms - spec_one_ms) / (args.new_tokens - 1)
        length = (args.new_tokens - 1) / max(result.steps, 1)
        rows.append(
            {
                "mode": label,
                "ms_per_token": per_token,
                "acceptance_length": length,
                "steps": result.steps,
                "drafted": result.drafted,
                "accepted": result.accepted,
            }
        )
        speedup = decode_ms_per_token / per_token
        print(
            f"{label:>12}: {per_token:.3f} ms/token ({1e3 / per_token:.1f} tok/s, x{speedup:.2f} vs plain),"
            f" acceptance length {length:.2f}, {result.steps} verify steps"
        )

    for text in args.acceptance.split(","):
        length = float(text)
        offsets = offsets_for(length, args.k, args.new_tokens)
        state = {"step": 0}

        def synthetic(tokens: list[int], k: int, offsets=offsets, state=state) -> list[int]:
            at = len(tokens)  # the next tokens the target will produce are reference[at:]
            block = list(reference[at : at + k])
            a = offsets[state["step"] % len(offsets)]
            state["step"] += 1
            if a < len(block):
                block[a] = (block[a] + 1) % vocab  # the first wrong draft: a accepted before it
            return block

        run(f"L={text}", synthetic)
    run("real", None)
    if args.out:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout
        meta = {
            "date": time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()),
            "commit": os.environ.get("DSV41RT_COMMIT", commit.strip()),
            "device": rt.device,
            "precision": args.precision,
            "prompt": args.prompt,
            "new_tokens": args.new_tokens,
            "k": args.k,
            "prefill_and_first_token_ms": plain_one_ms,
            "rows": rows,
        }
        with open(args.out, "w") as f:
            json.dump(meta, f, indent=1)
    rt.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
