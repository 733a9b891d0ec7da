"""Tensor and expert parallelism (virtual ranks over LocalComm, CPU) against one rank.

Tolerance: bitwise. Every rank runs every token (replicated state) with its shares: under tensor
parallelism its heads, their output groups and its rows of the vocabulary head, whose outputs are
all-gathered (wo_b, whole, then sums in the one-rank order); under expert parallelism its
contiguous share of each layer's routed experts: a rank writes the outputs of its experts' (token,
slot) pairs and zeros elsewhere, the ranks' slots are summed (one non-zero term per slot: exact),
and the combine adds each token's slots in the one-rank order (ascending expert id) before the
shared expert. So every (tp, ep) gives exactly the one-rank logits, and greedy generation under
continuous batching (several requests per forward, sampling on rank 0) is identical.
"""

from __future__ import annotations

import numpy as np
import pytest

PROMPTS = (1, 37, 201)


def prompt_of(n: int) -> list[int]:
    return [0] + [int(t) for t in np.random.default_rng(5000 + n).integers(3, 129000, n - 1)]


@pytest.mark.parametrize(
    ("preset_dir", "sizes"),
    [("tiny_v41_dir", ((1, 8), (2, 2))), ("released_dir", ((4, 1), (1, 4)))],
)
def test_parallel_equals_one_rank_bitwise(preset_dir: str, sizes: tuple[tuple[int, int], ...], request) -> None:
    from dsv41rt.runtime import Runtime

    path = request.getfixturevalue(preset_dir)
    kw = dict(kv_memory=64 << 20, max_num_seqs=4)
    base = Runtime(path, **kw)
    want_logits = {n: base.score(prompt_of(n)) for n in PROMPTS}
    want_tokens = base.generate([prompt_of(n) for n in PROMPTS], max_new_tokens=32, ignore_eos=True)
    base.close()
    for tp, ep in sizes:
        rt = Runtime(path, tensor_parallel_size=tp, expert_parallel_size=ep, **kw)
        assert (rt.backend_stats()["tp_size"], rt.backend_stats()["ep_size"]) == (tp, ep)
        for n in PROMPTS:
            got = rt.score(prompt_of(n))
            assert np.array_equal(got, want_logits[n]), (
                f"tp {tp} ep {ep} prompt {n}: max |Δ| {np.abs(got - want_logits[n]).max()}"
            )
        assert rt.generate([prompt_of(n) for n in PROMPTS], max_new_tokens=32, ignore_eos=True) == want_tokens, (tp, ep)
        rt.close()


def test_parallel_sizes_that_cannot_work_are_refused(tiny_v41_dir: str) -> None:
    from dsv41rt.errors import Dsv41rtError
    from dsv41rt.runtime import Runtime

    with pytest.raises(Dsv41rtError, match="does not divide the 8 routed experts of layer 0"):
        Runtime(tiny_v41_dir, expert_parallel_size=3)
    with pytest.raises(Dsv41rtError, match="expert-parallel-size: must be in"):
        Runtime(tiny_v41_dir, expert_parallel_size=0)
    with pytest.raises(Dsv41rtError, match="does not divide the 4 attention heads"):
        Runtime(tiny_v41_dir, tensor_parallel_size=8)
    with pytest.raises(Dsv41rtError, match="needs the same size"):
        Runtime(tiny_v41_dir, tensor_parallel_size=2, expert_parallel_size=4)


def test_context_parallel_over_tensor_expert_groups_equals_one_rank(tiny_v41_dir: str) -> None:
    """CP 2 over TP 2 x EP 2 groups (8 virtual ranks: prefill rows split over the CP ranks, heads,
    vocabulary and experts over each group): logits and greedy tokens equal one rank's bitwise."""
    from dsv41rt.runtime import Runtime

    kw = dict(kv_memory=64 << 20, max_num_seqs=4)
    one = Runtime(tiny_v41_dir, **kw)
    want_logits = one.score(prompt_of(201))
    want_tokens = one.generate([prompt_of(n) for n in PROMPTS], max_new_tokens=32, ignore_eos=True)
    one.close()
    rt = Runtime(tiny_v41_dir, context_parallel_size=2, tensor_parallel_size=2, expert_parallel_size=2, **kw)
    stats = rt.backend_stats()
    assert (stats["cp_size"], stats["tp_size"], stats["ep_size"]) == (2, 2, 2)
    assert np.array_equal(rt.score(prompt_of(201)), want_logits)
    assert rt.generate([prompt_of(n) for n in PROMPTS], max_new_tokens=32, ignore_eos=True) == want_tokens
    assert rt.backend_stats()["cp_forwards"] > 0
    rt.close()


