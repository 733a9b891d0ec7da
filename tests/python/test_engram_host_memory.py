"""Engram tables in host memory (`engram_host_memory`, issue 20): the device's gathers read the
same bytes over PCIe, so logits and greedy tokens are bitwise those of device-resident tables; the
tables leave device memory (backend_stats weight_bytes) for host memory (weight_host_bytes), the
two adding up to the same total. By default the device reads the checkpoint file's own pages in
place (registered once per process: weight_host_in_place_bytes; the page cache holds them once per
host), so virtual ranks of one process share them; DSV41RT_ENGRAM_REGISTER=0 takes one pinned copy
per process instead. The CPU backend has only host memory: the option changes nothing there."""

from __future__ import annotations

import numpy as np
import pytest

PROMPTS = (7, 201)


def prompt_of(n: int) -> list[int]:
    return [0] + [int(t) for t in np.random.default_rng(8100 + n).integers(3, 129000, n - 1)]


def run(path: str, device: str, host: bool, **group):
    from dsv41rt.runtime import Runtime

    rt = Runtime(path, device, precision="fp8", kv_memory=256 << 20, max_num_seqs=4, engram_host_memory=host, **group)
    logits = [rt.score(prompt_of(n)) for n in PROMPTS]
    tokens = rt.generate([prompt_of(n) for n in PROMPTS], max_new_tokens=16, ignore_eos=True)
    stats = rt.backend_stats()
    rt.close()
    return logits, tokens, stats


@pytest.mark.cuda
@pytest.mark.parametrize(
    ("switch", "in_place"),
    [("0", False), ("1", True), (None, True)],
    ids=["pinned copy", "registered in place", "default: in place"],
)
def test_host_tables_give_the_device_tables_bits(
    tiny_v41_dir: str, switch: str | None, in_place: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    dev_logits, dev_tokens, dev = run(tiny_v41_dir, "cuda", False)
    if switch is None:
        monkeypatch.delenv("DSV41RT_ENGRAM_REGISTER", raising=False)
    else:
        monkeypatch.setenv("DSV41RT_ENGRAM_REGISTER", switch)
    host_logits, host_tokens, host = run(tiny_v41_dir, "cuda", True)
    for n, a, b in zip(PROMPTS, dev_logits, host_logits, strict=True):
        assert np.array_equal(a, b), f"prompt {n}: max |Δ| {np.abs(a - b).max()}"
    assert host_tokens == dev_tokens
    assert dev["weight_host_bytes"] == 0 and host["weight_host_bytes"] > 0
    assert host["weight_bytes"] + host["weight_host_bytes"] == dev["weight_bytes"]
    # In place: read from the checkpoint's mapping, not copied (Linux, unified addressing).
    assert host["weight_host_in_place_bytes"] == (host["weight_host_bytes"] if in_place else 0), host


@pytest.mark.cuda
def test_virtual_ranks_share_the_registered_tables(tiny_v41_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tensor-parallel virtual ranks of one process each read every Engram table: the pages are
    registered once and both ranks read them in place; the tokens are the one-rank ones (TP is
    bitwise on CUDA)."""
    _, want_tokens, _ = run(tiny_v41_dir, "cuda", False)
    monkeypatch.setenv("DSV41RT_ENGRAM_REGISTER", "1")
    logits, tokens, stats = run(tiny_v41_dir, "cuda", True, tensor_parallel_size=2)
    assert tokens == want_tokens
    assert stats["weight_host_in_place_bytes"] == stats["weight_host_bytes"] > 0, stats


def test_the_cpu_backend_ignores_the_option(tiny_v41_dir: str) -> None:
    a_logits, a_tokens, _ = run(tiny_v41_dir, "cpu", False)
    b_logits, b_tokens, stats = run(tiny_v41_dir, "cpu", True)
    assert all(np.array_equal(a, b) for a, b in zip(a_logits, b_logits, strict=True)) and a_tokens == b_tokens
    assert stats["weight_host_bytes"] == 0
