"""`dsv41rt serve` configuration: a validated YAML file, overridden by command-line flags.

Keys are the long flag names in kebab-case (snake_case is accepted too), as vLLM and SGLang spell
them; precedence is flags > file > defaults. Unknown keys and bad values are errors that name the
key (with a "did you mean" for near misses). Sizes take human units (`256M`, `8G`, `1M` tokens).
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
from dataclasses import dataclass, field, fields
from typing import Any

import yaml

from ..errors import Dsv41rtError

LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
_SUFFIX = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


@dataclass(frozen=True)
class ServeConfig:
    """Everything `dsv41rt serve` needs; one field per YAML key / flag."""

    model: str | None = None  # checkpoint directory; None = the built-in tiny V4.1 model
    served_model_name: tuple[str, ...] = ()  # names accepted in requests; default: the model's name
    device: str = "cpu"  # cpu, cuda, cuda:N
    precision: str = "fp32"  # fp32 (the reference numerics) or bf16 (tensor-core GEMMs, CUDA only)
    context_parallel_size: int = 1  # prefill split over this many ranks (docs/design/context-parallel.md)
    cp_comm: str = "local"  # local (virtual ranks in this process) or nccl (rank r on GPU base + r)
    cp_processes: bool = False  # ranks 1..N-1 as worker processes: NCCL between GPUs, TCP on the CPU
    kv_memory: int = 256 << 20  # KV pool bytes (request slots + token pages + workspaces)
    max_num_seqs: int = 16  # requests running at once
    max_num_batched_tokens: int = 512  # chunked-prefill token budget per engine step
    max_model_len: int = 0  # prompt + output tokens per request; 0 = what the pool holds
    max_num_queued_reqs: int = 256  # waiting requests beyond this get 503 + Retry-After
    max_tokens_limit: int = 32768  # the largest max_tokens a request may ask for
    default_max_tokens: int = 256  # when a request sets none
    max_request_bytes: int = 1 << 20  # HTTP body limit (413 beyond)
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: tuple[str, ...] = ()  # accepted bearer keys; also DSV41RT_API_KEY; none = open
    shutdown_timeout: float = 30.0  # seconds in-flight requests may drain after SIGTERM
    log_level: str = "info"
    thinking: bool = True  # default thinking mode of chat requests that do not say
    tiny_model_dir: str = field(default="", metadata={"help": "where the built-in model is generated"})

    def model_names(self, default: str) -> tuple[str, ...]:
        return self.served_model_name or (default,)


_FIELDS = {f.name: f for f in fields(ServeConfig)}


def _key(raw: str) -> str:
    return raw.replace("-", "_")


def _suggest(name: str) -> str:
    close = difflib.get_close_matches(name.replace("_", "-"), [k.replace("_", "-") for k in _FIELDS], n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


def parse_size(value: Any, key: str) -> int:
    if isinstance(value, bool):
        raise Dsv41rtError(f"{key}: expected a size, got {value!r}")
    if isinstance(value, int):
        size = value
    else:
        m = re.fullmatch(r"\s*(\d+)\s*([KMGT]?)i?B?\s*", str(value), flags=re.IGNORECASE)
        if not m:
            raise Dsv41rtError(f"{key}: expected a size such as 4096, 256M or 8G, got {value!r}")
        size = int(m.group(1)) * _SUFFIX[m.group(2).upper()]
    if size < 0:
        raise Dsv41rtError(f"{key}: must be >= 0, got {value!r}")
    return size


def _convert(name: str, value: Any) -> Any:
    key = name.replace("_", "-")
    kind = _FIELDS[name].type
    if name in ("kv_memory", "max_request_bytes", "max_model_len"):
        return parse_size(value, key)
    if kind in ("tuple[str, ...]",):
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, (list, tuple)) or not all(isinstance(v, str) and v for v in items):
            raise Dsv41rtError(f"{key}: expected a string or a list of non-empty strings, got {value!r}")
        return tuple(items)
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, str) and re.fullmatch(r"\d+", value.strip()):
                return int(value)
            raise Dsv41rtError(f"{key}: expected an integer, got {value!r}")
        return value
    if kind == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise Dsv41rtError(f"{key}: expected a number, got {value!r}")
        try:
            return float(value)
        except ValueError:
            raise Dsv41rtError(f"{key}: expected a number, got {value!r}") from None
    if kind == "bool":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        raise Dsv41rtError(f"{key}: expected true or false, got {value!r}")
    if kind in ("str", "str | None"):
        if value is None and kind == "str | None":
            return None
        if not isinstance(value, str):
            raise Dsv41rtError(f"{key}: expected a string, got {value!r}")
        return value
    raise AssertionError(f"unhandled field type {kind} of {name}")


def _validate(cfg: ServeConfig) -> ServeConfig:
    def need(cond: bool, key: str, msg: str) -> None:
        if not cond:
            raise Dsv41rtError(f"{key}: {msg}")

    need(cfg.kv_memory > 0, "kv-memory", "must be > 0")
    need(cfg.max_num_seqs >= 1, "max-num-seqs", f"must be >= 1, got {cfg.max_num_seqs}")
    need(cfg.max_num_batched_tokens >= 1, "max-num-batched-tokens", "must be >= 1")
    need(cfg.max_num_queued_reqs >= 0, "max-num-queued-reqs", "must be >= 0")
    need(cfg.max_tokens_limit >= 1, "max-tokens-limit", "must be >= 1")
    need(1 <= cfg.default_max_tokens <= cfg.max_tokens_limit, "default-max-tokens", "must be in [1, max-tokens-limit]")
    need(cfg.max_request_bytes >= 1024, "max-request-bytes", "must be >= 1024")
    need(0 <= cfg.port <= 65535, "port", f"must be in [0, 65535], got {cfg.port}")
    need(cfg.shutdown_timeout >= 0, "shutdown-timeout", "must be >= 0")
    need(cfg.log_level in LOG_LEVELS, "log-level", f"must be one of {', '.join(LOG_LEVELS)}, got {cfg.log_level!r}")
    dev = cfg.device
    need(dev in ("cpu", "cuda") or bool(re.fullmatch(r"cuda:\d+", dev)), "device", f"cpu, cuda or cuda:N, got {dev!r}")
    need(cfg.precision in ("fp32", "bf16"), "precision", f"fp32 or bf16, got {cfg.precision!r}")
    need(cfg.precision == "fp32" or dev != "cpu", "precision", "bf16 needs a CUDA device")
    need(1 <= cfg.context_parallel_size <= 64, "context-parallel-size", "must be in [1, 64]")
    need(cfg.cp_comm in ("local", "nccl"), "cp-comm", f"local or nccl, got {cfg.cp_comm!r}")
    need(cfg.cp_comm == "local" or dev != "cpu", "cp-comm", "nccl needs a CUDA device")
    need(not cfg.cp_processes or cfg.context_parallel_size >= 2, "cp-processes", "needs context-parallel-size >= 2")
    return cfg  # the model directory is checked when the server starts (configs travel between machines)


def build_config(file_values: dict[str, Any] | None, overrides: dict[str, Any]) -> ServeConfig:
    """Defaults < file < overrides; every value converted and the result validated."""
    values: dict[str, Any] = {}
    for source in (file_values or {}, overrides):
        for raw, value in source.items():
            name = _key(str(raw))
            if name not in _FIELDS:
                raise Dsv41rtError(f"unknown config key '{raw}'{_suggest(name)}")
            values[name] = _convert(name, value)
    env_key = os.environ.get("DSV41RT_API_KEY")
    if env_key and "api_key" not in values:
        values["api_key"] = (env_key,)
    return _validate(ServeConfig(**values))


def load_file(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except OSError as err:
        raise Dsv41rtError(f"cannot read config {path}: {err.strerror}") from None
    except yaml.YAMLError as err:
        raise Dsv41rtError(f"{path}: not valid YAML: {err}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise Dsv41rtError(f"{path}: the top level must be a mapping of keys to values")
    return data


def dump(cfg: ServeConfig) -> str:
    """The effective config as YAML (kebab-case keys; API keys redacted)."""
    out: dict[str, Any] = {}
    for name, value in dataclasses.asdict(cfg).items():
        if name == "api_key":
            value = ["<redacted>"] * len(value)
        out[name.replace("_", "-")] = list(value) if isinstance(value, tuple) else value
    return yaml.safe_dump(out, sort_keys=False)
