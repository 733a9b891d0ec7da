"""`dsv41rt make-checkpoint --preset NAME --seed N --out DIR`."""

from __future__ import annotations

import argparse
import os
import sys
import time

from ..config.presets import GENERATOR, preset_config_json
from ..errors import CheckpointError


def _size(text: str) -> int:
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    t = text.strip().lower().removesuffix("b").removesuffix("i")
    try:
        return int(float(t[:-1]) * units[t[-1]]) if t and t[-1] in units else int(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a byte size: {text!r} (e.g. 4G, 512M, 1000000)") from None


def register(sub: argparse._SubParsersAction) -> None:
    register_prepare(sub)
    p = sub.add_parser(
        "make-checkpoint",
        help="write a random, well-conditioned checkpoint in the released format",
        description="Write config.json, *.safetensors (released names and formats) and tokenizer "
        "files. The same preset and seed always give byte-identical files.",
    )
    p.add_argument("--preset", required=True, choices=sorted(GENERATOR), help="model preset")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument(
        "--bf16",
        action="store_true",
        help="store quantised weights as their exact BF16 dequantised values (no quantization_config)",
    )
    p.add_argument("--max-shard-bytes", type=_size, default=4 << 30, help="shard size limit (default 4G)")
    p.add_argument("--no-tokenizer", action="store_true", help="do not copy tokenizer files")
    p.add_argument(
        "--direct-codes-min-numel",
        type=int,
        default=None,
        help="quantised matrices of at least this many elements get directly sampled codes and one "
        "tensor-wide scale (what synthetic weights generate on the device; default 4194304 = 2^22)",
    )
    p.add_argument(
        "--synthetic",
        action="store_true",
        help="leave the directly sampled tensors out of the files and list them in "
        "dsv41rt_synthetic.json: the runtime generates them when it opens the directory, with the bytes "
        "this command would have written (how flash-full runs without 300 GB on disk)",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=min(8, os.cpu_count() or 1),
        help="processes writing shards in parallel (output is identical for any value)",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ..checkpoint.generator import DIRECT_CODES_MIN_NUMEL, make_checkpoint

    if args.workers < 1:
        raise CheckpointError(f"--workers must be >= 1, got {args.workers}")
    if args.seed < 0:
        raise CheckpointError(f"--seed must be non-negative, got {args.seed}")
    cfg = preset_config_json(args.preset)
    if args.bf16:
        cfg.pop("quantization_config", None)
        cfg.pop("expert_dtype", None)
    t0 = time.time()
    files = make_checkpoint(
        cfg,
        args.out,
        args.seed,
        name=args.preset,
        max_shard_bytes=args.max_shard_bytes,
        tokenizer=not args.no_tokenizer,
        workers=args.workers,
        direct_codes_min_numel=DIRECT_CODES_MIN_NUMEL
        if args.direct_codes_min_numel is None
        else args.direct_codes_min_numel,
        synthetic=args.synthetic,
        progress=lambda m: print(m, file=sys.stderr),
    )
    print(
        f"wrote {args.out}: preset {args.preset}, seed {args.seed}, {len(files)} safetensors file(s)"
        f"{' (synthetic: the listed tensors are generated at load)' if args.synthetic else ''} "
        f"in {time.time() - t0:.1f}s"
    )
    return 0


def register_prepare(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "prepare",
        help="write engram_tables.st into a checkpoint (for C/C++ hosts without Python)",
        description="Computes the Engram hashing inputs (normalised-token map from tokenizer.json, per-layer "
        "multipliers, primes and offsets) and writes them next to the weights. Generated checkpoints already "
        "have the file; released ones need this once.",
    )
    p.add_argument("checkpoint", help="checkpoint directory")
    p.set_defaults(run=run_prepare)


def run_prepare(args: argparse.Namespace) -> int:
    from ..checkpoint.reader import open_checkpoint
    from ..tokenizer.engram_file import engram_inputs, write_engram_tables

    opened = open_checkpoint(args.checkpoint)
    token_map, layers = engram_inputs(args.checkpoint, opened.config)
    if token_map is None:
        print(f"{args.checkpoint}: no Engram layers, nothing to write")
        return 0
    print(f"wrote {write_engram_tables(args.checkpoint, token_map, layers)} ({len(layers)} Engram layers)")
    return 0
