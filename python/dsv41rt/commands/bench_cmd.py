"""`dsv41rt bench`: load-test an OpenAI-compatible server (ours or any other) the way
`vllm bench serve` does, and write its JSON result schema (same keys) plus a PNG of the latency
distributions.

Streams /v1/completions with random token-id prompts of --input-len tokens and --output-len output
tokens (ignore_eos), at a Poisson --request-rate or a fixed --max-concurrency. Per request: TTFT
(first streamed token), ITL (gaps between streamed chunks), TPOT ((e2e - TTFT) / (output - 1)), e2e.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from ..errors import Dsv41rtError


@dataclass
class Result:
    ok: bool = False
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    latency: float = 0.0
    output_tokens: int = 0
    error: str = ""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="benchmark an OpenAI-compatible server (vllm bench serve's JSON)")
    p.add_argument("--base-url", required=True, help="e.g. http://127.0.0.1:8000")
    p.add_argument("--model", help="model name (default: the server's first /v1/models entry)")
    p.add_argument("--dataset", "--dataset-name", default="random", choices=["random"])
    p.add_argument("--input-len", "--random-input-len", type=int, default=128)
    p.add_argument("--output-len", "--random-output-len", type=int, default=64)
    p.add_argument("--num-prompts", type=int, default=32)
    load = p.add_mutually_exclusive_group()
    load.add_argument("--request-rate", type=float, default=float("inf"), help="Poisson requests/s (default inf)")
    load.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--api-key", default=None)
    p.add_argument("--out", required=True, help="result JSON (a PNG of the latencies is written beside it)")
    p.add_argument("--no-plot", action="store_true")
    p.set_defaults(run=run_bench)


async def _one(client, url: str, body: dict, headers: dict) -> Result:
    r = Result()
    start = time.perf_counter()
    last = start
    try:
        async with client.stream("POST", url, json=body, headers=headers) as resp:
            if resp.status_code != 200:
                r.error = f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}"
                return r
            async for line in resp.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    r.error = str(chunk["error"])
                    return r
                if chunk.get("usage"):
                    r.output_tokens = chunk["usage"]["completion_tokens"]
                if not chunk.get("choices"):
                    continue
                now = time.perf_counter()
                if r.ttft == 0.0:
                    r.ttft = now - start
                else:
                    r.itl.append(now - last)
                last = now
        r.latency = time.perf_counter() - start
        r.ok = True
    except Exception as err:  # a failed request is counted, not fatal
        r.error = f"{type(err).__name__}: {err}"
    return r


async def _gather_with_progress(tasks: list, total: int) -> list[Result]:
    """asyncio.gather with a progress bar on stderr (tqdm, when installed)."""
    try:
        from tqdm import tqdm
    except ImportError:
        return list(await asyncio.gather(*tasks))
    with tqdm(total=total, desc="requests", unit="req", file=sys.stderr) as bar:
        for t in tasks:
            t.add_done_callback(lambda _: bar.update(1))
        return list(await asyncio.gather(*tasks))


def _stats(values: list[float], name: str, out: dict) -> None:
    a = np.asarray(values, dtype=float) * 1000.0 if values else np.zeros(1)
    out[f"mean_{name}_ms"] = float(a.mean())
    out[f"median_{name}_ms"] = float(np.median(a))
    out[f"std_{name}_ms"] = float(a.std())
    for p in (50, 90, 95, 99):
        out[f"p{p}_{name}_ms"] = float(np.percentile(a, p))


async def _bench(args: argparse.Namespace) -> dict:
    import httpx

    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    async with httpx.AsyncClient(base_url=args.base_url, timeout=httpx.Timeout(600.0), headers=headers) as client:
        model = args.model
        if model is None:
            model = (await client.get("/v1/models")).json()["data"][0]["id"]
        rng = random.Random(args.seed)
        prompts = [[rng.randrange(1000, 100000) for _ in range(args.input_len)] for _ in range(args.num_prompts)]
        limit = asyncio.Semaphore(args.max_concurrency or args.num_prompts)
        active = [0]
        peak = [0]

        async def run(prompt: list[int]) -> Result:
            async with limit:
                active[0] += 1
                peak[0] = max(peak[0], active[0])
                body = {
                    "model": model,
                    "prompt": prompt,
                    "max_tokens": args.output_len,
                    "stream": True,
                    "ignore_eos": True,
                    "temperature": 0.0,
                    "stream_options": {"include_usage": True},
                }
                try:
                    return await _one(client, "/v1/completions", body, {})
                finally:
                    active[0] -= 1

        tasks = []
        start = time.perf_counter()
        for p in prompts:
            tasks.append(asyncio.create_task(run(p)))
            if args.request_rate != float("inf"):
                await asyncio.sleep(rng.expovariate(args.request_rate))
        results = await _gather_with_progress(tasks, args.num_prompts)
        duration = time.perf_counter() - start
    ok = [r for r in results if r.ok]
    for r in ok:
        r.output_tokens = r.output_tokens or len(r.itl) + 1
    total_out = sum(r.output_tokens for r in ok)
    out: dict = {
        "date": time.strftime("%Y%m%d-%H%M%S"),
        "backend": "openai",
        "model_id": model,
        "num_prompts": args.num_prompts,
        "request_rate": args.request_rate if args.request_rate != float("inf") else "inf",
        "burstiness": 1.0,
        "max_concurrency": args.max_concurrency,
        "duration": duration,
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "total_input_tokens": args.input_len * len(ok),
        "total_output_tokens": total_out,
        "request_throughput": len(ok) / duration,
        "request_goodput": None,
        "output_throughput": total_out / duration,
        "total_token_throughput": (args.input_len * len(ok) + total_out) / duration,
        "max_concurrent_requests": peak[0],
        "input_lens": [args.input_len] * len(results),
        "output_lens": [r.output_tokens for r in results],
        "ttfts": [r.ttft for r in results],
        "itls": [r.itl for r in results],
        "errors": [r.error for r in results],
    }
    _stats([r.ttft for r in ok], "ttft", out)
    _stats([(r.latency - r.ttft) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1], "tpot", out)
    _stats([g for r in ok for g in r.itl], "itl", out)
    _stats([r.latency for r in ok], "e2el", out)
    return out


def _plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = {
        "TTFT": [t * 1e3 for t, e in zip(result["ttfts"], result["errors"], strict=True) if not e],
        "ITL": [g * 1e3 for itl in result["itls"] for g in itl],
        "E2E": [],
    }
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for name in ("TTFT", "ITL"):
        if series[name]:
            axes[0].hist(series[name], bins=40, alpha=0.6, label=f"{name} (median {np.median(series[name]):.1f} ms)")
    axes[0].set_xlabel("ms")
    axes[0].set_ylabel("count")
    axes[0].legend()
    axes[0].set_title("latency distributions")
    pct = [50, 90, 95, 99]
    for name in ("ttft", "tpot", "itl", "e2el"):
        axes[1].plot(pct, [result[f"p{p}_{name}_ms"] for p in pct], marker="o", label=name.upper())
    axes[1].set_xlabel("percentile")
    axes[1].set_ylabel("ms")
    axes[1].set_yscale("log")
    axes[1].legend()
    axes[1].set_title(f"{result['model_id']}: {result['completed']} requests")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run_bench(args: argparse.Namespace) -> int:
    for name in ("input_len", "output_len", "num_prompts"):
        if getattr(args, name) < 1:
            raise Dsv41rtError(f"--{name.replace('_', '-')} must be >= 1")
    if args.max_concurrency is not None and args.max_concurrency < 1:
        raise Dsv41rtError("--max-concurrency must be >= 1")
    if not args.request_rate > 0:
        raise Dsv41rtError("--request-rate must be > 0")
    try:
        import httpx  # noqa: F401
    except ImportError:
        raise Dsv41rtError("dsv41rt bench needs httpx (pip install 'dsv41rt[bench]')") from None
    result = asyncio.run(_bench(args))
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print("============ Serving Benchmark Result ============")
    for key in (
        "completed",
        "failed",
        "duration",
        "request_throughput",
        "output_throughput",
        "total_token_throughput",
        "mean_ttft_ms",
        "median_ttft_ms",
        "p99_ttft_ms",
        "mean_tpot_ms",
        "median_tpot_ms",
        "p99_tpot_ms",
        "mean_itl_ms",
        "median_itl_ms",
        "p99_itl_ms",
        "mean_e2el_ms",
        "median_e2el_ms",
        "p99_e2el_ms",
    ):
        v = result[key]
        print(f"{key:<28} {v:.2f}" if isinstance(v, float) else f"{key:<28} {v}")
    print(f"wrote {args.out}")
    if not args.no_plot:
        png = args.out.rsplit(".", 1)[0] + ".png"
        _plot(result, png)
        print(f"wrote {png}")
    return 0 if result["completed"] else 1
