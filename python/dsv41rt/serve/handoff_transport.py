"""How a request's state blob moves from a prefill server to its decode server
(`handoff-transport`; docs/design/disaggregation.md):

  - "http": the prefill server's GET HANDOFF_ROUTE/{id} answer carries the bytes;
  - "nixl": the prefill server keeps each blob in NIXL-registered memory (`NixlPeer.lend`) and its
    GET answer carries a `NixlManifest` instead (agent name and metadata, serialized descriptors,
    size, CRC-32); the decode server READs the bytes with NIXL into memory it registered
    (`NixlPeer.read`), checks size and CRC-32, and the READ's notification (the handoff id) tells
    the prefill server it may free the blob. `handoff-memory` says which memory: host memory
    (UCX over shared memory or TCP) or, on CUDA servers, device memory (UCX's CUDA IPC between
    processes on one GPU or host, RDMA across hosts).

The checked bytes go to the unchanged import path (Runtime.add_handoff_request), whose C++ side
checks the blob's own header and FNV-1a checksum again.
"""

from __future__ import annotations

import asyncio
import base64
import os
import threading
import time
import uuid
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import Dsv41rtError

TRANSPORTS = ("nixl", "http")
#: Where lent and read blobs lie: "host" (DRAM), "device" (VRAM of the server's GPU), "auto" =
#: device on a CUDA server, host otherwise.
MEMORIES = ("auto", "host", "device")
#: The decode server's transport, sent with its GET so that a mismatched pair is a clear error.
TRANSPORT_HEADER = "x-dsv41rt-handoff-transport"
NIXL_PACKAGE = "nixl-cu13"
#: UCX's switch for GET over CUDA IPC (`auto`: only with NVLink); read when the agent's UCX starts.
CUDA_IPC_GET_ENV = "UCX_CUDA_IPC_ENABLE_GET_ZCOPY"


def import_nixl() -> Any:
    """The nixl_cu13 module, or a Dsv41rtError naming the package and the extra to install."""
    try:
        import nixl_cu13
    except ImportError as err:
        raise Dsv41rtError(
            f"handoff-transport: nixl needs the {NIXL_PACKAGE} package ({err}): pip install 'dsv41rt[disagg]' "
            "(or set handoff-transport: http on both servers of the pair)"
        ) from None
    return nixl_cu13


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


@dataclass(frozen=True)
class NixlManifest:
    """Where a lent blob lies: enough for a decode server to READ it and check what arrived."""

    agent: str  # the prefill server's NIXL agent
    metadata: bytes  # that agent's connection info and this blob's registration (add_remote_agent)
    descs: bytes  # the blob's serialized descriptor list (deserialize_descs)
    size: int
    crc32: int

    def to_json(self) -> dict[str, Any]:
        return {
            "agent": self.agent,
            "metadata": _b64(self.metadata),
            "descs": _b64(self.descs),
            "size": self.size,
            "crc32": self.crc32,
        }

    @staticmethod
    def from_json(d: Any) -> NixlManifest:
        """ValueError naming the field a malformed manifest gets wrong."""
        if not isinstance(d, dict):
            raise ValueError(f"handoff: the NIXL manifest must be an object, got {type(d).__name__}")
        try:
            m = NixlManifest(
                str(d["agent"]),
                base64.b64decode(d["metadata"], validate=True),
                base64.b64decode(d["descs"], validate=True),
                int(d["size"]),
                int(d["crc32"]),
            )
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"handoff: malformed NIXL manifest ({type(err).__name__}: {err})") from None
        if m.size <= 0 or not m.agent:
            raise ValueError(f"handoff: NIXL manifest of {m.size} bytes from agent {m.agent!r}")
        return m


class _Region:
    """One blob's memory for NIXL: host (numpy) or device (a torch CUDA tensor). Keeps the memory
    alive while registered; `kind` and `dev` are NIXL's memory type and device id."""

    def __init__(self, nbytes: int, device: int | None, data: bytes | None = None) -> None:
        self.nbytes, self.dev = nbytes, device if device is not None else 0
        self.kind = "DRAM" if device is None else "VRAM"
        if device is None:
            host = np.frombuffer(data, dtype=np.uint8).copy() if data is not None else np.empty(nbytes, np.uint8)
            self.mem: Any = host
            self.addr = int(self.mem.ctypes.data)
        else:
            torch = import_torch_cuda()
            self.mem = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{device}")
            if data is not None:
                self.mem.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
                torch.cuda.synchronize(device)  # the bytes are in place before any peer reads them
            self.addr = int(self.mem.data_ptr())

    def reg_desc(self) -> list[tuple[int, int, int, str]]:
        return [(self.addr, self.nbytes, self.dev, "")]

    def xfer_desc(self) -> list[tuple[int, int, int]]:
        return [(self.addr, self.nbytes, self.dev)]

    def tobytes(self) -> bytes:
        if self.kind == "DRAM":
            return self.mem.tobytes()
        return bytes(self.mem.cpu().numpy().tobytes())


