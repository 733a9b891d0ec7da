"""The GPU executor against the NeMo V4.1 oracle, in two halves (the oracle packages are not on the
GPU machine, the GPU is not on the CPU machine; the tiny checkpoints are byte-identical per seed):

  on the GPU machine:  python bench/cuda_oracle.py dump --out cuda_logits.npz
  on the CPU machine:  python bench/cuda_oracle.py compare cuda_logits.npz

`dump` runs tests/python/test_oracle_v41.py's protocol on device "cuda" (tiny-v41 seeds 1-3, cache
quantisation on and off, prompts of 1/7/37/200 tokens, prefill then 32 greedy tokens through the
caches) and saves the logits and tokens; `compare` runs NeMo on the same tokens and applies that
test's tolerance (max |Δ| <= 1e-4 + 3 x the reference's noise floor per position; greedy tokens
are the reference's argmax up to that tolerance). Prints one line per case and exits 1 on failure.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))

SEEDS = (1, 2, 3)
LENGTHS = (1, 7, 37, 200)
GEN = 32


def prompt_of(n: int) -> list[int]:
    return [0] + [int(t) for t in np.random.default_rng(1000 + n).integers(3, 129000, n - 1)]


def checkpoint(seed: int, root: str) -> str:
    from dsv41rt.checkpoint.generator import make_checkpoint
    from dsv41rt.config.presets import preset_config_json

    path = os.path.join(root, f"tiny-v41-seed{seed}")
    if not os.path.exists(os.path.join(path, "config.json")):
        make_checkpoint(preset_config_json("tiny-v41"), path, seed)
    return path


def dump(out: str, device: str) -> None:
    from dsv41rt.runtime import Runtime

    arrays: dict[str, np.ndarray] = {}
    with tempfile.TemporaryDirectory() as root:
        for seed in SEEDS:
            ck = checkpoint(seed, root)
            for quant in (True, False):
                rt = Runtime(ck, device, cache_quant=quant)
                for n in LENGTHS:
                    p = prompt_of(n)
                    h = rt.new_handle()
                    logits = [rt.forward_tokens(h, p)]
                    greedy = []
                    for _ in range(GEN):
                        greedy.append(int(np.argmax(logits[-1][-1])))
                        logits.append(rt.forward_tokens(h, [greedy[-1]]))
                    rt.release_handle(h)
                    key = f"s{seed}_q{int(quant)}_n{n}"
                    arrays[key + "_logits"] = np.concatenate(logits)[: n + GEN - 1]
                    arrays[key + "_greedy"] = np.asarray(greedy)
                print(f"seed {seed} quant {quant}: done on {rt.device}", flush=True)
    np.savez_compressed(out, **arrays)
    print(f"wrote {out}")


def compare(path: str) -> int:
    import nemo_automodel.components.models.deepseek_v41.attention as nemo_attention
    from oracle.nemo_v41 import build_model
    from oracle.reference import reference

    data = np.load(path)
    failures = 0
    with tempfile.TemporaryDirectory() as root:
        for seed in SEEDS:
            model = build_model(checkpoint(seed, root))
            for quant in (True, False):
                original = nemo_attention.quantize_cache
                if not quant:
                    nemo_attention.quantize_cache = lambda values, **_: values
                try:
                    for n in LENGTHS:
                        key = f"s{seed}_q{int(quant)}_n{n}"
                        ours, greedy = data[key + "_logits"], data[key + "_greedy"]
                        p = prompt_of(n)
                        ref = reference(model, p + [int(g) for g in greedy[:-1]], prompt_len=n, length_noise=quant)
                        tol = 1e-4 + 3 * ref["noise"]
                        diff = np.abs(ours - ref["logits"]).max(-1)
                        rows = np.arange(n - 1, n + GEN - 1)
                        margins = ref["logits"][rows].max(-1) - ref["logits"][rows, greedy]
                        ok = bool((diff <= tol).all() and (margins <= tol[rows]).all())
                        failures += not ok
                        print(
                            f"seed {seed} quant {'on ' if quant else 'off'} n {n:3d}: max|Δ| {diff.max():.2e} "
                            f"(median {np.median(diff):.1e}), worst Δ/tol {np.max(diff / tol):.2f}, "
                            f"greedy tokens {'agree' if (margins <= tol[rows]).all() else 'DIFFER'} "
                            f"-> {'PASS' if ok else 'FAIL'}",
                            flush=True,
                        )
                finally:
                    nemo_attention.quantize_cache = original
    print(f"{failures} failing case(s)")
    return 1 if failures else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dump")
    d.add_argument("--out", required=True)
    d.add_argument("--device", default="cuda")
    c = sub.add_parser("compare")
    c.add_argument("path")
    args = ap.parse_args()
    if args.cmd == "dump":
        dump(args.out, args.device)
        return 0
    return compare(args.path)


if __name__ == "__main__":
    sys.exit(main())
