// A weight matrix in a stored format held on the host (codes + scales), for the kernel tests that
// call GEMM kernels directly: its WeightView over host or device copies of the bytes.
#pragma once

#include <cstdint>
#include <vector>

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

/// Short name of a stored format, for test traces.
inline const char* format_name(kernels::WeightFormat f) {
  return f == kernels::WeightFormat::kBF16       ? "bf16"
         : f == kernels::WeightFormat::kFp8Block ? "fp8"
                                                 : "mxfp4";
}

}  // namespace dsv41rt::testing
