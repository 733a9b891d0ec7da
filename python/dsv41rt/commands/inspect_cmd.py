"""`dsv41rt inspect PATH`: the layer plan, tensor inventory and cache footprint of a model.

PATH is a checkpoint directory (its safetensors headers are read and validated against config.json)
or a preset name (the tensor inventory is then the one the config implies).
"""

from __future__ import annotations

import argparse
import os
from collections import defaultdict

from ..checkpoint.reader import open_checkpoint
from ..checkpoint.tensor_spec import physical_tensors
from ..config import ModelPlan, build_plan, cache_bytes, config_from_dict, preset_names
from ..config.parallel_plan import gpu_bytes
from ..config.plan import Role
from ..config.presets import preset_config_json
from ..errors import ConfigError
from ..options import parse_size


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("inspect", help="print the layer plan, tensors and cache bytes of a checkpoint or preset")
    p.add_argument("path", help=f"checkpoint directory or preset name ({', '.join(preset_names())})")
    p.add_argument("--no-validate", action="store_true", help="skip checking tensors against the config")
    p.add_argument(
        "--tensor-parallel-size", type=int, default=1, help="GPUs the weights are split over (per-GPU bytes)"
    )
    p.add_argument(
        "--expert-parallel-size", type=int, default=1, help="groups of those GPUs the routed experts are split over"
    )
    p.add_argument(
        "--kv-memory", default="16G", help="KV budget per GPU for the fit check (default 16G; sizes like 8G, 512M)"
    )
    p.set_defaults(run=run)


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.2f} {unit}"
        n /= 1024
    raise AssertionError


def _src(x: int | None) -> str:
    return "-" if x is None else str(x)


