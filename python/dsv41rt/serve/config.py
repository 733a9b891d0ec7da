"""`dsv41rt serve` configuration: a validated YAML file, overridden by command-line flags.

Keys are the long flag names in kebab-case (snake_case is accepted too), as vLLM and SGLang spell
them; precedence is flags > file > defaults. Unknown keys and bad values are errors that name the
key (with a "did you mean" for near misses). Sizes take human units (`256M`, `8G`, `1M` tokens).

A DeepSeek-V4 checkpoint (`model` a directory whose config.json says `model_type: deepseek_v4`)
runs with some runtime options one way only so far (`V4_LIMITS`, docs/design/v4.md): an option the
user left at its default becomes V4's value (prefix caching off, FP32 caches, pages of 128), one
the user set to what V4 cannot do yet is an error naming the key, before the port or the model.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

import yaml

from ..errors import ConfigError, Dsv41rtError
from ..options import OPTIONS, RuntimeOptions, options_from, parse_bool, parse_int, parse_size

LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
DISAGGREGATION_MODES = ("none", "prefill", "decode")
HANDOFF_TRANSPORTS = ("nixl", "http")  # serve/handoff_transport.py
HANDOFF_MEMORIES = ("auto", "host", "device")  # serve/handoff_transport.py MEMORIES


@dataclass(frozen=True)
class ServeConfig:
    """Everything `dsv41rt serve` needs: the runtime options (dsv41rt.options, one YAML key / flag
    each) and the server's own, one field per YAML key / flag."""

    model: str | None = None  # checkpoint directory; None = the built-in tiny V4.1 model
    runtime: RuntimeOptions = field(default_factory=RuntimeOptions)
    served_model_name: tuple[str, ...] = ()  # names accepted in requests; default: the model's name
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
    # Prefill/decode disaggregation (docs/design/disaggregation.md): "none", or this server's role
    # behind `dsv41rt router`; a decode server fetches request state only from `prefill-servers`
    # (with none given: from this host).
    disaggregation_mode: str = "none"
    prefill_servers: tuple[str, ...] = ()
    # How the state moves between the pair (both must agree): NIXL reads (the `disagg` extra), or
    # the bytes in the HTTP answer.
    handoff_transport: str = "nixl"
    # Where NIXL-moved states lie on this server: host memory, or device memory of its GPU (CUDA
    # IPC / RDMA); auto = device on a CUDA server. The two servers of a pair may differ.
    handoff_memory: str = "auto"
    tiny_model_dir: str = field(default="", metadata={"help": "where the built-in model is generated"})

    def model_names(self, default: str) -> tuple[str, ...]:
        return self.served_model_name or (default,)


_FIELDS = {f.name: f for f in fields(ServeConfig) if f.name != "runtime"}
#: Every key a config file or flag may set: the server's fields and the runtime options.
KEYS = (*_FIELDS, *OPTIONS)


def _key(raw: str) -> str:
    return raw.replace("-", "_")


def _suggest(name: str) -> str:
    close = difflib.get_close_matches(name.replace("_", "-"), [k.replace("_", "-") for k in KEYS], n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _convert(name: str, value: Any) -> Any:
    key = name.replace("_", "-")
    if name in OPTIONS:
        return OPTIONS[name].convert(value)
    kind = _FIELDS[name].type
    if name == "max_request_bytes":
        return parse_size(value, key)
    if kind in ("tuple[str, ...]",):
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, (list, tuple)) or not all(isinstance(v, str) and v for v in items):
            raise Dsv41rtError(f"{key}: expected a string or a list of non-empty strings, got {value!r}")
        return tuple(items)
    if kind == "int":
        return parse_int(value, key)
    if kind == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise Dsv41rtError(f"{key}: expected a number, got {value!r}")
        try:
            return float(value)
        except ValueError:
            raise Dsv41rtError(f"{key}: expected a number, got {value!r}") from None
    if kind == "bool":
        return parse_bool(value, key)
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

    need(cfg.max_num_queued_reqs >= 0, "max-num-queued-reqs", "must be >= 0")
    need(cfg.max_tokens_limit >= 1, "max-tokens-limit", "must be >= 1")
    need(1 <= cfg.default_max_tokens <= cfg.max_tokens_limit, "default-max-tokens", "must be in [1, max-tokens-limit]")
    need(cfg.max_request_bytes >= 1024, "max-request-bytes", "must be >= 1024")
    need(0 <= cfg.port <= 65535, "port", f"must be in [0, 65535], got {cfg.port}")
    need(cfg.shutdown_timeout >= 0, "shutdown-timeout", "must be >= 0")
    need(
        cfg.disaggregation_mode in DISAGGREGATION_MODES,
        "disaggregation-mode",
        f"must be one of {', '.join(DISAGGREGATION_MODES)}, got {cfg.disaggregation_mode!r}",
    )
    need(
        cfg.handoff_transport in HANDOFF_TRANSPORTS,
        "handoff-transport",
        f"must be one of {', '.join(HANDOFF_TRANSPORTS)}, got {cfg.handoff_transport!r}",
    )
    need(
        cfg.handoff_memory in HANDOFF_MEMORIES,
        "handoff-memory",
        f"must be one of {', '.join(HANDOFF_MEMORIES)}, got {cfg.handoff_memory!r}",
    )
    need(
        cfg.handoff_memory != "device" or cfg.runtime.device.startswith("cuda"),
        "handoff-memory",
        f"device needs a CUDA server (device: {cfg.runtime.device})",
    )
    need(cfg.log_level in LOG_LEVELS, "log-level", f"must be one of {', '.join(LOG_LEVELS)}, got {cfg.log_level!r}")
    return cfg  # the model directory is checked when the server starts (configs travel between machines)


