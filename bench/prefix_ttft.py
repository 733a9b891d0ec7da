"""Time to first token with the prefix cache: a long prompt sent cold, re-sent with a new suffix
(device-pool hit), and re-sent again after other traffic pushed its state out of the device pool
into the host-memory tier (issue 22, acceptance 3).

  python bench/prefix_ttft.py --checkpoint DIR [--device cuda] [--precision fp8] [--tokens 32768]
      [--suffix 200] [--host-cache-memory 32G] [--out result.json]

Phases, one request each, on one Runtime (`step()` driven, nothing else running):
  warmup  a different prompt of one chunk (workspaces, kernels' first use), then the cache is reset
  cold    prompt P (--tokens): nothing cached
  hit     P + a new suffix S1 (--suffix tokens): P's state is in the device pool
  evict   a different prompt Q as long as P: the pool (sized to hold about one such request) has to
          evict P's pages and snapshot; they go to the host tier
  host    P + another suffix S2: what the device pool lost comes back from host memory
TTFT is host wall time from add_request to the output carrying the first token (what a client of
the engine waits), single run per phase; cached tokens are the engine's own count.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time

import numpy as np


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--precision", default="fp8")
    p.add_argument("--tokens", type=int, default=32768)
    p.add_argument("--suffix", type=int, default=200)
    p.add_argument("--chunk", type=int, default=8192, help="max_num_batched_tokens (prefill chunk)")
    p.add_argument("--page-size", type=int, default=256)
    p.add_argument("--host-cache-memory", default="32G")
    p.add_argument("--kv-cache-dtype", default="auto", help="auto (released cache formats) or float32")
    p.add_argument("--pool-slack", type=float, default=1.10, help="pool positions / (tokens + suffix)")
    p.add_argument("--out", default="")
    return p.parse_args()


def first_token(rt, prompt: list[int]) -> dict:
    """Submit one request for one token; TTFT (ms) and the cached prompt tokens it reported."""
    start = time.perf_counter()
    rid = rt.add_request(prompt, max_new_tokens=1, ignore_eos=True)
    cached, tokens = -1, []
    while rt.has_unfinished():
        for o in rt.step():
            if o.request_id == rid:
                cached = max(cached, o.cached_tokens)
                tokens += o.new_tokens
                if o.finish_reason == "error":
                    raise SystemExit(f"request failed: {o.error}")
    ms = (time.perf_counter() - start) * 1e3
    return {"prompt_tokens": len(prompt), "ttft_ms": round(ms, 1), "cached_tokens": cached, "token": tokens}


def main() -> None:
    a = parse_args()
    from dsv41rt import Runtime, _core
    from dsv41rt.config import load_config

    cfg = load_config(a.checkpoint)
    rng = np.random.default_rng(0)
    lo, hi = 1000, cfg.vocab_size - 1000

    def tokens(n: int) -> list[int]:
        return rng.integers(lo, hi, size=n).tolist()

    # A pool of about one request of tokens + suffix, sized by the executor's own memory plan.
    seqs, max_len = 4, a.tokens + 2 * a.suffix + 16
    plan = _core.build_model_plan(_core.load_model_config(a.checkpoint))
    m = _core.memory_plan(plan, 1 << 40, seqs, a.chunk, max_len, a.page_size, a.kv_cache_dtype == "auto")
    pages = math.ceil((a.tokens + a.suffix) * a.pool_slack / a.page_size)
    kv_memory = m["scratch_bytes"] + seqs * m["slot_bytes"] + pages * (m["page_bytes"] + m["workspace_bytes_per_page"])
    rt = Runtime(
        a.checkpoint,
        a.device,
        precision=a.precision,
        kv_cache_dtype=a.kv_cache_dtype,
        kv_memory=kv_memory,
        max_num_seqs=seqs,
        max_num_batched_tokens=a.chunk,
        max_model_len=max_len,
        page_size=a.page_size,
        host_cache_memory=a.host_cache_memory,
    )
    s = rt.stats()
    print(f"pool: {s['pages_total']} pages of {a.page_size} positions, kv_memory {kv_memory / 2**30:.2f} GiB")

    p, s1, s2, q = tokens(a.tokens), tokens(a.suffix), tokens(a.suffix), tokens(a.tokens)
    phases = {}
    phases["warmup"] = first_token(rt, tokens(a.chunk))
    rt.reset_prefix_cache()
    phases["cold"] = first_token(rt, p)
    phases["hit"] = first_token(rt, p + s1)
    phases["evict"] = first_token(rt, q)
    phases["host"] = first_token(rt, p + s2)
    st = rt.stats()
    rt.check_invariants()
    cold = phases["cold"]["ttft_ms"]
    for name, r in phases.items():
        ratio = f"{100 * r['ttft_ms'] / cold:6.1f}% of cold" if name in ("hit", "host") else ""
        head = f"{name:7s} {r['prompt_tokens']:7d} tokens  TTFT {r['ttft_ms']:9.1f} ms"
        print(f"{head}  cached {r['cached_tokens']:7d}  {ratio}")
    keys = [k for k in st if k.startswith("prefix_cache_")]
    print("  ".join(f"{k[len('prefix_cache_') :]}={st[k]}" for k in keys))

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    result = {
        "checkpoint": os.path.basename(a.checkpoint.rstrip("/")),
        "device": rt.device,
        "precision": a.precision,
        "commit": os.environ.get("DSV41RT_COMMIT") or commit or "?",
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "pages_total": s["pages_total"],
        "page_size": a.page_size,
        "phases": phases,
        "hit_ratio": phases["hit"]["ttft_ms"] / cold,
        "host_ratio": phases["host"]["ttft_ms"] / cold,
        "stats": {k: st[k] for k in keys},
    }
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
