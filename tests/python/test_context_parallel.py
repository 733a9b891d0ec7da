"""Context-parallel prefill (virtual ranks over LocalComm) against CP = 1.

Tolerance: bitwise. Every op computes a row with a fixed reduction order independent of the other
rows, a CP rank computes its query rows with the same ops on the same inputs (the all-gathered
hidden states are copies), and every rank writes the whole batch's state, so CP = 2, 3, 4 give
exactly the CP = 1 logits, and the decode that follows (which runs replicated, without CP) is
identical too. The GPU variants are marked `cuda`.
"""

from __future__ import annotations

import numpy as np
import pytest

PROMPTS = (37, 201, 1000)
DECODE = 6


def prompt_of(n: int) -> list[int]:
    return [0] + [int(t) for t in np.random.default_rng(4000 + n).integers(3, 129000, n - 1)]


def prefill_and_decode(rt, prompt: list[int]) -> tuple[np.ndarray, list[int], np.ndarray]:
    h = rt.new_handle()
    logits = rt.forward_tokens(h, prompt)
    tokens, steps = [], []
    for _ in range(DECODE):
        tokens.append(int(np.argmax((steps[-1] if steps else logits)[-1])))
        steps.append(rt.forward_tokens(h, tokens[-1:]))
    rt.release_handle(h)
    return logits, tokens, np.concatenate(steps)


def check_cp_equals_one(path: str, device: str, sizes: tuple[int, ...]) -> None:
    from dsv41rt.runtime import Runtime

    kw = dict(kv_memory=64 << 20, max_num_seqs=4)
    base = Runtime(path, device, **kw)
    ref = {n: prefill_and_decode(base, prompt_of(n)) for n in PROMPTS}
    del base
    for cp in sizes:
        rt = Runtime(path, device, context_parallel_size=cp, **kw)
        assert rt.backend_stats()["cp_size"] == cp
        for n in PROMPTS:
            logits, tokens, steps = prefill_and_decode(rt, prompt_of(n))
            want_logits, want_tokens, want_steps = ref[n]
            assert np.array_equal(logits, want_logits), (
                f"cp {cp} prompt {n}: max |Δ| {np.abs(logits - want_logits).max()}"
            )
            assert tokens == want_tokens, (cp, n)
            assert np.array_equal(steps, want_steps), (cp, n)
        assert rt.backend_stats()["cp_forwards"] == len(PROMPTS)  # the prefills; decode replicated
        print(f"{device} cp {cp}: prompts {PROMPTS} + {DECODE} decode steps bitwise equal to cp 1")


@pytest.mark.parametrize("preset", ["tiny-v41", "tiny-v41-released-schedule"])
def test_cp_prefill_equals_cp1_cpu(preset: str, tiny_v41_dir, released_dir) -> None:
    check_cp_equals_one(tiny_v41_dir if preset == "tiny-v41" else released_dir, "cpu", (2, 3, 4))


@pytest.mark.cuda
@pytest.mark.parametrize("preset", ["tiny-v41", "tiny-v41-released-schedule"])
def test_cp_prefill_equals_cp1_cuda(preset: str, tiny_v41_dir, released_dir) -> None:
    check_cp_equals_one(tiny_v41_dir if preset == "tiny-v41" else released_dir, "cuda", (2, 3, 4))


def test_cp_engine_batches_give_the_cp1_tokens(tiny_v41_dir) -> None:
    """Through the engine: mixed steps (prefill chunks next to decodes) under CP = 3."""
    from dsv41rt.runtime import Runtime
    from numerics import generate_with_logprobs

    prompts = [prompt_of(n) for n in (5, 70, 130, 9)]
    kw = dict(kv_memory=64 << 20, max_num_seqs=4, max_num_batched_tokens=48)
    want = generate_with_logprobs(Runtime(tiny_v41_dir, **kw), prompts, 8)
    rt = Runtime(tiny_v41_dir, context_parallel_size=3, **kw)
    assert generate_with_logprobs(rt, prompts, 8) == want  # tokens and logprobs, bit for bit
    assert rt.stats()["pages_used"] == 0


def test_cp_size_is_checked(tiny_v41_dir) -> None:
    from dsv41rt.errors import Dsv41rtError
    from dsv41rt.runtime import Runtime

    with pytest.raises(Dsv41rtError, match=r"context-parallel-size: must be in \[1, 64\]"):
        Runtime(tiny_v41_dir, context_parallel_size=0)


