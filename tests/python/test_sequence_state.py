"""A sequence's cache state handed from one runtime to another (Runtime.export_handle /
import_handle; cpp/runtime/sequence_state.h): the prefill/decode handoff's payload."""

from __future__ import annotations

import numpy as np
import pytest
from dsv41rt.runtime import Runtime

DECODE = [7, 9, 11, 13, 200, 3, 4, 5, 6, 8]


def runtime(path: str, **kw) -> Runtime:
    return Runtime(path, kv_memory=64 << 20, max_num_seqs=4, **kw)


@pytest.mark.parametrize("n", [1, 7, 37, 200])
def test_an_imported_sequence_continues_bitwise(tiny_v41_dir: str, n: int) -> None:
    """Prompts that end inside the first page, past the window ring's wrap, past the first
    compressed entries and across several pages: the importer's decoded logits equal the
    exporter's bit for bit, and both pools stay consistent."""
    a, b = runtime(tiny_v41_dir), runtime(tiny_v41_dir)
    prompt = [0] + [int(t) for t in np.random.default_rng(n).integers(3, 1000, n - 1)]
    h = a.new_handle()
    a.forward_tokens(h, prompt, all_logits=False)
    blob = a.export_handle(h)
    h2 = b.import_handle(blob)
    for t in DECODE:
        assert np.array_equal(a.decode_handles([h], [t]), b.decode_handles([h2], [t])), f"token {t}"
    # Exporting does not change the exported sequence; a second import into the same runtime works.
    h3 = a.import_handle(a.export_handle(h))
    assert np.array_equal(a.decode_handles([h], [1]), a.decode_handles([h3], [1]))
    # Released handles give every slot and page back (the pool's invariants hold with none held).
    for rt, handles in ((a, [h, h3]), (b, [h2])):
        for x in handles:
            rt.release_handle(x)
        rt.check_invariants()


def test_bad_blobs_are_refused_before_taking_pool_memory(tiny_v41_dir: str) -> None:
    a, b = runtime(tiny_v41_dir), runtime(tiny_v41_dir)
    h = a.new_handle()
    a.forward_tokens(h, [0, 5, 6, 7, 8, 9, 10, 11, 12, 13], all_logits=False)
    blob = a.export_handle(h)
    before = b.describe_pool()
    with pytest.raises(Exception, match="shorter than its header"):
        b.import_handle(blob[:10])
    with pytest.raises(Exception, match="truncated or padded"):
        b.import_handle(blob[:-1])
    flipped = bytearray(blob)
    flipped[-3] ^= 0x10
    with pytest.raises(Exception, match="checksum mismatch"):
        b.import_handle(bytes(flipped))
    with pytest.raises(Exception, match="bad magic"):
        b.import_handle(b"XXXXXXXX" + blob[8:])
    with pytest.raises(Exception, match="expected bytes"):
        b.import_handle(bytearray(blob))  # type: ignore[arg-type]
    assert b.describe_pool() == before
    b.check_invariants()  # nothing taken: no handle holds pages in b
    with pytest.raises(Exception, match="unknown sequence handle"):
        a.export_handle(12345)


def test_another_pool_layout_is_named(tiny_v41_dir: str) -> None:
    a, b = runtime(tiny_v41_dir), runtime(tiny_v41_dir, page_size=128)
    h = a.new_handle()
    a.forward_tokens(h, [0, 5, 6, 7], all_logits=False)
    with pytest.raises(Exception, match="pool layout differs"):
        b.import_handle(a.export_handle(h))


def test_another_model_is_named(tiny_v41_dir: str, tmp_path) -> None:
    from dsv41rt.checkpoint.generator import make_checkpoint
    from dsv41rt.config.presets import preset_config_json

    other = str(tmp_path / "released-schedule")
    make_checkpoint(preset_config_json("tiny-v41-released-schedule"), other, 1, name="tiny-v41-released-schedule")
    a, b = runtime(tiny_v41_dir), runtime(other)
    h = a.new_handle()
    a.forward_tokens(h, [0, 5, 6, 7], all_logits=False)
    with pytest.raises(Exception, match="from another model"):
        b.import_handle(a.export_handle(h))


@pytest.mark.cuda
@pytest.mark.parametrize("precision", ["fp32", "fp8"])
def test_cuda_an_imported_sequence_continues_bitwise(tiny_v41_dir: str, precision: str) -> None:
    """The same handoff between two runtimes on one GPU (device pool and Engram history copied
    through the host; run on the H200 by bench/device_session.sh, step suite)."""
    a, b = (runtime(tiny_v41_dir, device="cuda", precision=precision) for _ in range(2))
    prompt = [0] + [int(t) for t in np.random.default_rng(5).integers(3, 1000, 199)]
    h = a.new_handle()
    a.forward_tokens(h, prompt, all_logits=False)
    h2 = b.import_handle(a.export_handle(h))
    for t in DECODE:
        assert np.array_equal(a.decode_handles([h], [t]), b.decode_handles([h2], [t])), f"token {t}"


@pytest.mark.parametrize(
    "group",
    [{"context_parallel_size": 2}, {"tensor_parallel_size": 2, "expert_parallel_size": 2}],
    ids=["cp2", "tp2ep2"],
)
def test_a_parallel_group_exports_and_imports_the_one_rank_state(tiny_v41_dir: str, group: dict) -> None:
    """Every rank of a group holds the whole state, bitwise alike, so the group's export (rank 0's)
    continues in a one-rank runtime exactly as that runtime's own sequence does (a context-parallel
    prefill side of the disaggregated setup), and a one-rank state imported into the group (written
    to every rank) decodes there as in the one-rank runtime. (Blobs are not compared byte for byte:
    they carry bytes no forward wrote, e.g. the rest of a partly filled page.)"""
    one, par = runtime(tiny_v41_dir), runtime(tiny_v41_dir, **group)
    prompt = [0] + [int(t) for t in np.random.default_rng(77).integers(3, 1000, 99)]
    h1, hp = one.new_handle(), par.new_handle()
    one.forward_tokens(h1, prompt, all_logits=False)
    par.forward_tokens(hp, prompt, all_logits=False)
    from_group = one.import_handle(par.export_handle(hp))
    into_group = par.import_handle(one.export_handle(h1))
    for t in DECODE:
        want = one.decode_handles([h1], [t])
        assert np.array_equal(one.decode_handles([from_group], [t]), want), f"token {t} (exported by the group)"
        assert np.array_equal(par.decode_handles([into_group], [t]), want), f"token {t} (imported into the group)"
        assert np.array_equal(par.decode_handles([hp], [t]), want), f"token {t} (the group's own)"
    # A multi-token chunk: under context parallelism each rank computes some of its rows from its
    # own copy of the state, so every rank's import is read.
    chunk = [21, 22, 23, 24, 25, 26]
    want = one.forward_tokens(h1, chunk)
    assert np.array_equal(par.forward_tokens(into_group, chunk), want), "chunk (imported into the group)"
    assert np.array_equal(one.forward_tokens(from_group, chunk), want), "chunk (exported by the group)"
    for rt, handles in ((one, [h1, from_group]), (par, [hp, into_group])):
        for x in handles:
            rt.release_handle(x)
        rt.check_invariants()
