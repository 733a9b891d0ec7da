"""CLI subcommands; each module has `register(subparsers)` and sets `run` on its parser."""