def test_cli_score_and_generate_take_cp_size(tiny_v41_dir, tmp_path) -> None:
    import json
    import subprocess
    import sys

    prompts = tmp_path / "p.json"
    prompts.write_text(json.dumps([prompt_of(37), prompt_of(20)]))
    outs = {}
    for cp, mode in (
        (1, []),
        (2, []),
        (2, ["--context-parallel-processes", "true"]),
    ):  # the last: a worker process over TCP
        s = tmp_path / f"s{cp}{len(mode)}.npz"
        g = tmp_path / f"g{cp}{len(mode)}.json"
        for cmd, out, extra in (("score", s, []), ("generate", g, ["--max-new-tokens", "4"])):
            r = subprocess.run(
                [sys.executable, "-m", "dsv41rt", cmd, "--checkpoint", tiny_v41_dir, "--prompts", str(prompts)]
                + ["--out", str(out), "--context-parallel-size", str(cp), *mode, *extra],
                capture_output=True,
                text=True,
            )
            assert r.returncode == 0, r.stderr
        outs[(cp, bool(mode))] = (dict(np.load(s)), json.loads(g.read_text()))
    base = outs[(1, False)]
    for other in ((2, False), (2, True)):
        for key in base[0]:
            assert np.array_equal(base[0][key], outs[other][0][key]), (other, key)
        assert base[1] == outs[other][1], other


@pytest.mark.cuda
def test_cp_over_one_rank_nccl_equals_plain_and_overlaps_the_q_projection(tiny_v41_dir) -> None:
    """The CP data flow over a real (one-rank) NCCL group on the GPU: the same logits as the plain
    executor, and the all-gather (main stream) runs while the Q projection (side stream) does."""
    from dsv41rt import comm
    from dsv41rt.runtime import Runtime

    assert comm.nccl_available(), comm.nccl_library_info()
    kw = dict(kv_memory=64 << 20, max_num_seqs=4)
    want = prefill_and_decode(Runtime(tiny_v41_dir, "cuda", **kw), prompt_of(1000))
    rt = Runtime(tiny_v41_dir, "cuda", context_parallel_backend="nccl", **kw)
    rt.set_switch("cp_timing", True)
    got = prefill_and_decode(rt, prompt_of(1000))
    assert np.array_equal(got[0], want[0]) and got[1] == want[1] and np.array_equal(got[2], want[2])
    s = rt.backend_stats()
    print(
        f"nccl cp 1, prompt 1000: {s['cp_layers_timed']} layers, Q projection {s['cp_q_projection_us']} us, "
        f"all-gather {s['cp_all_gather_us']} us, both running {s['cp_overlap_us']} us"
    )
    assert s["cp_size"] == 1 and s["cp_forwards"] == 1
    assert s["cp_layers_timed"] == rt.config.num_hidden_layers
    assert s["cp_all_gather_us"] > 0 and s["cp_q_projection_us"] > 0 and s["cp_overlap_us"] > 0


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_cp_ranks_without_rows_and_bad_input(tiny_v41_dir, device: str) -> None:
    """Prompts shorter than the group (ranks with no query rows) still match CP = 1; a bad token is
    refused before any rank runs (at once, not after a collective's timeout) and the group stays
    usable."""
    import time

    from dsv41rt import _core
    from dsv41rt.runtime import Runtime

    kw = dict(kv_memory=64 << 20, max_num_seqs=4)
    one, cp = Runtime(tiny_v41_dir, device, **kw), Runtime(tiny_v41_dir, device, context_parallel_size=4, **kw)
    for n in (2, 3, 5):
        p = prompt_of(n)
        want = prefill_and_decode(one, p)
        got = prefill_and_decode(cp, p)
        assert np.array_equal(got[0], want[0]) and got[1] == want[1] and np.array_equal(got[2], want[2]), n
    h = cp.new_handle()
    t0 = time.monotonic()
    with pytest.raises(_core.Error, match="outside the vocabulary"):  # the C++ check, not Python's
        cp._rt.forward(h, np.asarray([5, 10**8], np.int32), all_logits=True)
    assert time.monotonic() - t0 < 5
    cp.release_handle(h)
    assert np.array_equal(prefill_and_decode(cp, prompt_of(37))[0], prefill_and_decode(one, prompt_of(37))[0])


def test_cp_worker_protocol_in_threads_equals_cp1(tiny_v41_dir) -> None:
    """The one-process-per-rank protocol (a leader broadcasting every state-changing call, worker
    loops replaying it), run with the ranks as threads: the CP = 1 logits, decode, forks and engine
    tokens; bad input refused before anything is sent, and the group still works after it."""
    from dsv41rt import _core
    from dsv41rt.runtime import Runtime

    kw = dict(kv_memory=64 << 20, max_num_seqs=4)
    one = Runtime(tiny_v41_dir, **kw)
    rt = Runtime(tiny_v41_dir, context_parallel_size=3, worker_threads=True, **kw)
    assert rt.backend_stats()["cp_size"] == 3 and rt.backend_stats()["cp_processes"] == 0
    for n in (2, 201):
        want, got = prefill_and_decode(one, prompt_of(n)), prefill_and_decode(rt, prompt_of(n))
        assert np.array_equal(got[0], want[0]) and got[1] == want[1] and np.array_equal(got[2], want[2]), n
    h = rt.new_handle()
    rt.forward_tokens(h, prompt_of(70))
    forks = [rt.fork_handle(h) for _ in range(2)]  # copy_state travels to the workers too
    rows = rt.decode_handles([h, *forks], [9, 9, 9])
    assert np.array_equal(rows[1], rows[0]) and np.array_equal(rows[2], rows[0])
    with pytest.raises(_core.Error, match="outside the vocabulary"):
        rt._rt.forward(h, np.asarray([5, 10**8], np.int32), all_logits=True)
    for x in (h, *forks):
        rt.release_handle(x)
    prompts = [prompt_of(n) for n in (5, 70, 130)]
    ekw = dict(kw, max_num_batched_tokens=48)
    want = Runtime(tiny_v41_dir, **ekw).generate(prompts, max_new_tokens=6, ignore_eos=True)
    assert (
        Runtime(tiny_v41_dir, context_parallel_size=2, worker_threads=True, **ekw).generate(
            prompts, max_new_tokens=6, ignore_eos=True
        )
        == want
    )


