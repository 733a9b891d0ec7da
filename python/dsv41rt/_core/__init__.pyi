"""
dsv41rt C++ core: the engine and executors, checkpoints, dtype codecs, CPU ops, comm.
"""

from collections.abc import Callable, Sequence
import enum
from typing import Annotated

import numpy
from numpy.typing import NDArray

from dsv41rt._core import comm as comm, ops as ops
import dsv41rt.errors


class Error(dsv41rt.errors.Dsv41rtError, ValueError):
    pass

def dtype_names() -> list[str]:
    """
    Names accepted by decode()/encode(): f32, bf16, f16, fp8_e4m3, e8m0, fp4_e2m1.
    """

def decode(codes: Annotated[NDArray, dict(order='C', device='cpu', writable=False)], dtype: str) -> NDArray:
    """
    Decode raw codes to float32 (same shape). Codes: uint16 for bf16/f16, uint8 for fp8_e4m3/e8m0 and UNPACKED fp4_e2m1 (one code 0..15 per element), float32 for f32.
    """

def encode(values: Annotated[NDArray[numpy.float32], dict(order='C', device='cpu', writable=False)], dtype: str) -> NDArray:
    """
    Encode float32 values to raw codes (same shape); inverse of decode(). fp8_e4m3 saturates to +-448; fp4_e2m1 yields unpacked codes; e8m0 rounds up to a power of two.
    """

def safetensors_dtype_size(dtype: str) -> int:
    """
    Bytes per element of a safetensors dtype string (F32 -> 4, I8 -> 1, ...).
    """

class Checkpoint:
    """
    A safetensors checkpoint: a .safetensors file, an index.json, or a directory (single or sharded). Headers are fully validated on open.
    """

    def __init__(self, path: str) -> None: ...

    @property
    def path(self) -> str: ...

    def names(self) -> list[str]:
        """Sorted tensor names."""

    def files(self) -> list[str]:
        """Sorted paths of the data files."""

    def metadata(self) -> dict:
        """Merged __metadata__ string map."""

    def info(self, name: str) -> dict:
        """dict(dtype=safetensors dtype string, shape, file, nbytes)."""

    def all_info(self) -> dict:
        """{name: (dtype string, shape list)} for every tensor."""

    def array(self, name: str) -> Annotated[NDArray, dict(writable=False)]:
        """
        Zero-copy read-only numpy view of a tensor (F32->float32, BF16/F16->uint16, F8_E4M3/F8_E8M0/U8->uint8, I8->int8, I32->int32, I64->int64).
        """

    def __len__(self) -> int: ...

    def __contains__(self, arg: str, /) -> bool: ...

    def __repr__(self) -> str: ...

class ModelConfig:
    """
    A parsed and validated config.json (see model_config.h); fields() gives its values for dsv41rt.config.ModelConfig.
    """

    @property
    def source(self) -> str: ...

    def fields(self) -> dict:
        """Every field under its name in dsv41rt.config.ModelConfig."""

    def __copy__(self) -> ModelConfig: ...

    def __deepcopy__(self, memo: object) -> ModelConfig: ...

def model_config_from_object(data: object, source: str) -> ModelConfig:
    """
    Parse and validate a config.json dict; raises dsv41rt.errors.ConfigError naming the source and field.
    """

def load_model_config(path: str) -> ModelConfig:
    """
    Parse and validate <path>/config.json (or the file); raises ConfigError naming the file and field.
    """

class ModelPlan:
    """The per-layer plan of a config (layer_plan.h)."""

    @property
    def config(self) -> ModelConfig: ...

    def layers(self) -> list: ...

    def draft_layers(self) -> list: ...

    def __copy__(self) -> ModelPlan: ...

    def __deepcopy__(self, memo: object) -> ModelPlan: ...

def build_model_plan(config: ModelConfig) -> ModelPlan:
    """The per-layer plan (roles, sources, rope) of a parsed config."""

def engram_layouts(layer_ids: Sequence[int], max_ngram_size: int, vocab_size: int, n_heads: int) -> list:
    """
    Engram hash buckets per layer: dicts of layer_id, primes, offsets, required_rows.
    """

def tensor_spec(plan: ModelPlan) -> tuple:
    """
    The tensors a checkpoint of this plan holds: (quantized, logical, physical), logical = [(name, shape, storage, block)], physical = [(name, safetensors dtype, shape, index into logical, is_scale, nbytes)], both sorted by name.
    """

def cache_bytes(plan: ModelPlan) -> dict:
    """
    Cache bytes of this plan in the release's formats: window_row, window_layers, window_per_request, global_per_token, compressor_state_per_request, engram_history_per_request.
    """

