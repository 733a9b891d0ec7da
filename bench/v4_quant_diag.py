"""Where GPU and CPU part with V4's quantised caches (tiny-v4-d512): per-position max |Δlogit| for
config variants that take parts out (index_topk large: no indexer selection; sliding_window large:
no ring wrap), and GPU one-shot prefill vs GPU incremental decode (equal bitwise on the CPU)."""

from __future__ import annotations

import json
import os
import shutil
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "python"))
from test_cuda_executor import prompt_of, run_prompt  # noqa: E402


def one_shot(rt, tokens):
    h = rt.new_handle()
    out = rt.forward_tokens(h, tokens)
    rt.release_handle(h)
    return out


def show(tag, diff):
    over = np.where(diff > 1e-4)[0]
    first = int(over[0]) if over.size else -1
    codes = "".join("." if d <= 1e-4 else ("o" if d <= 1e-2 else "X") for d in diff)
    print(f"{tag}: max {diff.max():.2e} first>1e-4 at {first} over {over.size}/{diff.size} {codes}", flush=True)


def main() -> None:
    from dsv41rt.checkpoint.generator import make_checkpoint
    from dsv41rt.config.presets import preset_config_json
    from dsv41rt.runtime import Runtime

    base = "/tmp/v4diag/base"
    if not os.path.isdir(base):
        make_checkpoint(preset_config_json("tiny-v4-d512"), base, 1)
    variants = {
        "base": {},
        "topk64": {"index_topk": 64},
        "win64": {"sliding_window": 64},
        "topk64+win64": {"index_topk": 64, "sliding_window": 64},
    }
    for name, change in variants.items():
        d = base if not change else f"/tmp/v4diag/{name}"
        if change and not os.path.isdir(d):
            os.makedirs(d)
            for f in os.listdir(base):
                if f != "config.json":
                    os.symlink(os.path.join(base, f), os.path.join(d, f))
            cfg = json.load(open(os.path.join(base, "config.json")))
            cfg.update(change)
            json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
        for kv in ("auto", "float32"):
            opts = dict(kv_cache_dtype=kv, enable_prefix_caching=False)
            try:
                cpu, gpu = Runtime(d, **opts), Runtime(d, os.environ.get("DIAG_GPU", "cuda"), **opts)
            except Exception as e:  # noqa: BLE001
                print(f"{name} kv {kv}: {e}")
                continue
            for n in (1, 37):
                ours, greedy = run_prompt(gpu, prompt_of(n), 24)
                ref, _ = run_prompt(cpu, prompt_of(n), 24, greedy)
                show(f"{name} kv {kv} n {n} GPU vs CPU", np.abs(ours - ref).max(-1))
                seq = prompt_of(n) + greedy[:-1]
                show(f"{name} kv {kv} n {n} GPU one-shot vs GPU decode", np.abs(one_shot(gpu, seq) - ours[:-1]).max(-1))
                show(f"{name} kv {kv} n {n} CPU one-shot vs CPU decode", np.abs(one_shot(cpu, seq) - ref[:-1]).max(-1))
            cpu.close()
            gpu.close()
    shutil.rmtree("/tmp/v4diag", ignore_errors=True)


if __name__ == "__main__":
    main()
