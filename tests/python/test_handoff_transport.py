"""The NIXL transport of the prefill/decode handoff (serve/handoff_transport.py; issue 26): blobs
lent by one agent and READ by another arrive intact, a read that brings other bytes or never
finishes is a TransferError (before anything is imported), and lent memory is freed once read,
dropped or expired. Two agents in this process, or a lender in a child process that is killed."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest
from dsv41rt.runtime import StepOutput
from dsv41rt.serve.disaggregation import Handoff, HandoffStore
from dsv41rt.serve.handoff_transport import NixlManifest, NixlPeer, TransferError, wait_done


@pytest.fixture(scope="module")
def pair() -> tuple[NixlPeer, NixlPeer]:
    return NixlPeer("prefill"), NixlPeer("decode")


def _reap_until(peer: NixlPeer, registered: int, timeout: float = 10.0) -> None:
    """Notifications arrive asynchronously: reap until `registered` blobs are left."""
    deadline = time.monotonic() + timeout
    while peer.registered() != registered:
        assert time.monotonic() < deadline, f"{peer.registered()} blobs still registered, want {registered}"
        peer.reap(read_timeout=60)
        time.sleep(0.01)


def test_random_blobs_round_trip_and_are_freed_once_read(pair) -> None:
    lender, reader = pair
    rng = np.random.default_rng(26)
    for i, n in enumerate([1, 7, 4096, 65537, 3 << 20]):
        blob = rng.bytes(n)
        m = lender.lend(f"blob-{i}", blob)
        assert (m.size, m.agent) == (n, lender.name)
        wire = NixlManifest.from_json(json.loads(json.dumps(m.to_json())))  # as the GET answer carries it
        assert wire == m
        assert lender.manifest(f"blob-{i}") == m
        got = asyncio.run(reader.read(wire, f"blob-{i}", timeout=30))
        assert got == blob, f"blob of {n} bytes"
        _reap_until(lender, 0)  # the READ's notification freed it


def test_a_corrupted_or_short_transfer_is_refused(pair) -> None:
    lender, reader = pair
    blob = np.random.default_rng(1).bytes(10_000)
    m = lender.lend("c", blob)
    # Bytes that differ from what the manifest's CRC-32 describes (corrupted in flight or at rest).
    lender._lent["c"].region.mem[5000] ^= 0xFF
    with pytest.raises(TransferError, match="CRC-32"):
        asyncio.run(reader.read(m, "c", timeout=30))
    # A manifest promising more bytes than the lent region holds: the read is refused.
    longer = NixlManifest(m.agent, m.metadata, m.descs, m.size + 1, m.crc32)
    with pytest.raises(TransferError, match=r"NIXL read of 10001 bytes"):
        asyncio.run(reader.read(longer, "c", timeout=30))
    # Fewer bytes than lent: the checksum of the prefix is not the blob's.
    shorter = NixlManifest(m.agent, m.metadata, m.descs, m.size - 1, m.crc32)
    with pytest.raises(TransferError):
        asyncio.run(reader.read(shorter, "c", timeout=30))
    lender.release("c")
    assert lender.registered() == 0


def test_malformed_manifests_name_the_problem() -> None:
    with pytest.raises(ValueError, match="must be an object"):
        NixlManifest.from_json([1])
    with pytest.raises(ValueError, match="malformed NIXL manifest"):
        NixlManifest.from_json({"agent": "a", "metadata": "!!", "descs": "", "size": 3, "crc32": 0})
    with pytest.raises(ValueError, match="NIXL manifest of 0 bytes"):
        NixlManifest.from_json({"agent": "a", "metadata": "", "descs": "", "size": 0, "crc32": 0})


def test_a_transfer_that_never_finishes_times_out_and_an_error_is_reported() -> None:
    start = time.monotonic()
    with pytest.raises(TransferError, match=r"did not finish within 0.2 s \(state PROC\)"):
        asyncio.run(wait_done(lambda: "PROC", 0.2, "NIXL read"))
    assert 0.2 <= time.monotonic() - start < 5
    with pytest.raises(TransferError, match="NIXL read failed"):
        asyncio.run(wait_done(lambda: "ERR", 10, "NIXL read"))
    states = iter(["PROC", "PROC", "DONE"])
    asyncio.run(wait_done(lambda: next(states), 10, "NIXL read"))


def _handoff(state: bytes | None) -> Handoff:
    reason = "length" if state is None else None
    first = StepOutput(3, [42], state is None, reason, [-0.5], [{42: -0.5}])
    return Handoff([0, 5, 6], first, state)


def test_the_store_lends_at_put_and_frees_on_take_drop_and_expiry(pair) -> None:
    lender, reader = pair
    store = HandoffStore(ttl=0.3, capacity=2, nixl=lender)
    blob = np.random.default_rng(2).bytes(50_000)
    store.put("a", _handoff(blob))
    store.put("none", _handoff(None))  # ended at its first token: nothing to lend
    assert lender.registered() == 1
    taken = store.take("a")
    assert taken is not None
    h, m = taken
    assert m is not None and m.size == len(blob)
    # What the decode server gets over HTTP: the header and the manifest, not the state.
    wire = h.encode(m)
    assert len(wire) < len(blob)
    h2, m2 = Handoff.decode(wire)
    assert m2 == m and h2.state is None and h2.prompt == h.prompt
    assert asyncio.run(reader.read(m2, "a", timeout=30)) == blob
    _reap_until(lender, 0)
    # Dropped for capacity (oldest first) and expired: deregistered without any read.
    for k in ("b", "c", "d"):
        store.put(k, _handoff(blob))
    assert lender.registered() == 2 and store.take("b") is None
    time.sleep(0.4)
    store.reap()
    assert lender.registered() == 0 and len(store) == 0
    # Taken but never read (its decode server died): freed `ttl` after the take.
    store = HandoffStore(ttl=0.3, nixl=lender)
    store.put("e", _handoff(blob))
    assert store.take("e") is not None and lender.registered() == 1
    time.sleep(0.4)
    store.reap()
    assert lender.registered() == 0


class _FailingLender(NixlPeer):
    def __init__(self) -> None:  # no agent: lend fails as a registration error would
        pass

    def lend(self, handoff_id: str, state: bytes) -> NixlManifest:
        raise RuntimeError("NIXL_ERR_BACKEND")

    def manifest(self, handoff_id: str) -> NixlManifest | None:
        return None  # as NixlPeer.manifest of a state it never lent

    def reap(self, read_timeout: float) -> int:
        return 0


def test_a_state_that_cannot_be_lent_goes_in_the_http_answer() -> None:
    """put runs on the engine's output thread: a failed registration must not raise there."""
    store = HandoffStore(nixl=_FailingLender())
    store.put("f", _handoff(b"state"))
    taken = store.take("f")
    assert taken is not None and taken[1] is None
    h, m = Handoff.decode(taken[0].encode(taken[1]))
    assert m is None and h.state == b"state"