def import_torch_cuda() -> Any:
    """torch with a usable CUDA device, or a Dsv41rtError saying what handoff-memory: device needs."""
    try:
        import torch
    except ImportError:
        raise Dsv41rtError("handoff-memory: device needs torch with CUDA (or set handoff-memory: host)") from None
    if not torch.cuda.is_available():
        raise Dsv41rtError("handoff-memory: device needs a CUDA device visible to torch (or set handoff-memory: host)")
    return torch


def resolve_memory(memory: str, runtime_device: str) -> int | None:
    """NIXL's device id for `handoff-memory` on a server running on `runtime_device` ("cpu",
    "cuda", "cuda:N"), or None for host memory. Dsv41rtError for device memory on a CPU server."""
    on_cuda = runtime_device.startswith("cuda")
    if memory == "host" or (memory == "auto" and not on_cuda):
        return None
    if not on_cuda:
        raise Dsv41rtError(f"handoff-memory: device needs a CUDA server (device: {runtime_device})")
    return int(runtime_device.split(":", 1)[1]) if ":" in runtime_device else 0


@dataclass(frozen=True)
class _Lent:
    region: _Region  # keeps the registered memory alive
    reg: Any  # the nixlRegDList, for deregister_memory
    manifest: NixlManifest
    since: float


class TransferError(Exception):
    """A NIXL read that failed, timed out or brought bytes other than the manifest's."""


async def wait_done(check: Any, timeout: float, what: str) -> None:
    """Polls `check()` ("PROC", "DONE" or "ERR") until DONE; TransferError on ERR or after
    `timeout` seconds (a stuck transfer must not hold the request forever). Polls in bursts of
    SPIN_S without sleeping (a READ of a few MiB takes milliseconds; each check also progresses
    UCX), yielding to the event loop between bursts so that other requests are served."""
    deadline = time.monotonic() + timeout
    while True:
        burst_end = time.monotonic() + SPIN_S
        while True:
            state = check()
            if state == "DONE":
                return
            if state == "ERR":
                raise TransferError(f"{what} failed")
            now = time.monotonic()
            if now >= deadline:
                raise TransferError(f"{what} did not finish within {timeout:g} s (state {state})")
            if now >= burst_end:
                break
        await asyncio.sleep(0)


#: How long one burst of polling holds the event loop.
SPIN_S = 0.001


