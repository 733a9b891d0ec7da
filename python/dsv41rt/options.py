"""Runtime options: one name and one default per option, for every way in.

`RuntimeOptions` is what a `Runtime` is built from; `dsv41rt serve` (YAML keys and flags), the
`score`/`generate`/`cp-worker` commands and the context-parallel launcher all produce one. `OPTIONS`
is the table that maps each field to its YAML/CLI key and its C API field (docs/options.md is
rendered from it and a test keeps the two equal; another test checks that the C++ facade, the C
API, the server and the CLI start from the same defaults).
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from .errors import Dsv41rtError
from .speculative import SpeculativeConfig, parse_speculative_config

DEVICE_PATTERN = r"cpu|cuda|cuda:\d+"
PRECISIONS = ("fp32", "bf16", "fp8")
KV_CACHE_DTYPES = ("auto", "float32")
CP_BACKENDS = ("local", "nccl", "socket")
_SUFFIX = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


@dataclass(frozen=True)
class RuntimeOptions:
    """How a checkpoint is run (docs/options.md says what each field means)."""

    device: str = "cpu"
    precision: str = "fp32"
    kv_cache_dtype: str = "auto"
    kv_memory: int = 256 << 20
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512
    max_model_len: int = 0
    page_size: int = 64
    max_prefill_tokens_while_decoding: int = 0
    max_decode_slowdown: float = 0.0
    enable_prefix_caching: bool = True
    host_cache_memory: int = 0
    enforce_eager: bool = False
    multistream: bool = True
    engram_host_memory: bool = False
    context_parallel_size: int = 1
    context_parallel_backend: str = "local"
    context_parallel_processes: bool = False
    tensor_parallel_size: int = 1
    expert_parallel_size: int = 1
    record_decisions: bool = False
    load_drafter: bool = False
    speculative_config: SpeculativeConfig | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            option = OPTIONS[f.name]
            object.__setattr__(self, f.name, option.convert(getattr(self, f.name)))
        self._check()

    def _check(self) -> None:
        def need(cond: bool, name: str, msg: str) -> None:
            if not cond:
                raise Dsv41rtError(f"{OPTIONS[name].key}: {msg}")

        need(self.kv_memory > 0, "kv_memory", f"must be > 0, got {self.kv_memory}")
        need(self.max_num_seqs >= 1, "max_num_seqs", f"must be >= 1, got {self.max_num_seqs}")
        need(self.max_num_batched_tokens >= 1, "max_num_batched_tokens", "must be >= 1")
        need(self.page_size >= 1, "page_size", f"must be >= 1, got {self.page_size}")
        need(
            self.max_prefill_tokens_while_decoding >= 0,
            "max_prefill_tokens_while_decoding",
            f"must be >= 0 (0: no cap), got {self.max_prefill_tokens_while_decoding}",
        )
        need(
            self.max_decode_slowdown == 0 or self.max_decode_slowdown >= 1,
            "max_decode_slowdown",
            f"must be >= 1 (0: off), got {self.max_decode_slowdown}",
        )
        need(
            self.host_cache_memory >= 0,
            "host_cache_memory",
            f"must be >= 0 (0: off), got {self.host_cache_memory}",
        )
        need(1 <= self.context_parallel_size <= 64, "context_parallel_size", "must be in [1, 64]")
        need(1 <= self.tensor_parallel_size <= 64, "tensor_parallel_size", "must be in [1, 64]")
        need(1 <= self.expert_parallel_size <= 64, "expert_parallel_size", "must be in [1, 64]")
        need(
            self.context_parallel_backend != "nccl" or self.device != "cpu",
            "context_parallel_backend",
            "nccl needs a CUDA device",
        )
        need(
            not self.context_parallel_processes or self.group_size >= 2,
            "context_parallel_processes",
            "needs context-parallel-size, tensor-parallel-size or expert-parallel-size >= 2",
        )

    @property
    def group_size(self) -> int:
        """Ranks of the process group: the context-parallel size, else the tensor/expert-parallel
        group's (max of the two; expert parallelism inside TP has the same size or 1)."""
        if self.context_parallel_size > 1:
            return self.context_parallel_size
        return max(self.tensor_parallel_size, self.expert_parallel_size)

    def replace(self, **changes: Any) -> RuntimeOptions:
        unknown = [k for k in changes if k not in OPTIONS]
        if unknown:
            raise Dsv41rtError(f"unknown runtime option {unknown[0]!r}{_suggest(unknown[0])}")
        return dataclasses.replace(self, **changes)


# ---- the table -------------------------------------------------------------------------------


def parse_size(value: Any, key: str) -> int:
    """A byte or token count: an integer or a string such as 4096, 256M, 8G."""
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