def memory_plan(plan: ModelPlan, kv_memory: int, max_num_seqs: int, max_num_batched_tokens: int, max_model_len: int, page_size: int, cache_quant: bool = True) -> dict:
    """
    How the executor splits a KV memory budget (memory_plan.h): num_slots, slot_bytes, num_pages, page_bytes, page_tokens, workspace_bytes_per_page, scratch_bytes; raises naming the shortfall when not one slot and one page fit.
    """

def open_checkpoint(path: str, validate: bool = True) -> tuple:
    """
    Open a checkpoint directory once: parse config.json, plan, map the safetensors files and (validate) check every tensor against the spec. Returns (ModelPlan, Checkpoint); raises dsv41rt.errors.ConfigError / CheckpointError naming the field, file or tensor.
    """

class Precision(enum.Enum):
    fp32 = 0

    bf16 = 1

    fp8 = 2

class KvCacheDtype(enum.Enum):
    auto = 0

    float32 = 1

class CpBackend(enum.Enum):
    local = 0

    nccl = 1

    socket = 2

class Switch(enum.Enum):
    multistream = 0

    cuda_graphs = 1

    tensor_cores = 2

    cp_timing = 3

    attention_in_place = 4

    programmatic_launch = 5

class FinishReason(enum.Enum):
    none = 0

    length = 1

    stop = 2

    abort = 3

    error = 4

class PoolOptions:
    def __init__(self) -> None: ...

    @property
    def kv_memory(self) -> int: ...

    @kv_memory.setter
    def kv_memory(self, arg: int, /) -> None: ...

    @property
    def max_num_seqs(self) -> int: ...

    @max_num_seqs.setter
    def max_num_seqs(self, arg: int, /) -> None: ...

    @property
    def max_num_batched_tokens(self) -> int: ...

    @max_num_batched_tokens.setter
    def max_num_batched_tokens(self, arg: int, /) -> None: ...

    @property
    def max_model_len(self) -> int: ...

    @max_model_len.setter
    def max_model_len(self, arg: int, /) -> None: ...

    @property
    def page_size(self) -> int: ...

    @page_size.setter
    def page_size(self, arg: int, /) -> None: ...

    @property
    def max_prefill_tokens_while_decoding(self) -> int: ...

    @max_prefill_tokens_while_decoding.setter
    def max_prefill_tokens_while_decoding(self, arg: int, /) -> None: ...

    @property
    def max_decode_slowdown(self) -> float: ...

    @max_decode_slowdown.setter
    def max_decode_slowdown(self, arg: float, /) -> None: ...

    @property
    def enable_prefix_caching(self) -> bool: ...

    @enable_prefix_caching.setter
    def enable_prefix_caching(self, arg: bool, /) -> None: ...

    @property
    def host_cache_memory(self) -> int: ...

    @host_cache_memory.setter
    def host_cache_memory(self, arg: int, /) -> None: ...

class NumericsOptions:
    def __init__(self) -> None: ...

    @property
    def precision(self) -> Precision: ...

    @precision.setter
    def precision(self, arg: Precision, /) -> None: ...

    @property
    def kv_cache_dtype(self) -> KvCacheDtype: ...

    @kv_cache_dtype.setter
    def kv_cache_dtype(self, arg: KvCacheDtype, /) -> None: ...

class DeviceOptions:
    def __init__(self) -> None: ...

    @property
    def device(self) -> str: ...

    @device.setter
    def device(self, arg: str, /) -> None: ...

    @property
    def enforce_eager(self) -> bool: ...

    @enforce_eager.setter
    def enforce_eager(self, arg: bool, /) -> None: ...

    @property
    def multistream(self) -> bool: ...

    @multistream.setter
    def multistream(self, arg: bool, /) -> None: ...

    @property
    def engram_host_memory(self) -> bool: ...

    @engram_host_memory.setter
    def engram_host_memory(self, arg: bool, /) -> None: ...

