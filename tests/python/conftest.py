"""Shared fixtures (generated tiny checkpoints, once per session) and the test policy:

- `cuda`-marked tests skip, with the reason, where no CUDA device is visible; with
  DSV41RT_REQUIRE_CUDA=1 (the device scripts) they fail instead, so a GPU run cannot pass by
  skipping. A broken build (dsv41rt._core failing to import) is an error, never "no GPU".
- Every other skip is an "unexpected skip", counted in the summary; with DSV41RT_FORBID_SKIPS=1 (CI)
  any unexpected skip fails the run.
"""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest


def _cuda_status() -> tuple[bool, str]:
    """(usable, why): a CUDA device visible to libdsv41rt, or the reason there is none."""
    if shutil.which("nvidia-smi") is None:
        return False, "no NVIDIA driver (nvidia-smi not found)"
    from dsv41rt import _core  # an import error propagates: a broken build is not "no GPU"

    n = _core.cuda_device_count()
    return n > 0, f"{n} CUDA devices visible to libdsv41rt"


def pytest_runtest_setup(item: pytest.Item) -> None:
    if "cuda" not in item.keywords:
        return
    usable, why = _cuda_status()
    if usable and "multi_gpu" in item.keywords:
        from dsv41rt import _core

        usable, why = _core.cuda_device_count() >= 2, "fewer than 2 CUDA devices"
    if usable:
        return
    if os.environ.get("DSV41RT_REQUIRE_CUDA") == "1":
        pytest.fail(f"DSV41RT_REQUIRE_CUDA=1 but the test cannot use a GPU: {why}")
    pytest.skip(f"needs an NVIDIA GPU ({why})")


_unexpected_skips: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and "cuda" not in report.keywords:
        _unexpected_skips.append(report.nodeid)


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    terminalreporter.write_line(f"skip policy: {len(_unexpected_skips)} unexpected skips (tests not marked cuda)")
    for nodeid in _unexpected_skips:
        terminalreporter.write_line(f"  unexpected skip: {nodeid}")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _unexpected_skips and os.environ.get("DSV41RT_FORBID_SKIPS") == "1":
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def require_oracle_packages() -> None:
    """Skip when the reference packages are absent, unless CI demands them (then fail loudly)."""
    missing = []
    for mod in ("torch", "transformers", "nemo_automodel"):
        try:
            __import__(mod)
        except ImportError:
            missing.append(mod)
    if missing:
        msg = f"oracle packages missing: {', '.join(missing)} (run scripts/setup.sh)"
        if os.environ.get("DSV41RT_REQUIRE_ORACLE") == "1":
            pytest.fail(msg)
        pytest.skip(msg)


@pytest.fixture
def rng():
    """A fresh seed per test (printed, so a failure can be replayed): (generator, seed)."""
    seed = int(np.random.SeedSequence().entropy % (1 << 32))
    print(f"seed {seed}")
    return np.random.default_rng(seed), seed


@pytest.fixture(scope="session")
def tiny_v41_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    from dsv41rt.checkpoint.generator import make_checkpoint
    from dsv41rt.config.presets import preset_config_json

    out = str(tmp_path_factory.mktemp("ck") / "tiny-v41-seed1")
    make_checkpoint(preset_config_json("tiny-v41"), out, 1, name="tiny-v41")
    return out


@pytest.fixture(scope="session")
def tiny_v4_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tiny DeepSeek-V4 checkpoint (SWA, CSA ratio 4, HCA ratio 128, hash-routed layers), seed 1."""
    from dsv41rt.checkpoint.generator import make_checkpoint
    from dsv41rt.config.presets import preset_config_json

    out = str(tmp_path_factory.mktemp("ck") / "tiny-v4-seed1")
    make_checkpoint(preset_config_json("tiny-v4"), out, 1)
    return out


@pytest.fixture(scope="session")
def tiny_v4_d512_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """tiny-v4 at head_dim 512 / qk_rope_head_dim 64 (what V4's quantised cache rows hold), seed 1."""
    from dsv41rt.checkpoint.generator import make_checkpoint
    from dsv41rt.config.presets import preset_config_json

    out = str(tmp_path_factory.mktemp("ck") / "tiny-v4-d512-seed1")
    make_checkpoint(preset_config_json("tiny-v4-d512"), out, 1)
    return out


@pytest.fixture(scope="session")
def released_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tiny checkpoint with the released layer schedule (40 layers), seed 0."""
    from dsv41rt.checkpoint.generator import make_checkpoint
    from dsv41rt.config.presets import preset_config_json

    path = str(tmp_path_factory.mktemp("released"))
    make_checkpoint(preset_config_json("tiny-v41-released-schedule"), path, 0)
    return path


# The server's built-in tiny random model and its chat protocol, for the serve tests that drive the
# routes' code without a server (test_serve_tools*.py); one per test module.
@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    from dsv41rt.serve.tiny_model import ensure_tiny_model

    return ensure_tiny_model(str(tmp_path_factory.mktemp("builtin") / "tiny-v41-seed0"))


@pytest.fixture(scope="module")
def tok(tiny_dir: str):
    from dsv41rt.serve.protocol import Tokenizers

    return Tokenizers(tiny_dir)


@pytest.fixture(scope="module")
def chat(tok):
    from dsv41rt.serve.protocol import ChatProtocol

    return ChatProtocol(tok, ("dsv41rt-tiny-v41",), True, tok.hf.get_vocab_size())
