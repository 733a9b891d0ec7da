"""The GPU executor against the CPU reference executor (same checkpoint, same caches, same prompts).

Marked `cuda`: skipped without a GPU, run on the H200 by bench/device_session.sh. The NeMo oracle
comparison of the GPU's logits is bench/cuda_oracle.py (the oracle packages live on the CPU side).

Tolerances, stated per mode:
- cache quantisation off: max |Δlogit| <= 1e-4 per position (the CPU-forward issue's FP32 bound;
  the GPU sums in a different order than the CPU, ~1e-6 relative per op);
- cache quantisation on: the same 1e-4 where both sides made the same rounding decisions; a cache
  value within an ulp of an FP8/FP4 rounding boundary can round the other way on the two devices,
  so a position may exceed it, bounded by 1e-2 and by at most 5% of the positions (measured
  numbers are in bench/results).
- row independence: chunked prefill, decode and batching give bitwise-identical logits on the GPU.
"""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.cuda

LENGTHS = (1, 7, 37, 200)
GEN = 16


def prompt_of(n: int) -> list[int]:
    return [0] + [int(t) for t in np.random.default_rng(1000 + n).integers(3, 129000, n - 1)]


def run_prompt(rt, prompt: list[int], gen: int, greedy: list[int] | None = None) -> tuple[np.ndarray, list[int]]:
    """Prefill + `gen` decode steps (greedy, or forced to `greedy` when given)."""
    h = rt.new_handle()
    logits = [rt.forward_tokens(h, prompt)]
    chosen = []
    for i in range(gen):
        chosen.append(int(np.argmax(logits[-1][-1])) if greedy is None else greedy[i])
        logits.append(rt.forward_tokens(h, [chosen[-1]]))
    rt.release_handle(h)
    return np.concatenate(logits), chosen


@pytest.fixture(scope="module", params=[True, False], ids=["quant-on", "quant-off"])
def pair(request, tiny_v41_dir):
    from dsv41rt.runtime import Runtime

    q = request.param
    return (
        q,
        Runtime(tiny_v41_dir, kv_cache_dtype="auto" if q else "float32"),
        Runtime(tiny_v41_dir, "cuda", kv_cache_dtype="auto" if q else "float32"),
    )


@pytest.mark.parametrize("n", LENGTHS)
def test_cuda_matches_cpu_prefill_and_decode(pair, n: int) -> None:
    quant, cpu, gpu = pair
    ours, greedy = run_prompt(gpu, prompt_of(n), GEN)
    ref, _ = run_prompt(cpu, prompt_of(n), GEN, greedy)  # the same tokens through the CPU caches
    diff = np.abs(ours - ref).max(-1)
    print(f"quant {quant} n {n}: GPU vs CPU max |Δ| {diff.max():.2e}, median {np.median(diff):.1e}")
    assert np.isfinite(ours).all()
    if not quant:
        assert diff.max() <= 1e-4, f"max |Δ| {diff.max():.3g} at position {int(diff.argmax())}"
    else:
        over = np.where(diff > 1e-4)[0]
        assert diff.max() <= 1e-2 and over.size <= 0.05 * diff.size, (
            f"{over.size}/{diff.size} positions over 1e-4 (max {diff.max():.3g} at {int(diff.argmax())})"
        )


def test_cuda_chunked_prefill_and_decode_are_bitwise_row_independent(tiny_v41_dir) -> None:
    from dsv41rt.runtime import Runtime

    gpu = Runtime(tiny_v41_dir, "cuda")
    p = prompt_of(150)
    h = gpu.new_handle()
    one_shot = gpu.forward_tokens(h, p)
    gpu.release_handle(h)
    for chunk in (1, 17, 64):
        h = gpu.new_handle()
        parts = [gpu.forward_tokens(h, p[i : i + chunk]) for i in range(0, len(p), chunk)]
        gpu.release_handle(h)
        assert np.array_equal(np.concatenate(parts), one_shot), f"chunk {chunk}"


def test_cuda_multistream_off_gives_identical_logits(tiny_v41_dir) -> None:
    from dsv41rt.runtime import Runtime

    p = prompt_of(120)
    on, _ = run_prompt(Runtime(tiny_v41_dir, "cuda", multistream=True), p, 8)
    off, _ = run_prompt(Runtime(tiny_v41_dir, "cuda", multistream=False), p, 8)
    assert np.array_equal(on, off)


