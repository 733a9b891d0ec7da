"""Context parallelism with one process per rank: rank 0 (this process) runs the engine, ranks
1..P-1 are `dsv41rt cp-worker` processes that replay rank 0's calls (docs/design/context-parallel.md):
over NCCL on GPUs base+1..base+P-1, or over TCP sockets on any device (how the mode is tested
without GPUs). Every rank gets the same pool and model options, or the paged
state would not line up.

    opts = RuntimeOptions(device="cuda:0", context_parallel_size=2, context_parallel_processes=True)
    with open_runtime(checkpoint, opts) as rt:
        rt.generate(...)

Started by `torchrun` instead (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT in the
environment, WORLD_SIZE > 1), every process opens its own rank: rank 0 returns the Runtime, the
others replay its calls and exit when it closes; the group's id (rank 0's host:port, or the NCCL
unique id) travels through torchrun's TCP store, so the same command line runs on every process:

    torchrun --nproc-per-node 2 -m dsv41rt generate --tensor-parallel-size 2 ...
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

from .errors import Dsv41rtError
from .options import RuntimeOptions, to_argv


def worker_argv(checkpoint: str, rank: int, device: str, id_file: str, options: RuntimeOptions) -> list[str]:
    """`dsv41rt cp-worker` for `rank`: every runtime option as rank 0's (the pool and the numerics
    must line up), on `device`."""
    argv = [sys.executable, "-m", "dsv41rt", "cp-worker", checkpoint, "--rank", str(rank), "--id-file", id_file]
    return argv + to_argv(options.replace(device=device, context_parallel_processes=False))


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def open_runtime(checkpoint: str, options: RuntimeOptions, **runtime_kw: Any) -> Iterator[Any]:
    """The Runtime for `options` (closed on exit): in this process, or, with
    context_parallel_processes, as rank 0 of worker processes for ranks 1..N-1 (`runtime_kw`:
    Runtime's other keywords, e.g. progress, engine_thread)."""
    from .runtime import Runtime

    launched = torchrun_rank()
    if launched is not None:
        with torchrun_group(checkpoint, options, *launched, **runtime_kw) as rt:
            yield rt
        return
    if not options.context_parallel_processes:
        rt = Runtime(checkpoint, options=options, **runtime_kw)
        try:
            yield rt
        finally:
            rt.close()
        return
    gpu = options.device.startswith("cuda")
    device = "cuda:0" if options.device == "cuda" else options.device
    with cp_processes(checkpoint, options.replace(device=device), comm="nccl" if gpu else "socket", **runtime_kw) as rt:
        yield rt


@contextlib.contextmanager
def cp_processes(checkpoint: str, options: RuntimeOptions, comm: str = "nccl", **runtime_kw: Any) -> Iterator[Any]:
    """A rank-0 Runtime whose ranks 1..N-1 (N = options.group_size: the context-parallel size, or
    the tensor/expert-parallel group's) run in worker processes: over NCCL one GPU each (rank r on
    cuda:B+r for options.device cuda:B), or over TCP sockets on any device (comm="socket": every
    rank on options.device, e.g. "cpu")."""
    from .runtime import Runtime

    device, size = options.device, options.group_size
    if comm not in ("nccl", "socket"):
        raise Dsv41rtError(f"cp_processes: comm must be 'nccl' or 'socket', got {comm!r}")
    if comm == "nccl" and (not device.startswith("cuda:") or not device[5:].isdigit()):
        raise Dsv41rtError(f"cp_processes: device must be cuda:N (rank r runs on cuda:N+r), got {device!r}")
    if size < 2:
        raise Dsv41rtError(
            f"cp_processes: the group needs >= 2 ranks (context-, tensor- or expert-parallel size), got {size}"
        )
    if comm == "nccl":
        from . import comm as nccl

        uid = nccl.nccl_unique_id()
        base = int(device[5:])
        devices = [f"cuda:{base + r}" for r in range(size)]
    else:
        uid = f"127.0.0.1:{_free_port()}".encode()
        devices = [device] * size
    options = options.replace(context_parallel_backend=comm, context_parallel_processes=False)
    with tempfile.TemporaryDirectory() as tmp:
        id_file = os.path.join(tmp, "group_id")
        with open(id_file, "wb") as f:
            f.write(uid)
        procs = [subprocess.Popen(worker_argv(checkpoint, r, devices[r], id_file, options)) for r in range(1, size)]
        rt = None
        try:
            rt = Runtime(checkpoint, devices[0], options=options, rank=0, group_id=uid, **runtime_kw)
            yield rt
        finally:
            if rt is not None:
                rt.close()  # rank 0's executor sends the shutdown message
            for p in procs:
                try:
                    p.wait(timeout=120)
                except subprocess.TimeoutExpired:
                    p.kill()
        bad = [(r + 1, p.returncode) for r, p in enumerate(procs) if p.returncode != 0]
        if bad:
            raise Dsv41rtError(f"cp worker processes failed (rank, exit code): {bad}")


def torchrun_rank() -> tuple[int, int, int] | None:
    """(rank, world size, local rank) when torchrun started this process as one of several."""
    env = os.environ
    if "WORLD_SIZE" not in env or "RANK" not in env:
        return None
    try:
        rank, world, local = int(env["RANK"]), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", env["RANK"]))
    except ValueError:
        raise Dsv41rtError(
            f"RANK / WORLD_SIZE / LOCAL_RANK must be integers, got {env['RANK']!r} / {env['WORLD_SIZE']!r}"
        ) from None
    return (rank, world, local) if world > 1 else None


@contextlib.contextmanager
def torchrun_group(
    checkpoint: str, options: RuntimeOptions, rank: int, world: int, local_rank: int, **runtime_kw: Any
) -> Iterator[Any]:
    """This process's rank of a group torchrun started: rank 0's Runtime is yielded; a worker rank
    replays rank 0's calls until it closes, then exits the process (SystemExit(0)) so the command
    it ran under does not go on."""
    from .runtime import Runtime

    size = options.group_size
    if size != world:
        raise Dsv41rtError(
            f"torchrun started {world} processes but the options make a group of {size} rank(s)"
            " (context-, tensor- or expert-parallel size): they must be equal"
        )
    if not 0 <= rank < world:
        raise Dsv41rtError(f"RANK {rank} outside [0, WORLD_SIZE {world})")
    gpu = options.device.startswith("cuda")
    device = f"cuda:{local_rank}" if gpu else options.device
    comm = "nccl" if gpu else "socket"
    group_id = _exchange_group_id(rank, world, gpu)
    options = options.replace(device=device, context_parallel_backend=comm, context_parallel_processes=False)
    rt = Runtime(checkpoint, device, options=options, rank=rank, group_id=group_id, **runtime_kw)
    if rank > 0:
        rt.run_cp_worker()
        raise SystemExit(0)
    try:
        yield rt
    finally:
        rt.close()  # the shutdown message ends the workers


def _exchange_group_id(rank: int, world: int, gpu: bool) -> bytes:
    """Rank 0 makes the group's id (an NCCL unique id, or its host:port for TCP) and publishes it in
    torchrun's TCP store (MASTER_ADDR:MASTER_PORT); the others read it there."""
    from datetime import timedelta

    from torch.distributed import TCPStore

    host, port = os.environ.get("MASTER_ADDR", "127.0.0.1"), int(os.environ.get("MASTER_PORT", "29500"))
    store = TCPStore(host, port, world, is_master=False, timeout=timedelta(seconds=300))
    key = "dsv41rt/group_id"
    if rank == 0:
        if gpu:
            from . import comm as nccl

            uid = nccl.nccl_unique_id()
        else:
            uid = f"{host}:{_free_port()}".encode()
        store.set(key, uid.hex())  # hex: the store takes text, an NCCL id is binary
        return uid
    return bytes.fromhex(store.get(key).decode())
