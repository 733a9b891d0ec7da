"""The GPU's `precision="fp8"` mode (the official inference numerics, spec 5.2: FP8 activations in
1x32 blocks with power-of-two scales for every FP8/FP4 matrix and the MoE's hidden units) against the
CPU emulation of that mode, by the method of test_cuda_executor_bf16.py: on the prefill rows before
the first discrete decision on which the two part, the GPU's deviation from the emulation must be at
least 10x smaller (median) than its deviation from FP32, with at least 8 rows before that decision.

Negative controls: the GPU (or, in CI, the CPU) running precision "bf16" must fail the comparison
with the fp8 emulation, and the GPU in fp8 must fail it against the bf16 emulation: the comparison
tells the two modes apart. Graph == eager stays bitwise.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_cuda_executor import prompt_of
from test_cuda_executor_bf16 import emulation_mismatch, prefill


@pytest.fixture(scope="module")
def references(tiny_v41_dir):
    """The CPU emulations of precision fp8 and bf16 and the FP32 reference, per prompt length."""
    from dsv41rt.runtime import Runtime

    fp8 = Runtime(tiny_v41_dir, precision="fp8", record_decisions=True)
    bf16 = Runtime(tiny_v41_dir, precision="bf16", record_decisions=True)
    fp32 = Runtime(tiny_v41_dir)
    return {
        n: {"fp8": prefill(fp8, prompt_of(n)), "bf16": prefill(bf16, prompt_of(n)), "fp32": fp32.score(prompt_of(n))}
        for n in (37, 200)
    }


@pytest.mark.cuda
@pytest.mark.parametrize("n", (37, 200))
def test_fp8_gpu_matches_the_cpu_emulation_far_better_than_fp32(tiny_v41_dir, references, n: int) -> None:
    from dsv41rt.runtime import Runtime

    gpu = Runtime(tiny_v41_dir, "cuda", precision="fp8", record_decisions=True)
    r = references[n]
    ours = prefill(gpu, prompt_of(n))
    why = emulation_mismatch(ours, r["fp8"], r["fp32"], n)
    assert why is None, why
    # Negative control: the same GPU run is not the bf16 mode's emulation.
    assert emulation_mismatch(ours, r["bf16"], r["fp32"], n) is not None


@pytest.mark.cuda
def test_bf16_gpu_fails_the_fp8_comparison(tiny_v41_dir, references) -> None:
    from dsv41rt.runtime import Runtime

    gpu = Runtime(tiny_v41_dir, "cuda", precision="bf16", record_decisions=True)
    r = references[37]
    why = emulation_mismatch(prefill(gpu, prompt_of(37)), r["fp8"], r["fp32"], 37)
    assert why is not None, "the fp8 comparison accepts the bf16 mode"


@pytest.mark.cuda
@pytest.mark.parametrize("requests", (5, 12, 70))
def test_fp8_graph_batched_decode_matches_eager(tiny_v41_dir, requests: int) -> None:
    """5 and 12 requests (buckets 8 and 16): decode-sized forwards, FP8 tensor-core GEMVs; 70
    (bucket 128): a decode batch over 64 rows, on the unstaged kernels in graph and eager alike."""
    from dsv41rt.runtime import Runtime

    prompts = [prompt_of(3 + 11 * i) for i in range(requests)]
    kw = dict(max_num_seqs=128 if requests > 16 else 16, precision="fp8")
    graph = Runtime(tiny_v41_dir, "cuda", **kw)
    eager = Runtime(tiny_v41_dir, "cuda", enforce_eager=True, **kw)
    a = graph.generate(prompts, max_new_tokens=16, ignore_eos=True)
    b = eager.generate(prompts, max_new_tokens=16, ignore_eos=True)
    assert a == b
    assert graph.backend_stats()["graph_replays"] > 0


@pytest.mark.parametrize("mode", ("fp8", "bf16"))
def test_fp8_comparison_with_a_cpu_stand_in(tiny_v41_dir, references, mode: str) -> None:
    """The comparison's logic on the CPU (in CI): the fp8 emulation itself passes, bf16 fails."""
    from dsv41rt.runtime import Runtime

    r = references[37]
    model = Runtime(tiny_v41_dir, precision=mode, record_decisions=True)
    why = emulation_mismatch(prefill(model, prompt_of(37)), r["fp8"], r["fp32"], 37)
    assert (why is None) == (mode == "fp8"), why


def test_cpu_fp8_emulation_quantises_every_forward(tiny_v41_dir) -> None:
    """CPU precision "fp8": every forward, one row or many, quantises its FP8/FP4 GEMM inputs
    (logits differ from both FP32 and bf16, and lie further from FP32 than bf16's do: A8 is the
    coarser rounding, bench/a8_vs_a16_error.py), as the GPU's decode and prefill kernels do."""
    from dsv41rt.runtime import Runtime

    fp32 = Runtime(tiny_v41_dir)
    bf16, fp8 = Runtime(tiny_v41_dir, precision="bf16"), Runtime(tiny_v41_dir, precision="fp8")
    for n in (1, 8, 40):
        p = prompt_of(n)
        a, b, c = fp32.score(p), bf16.score(p), fp8.score(p)
        scale = np.abs(a).max(-1)
        e_bf16 = np.median(np.abs(a - b).max(-1) / scale)
        e_fp8 = np.median(np.abs(a - c).max(-1) / scale)
        print(f"n {n}: median max|logit error| / max|logit|: bf16 {e_bf16:.2e}, fp8 {e_fp8:.2e}")
        assert not np.array_equal(b, c)
        assert 0 < e_bf16 < e_fp8 <= 0.5, (n, e_bf16, e_fp8)
