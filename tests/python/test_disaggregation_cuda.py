"""Prefill/decode disaggregation on one GPU (issue 26): a prefill and a decode server process on the
same CUDA device, the state lent and read in device memory (`handoff-memory: device`, NIXL VRAM;
UCX moves it with CUDA IPC between the two processes). The router's answers equal the decode
server's own, bitwise in tokens and logprobs, for 16 prompts of 1..300 tokens."""

from __future__ import annotations

import re
import time

import httpx
import pytest
from serve_harness import LiveServer
from test_disaggregation import LENGTHS, MODEL, Router, assert_routed_equals_direct, metric

pytestmark = pytest.mark.cuda


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("builtin") / "tiny-v41-seed0")


def test_two_servers_on_one_gpu_hand_off_in_device_memory(tiny_dir, monkeypatch) -> None:
    # UCX prints the protocols it selects (the transport, e.g. cuda_ipc, on each line).
    monkeypatch.setenv("UCX_PROTO_INFO", "y")
    flags = ("--device", "cuda", "--handoff-memory", "device")
    prefill = LiveServer("--disaggregation-mode", "prefill", *flags, model_dir=tiny_dir)
    decode = LiveServer("--disaggregation-mode", "decode", *flags, model_dir=tiny_dir)
    router = Router([prefill.url], [decode.url])
    try:
        assert_routed_equals_direct(router, decode, LENGTHS, seed=26, max_tokens=8, logprobs=3)
        text = httpx.get(decode.url + "/metrics", timeout=10).text
        assert f'handoff_transfer_seconds_count{{model_name="{MODEL}",transport="nixl"}} {float(len(LENGTHS))}' in text
        seconds = metric(decode, "handoff_transfer_seconds_sum")
        moved = metric(decode, "handoff_received_bytes_total")
        each = 1e3 * seconds / len(LENGTHS)
        print(f"\n{len(LENGTHS)} handoffs in device memory: {moved / 1e6:.2f} MB, {each:.2f} ms each")
        deadline = time.monotonic() + 10
        while metric(prefill, "handoff_lent_states") != 0:
            assert time.monotonic() < deadline, "the prefill server still holds lent states"
            time.sleep(0.1)
    finally:
        router.stop()
        assert decode.stop() == 0, decode.output()
        assert prefill.stop() == 0, prefill.output()
    # What UCX chose for the reads (printed for the record: the protocol lines name the transport).
    lines = [ln.strip() for ln in decode.output().splitlines() if re.search(r"cuda|rma|get", ln, re.IGNORECASE)]
    print("\n".join(lines[:20]))
