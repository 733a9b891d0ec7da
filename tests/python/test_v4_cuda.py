"""A DeepSeek-V4 checkpoint on the GPU against the CPU reference executor (docs/design/v4.md).

Marked `cuda`: skipped without a GPU (failing instead under DSV41RT_REQUIRE_CUDA=1). V4 runs in
precision fp32 with FP32 caches and without the prefix cache on every backend, so the V4.1 GPU
test's fp32 rule applies unchanged (tests/python/test_cuda_executor.py, cache quantisation off):
max |Δlogit| <= 1e-4 per position, the CPU fed the GPU's greedy tokens so that every row of the two
runs sees the same inputs. The row where the CPU's own greedy choice would first have differed is
printed, not excused: the bound holds on every row before and after it.

Quantised caches (kv_cache_dtype auto: 584-byte rows, Hadamard-rotated MXFP4 index keys):
tests/python/test_v4_cuda_quant.py.

Graph == eager: decode steps replayed from captured graphs give the eager executor's logits bit for
bit, as for V4.1 (test_cuda_graph_replay_equals_eager_bitwise): the V4 ops skip a graph's padding
items and rows and compute each real row with the same operations whatever the bucket.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from test_cuda_executor import prompt_of, run_prompt

pytestmark = pytest.mark.cuda

LENGTHS = (1, 7, 37, 200)  # one token; the window of 8; many CSA groups; an HCA group at 128
GEN = 32
V4_OPTIONS = dict(kv_cache_dtype="float32", enable_prefix_caching=False)


@pytest.fixture(scope="module")
def pair(tiny_v4_dir: str) -> tuple[Any, Any]:
    from dsv41rt.runtime import Runtime

    return Runtime(tiny_v4_dir, **V4_OPTIONS), Runtime(tiny_v4_dir, "cuda", **V4_OPTIONS)


@pytest.mark.parametrize("n", LENGTHS)
def test_v4_cuda_matches_cpu_prefill_and_decode(pair: tuple[Any, Any], n: int) -> None:
    cpu, gpu = pair
    assert gpu.device.startswith("cuda")
    ours, greedy = run_prompt(gpu, prompt_of(n), GEN)
    ref, _ = run_prompt(cpu, prompt_of(n), GEN, greedy)  # the same tokens through the CPU caches
    diff = np.abs(ours - ref).max(-1)
    # Rows n-1 .. n+GEN-2 chose the next token: where would the CPU have chosen another first?
    cpu_choice = ref[n - 1 : n - 1 + GEN].argmax(-1)
    parted = np.flatnonzero(cpu_choice != np.asarray(greedy))
    first = int(parted[0]) if parted.size else None
    print(f"n {n}: GPU vs CPU max |Δ| {diff.max():.2e}, median {np.median(diff):.1e}")
    print(f"n {n}: first step where the CPU's greedy choice differs: {first}")
    assert np.isfinite(ours).all()
    assert diff.max() <= 1e-4, f"max |Δ| {diff.max():.3g} at position {int(diff.argmax())}"


def test_v4_cuda_graph_replay_equals_eager_bitwise(tiny_v4_dir: str) -> None:
    from dsv41rt.runtime import Runtime

    graph = Runtime(tiny_v4_dir, "cuda", **V4_OPTIONS)
    eager = Runtime(tiny_v4_dir, "cuda", enforce_eager=True, **V4_OPTIONS)
    for n, steps in ((37, 12), (250, 20)):  # the second crosses the 256-position bucket
        p = prompt_of(n)
        a, greedy = run_prompt(graph, p, steps)
        b, _ = run_prompt(eager, p, steps, greedy)
        assert np.array_equal(a, b), f"prompt {n}: max |Δ| {np.abs(a - b).max()}"
    s = graph.backend_stats()
    print(f"graph stats: {s}")
    assert s["graph_captures"] >= 2 and s["graph_replays"] >= 25
    assert eager.backend_stats()["graph_replays"] == 0


def test_v4_cuda_batched_graph_decode_matches_eager(tiny_v4_dir: str) -> None:
    """Several requests per decode graph (padding items in the bucket, compressor groups completing
    at different steps) give the eager tokens and logprobs bit for bit."""
    from dsv41rt.runtime import Runtime
    from numerics import generate_with_logprobs

    prompts = [prompt_of(n) for n in (5, 33, 126, 140, 12)]
    graph = Runtime(tiny_v4_dir, "cuda", max_num_seqs=8, **V4_OPTIONS)
    eager = Runtime(tiny_v4_dir, "cuda", max_num_seqs=8, enforce_eager=True, **V4_OPTIONS)
    assert generate_with_logprobs(graph, prompts, 20) == generate_with_logprobs(eager, prompts, 20)
    assert graph.backend_stats()["graph_replays"] > 0


def test_v4_cuda_is_fp32_only(tiny_v4_dir: str) -> None:
    from dsv41rt.runtime import Runtime

    for precision in ("bf16", "fp8"):
        with pytest.raises(Exception, match="fp32 only"):
            Runtime(tiny_v4_dir, "cuda", precision=precision, **V4_OPTIONS)
