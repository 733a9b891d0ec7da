"""`dsv41rt cp-worker`: one context-parallel rank > 0 in its own process (started by
dsv41rt.cp_launch for rank 0; every pool option must equal rank 0's)."""

from __future__ import annotations

import argparse

from ..errors import Dsv41rtError
from .make_checkpoint_cmd import _size


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("cp-worker", help="a context-parallel rank > 0 (started by rank 0's process)")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--size", type=int, required=True)
    p.add_argument("--device", required=True, help="cuda:N (nccl) or any device (socket)")
    p.add_argument("--cp-comm", default="nccl", choices=("nccl", "socket"))
    p.add_argument(
        "--id-file",
        required=True,
        help="file holding the group's id: the 128-byte NCCL unique id or rank 0's host:port",
    )
    p.add_argument("--kv-memory", type=_size, default=256 << 20)
    p.add_argument("--max-running", type=int, default=64)
    p.add_argument("--token-budget", type=int, default=512)
    p.add_argument("--max-context", type=int, default=0)
    p.add_argument("--page-tokens", type=int, default=64)
    p.add_argument("--cache-quant", type=int, default=1)
    p.add_argument("--precision", default="fp32", choices=("fp32", "bf16"))
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ..runtime import Runtime

    if not 1 <= args.rank < args.size:
        raise Dsv41rtError(f"--rank must be in [1, --size), got {args.rank} of {args.size}")
    try:
        with open(args.id_file, "rb") as f:
            uid = f.read()
    except OSError as err:
        raise Dsv41rtError(f"--id-file {args.id_file}: {err.strerror}") from None
    rt = Runtime(
        args.checkpoint,
        args.device,
        kv_memory=args.kv_memory,
        max_running=args.max_running,
        token_budget=args.token_budget,
        max_context=args.max_context,
        page_tokens=args.page_tokens,
        cache_quant=bool(args.cache_quant),
        precision=args.precision,
        cp_size=args.size,
        cp_comm=args.cp_comm,
        cp_rank=args.rank,
        cp_id=uid,
    )
    rt.run_cp_worker()
    return 0
