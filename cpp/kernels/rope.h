// Contract: rotary position embedding with the frequency-only YaRN adjustment (architecture spec
// §2.4; NeMo `deepseek_v41/attention.py` `_RotaryEmbedding` + `_apply_rope`).
//
// Frequency table (rope_inv_freq), FP32 like NeMo, for pair k = 0..R/2-1 (R = rope_dim):
//   e_k   = float(2k) / float(R)                                  (FP32 division)
//   p_k   = float(base ^ e_k)                                     (pow in double, rounded once)
//   θ_k   = 1 / p_k                                               (FP32 division)
//   YaRN, only when yarn != nullptr and yarn->original_max_position > 0 (NeMo's rule):
//     corr(β) = R · ln(L0 / (β · 2 · π)) / (2 · ln base)          (double)
//     low  = max(floor(corr(beta_fast)), 0), high = min(ceil(corr(beta_slow)), R − 1)
//     ramp_k = clamp((float(k) − low) / max(high − low, 1e-3), 0, 1)   (FP32)
//     θ'_k = (θ_k / factor) · ramp_k + θ_k · (1 − ramp_k)             (FP32, no FMA)
//   Note the quirk kept from the reference: low/high are in "dimension" units but compared with the
//   pair index k. base 160000, L0 65536, factor 16, R 64 gives low 15, high 25.
//
// Application (apply_rope), in place on x [rows, heads, head_dim] row-major:
//   the LAST rope_dim channels of each head are pairs (2k, 2k+1) = complex a + ib, rotated by
//   angle φ = float(pos) · θ_k (FP32 product), c = cosf(φ), s = sinf(φ) (as torch.polar):
//     forward: (a·c − b·s, a·s + b·c);  inverse (conjugate): (a·c + b·s, b·c − a·s)
//   each product rounded to FP32 then summed (the complex-multiply rounding NeMo keeps).
//   The leading head_dim − rope_dim channels are untouched. positions [rows] (int64, |pos| < 2^24
//   so float(pos) is exact), inv_freq [rope_dim / 2].
#pragma once

#include <cstdint>
#include <vector>

#include "core/export.h"

namespace dsv41rt::kernels {

/// HF/NeMo rope_scaling parameters (type "yarn"). original_max_position <= 0 disables YaRN.
struct YarnParams {
  double factor = 1.0;
  int64_t original_max_position = 0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
};

}  // namespace dsv41rt::kernels

namespace dsv41rt::kernels::cpu {

/// θ'_k for k = 0..rope_dim/2-1 (see the header comment). rope_dim must be even and > 0,
/// base > 0 (and != 1 when YaRN is on), factor > 0.
DSV41RT_API std::vector<float> rope_inv_freq(int64_t rope_dim, double base,
                                             const YarnParams* yarn /*nullptr = none*/);

/// The YaRN ramp bounds (low, high) used by rope_inv_freq (exposed for tests).
DSV41RT_API void yarn_low_high(int64_t rope_dim, double base, const YarnParams& yarn, int64_t* low,
                               int64_t* high);

/// Rotates the last rope_dim channels of every head of x [rows, heads, head_dim] in place by
/// pos[r] · inv_freq[k]; inverse = rotate by the conjugate. rope_dim even, 0 < rope_dim <=
/// head_dim.
DSV41RT_API void apply_rope(float* x, int64_t rows, int64_t heads, int64_t head_dim,
                            int64_t rope_dim, const int64_t* positions, const float* inv_freq,
                            bool inverse);

}  // namespace dsv41rt::kernels::cpu