def parse_int(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, str) and re.fullmatch(r"-?\d+", value.strip()):
            return int(value)
        raise Dsv41rtError(f"{key}: expected an integer, got {value!r}")
    return value


def parse_float(value: Any, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise Dsv41rtError(f"{key}: expected a number, got {value!r}")
    try:
        number = float(value)
    except ValueError:
        raise Dsv41rtError(f"{key}: expected a number, got {value!r}") from None
    if number != number or number in (float("inf"), float("-inf")):
        raise Dsv41rtError(f"{key}: expected a finite number, got {value!r}")
    return number


def parse_bool(value: Any, key: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
        return value.lower() in ("true", "1", "yes")
    raise Dsv41rtError(f"{key}: expected true or false, got {value!r}")


def _choice(choices: tuple[str, ...]) -> Callable[[Any, str], str]:
    def parse(value: Any, key: str) -> str:
        if value not in choices:
            raise Dsv41rtError(f"{key}: expected one of {', '.join(choices)}, got {value!r}")
        return str(value)

    return parse


def _speculative(value: Any, key: str) -> SpeculativeConfig | None:
    """vLLM's speculative-config: a YAML mapping, its JSON text or a SpeculativeConfig; None (or
    null / an empty string) is off."""
    if value is None or value == "" or value == "null" or isinstance(value, SpeculativeConfig):
        return value if isinstance(value, SpeculativeConfig) else None
    return parse_speculative_config(value)


def _device(value: Any, key: str) -> str:
    if not isinstance(value, str) or not re.fullmatch(DEVICE_PATTERN, value):
        raise Dsv41rtError(f"{key}: unknown device {value!r} (expected 'cpu', 'cuda' or 'cuda:N')")
    return value


@dataclass(frozen=True)
class Option:
    name: str  # the RuntimeOptions field
    parse: Callable[[Any, str], Any]
    c_api: str  # the dsv41rt_runtime_params field ("" when the C API has none)
    meaning: str

    @property
    def key(self) -> str:
        """The YAML key and (with "--") the command-line flag."""
        return self.name.replace("_", "-")

    def convert(self, value: Any) -> Any:
        return self.parse(value, self.key)


_ROWS = (
    Option("device", _device, "device", "cpu, cuda or cuda:N"),
    Option(
        "precision",
        _choice(PRECISIONS),
        "precision",
        "GEMMs in fp32 (reference numerics), bf16 (BF16 activations on tensor cores) or fp8"
        " (FP8 activations of FP8/FP4 weights: the official numerics); bf16/fp8 are emulated"
        " on the CPU",
    ),
    Option(
        "kv_cache_dtype",
        _choice(KV_CACHE_DTYPES),
        "kv_cache_dtype",
        "auto: the release's cache formats (DeepSeek-V4: its 584-byte rows, head_dim 512 only); "
        "float32: FP32 caches (debugging; DeepSeek-V4's default)",
    ),
    Option("kv_memory", parse_size, "kv_memory", "bytes for request slots, KV pages and workspaces"),
    Option("max_num_seqs", parse_int, "max_num_seqs", "requests running at once"),
    Option(
        "max_num_batched_tokens",
        parse_int,
        "max_num_batched_tokens",
        "tokens per engine step (prefill chunks + decodes)",
    ),
    Option("max_model_len", parse_size, "max_model_len", "prompt + output tokens per request; 0 = what the pool holds"),
    Option(
        "page_size",
        parse_int,
        "page_size",
        "positions per KV page (a multiple of every compression ratio; DeepSeek-V4: of 128, the default becomes 128)",
    ),
    Option(
        "max_prefill_tokens_while_decoding",
        parse_int,
        "max_prefill_tokens_while_decoding",
        "prefill tokens an engine step may carry while requests decode (bounds inter-token latency); 0 = no cap",
    ),
    Option(
        "max_decode_slowdown",
        parse_float,
        "max_decode_slowdown",
        "a step carrying prefill while requests decode may take up to this many times a decode-only step:"
        " its prefill tokens are capped from measured step times (docs/design/engine.md); 0 = off",
    ),
    Option(
        "enable_prefix_caching",
        parse_bool,
        "enable_prefix_caching",
        "reuse the state of prompt prefixes earlier requests computed (exact; docs/design/prefix-cache.md)",
    ),
    Option(
        "host_cache_memory",
        parse_size,
        "host_cache_memory",
        "bytes of host memory (pinned on CUDA) the prefix cache keeps pages evicted from the pool in,"
        " to bring them back instead of recomputing them; 0 = off",
    ),
    Option("enforce_eager", parse_bool, "enforce_eager", "CUDA: no decode CUDA graphs"),
    Option("multistream", parse_bool, "", "CUDA: window store, compressor, indexer and V4.1's mHC mix on side streams"),
    Option(
        "engram_host_memory",
        parse_bool,
        "",
        "CUDA: Engram tables in host memory, gathered over PCIe (zero-copy), not in device memory: read in "
        "place from the checkpoint's pages (once per host through the page cache; `DSV41RT_ENGRAM_REGISTER=0`: "
        "one pinned copy per process instead; docs/design/parallelism.md)",
    ),
    Option("context_parallel_size", parse_int, "", "prefill split over this many ranks"),
    Option(
        "context_parallel_backend",
        _choice(CP_BACKENDS),
        "",
        "local (ranks in this process), nccl (rank r on GPU base + r), socket (TCP)",
    ),
    Option(
        "context_parallel_processes",
        parse_bool,
        "",
        "ranks 1..N-1 of the CP, TP or EP group as worker processes (NCCL on GPUs, TCP on the CPU)",
    ),
    Option(
        "tensor_parallel_size",
        parse_int,
        "tensor_parallel_size",
        "attention heads and head vocabulary split over this many ranks (CPU: virtual ranks; exact)",
    ),
    Option(
        "expert_parallel_size",
        parse_int,
        "expert_parallel_size",
        "routed experts split over this many ranks (CPU: virtual ranks in this process; exact)",
    ),
    Option("record_decisions", parse_bool, "", "keep each forward's top-k, experts, window-KV inputs (debugging)"),
    Option(
        "load_drafter",
        parse_bool,
        "",
        "load the DSpark drafter for Runtime.draft_greedy on direct handles (speculative-config loads it too)",
    ),
    Option(
        "speculative_config",
        _speculative,
        "speculative_config",
        'speculative decoding in the engine, vLLM\'s JSON: {"method": "dspark", "num_speculative_tokens": 5}'
        ' (count omitted: self-tuned per request and step up to the drafter\'s block; "disable_by_batch_size": N,'
        " no drafts in steps of more requests); requests without a grammar draft with DSpark, one batched verify"
        " per step; greedy outputs bitwise those without, sampling by rejection sampling (docs/design/dspark.md);"
        " needs a checkpoint with DSpark weights",
    ),
)
OPTIONS: dict[str, Option] = {o.name: o for o in _ROWS}
assert list(OPTIONS) == [f.name for f in fields(RuntimeOptions)], "one table row per RuntimeOptions field"


def _suggest(name: str) -> str:
    import difflib

    close = difflib.get_close_matches(name, list(OPTIONS), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def options_from(values: dict[str, Any], base: RuntimeOptions | None = None) -> RuntimeOptions:
    """`base` (default: the defaults) with `values` (field names) converted and checked."""
    return (base or RuntimeOptions()).replace(**values)


# ---- command-line flags ----------------------------------------------------------------------


def add_runtime_flags(parser: argparse.ArgumentParser, group_title: str = "runtime options") -> None:
    """One flag per option (--max-num-seqs, ...); unset flags keep RuntimeOptions' defaults."""
    group = parser.add_argument_group(group_title)
    defaults = RuntimeOptions()
    for o in OPTIONS.values():
        help = f"{o.meaning} (default {getattr(defaults, o.name)})"
        group.add_argument(f"--{o.key}", dest=o.name, default=None, metavar="VALUE", help=help)


def options_from_args(args: argparse.Namespace) -> RuntimeOptions:
    return options_from({name: getattr(args, name) for name in OPTIONS if getattr(args, name, None) is not None})


def to_argv(options: RuntimeOptions) -> list[str]:
    """The flags that rebuild `options` (for worker processes)."""
    argv: list[str] = []
    for o in OPTIONS.values():
        value = getattr(options, o.name)
        if isinstance(value, SpeculativeConfig):
            argv += [f"--{o.key}", value.to_json()]
        elif value is not None:
            argv += [f"--{o.key}", str(value).lower() if isinstance(value, bool) else str(value)]
    return argv


def markdown_table() -> str:
    """docs/options.md's table of the runtime options."""
    defaults = RuntimeOptions()
    rows = [
        "| YAML key / CLI flag | Python (`RuntimeOptions`) | C API (`dsv41rt_runtime_params`) | default | meaning |",
        "|---|---|---|---|---|",
    ]
    for o in OPTIONS.values():
        c_api = f"`{o.c_api}`" if o.c_api else "—"
        rows.append(f"| `{o.key}` / `--{o.key}` | `{o.name}` | {c_api} | `{getattr(defaults, o.name)}` | {o.meaning} |")
    return "\n".join(rows) + "\n"
