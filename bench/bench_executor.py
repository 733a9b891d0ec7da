"""GPU executor benchmark: prefill tokens/s and decode step time, with graph / multistream / dequant
reuse on-off deltas, each next to its roofline.

  python bench/bench_executor.py --preset tiny-v41 [--checkpoint DIR] [--out results.json]

Times are device times of the executor's forward (CUDA events on the main stream around each
forward, `backend_stats()["last_forward_us"]`), median over the repeats. Decode: one prompt of L
tokens is prefilled and its state copied into B handles (Runtime.fork_handle, bitwise the state B
prefills would leave), then each timed step decodes one token for all B as the engine's step does
(Runtime.decode_handles_greedy: greedy tokens drawn on the device, only tokens and logprobs read
back; before 2026-12-04 the step read every handle's FP32 logits back, ~11 ms at B 64 on the H200).
Roofline: a decode step must at least read, in the checkpoint's released formats, every weight it
uses once (attention, shared expert, head, and only the routed experts the batch touches: the
expected number of distinct experts for B tokens routed top-k of E at random; not the embedding or
Engram tables, of which it gathers rows) and each request's KV state, over the copy bandwidth
measured in the same run (torch device-to-device copy, read + write bytes; 4.3 TB/s if torch is
missing); a prefill must at least do its FLOPs (2 x active parameters x tokens; attention
not counted) at 790 TFLOP/s (bf16 dense peak). `--precision bf16` runs the tensor-core GEMM path
and adds an "fp32 gemm" decode mode (the same state with the FP32 kernels).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

COPY_BW = 4.3e12
BF16_FLOPS = 790e12


def make(preset: str, root: str) -> str:
    from dsv41rt.checkpoint.generator import make_checkpoint
    from dsv41rt.config.presets import preset_config_json

    path = os.path.join(root, preset)
    make_checkpoint(preset_config_json(preset), path, 0)
    return path


def active_params(cfg) -> float:
    """Parameters touched per token (dense + k routed experts + shared), from the config."""
    H, D, nh = cfg.hidden_size, cfg.head_dim, cfg.num_attention_heads
    attn = (
        H * cfg.q_lora_rank
        + cfg.q_lora_rank * nh * D
        + H * D
        + nh * D * cfg.o_lora_rank
        + cfg.o_groups * cfg.o_lora_rank * H
    )
    expert = 3 * H * cfg.moe_intermediate_size
    return cfg.num_hidden_layers * (attn + expert * (cfg.num_experts_per_tok + 1)) + 2 * cfg.vocab_size * H


def stored_tensor_bytes(checkpoint: str) -> dict[str, int]:
    """Stored bytes (codes + scales) per tensor class of the checkpoint: 'expert' (one routed
    expert of one layer, averaged), 'experts_per_layer' (E), 'layers' (MoE layers), 'gathered'
    (embedding, Engram tables: rows are gathered), 'draft' (mtp.*), 'read' (everything else)."""
    import glob
    import re
    import struct

    out = {"expert": 0, "read": 0, "gathered": 0, "draft": 0}
    experts, layers = set(), set()
    for path in glob.glob(os.path.join(checkpoint, "*.safetensors")):
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        for name, info in header.items():
            if name == "__metadata__":
                continue
            size = info["data_offsets"][1] - info["data_offsets"][0]
            m = re.match(r"layers\.(\d+)\.ffn\.experts\.(\d+)\.", name)
            if name.startswith("mtp."):
                out["draft"] += size
            elif m:
                out["expert"] += size
                experts.add(int(m.group(2)))
                layers.add(int(m.group(1)))
            elif name.startswith("embed.") or ".engram.embed." in name:
                out["gathered"] += size
            else:
                out["read"] += size
    out["experts_per_layer"] = len(experts)
    out["layers"] = len(layers)
    out["expert"] //= max(1, len(experts) * len(layers))
    return out


def decode_floor_bytes(stored: dict[str, int], batch: int, top_k: int) -> float:
    """Released-format bytes a decode step of `batch` tokens must read (KV state excluded)."""
    E = stored["experts_per_layer"]
    touched = E * (1 - (1 - top_k / E) ** batch) if E else 0.0
    return stored["read"] + stored["layers"] * touched * stored["expert"]


def copy_bandwidth() -> float:
    """Device-to-device copy bandwidth (read + write bytes / s, median of 5), or COPY_BW."""
    try:
        import torch
    except ImportError:
        return COPY_BW
    if not torch.cuda.is_available():
        return COPY_BW
    a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    times = []
    for _ in range(6):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        b.copy_(a)
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    del a, b
    torch.cuda.empty_cache()
    return 2 * (1 << 30) / statistics.median(times[1:])


def timed(rt, fn) -> float:
    """Milliseconds of fn(): the forward's device time (CUDA events) where the executor reports it,
    else host wall time (CPU executor, for smoke runs)."""
    t = time.perf_counter()
    fn()
    host = (time.perf_counter() - t) * 1e3
    return rt.backend_stats().get("last_forward_us", host * 1e3) / 1e3


MODES = {  # name -> backend options (and dequant reuse) switched from the defaults
    "default": {},
    "graphs off": {"cuda_graphs": False},
    "multistream off": {"multistream": False},
    "reuse off": {"reuse": False, "attention_in_place": False},
    "in place off": {"attention_in_place": False},
    "pdl off": {"programmatic_launch": False},
}
DEFAULTS = {
    "cuda_graphs": True,
    "multistream": True,
    "reuse": True,
    "attention_in_place": True,
    "programmatic_launch": True,
}


def prefill_handle(rt, n: int, budget: int, rng) -> tuple[int, float]:
    """A handle holding an n-token random prompt, run in token-budget chunks; its device ms."""
    p = [0] + [int(t) for t in rng.integers(3, 129000, n - 1)]
    h = rt.new_handle()
    total = 0.0
    for i in range(0, n, budget):
        chunk = np.asarray(p[i : i + budget], np.int32)
        total += timed(rt, functools.partial(rt.forward_tokens, h, chunk, all_logits=False))
    return h, total


def decode(
    rt, batch: int, context: int, steps: int, rng, device: str, budget: int, modes: dict
) -> tuple[dict[str, dict], float]:
    """One `context`-token prefill, copied into `batch` handles (Runtime.fork_handle: the state is
    bitwise what `batch` prefills of that prompt would leave), then `steps` timed decode steps of
    all of them in every mode (the context grows by a few tokens per mode, negligible at 4k/32k)."""
    src, prefill_ms = prefill_handle(rt, context, budget, rng)
    handles = [src] + [rt.fork_handle(src) for _ in range(batch - 1)]
    out = {}

    def applies(name: str) -> bool:  # graphs and streams are CUDA switches; the CPU takes the rest
        return name != "reuse" and (device != "cpu" or name in ("tensor_cores", "attention_in_place"))

    for mode, switched in modes.items():
        opts = dict(DEFAULTS, **switched)
        for name, on in opts.items():
            if applies(name):
                rt.set_switch(name, on)
        rt.set_dequant_reuse(opts["reuse"])
        tokens = rng.integers(3, 129000, (steps + 2, batch)).tolist()
        # The served step: greedy tokens drawn on the device, no logits read back.
        ms = [timed(rt, functools.partial(rt.decode_handles_greedy, handles, t)) for t in tokens]
        ms = ms[2:]  # warm-up (graph capture)
        out[mode] = {"median_ms": statistics.median(ms), "min_ms": min(ms), "steps": len(ms)}
    for name, on in DEFAULTS.items():
        if applies(name):
            rt.set_switch(name, on)
    rt.set_dequant_reuse(True)
    for h in handles:
        rt.release_handle(h)
    return out, prefill_ms


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="tiny-v41")
    ap.add_argument("--checkpoint")
    ap.add_argument("--batches", default="1,8,64")
    ap.add_argument("--contexts", default="4096,32768")
    ap.add_argument("--prefill", default="1024,8192,32768")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--kv-memory", type=int, default=16 << 30)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--repeats", type=int, default=3, help="prefill repeats (median); 1 above 8k tokens")
    ap.add_argument("--token-budget", type=int, default=8192)
    ap.add_argument("--trace", action="store_true", help="first run bench/dequant_trace.py's 6-forward trace")
    ap.add_argument("--precision", default="fp32", choices=("fp32", "bf16", "fp8"))
    ap.add_argument("--max-context", type=int, default=0, help="longest request (sizes the indexer scratch once)")
    ap.add_argument("--engram-host-memory", action="store_true", help="Engram tables in pinned host memory")
    ap.add_argument("--modes", default="", help="decode modes to run, comma-separated (default: all)")
    ap.add_argument("--out")
    args = ap.parse_args()
    from dsv41rt.checkpoint.reader import open_checkpoint
    from dsv41rt.runtime import Runtime

    root = tempfile.mkdtemp()
    ck = args.checkpoint or make(args.preset, root)
    cfg = open_checkpoint(ck).config
    rng = np.random.default_rng(0)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    try:
        gpu = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True
        ).stdout.strip()
    except FileNotFoundError:
        gpu = "cpu (no nvidia-smi)"
    result: dict = {
        "date": time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()),
        "commit": os.environ.get("DSV41RT_COMMIT") or commit or "?",
        "device": gpu,
        "model": args.preset if not args.checkpoint else args.checkpoint,
        "precision": args.precision,
        "engram_host_memory": args.engram_host_memory,
        "prefill": [],
        "decode": [],
    }
    print(f"# {result['model']} on {gpu}, commit {result['commit']}, {result['date']}")

    def runtime(**kw) -> Runtime:
        return Runtime(
            ck,
            args.device,
            kv_memory=args.kv_memory,
            max_num_seqs=max(int(b) for b in args.batches.split(",")),
            max_num_batched_tokens=args.token_budget,
            precision=args.precision,
            max_model_len=args.max_context,
            engram_host_memory=args.engram_host_memory,
            **kw,
        )

    # Prefill: one request, one forward per chunk of the token budget; tokens/s of the whole prompt.
    t0 = time.perf_counter()
    rt = runtime()
    weight_bytes = rt.backend_stats().get("weight_bytes", 0) + rt.backend_stats().get("weight_host_bytes", 0)
    stored = stored_tensor_bytes(ck)
    loaded = stored["read"] + stored["gathered"] + stored["expert"] * stored["experts_per_layer"] * stored["layers"]
    print(
        f"loaded in {time.perf_counter() - t0:.1f} s: {weight_bytes / 2**30:.2f} GiB of weights on {rt.device} "
        f"({rt.backend_stats().get('weight_host_bytes', 0) / 2**30:.2f} GiB of them in host memory, "
        f"{rt.backend_stats().get('weight_host_in_place_bytes', 0) / 2**30:.2f} GiB read in place "
        "from the checkpoint's pages); "
        f"the checkpoint stores the loaded tensors in {loaded / 2**30:.2f} GiB "
        f"(ratio {weight_bytes / max(loaded, 1):.3f})"
    )
    bandwidth = copy_bandwidth() if args.device != "cpu" else COPY_BW
    print(f"copy bandwidth {bandwidth / 1e12:.2f} TB/s (read + write)")
    result.update({"weight_bytes": weight_bytes, "checkpoint_loaded_bytes": loaded, "copy_bandwidth": bandwidth})
    if args.trace:
        from dequant_trace import trace

        result["trace"] = trace(rt)
    flops_per_token = 2 * active_params(cfg)
    modes = dict(MODES)
    if args.precision in ("bf16", "fp8"):
        modes["fp32 gemm"] = {"tensor_cores": False}
        DEFAULTS["tensor_cores"] = True
    if args.modes:
        wanted = [m.strip() for m in args.modes.split(",") if m.strip()]
        unknown = [m for m in wanted if m not in modes]
        if unknown:
            raise SystemExit(f"unknown --modes {unknown}; known: {', '.join(modes)}")
        modes = {m: modes[m] for m in wanted}

    def save() -> None:
        if args.out:
            with open(args.out, "w") as f:
                json.dump(result, f, indent=1)

    def prefill_row(n: int, times: list[float]) -> None:
        ms = statistics.median(times)
        roof_ms = flops_per_token * n / BF16_FLOPS * 1e3
        row = {
            "tokens": n,
            "median_ms": ms,
            "repeats": len(times),
            "tokens_per_s": n / ms * 1e3,
            "roofline_ms": roof_ms,
        }
        result["prefill"].append(row)
        save()
        tps = row["tokens_per_s"]
        print(
            f"prefill {n:6d} tokens: {ms:9.2f} ms  {tps:10.0f} tok/s  roofline {roof_ms:.4f} ms (bf16)  x{len(times)}"
        )

    prefilled = set()
    for n in (int(x) for x in args.prefill.split(",") if x):
        times = []
        for _ in range(args.repeats if n <= 8192 else 1):
            h, total = prefill_handle(rt, n, args.token_budget, rng)
            rt.release_handle(h)
            times.append(total)
        prefill_row(n, times)
        prefilled.add(n)

    state_per_token = rt.stats()["page_bytes"] / rt.stats()["page_size"]
    for L in (int(x) for x in args.contexts.split(",") if x):
        for B in (int(x) for x in args.batches.split(",")):
            floor = decode_floor_bytes(stored, B, cfg.num_experts_per_tok) + B * L * state_per_token
            roof_ms = floor / bandwidth * 1e3
            by_mode, prefill_ms = decode(rt, B, L, args.steps, rng, args.device, args.token_budget, modes)
            if L not in prefilled:  # the decode setup's prefill doubles as a (single-run) measurement
                prefill_row(L, [prefill_ms])
                prefilled.add(L)
            for mode, r in by_mode.items():
                r.update({"mode": mode, "batch": B, "context": L, "roofline_ms": roof_ms, "floor_bytes": floor})
                result["decode"].append(r)
                step = r["median_ms"]
                print(
                    f"decode [{mode:15s}] B {B:3d} ctx {L:6d}: {step:8.3f} ms/step  floor {roof_ms:.4f} ms "
                    f"({floor / 1e9:.2f} GB released-format)"
                )
            save()
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