class NixlPeer:
    """This process's NIXL agent (one per server): lends blobs on a prefill server, reads them on a
    decode server. Every agent call holds one lock: the engine's output thread lends, the event
    loop takes, reads and reaps, and the agent is created without thread synchronisation."""

    def __init__(self, role: str, device: int | None = None) -> None:
        """`device`: the CUDA device whose memory holds lent and read blobs (NIXL VRAM), or None
        for host memory (`resolve_memory`)."""
        nixl = import_nixl()
        if device is not None:
            import_torch_cuda()
            # UCX's CUDA IPC transport turns GET (the decode side's READ) off where it sees no
            # NVLink ("auto"), e.g. two servers on one GPU, and such READs fell back to TCP over
            # loopback (measured on an H100, session 31). A user's own setting wins.
            os.environ.setdefault(CUDA_IPC_GET_ENV, "y")
        self.device = device
        self.memory = "DRAM" if device is None else "VRAM"
        name = f"dsv41rt-{role}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._lock = threading.Lock()
        self._agent = nixl.nixl_agent(name, nixl.nixl_agent_config(backends=["UCX"]))
        if "UCX" not in self._agent.backends:
            raise Dsv41rtError(f"handoff-transport: nixl: {NIXL_PACKAGE} has no UCX backend plugin")
        self.name = name
        self._lent: dict[str, _Lent] = {}
        self._taken: dict[str, float] = {}  # handoff id -> when its manifest was handed out
        self._remotes: set[str] = set()
        self._stuck: list[tuple[_Region, Any]] = []

    # -- prefill side ---------------------------------------------------------------------------
    def lend(self, handoff_id: str, state: bytes) -> NixlManifest:
        """Copies `state` into memory registered with NIXL until `release` (or the reader's
        notification, seen by `reap`)."""
        region = _Region(len(state), self.device, state)
        with self._lock:
            reg = self._agent.register_memory(region.reg_desc(), region.kind)
            descs = self._agent.get_serialized_descs(self._agent.get_xfer_descs(region.xfer_desc(), region.kind))
            # Partial metadata of this registration (the agent's full metadata is only as new as
            # its last registration); a reader loads it with each blob.
            metadata = self._agent.get_partial_agent_metadata(reg, True)
            m = NixlManifest(self.name, metadata, descs, region.nbytes, zlib.crc32(state))
            old = self._lent.pop(handoff_id, None)
            self._lent[handoff_id] = _Lent(region, reg, m, time.monotonic())
            if old is not None:
                self._agent.deregister_memory(old.reg)
        return m

    def manifest(self, handoff_id: str) -> NixlManifest | None:
        """The lent blob's manifest, handed to its decode server: from now on the blob waits for
        that server's read (`reap` frees it on the notification, or `read_timeout` later)."""
        with self._lock:
            lent = self._lent.get(handoff_id)
            if lent is not None:
                self._taken[handoff_id] = time.monotonic()
            return lent.manifest if lent else None

    def release(self, handoff_id: str) -> None:
        with self._lock:
            self._release(handoff_id)

    def _release(self, handoff_id: str) -> None:
        lent = self._lent.pop(handoff_id, None)
        self._taken.pop(handoff_id, None)
        if lent is not None:
            self._agent.deregister_memory(lent.reg)

    def reap(self, read_timeout: float) -> int:
        """Frees the blobs whose reader sent its notification, and those handed out more than
        `read_timeout` seconds ago (a decode server that died before reading). Returns how many."""
        with self._lock:
            done = [m.decode("ascii", "replace") for msgs in self._agent.get_new_notifs().values() for m in msgs]
            now = time.monotonic()
            late = [k for k, t in self._taken.items() if now - t > read_timeout]
            freed = 0
            for handoff_id in {*done, *late}:
                if handoff_id in self._lent:
                    self._release(handoff_id)
                    freed += 1
            return freed

    def registered(self) -> int:
        """Blobs held in registered memory now."""
        with self._lock:
            return len(self._lent)

    # -- decode side ----------------------------------------------------------------------------
    async def read(self, m: NixlManifest, handoff_id: str, timeout: float) -> bytes:
        """The lent blob's bytes, READ into registered memory of this process; TransferError when
        the read fails, does not finish within `timeout` seconds, or brings bytes whose size or
        CRC-32 differ from the manifest's. The READ's notification (the handoff id) tells the
        prefill server it may free the blob."""
        what = f"NIXL read of {m.size} bytes from agent {m.agent}"
        buf = _Region(m.size, self.device)
        with self._lock:
            try:
                self._agent.add_remote_agent(m.metadata)  # connects once; adds this blob's registration
                self._remotes.add(m.agent)
                remote = self._agent.deserialize_descs(m.descs)
                reg = self._agent.register_memory(buf.reg_desc(), buf.kind)
            except Exception as err:  # nixlBind raises its own types: bad metadata or descriptors
                raise TransferError(f"{what}: {type(err).__name__}: {err}") from None
        handle = None
        try:
            with self._lock:
                local = self._agent.get_xfer_descs(buf.xfer_desc(), buf.kind)
                handle = self._agent.initialize_xfer("READ", local, remote, m.agent, handoff_id.encode())
                if self._agent.transfer(handle) == "ERR":
                    raise TransferError(f"{what} failed to start")

            def check() -> str:
                with self._lock:
                    return str(self._agent.check_xfer_state(handle))

            await wait_done(check, timeout, what)
        except TransferError:
            self._forget(m.agent)
            raise
        except Exception as err:  # nixlBind's errors (a descriptor list that does not match, ...)
            self._forget(m.agent)
            raise TransferError(f"{what}: {type(err).__name__}: {err}") from None
        finally:
            with self._lock:
                released = handle is None
                if handle is not None:
                    try:
                        self._agent.release_xfer_handle(handle)
                        released = True
                    except Exception:  # a transfer NIXL could not abort may still write into `buf`
                        pass
                if released:
                    self._agent.deregister_memory(reg)
                else:
                    self._stuck.append((buf, reg))  # kept alive, never freed under a running transfer
        data = buf.tobytes()
        crc = zlib.crc32(data)
        if crc != m.crc32:
            raise TransferError(f"{what}: CRC-32 {crc:#010x}, the manifest says {m.crc32:#010x}")
        return data

    def _forget(self, agent: str) -> None:
        """After a failure: drop the peer's metadata so that the next read connects afresh."""
        with self._lock:
            if agent in self._remotes:
                self._remotes.discard(agent)
                try:
                    self._agent.remove_remote_agent(agent)
                except Exception:  # already gone with its connection
                    pass
