"""NCCL collectives for multi-GPU runs: the ``dsv41rt._core.comm`` binding with NCCL located.

libdsv41rt never links NCCL: the C++ loader dlopens ``libnccl.so.2`` at first use (search order in
cpp/comm/nccl_loader.h). Importing this module first adds the ``nvidia-nccl-cu13`` pip package
(which torch's CUDA wheels install) to ``DSV41RT_NCCL_SEARCH_PATH``, so the loader finds it
wherever pip put it; ``DSV41RT_NCCL_LIBRARY=/path/libnccl.so.2`` overrides everything.

Raw API: device pointers and cudaStream_t handles as ints (``NcclComm(unique_id, rank, size,
device)``, ``NcclComm.single(device)``; methods ``all_gather``, ``reduce_scatter``,
``all_reduce``, ``all_to_all``, ``barrier``, ``close``). The functions below wrap it for torch
tensors and check sizes and dtypes first, which the raw API cannot::

    from dsv41rt import comm
    c = comm.NcclComm.single(0)
    comm.all_reduce(c, x)  # in place, on torch.cuda.current_stream()
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

_SEARCH_PATH_ENV = "DSV41RT_NCCL_SEARCH_PATH"


def _add_pip_nccl_to_search_path() -> None:
    """Appends nvidia/nccl/lib of the nvidia-nccl-cu13 package (if installed) to the loader's path."""
    try:
        # nvidia.nccl is a namespace package (no __init__.py): its directories are the spec's
        # search locations. find_spec does not import it, only the (empty) nvidia namespace.
        spec = importlib.util.find_spec("nvidia.nccl")
    except (ImportError, ValueError):
        return
    if spec is None or not spec.submodule_search_locations:
        return
    current = [d for d in os.environ.get(_SEARCH_PATH_ENV, "").split(os.pathsep) if d]
    found = [os.path.join(d, "lib") for d in spec.submodule_search_locations]
    # Directories the user set keep their priority.
    os.environ[_SEARCH_PATH_ENV] = os.pathsep.join(current + [d for d in found if d not in current])


_add_pip_nccl_to_search_path()

from . import _core  # noqa: E402  (after the search path: the library loads on first use)

NcclComm = _core.comm.NcclComm
#: Whether this build compiled NcclComm at all (nccl.h found at build time, CUDA backend on).
built_with_nccl: bool = bool(_core.comm.built_with_nccl())


def nccl_available() -> bool:
    """True when NCCL is compiled in and libnccl.so.2 loads (a GPU is not checked)."""
    return bool(_core.comm.nccl_available())


def nccl_unique_id() -> bytes:
    """A fresh 128-byte ncclUniqueId; make it on rank 0 and send it to every rank."""
    return _core.comm.nccl_unique_id()


def nccl_library_info() -> str:
    """``'NCCL 2.27.3 (/path/libnccl.so.2)'``; raises if NCCL is not available."""
    return _core.comm.nccl_library_info()


# torch dtype name -> dsv41rt dtype name, for the dtypes NcclComm moves.
_DTYPES = {
    "float32": "f32",
    "bfloat16": "bf16",
    "float16": "f16",
    "float8_e4m3fn": "fp8_e4m3",
    "float8_e8m0fnu": "e8m0",
    "int8": "i8",
    "int32": "i32",
    "int64": "i64",
    "uint8": "u8",
}


def _args(op: str, send: Any, recv: Any, stream: Any) -> tuple[str, int]:
    """Checks a (send, recv) tensor pair; returns (dsv41rt dtype name, cudaStream_t as int)."""
    if send.dtype != recv.dtype:
        raise ValueError(f"{op}: send is {send.dtype} but recv is {recv.dtype}")
    name = _DTYPES.get(str(send.dtype).removeprefix("torch."))
    if name is None:
        raise ValueError(f"{op}: NCCL collectives do not support {send.dtype} (one of {sorted(_DTYPES)})")
    for what, t in (("send", send), ("recv", recv)):
        if not t.is_cuda or not t.is_contiguous():
            raise ValueError(f"{op}: {what} must be a contiguous CUDA tensor")
    if stream is None:
        import torch

        return name, int(torch.cuda.current_stream(send.device).cuda_stream)
    return name, int(getattr(stream, "cuda_stream", stream))


def _expect(op: str, what: str, got: int, want: int) -> None:
    if got != want:
        raise ValueError(f"{op}: {what} has {got} elements, expected {want}")


def all_gather(comm: Any, send: Any, recv: Any, *, stream: Any = None) -> None:
    """recv[size * n] = every rank's send[n], rank-major."""
    _expect("all_gather", "recv", recv.numel(), comm.size * send.numel())
    dtype, s = _args("all_gather", send, recv, stream)
    comm.all_gather(send.data_ptr(), recv.data_ptr(), send.numel(), dtype, s)


def reduce_scatter(comm: Any, send: Any, recv: Any, op: str = "sum", *, stream: Any = None) -> None:
    """recv[n] = the reduction over ranks of chunk `rank` of send[size * n]."""
    _expect("reduce_scatter", "send", send.numel(), comm.size * recv.numel())
    dtype, s = _args("reduce_scatter", send, recv, stream)
    comm.reduce_scatter(send.data_ptr(), recv.data_ptr(), recv.numel(), dtype, op, s)


def all_reduce(comm: Any, send: Any, recv: Any = None, op: str = "sum", *, stream: Any = None) -> None:
    """recv[n] = the reduction over ranks of send[n]; recv=None reduces in place."""
    recv = send if recv is None else recv
    _expect("all_reduce", "recv", recv.numel(), send.numel())
    dtype, s = _args("all_reduce", send, recv, stream)
    comm.all_reduce(send.data_ptr(), recv.data_ptr(), send.numel(), dtype, op, s)


def all_to_all(comm: Any, send: Any, recv: Any, *, stream: Any = None) -> None:
    """Chunk p of this rank's recv = chunk `rank` of rank p's send (size equal chunks)."""
    _expect("all_to_all", "recv", recv.numel(), send.numel())
    if send.numel() % comm.size:
        raise ValueError(f"all_to_all: {send.numel()} elements do not split into {comm.size} chunks")
    dtype, s = _args("all_to_all", send, recv, stream)
    comm.all_to_all(send.data_ptr(), recv.data_ptr(), send.numel() // comm.size, dtype, s)
