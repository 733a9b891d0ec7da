"""`dsv41rt cp-worker`: one rank > 0 of a context-, tensor- or expert-parallel group in its own
process (started by dsv41rt.cp_launch for rank 0 with every runtime option as rank 0's)."""

from __future__ import annotations

import argparse

from ..errors import Dsv41rtError
from ..options import add_runtime_flags, options_from_args


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("cp-worker", help="a context-parallel rank > 0 (started by rank 0's process)")
    p.add_argument("checkpoint")
    p.add_argument("--rank", type=int, required=True)
    p.add_argument(
        "--id-file",
        required=True,
        help="file holding the group's id: the 128-byte NCCL unique id or rank 0's host:port",
    )
    add_runtime_flags(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ..runtime import Runtime

    options = options_from_args(args)
    if not 1 <= args.rank < options.group_size:
        raise Dsv41rtError(f"--rank must be in [1, group size), got {args.rank} of {options.group_size}")
    try:
        with open(args.id_file, "rb") as f:
            group_id = f.read()
    except OSError as err:
        raise Dsv41rtError(f"--id-file {args.id_file}: {err.strerror}") from None
    Runtime(args.checkpoint, options=options, rank=args.rank, group_id=group_id).run_cp_worker()
    return 0
