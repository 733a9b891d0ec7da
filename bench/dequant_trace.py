"""Print the dequant-workspace counters of a 6-forward trace (a prefill, then five forwards of new
tokens through the sparse path) with reuse on and off, and check the logits are identical.

    python bench/dequant_trace.py [--preset tiny-v41-released-schedule] [--checkpoint DIR] [--device cuda]

On the released 40-layer schedule: 4 dequantisations per forward with reuse (one per KV source),
38 without (one per compressed layer): 24 vs 228 over the trace.
"""

from __future__ import annotations

import argparse
import tempfile

import numpy as np
from dsv41rt.checkpoint.generator import make_checkpoint
from dsv41rt.config.presets import preset_config_json
from dsv41rt.runtime import Runtime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="tiny-v41-released-schedule")
    ap.add_argument("--checkpoint", help="use this checkpoint instead of generating the preset")
    ap.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    ap.add_argument("--kv-memory", type=int, default=256 << 20)
    a = ap.parse_args()
    path = a.checkpoint or tempfile.mkdtemp(prefix="dsv41rt-trace-")
    if not a.checkpoint:
        make_checkpoint(preset_config_json(a.preset), path, 0)
    rt = Runtime(path, a.device, kv_memory=a.kv_memory)
    print(f"{path} on {rt.device}")
    trace(rt)


def trace(rt: Runtime) -> dict:
    """Runs the trace on `rt`, prints it, returns the counters and whether the logits agree."""
    tokens = [0] + [int(t) for t in np.random.default_rng(0).integers(3, 129000, 29)]
    chunks = [tokens[:10]] + [tokens[10 + 4 * i : 14 + 4 * i] for i in range(5)]
    results, out = {}, {}
    for reuse in (True, False):
        rt.set_dequant_reuse(reuse)
        rt.reset_dequant_counters()
        h = rt.new_handle()
        logits = [rt.forward_tokens(h, c) for c in chunks]
        rt.release_handle(h)
        c = rt.dequant_counters()
        results[reuse] = logits
        out["reuse_on" if reuse else "reuse_off"] = dict(c)
        print(
            f"reuse {'on ' if reuse else 'off'}: {len(chunks)} forwards, dequantisations {c['dequant_calls']} "
            f"({c['dequant_calls'] / len(chunks):g} per forward), reuse hits {c['reuse_hits']}, "
            f"rows dequantised {c['rows_dequantised']}",
            flush=True,
        )
    rt.set_dequant_reuse(True)
    same = all(np.array_equal(x, y) for x, y in zip(results[True], results[False], strict=True))
    print(f"logits identical with reuse on and off: {same}")
    out["logits_identical"] = same
    return out


if __name__ == "__main__":
    main()
