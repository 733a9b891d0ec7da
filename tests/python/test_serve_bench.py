"""`dsv41rt bench` against a live tiny server: vLLM's `bench serve` JSON keys and a PNG plot."""

from __future__ import annotations

import json
import subprocess
import sys

from serve_harness import LiveServer

# The keys `vllm bench serve --save-result` writes (serving-conventions.md §3.1), minus
# max_output_tokens_per_s (a per-second peak vLLM derives from its own timeline).
VLLM_KEYS = {
    "date",
    "backend",
    "model_id",
    "num_prompts",
    "request_rate",
    "burstiness",
    "max_concurrency",
    "duration",
    "completed",
    "failed",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "request_goodput",
    "output_throughput",
    "total_token_throughput",
    "max_concurrent_requests",
    "input_lens",
    "output_lens",
    "ttfts",
    "itls",
    "errors",
} | {f"{s}_{m}_ms" for s in ("mean", "median", "std", "p99") for m in ("ttft", "tpot", "itl", "e2el")}


def test_bench_writes_vllm_json_and_plot(tmp_path) -> None:
    server = LiveServer(model_dir=str(tmp_path / "tiny"))
    try:
        out = tmp_path / "result.json"
        cmd = [
            sys.executable,
            "-m",
            "dsv41rt",
            "bench",
            "--base-url",
            server.url,
            "--input-len",
            "32",
            "--output-len",
            "8",
            "--num-prompts",
            "6",
            "--max-concurrency",
            "3",
            "--out",
            str(out),
        ]
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stdout + run.stderr
        assert "Serving Benchmark Result" in run.stdout
        result = json.loads(out.read_text())
        assert VLLM_KEYS <= set(result), VLLM_KEYS - set(result)
        assert result["completed"] == 6 and result["failed"] == 0
        assert result["total_output_tokens"] == 48 and result["total_input_tokens"] == 6 * 32
        assert result["max_concurrent_requests"] <= 3
        assert 0 < result["median_ttft_ms"] <= result["median_e2el_ms"]
        png = (tmp_path / "result.png").read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n"
    finally:
        assert server.stop() == 0
