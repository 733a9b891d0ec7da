"""Cost of handing a sequence from one runtime to another (Runtime.export_handle / import_handle, the
payload of the prefill/decode handoff, issue 26): blob bytes, export and import time per prompt
length, next to the prefill time of the same prompt.

  python bench/handoff_bench.py --checkpoint DIR [--device cuda] [--precision fp8]
      [--tokens 1024,8192] [--repeats 5] [--out result.json]

Two runtimes of the same checkpoint in one process (on a GPU: the same device). Per length: one
prefill on runtime A (host wall time, single run), then --repeats exports from A and imports into B
(each import released again): medians of host wall time. The copies go through host memory
(device -> host on export, host -> device on import; synchronous). A check that B's next-token
logits equal A's (bitwise) guards the numbers.
"""

from __future__ import annotations

import argparse
import json
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
    p.add_argument("--tokens", default="1024,8192")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--kv-memory", default="24G")
    p.add_argument("--out", default="")
    return p.parse_args()


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, (time.perf_counter() - start) * 1e3


def main() -> None:
    a = parse_args()
    from dsv41rt import Runtime
    from dsv41rt.config import load_config

    lengths = [int(x) for x in a.tokens.split(",")]
    longest = max(lengths)
    kw = dict(
        precision=a.precision,
        kv_memory=a.kv_memory,
        max_num_seqs=4,
        max_num_batched_tokens=min(longest, 8192),
        max_model_len=longest + 8,
    )
    src, dst = Runtime(a.checkpoint, a.device, **kw), Runtime(a.checkpoint, a.device, **kw)
    cfg = load_config(a.checkpoint)
    rng = np.random.default_rng(0)
    rows = []
    for n in lengths:
        prompt = [0] + rng.integers(1000, cfg.vocab_size - 1000, size=n - 1).tolist()
        h = src.new_handle()
        _, prefill_ms = timed(lambda h=h, prompt=prompt: src.forward_tokens(h, prompt, all_logits=False))
        exports, imports = [], []
        blob = b""
        for _ in range(a.repeats):
            blob, ms = timed(lambda h=h: src.export_handle(h))
            exports.append(ms)
            h2, ms = timed(lambda blob=blob: dst.import_handle(blob))
            imports.append(ms)
            dst.release_handle(h2)
        h2 = dst.import_handle(blob)
        same = bool(np.array_equal(src.decode_handles([h], [7]), dst.decode_handles([h2], [7])))
        src.release_handle(h)
        dst.release_handle(h2)
        row = {
            "tokens": n,
            "blob_bytes": len(blob),
            "bytes_per_token": round(len(blob) / n, 1),
            "prefill_ms": round(prefill_ms, 2),
            "export_ms": round(statistics.median(exports), 3),
            "import_ms": round(statistics.median(imports), 3),
            "next_token_logits_equal": same,
        }
        rows.append(row)
        gbps = len(blob) / (row["export_ms"] + row["import_ms"]) / 1e6
        print(
            f"{n:7d} tokens: blob {len(blob) / 2**20:9.2f} MiB ({row['bytes_per_token']:8.1f} B/token)  "
            f"prefill {prefill_ms:9.1f} ms  export {row['export_ms']:8.2f} ms  import {row['import_ms']:8.2f} ms  "
            f"({gbps:5.2f} GB/s both ways)  logits equal: {same}"
        )
        if not same:
            raise SystemExit("the imported sequence's logits differ from the exporter's")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    result = {
        "checkpoint": os.path.basename(a.checkpoint.rstrip("/")),
        "device": src.device,
        "precision": a.precision,
        "commit": os.environ.get("DSV41RT_COMMIT") or commit or "?",
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "repeats": a.repeats,
        "rows": rows,
    }
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
