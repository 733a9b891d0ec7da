"""`dsv41rt.Runtime`: load a checkpoint, run requests step by step, score prompts.

A thin wrapper over the C++ facade (`dsv41rt._core.Runtime`, cpp/include/dsv41rt/runtime.hpp),
which loads and validates the checkpoint once, owns the engine (continuous batching over the paged
KV pool, tokens drawn on the device with each request's sampling parameters) and, when asked, the
engine thread. Options are `RuntimeOptions` (dsv41rt.options; one name per option).

Scripting drives the engine with `step()`; the server creates its Runtime with
`engine_thread=True` and consumes outputs with `await_outputs()` (serve/engine_loop.py).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from . import _core
from .config import ModelConfig, load_config
from .errors import Dsv41rtError
from .options import RuntimeOptions
from .sampling import GREEDY, Grammar, SamplingParams
from .speculative import DraftBlock
from .tokenizer.engram_file import engram_tables_for
from .tokenizer.grammar_vocab import grammar_vocab


class StepOutput(NamedTuple):
    request_id: int
    new_tokens: list[int]
    finished: bool
    finish_reason: str | None  # "length" | "stop" | "abort" | "error" | None
    logprobs: list[float]  # raw logprob of each new token
    top_logprobs: list[dict[int, float]]  # per new token, when requested
    error: str = ""  # finish_reason "error": why the request could not go on
    first_scheduled: float = 0.0  # time.monotonic() when the first step running it began
    cached_tokens: int = -1  # prompt tokens served by the prefix cache (on the first token's output)
    handoff: bytes | None = None  # add_request(handoff=True): the request's state, on its finished output


def _step_output(o: Any) -> StepOutput:
    tops = [dict(zip(ids, lps, strict=True)) for ids, lps in zip(o.top_ids, o.top_logprobs, strict=True)]
    reason = None if o.reason == _core.FinishReason.none else o.reason.name
    # steady_clock is CLOCK_MONOTONIC, the clock of time.monotonic().
    return StepOutput(
        o.id,
        list(o.tokens),
        o.finished,
        reason,
        list(o.logprobs),
        tops,
        o.error,
        o.first_scheduled_ns * 1e-9,
        o.cached_tokens,
        o.handoff,
    )


def _fields(obj: Any) -> dict[str, Any]:
    return {k: getattr(obj, k) for k in dir(obj) if not k.startswith("_")}


def flat_stats(s: Any) -> dict[str, int]:
    """One dict of the typed stats (pool, scheduler, dequant counters, totals)."""
    out: dict[str, int] = {}
    for group in (s.pool, s.scheduler, s.dequant):
        out.update(_fields(group))
    out["pool_bytes"] = out.pop("bytes_total")
    out.update(steps=s.steps, tokens_computed=s.tokens_computed, tokens_generated=s.tokens_generated)
    out.update({f"prefix_cache_{k}": v for k, v in _fields(s.prefix_cache).items()})
    d = s.spec_decode
    out.update(
        spec_decode_drafts=d.drafts,
        spec_decode_draft_tokens=d.draft_tokens,
        spec_decode_accepted_tokens=d.accepted_tokens,
    )
    out.update({f"spec_decode_accepted_pos_{j}": int(n) for j, n in enumerate(d.accepted_per_pos)})
    return out


def core_options(
    checkpoint: str,
    o: RuntimeOptions,
    *,
    engram_tables: str = "",
    engine_thread: bool = False,
    rank: int = -1,
    group_id: bytes = b"",
    worker_threads: bool = False,
) -> Any:
    """The C++ facade's options for `o` (plus the per-process launch fields)."""
    c = _core.RuntimeOptions()
    c.checkpoint = checkpoint
    c.engram_tables = engram_tables
    c.pool.kv_memory = o.kv_memory
    c.pool.max_num_seqs = o.max_num_seqs
    c.pool.max_num_batched_tokens = o.max_num_batched_tokens
    c.pool.max_model_len = o.max_model_len
    c.pool.page_size = o.page_size
    c.pool.max_prefill_tokens_while_decoding = o.max_prefill_tokens_while_decoding
    c.pool.max_decode_slowdown = o.max_decode_slowdown
    c.pool.enable_prefix_caching = o.enable_prefix_caching
    c.pool.host_cache_memory = o.host_cache_memory
    c.numerics.precision = _core.Precision.__members__[o.precision]
    c.numerics.kv_cache_dtype = _core.KvCacheDtype.__members__[o.kv_cache_dtype]
    c.device.device = o.device
    c.device.enforce_eager = o.enforce_eager
    c.device.multistream = o.multistream
    c.device.engram_host_memory = o.engram_host_memory
    c.parallel.context_parallel_size = o.context_parallel_size
    c.parallel.context_parallel_backend = _core.CpBackend.__members__[o.context_parallel_backend]
    c.parallel.expert_parallel_size = o.expert_parallel_size
    c.parallel.tensor_parallel_size = o.tensor_parallel_size
    c.parallel.rank = rank
    c.parallel.group_id = group_id
    c.parallel.worker_threads = worker_threads
    c.record_decisions = o.record_decisions
    c.load_drafter = o.load_drafter
    spec = o.speculative_config
    c.num_speculative_tokens = 0 if spec is None else spec.engine_tokens
    c.speculative_disable_by_batch_size = 0 if spec is None else spec.disable_by_batch_size or 0
    c.engine_thread = engine_thread
    return c