def plan_table(plan: ModelPlan) -> list[str]:
    rows = [("layer", "ratio", "role", "kv source", "top-k source", "candidates", "engram", "rope base")]
    for layer in plan.layers + plan.draft_layers:
        label = str(layer.index) if layer.stage.value == "backbone" else f"{layer.stage.value}.{layer.index}"
        role = layer.role.value + (" (hash MoE)" if layer.hash_routed else "")
        kv = "own" if layer.kv_source == layer.index and layer.role is not Role.SWA else _src(layer.kv_source)
        topk = "own" if layer.topk_source == layer.index else _src(layer.topk_source)
        rope = f"{layer.rope_base:g}" + (" + YaRN" if layer.yarn else "")
        rows.append(
            (
                label,
                str(layer.ratio),
                role,
                kv,
                topk,
                layer.candidates.value or "-",
                "yes" if layer.engram else "-",
                rope,
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return lines


def _tensor_summary(tensors: list[tuple[str, int]], source: str) -> list[str]:
    """Counts and bytes per safetensors dtype of `tensors` = [(dtype, nbytes)]."""
    per_dtype: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for dtype, nbytes in tensors:
        per_dtype[dtype][0] += 1
        per_dtype[dtype][1] += nbytes
    total_n = sum(v[0] for v in per_dtype.values())
    total_b = sum(v[1] for v in per_dtype.values())
    lines = [f"Tensors {source}: {total_n:,} tensors, {_fmt_bytes(total_b)}"]
    for dtype in sorted(per_dtype):
        n, b = per_dtype[dtype]
        lines.append(f"  {dtype:<8} {n:>8,} tensors  {b:>20,} bytes  ({_fmt_bytes(b)})")
    return lines


# V4's quantised rows (584 B: 448 FP8 channels, 64 BF16 rope channels) exist at these widths only.
_V4_ROW_HEAD_DIM, _V4_ROW_ROPE_DIM = 512, 64


def _cache_summary(plan: ModelPlan) -> list[str]:
    cb = cache_bytes(plan)
    cfg = plan.config
    note = []
    if not cfg.is_v41 and (cfg.head_dim, cfg.qk_rope_head_dim) != (_V4_ROW_HEAD_DIM, _V4_ROW_ROPE_DIM):
        note = [
            f"  note: V4's quantised rows need head_dim {_V4_ROW_HEAD_DIM} with a {_V4_ROW_ROPE_DIM}-channel "
            f"rope tail; this config (head_dim {cfg.head_dim}, rope {cfg.qk_rope_head_dim}) runs with "
            "kv_cache_dtype float32 only, and the sizes below are what its rows would take at that layout"
        ]
    return [
        "Cache footprint (stored quantised):",
        *note,
        f"  global KV (compressed KV + index keys): {cb.global_per_token:g} B/token",
        f"  window rows: {cb.window_row} B per row; {cfg.sliding_window} rows x {cb.window_layers} layers = "
        f"{cb.window_per_request:,} B per request",
        f"  compressor pending state: {cb.compressor_state_per_request:,} B per request; "
        f"engram history: {cb.engram_history_per_request} B per request",
        f"  per request: {_fmt_bytes(cb.per_request(0))} fixed + {cb.global_per_token:g} B/token "
        f"(128K tokens: {_fmt_bytes(cb.per_request(131072))}, 1M tokens: {_fmt_bytes(cb.per_request(1 << 20))})",
    ]


# Device memory as the vendors state it, and what the fit check keeps back for the CUDA context and
# the GEMM / attention staging workspaces (which sit outside kv-memory; docs/design/gpu-decode.md).
_DEVICES = (("H200", 141_000_000_000), ("B200", 192_000_000_000))
_RESERVE = 4 << 30


def _parallel_summary(plan: ModelPlan, tp: int, ep: int, kv_memory: int) -> list[str]:
    b = gpu_bytes(list(physical_tensors(plan)), plan, tp, ep)
    lines = [
        f"Per GPU (tensor-parallel-size {tp}, expert-parallel-size {ep}; placement: "
        "python/dsv41rt/config/parallel_plan.py):",
        f"  weights on each GPU: {_fmt_bytes(b.device)} ({b.device:,} B: split {_fmt_bytes(b.split)}, "
        f"routed experts {_fmt_bytes(b.experts)}, replicated {_fmt_bytes(b.replicated)})",
        f"  Engram tables in host memory, once per host: {_fmt_bytes(b.host)} ({b.host:,} B)",
    ]
    need = b.device + kv_memory + _RESERVE
    for name, capacity in _DEVICES:
        verdict = "fits" if need <= capacity else "does not fit"
        rest = f"{_fmt_bytes(capacity - need)} left" if need <= capacity else f"{_fmt_bytes(need - capacity)} short"
        lines.append(
            f"  {name} ({capacity / 1e9:.0f} GB): {verdict} with kv-memory {_fmt_bytes(kv_memory)} and a "
            f"{_fmt_bytes(_RESERVE)} reserve ({_fmt_bytes(need)} needed, {rest})"
        )
    return lines


def run(args: argparse.Namespace) -> int:
    if os.path.isdir(args.path):
        opened = open_checkpoint(args.path, validate=not args.no_validate)
        plan = opened.plan
        infos = (opened.tensors.info(name) for name in opened.tensors.names())
        tensors = [(d["dtype"], d["nbytes"]) for d in infos]
        source = f"in {args.path}" + ("" if args.no_validate else " (validated against config.json)")
    elif args.path in preset_names():
        plan = build_plan(config_from_dict(preset_config_json(args.path), source=f"preset {args.path}"))
        tensors = [(t.dtype, t.nbytes) for t in physical_tensors(plan)]
        source = "implied by the config"
    else:
        raise ConfigError(f"{args.path!r} is neither a checkpoint directory nor a preset ({', '.join(preset_names())})")
    c = plan.config
    counts = plan.role_counts()
    print(f"Model: {c.arch.value} from {c.source}")
    print(
        f"  hidden {c.hidden_size}, {c.num_hidden_layers} layers, {c.num_attention_heads} heads x {c.head_dim} "
        f"(rope {c.qk_rope_head_dim}), q_lora {c.q_lora_rank}, o_lora {c.o_lora_rank} x {c.o_groups} groups, "
        f"window {c.sliding_window}, hc_mult {c.hc_mult}"
    )
    print(
        f"  MoE: {c.n_routed_experts} experts top-{c.num_experts_per_tok} x {c.moe_intermediate_size} + 1 shared; "
        f"indexer {c.index_n_heads} x {c.index_head_dim} top-{c.index_topk}; vocab {c.vocab_size}"
    )
    print("  layer roles: " + ", ".join(f"{counts.get(r, 0)} {r.value}" for r in Role if counts.get(r)))
    if plan.draft_layers:
        print(f"  draft stages: {len(plan.draft_layers)} ({plan.draft_layers[0].stage.value})")
    print()
    print("\n".join(plan_table(plan)))
    print()
    print("\n".join(_tensor_summary(tensors, source)))
    print()
    print("\n".join(_cache_summary(plan)))
    print()
    kv_memory = parse_size(args.kv_memory, "--kv-memory")
    print("\n".join(_parallel_summary(plan, args.tensor_parallel_size, args.expert_parallel_size, kv_memory)))
    return 0