def test_cp_rank_options_are_checked(tiny_v41_dir, tmp_path) -> None:
    import subprocess
    import sys

    from dsv41rt.errors import Dsv41rtError
    from dsv41rt.runtime import Runtime

    with pytest.raises(Dsv41rtError, match="rank 0 needs context_parallel_backend 'nccl' or 'socket'"):
        Runtime(tiny_v41_dir, context_parallel_size=2, rank=0)
    with pytest.raises(Dsv41rtError, match="context_parallel_backend 'socket' is for one process per rank"):
        Runtime(tiny_v41_dir, context_parallel_size=2, context_parallel_backend="socket")
    with pytest.raises(Dsv41rtError, match="is not a context-parallel worker"):
        Runtime(tiny_v41_dir).run_cp_worker()
    ident = tmp_path / "id"
    ident.write_bytes(b"x" * 128)
    r = subprocess.run(
        [sys.executable, "-m", "dsv41rt", "cp-worker", tiny_v41_dir, "--rank", "0"]
        + ["--context-parallel-size", "2", "--device", "cuda:1", "--id-file", str(ident)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and "--rank must be in [1, group size)" in r.stderr, r.stderr


def test_cp_one_process_per_rank_over_sockets_equals_cp1(tiny_v41_dir) -> None:
    """The real multi-process mode on the CPU: rank 0 here, ranks 1 and 2 as `dsv41rt cp-worker`
    processes over TCP (dsv41rt.cp_launch): prefill + decode and a fork equal CP = 1; closing rank 0
    shuts the workers down cleanly (the launcher raises on a non-zero worker exit)."""
    from dsv41rt.cp_launch import cp_processes
    from dsv41rt.options import RuntimeOptions
    from dsv41rt.runtime import Runtime

    kw = dict(kv_memory=64 << 20, max_num_seqs=4)
    one = Runtime(tiny_v41_dir, **kw)
    opts = RuntimeOptions(device="cpu", context_parallel_size=3, **kw)
    with cp_processes(tiny_v41_dir, opts, comm="socket") as rt:
        assert rt.backend_stats()["cp_processes"] == 1 and rt.backend_stats()["cp_size"] == 3
        for n in (37, 201):
            want, got = prefill_and_decode(one, prompt_of(n)), prefill_and_decode(rt, prompt_of(n))
            assert np.array_equal(got[0], want[0]) and got[1] == want[1] and np.array_equal(got[2], want[2]), n
        h = rt.new_handle()
        rt.forward_tokens(h, prompt_of(50))
        f = rt.fork_handle(h)
        rows = rt.decode_handles([h, f], [11, 11])
        assert np.array_equal(rows[0], rows[1])


@pytest.mark.cuda
@pytest.mark.multi_gpu
def test_cp_one_process_per_gpu_over_nccl_equals_cp1(tiny_v41_dir) -> None:
    """Issue 9's mode: rank 0 here on cuda:0, rank 1 a `dsv41rt cp-worker` process on cuda:1, NCCL."""
    from dsv41rt import _core
    from dsv41rt.cp_launch import cp_processes
    from dsv41rt.options import RuntimeOptions
    from dsv41rt.runtime import Runtime

    assert _core.cuda_device_count() >= 2, "a multi_gpu test run on fewer than 2 GPUs"
    kw = dict(kv_memory=256 << 20, max_num_seqs=4)
    one = Runtime(tiny_v41_dir, "cuda:0", **kw)
    opts = RuntimeOptions(device="cuda:0", context_parallel_size=2, **kw)
    with cp_processes(tiny_v41_dir, opts, comm="nccl") as rt:
        for n in PROMPTS:
            want, got = prefill_and_decode(one, prompt_of(n)), prefill_and_decode(rt, prompt_of(n))
            assert np.array_equal(got[0], want[0]) and got[1] == want[1] and np.array_equal(got[2], want[2]), n
