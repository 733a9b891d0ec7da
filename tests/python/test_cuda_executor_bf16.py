"""The GPU executor's `precision="bf16"` mode (tensor-core GEMMs) against the FP32 CPU reference.

The kernels themselves are checked tightly against float64 emulations of the same roundings
(test_cuda_ops_gemm_tc.py). End to end the check is statistical, per position p:
err(p) = max |Δlogit| / max |logit|. BF16 rounding of every GEMM input (relative 2^-9 per element)
feeds many discrete decisions (indexer top-k, expert routing, FP8/FP4 cache rounding); on this
random tiny model they flip often and a flipped position moves by up to its scale. Measured on
the H200 (2026-11-29): prompt 37 median 1.7e-2, 92% of positions <= 6e-2, max 0.23; prompt 200
median 5.0e-2, 58% <= 6e-2, max 0.35. (A first bound of max <= 3e-2, set before any measurement,
ignored the flips.) Bound: median <= 0.1 and 90% of positions <= 0.25; a wrong operand layout, a
dropped expert or a misplaced row moves every position by O(1) and fails it. Decode forwards of
<= 8 rows use the FP32 kernels. Graph == eager stays bitwise (the GEMM choice is per forward and
never straddles a graph bucket).
"""

from __future__ import annotations

import numpy as np
import pytest
from test_cuda_executor import prompt_of, run_prompt


@pytest.mark.cuda
@pytest.mark.parametrize("n", (37, 200))
def test_bf16_precision_matches_cpu_within_bf16_bound(tiny_v41_dir, n: int) -> None:
    from dsv41rt.runtime import Runtime

    gpu = Runtime(tiny_v41_dir, "cuda", precision="bf16")
    ours, greedy = run_prompt(gpu, prompt_of(n), 12)
    ref, _ = run_prompt(Runtime(tiny_v41_dir), prompt_of(n), 12, greedy)
    assert np.isfinite(ours).all()
    scale = np.abs(ref).max(-1)
    err = np.abs(ours - ref).max(-1) / scale
    within = float(np.mean(err <= 0.25))
    print(
        f"bf16 n {n}: err median {np.median(err):.2e}, {100 * np.mean(err <= 6e-2):.0f}% of positions <= 6e-2, "
        f"{100 * within:.0f}% <= 0.25, max {err.max():.2e} at {int(err.argmax())}"
    )
    assert np.median(err) <= 0.1 and within >= 0.9, (float(np.median(err)), within)
    assert gpu.backend_stats()["bf16_gemm"] == 1


@pytest.mark.cuda
@pytest.mark.parametrize("requests", (5, 12))
def test_bf16_graph_batched_decode_matches_eager(tiny_v41_dir, requests: int) -> None:
    """5 requests decode on the FP32 kernels (bucket 8), 12 on tensor cores (bucket 16)."""
    from dsv41rt.runtime import Runtime

    prompts = [prompt_of(3 + 11 * i) for i in range(requests)]
    kw = dict(max_running=16, precision="bf16")
    graph = Runtime(tiny_v41_dir, "cuda", **kw)
    eager = Runtime(tiny_v41_dir, "cuda", cuda_graphs=False, **kw)
    a = graph.generate(prompts, max_new_tokens=16, ignore_eos=True)
    b = eager.generate(prompts, max_new_tokens=16, ignore_eos=True)
    assert a == b
    assert graph.backend_stats()["graph_replays"] > 0


def first_divergent_row(a: dict[str, np.ndarray], b: dict[str, np.ndarray], n: int) -> int:
    """The first prefill row at which two runs' recorded discrete decisions (indexer top-k and
    routed experts of every layer) differ; n when none do. A row's decisions shape only itself
    and later rows (causal attention), so rows before it saw identical decisions on both sides."""
    assert sorted(a) == sorted(b), (sorted(a), sorted(b))
    first = n
    for key in a:
        x, y = np.asarray(a[key]).reshape(n, -1), np.asarray(b[key]).reshape(n, -1)
        assert x.shape == y.shape, (key, x.shape, y.shape)
        differ = np.flatnonzero((x != y).any(-1))
        if differ.size:
            first = min(first, int(differ[0]))
    return first


