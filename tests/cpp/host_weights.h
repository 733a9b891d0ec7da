// A weight matrix in a stored format held on the host (codes + scales), for the kernel tests that
// call GEMM kernels directly: its WeightView over host or device copies of the bytes.
#pragma once

#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "kernels/weight_view.h"

namespace dsv41rt::testing {

struct HostWeights {
  kernels::WeightFormat format = kernels::WeightFormat::kBF16;
  int64_t rows = 0, cols = 0;
  int32_t br = 0, bc = 0;  ///< FP8 scale blocks
  std::vector<uint8_t> data, scale;
  kernels::WeightView view(const void* d, const uint8_t* s) const {
    kernels::WeightView v;
    v.data = d, v.scale = s, v.format = format, v.block_rows = br, v.block_cols = bc;
    v.rows = rows, v.cols = cols;
    return v;
  }
  kernels::WeightView host() const {
    return view(data.data(), scale.empty() ? nullptr : scale.data());
  }
};

/// Random weights of format `f` from the test's RandomInputs `rng`: BF16 values N(0, 0.05^2); FP8
/// E4M3 or MXFP4 codes uniform over all bytes but the FP8 NaN codes, with UE8M0 scales drawn from
/// [e_lo, e_hi] (2^-10 .. 2^-4 by default: products stay in the normal range); `br` x `bc` the
/// FP8 scale blocks (ignored for the other formats).
template <class Rng>
HostWeights random_host_weights(Rng& rng, kernels::WeightFormat f, int64_t rows, int64_t cols,
                                int32_t br = 32, int32_t bc = 32, int e_lo = 117, int e_hi = 123) {
  using kernels::WeightFormat;
  HostWeights w;
  w.format = f, w.rows = rows, w.cols = cols;
  if (f == WeightFormat::kBF16) {
    for (const float v : rng.normal(rows * cols, 0.05)) {
      const uint16_t b = f32_to_bf16(v);
      w.data.push_back(uint8_t(b & 0xFF)), w.data.push_back(uint8_t(b >> 8));
    }
    return w;
  }
  if (f == WeightFormat::kFp8Block) w.br = br, w.bc = bc;
  w.data = rng.random_bytes(f == WeightFormat::kFp8Block ? rows * cols : rows * cols / 2);
  if (f == WeightFormat::kFp8Block) {
    for (uint8_t& c : w.data) c = (c & 0x7F) == 0x7F ? uint8_t(c - 1) : c;  // no NaN codes
  }
  w.scale.resize(size_t(w.host().scale_bytes()));
  for (uint8_t& e : w.scale) e = uint8_t(rng.randint(e_lo, e_hi));
  return w;
}

/// Short name of a stored format, for test traces.
inline const char* format_name(kernels::WeightFormat f) {
  return f == kernels::WeightFormat::kBF16       ? "bf16"
         : f == kernels::WeightFormat::kFp8Block ? "fp8"
                                                 : "mxfp4";
}

}  // namespace dsv41rt::testing
