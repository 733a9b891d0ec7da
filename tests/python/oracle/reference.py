"""Reference logits from NeMo Automodel's V4.1 model, with per-position noise floors.

V4.1 is sensitive even to FP32-level noise: top-k, routing and the rounding of every cache element
to FP8/NVFP4/MXFP4 are discrete, so a 1-ulp change can flip one decision and move later logits by
~1e-3 or more. The reference itself shows this: its logits at a position change when the same
prefix is run inside a longer or shorter sequence (its GEMMs round differently for different row
counts). The noise floor of a position is therefore the largest change of the reference's own
logits there under perturbations that do not change the mathematics:
  - relative 1e-6 jitter of the token embeddings (two draws), as the shared oracle records;
  - running the same tokens as a shorter sequence (the prompt alone, and the sequence minus its last
    16 tokens), for the positions those runs contain.
A runtime computing in FP32 with the same quantisers should agree within ~1e-4 + 3 x this floor.

One discrete decision is aligned instead of measured: the rounding of each window-KV element to FP8.
Given the runtime's own inputs to that rounding (`window_kv`, recorded with `record_decisions`), the
reference rounds an element the runtime's way wherever the two inputs agree within
WINDOW_KV_AGREEMENT of their row's largest magnitude: there a rounding that went the other way is a
near-tie broken by summation order, not an error (seed 2's 200-token prompt holds an element that
the reference itself puts on either side of an FP8 midpoint depending on its sequence length; the
inputs of both sides agree to <= 1.2e-6 of the row amax through 10 layers before any such flip).
An input further away keeps the reference's rounding, so a real difference still shows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from .nemo_v41 import logits as nemo_logits


def jittered_logits(model: Any, ids: list[int], rel: float, seed: int) -> np.ndarray:
    import torch

    emb = model.get_input_embeddings()
    w0 = emb.weight.data
    noise = torch.randn(w0.shape, generator=torch.Generator().manual_seed(seed))
    emb.weight.data = (w0.float() * (1 + rel * noise)).to(w0.dtype)
    try:
        return nemo_logits(model, ids).numpy()
    finally:
        emb.weight.data = w0


WINDOW_KV_AGREEMENT = 2.0**-18  # |ours - reference| / row amax below which a rounding may go either way


def align_rounding(values: Any, rounded: Any, ours: np.ndarray, quantize: Callable[..., Any], **kw: Any) -> Any:
    """`rounded` (the reference's quantisation of `values`, [1, T, D]) with each element rounded as
    `quantize` rounds `ours` ([>= T, D], the runtime's inputs) where the two inputs agree within
    WINDOW_KV_AGREEMENT of the row's amax."""
    import torch

    mine = torch.from_numpy(np.ascontiguousarray(ours[: values.shape[1]])).to(values.dtype)[None]
    theirs = quantize(mine, **kw)
    near = (values - mine).abs() <= WINDOW_KV_AGREEMENT * values.abs().amax(-1, keepdim=True)
    return torch.where(near & (theirs != rounded), theirs, rounded)


@contextmanager
def window_rounding_aligned(window_kv: dict[int, np.ndarray] | None) -> Iterator[None]:
    """Within: every NeMo forward rounds its window KV (one FP8 cache quantisation per layer, in
    layer order) as `align_rounding` says, for layer l from `window_kv[l]` (rows in token order)."""
    if not window_kv:
        yield
        return
    import nemo_automodel.components.models.deepseek_v41.attention as nemo_attention

    quantize = nemo_attention.quantize_cache
    calls = [0]

    def aligned(values: Any, **kw: Any) -> Any:
        rounded = quantize(values, **kw)
        if kw["format"] != "fp8":
            return rounded
        layer = calls[0] % len(window_kv)
        calls[0] += 1
        return align_rounding(values, rounded, window_kv[layer], quantize, **kw)

    nemo_attention.quantize_cache = aligned
    try:
        yield
    finally:
        nemo_attention.quantize_cache = quantize


def reference(
    model: Any,
    ids: list[int],
    prompt_len: int | None = None,
    length_noise: bool = True,
    window_kv: dict[int, np.ndarray] | None = None,
) -> dict[str, np.ndarray]:
    """Logits of every position of `ids` and their noise floor (see the module docstring), with the
    window-KV roundings aligned to `window_kv` when given."""
    with window_rounding_aligned(window_kv):
        return _reference(model, ids, prompt_len, length_noise)


def _reference(model: Any, ids: list[int], prompt_len: int | None, length_noise: bool) -> dict[str, np.ndarray]:
    full = nemo_logits(model, ids).numpy()
    noise = np.zeros(len(ids), np.float32)
    for seed in (1, 2):
        noise = np.maximum(noise, np.abs(jittered_logits(model, ids, 1e-6, seed) - full).max(-1))
    for length in {prompt_len or len(ids), len(ids) - 16} if length_noise else ():
        if 0 < length < len(ids):
            shorter = nemo_logits(model, ids[:length]).numpy()
            noise[:length] = np.maximum(noise[:length], np.abs(shorter - full[:length]).max(-1))
    return {"logits": full, "noise": noise}


def decisions(model: Any, ids: list[int]) -> dict[str, np.ndarray]:
    """The reference's discrete decisions for `ids`: sorted indexer top-k ("topk_L<l>", -1 = none) of
    every index-source layer and sorted routed experts ("experts_L<l>") of every layer."""
    import torch

    got: dict[str, np.ndarray] = {}

    def keep(key: str, idx: Any) -> None:
        got[key] = torch.sort(idx.to(torch.int32), dim=-1).values.numpy()

    hooks = []
    for layer_id, layer in model.model.layers.items():
        if layer.attn.indexer is not None:
            topk_hook = lambda m, i, o, lid=layer_id: keep(f"topk_L{lid}", o.state.topk_indices[0])  # noqa: E731
            hooks.append(layer.attn.register_forward_hook(topk_hook))
        expert_hook = lambda m, i, o, lid=layer_id: keep(f"experts_L{lid}", o[1])  # noqa: E731
        hooks.append(layer.ffn.gate.register_forward_hook(expert_hook))
    try:
        nemo_logits(model, ids)
    finally:
        for h in hooks:
            h.remove()
    return got