class ParallelOptions:
    def __init__(self) -> None: ...

    @property
    def context_parallel_size(self) -> int: ...

    @context_parallel_size.setter
    def context_parallel_size(self, arg: int, /) -> None: ...

    @property
    def context_parallel_backend(self) -> CpBackend: ...

    @context_parallel_backend.setter
    def context_parallel_backend(self, arg: CpBackend, /) -> None: ...

    @property
    def expert_parallel_size(self) -> int: ...

    @expert_parallel_size.setter
    def expert_parallel_size(self, arg: int, /) -> None: ...

    @property
    def tensor_parallel_size(self) -> int: ...

    @tensor_parallel_size.setter
    def tensor_parallel_size(self, arg: int, /) -> None: ...

    @property
    def rank(self) -> int: ...

    @rank.setter
    def rank(self, arg: int, /) -> None: ...

    @property
    def group_id(self) -> bytes: ...

    @group_id.setter
    def group_id(self, arg: bytes, /) -> None: ...

    @property
    def worker_threads(self) -> bool: ...

    @worker_threads.setter
    def worker_threads(self, arg: bool, /) -> None: ...

class RuntimeOptions:
    def __init__(self) -> None: ...

    @property
    def checkpoint(self) -> str: ...

    @checkpoint.setter
    def checkpoint(self, arg: str, /) -> None: ...

    @property
    def engram_tables(self) -> str: ...

    @engram_tables.setter
    def engram_tables(self, arg: str, /) -> None: ...

    @property
    def pool(self) -> PoolOptions: ...

    @pool.setter
    def pool(self, arg: PoolOptions, /) -> None: ...

    @property
    def numerics(self) -> NumericsOptions: ...

    @numerics.setter
    def numerics(self, arg: NumericsOptions, /) -> None: ...

    @property
    def device(self) -> DeviceOptions: ...

    @device.setter
    def device(self, arg: DeviceOptions, /) -> None: ...

    @property
    def parallel(self) -> ParallelOptions: ...

    @parallel.setter
    def parallel(self, arg: ParallelOptions, /) -> None: ...

    @property
    def record_decisions(self) -> bool: ...

    @record_decisions.setter
    def record_decisions(self, arg: bool, /) -> None: ...

    @property
    def load_drafter(self) -> bool: ...

    @load_drafter.setter
    def load_drafter(self, arg: bool, /) -> None: ...

    @property
    def num_speculative_tokens(self) -> int: ...

    @num_speculative_tokens.setter
    def num_speculative_tokens(self, arg: int, /) -> None: ...

    @property
    def speculative_disable_by_batch_size(self) -> int: ...

    @speculative_disable_by_batch_size.setter
    def speculative_disable_by_batch_size(self, arg: int, /) -> None: ...

    @property
    def draft_source(self) -> Callable[[int, list[int], int], list[int]]: ...

    @draft_source.setter
    def draft_source(self, arg: Callable[[int, Sequence[int], int], Sequence[int]], /) -> None: ...

    @property
    def forced_acceptance(self) -> Callable[[int, int], int]: ...

    @forced_acceptance.setter
    def forced_acceptance(self, arg: Callable[[int, int], int], /) -> None: ...

    @property
    def engine_thread(self) -> bool: ...

    @engine_thread.setter
    def engine_thread(self, arg: bool, /) -> None: ...

class DraftBlock:
    @property
    def tokens(self) -> list[int]: ...

    @property
    def confidence(self) -> list[float]: ...

def c_api_defaults() -> dict: ...

class RequestOutput:
    @property
    def id(self) -> int: ...

    @property
    def tokens(self) -> list[int]: ...

    @property
    def logprobs(self) -> list[float]: ...

    @property
    def top_ids(self) -> list[list[int]]: ...

    @property
    def top_logprobs(self) -> list[list[float]]: ...

    @property
    def finished(self) -> bool: ...

    @property
    def reason(self) -> FinishReason: ...

    @property
    def error(self) -> str: ...

    @property
    def first_scheduled_ns(self) -> int: ...

    @property
    def cached_tokens(self) -> int: ...

    @property
    def handoff(self) -> object: ...

class PoolStats:
    @property
    def pages_total(self) -> int: ...

    @property
    def pages_used(self) -> int: ...

    @property
    def slots_total(self) -> int: ...

    @property
    def slots_used(self) -> int: ...

    @property
    def bytes_total(self) -> int: ...

    @property
    def page_size(self) -> int: ...

    @property
    def page_bytes(self) -> int: ...

    @property
    def slot_bytes(self) -> int: ...

    @property
    def workspace_bytes_per_page(self) -> int: ...

    @property
    def scratch_bytes(self) -> int: ...

    @property
    def pages_cached(self) -> int: ...

    @property
    def slots_cached(self) -> int: ...

class PrefixCacheStats:
    @property
    def queries(self) -> int: ...

    @property
    def hits(self) -> int: ...

    @property
    def evicted_pages(self) -> int: ...

    @property
    def evicted_snapshots(self) -> int: ...

    @property
    def host_pages(self) -> int: ...

    @property
    def host_bytes(self) -> int: ...

    @property
    def offloaded_pages(self) -> int: ...

    @property
    def restored_pages(self) -> int: ...

    @property
    def offloaded_snapshots(self) -> int: ...

    @property
    def restored_snapshots(self) -> int: ...