_CHILD = """
import json, sys, time
from dsv41rt.serve.handoff_transport import NixlPeer
peer = NixlPeer("prefill")
peer.lend("k", bytes(range(256)) * 4096)
print(json.dumps(peer.manifest("k").to_json()), flush=True)
time.sleep(600)
"""


def test_a_killed_lender_is_a_clear_error_not_a_hang(pair) -> None:
    """The prefill server dies after handing out the manifest, before the decode server reads."""
    _, reader = pair
    child = subprocess.Popen([sys.executable, "-c", _CHILD], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        while line and not line.startswith("{"):  # NIXL logs to stdout too
            line = child.stdout.readline()
        m = NixlManifest.from_json(json.loads(line))
    finally:
        child.kill()
        child.wait()
    start = time.monotonic()
    with pytest.raises(TransferError, match=f"from agent {m.agent}"):
        asyncio.run(reader.read(m, "k", timeout=5))
    assert time.monotonic() - start < 10


def test_handoff_memory_resolves_per_server_device() -> None:
    """auto = device memory on a CUDA server (its device id), host memory on a CPU one; device
    memory on a CPU server is refused by name, in the config and in resolve_memory."""
    from dsv41rt.errors import Dsv41rtError
    from dsv41rt.serve.config import build_config
    from dsv41rt.serve.handoff_transport import resolve_memory

    assert resolve_memory("auto", "cpu") is None
    assert resolve_memory("auto", "cuda") == 0
    assert resolve_memory("auto", "cuda:3") == 3
    assert resolve_memory("host", "cuda:1") is None
    assert resolve_memory("device", "cuda:1") == 1
    with pytest.raises(Dsv41rtError, match="handoff-memory: device needs a CUDA server"):
        resolve_memory("device", "cpu")
    assert build_config(None, {"handoff_memory": "host"}).handoff_memory == "host"
    with pytest.raises(Dsv41rtError, match="handoff-memory: must be one of auto, host, device, got 'vram'"):
        build_config(None, {"handoff_memory": "vram"})
    with pytest.raises(Dsv41rtError, match=r"handoff-memory: device needs a CUDA server \(device: cpu\)"):
        build_config(None, {"handoff_memory": "device"})


@pytest.mark.cuda
def test_device_memory_blobs_round_trip_between_processes() -> None:
    """Device memory on both sides (NIXL VRAM; UCX's CUDA IPC between two processes on one GPU):
    a lender in another process, blobs of several sizes read here bitwise and freed once read."""
    lender = subprocess.Popen(
        [sys.executable, "-c", _DEVICE_LENDER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        from dsv41rt.serve.handoff_transport import CUDA_IPC_GET_ENV

        preset = os.environ.get(CUDA_IPC_GET_ENV)
        reader = NixlPeer("decode", device=0)
        assert reader.memory == "VRAM"
        # GET over CUDA IPC without NVLink (UCX turns it off there by default), unless set already.
        assert os.environ[CUDA_IPC_GET_ENV] == (preset or "y")
        rng = np.random.default_rng(2626)
        for i, n in enumerate([1, 4097, 3 << 20]):
            blob = rng.bytes(n)
            assert lender.stdin is not None and lender.stdout is not None
            lender.stdin.write(json.dumps({"id": f"d{i}", "hex": blob.hex()}) + "\n")
            lender.stdin.flush()
            line = lender.stdout.readline()
            while line and not line.startswith("manifest "):  # NIXL and UCX log to stdout too
                line = lender.stdout.readline()
            m = NixlManifest.from_json(json.loads(line.removeprefix("manifest ")))
            assert m.size == n
            assert asyncio.run(reader.read(m, f"d{i}", timeout=30)) == blob, f"blob of {n} bytes"
    finally:
        if lender.stdin is not None:
            lender.stdin.close()
        assert lender.wait(timeout=60) == 0


_DEVICE_LENDER = """
import json, sys
from dsv41rt.serve.handoff_transport import NixlPeer
peer = NixlPeer("prefill", device=0)
assert peer.memory == "VRAM"
for line in sys.stdin:
    req = json.loads(line)
    m = peer.lend(req["id"], bytes.fromhex(req["hex"]))
    print("manifest " + json.dumps(m.to_json()), flush=True)
    peer.reap(read_timeout=60)
"""
