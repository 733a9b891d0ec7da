// Host-pointer entry points of the CUDA MoE, Engram and sampling kernels, for the
// device-parameterised op tests (tests/python/test_cuda_ops_moe.py through dsv41rt._core.cuda_ops).
// Plain C++: no CUDA types. Each copies inputs to the device, poisons the outputs, runs on the
// default stream, synchronises and copies back; CUDA errors and invalid inputs throw
// dsv41rt::Error (the same argument checks as the CPU references).
#pragma once

#include <cstdint>

#include "kernels/sampling.h"
#include "core/export.h"

namespace dsv41rt::kernels::cuda::testing {

DSV41RT_API void moe_route(const float* x, const float* gate_w, const float* bias /*nullable*/,
                           int64_t S, int64_t H, int64_t E, int64_t k, float routed_scaling_factor,
                           bool normalize, int32_t* idx, float* weight);

/// w1, w3 [E, I, H], w2 [E, H, I]; shared_* [Is, H] / [H, Is] or all nullptr.
DSV41RT_API void moe_forward(const float* x, const int32_t* idx, const float* weight, int64_t S,
                             int64_t H, int64_t k, int64_t E, int64_t I, const float* w1,
                             const float* w3, const float* w2, const float* shared_w1,
                             const float* shared_w3, const float* shared_w2, int64_t I_shared,
                             float limit, float* y);

/// moe_forward through the split kernels, `chunk` tokens per pass (workspace poisoned with NaN);
/// bf16_weights rounds every weight to BF16 first and runs the BF16-weight variant.
DSV41RT_API void moe_forward_split(const float* x, const int32_t* idx, const float* weight,
                                   int64_t S, int64_t H, int64_t k, int64_t E, int64_t I,
                                   const float* w1, const float* w3, const float* w2,
                                   const float* shared_w1, const float* shared_w3,
                                   const float* shared_w2, int64_t I_shared, float limit,
                                   int64_t chunk, bool bf16_weights, float* y);

/// y[M, N] (+)= bf16(x)[M, K] x bf16(w)[N, K]^T on tensor cores (gemm_tc.cuh), batched over
/// `batch` slices with element strides (x, w, y); w is rounded to BF16 first. `y` is read when
/// accumulating. ld* are row strides.
DSV41RT_API void gemm_bf16_tc(const float* x, int64_t ldx, const float* w, int64_t ldw, float* y,
                              int64_t ldy, int64_t M, int64_t N, int64_t K, bool accumulate,
                              int64_t batch, int64_t stride_x, int64_t stride_w, int64_t stride_y,
                              int64_t x_elems, int64_t w_elems, int64_t y_elems);

/// Median device milliseconds of gemm_bf16_tc on M x K random activations and N x K random BF16
/// weights (device-resident, CUDA events, after warm-up), over `reps` launches: for bench/.
DSV41RT_API double gemm_bf16_tc_time_ms(int64_t M, int64_t N, int64_t K, int reps);

/// The tensor-core MoE (moe_grouped.cuh) with every weight rounded to BF16 (workspace poisoned).
DSV41RT_API void moe_grouped_bf16(const float* x, const int32_t* idx, const float* weight,
                                  int64_t S, int64_t H, int64_t k, int64_t E, int64_t I,
                                  const float* w1, const float* w3, const float* w2,
                                  const float* shared_w1, const float* shared_w3,
                                  const float* shared_w2, int64_t I_shared, float limit, float* y);

DSV41RT_API void engram_hash_rows(const int64_t* compressed_ids, int64_t S, int64_t max_ngram,
                                  int64_t n_heads, const int64_t* multipliers,
                                  const int64_t* primes, const int64_t* offsets, int64_t pad_id,
                                  int64_t* rows);

/// X [S, n, H] updated in place (host memory).
DSV41RT_API void engram_forward(float* X, const float* emb, const float* wkv, const float* q_weight,
                                const float* k_weight, const uint8_t* token_mask /*nullable*/,
                                int64_t S, int64_t n, int64_t H, int64_t D, float eps);

/// One row: the filtered distribution (kernels::cpu::sampling_probs semantics), probs [V].
DSV41RT_API void sampling_probs(const float* logits, int64_t V, const kernels::SamplingParams& p,
                                const int32_t* prompt, int64_t n_prompt, const int32_t* output,
                                int64_t n_output, float* probs);

/// One row: the drawn token, its raw logprob and the top_logprobs alternatives (as
/// kernels::cpu::sample_token).
DSV41RT_API kernels::SampledToken sample_token(const float* logits, int64_t V,
                                           const kernels::SamplingParams& p, const int32_t* prompt,
                                           int64_t n_prompt, const int32_t* output,
                                           int64_t n_output, uint64_t step);

}  // namespace dsv41rt::kernels::cuda::testing
