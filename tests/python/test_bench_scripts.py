"""The issue-9 benchmark script runs end to end on the CPU (its `--cpu` smoke mode: rank processes
over TCP) and writes the JSON the results pages quote, so it cannot rot between device sessions."""

from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_cp_prefill_bench_cpu_smoke_writes_medians_and_metadata(tiny_v41_dir, tmp_path) -> None:
    out = tmp_path / "cp.json"
    cmd = [sys.executable, os.path.join(ROOT, "bench", "cp_prefill_bench.py"), "--checkpoint", tiny_v41_dir]
    cmd += [
        "--cpu",
        "--processes",
        "--tokens",
        "40",
        "--cp1-tokens",
        "40",
        "--budget",
        "32",
        "--repeats",
        "2",
        "--warmup",
        "16",
    ]
    cmd += ["--out", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=dict(os.environ, DSV41RT_COMMIT="abc1234"))
    assert r.returncode == 0, r.stderr[-2000:]
    data = json.loads(out.read_text())
    meta = data["meta"]
    assert meta["commit"] == "abc1234" and meta["mode"] == "one process per GPU" and meta["date"]
    assert [(row["cp"], row["tokens"], row["repeats"]) for row in data["rows"]] == [(2, 40, 2), (1, 40, 2)]
    for row in data["rows"]:
        assert len(row["runs_ms"]) == 2 and row["ms"] > 0
        assert min(row["runs_ms"]) <= round(row["ms"], 1) <= max(row["runs_ms"])  # the median
    assert "CP 2 prefill     40" in r.stdout and "CP 1 prefill     40" in r.stdout


def test_executor_bench_cpu_smoke_reports_floor_and_weight_bytes(tiny_v41_dir, tmp_path) -> None:
    """bench_executor.py on the CPU (precision bf16, so its FP32-GEMM decode mode switches tensor
    cores off and on): every decode row carries its released-format floor, the JSON the weight bytes."""
    out = tmp_path / "exec.json"
    cmd = [sys.executable, os.path.join(ROOT, "bench", "bench_executor.py"), "--checkpoint", tiny_v41_dir]
    cmd += ["--device", "cpu", "--precision", "bf16", "--prefill", "8", "--contexts", "16"]
    cmd += ["--batches", "1,2", "--steps", "2", "--repeats", "1", "--out", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    data = json.loads(out.read_text())
    assert data["precision"] == "bf16" and data["checkpoint_loaded_bytes"] > 0
    modes = {row["mode"] for row in data["decode"]}
    assert "fp32 gemm" in modes and "default" in modes
    for row in data["decode"]:
        assert row["floor_bytes"] > 0 and row["roofline_ms"] > 0 and row["median_ms"] > 0
    # More requests touch more experts: the floor grows with the batch.
    floors = {row["batch"]: row["floor_bytes"] for row in data["decode"] if row["mode"] == "default"}
    assert floors[2] > floors[1]
