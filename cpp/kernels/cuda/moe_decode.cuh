// MoE for decode batches (S <= 64 tokens) reading the experts as stored: routed experts in MXFP4
// (or FP8 blocks / BF16), the shared expert in FP8 32x32 blocks (or any of the three), no BF16
// copy of any weight. Precision "bf16" (W4A16 / W8A16), the CPU emulation
// kernels::cpu::moe_forward(..., GemmInputs::kBf16) up to the summation order inside each dot
// product:
//   - x is rounded to BF16 (nearest even) before the gate/up products (routed and shared);
//   - h = silu(min(g, L)) * clamp(u, -L, L), times the routing weight (routed only), is rounded to
//     BF16 before the down product;
//   - weights are decoded exactly (every E2M1 / E4M3 code times a power-of-two scale is a BF16 in
//     BF16's normal range), products are exact, sums are FP32 (tensor-core mma, FP32 accumulate);
//   - y[t] = 0 + the token's routed slot outputs in ascending (expert id, slot) order, + the shared
//     expert's output: the CPU's order, so no float atomics and bitwise run-to-run identical.
// Graph-capturable: the touched experts and their (token, slot) pairs are found on the device; no
// host synchronisation, no allocation. Each touched expert's weights are streamed once per call.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/export.h"
#include "kernels/weight_view.h"

namespace dsv41rt::kernels::cuda {

struct MoeDecode {
  const float* x = nullptr;       ///< [S, H] FP32
  const int32_t* idx = nullptr;   ///< [S, k] expert ids; entries outside [0, E) are skipped
  const float* weight = nullptr;  ///< [S, k] routing weights
  int64_t S = 0, H = 0, k = 0, E = 0, I = 0, Is = 0;  ///< Is = 0: no shared expert
  kernels::WeightView w1, w3, w2;                     ///< routed: w1/w3 [E*I, H], w2 [E*H, I]
  kernels::WeightView sw1, sw3, sw2;  ///< shared: [Is, H], [Is, H], [H, Is] (unused when Is == 0)
  float limit = 0;                    ///< SwiGLU clamp (<= 0: none)
  /// Precision "fp8": h (after its BF16 rounding) goes through the FP8 activation QDQ
  /// (kernels::cpu::fp8_act_qdq) before the down product; the caller passes x QDQ'd likewise.
  bool fp8_inputs = false;
  float* y = nullptr;  ///< [S, H] FP32, overwritten
};

constexpr int64_t kMoeDecodeMaxTokens = 64;
/// Limits of the one-CTA device routing step (E experts counted and scanned by 1024 threads).
constexpr int64_t kMoeDecodeMaxExperts = 1024;
constexpr int64_t kMoeDecodeMaxTopK = 16;

/// Bytes of device scratch one call needs (0 when S == 0).
DSV41RT_API int64_t moe_decode_workspace_bytes(const MoeDecode& p);

/// Whether moe_decode_bf16 accepts p: 0 <= S <= 64, 1 <= k <= 16, 1 <= E <= 1024, H, I (and Is)
/// positive multiples of 32, weights BF16 / FP8 blocks (block_cols a multiple of 32) / MXFP4 of
/// the shapes above with 16-byte aligned data, x / y 16-byte aligned, pointers non-null.
DSV41RT_API bool moe_decode_supported(const MoeDecode& p);

/// y = routed + shared experts of x (see the file comment). Returns cudaErrorInvalidValue when
/// !moe_decode_supported(p) or the workspace is smaller than moe_decode_workspace_bytes(p).
/// The workspace is scratch (no state carries between calls); 256-byte aligned.
DSV41RT_API cudaError_t moe_decode_bf16(const MoeDecode& p, void* workspace,
                                        int64_t workspace_bytes, cudaStream_t s);

}  // namespace dsv41rt::kernels::cuda
