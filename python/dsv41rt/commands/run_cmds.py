"""`dsv41rt score` and `dsv41rt generate`: run a checkpoint on prompt files (JSON lists of token ids)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..errors import Dsv41rtError
from ..options import add_runtime_flags, options_from_args


def load_prompts(path: str) -> list[list[int]]:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise Dsv41rtError(f"{path}: prompts file not found") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise Dsv41rtError(f"{path}: not valid JSON: {e}") from None
    if not isinstance(data, list) or not data:
        raise Dsv41rtError(f"{path}: must be a non-empty JSON list of lists of token ids")
    for i, p in enumerate(data):
        if not isinstance(p, list) or not p:
            raise Dsv41rtError(f"{path}: prompt {i} must be a non-empty list of token ids")
        for j, t in enumerate(p):
            if isinstance(t, bool) or not isinstance(t, int):
                raise Dsv41rtError(f"{path}: prompt {i} position {j} is {t!r}, not an integer token id")
    return data


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", required=True, help="checkpoint directory (config.json + safetensors)")
    p.add_argument("--prompts", required=True, help="JSON file: a list of lists of token ids")
    p.add_argument("--out", required=True, help="output file")
    add_runtime_flags(p)


def register(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("score", help="logits of every position of every prompt, to an .npz")
    _common(s)
    s.add_argument("--chunk-size", type=int, default=None, help="prefill in chunks of N tokens")
    s.set_defaults(run=run_score)
    g = sub.add_parser("generate", help="greedy continuation of every prompt, to a JSON list")
    _common(g)
    g.add_argument("--max-new-tokens", type=int, required=True)
    g.add_argument(
        "--sequential", action="store_true", help="run the prompts one at a time (default: all at once, batched)"
    )
    g.add_argument("--ignore-eos", action="store_true", help="do not stop at the model's end-of-sequence token")
    g.set_defaults(run=run_generate)


@contextlib.contextmanager
def _runtime(args: argparse.Namespace) -> Iterator[Any]:
    from ..cp_launch import open_runtime

    with open_runtime(args.checkpoint, options_from_args(args)) as rt:
        print(rt.describe_pool(), file=sys.stderr)  # capacity: tokens and concurrent requests
        yield rt


def run_score(args: argparse.Namespace) -> int:
    prompts = load_prompts(args.prompts)
    with _runtime(args) as rt:
        t0 = time.time()
        out = {f"logits_{i}": rt.score(p, chunk_size=args.chunk_size) for i, p in enumerate(prompts)}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    np.savez(args.out, **out)
    n = sum(len(p) for p in prompts)
    print(f"scored {len(prompts)} prompt(s), {n} tokens in {time.time() - t0:.2f}s -> {args.out}")
    return 0


def run_generate(args: argparse.Namespace) -> int:
    if args.max_new_tokens < 1:
        raise Dsv41rtError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    prompts = load_prompts(args.prompts)
    # --speculative-config (a runtime option): the direct-handle loop below, which reports the
    # acceptance per prompt; serve speculates in the engine.
    if options_from_args(args).speculative_config is not None:
        return _run_generate_speculative(args, prompts)
    with _runtime(args) as rt:
        t0 = time.time()
        out = rt.generate(
            prompts, max_new_tokens=args.max_new_tokens, sequential=args.sequential, ignore_eos=args.ignore_eos
        )
        stats = rt.stats()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f)
        f.write("\n")
    print(
        f"generated {sum(map(len, out))} tokens for {len(prompts)} prompt(s) in {time.time() - t0:.2f}s "
        f"({stats['steps']} steps, {stats['preemptions']} preemptions, max queue {stats['max_waiting_seen']}) "
        f"-> {args.out}"
    )
    return 0


def _run_generate_speculative(args: argparse.Namespace, prompts: list[list[int]]) -> int:
    """`generate --speculative-config`: each prompt's greedy continuation drafted by DSpark and
    verified by the target (dsv41rt.speculative), one prompt at a time; the tokens are those of
    plain greedy generation, the summary says how many drafts the target accepted."""
    from ..runtime import Runtime
    from ..speculative import generate_greedy_speculative

    options = options_from_args(args)
    spec = options.speculative_config
    assert spec is not None
    options = options.replace(load_drafter=True, speculative_config=None)  # no engine speculation
    if options.context_parallel_size > 1 or options.tensor_parallel_size > 1 or options.expert_parallel_size > 1:
        raise Dsv41rtError(
            "--speculative-config runs on one rank: context/tensor/expert parallelism is not built for it"
        )
    t0 = time.time()
    with contextlib.closing(Runtime(args.checkpoint, options=options)) as rt:
        if rt.config.dspark is None:
            raise Dsv41rtError(f"{args.checkpoint}: the model has no DSpark drafter (dspark_* config keys)")
        stops = [] if args.ignore_eos else [rt.config.eos_token_id]
        results = [
            generate_greedy_speculative(rt, p, args.max_new_tokens, spec.num_speculative_tokens, stop_token_ids=stops)
            for p in prompts
        ]
    out = [list(r.tokens) for r in results]
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f)
        f.write("\n")
    steps, drafted, accepted = (sum(getattr(r, k) for r in results) for k in ("steps", "drafted", "accepted"))
    print(
        f"generated {sum(map(len, out))} tokens for {len(prompts)} prompt(s) in {time.time() - t0:.2f}s "
        f"with {spec.method}: {steps} verify steps, {accepted} of {drafted} draft tokens accepted "
        f"({accepted / max(drafted, 1):.1%}) -> {args.out}"
    )
    return 0
