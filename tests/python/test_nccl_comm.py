"""NcclComm (dsv41rt.comm): NCCL collectives on one GPU, eager and inside CUDA graphs, and the
failures a user can hit (no NCCL, no GPU, bad arguments) as exceptions rather than crashes.

With one rank every collective is a copy, so results are compared exactly. Inputs are random with
a fresh seed per run (printed on failure); outputs are pre-filled with poison (NaN, INT32_MIN) and
have a poisoned tail, so an unwritten or overrun element shows.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import types

import pytest
from dsv41rt import _core, comm

try:
    import torch
except ImportError:  # only the GPU tests and the tensor-helper checks need it
    torch = None

COUNT = 4099  # odd and more than one page of every dtype: element/byte mix-ups show
PAD = 67  # poisoned tail after each output


# ---- No GPU needed (CI) ----------------------------------------------------------------------


def test_nccl_available_is_a_bool_and_consistent_with_the_build():
    available = comm.nccl_available()
    assert isinstance(available, bool)
    assert isinstance(comm.built_with_nccl, bool)
    if not comm.built_with_nccl:
        assert available is False
        with pytest.raises(RuntimeError, match="built without NCCL"):
            comm.nccl_library_info()
    elif available:
        assert comm.nccl_library_info().startswith("NCCL 2.")


def test_import_points_the_loader_at_the_pip_package():
    try:
        import nvidia.nccl  # noqa: F401
    except ImportError:
        pytest.skip("nvidia-nccl-cu13 is not installed")
    dirs = os.environ["DSV41RT_NCCL_SEARCH_PATH"].split(os.pathsep)
    assert any(os.path.isfile(os.path.join(d, "libnccl.so.2")) for d in dirs), dirs


def test_constructing_without_a_gpu_raises_a_clear_error():
    if _core.cuda_device_count() > 0:
        pytest.skip("this machine has a GPU")
    with pytest.raises((RuntimeError, ValueError), match="CUDA|NCCL"):
        comm.NcclComm.single(0)


def test_bad_unique_id_and_rank_raise():
    if not comm.built_with_nccl:
        with pytest.raises(RuntimeError, match="built without NCCL"):
            comm.NcclComm(b"\0" * 128, 0, 1, 0)
        return
    with pytest.raises(_core.Error, match="must be 128 bytes"):
        comm.NcclComm(b"short", 0, 1, 0)
    with pytest.raises(_core.Error, match="rank 2 is not in a group of 2"):
        comm.NcclComm(b"\0" * 128, 2, 2, 0)


def test_missing_library_is_reported_with_the_fix():
    if not comm.built_with_nccl:
        pytest.skip("built without NCCL")
    # A fresh process: a library that loaded once stays loaded.
    code = (
        "from dsv41rt import comm\n"
        "assert comm.nccl_available() is False\n"
        "try:\n"
        "    comm.nccl_unique_id()\n"
        "except ValueError as e:\n"
        "    print(e)\n"
    )
    env = dict(os.environ, DSV41RT_NCCL_LIBRARY="/nonexistent/libnccl.so.2")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "NCCL not available" in out.stdout
    assert "/nonexistent/libnccl.so.2" in out.stdout
    assert "pip install nvidia-nccl-cu13 or set DSV41RT_NCCL_LIBRARY" in out.stdout


def test_tensor_helpers_check_sizes_and_dtypes_before_calling_nccl():
    pytest.importorskip("torch")
    fake = types.SimpleNamespace(size=2)  # never called: every check fails first
    x = torch.zeros(6)
    with pytest.raises(ValueError, match="recv has 6 elements, expected 12"):
        comm.all_gather(fake, x, torch.zeros(6))
    with pytest.raises(ValueError, match="send has 6 elements, expected 8"):
        comm.reduce_scatter(fake, x, torch.zeros(4))
    with pytest.raises(ValueError, match="recv has 5 elements, expected 6"):
        comm.all_reduce(fake, x, torch.zeros(5))
    with pytest.raises(ValueError, match="do not split into 2 chunks"):
        comm.all_to_all(fake, torch.zeros(5), torch.zeros(5))
    with pytest.raises(ValueError, match="send is torch.float32 but recv is torch.int32"):
        comm.all_reduce(fake, x, torch.zeros(6, dtype=torch.int32))
    with pytest.raises(ValueError, match="do not support torch.float64"):
        comm.all_reduce(fake, torch.zeros(6, dtype=torch.float64))
    with pytest.raises(ValueError, match="contiguous CUDA tensor"):
        comm.all_reduce(fake, x)


# ---- One GPU ---------------------------------------------------------------------------------

DTYPES = ["f32", "bf16", "i32"]


@pytest.fixture(scope="module")
def nccl():
    pytest.importorskip("torch")
    if not comm.built_with_nccl:
        pytest.skip("built without NCCL")
    c = comm.NcclComm.single(0)
    yield c
    torch.cuda.synchronize()
    c.close()  # after every test's CUDA graphs are gone


def _torch_dtype(name):
    return {"f32": torch.float32, "bf16": torch.bfloat16, "i32": torch.int32}[name]


def _random(name, n, gen):
    if name == "i32":
        return torch.randint(-(2**30), 2**30, (n,), generator=gen, dtype=torch.int32).cuda()
    return torch.randn(n, generator=gen).to(_torch_dtype(name)).cuda()


def _poisoned(name, n):
    value = torch.iinfo(torch.int32).min if name == "i32" else float("nan")
    return torch.full((n + PAD,), value, dtype=_torch_dtype(name), device="cuda")


def _check(out, want, what, seed):
    n = want.numel()
    assert torch.equal(out[:n], want), f"{what}: wrong result (seed {seed})"
    tail = out[n:]
    intact = torch.isnan(tail).all() if tail.is_floating_point() else (tail == torch.iinfo(tail.dtype).min).all()
    assert bool(intact), f"{what}: wrote past the end of its output (seed {seed})"


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_one_rank_collectives_are_exact_copies(nccl, dtype):
    seed = secrets.randbits(31)
    gen = torch.Generator().manual_seed(seed)
    assert (nccl.rank, nccl.size) == (0, 1)
    x = _random(dtype, COUNT, gen)
    s = torch.cuda.current_stream().cuda_stream
    for what, call in [
        ("all_gather", lambda o: nccl.all_gather(x.data_ptr(), o.data_ptr(), COUNT, dtype, s)),
        ("all_reduce sum", lambda o: nccl.all_reduce(x.data_ptr(), o.data_ptr(), COUNT, dtype, "sum", s)),
        ("all_reduce max", lambda o: nccl.all_reduce(x.data_ptr(), o.data_ptr(), COUNT, dtype, "max", s)),
        ("reduce_scatter", lambda o: nccl.reduce_scatter(x.data_ptr(), o.data_ptr(), COUNT, dtype, "sum", s)),
        ("all_to_all", lambda o: nccl.all_to_all(x.data_ptr(), o.data_ptr(), COUNT, dtype, s)),
    ]:
        out = _poisoned(dtype, COUNT)
        call(out)
        _check(out, x, what, seed)
    inplace = _poisoned(dtype, COUNT)
    inplace[:COUNT] = x
    nccl.all_reduce(inplace.data_ptr(), inplace.data_ptr(), COUNT, dtype, "sum", s)
    _check(inplace, x, "in-place all_reduce", seed)
    inplace = _poisoned(dtype, COUNT)
    inplace[:COUNT] = x
    nccl.broadcast(inplace.data_ptr(), COUNT, dtype, 0, s)  # in place, root 0
    _check(inplace, x, "broadcast", seed)
    nccl.barrier()


@pytest.mark.cuda
def test_tensor_helpers_on_a_side_stream(nccl):
    seed = secrets.randbits(31)
    x = _random("f32", COUNT, torch.Generator().manual_seed(seed))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        gathered, scattered, swapped = (torch.full_like(x, float("nan")) for _ in range(3))
        comm.all_gather(nccl, x, gathered)
        comm.reduce_scatter(nccl, x, scattered, "max")
        comm.all_to_all(nccl, x, swapped)
        inplace = x.clone()
        comm.all_reduce(nccl, inplace)
    side.synchronize()
    for what, out in [("all_gather", gathered), ("reduce_scatter", scattered), ("all_to_all", swapped)]:
        assert torch.equal(out, x), f"{what} (seed {seed})"
    assert torch.equal(inplace, x), f"in-place all_reduce (seed {seed})"


def _capture_and_replay(nccl, dtype, record):
    """Captures record(x, stream) -> {name: (output, expected(x))}; replays it on 3 fresh inputs."""
    seed = secrets.randbits(31)
    gen = torch.Generator().manual_seed(seed)
    static_in = _random(dtype, COUNT, gen)
    # Warm up outside the capture on a side stream (torch's recipe; NCCL connects lazily).
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        outs = record(static_in, side.cuda_stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = record(static_in, torch.cuda.current_stream().cuda_stream)
    for replay in range(3):
        fresh = _random(dtype, COUNT, gen)
        static_in.copy_(fresh)
        for out, _ in outs.values():
            out.fill_(torch.iinfo(torch.int32).min if dtype == "i32" else float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        for what, (out, want) in outs.items():
            _check(out, want(fresh), f"{what} ({dtype}), replay {replay}", seed)
    del graph
    torch.cuda.synchronize()


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_all_gather_and_all_reduce_replay_from_a_cuda_graph(nccl, dtype):
    def record(x, s):
        gathered, summed, maxed = (_poisoned(dtype, COUNT) for _ in range(3))
        nccl.all_gather(x.data_ptr(), gathered.data_ptr(), COUNT, dtype, s)
        nccl.all_reduce(x.data_ptr(), summed.data_ptr(), COUNT, dtype, "sum", s)
        nccl.all_reduce(summed.data_ptr(), maxed.data_ptr(), COUNT, dtype, "max", s)  # chained
        return {"all_gather": (gathered, lambda v: v), "all_reduce": (summed, lambda v: v), "max": (maxed, lambda v: v)}

    _capture_and_replay(nccl, dtype, record)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_all_to_all_and_reduce_scatter_replay_from_a_cuda_graph(nccl, dtype):
    def record(x, s):
        swapped, scattered = _poisoned(dtype, COUNT), _poisoned(dtype, COUNT)
        nccl.all_to_all(x.data_ptr(), swapped.data_ptr(), COUNT, dtype, s)
        nccl.reduce_scatter(x.data_ptr(), scattered.data_ptr(), COUNT, dtype, "sum", s)
        return {"all_to_all": (swapped, lambda v: v), "reduce_scatter": (scattered, lambda v: v)}

    _capture_and_replay(nccl, dtype, record)


@pytest.mark.cuda
def test_bad_calls_raise_and_leave_the_communicator_usable(nccl):
    x = torch.arange(8, dtype=torch.float32, device="cuda")
    y = torch.full_like(x, float("nan"))
    p, q = x.data_ptr(), y.data_ptr()
    with pytest.raises(_core.Error, match="f64"):
        nccl.all_reduce(p, q, 8, "f64")
    with pytest.raises(_core.Error, match="fp4_e2m1 is not supported"):
        nccl.all_gather(p, q, 8, "fp4_e2m1")
    with pytest.raises(_core.Error, match="reductions of fp8_e4m3 are not supported"):
        nccl.all_reduce(p, q, 8, "fp8_e4m3")
    with pytest.raises(_core.Error, match=r"unknown reduce op 'min' \(sum, max\)"):
        nccl.all_reduce(p, q, 8, "f32", "min")
    with pytest.raises(_core.Error, match="NULL buffer"):
        nccl.all_gather(0, q, 8, "f32")
    with pytest.raises(_core.Error, match="cannot run in place"):
        nccl.all_to_all(p, p, 8, "f32")
    with pytest.raises(ValueError, match="recv has 4 elements, expected 8"):
        comm.all_gather(nccl, x, torch.zeros(4, device="cuda"))
    nccl.all_reduce(p, q, 0, "f32")  # an empty collective is a no-op
    assert torch.isnan(y).all()
    nccl.all_reduce(p, q, 8, "f32", "sum", torch.cuda.current_stream().cuda_stream)
    assert torch.equal(y, x)
    nccl.barrier()


@pytest.mark.cuda
def test_unique_id_group_and_close():
    pytest.importorskip("torch")
    if not comm.built_with_nccl:
        pytest.skip("built without NCCL")
    uid = comm.nccl_unique_id()
    assert isinstance(uid, bytes) and len(uid) == 128
    c = comm.NcclComm(uid, 0, 1, 0)
    x = torch.arange(16, dtype=torch.int32, device="cuda")
    y = torch.zeros_like(x)
    comm.all_reduce(c, x, y)
    torch.cuda.synchronize()
    assert torch.equal(x, y)
    c.barrier()
    c.close()
    with pytest.raises(_core.Error, match="closed"):
        c.barrier()


def _wait_for_the_watchdog(c) -> tuple[str, float]:
    """Polls check_healthy() until it raises (at most 5 s): (its message, seconds waited)."""
    import time

    t0 = time.monotonic()
    while True:
        try:
            c.check_healthy()
        except _core.Error as e:
            fired = time.monotonic() - t0
            print(f"watchdog fired after {fired * 1e3:.0f} ms: {e}")
            return str(e), fired
        assert time.monotonic() - t0 < 5, "the watchdog did not fire"
        time.sleep(0.01)


@pytest.mark.cuda
def test_the_watchdog_aborts_a_collective_stuck_past_its_timeout():
    """A collective that cannot complete (on one GPU: queued behind ~1.5 s of GPU work, with a
    300 ms timeout; in a group, a dead or diverging rank) makes the watchdog abort the communicator:
    check_healthy() and the next call raise its reason soon after the timeout, and the stream's work
    still ends (nothing hangs). A collective that completes in time raises nothing."""
    import time

    pytest.importorskip("torch")
    if not comm.built_with_nccl:
        pytest.skip("built without NCCL")
    with pytest.raises(_core.Error, match="timeout_ms must be positive"):
        comm.NcclComm.single(0, timeout_ms=0)
    c = comm.NcclComm.single(0, timeout_ms=300)
    x = torch.arange(8, dtype=torch.float32, device="cuda")
    y = torch.full_like(x, float("nan"))
    stream = torch.cuda.current_stream().cuda_stream
    c.all_reduce(x.data_ptr(), y.data_ptr(), 8, "f32", "sum", stream)
    torch.cuda.synchronize()
    time.sleep(0.5)
    c.check_healthy()  # completed in time: no alarm
    assert torch.equal(y, x)
    torch.cuda._sleep(int(3e9))  # ~1.5 s of spinning ahead of the next collective
    c.all_reduce(x.data_ptr(), y.data_ptr(), 8, "f32", "sum", stream)
    message, fired = _wait_for_the_watchdog(c)
    assert "aborted by its watchdog: all_reduce did not complete within 300 ms" in message
    assert fired < 1.0
    with pytest.raises(_core.Error, match="aborted by its watchdog"):
        c.all_reduce(x.data_ptr(), y.data_ptr(), 8, "f32", "sum", stream)
    torch.cuda.synchronize()  # the spinning kernel ends; the aborted collective does not hang
    c.close()


@pytest.mark.cuda
def test_the_watchdog_watches_a_replayed_graph_past_its_collectives():
    """A CUDA graph that captured a collective is not tracked call by call (nothing is tracked
    under capture); watch_launch after its replay has the watchdog watch the stream past it, so a
    replay that cannot complete aborts the communicator as a stuck collective does (the decode
    graphs of a tensor/expert-parallel rank over NCCL rely on it)."""
    import time

    pytest.importorskip("torch")
    if not comm.built_with_nccl:
        pytest.skip("built without NCCL")
    c = comm.NcclComm.single(0, timeout_ms=300)
    x = torch.arange(8, dtype=torch.float32, device="cuda")
    y = torch.full_like(x, float("nan"))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up outside the capture (NCCL connects lazily)
        c.all_reduce(x.data_ptr(), y.data_ptr(), 8, "f32", "sum", side.cuda_stream)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        c.all_reduce(x.data_ptr(), y.data_ptr(), 8, "f32", "sum", torch.cuda.current_stream().cuda_stream)
    stream = torch.cuda.current_stream().cuda_stream
    graph.replay()
    c.watch_launch("graph replay", stream)
    torch.cuda.synchronize()
    time.sleep(0.5)
    c.check_healthy()  # completed in time: no alarm
    torch.cuda._sleep(int(3e9))  # ~1.5 s of spinning ahead of the replay
    graph.replay()
    c.watch_launch("graph replay", stream)
    message, _ = _wait_for_the_watchdog(c)
    assert "aborted by its watchdog: graph replay did not complete within 300 ms" in message
    torch.cuda.synchronize()
    del graph
    c.close()