class SchedulerStats:
    @property
    def waiting(self) -> int: ...

    @property
    def running(self) -> int: ...

    @property
    def preemptions(self) -> int: ...

    @property
    def admitted(self) -> int: ...

    @property
    def finished(self) -> int: ...

    @property
    def aborted(self) -> int: ...

    @property
    def max_waiting_seen(self) -> int: ...

class DequantStats:
    @property
    def dequant_calls(self) -> int: ...

    @property
    def reuse_hits(self) -> int: ...

    @property
    def rows_dequantised(self) -> int: ...

    @property
    def reallocations(self) -> int: ...

class BackendStats:
    @property
    def weight_bytes(self) -> int: ...

    @property
    def weight_host_bytes(self) -> int: ...

    @property
    def weight_host_in_place_bytes(self) -> int: ...

    @property
    def d2h_bytes(self) -> int: ...

    @property
    def eager_forwards(self) -> int: ...

    @property
    def graph_captures(self) -> int: ...

    @property
    def graph_replays(self) -> int: ...

    @property
    def graph_updates(self) -> int: ...

    @property
    def programmatic_edges(self) -> int: ...

    @property
    def graphs(self) -> int: ...

    @property
    def last_forward_us(self) -> int: ...

    @property
    def multistream(self) -> bool: ...

    @property
    def cuda_graphs(self) -> bool: ...

    @property
    def tensor_cores(self) -> bool: ...

    @property
    def cp_size(self) -> int: ...

    @property
    def cp_forwards(self) -> int: ...

    @property
    def cp_processes(self) -> int: ...

    @property
    def tp_size(self) -> int: ...

    @property
    def ep_size(self) -> int: ...

    @property
    def cp_layers_timed(self) -> int: ...

    @property
    def cp_q_projection_us(self) -> int: ...

    @property
    def cp_all_gather_us(self) -> int: ...

    @property
    def cp_overlap_us(self) -> int: ...

class SpecDecodeStats:
    @property
    def drafts(self) -> int: ...

    @property
    def draft_tokens(self) -> int: ...

    @property
    def accepted_tokens(self) -> int: ...

    @property
    def accepted_per_pos(self) -> list[int]: ...

class Stats:
    @property
    def pool(self) -> PoolStats: ...

    @property
    def scheduler(self) -> SchedulerStats: ...

    @property
    def dequant(self) -> DequantStats: ...

    @property
    def backend(self) -> BackendStats: ...

    @property
    def steps(self) -> int: ...

    @property
    def tokens_computed(self) -> int: ...

    @property
    def tokens_generated(self) -> int: ...

    @property
    def prefix_cache(self) -> PrefixCacheStats: ...

    @property
    def spec_decode(self) -> SpecDecodeStats: ...

class ModelInfo:
    @property
    def vocab_size(self) -> int: ...

    @property
    def eos_token_id(self) -> int: ...

    @property
    def device(self) -> str: ...