def test_cuda_engine_batch_gives_the_tokens_of_each_request_alone(tiny_v41_dir) -> None:
    from dsv41rt.runtime import Runtime
    from numerics import generate_with_logprobs

    prompts = [prompt_of(n) for n in (1, 9, 40, 130, 77, 3)]
    alone = []
    for p in prompts:
        rt = Runtime(tiny_v41_dir, "cuda")
        alone += generate_with_logprobs(rt, [p], 12)
    rt = Runtime(tiny_v41_dir, "cuda", max_num_batched_tokens=64, max_num_seqs=4)
    together = generate_with_logprobs(rt, prompts, 12)
    assert together == alone  # tokens and logprobs, bit for bit
    assert rt.stats()["pages_used"] == 0


def test_cuda_graph_replay_equals_eager_bitwise(tiny_v41_dir) -> None:
    """Decode steps replayed from captured graphs give the eager executor's logits bit for bit.

    Why bitwise holds: a graph runs the padded plan of its bucket (more rows, entries and window
    slots, all masked), and every kernel computes a real row with the same operations in the same
    order whatever the padding (row-independent ops, per-entry indexer scores, masked entries
    never selected, attention summing its key slots in the same order).
    """
    from dsv41rt.runtime import Runtime

    graph, eager = Runtime(tiny_v41_dir, "cuda"), Runtime(tiny_v41_dir, "cuda", enforce_eager=True)
    for n, steps in ((37, 12), (250, 20)):  # the second crosses the 256-position bucket
        p = prompt_of(n)
        a, greedy = run_prompt(graph, p, steps)
        b, _ = run_prompt(eager, p, steps, greedy)
        assert np.array_equal(a, b), f"prompt {n}: max |Δ| {np.abs(a - b).max()}"
    s = graph.backend_stats()
    print(f"graph stats: {s}")
    assert s["graph_captures"] >= 2 and s["graph_replays"] >= 25
    assert eager.backend_stats()["graph_replays"] == 0
    assert graph.stats()["dequant_calls"] == eager.stats()["dequant_calls"]
    assert graph.stats()["reuse_hits"] == eager.stats()["reuse_hits"]


@pytest.mark.parametrize("precision", ("fp32", "fp8"))
def test_programmatic_launch_graphs_equal_plain_graphs_bitwise(tiny_v41_dir, precision: str) -> None:
    """Decode graphs whose kernel -> kernel edges are programmatic (the default for buckets of up
    to 8 items: each kernel's launch overlaps its predecessor's tail) give the logits and tokens
    of graphs with plain edges, bit for bit: every kernel of the library waits at its first
    statement for the grids before it (kernels/cuda/common.cuh pdl_entry), so no kernel reads
    anything earlier than in stream order. A kernel without that wait would race with its
    predecessor, which long decode runs at several batch sizes are meant to expose. Buckets over 8
    items keep plain edges."""
    from dsv41rt.runtime import Runtime
    from numerics import generate_with_logprobs

    kw = dict(precision=precision, max_num_seqs=16)
    pdl, plain = Runtime(tiny_v41_dir, "cuda", **kw), Runtime(tiny_v41_dir, "cuda", **kw)
    plain.set_switch("programmatic_launch", False)
    for n, steps in ((37, 12), (250, 20)):
        p = prompt_of(n)
        a, greedy = run_prompt(pdl, p, steps)
        b, _ = run_prompt(plain, p, steps, greedy)
        assert np.array_equal(a, b), f"prompt {n}: max |Δ| {np.abs(a - b).max()}"
    for requests in (3, 7):
        prompts = [prompt_of(5 + 17 * i) for i in range(requests)]
        assert generate_with_logprobs(pdl, prompts, 24) == generate_with_logprobs(plain, prompts, 24)
    # The bucket rule, on direct handles (every step exactly 12, then 5, items): a 16-item graph
    # keeps plain edges, an 8-item one gets programmatic ones. (Engine batches are not used here:
    # staggered admissions give steps of any size.)
    src = pdl.new_handle()
    pdl.forward_tokens(src, prompt_of(30), all_logits=False)
    handles = [src] + [pdl.fork_handle(src) for _ in range(11)]
    edges = pdl.backend_stats()["programmatic_edges"]
    for t in range(3):
        pdl.decode_handles_greedy(handles, [7 + t] * 12)
    assert pdl.backend_stats()["programmatic_edges"] == edges
    for t in range(3):
        pdl.decode_handles_greedy(handles[:5], [9 + t] * 5)
    assert pdl.backend_stats()["programmatic_edges"] > edges
    for h in handles:
        pdl.release_handle(h)
    s, t = pdl.backend_stats(), plain.backend_stats()
    print(f"{precision}: programmatic edges {s['programmatic_edges']} over {s['graph_captures']} captures")
    assert s["graph_replays"] > 0 and t["graph_replays"] > 0
    assert s["programmatic_edges"] > 0 and t["programmatic_edges"] == 0


