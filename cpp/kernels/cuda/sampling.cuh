// CUDA token sampler (contract: kernels/sampling.h), one block per request row. Same pipeline,
// FP64 arithmetic and tie orders as kernels::cpu::sampling_probs / sample_token; the sums whose
// rounding decides the kept set and the drawn token (top-k mass, top-p prefix, total, inverse CDF)
// are accumulated sequentially in the CPU's order, and the (seed, step) uniform is the CPU's
// counter-based generator, so the GPU draws the CPU's token for the same inputs.
// Parameters and token ids are assumed valid (kernels::validate_sampling_params, ids in [0, V):
// the caller checks them). A logits row the CPU sampler refuses (NaN, +inf, or no finite value)
// draws token -1 for the caller to report.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/export.h"
#include "kernels/sampling.h"

namespace dsv41rt::kernels::cuda {

/// Bytes of workspace per row (rows are laid out at this stride; a multiple of 8).
DSV41RT_API int64_t sampling_workspace_bytes(int64_t V);

/// logit_rows [rows] (nullptr: row r): row r draws from logits row logit_rows[r].
/// tokens [rows] drawn with sampling_uniform(params[r].seed, steps[r]); logprobs [rows] the raw
/// log_softmax of the drawn token; top_ids / top_logprobs [rows, max_top] (may be nullptr when
/// max_top == 0): the first min(params[r].top_logprobs, V, max_top) entries of each row are
/// written (raw logprob descending, ties -> lower id), the rest are left untouched.
DSV41RT_API cudaError_t sample_token(const float* logits, const int64_t* logit_rows, int64_t rows,
                                     int64_t V, const kernels::SamplingParams* params,
                                     const int32_t* prompt, const int64_t* prompt_offsets,
                                     const int32_t* output, const int64_t* output_offsets,
                                     const uint64_t* steps, void* workspace, int32_t* tokens,
                                     float* logprobs, int32_t max_top, int32_t* top_ids,
                                     float* top_logprobs, cudaStream_t stream);

/// Token masks (kernels/sampling.h, kernels::cpu::mask_tokens): logits rows rows[i] get -inf at
/// the tokens mask words[i * token_mask_words(V) ...] does not allow; n <= 65535 rows.
DSV41RT_API cudaError_t mask_tokens(float* logits, const int64_t* rows, int64_t n, int64_t V,
                                    const uint32_t* words, cudaStream_t stream);

}  // namespace dsv41rt::kernels::cuda
