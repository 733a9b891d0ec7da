"""One name and one default per option (docs/options.md): the Python dataclass, the C++ facade, the
C API, `dsv41rt serve` and the `score` / `generate` / `cp-worker` commands agree; the docs table is
the one the code renders; bad values are errors naming the option."""

from __future__ import annotations

import argparse
import os
import re
from dataclasses import fields

import pytest
from dsv41rt.errors import Dsv41rtError
from dsv41rt.options import OPTIONS, RuntimeOptions, markdown_table, options_from_args, to_argv

DOC = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "options.md")


def _core_defaults() -> dict:
    from dsv41rt import _core

    c = _core.RuntimeOptions()
    return {
        "device": c.device.device,
        "precision": c.numerics.precision.name,
        "kv_cache_dtype": c.numerics.kv_cache_dtype.name,
        "kv_memory": c.pool.kv_memory,
        "max_num_seqs": c.pool.max_num_seqs,
        "max_num_batched_tokens": c.pool.max_num_batched_tokens,
        "max_model_len": c.pool.max_model_len,
        "page_size": c.pool.page_size,
        "max_prefill_tokens_while_decoding": c.pool.max_prefill_tokens_while_decoding,
        "enable_prefix_caching": c.pool.enable_prefix_caching,
        "host_cache_memory": c.pool.host_cache_memory,
        "enforce_eager": c.device.enforce_eager,
        "multistream": c.device.multistream,
        "engram_host_memory": c.device.engram_host_memory,
        "context_parallel_size": c.parallel.context_parallel_size,
        "context_parallel_backend": c.parallel.context_parallel_backend.name,
        "record_decisions": c.record_decisions,
        "load_drafter": c.load_drafter,
    }


def test_python_cpp_and_c_api_defaults_agree() -> None:
    from dsv41rt import _core

    py = RuntimeOptions()
    core = _core_defaults()
    for name, value in core.items():
        assert getattr(py, name) == value, name
    c_api = _core.c_api_defaults()
    for name, value in c_api.items():
        assert OPTIONS[name].c_api == name and getattr(py, name) == value, name
    # Every option the C API has is in the table under its Python name, and the other way round.
    assert sorted(c_api) == sorted(o.name for o in OPTIONS.values() if o.c_api)


def test_serve_and_cli_defaults_are_the_runtime_defaults() -> None:
    from dsv41rt.cli import build_parser
    from dsv41rt.serve.config import build_config

    assert build_config({}, {}).runtime == RuntimeOptions()
    parser = build_parser()
    for argv in (
        ["score", "--checkpoint", "c", "--prompts", "p", "--out", "o"],
        ["generate", "--checkpoint", "c", "--prompts", "p", "--out", "o", "--max-new-tokens", "1"],
        ["cp-worker", "c", "--rank", "1", "--id-file", "f"],
    ):
        assert options_from_args(parser.parse_args(argv)) == RuntimeOptions(), argv[0]


def test_one_key_per_option_in_serve_and_cli() -> None:
    from dsv41rt.cli import build_parser
    from dsv41rt.serve.config import KEYS, build_config

    assert len(KEYS) == len(set(KEYS))
    cfg = build_config({"max-num-seqs": 3, "kv_memory": "64M"}, {"max_num_batched_tokens": "32"})
    assert (cfg.runtime.max_num_seqs, cfg.runtime.kv_memory, cfg.runtime.max_num_batched_tokens) == (3, 64 << 20, 32)
    for old in ("max-running", "token-budget", "cp-comm", "cp-processes", "max-context", "page-tokens"):
        with pytest.raises(Dsv41rtError, match="unknown config key"):
            build_config({old: 1}, {})
    args = build_parser().parse_args(
        ["score", "--checkpoint", "c", "--prompts", "p", "--out", "o", "--page-size", "16"]
    )
    assert options_from_args(args).page_size == 16


def test_worker_argv_rebuilds_the_options() -> None:
    from dsv41rt.commands import cp_worker_cmd

    o = RuntimeOptions(kv_memory=8 << 20, max_num_seqs=3, page_size=16, kv_cache_dtype="float32", multistream=False)
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    cp_worker_cmd.register(sub)
    args = parser.parse_args(["cp-worker", "ck", "--rank", "1", "--id-file", "f", *to_argv(o)])
    assert options_from_args(args) == o


def test_bad_values_name_the_option() -> None:
    cases = {
        "device": ("tpu", "device: unknown device 'tpu'"),
        "precision": ("fp16", "precision: expected one of fp32, bf16, fp8"),
        "kv_memory": (0, "kv-memory: must be > 0"),
        "host_cache_memory": (-1, "host-cache-memory: must be >= 0"),
        "max_num_seqs": (0, "max-num-seqs: must be >= 1"),
        "max_model_len": ("lots", "max-model-len: expected a size"),
        "enforce_eager": ("maybe", "enforce-eager: expected true or false"),
        "context_parallel_backend": ("mpi", "context-parallel-backend: expected one of local, nccl, socket"),
    }
    for name, (value, message) in cases.items():
        with pytest.raises(Dsv41rtError, match=re.escape(message)):
            RuntimeOptions().replace(**{name: value})
    with pytest.raises(Dsv41rtError, match="unknown runtime option 'max_running'"):
        RuntimeOptions().replace(max_running=4)
    with pytest.raises(Dsv41rtError, match="context-parallel-backend: nccl needs a CUDA device"):
        RuntimeOptions(context_parallel_backend="nccl")
    assert RuntimeOptions(precision="bf16").device == "cpu"  # bf16 on the CPU: the emulation


def test_docs_table_is_the_rendered_table() -> None:
    with open(DOC, encoding="utf-8") as f:
        doc = f.read()
    block = doc.split("<!-- runtime-options:begin -->\n", 1)[1].split("<!-- runtime-options:end -->", 1)[0]
    assert block == markdown_table()
    from dsv41rt.serve.config import ServeConfig

    server = doc.split("## Server options", 1)[1]
    for f in fields(ServeConfig):
        if f.name == "runtime":
            continue
        key = f.name.replace("_", "-")
        assert server.count(f"| `{key}` / `--{key}` |") == 1, key
    for name in OPTIONS:  # each runtime option once in the whole document's tables
        key = name.replace("_", "-")
        assert doc.count(f"| `{key}` / `--{key}` |") == 1, key
