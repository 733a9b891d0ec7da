"""Context parallelism with one process per rank: rank 0 (this process) runs the engine, ranks
1..P-1 are `dsv41rt cp-worker` processes that replay rank 0's calls (docs/design/context-parallel.md):
over NCCL on GPUs base+1..base+P-1, or over TCP sockets on any device (how the mode is tested
without GPUs). Every rank gets the same pool and model options, or the paged
state would not line up.

    with cp_processes(checkpoint, cp_size=2, device="cuda:0", kv_memory=8 << 30) as rt:
        rt.generate(...)
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

#: Runtime options that must be the same on every rank (they shape the pool and the numerics).
SHARED_OPTIONS = ("kv_memory", "max_running", "token_budget", "max_context", "page_tokens", "cache_quant", "precision")


def worker_argv(
    checkpoint: str, rank: int, size: int, device: str, id_file: str, comm: str, options: dict[str, Any]
) -> list[str]:
    argv = [sys.executable, "-m", "dsv41rt", "cp-worker", "--checkpoint", checkpoint]
    argv += ["--rank", str(rank), "--size", str(size), "--device", device, "--id-file", id_file, "--cp-comm", comm]
    for name in SHARED_OPTIONS:
        if name in options:
            value = options[name]
            argv += [f"--{name.replace('_', '-')}", str(int(value) if isinstance(value, bool) else value)]
    return argv


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def cp_processes(
    checkpoint: str, cp_size: int, device: str = "cuda:0", comm: str = "nccl", **options: Any
) -> Iterator[Any]:
    """A rank-0 Runtime whose CP ranks 1..cp_size-1 run in worker processes: over NCCL one GPU
    each (rank r on cuda:N+r), or over TCP sockets on any device (comm="socket": every rank on
    `device`, e.g. "cpu")."""
    from .runtime import Runtime

    unknown = set(options) - set(SHARED_OPTIONS) - {"multistream", "cuda_graphs", "progress"}
    if unknown:
        raise Dsv41rtError(f"cp_processes: unsupported options {sorted(unknown)}")
    if comm not in ("nccl", "socket"):
        raise Dsv41rtError(f"cp_processes: comm must be 'nccl' or 'socket', got {comm!r}")
    if comm == "nccl" and (not device.startswith("cuda:") or not device[5:].isdigit()):
        raise Dsv41rtError(f"cp_processes: device must be cuda:N (rank r runs on cuda:N+r), got {device!r}")
    if cp_size < 2:
        raise Dsv41rtError(f"cp_processes: cp_size must be >= 2, got {cp_size}")
    if comm == "nccl":
        from . import comm as nccl

        uid = nccl.nccl_unique_id()
        base = int(device[5:])
        devices = [f"cuda:{base + r}" for r in range(cp_size)]
    else:
        uid = f"127.0.0.1:{_free_port()}".encode()
        devices = [device] * cp_size
    with tempfile.TemporaryDirectory() as tmp:
        id_file = os.path.join(tmp, "nccl_id")
        with open(id_file, "wb") as f:
            f.write(uid)
        procs = [
            subprocess.Popen(worker_argv(checkpoint, r, cp_size, devices[r], id_file, comm, options))
            for r in range(1, cp_size)
        ]
        rt = None
        try:
            rt = Runtime(checkpoint, devices[0], cp_size=cp_size, cp_comm=comm, cp_rank=0, cp_id=uid, **options)
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