class Runtime:
    """
    A loaded V4.1 checkpoint: engine, engine thread (unless options.engine_thread is False) and direct sequences.
    """

    def __init__(self, options: RuntimeOptions, progress: object | None = None) -> None: ...

    def submit(self, prompt: Sequence[int], max_new_tokens: int, sampling: dict = {}, stop_token_ids: Sequence[int] = [], ignore_eos: bool = False, grammar: dict = {}, handoff: bool = False) -> int:
        """
        Queues a request. grammar: {} or {kind, text, start_token, start_within} (dsv41rt/runtime.hpp GrammarParams). handoff: end after the first token with the request's state in the output (prefill role).
        """

    def submit_handoff(self, prompt: Sequence[int], first_token: int, state: bytes, max_new_tokens: int, sampling: dict = {}, stop_token_ids: Sequence[int] = [], ignore_eos: bool = False, grammar: dict = {}) -> int:
        """
        Continues a request another runtime prefilled (decode role; dsv41rt/runtime.hpp).
        """

    def set_grammar_vocab(self, tokens: Sequence[bytes], stop_token_ids: Sequence[int]) -> None:
        """
        The vocabulary grammars compile against: the bytes of each token (b'' for control tokens) and the stop tokens.
        """

    @staticmethod
    def grammar_available() -> bool:
        """Whether this build has grammar-constrained decoding (xgrammar)."""

    def await_output(self, id: int, timeout_s: float) -> RequestOutput | None: ...

    def await_any(self, timeout_s: float) -> list[RequestOutput]: ...

    def cancel(self, id: int, wait: bool = True) -> None: ...

    def step(self) -> list[RequestOutput]: ...

    def idle(self) -> bool: ...

    def shutdown(self) -> None: ...

    def stats(self) -> Stats: ...

    def info(self) -> ModelInfo: ...

    def decisions(self) -> dict: ...

    def describe_pool(self) -> str: ...

    def check_invariants(self) -> None: ...

    def set_switch(self, which: Switch, on: bool) -> None: ...

    def set_dequant_reuse(self, on: bool) -> None: ...

    def reset_dequant_counters(self) -> None: ...

    def reset_prefix_cache(self) -> None: ...

    def run_cp_worker(self) -> None: ...

    def open_sequence(self) -> int: ...

    def forward(self, seq: int, tokens: Annotated[NDArray[numpy.int32], dict(shape=(None,), order='C', device='cpu', writable=False)], all_logits: bool = True, undoable: bool = False) -> NDArray[numpy.float32]: ...

    def rollback(self, seq: int, r: int) -> None: ...

    def rollback_limit(self, seq: int) -> int: ...

    def verify_greedy(self, seq: int, last_token: int, draft: Sequence[int]) -> list[int]: ...

    def draft_greedy(self, seq: int, last_token: int) -> DraftBlock: ...

    def fork(self, seq: int) -> int: ...

    def decode(self, seqs: Sequence[int], tokens: Annotated[NDArray[numpy.int32], dict(shape=(None,), order='C', device='cpu', writable=False)]) -> NDArray[numpy.float32]: ...

    def decode_greedy(self, seqs: Sequence[int], tokens: Annotated[NDArray[numpy.int32], dict(shape=(None,), order='C', device='cpu', writable=False)]) -> tuple: ...

    def close_sequence(self, seq: int) -> None: ...

    def export_sequence(self, seq: int) -> bytes: ...

    def import_sequence(self, blob: bytes) -> int: ...

class DSparkDrafter:
    """
    The DSpark drafter (V4.1 speculative stages mtp.*) of a checkpoint on the CPU or a CUDA backend: one parallel block per draft() call.
    """

    def __init__(self, checkpoint: str, kv_cache_dtype: KvCacheDtype = KvCacheDtype.auto, record_window_kv: bool = False, device: str = 'cpu') -> None:
        """
        Loads the checkpoint's weights with their drafts on `device` ('cpu', 'cuda' or 'cuda:N'). kv_cache_dtype auto: the ring and block keys are FP8-QDQ'd as the window cache's rows; float32: no rounding. record_window_kv: keep each draft's keys before their QDQ (window_kv_inputs()).
        """

    def draft(self, features: Annotated[NDArray[numpy.float32], dict(shape=(None, None), order='C', device='cpu', writable=False)], anchor: int, ids: Annotated[NDArray[numpy.int32], dict(shape=(None,), order='C', device='cpu', writable=False)], previous: Annotated[NDArray[numpy.int32], dict(shape=(None,), order='C', device='cpu', writable=False)]) -> tuple[NDArray[numpy.float32], NDArray[numpy.float32]]:
        """
        Drafts one block. features float32 [context, T * hidden]: row i is target position i's features (the dspark_target_layer_ids' in order, concatenated); anchor: the position of ids[0] (0 <= anchor <= context; the block occupies anchor .. anchor + block - 1 and reads the features of [anchor - sliding_window, anchor)); ids int32 [block]: the anchor token then noise tokens; previous int32 [block]: each row's preceding token for the Markov head. Returns (logits float32 [block, vocab], confidence float32 [block]).
        """

    def window_kv_inputs(self) -> list[NDArray[numpy.float32]]:
        """
        Per stage, the last draft's keys entering their FP8 QDQ, float32 [ring + block, head_dim] (ring rows, then block rows); empty unless record_window_kv.
        """

def grammar_accepted_prefix(tokens: Sequence[bytes], vocab_size: int, stop_token_ids: Sequence[int], grammar: dict, token_ids: Sequence[int]) -> tuple[int, bool]:
    """
    (how many leading token_ids the grammar accepts, whether it then ended on a stop token). tokens, vocab_size, stop_token_ids as Runtime.set_grammar_vocab; grammar as add_request's.
    """

def cuda_device_count() -> int:
    """
    Number of usable CUDA devices (0 for CPU-only builds or without a driver).
    """