def build_config(file_values: dict[str, Any] | None, overrides: dict[str, Any]) -> ServeConfig:
    """Defaults < file < overrides; every value converted and the result validated. With a
    DeepSeek-V4 `model`, the runtime options it cannot run with yet are resolved or refused
    (`resolve_for_v4`): the keys the file and the flags set are the ones the user asked for."""
    values: dict[str, Any] = {}
    for source in (file_values or {}, overrides):
        for raw, value in source.items():
            name = _key(str(raw))
            if name not in KEYS:
                raise Dsv41rtError(f"unknown config key '{raw}'{_suggest(name)}")
            values[name] = _convert(name, value)
    env_key = os.environ.get("DSV41RT_API_KEY")
    if env_key and "api_key" not in values:
        values["api_key"] = (env_key,)
    explicit = {k for k in values if k in OPTIONS}  # what the user set, file or flag
    runtime = options_from({k: values.pop(k) for k in list(values) if k in OPTIONS})
    model = values.get("model")
    if model is not None and model_type_of(model) == V4_MODEL_TYPE:
        runtime = resolve_for_v4(runtime, explicit)
    return _validate(ServeConfig(runtime=runtime, **values))


# ---- DeepSeek-V4 checkpoints ------------------------------------------------------------------

V4_MODEL_TYPE = "deepseek_v4"


def model_type_of(model: str) -> str | None:
    """The checkpoint directory's model type (`Arch` value: deepseek_v41 / deepseek_v4), read by
    the one config parser; None when there is no valid config.json to read here (configs travel
    between machines: the server's start checks the directory)."""
    from ..config import load_config

    try:
        return load_config(model).arch.value
    except ConfigError:
        return None


@dataclass(frozen=True)
class V4Limit:
    """A runtime option DeepSeek-V4 runs with one way only so far. The runtime's load refuses the
    other values too (cpp/runtime/model/v4_support.cc, runtime_load.cc `check_v4_runtime`); the
    server resolves or refuses them first, by their key, before it binds the port or loads."""

    name: str  # the RuntimeOptions field
    supported: Callable[[Any, RuntimeOptions], bool]  # (value, all the options)
    value: Any  # what the option's default becomes for V4
    why: str


V4_LIMITS = (
    # auto (V4's 584-byte rows, FP4 index keys) runs on the cpu and cuda backends, head_dim 512
    # only (the runtime names the dims otherwise): the default stays float32, which every V4
    # config runs, and an explicit auto is kept.
    V4Limit(
        "kv_cache_dtype",
        lambda v, rt: True,
        "float32",
        "DeepSeek-V4's quantised cache rows (584-byte rows) hold head_dim 512 only",
    ),
    V4Limit("precision", lambda v, rt: v == "fp32", "fp32", "DeepSeek-V4 runs in fp32 only so far"),
    V4Limit(
        "page_size",
        lambda v, rt: v % 128 == 0,
        128,
        "DeepSeek-V4's HCA compresses groups of 128 positions (pages hold a multiple of 128)",
    ),
    V4Limit(
        "speculative_config",
        lambda v, rt: v is None,
        None,
        "speculative decoding is not built for DeepSeek-V4 yet (speculation with its MTP layer is not built)",
    ),
    V4Limit("load_drafter", lambda v, rt: v is False, False, "DeepSeek-V4 has no drafter in this runtime yet"),
)


def _yaml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    to_json = getattr(value, "to_json", None)  # a SpeculativeConfig
    return to_json() if callable(to_json) else str(value)


def resolve_for_v4(runtime: RuntimeOptions, explicit: set[str]) -> RuntimeOptions:
    """`runtime` for a DeepSeek-V4 checkpoint: each option of V4_LIMITS that `explicit` (the field
    names the user set) does not name takes V4's value (`V4Limit.value`); an explicit value V4
    cannot run with is a Dsv41rtError naming the key, the value and why."""
    changes: dict[str, Any] = {}
    for limit in V4_LIMITS:
        value = getattr(runtime, limit.name)
        key = OPTIONS[limit.name].key
        if limit.name in explicit:
            if limit.supported(value, runtime):
                continue
            fix = "remove it" if limit.value is None else f"remove it or set {_yaml(limit.value)}"
            raise Dsv41rtError(
                f"{key}: {_yaml(value)} is not supported with a DeepSeek-V4 checkpoint: {limit.why}; {fix}"
            )
        if value != limit.value:  # a default V4 runs otherwise (kv-cache-dtype auto stays opt-in)
            changes[limit.name] = limit.value
    return runtime.replace(**changes) if changes else runtime


def v4_note(runtime: RuntimeOptions) -> str:
    """One log line: the options a DeepSeek-V4 checkpoint runs with that are not the defaults."""
    defaults = RuntimeOptions()
    changed = [
        f"{OPTIONS[lim.name].key} {_yaml(getattr(runtime, lim.name))} (default {_yaml(getattr(defaults, lim.name))})"
        for lim in V4_LIMITS
        if getattr(runtime, lim.name) != getattr(defaults, lim.name)
    ]
    what = ", ".join(changed) if changed else "the defaults"
    return f"DeepSeek-V4 checkpoint: running with {what}: what V4 supports so far (docs/design/v4.md)"


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
    items = dataclasses.asdict(cfg)
    items.update(items.pop("runtime"))
    for name, value in items.items():
        if name == "api_key":
            value = ["<redacted>"] * len(value)
        out[name.replace("_", "-")] = list(value) if isinstance(value, tuple) else value
    return yaml.safe_dump(out, sort_keys=False)
