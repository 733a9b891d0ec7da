"""CPU reference ops (FP32) on numpy arrays, for tests."""

from typing import Annotated

import numpy
from numpy.typing import NDArray


def linear(x: Annotated[NDArray[numpy.float32], dict(shape=(None, None), order='C', device='cpu', writable=False)], w: Annotated[NDArray[numpy.float32], dict(shape=(None, None), order='C', device='cpu', writable=False)]) -> NDArray[numpy.float32]:
    """y = x @ w.T (FP32)"""

def fp8_window_qdq(x: Annotated[NDArray[numpy.float32], dict(order='C', device='cpu', writable=False)]) -> NDArray:
    """
    Window-KV cache QDQ: FP8 E4M3, blocks of 32, UE8M0 scales. x float32 [..., dim].
    """

def nvfp4_qdq(x: Annotated[NDArray[numpy.float32], dict(order='C', device='cpu', writable=False)]) -> NDArray:
    """
    Compressed-KV cache QDQ: E2M1, blocks of 16, E4M3 scales. x float32 [..., dim].
    """

def mxfp4_qdq(x: Annotated[NDArray[numpy.float32], dict(order='C', device='cpu', writable=False)]) -> NDArray:
    """
    Indexer cache QDQ: E2M1, blocks of 32, UE8M0 scales. x float32 [..., dim].
    """

def v4_row_qdq(x: Annotated[NDArray[numpy.float32], dict(order='C', device='cpu', writable=False)]) -> NDArray:
    """
    DeepSeek-V4 cache-row QDQ (584-byte rows): FP8 E4M3 channels 0..447 in blocks of 64 with UE8M0 scales, BF16 channels 448..511. x float32 [..., 512].
    """

def fp8_window_pack(x: Annotated[NDArray[numpy.float32], dict(order='C', device='cpu', writable=False)]) -> NDArray:
    """float32 [..., dim] -> uint8 [..., dim + dim/32]."""

def fp8_window_unpack(packed: Annotated[NDArray[numpy.uint8], dict(order='C', device='cpu', writable=False)]) -> NDArray:
    """uint8 [..., dim + dim/32] -> float32 [..., dim]."""

def nvfp4_pack(x: Annotated[NDArray[numpy.float32], dict(order='C', device='cpu', writable=False)]) -> NDArray:
    """float32 [..., dim] -> uint8 [..., dim/2 + dim/16]."""

def nvfp4_unpack(packed: Annotated[NDArray[numpy.uint8], dict(order='C', device='cpu', writable=False)]) -> NDArray:
    """uint8 [..., dim/2 + dim/16] -> float32 [..., dim]."""

def mxfp4_pack(x: Annotated[NDArray[numpy.float32], dict(order='C', device='cpu', writable=False)]) -> NDArray:
    """float32 [..., dim] -> uint8 [..., dim/2 + dim/32]."""

def mxfp4_unpack(packed: Annotated[NDArray[numpy.uint8], dict(order='C', device='cpu', writable=False)]) -> NDArray:
    """uint8 [..., dim/2 + dim/32] -> float32 [..., dim]."""

def dequant_fp8_blocks(codes: Annotated[NDArray[numpy.uint8], dict(shape=(None, None), order='C', device='cpu', writable=False)], scales: Annotated[NDArray[numpy.uint8], dict(shape=(None, None), order='C', device='cpu', writable=False)], block_rows: int, block_cols: int) -> NDArray:
    """
    E4M3 codes uint8 [rows, cols] * UE8M0 scales uint8 [ceil(rows/br), ceil(cols/bc)] -> float32 [rows, cols].
    """

def dequant_fp4_rows(packed: Annotated[NDArray, dict(shape=(None, None), order='C', device='cpu', writable=False)], scales: Annotated[NDArray[numpy.uint8], dict(shape=(None, None), order='C', device='cpu', writable=False)]) -> NDArray:
    """
    Packed E2M1 int8/uint8 [rows, cols/2] * UE8M0 scales uint8 [rows, ceil(cols/32)] -> float32 [rows, cols].
    """

def rms_norm(x: Annotated[NDArray[numpy.float32], dict(order='C', device='cpu', writable=False)], weight: Annotated[NDArray[numpy.float32], dict(order='C', device='cpu', writable=False)], eps: float) -> NDArray[numpy.float32]:
    """y = weight * x * rsqrt(mean(x^2, -1) + eps) over the last dim (FP32)"""

def rope_inv_freq(rope_dim: int, base: float, yarn: dict | None = None) -> NDArray[numpy.float32]:
    """
    FP32 RoPE frequency table [rope_dim/2]; yarn = HF rope_scaling dict (factor, original_max_position_embeddings, beta_fast, beta_slow) or None
    """

