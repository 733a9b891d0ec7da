"""Runtime.rollback_handle through the bindings (the C++ suite tests/cpp/test_rollback.cc covers
the lengths in depth): positions fed undoably and taken back leave a handle that continues
bitwise as a fresh one fed only the kept tokens, with its pages given back; bad requests raise
Dsv41rtError with the status code."""

from __future__ import annotations

import pytest
import rollback_util
from dsv41rt.errors import Dsv41rtError
from rollback_util import check_rollback_continues

HIGH = 129000  # token ids below tiny-v41's vocabulary


def ids(n: int, seed: int) -> list[int]:
    return rollback_util.ids(n, seed, HIGH)


@pytest.fixture(scope="module")
def rt(tiny_v41_dir):
    from dsv41rt.runtime import Runtime

    runtime = Runtime(tiny_v41_dir)
    yield runtime
    runtime.close()


@pytest.mark.parametrize(("a", "k", "r"), [(1, 0, 6), (9, 3, 4), (61, 2, 5), (70, 0, 20)])
def test_rollback_continues_as_a_fresh_handle(rt, a: int, k: int, r: int) -> None:
    check_rollback_continues(rt, a, k, r, 0, HIGH)


def test_bad_rollbacks_raise_with_their_code(rt) -> None:
    h = rt.new_handle()
    with pytest.raises(Dsv41rtError) as e:
        rt.rollback_handle(h + 1000, 1)
    assert e.value.code == "not_found"
    with pytest.raises(Dsv41rtError, match="no undoable forward") as e:
        rt.rollback_handle(h, 1)
    assert e.value.code == "out_of_range"
    rt.forward_tokens(h, ids(5, 3), undoable=True)
    with pytest.raises(Dsv41rtError) as e:
        rt.rollback_handle(h, -1)
    assert e.value.code == "invalid_argument"
    with pytest.raises(Dsv41rtError, match="at most 5") as e:
        rt.rollback_handle(h, 6)
    assert e.value.code == "out_of_range"
    rt.rollback_handle(h, 5)
    assert rt.rollback_limit(h) == 0
    rt.check_invariants()
    rt.release_handle(h)
