// Contract: MoE router, clamped-SwiGLU experts and the routed + shared MoE sum, all FP32
// (spec §3; reference: NeMo Automodel 0.7.0 moe/layers.py `Gate` / `DeepseekV4VisionGate`,
// moe/experts.py `GroupedExperts._forward_loop` + `swiglu_clamped_deepep`, gate_precision FP32).
//
// Layouts are row-major, weights PyTorch [out, in]:
//   x [S, H]; gate_w [E, H]; bias [E]; idx / weight [S, k];
//   w1, w3 [I, H] (gate / up); w2 [H, I] (down).
#pragma once

#include <cstdint>

#include "core/export.h"
#include "kernels/linear.h"

namespace dsv41rt::kernels {

/// Pointers to one expert's FP32 weights: w1, w3 [I, H], w2 [H, I].
struct SwigluWeights {
  const float* w1 = nullptr;
  const float* w3 = nullptr;
  const float* w2 = nullptr;
};

}  // namespace dsv41rt::kernels

namespace dsv41rt::kernels::cpu {

/// softplus exactly as torch.nn.functional.softplus(beta=1, threshold=20): x if x > 20,
/// else log1p(exp(x)).
DSV41RT_API float softplus(float x);

/// Score-routed gate (V4 / V4.1, "sqrtsoftplus", noaux_tc, no groups):
///   logits = x · gate_w^T (FP32), s = sqrt(softplus(logits)),
///   idx    = top-k of (s + bias) in descending order (bias may be nullptr = zeros); ties are
///   broken
///            towards the lower expert index (torch.topk leaves tie order unspecified),
///   weight = s[idx] / (Σ s[idx] + 1e-20) · routed_scaling_factor   (unbiased scores).
/// The normalisation is applied only when `normalize && k > 1` (NeMo: norm_topk_prob and topk > 1).
/// Each row depends only on its own x row (no batch effects). Requires 1 <= k <= E.
DSV41RT_API void moe_route(const float* x, const float* gate_w, const float* bias, int64_t S,
                           int64_t H, int64_t E, int64_t k, float routed_scaling_factor,
                           int32_t* idx, float* weight, bool normalize = true);

/// Hash-routed gate (V4 layers < num_hash_layers, spec §3.2): idx[t] = tid2eid[token_ids[t]]
/// (tid2eid [vocab, k] int32, entries in [0, E)), weights from the learned gate as in moe_route
/// (s = sqrt(softplus(x · gate_w^T)), weight = s[idx] / (Σ s[idx] + 1e-20) · scale when
/// `normalize`, the sum in slot order; unlike moe_route also for k = 1). References: transformers
/// 5.23 DeepseekV4HashRouter.forward (modeling_deepseek_v4.py:1119-1128: `weights / (weights.sum(
/// dim=-1, keepdim=True) + 1e-20)` then `* routed_scaling_factor`, unconditionally) and NeMo's
/// DeepseekV4HashGate (normalises unconditionally, i.e. normalize = true). Errors (Error,
/// kInvalidArgument) name the position and value of a token id outside [0, vocab) and of a
/// tid2eid entry outside [0, E). Tested against transformers in tests/cpp/test_v4_ops.cc.
DSV41RT_API void moe_route_hash(const float* x, const float* gate_w, const int32_t* tid2eid,
                                const int64_t* token_ids, int64_t S, int64_t H, int64_t E,
                                int64_t k, int64_t vocab, float routed_scaling_factor, int32_t* idx,
                                float* weight, bool normalize = true);

/// One clamped-SwiGLU expert on m rows:
///   g = x · w1^T, u = x · w3^T, g = min(g, L), u = clamp(u, -L, L), h = silu(g) · u,
///   h *= row_scale[r] (routing weight, applied BEFORE the down projection as NeMo does; nullptr
///   = 1), y (=|+=) h · w2^T. limit <= 0 disables both clamps (NeMo's swiglu_limit = 0 path).
/// x [m, H], y [m, H] (must not alias x). `inputs` (kernels/linear.h) is applied to x and to h
/// (after the routing weight) before their GEMMs: the GPU's precision "bf16" / "fp8", emulated.
DSV41RT_API void swiglu_expert(const float* x, const float* w1, const float* w3, const float* w2,
                               const float* row_scale, int64_t m, int64_t H, int64_t I, float limit,
                               float* y, bool accumulate = false,
                               GemmInputs inputs = GemmInputs::kFp32);

/// MoE block output y [S, H] (overwritten):
///   y[t] = Σ_{e in ascending expert id, each (t, slot) with idx[t, slot] == e}
///            swiglu_expert_e(x[t], row_scale = weight[t, slot])
///          + shared(x[t])  (weight 1, intermediate size I_shared; skipped when shared == nullptr).
/// Routed outputs are summed in FP32 starting from 0 in ascending expert id (NeMo's per-expert
/// scatter_add loop), then the shared output is added, so every row is bitwise independent of the
/// batch it is in. experts: array of E entries (only the experts that receive tokens are read).
/// idx entries must lie in [0, E).
DSV41RT_API void moe_forward(const float* x, const int32_t* idx, const float* weight, int64_t S,
                             int64_t H, int64_t k, int64_t E, int64_t I,
                             const SwigluWeights* experts, const SwigluWeights* shared,
                             int64_t I_shared, float limit, float* y,
                             GemmInputs inputs = GemmInputs::kFp32);

/// Expert parallelism, the routed half of moe_forward on one rank: slots [S, k, H] (overwritten)
/// holds swiglu_expert_e(x[t], weight[t, slot]) for every (t, slot) whose expert e lies in
/// [e_begin, e_begin + count) and 0 for the others. experts: `count` entries, expert e_begin + i
/// at i. Summing the ranks' slots (exactly one rank is non-zero per slot) and moe_combine give
/// moe_forward's y bitwise.
DSV41RT_API void moe_slots(const float* x, const int32_t* idx, const float* weight, int64_t S,
                           int64_t H, int64_t k, int64_t E, int64_t I, const SwigluWeights* experts,
                           int64_t e_begin, int64_t count, float limit, float* slots,
                           GemmInputs inputs = GemmInputs::kFp32);

/// Expert parallelism by partial sums: the ids of a rank's experts [begin, begin + count) become
/// its stack's [0, count) (out[i] = idx[i] - begin) and every other id becomes count, one past
/// the stack, which the CUDA expert kernels skip. (Not a negative id: their ascending-id walk over
/// a token's slots stops at -1.) out may alias idx.
DSV41RT_API void moe_local_ids(const int32_t* idx, int64_t n, int64_t begin, int64_t count,
                               int32_t* out);

/// The rest of moe_forward given every slot's routed output [S, k, H]: y[t] = t's slots summed
/// from 0 in ascending expert id, then the shared expert added (skipped when shared == nullptr).
DSV41RT_API void moe_combine(const float* x, const int32_t* idx, const float* slots, int64_t S,
                             int64_t H, int64_t k, const SwigluWeights* shared, int64_t I_shared,
                             float limit, float* y, GemmInputs inputs = GemmInputs::kFp32);

}  // namespace dsv41rt::kernels::cpu