def test_one_process_per_rank_over_sockets_equals_one_rank(tiny_v41_dir: str) -> None:
    """TP 2 x EP 2 with rank 1 as a `dsv41rt cp-worker` process over TCP (dsv41rt.cp_launch):
    prefill logits, engine batches and greedy tokens equal one rank's bitwise; closing rank 0 shuts
    the worker down cleanly (the launcher raises on a non-zero worker exit)."""
    from dsv41rt.cp_launch import cp_processes
    from dsv41rt.options import RuntimeOptions
    from dsv41rt.runtime import Runtime

    kw = dict(kv_memory=64 << 20, max_num_seqs=4)
    one = Runtime(tiny_v41_dir, **kw)
    want_logits = one.score(prompt_of(37))
    want_tokens = one.generate([prompt_of(n) for n in PROMPTS], max_new_tokens=32, ignore_eos=True)
    one.close()
    opts = RuntimeOptions(tensor_parallel_size=2, expert_parallel_size=2, **kw)
    with cp_processes(tiny_v41_dir, opts, comm="socket") as rt:
        stats = rt.backend_stats()
        assert (stats["tp_size"], stats["ep_size"], stats["cp_processes"]) == (2, 2, 1)
        assert np.array_equal(rt.score(prompt_of(37)), want_logits)
        assert rt.generate([prompt_of(n) for n in PROMPTS], max_new_tokens=32, ignore_eos=True) == want_tokens


def test_a_killed_worker_process_fails_rank_0_quickly(tiny_v41_dir: str) -> None:
    """A worker process killed (SIGKILL) mid-session: rank 0's next forward fails within 30 s with
    an error naming the lost rank, instead of hanging."""
    import os
    import signal
    import subprocess
    import time

    from dsv41rt.cp_launch import cp_processes
    from dsv41rt.errors import Dsv41rtError
    from dsv41rt.options import RuntimeOptions

    popen = subprocess.Popen
    workers: list[subprocess.Popen] = []

    def spy(*args, **kwargs):  # the launcher's worker processes, to kill one
        p = popen(*args, **kwargs)
        workers.append(p)
        return p

    opts = RuntimeOptions(expert_parallel_size=2, kv_memory=64 << 20, max_num_seqs=4)
    subprocess.Popen = spy  # type: ignore[misc]
    try:
        with pytest.raises(Dsv41rtError) as failed:
            with cp_processes(tiny_v41_dir, opts, comm="socket") as rt:
                rt.score(prompt_of(7))  # the group works
                os.kill(workers[0].pid, signal.SIGKILL)
                workers[0].wait(timeout=10)
                start = time.monotonic()
                with pytest.raises(Dsv41rtError) as lost:
                    rt.score(prompt_of(37))
                assert time.monotonic() - start < 30
                assert "rank 1" in str(lost.value) or "peer" in str(lost.value), lost.value
    finally:
        subprocess.Popen = popen  # type: ignore[misc]
    assert "worker processes failed" in str(failed.value)  # the launcher reports the dead rank


def test_torchrun_starts_the_group_with_one_command_line(tiny_v41_dir: str, tmp_path) -> None:
    """`torchrun --nproc-per-node 2 -m dsv41rt generate --tensor-parallel-size 2 ...`: the group's
    id travels through torchrun's TCP store, rank 1 replays rank 0 and exits 0, and the tokens
    equal a one-process run; a world size the options do not match is refused by name."""
    import json
    import socket
    import subprocess
    import sys

    prompts = tmp_path / "p.json"
    prompts.write_text(json.dumps([prompt_of(7), prompt_of(37)]))

    def generate(out: str, *launcher: str, flags: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
        args = ["generate", "--checkpoint", tiny_v41_dir, "--prompts", str(prompts), "--out", str(tmp_path / out)]
        cmd = [sys.executable, *launcher, "-m", "dsv41rt", *args, "--max-new-tokens", "6", "--ignore-eos", *flags]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=300)

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    torchrun = ("-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", port)
    r = generate("tp.json", *torchrun, flags=("--tensor-parallel-size", "2", "--expert-parallel-size", "2"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("generated 12 tokens") == 1, r.stdout  # rank 0 only
    r = generate("one.json")
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "tp.json").read_text()) == json.loads((tmp_path / "one.json").read_text())
    r = generate("bad.json", *torchrun)
    assert r.returncode != 0 and "torchrun started 2 processes but the options make a group of 1" in r.stderr, r.stderr
