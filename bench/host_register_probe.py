"""How long cudaHostRegister takes on a read-only file mapping, a /dev/shm mapping and anonymous
memory (diagnosis for Engram tables registered in place; docs/design/parallelism.md).

Usage: python bench/host_register_probe.py {file,fileshared,filesub,shm,anon} MIB   (one registration per
process: run each case under `timeout`, a registration that hangs cannot be cancelled). `filesub`
registers MIB in the middle of a 1 GiB file's whole mapping, as the loader registers a table inside
the checkpoint's mapping; `file` maps the file MAP_PRIVATE (as the loader does), `fileshared`
MAP_SHARED.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import mmap
import os
import sys
import time

PORTABLE, MAPPED, READ_ONLY = 1, 2, 8


def cudart() -> ctypes.CDLL:
    found = sorted(
        glob.glob("/usr/local/cuda*/lib64/libcudart.so*")
        + glob.glob("/usr/local/cuda*/targets/*/lib/libcudart.so*")
        + glob.glob("/usr/local/lib/python3*/*-packages/nvidia/**/libcudart.so*", recursive=True)
        + glob.glob("/usr/lib/python3*/*-packages/nvidia/**/libcudart.so*", recursive=True)
    )
    if not found:
        raise SystemExit("no libcudart found")
    return ctypes.CDLL(found[0])


def main() -> None:
    kind, mib = sys.argv[1], int(sys.argv[2])
    n = mib << 20
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    offset = 0
    if kind in ("file", "fileshared", "filesub", "shm"):
        path = "/dev/shm/register_probe.bin" if kind == "shm" else f"/tmp/register_probe_{kind}.bin"
        size = (1 << 30) if kind == "filesub" else n
        if not os.path.exists(path) or os.path.getsize(path) < size:
            with open(path, "wb") as f:
                for _ in range(0, size, 1 << 24):
                    f.write(os.urandom(1 << 24))
        fd = os.open(path, os.O_RDONLY)
        share = mmap.MAP_SHARED if kind in ("shm", "fileshared") else mmap.MAP_PRIVATE
        base = libc.mmap(None, size, mmap.PROT_READ, share, fd, 0)
        offset = (size - n) // 2 // 4096 * 4096
        p = base + offset
        flags = PORTABLE | MAPPED | READ_ONLY
    else:
        p = libc.mmap(None, n, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
        ctypes.memset(p, 1, n)
        flags = PORTABLE | MAPPED
    rt = cudart()
    rt.cudaFree(ctypes.c_void_p(0))  # the context first: its creation is not the registration's cost
    start = time.perf_counter()
    err = rt.cudaHostRegister(ctypes.c_void_p(p), ctypes.c_size_t(n), ctypes.c_uint(flags))
    print(f"{kind:5s} {mib:5d} MiB: cudaHostRegister -> {err} in {time.perf_counter() - start:.3f} s", flush=True)


if __name__ == "__main__":
    main()