@pytest.mark.cuda
@pytest.mark.parametrize("n", (37, 200))
def test_bf16_gpu_matches_the_cpu_emulation_far_better_than_fp32(tiny_v41_dir, n: int) -> None:
    """The CPU executor emulates precision "bf16" (the same GEMM inputs, MoE hidden units included,
    rounded to BF16 for the same matrices under the same per-forward choice). On the prefill rows
    before the first discrete decision (indexer top-k, expert routing) on which the GPU and the
    emulation part, the GPU's deviation from the emulation must be at least 10x smaller (median
    over those rows) than its deviation from FP32: it fails when the GPU rounds anything the
    emulation does not (or the other way round), because then the two differ by BF16-sized
    amounts as bf16 and fp32 do. Measured on the H200 (7410ea2), over all rows and the decode
    steps: n 37 median 1.4e-3 vs 1.7e-2 (before the emulation rounded the MoE: 1.6e-2, the
    mismatch this test exists to catch); n 200 2.5e-2 vs 5.0e-2, as near-tie top-8 selections
    flip between the two and the flipped rows move by BF16-FP32 amounts, hence the cut at the
    first differing decision (at least 8 rows must precede it)."""
    from dsv41rt.runtime import Runtime

    p = prompt_of(n)
    runs = {}
    for name, rt in (
        ("gpu", Runtime(tiny_v41_dir, "cuda", precision="bf16", record_decisions=True)),
        ("emul", Runtime(tiny_v41_dir, precision="bf16", record_decisions=True)),
        ("fp32", Runtime(tiny_v41_dir)),
    ):
        h = rt.new_handle()
        runs[name] = (rt.forward_tokens(h, p), rt.decisions())
        rt.release_handle(h)
    (ours, d_gpu), (emul, d_emul), (fp32, _) = runs["gpu"], runs["emul"], runs["fp32"]
    first = first_divergent_row(d_gpu, d_emul, n)
    scale = np.abs(fp32[:first]).max(-1)
    to_emul = np.abs(ours[:first] - emul[:first]).max(-1) / scale
    to_fp32 = np.abs(ours[:first] - fp32[:first]).max(-1) / scale
    print(
        f"bf16 n {n}: decisions identical on rows [0, {first}); there GPU vs CPU emulation median "
        f"{np.median(to_emul):.2e} (max {to_emul.max():.2e}), GPU vs FP32 median {np.median(to_fp32):.2e}"
    )
    assert first >= 8, f"the GPU and the emulation already part at row {first}"
    assert np.median(to_emul) <= 0.1 * np.median(to_fp32), (np.median(to_emul), np.median(to_fp32))


def test_first_divergent_row_finds_the_earliest_row_of_any_layer() -> None:
    a = {"topk_L2": np.arange(12), "experts_L0": np.zeros(8, np.int32)}
    b = {"topk_L2": np.arange(12), "experts_L0": np.zeros(8, np.int32)}
    assert first_divergent_row(a, b, 4) == 4
    b["topk_L2"] = np.where(np.arange(12) == 10, -1, np.arange(12))  # row 3 of [4, 3]
    assert first_divergent_row(a, b, 4) == 3
    b["experts_L0"] = np.asarray([0, 0, 5, 0, 0, 0, 0, 0])  # row 1 of [4, 2]
    assert first_divergent_row(a, b, 4) == 1
    with pytest.raises(AssertionError):
        first_divergent_row(a, {"topk_L2": a["topk_L2"]}, 4)


def test_cpu_bf16_emulation_switches_per_forward(tiny_v41_dir) -> None:
    """CPU precision "bf16": a forward of <= 8 rows is the FP32 one (bitwise); one of 9+ rows rounds
    its GEMM inputs (different logits, within BF16 distance of FP32)."""
    from dsv41rt.runtime import Runtime

    fp32, bf16 = Runtime(tiny_v41_dir), Runtime(tiny_v41_dir, precision="bf16")
    for n, same in ((8, True), (40, False)):
        p = prompt_of(n)
        a, b = fp32.score(p), bf16.score(p)
        assert np.array_equal(a, b) == same, n
        if not same:
            err = np.abs(a - b).max(-1) / np.abs(a).max(-1)
            assert 0 < np.median(err) <= 0.1, np.median(err)


def test_precision_is_checked_at_load(tiny_v41_dir) -> None:
    from dsv41rt.errors import Dsv41rtError
    from dsv41rt.runtime import Runtime

    with pytest.raises(Dsv41rtError, match="unknown precision 'fp8'"):
        Runtime(tiny_v41_dir, "cpu", precision="fp8")