class _LoadBar:
    """A tqdm bar over the blocks being loaded (the C++ loader calls it after each block)."""

    def __init__(self, checkpoint: str) -> None:
        from tqdm import tqdm

        self._bar = tqdm(
            desc=f"loading {os.path.basename(os.path.normpath(checkpoint))}", unit="block", file=sys.stderr
        )

    def __call__(self, done: int, total: int) -> None:
        self._bar.total = total
        self._bar.update(done - self._bar.n)

    def close(self) -> None:
        self._bar.close()


def _load_progress(checkpoint: str) -> _LoadBar | None:
    try:
        return _LoadBar(checkpoint)
    except ImportError:  # tqdm is optional
        return None


class Runtime:
    """A loaded model: the C++ runtime (engine, paged KV pool, sampling) behind it."""

    def __init__(
        self,
        checkpoint: str,
        device: str | None = None,
        *,
        options: RuntimeOptions | None = None,
        progress: bool = False,
        engine_thread: bool = False,
        rank: int = -1,
        group_id: bytes = b"",
        worker_threads: bool = False,
        draft_source: Callable[[int, list[int], int], Sequence[int]] | None = None,
        forced_acceptance: Callable[[int, int], int] | None = None,
        **fields: Any,
    ) -> None:
        """Load `checkpoint` (its config and every tensor validated once, by the C++ core).

        `options` (default RuntimeOptions()) with `device` and any RuntimeOptions `fields` given as
        keywords (docs/options.md). engine_thread=True starts the C++ engine thread (the server);
        otherwise `step()` runs the engine. Context-parallel launchers only: this process's `rank`
        and the group's `group_id` (NCCL unique id or rank 0's host:port); worker_threads runs the
        one-process-per-rank protocol with the ranks as threads (tests). `draft_source` (benchmarks,
        tests; needs speculative_config with num_speculative_tokens): drafts(request_id, tokens, k)
        replaces the DSpark drafter (C++ RuntimeOptions::draft_source). `forced_acceptance`
        (benchmarks only, NOT lossless; needs num_speculative_tokens): accepted(request_id, drafted)
        makes every verify accept exactly that many of its drafts (clamped to [0, drafted]) whatever
        the model says, then emit the model's own token; the stats count those, so the measured
        acceptance length is the forced one (C++ RuntimeOptions::forced_acceptance).
        """
        if device is not None:
            fields["device"] = device
        opts = (options or RuntimeOptions()).replace(**fields)
        if opts.context_parallel_processes:
            raise Dsv41rtError(
                "context-parallel-processes: start the worker processes with dsv41rt.cp_launch.open_runtime"
            )
        if opts.context_parallel_backend == "nccl":
            from . import comm  # noqa: F401  (puts the pip NCCL on the loader's search path)
        self.options = opts
        self._engine_thread = engine_thread
        self.config: ModelConfig = load_config(checkpoint)
        self._checkpoint = checkpoint
        self._grammar_vocab = False  # given to the core at the first grammar (set_grammar_vocab)
        core = core_options(
            checkpoint,
            opts,
            engram_tables=engram_tables_for(checkpoint, self.config),
            engine_thread=engine_thread,
            rank=rank,
            group_id=group_id,
            worker_threads=worker_threads,
        )
        if draft_source is not None:
            core.draft_source = lambda i, t, k: [int(x) for x in draft_source(int(i), list(t), int(k))]
        if forced_acceptance is not None:
            core.forced_acceptance = lambda i, k: int(forced_acceptance(int(i), int(k)))
        bar = _load_progress(checkpoint) if progress else None
        try:
            self._rt = _core.Runtime(core, bar)
        finally:
            if bar is not None:
                bar.close()

    def describe_pool(self) -> str:
        return self._rt.describe_pool()

    # ---- requests -----------------------------------------------------------------------------
    def _check_ids(self, ids: Sequence[int], what: str) -> list[int]:
        out = []
        for i, t in enumerate(ids):
            if isinstance(t, bool) or not isinstance(t, (int, np.integer)):
                raise Dsv41rtError(f"{what}[{i}] is {t!r}, not a token id")
            if not 0 <= int(t) < self.config.vocab_size:
                raise Dsv41rtError(f"{what}[{i}] = {int(t)} is outside the vocabulary [0, {self.config.vocab_size})")
            out.append(int(t))
        return out

    def add_request(
        self,
        prompt_ids: Sequence[int],
        max_new_tokens: int = 16,
        sampling: SamplingParams | None = None,
        stop_token_ids: Sequence[int] | None = None,
        ignore_eos: bool = False,
        grammar: Grammar | None = None,
        handoff: bool = False,
    ) -> int:
        """Queue a request (greedy unless `sampling` says otherwise); returns its id. With `grammar`
        its output is held to it (the vocabulary comes from the checkpoint's tokenizer.json unless
        set_grammar_vocab gave one); a grammar the compiler refuses raises here. With `handoff`
        (prefill role) it ends after its first token, whose output carries the request's state
        (StepOutput.handoff) for another runtime's add_handoff_request; unless it ends at that token
        anyway (a stop token, max_new_tokens 1, its grammar)."""
        prompt, stops, g = self._request_args(prompt_ids, max_new_tokens, stop_token_ids, grammar)
        sampling_dict = (sampling or GREEDY).to_dict()
        return self._rt.submit(prompt, max_new_tokens, sampling_dict, stops, ignore_eos, g, handoff)

    def add_handoff_request(
        self,
        prompt_ids: Sequence[int],
        first_token: int,
        state: bytes,
        max_new_tokens: int = 16,
        sampling: SamplingParams | None = None,
        stop_token_ids: Sequence[int] | None = None,
        ignore_eos: bool = False,
        grammar: Grammar | None = None,
    ) -> int:
        """Continue a request another runtime of the same model and pool layout prefilled (decode
        role): its prompt, the first token generated there and its state (StepOutput.handoff); the
        rest as add_request (max_new_tokens counts the first token). Its outputs hold the second
        token onwards, equal to a run here from the start. It takes its pool pages at once: no room
        now raises Dsv41rtError (code out_of_range); a bad state raises naming what is wrong."""
        prompt, stops, g = self._request_args(prompt_ids, max_new_tokens, stop_token_ids, grammar)
        (first,) = self._check_ids([first_token], "first_token")
        if not isinstance(state, bytes | bytearray | memoryview):
            raise Dsv41rtError(f"state must be bytes (StepOutput.handoff), got {type(state).__name__}")
        sampling_dict = (sampling or GREEDY).to_dict()
        return self._rt.submit_handoff(prompt, first, bytes(state), max_new_tokens, sampling_dict, stops, ignore_eos, g)

    def _request_args(
        self,
        prompt_ids: Sequence[int],
        max_new_tokens: int,
        stop_token_ids: Sequence[int] | None,
        grammar: Grammar | None,
    ) -> tuple[list[int], list[int], dict[str, Any]]:
        prompt = self._check_ids(prompt_ids, "prompt_ids")
        if not prompt:
            raise Dsv41rtError("prompt_ids must contain at least one token")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise Dsv41rtError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
        stops = self._check_ids(stop_token_ids or [], "stop_token_ids")
        if grammar is not None and not self._grammar_vocab:
            self.set_grammar_vocab()
        g = grammar.to_dict() if grammar is not None else {}
        return prompt, stops, g

    def set_grammar_vocab(
        self, tokens: Sequence[bytes] | None = None, stop_token_ids: Sequence[int] | None = None
    ) -> None:
        """The vocabulary grammars compile against: each token's bytes (b"" for control tokens) and
        the tokens that end a completed grammar; by default the checkpoint's tokenizer.json
        (dsv41rt.tokenizer.grammar_vocab) and the model's end-of-sequence token."""
        if not _core.Runtime.grammar_available():
            raise Dsv41rtError("grammar-constrained decoding is not in this build (configured without xgrammar)")
        if tokens is None:
            path = os.path.join(self._checkpoint, "tokenizer.json")
            if not os.path.exists(path):
                raise Dsv41rtError(f"{path}: a grammar needs the model's tokenizer (no tokenizer.json)")
            tokens = grammar_vocab(path)
        stops = list(stop_token_ids) if stop_token_ids is not None else [self.config.eos_token_id]
        self._rt.set_grammar_vocab(list(tokens), stops)
        self._grammar_vocab = True

    def abort(self, request_id: int, wait: bool = True) -> None:
        """End a request (its pages are freed). With an engine thread, wait=False returns at once and
        the aborted output follows through await_outputs()."""
        self._rt.cancel(request_id, wait)

    def step(self) -> list[StepOutput]:
        """Run one engine step: new tokens of the requests that advanced, and finished requests."""
        return [_step_output(o) for o in self._rt.step()]

    def await_outputs(self, timeout: float) -> list[StepOutput]:
        """engine_thread=True: the outputs gathered since the last call (one per request), waiting up
        to `timeout` seconds for at least one (the GIL is released while waiting)."""
        return [_step_output(o) for o in self._rt.await_any(timeout)]

    def has_unfinished(self) -> bool:
        return not self._rt.idle()

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int = 16,
        sampling: SamplingParams | None = None,
        sequential: bool = False,
        ignore_eos: bool = False,
    ) -> list[list[int]]:
        """Continuations of every prompt: submitted together (continuous batching) or one at a time."""
        results: dict[int, list[int]] = {}
        batches = [[p] for p in prompts] if sequential else [list(prompts)]
        order = []
        for batch in batches:
            ids = [self.add_request(p, max_new_tokens, sampling, ignore_eos=ignore_eos) for p in batch]
            order += ids
            for i in ids:
                results[i] = []
            pending = set(ids)
            while pending:
                outs = self.await_outputs(1.0) if self._engine_thread else self.step()
                for o in outs:
                    if o.request_id in results:
                        results[o.request_id].extend(o.new_tokens)
                    if o.finished:
                        if o.finish_reason == "error":
                            raise Dsv41rtError(f"request {o.request_id}: {o.error}")
                        pending.discard(o.request_id)
                if not outs and not self._engine_thread and not self.has_unfinished():
                    break
        return [results[i] for i in order]

    def stats(self) -> dict[str, int]:
        return flat_stats(self._rt.stats())

    @property
    def device(self) -> str:
        """The executor's device: "cpu" or "cuda:N"."""
        return str(self._rt.info().device)

    def set_switch(self, name: str, on: bool) -> None:
        """Switch "multistream", "cuda_graphs", "tensor_cores", "cp_timing", "attention_in_place" or
        "programmatic_launch" between forwards (A/B measurements)."""
        if name not in _core.Switch.__members__:
            raise Dsv41rtError(f"unknown switch {name!r} (one of {', '.join(_core.Switch.__members__)})")
        self._rt.set_switch(_core.Switch.__members__[name], bool(on))

    def backend_stats(self) -> dict[str, int]:
        """The executor's counters (CUDA: weight bytes, eager forwards, graph captures/replays, ...)."""
        return {k: int(v) for k, v in _fields(self._rt.stats().backend).items()}

    def check_invariants(self) -> None:
        self._rt.check_invariants()

    # ---- scoring ------------------------------------------------------------------------------
    def score(self, prompt_ids: Sequence[int], chunk_size: int | None = None) -> np.ndarray:
        """Logits float32 [len, vocab] of every position, prefilled in chunks of `chunk_size`."""
        prompt = self._check_ids(prompt_ids, "prompt_ids")
        if not prompt:
            raise Dsv41rtError("cannot score an empty prompt")
        if chunk_size is not None and chunk_size < 1:
            raise Dsv41rtError(f"chunk_size must be >= 1, got {chunk_size}")
        handle = self.new_handle()
        try:
            step = chunk_size or len(prompt)
            parts = [self.forward_tokens(handle, prompt[i : i + step]) for i in range(0, len(prompt), step)]
        finally:
            self.release_handle(handle)
        return np.concatenate(parts, axis=0)

    # ---- diagnostics / low level --------------------------------------------------------------
    def dequant_counters(self) -> dict[str, int]:
        return _fields(self._rt.stats().dequant)

    def reset_dequant_counters(self) -> None:
        self._rt.reset_dequant_counters()

    def set_dequant_reuse(self, on: bool) -> None:
        self._rt.set_dequant_reuse(on)

    def reset_prefix_cache(self) -> None:
        """Forget every cached prefix (pages that running requests share stay with them)."""
        self._rt.reset_prefix_cache()

    def decisions(self) -> dict[str, np.ndarray]:
        """The last forward's "topk_L<l>" / "experts_L<l>" arrays (sorted rows), if recording."""
        return {k: v for k, v in self._rt.decisions().items() if k.startswith(("topk_L", "experts_L"))}

    def window_kv_inputs(self) -> dict[int, np.ndarray]:
        """Per layer, the last forward's window-KV rows [rows, head_dim] (float32) as they entered
        their cache rounding, if recording decisions: an oracle aligns near-tie roundings with them."""
        return {int(k[len("window_kv_L") :]): v for k, v in self._rt.decisions().items() if k.startswith("window_kv_L")}

    def dspark_target_features(self) -> dict[int, np.ndarray]:
        """Per DSpark target layer, the last forward's drafter features [rows, hidden] (float32: the
        mean over the hc streams of the layer's input after Engram, spec 4.2), if recording decisions."""
        prefix = "dspark_features_L"
        return {int(k[len(prefix) :]): v for k, v in self._rt.decisions().items() if k.startswith(prefix)}

    def mtp_outputs(self) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """Per DeepSeek-V4 MTP layer s (a Runtime with load_drafter=True, recording decisions), the last
        forward's final streams fed in [rows, hc_mult * hidden] (before the hyper-head) and its logits
        [rows, vocab] (float32; row t predicts token t + 2)."""
        d = self._rt.decisions()
        prefix = "mtp_logits_S"
        return {
            int(k[len(prefix) :]): (d[f"mtp_streams_S{k[len(prefix) :]}"], v)
            for k, v in d.items()
            if k.startswith(prefix)
        }

    # Direct handles: a request's state outside the scheduler (the facade's sequences).
    def new_handle(self) -> int:
        """A direct handle (outside the scheduler) for scoring and parity tests."""
        return self._rt.open_sequence()

    def forward_tokens(
        self, handle: int, tokens: Sequence[int], all_logits: bool = True, undoable: bool = False
    ) -> np.ndarray:
        """Run tokens on a handle at its next positions; logits float32 [len(tokens), vocab] (or of
        the last position only, [1, vocab], with all_logits=False). `undoable`: keep what these
        positions overwrite, so that rollback_handle can take them back."""
        ids = np.asarray(self._check_ids(tokens, "tokens"), np.int32)
        return self._rt.forward(handle, ids, all_logits=all_logits, undoable=undoable)

    def rollback_handle(self, handle: int, r: int) -> None:
        """Take back the last `r` positions of `handle`'s latest forward (run with undoable=True):
        the handle continues bitwise as if they had never run, the pages past its new length go
        back to the pool. A forward of n positions goes back by any r <= n when n <= the model's
        sliding window, else only as a whole; rollbacks may repeat down to where it began; a
        decode or another forward starts over. Raises for r < 0 or past rollback_limit(handle)."""
        self._rt.rollback(handle, int(r))

    def verify_greedy(self, handle: int, last_token: int, draft: Sequence[int]) -> list[int]:
        """One greedy speculative step: `last_token` is the handle's newest token, not fed yet,
        `draft` k proposed tokens after it (k + 1 <= the model's sliding window). ONE forward over
        [last_token, *draft]; the longest prefix of `draft` the target's greedy tokens agree with is
        kept, the other positions are taken back exactly; returns those drafts plus the target's
        own next token (1 .. k + 1 tokens, what plain greedy decoding gives; the last one is the
        next call's `last_token`)."""
        (last,) = self._check_ids([last_token], "last_token")
        return [int(t) for t in self._rt.verify_greedy(handle, last, self._check_ids(draft, "draft"))]

    def draft_greedy(self, handle: int, last_token: int) -> DraftBlock:
        """The DSpark drafter's greedy block after `handle` (a Runtime loaded with load_drafter=True):
        anchored at `last_token` (the newest token, not fed yet), reading the target features the
        handle's own forwards captured; dspark_block_size tokens for the positions after it, each
        with its confidence logit. Feed the tokens the target accepts with verify_greedy."""
        (last,) = self._check_ids([last_token], "last_token")
        block = self._rt.draft_greedy(handle, last)
        return DraftBlock(tuple(int(t) for t in block.tokens), tuple(float(c) for c in block.confidence))

    def rollback_limit(self, handle: int) -> int:
        """The most positions rollback_handle(handle, r) takes back now (0: none)."""
        return int(self._rt.rollback_limit(handle))

    def fork_handle(self, handle: int) -> int:
        """A new handle holding a copy of `handle`'s state: it continues exactly as `handle` would
        (prefix sharing by copy; benchmarks use it to build many long contexts from one prefill)."""
        return self._rt.fork(handle)

    def decode_handles(self, handles: Sequence[int], tokens: Sequence[int]) -> np.ndarray:
        """One token for each handle in one batched forward (a decode step); logits [B, vocab]."""
        ids = np.asarray(self._check_ids(tokens, "tokens"), np.int32)
        return self._rt.decode(list(handles), ids)

    def decode_handles_greedy(self, handles: Sequence[int], tokens: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """The same step as the engine runs it: each handle's greedy next token (int32 [B]) and its
        raw logprob (float32 [B]), drawn on the device; no logits leave it (what a served decode
        step costs, which bench/bench_executor.py times)."""
        ids = np.asarray(self._check_ids(tokens, "tokens"), np.int32)
        return self._rt.decode_greedy(list(handles), ids)

    def release_handle(self, handle: int) -> None:
        self._rt.close_sequence(handle)

    def export_handle(self, handle: int) -> bytes:
        """`handle`'s cache state as one self-describing, checksummed blob (the request slot and
        the pages covering its length: cpp/runtime/sequence_state.h), for import_handle in another
        runtime of the same model and pool layout (the prefill/decode handoff)."""
        return self._rt.export_sequence(handle)

    def import_handle(self, blob: bytes) -> int:
        """A new handle from export_handle's blob: it continues exactly as the exported handle
        would. A truncated or corrupted blob, or one from another model or pool layout, raises
        (naming what differs) before any pool memory is taken."""
        if not isinstance(blob, bytes):
            raise Dsv41rtError(f"import_handle: expected bytes, got {type(blob).__name__}")
        return self._rt.import_sequence(blob)

    def close(self) -> None:
        """Ends every request, stops the engine thread and releases the executor and its device
        memory now (a context-parallel rank 0 then shuts its worker processes down). The Runtime is
        unusable afterwards."""
        rt = self.__dict__.pop("_rt", None)
        if rt is not None:
            rt.shutdown()

    def run_cp_worker(self) -> None:
        """Context-parallel rank > 0 in its own process: replays rank 0's calls until rank 0 shuts the
        group down (its Runtime is closed)."""
        self._rt.run_cp_worker()