def apply_rope(x: Annotated[NDArray[numpy.float32], dict(order='C', device='cpu', writable=False)], positions: Annotated[NDArray[numpy.int64], dict(shape=(None,), order='C', device='cpu', writable=False)], inv_freq: Annotated[NDArray[numpy.float32], dict(order='C', device='cpu', writable=False)], inverse: bool = False) -> NDArray[numpy.float32]:
    """
    Rotate the last 2*len(inv_freq) channels of x [rows, heads, head_dim] (interleaved pairs) by positions[r] * inv_freq; returns a new array
    """

def hc_mix(X: Annotated[NDArray[numpy.float32], dict(order='C', device='cpu', writable=False)], fn: Annotated[NDArray[numpy.float32], dict(order='C', device='cpu', writable=False)], base: Annotated[NDArray[numpy.float32], dict(order='C', device='cpu', writable=False)], scale: Annotated[NDArray[numpy.float32], dict(order='C', device='cpu', writable=False)], rms_eps: float, hc_eps: float, iters: int) -> tuple[NDArray[numpy.float32], NDArray[numpy.float32], NDArray[numpy.float32]]:
    """
    mHC mixer: X [S, n, H] -> (pre [S, n], post [S, n], comb [S, n(in), n(out)])
    """

def hc_collapse(X: Annotated[NDArray[numpy.float32], dict(order='C', device='cpu', writable=False)], w: Annotated[NDArray[numpy.float32], dict(order='C', device='cpu', writable=False)]) -> NDArray[numpy.float32]:
    """u[S, H] = sum_i w[:, i] * X[:, i]"""

def hc_expand(X: Annotated[NDArray[numpy.float32], dict(order='C', device='cpu', writable=False)], y: Annotated[NDArray[numpy.float32], dict(order='C', device='cpu', writable=False)], post: Annotated[NDArray[numpy.float32], dict(order='C', device='cpu', writable=False)], comb: Annotated[NDArray[numpy.float32], dict(order='C', device='cpu', writable=False)]) -> NDArray[numpy.float32]:
    """out[S, o, H] = post[:, o] * y + sum_i comb[:, i, o] * X[:, i]"""

def moe_route(x: Annotated[NDArray[numpy.float32], dict(shape=(None, None), order='C', device='cpu', writable=False)], gate_w: Annotated[NDArray[numpy.float32], dict(shape=(None, None), order='C', device='cpu', writable=False)], bias: Annotated[NDArray[numpy.float32], dict(shape=(None,), order='C', device='cpu', writable=False)] | None, k: int, routed_scaling_factor: float, normalize: bool = True) -> tuple:
    """
    Score routing (sqrtsoftplus, top-k of s + bias, weights from unbiased s): returns (idx int32 [S, k], weight float32 [S, k]).
    """

def moe_route_hash(x: Annotated[NDArray[numpy.float32], dict(shape=(None, None), order='C', device='cpu', writable=False)], gate_w: Annotated[NDArray[numpy.float32], dict(shape=(None, None), order='C', device='cpu', writable=False)], tid2eid: Annotated[NDArray[numpy.int32], dict(shape=(None, None), order='C', device='cpu', writable=False)], token_ids: Annotated[NDArray[numpy.int64], dict(shape=(None,), order='C', device='cpu', writable=False)], routed_scaling_factor: float, normalize: bool = True) -> tuple:
    """Hash routing (V4): returns (idx, weight)."""

def swiglu_expert(x: Annotated[NDArray[numpy.float32], dict(shape=(None, None), order='C', device='cpu', writable=False)], w1: Annotated[NDArray[numpy.float32], dict(shape=(None, None), order='C', device='cpu', writable=False)], w3: Annotated[NDArray[numpy.float32], dict(shape=(None, None), order='C', device='cpu', writable=False)], w2: Annotated[NDArray[numpy.float32], dict(shape=(None, None), order='C', device='cpu', writable=False)], row_scale: Annotated[NDArray[numpy.float32], dict(shape=(None,), order='C', device='cpu', writable=False)] | None, limit: float) -> NDArray[numpy.float32]:
    """Clamped SwiGLU expert; row_scale multiplies h before w2."""

def moe_forward(x: Annotated[NDArray[numpy.float32], dict(shape=(None, None), order='C', device='cpu', writable=False)], idx: Annotated[NDArray[numpy.int32], dict(shape=(None, None), order='C', device='cpu', writable=False)], weight: Annotated[NDArray[numpy.float32], dict(shape=(None, None), order='C', device='cpu', writable=False)], w1: Annotated[NDArray[numpy.float32], dict(shape=(None, None, None), order='C', device='cpu', writable=False)], w3: Annotated[NDArray[numpy.float32], dict(shape=(None, None, None), order='C', device='cpu', writable=False)], w2: Annotated[NDArray[numpy.float32], dict(shape=(None, None, None), order='C', device='cpu', writable=False)], shared_w1: Annotated[NDArray[numpy.float32], dict(shape=(None, None), order='C', device='cpu', writable=False)] | None, shared_w3: Annotated[NDArray[numpy.float32], dict(shape=(None, None), order='C', device='cpu', writable=False)] | None, shared_w2: Annotated[NDArray[numpy.float32], dict(shape=(None, None), order='C', device='cpu', writable=False)] | None, limit: float) -> NDArray[numpy.float32]:
    """
    Routed experts (stacked w1, w3 [E, I, H], w2 [E, H, I]) + shared expert.
    """

