"""Where the GPU's precision="bf16" mode and the CPU emulation of it part (diagnostic for
tests/python/test_cuda_executor_bf16.py): per position, max |Δlogit| / max |logit| of GPU bf16 vs
CPU emulation, GPU bf16 vs CPU fp32, emulation vs fp32 and GPU fp32 vs CPU fp32, on tiny-v41
(seed 1, the test's checkpoint), prompts 37 and 200 + 12 forced decode steps. Saves those per-position
errors to --out (npz, small enough to come back from a device call; the logits themselves are ~100 MB).

  python bench/bf16_emulation_diag.py --out /tmp/bf16_diag.npz [--cpu-only]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "python"))
from test_cuda_executor import prompt_of, run_prompt  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True)
    ap.add_argument("--cpu-only", action="store_true")
    args = ap.parse_args()
    from dsv41rt.checkpoint.generator import make_checkpoint
    from dsv41rt.config.presets import preset_config_json
    from dsv41rt.runtime import Runtime

    ck = os.path.join(tempfile.mkdtemp(), "tiny-v41-seed1")
    make_checkpoint(preset_config_json("tiny-v41"), ck, 1, name="tiny-v41")
    saved = {}
    for n in (37, 200):
        p = prompt_of(n)
        runs = {}
        if not args.cpu_only:
            runs["gpu_bf16"], greedy = run_prompt(Runtime(ck, "cuda", precision="bf16"), p, 12)
            runs["gpu_fp32"], _ = run_prompt(Runtime(ck, "cuda"), p, 12, greedy)
        else:
            greedy = None
        runs["cpu_emul"], g2 = run_prompt(Runtime(ck, precision="bf16"), p, 12, greedy)
        runs["cpu_fp32"], _ = run_prompt(Runtime(ck), p, 12, greedy or g2)
        scale = np.abs(runs["cpu_fp32"]).max(-1)
        names = list(runs)
        for i, a in enumerate(names):
            for b in names[i + 1 :]:
                e = np.abs(runs[a] - runs[b]).max(-1) / scale
                first = [f"{x:.1e}" for x in e[:6]]
                print(f"n {n} {a} vs {b}: median {np.median(e):.2e} max {e.max():.2e}; first rows {first}")
                saved[f"{a}_vs_{b}_{n}"] = e
    np.savez_compressed(args.out, **saved)
    return 0


if __name__ == "__main__":
    sys.exit(main())