def test_cuda_graph_batched_decode_matches_eager(tiny_v41_dir) -> None:
    from dsv41rt.runtime import Runtime

    prompts = [prompt_of(n) for n in (5, 33, 90, 140, 12)]
    from numerics import generate_with_logprobs

    graph = Runtime(tiny_v41_dir, "cuda", max_num_seqs=8)
    eager = Runtime(tiny_v41_dir, "cuda", max_num_seqs=8, enforce_eager=True)
    assert generate_with_logprobs(graph, prompts, 20) == generate_with_logprobs(eager, prompts, 20)
    assert graph.backend_stats()["graph_replays"] > 0


def test_cuda_sampled_decode_replays_graphs_and_equals_eager(tiny_v41_dir) -> None:
    """Tokens drawn on the device (temperature, top-k/p, penalties, seeds, top logprobs) are the
    same whether the decode step is replayed from a graph or run eagerly."""
    from dsv41rt.runtime import Runtime
    from dsv41rt.sampling import SamplingParams

    sp = SamplingParams(temperature=0.8, top_k=50, top_p=0.9, repetition_penalty=1.1, seed=11, top_logprobs=3)
    prompts = [prompt_of(n) for n in (6, 40, 100)]

    def run(rt):
        ids = [rt.add_request(p, 10, sp, ignore_eos=True) for p in prompts]
        out: dict[int, list] = {i: [] for i in ids}
        while rt.has_unfinished():
            for o in rt.step():
                out[o.request_id] += list(zip(o.new_tokens, o.logprobs, o.top_logprobs, strict=True))
        return [out[i] for i in ids]

    graph = Runtime(tiny_v41_dir, "cuda", max_num_seqs=4)
    eager = Runtime(tiny_v41_dir, "cuda", max_num_seqs=4, enforce_eager=True)
    assert run(graph) == run(eager)
    assert graph.backend_stats()["graph_replays"] > 0 and eager.backend_stats()["graph_replays"] == 0


def stored_bytes(checkpoint: str, skip_prefixes: tuple[str, ...]) -> int:
    """Bytes of the tensors in the checkpoint's safetensors files, as stored (codes + scales)."""
    import glob
    import json
    import os
    import struct

    total = 0
    for path in glob.glob(os.path.join(checkpoint, "*.safetensors")):
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        for name, info in header.items():
            if name != "__metadata__" and not name.startswith(skip_prefixes):
                total += info["data_offsets"][1] - info["data_offsets"][0]
    return total


def test_cuda_weights_stay_in_their_released_formats(tiny_v41_dir) -> None:
    """The GPU holds the checkpoint's FP8 / MXFP4 / BF16 matrices as stored (no BF16 expansion):
    device weight bytes within 5% of the stored bytes of the tensors the executor loads (the
    draft stages `mtp.*` are not loaded; FP32 vectors stored BF16 double, a few KB here)."""
    from dsv41rt.runtime import Runtime

    gpu = Runtime(tiny_v41_dir, "cuda")
    held = gpu.backend_stats()["weight_bytes"]
    stored = stored_bytes(tiny_v41_dir, ("mtp.",))
    print(f"device weight bytes {held:,}, checkpoint bytes of the loaded tensors {stored:,}")
    assert 0.95 * stored <= held <= 1.05 * stored