def engram_hash_rows(compressed_ids: Annotated[NDArray[numpy.int64], dict(shape=(None,), order='C', device='cpu', writable=False)], n_heads: int, multipliers: Annotated[NDArray[numpy.int64], dict(shape=(None,), order='C', device='cpu', writable=False)], primes: Annotated[NDArray[numpy.int64], dict(shape=(None,), order='C', device='cpu', writable=False)], offsets: Annotated[NDArray[numpy.int64], dict(shape=(None,), order='C', device='cpu', writable=False)], pad_id: int) -> NDArray[numpy.int64]:
    """
    Engram row ids [S, (max_ngram-1)*n_heads] of one layer; compressed_ids = max_ngram-1 history slots then S positions, negative = blocking.
    """

def engram_forward(X: Annotated[NDArray[numpy.float32], dict(shape=(None, None, None), order='C', device='cpu', writable=False)], emb: Annotated[NDArray[numpy.float32], dict(shape=(None, None), order='C', device='cpu', writable=False)], wkv: Annotated[NDArray[numpy.float32], dict(shape=(None, None), order='C', device='cpu', writable=False)], q_weight: Annotated[NDArray[numpy.float32], dict(shape=(None, None), order='C', device='cpu', writable=False)], k_weight: Annotated[NDArray[numpy.float32], dict(shape=(None, None), order='C', device='cpu', writable=False)], token_mask: Annotated[NDArray[numpy.bool_], dict(shape=(None,), order='C', device='cpu', writable=False)] | None, eps: float) -> NDArray[numpy.float32]:
    """Engram gated residual update; returns the new X [S, n, H]."""

def sparse_attention(q: Annotated[NDArray[numpy.float32], dict(shape=(None, None, None), order='C', device='cpu', writable=False)], kv: Annotated[NDArray[numpy.float32], dict(shape=(None, None), order='C', device='cpu', writable=False)], indices: Annotated[NDArray[numpy.int32], dict(shape=(None, None), order='C', device='cpu', writable=False)], sink: Annotated[NDArray[numpy.float32], dict(shape=(None,), order='C', device='cpu', writable=False)], scale: float) -> NDArray[numpy.float32]: ...

def compress_pool(values: Annotated[NDArray[numpy.float32], dict(shape=(None, None), order='C', device='cpu', writable=False)], scores: Annotated[NDArray[numpy.float32], dict(shape=(None, None), order='C', device='cpu', writable=False)], ratio: int) -> NDArray[numpy.float32]: ...

def indexer_scores(q: Annotated[NDArray[numpy.float32], dict(shape=(None, None, None), order='C', device='cpu', writable=False)], keys: Annotated[NDArray[numpy.float32], dict(shape=(None, None), order='C', device='cpu', writable=False)], w: Annotated[NDArray[numpy.float32], dict(shape=(None, None), order='C', device='cpu', writable=False)], n_visible: Annotated[NDArray[numpy.int64], dict(shape=(None,), order='C', device='cpu', writable=False)]) -> NDArray[numpy.float32]: ...

def candidate_blocks(scores: Annotated[NDArray[numpy.float32], dict(shape=(None, None), order='C', device='cpu', writable=False)], n_visible: Annotated[NDArray[numpy.int64], dict(shape=(None,), order='C', device='cpu', writable=False)], topk_blocks: int, block_size: int) -> NDArray[numpy.uint8]: ...

def topk_select(scores: Annotated[NDArray[numpy.float32], dict(shape=(None, None), order='C', device='cpu', writable=False)], k: int) -> NDArray[numpy.int32]: ...

def sampling_probs(logits: Annotated[NDArray[numpy.float32], dict(shape=(None,), order='C', device='cpu', writable=False)], params: dict, prompt: Annotated[NDArray[numpy.int32], dict(shape=(None,), order='C', device='cpu', writable=False)] | None = None, output: Annotated[NDArray[numpy.int32], dict(shape=(None,), order='C', device='cpu', writable=False)] | None = None) -> NDArray[numpy.float32]:
    """
    The filtered distribution sampled from (kernels/sampling.h): float32 [V].
    """

def sample_token(logits: Annotated[NDArray[numpy.float32], dict(shape=(None,), order='C', device='cpu', writable=False)], params: dict, prompt: Annotated[NDArray[numpy.int32], dict(shape=(None,), order='C', device='cpu', writable=False)] | None = None, output: Annotated[NDArray[numpy.int32], dict(shape=(None,), order='C', device='cpu', writable=False)] | None = None, step: int = 0) -> tuple:
    """
    One token drawn with the (seed, step) generator: (token, logprob, top_ids int32 [n], top_logprobs float32 [n]); logprobs are raw (log_softmax of the unmodified logits).
    """
