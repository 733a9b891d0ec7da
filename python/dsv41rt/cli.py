"""The `dsv41rt` command line: one subcommand per module under dsv41rt.commands."""

from __future__ import annotations

import argparse
import sys

from .errors import Dsv41rtError


def build_parser() -> argparse.ArgumentParser:
    from .commands import bench_cmd, cp_worker_cmd, inspect_cmd, make_checkpoint_cmd, router_cmd, run_cmds, serve_cmd

    parser = argparse.ArgumentParser(prog="dsv41rt", description="Serving runtime for DeepSeek-V4.1 / V4 models")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in (inspect_cmd, make_checkpoint_cmd, run_cmds, serve_cmd, router_cmd, bench_cmd, cp_worker_cmd):
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except Dsv41rtError as e:
        print(f"dsv41rt {args.command}: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `dsv41rt inspect ... | head`
        return 0


if __name__ == "__main__":
    sys.exit(main())
