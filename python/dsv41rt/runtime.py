"""`dsv41rt.Runtime`: load a checkpoint, run requests step by step, score prompts.

A thin wrapper over the C++ engine (`dsv41rt._core.Engine`): continuous batching over the paged KV
pool, tokens drawn on the device with each request's sampling parameters, and direct handles for
scoring and parity tests.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from . import _core
from .checkpoint.reader import open_checkpoint
from .config.engram_layout import engram_layouts
from .errors import Dsv41rtError
from .sampling import GREEDY, SamplingParams
from .tokenizer import engram_multipliers
from .tokenizer.cache import cached_token_map


class StepOutput(NamedTuple):
    request_id: int
    new_tokens: list[int]
    finished: bool
    finish_reason: str | None  # "length" | "stop" | "abort" | None
    logprobs: list[float]  # raw logprob of each new token
    top_logprobs: list[dict[int, float]]  # per new token, when requested


def engram_inputs(path: str, opened) -> tuple[np.ndarray | None, list[dict]]:
    """The Engram token map and per-layer hash inputs of a checkpoint (None, [] without Engram)."""
    return _engram_inputs(path, opened)


def _engram_inputs(path: str, opened) -> tuple[np.ndarray | None, list[dict]]:
    cfg = opened.config
    if cfg.engram is None:
        return None, []
    tok = os.path.join(path, "tokenizer.json")
    if not os.path.exists(tok):
        raise Dsv41rtError(f"{path}: Engram layers need the checkpoint's tokenizer.json (not found)")
    token_map, n_classes = cached_token_map(tok)
    e = cfg.engram
    if n_classes != e.compressed_vocab_size:
        raise Dsv41rtError(
            f"{tok}: the tokenizer normalises to {n_classes} classes but engram_compressed_vocab_size is "
            f"{e.compressed_vocab_size}; the Engram hash depends on it"
        )
    if len(token_map) != cfg.vocab_size:
        raise Dsv41rtError(f"{tok}: tokenizer has {len(token_map)} ids, config vocab_size is {cfg.vocab_size}")
    layers = [
        {
            "multipliers": engram_multipliers(layout.layer_id, n_classes, e.max_ngram_size),
            "primes": list(layout.primes),
            "offsets": list(layout.offsets),
        }
        for layout in engram_layouts(e)
    ]
    return np.ascontiguousarray(token_map, dtype=np.int32), layers


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
    """A loaded model: the C++ engine (continuous batching, paged KV pool, sampling) behind it."""

    def __init__(
        self,
        checkpoint: str,
        device: str = "cpu",
        *,
        kv_memory: int = 256 << 20,
        max_running: int = 64,
        token_budget: int = 512,
        max_context: int = 0,
        page_tokens: int = 64,
        cache_quant: bool = True,
        record_decisions: bool = False,
        multistream: bool = True,
        cuda_graphs: bool = True,
        precision: str = "fp32",
        cp_size: int = 1,
        cp_comm: str = "local",
        cp_rank: int = -1,
        cp_id: bytes = b"",
        cp_workers: bool = False,
        progress: bool = False,
    ) -> None:
        """Load `checkpoint` (validated against its config).

        kv_memory sizes the KV pool (bytes for request slots + token pages); max_running caps the
        requests running at once; token_budget caps the tokens per step (prefill chunks + decodes);
        max_context caps prompt + generated tokens per request (0 = what the pool holds); page_tokens is
        the KV page size in positions (a multiple of every compression ratio).
        cache_quant=False keeps every cache in FP32 (a debugging deviation from the released numerics,
        matching the reference's "cache quantisation off" mode); record_decisions keeps each forward's
        indexer top-k and routed experts for `decisions()`.
        precision "fp32" computes every projection in FP32 (the reference numerics); "bf16" (CUDA
        only) runs projections and experts of 16+ rows on BF16 tensor cores (activations rounded to
        BF16 at each GEMM input, FP32 accumulation).
        cp_size > 1 splits prefill forwards round-robin over that many context-parallel ranks
        (virtual ranks in this process, each with a replica of the KV state; decode runs
        replicated): the same logits as cp_size 1 (docs/design/context-parallel.md). cp_comm "nccl"
        puts rank r on CUDA device base + r over NCCL (cp_size 1: the CP data flow on one GPU).
        One process per GPU (dsv41rt.cp_launch): cp_rank r of cp_size with the group's NCCL id cp_id;
        rank 0 runs the engine, the others call run_cp_worker(). cp_workers runs that protocol with
        the ranks as threads of this process (LocalComm), for tests.
        """
        if not (device in ("cpu", "cuda") or (device.startswith("cuda:") and device[5:].isdigit())):
            raise Dsv41rtError(f"unknown device {device!r} (expected 'cpu', 'cuda' or 'cuda:N')")
        if cp_comm == "nccl":
            from . import comm  # noqa: F401  (puts the pip NCCL on the loader's search path)
        opened = open_checkpoint(checkpoint)  # validates config and every tensor, errors by name
        self.config = opened.config
        token_map, layers = _engram_inputs(checkpoint, opened)
        del opened
        bar = _load_progress(checkpoint) if progress else None
        try:
            self._ex = _core.Engine(
                checkpoint,
                token_map,
                layers,
                cache_quant=cache_quant,
                record_decisions=record_decisions,
                kv_memory_bytes=int(kv_memory),
                max_running=int(max_running),
                token_budget=int(token_budget),
                max_context=int(max_context),
                page_tokens=int(page_tokens),
                device=device,
                multistream=bool(multistream),
                cuda_graphs=bool(cuda_graphs),
                precision=str(precision),
                cp_size=int(cp_size),
                cp_comm=str(cp_comm),
                cp_rank=int(cp_rank),
                cp_id=bytes(cp_id),
                cp_workers=bool(cp_workers),
                progress=bar,
            )
        except _core.Error as err:
            raise Dsv41rtError(str(err)) from None
        finally:
            if bar is not None:
                bar.close()

    def describe_pool(self) -> str:
        return self._ex.describe_pool()

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
    ) -> int:
        """Queue a request (greedy unless `sampling` says otherwise); returns its id."""
        prompt = self._check_ids(prompt_ids, "prompt_ids")
        if not prompt:
            raise Dsv41rtError("prompt_ids must contain at least one token")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise Dsv41rtError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
        stops = self._check_ids(stop_token_ids or [], "stop_token_ids")
        try:
            return self._ex.submit(prompt, max_new_tokens, (sampling or GREEDY).to_dict(), stops, ignore_eos)
        except _core.Error as err:
            raise Dsv41rtError(str(err)) from None

    def abort(self, request_id: int) -> None:
        try:
            self._ex.cancel(request_id)
        except _core.Error as err:
            raise Dsv41rtError(str(err)) from None

    def step(self) -> list[StepOutput]:
        """Run one engine step: new tokens of the requests that advanced, and finished requests."""
        outs = []
        for o in self._ex.step():
            tops = [dict(zip(ids, lps, strict=True)) for ids, lps in zip(o["top_ids"], o["top_logprobs"], strict=True)]
            outs.append(
                StepOutput(o["id"], list(o["new_tokens"]), o["finished"], o["finish_reason"], list(o["logprobs"]), tops)
            )
        return outs

    def has_unfinished(self) -> bool:
        return not self._ex.idle()

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
            while self.has_unfinished():
                for o in self.step():
                    if o.request_id in results:
                        results[o.request_id].extend(o.new_tokens)
        return [results[i] for i in order]

    def stats(self) -> dict[str, int]:
        return dict(self._ex.stats())

    @property
    def device(self) -> str:
        """The executor's device: "cpu" or "cuda:N"."""
        return str(self._ex.device)

    def set_backend_option(self, name: str, on: bool) -> None:
        """Switch "multistream" or "cuda_graphs" between forwards (CUDA executor; A/B measurements)."""
        try:
            self._ex.set_backend_option(name, bool(on))
        except _core.Error as err:
            raise Dsv41rtError(str(err)) from None

    def backend_stats(self) -> dict[str, int]:
        """Executor-specific counters (CUDA: weight bytes, eager forwards, graph captures/replays)."""
        return dict(self._ex.backend_stats())

    def check_invariants(self) -> None:
        self._ex.check_invariants()

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
            self._ex.release(handle)
        return np.concatenate(parts, axis=0)

    # ---- diagnostics / low level --------------------------------------------------------------
    def dequant_counters(self) -> dict[str, int]:
        s = self.stats()
        return {k: s[k] for k in ("dequant_calls", "reuse_hits", "rows_dequantised")}

    def reset_dequant_counters(self) -> None:
        self._ex.reset_counters()

    def set_dequant_reuse(self, on: bool) -> None:
        self._ex.set_dequant_reuse(on)

    def decisions(self) -> dict[str, np.ndarray]:
        """The last forward's "topk_L<l>" / "experts_L<l>" arrays (sorted rows), if recording."""
        return dict(self._ex.decisions())

    def new_handle(self) -> int:
        """A direct executor handle (outside the scheduler) for scoring and parity tests."""
        try:
            return self._ex.new_handle()
        except _core.Error as err:
            raise Dsv41rtError(str(err)) from None

    def forward_tokens(self, handle: int, tokens: Sequence[int]) -> np.ndarray:
        """Run tokens on a handle at its next positions; logits float32 [len(tokens), vocab]."""
        ids = np.asarray(self._check_ids(tokens, "tokens"), np.int32)
        try:
            return self._ex.forward(handle, ids, all_logits=True)
        except _core.Error as err:
            raise Dsv41rtError(str(err)) from None

    def close(self) -> None:
        """Releases the engine, its executor and its device memory now (a context-parallel rank 0
        then shuts its worker processes down). The Runtime is unusable afterwards."""
        self.__dict__.pop("_ex", None)

    def run_cp_worker(self) -> None:
        """Context-parallel rank > 0 (cp_rank) in its own process: replays rank 0's calls until rank 0
        shuts the group down (its Runtime is closed)."""
        try:
            self._ex.run_cp_worker()
        except _core.Error as err:
            raise Dsv41rtError(str(err)) from None

    def fork_handle(self, handle: int) -> int:
        """A new handle holding a copy of `handle`'s state: it continues exactly as `handle` would
        (prefix sharing by copy; benchmarks use it to build many long contexts from one prefill)."""
        try:
            return self._ex.fork(handle)
        except _core.Error as err:
            raise Dsv41rtError(str(err)) from None

    def decode_handles(self, handles: Sequence[int], tokens: Sequence[int]) -> np.ndarray:
        """One token for each handle in one batched forward (a decode step); logits [B, vocab]."""
        ids = np.asarray(self._check_ids(tokens, "tokens"), np.int32)
        try:
            return self._ex.decode(list(handles), ids)
        except _core.Error as err:
            raise Dsv41rtError(str(err)) from None

    def release_handle(self, handle: int) -> None:
        self._ex.release(handle)
