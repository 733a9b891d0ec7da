"""`dsv41rt serve` over a tensor/expert-parallel group with one process per rank (CPU, TCP):
it answers like one rank, and when a worker process dies the server answers 503 (naming the
failure) instead of hanging, and exits on SIGTERM."""

from __future__ import annotations

import os
import signal
import time

import httpx
import pytest
from serve_harness import LiveServer

MODEL = "dsv41rt-tiny-v41"


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (from /proc: no psutil)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry))
    return found


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("builtin") / "tiny-v41-seed0")


def test_a_killed_worker_makes_the_server_answer_503_and_sigterm_ends_it(tiny_dir: str) -> None:
    one = LiveServer(model_dir=tiny_dir)
    body = {"model": MODEL, "prompt": [0, 11, 12, 13], "max_tokens": 4, "temperature": 0, "ignore_eos": True}
    try:
        want = httpx.post(one.url + "/v1/completions", json=body, timeout=120).json()["choices"][0]["text"]
    finally:
        assert one.stop() == 0, one.output()
    server = LiveServer(
        "--tensor-parallel-size",
        "2",
        "--expert-parallel-size",
        "2",
        "--context-parallel-processes",
        "true",
        model_dir=tiny_dir,
    )
    try:
        r = httpx.post(server.url + "/v1/completions", json=body, timeout=120)
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == want, r.text
        workers = children(server.proc.pid)
        assert len(workers) == 1, workers  # rank 1
        os.kill(workers[0], signal.SIGKILL)
        deadline, statuses = time.monotonic() + 30, []
        while time.monotonic() < deadline:
            r = httpx.post(server.url + "/v1/completions", json=body, timeout=30)
            statuses.append(r.status_code)
            if r.status_code == 503:
                break
        assert statuses[-1] == 503, statuses
        assert "the engine failed" in r.json()["error"]["message"] and "rank 1" in r.json()["error"]["message"], r.text
        assert httpx.get(server.url + "/health", timeout=10).status_code == 503
    finally:
        start = time.monotonic()
        code = server.stop()
        assert time.monotonic() - start < 30, server.output()
    assert code != 0 and "worker processes failed" in server.output(), (code, server.output())
