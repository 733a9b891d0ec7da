// MoE experts on tensor cores (precision "bf16"): the routed (token, slot) pairs are grouped by
// expert on the device (counts, offsets, a permutation and a tile table; no host round trip, so it
// is graph-capturable), each expert's rows go through the BF16 tensor-core GEMM (gemm_tc.cuh) for
// the gate/up and down projections, the shared expert runs as plain GEMMs over all tokens, and a
// combine kernel sums each token's slots in the FP32 path's order (ascending expert id, slot; then
// the shared expert). Same maths as moe_forward (silu(min(g, L)) * clamp(u, -L, L) * weight, then
// the down projection); the activations entering each GEMM are rounded to BF16.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/export.h"
#include "kernels/weight_view.h"

namespace dsv41rt::kernels::cuda {

/// Device scratch of one moe_grouped_bf16 call for S tokens (sizes from moe_grouped_sizes).
struct MoeGroupedWorkspace {
  int32_t* counts = nullptr;  ///< [2 * E] per-expert counts, then placement cursors
  int32_t* perm = nullptr;    ///< [S * k] grouped position -> t * k + slot
  int32_t* inv = nullptr;     ///< [S * k] t * k + slot -> grouped position
  int32_t* tiles = nullptr;   ///< [3 * max_tiles] group, row0, row_end
  float* gate = nullptr;      ///< [S * k, I] gate GEMM, then the scaled hidden units
  float* up = nullptr;        ///< [S * k, I]
  float* out = nullptr;       ///< [S * k, H] each pair's down projection
  float *shared_gate = nullptr, *shared_up = nullptr;  ///< [S, Is]
  float* shared_out = nullptr;                         ///< [S, H]
  // Optional, for forwards that are never graph-captured: with both set (and H, I, Is multiples
  // of 8) the GEMMs run on the wgmma kernel (gemm_wgmma.cuh) over BF16 operands staged here.
  // a_bf16: max(S * k * max(H, I), S * max(H, Is)) elements; b_bf16: b_bf16_elems elements, at
  // least one expert's matrix (I * H) and the shared expert's (Is * H): experts are decoded into
  // it as many at a time as fit.
  uint16_t* a_bf16 = nullptr;
  uint16_t* b_bf16 = nullptr;
  int64_t b_bf16_elems = 0;
};

struct MoeGroupedSizes {
  int64_t max_tiles, ints, floats;  ///< tile-table entries; int32s and floats of the workspace
};

/// Workspace sizes for S tokens (carve the workspace with moe_grouped_carve).
DSV41RT_API MoeGroupedSizes moe_grouped_sizes(int64_t S, int64_t H, int64_t k, int64_t E, int64_t I,
                                              int64_t Is);
DSV41RT_API MoeGroupedWorkspace moe_grouped_carve(int32_t* ints, float* floats, int64_t S,
                                                  int64_t H, int64_t k, int64_t E, int64_t I,
                                                  int64_t Is);

/// y[S, H] = routed + shared experts of x[S, H] (idx/weight [S, k] from moe_route). Weights as
/// stored, BF16-exact (kernels/weight_view.h; w1/w3 one view of [E * I, H] rows, w2 of [E * H, I],
/// shared [Is, H] / [H, Is]; shared_w1.data == nullptr: none). fp8_hidden (precision "fp8"): the
/// hidden units go through fp8_act_qdq (quant.cuh) before the down projections, I and Is then
/// multiples of 32 (the caller quantises x the same way).
DSV41RT_API cudaError_t
moe_grouped_bf16(const float* x, const int32_t* idx, const float* weight, int64_t S, int64_t H,
                 int64_t k, int64_t E, int64_t I, const kernels::WeightView& w1,
                 const kernels::WeightView& w3, const kernels::WeightView& w2,
                 const kernels::WeightView& shared_w1, const kernels::WeightView& shared_w3,
                 const kernels::WeightView& shared_w2, int64_t Is, float limit, float* y,
                 const MoeGroupedWorkspace& ws, cudaStream_t stream, bool fp8_hidden = false);

}  // namespace dsv41rt::kernels::cuda
