"""
NCCL collectives on raw CUDA device pointers and streams (see dsv41rt.comm).
"""



def built_with_nccl() -> bool:
    """
    Whether this build compiled the NCCL communicator (nccl.h found at configure time).
    """

def nccl_available() -> bool:
    """True when NCCL is compiled in and libnccl.so.2 loads."""

def nccl_library_info() -> str:
    """
    'NCCL <version> (<path of libnccl.so.2>)'; raises when NCCL is not available.
    """

def nccl_unique_id() -> bytes:
    """
    A fresh 128-byte ncclUniqueId: make it on rank 0 and send it to every rank.
    """

class NcclComm:
    """
    One rank of an NCCL group. Buffers are device pointers (ints) on its GPU; collectives are enqueued on `stream` (a cudaStream_t as an int) and may be captured into a CUDA graph.
    """

    def __init__(self, unique_id: bytes, rank: int, size: int, device: int, timeout_ms: int = 600000) -> None:
        """
        `timeout_ms` bounds barrier() and every collective's completion (the watchdog aborts the communicator past it).
        """

    @staticmethod
    def single(device: int, timeout_ms: int = 600000) -> NcclComm:
        """A one-rank group on CUDA device `device`."""

    def check_healthy(self) -> None:
        """Raises the watchdog's reason once it has aborted the communicator."""

    def watch_launch(self, what: str, stream: int) -> None:
        """
        Has the watchdog watch `stream` past work holding this group's collectives that no call of it enqueued (a replayed CUDA graph that captured them).
        """

    @property
    def rank(self) -> int: ...

    @property
    def size(self) -> int: ...

    def all_gather(self, send_ptr: int, recv_ptr: int, count: int, dtype: str, stream: int = 0) -> None: ...

    def reduce_scatter(self, send_ptr: int, recv_ptr: int, count: int, dtype: str, op: str = 'sum', stream: int = 0) -> None: ...

    def all_reduce(self, send_ptr: int, recv_ptr: int, count: int, dtype: str, op: str = 'sum', stream: int = 0) -> None: ...

    def all_to_all(self, send_ptr: int, recv_ptr: int, count: int, dtype: str, stream: int = 0) -> None: ...

    def broadcast(self, buf_ptr: int, count: int, dtype: str, root: int = 0, stream: int = 0) -> None: ...

    def barrier(self) -> None: ...

    def close(self) -> None:
        """
        Destroys the NCCL communicator now (later calls raise). Destroy CUDA graphs that replay its collectives first.
        """
