// kernels/weight_view.h: the fast exact decodes the GPU GEMMs stage weights with
// (fp8_scaled_value, fp4_scaled_value) against the reference decode WeightView::value(), bitwise,
// for every code and every scale code in their stated ranges (exhaustive: 254 x 240 FP8 and
// 16 x 249 FP4 pairs), and BF16-exact (the tensor-core path converts them to BF16 without loss).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>

#include "core/dtype.h"
#include "kernels/weight_view.h"

namespace dsv41rt::testing {
namespace {

using kernels::WeightFormat;
using kernels::WeightView;

// value() of a 1 x 2 matrix holding `code` (both columns) with scale code e.
float reference(WeightFormat f, uint8_t code, uint8_t e) {
  uint8_t data[2] = {code, code};
  if (f == WeightFormat::kMxfp4) data[0] = uint8_t(code | (code << 4));
  uint8_t scale = e;
  WeightView v;
  v.data = data, v.scale = &scale, v.format = f, v.rows = 1, v.cols = 2;
  v.block_rows = v.block_cols = 32;
  return v.value(0, 0);
}

bool same_bits(float a, float b) {
  return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b);
}

TEST(WeightView, FastFp8DecodeIsTheReferenceForEveryCodeAndScaleInRange) {
  int checked = 0;
  for (int e = kernels::kFp8FastScaleMin; e <= kernels::kFp8FastScaleMax; ++e) {
    for (int c = 0; c < 256; ++c) {
      if ((c & 0x7F) == 0x7F) continue;  // NaN codes: the general path
      const float want = reference(WeightFormat::kFp8Block, uint8_t(c), uint8_t(e));
      const float got = kernels::fp8_scaled_value(uint8_t(c), e);
      ASSERT_TRUE(same_bits(got, want))
          << "code " << c << " scale " << e << ": " << got << " vs " << want;
      if (std::isfinite(want)) {
        ASSERT_EQ(bf16_to_f32(f32_to_bf16(want)), want) << "code " << c << " scale " << e;
      }
      ++checked;
    }
  }
  EXPECT_EQ(checked, 254 * (kernels::kFp8FastScaleMax - kernels::kFp8FastScaleMin + 1));
}

TEST(WeightView, FastFp4DecodeIsTheReferenceForEveryCodeAndScaleInRange) {
  for (int e = kernels::kFp4FastScaleMin; e <= kernels::kFp4FastScaleMax; ++e) {
    for (int n = 0; n < 16; ++n) {
      const float want = reference(WeightFormat::kMxfp4, uint8_t(n), uint8_t(e));
      const float got = kernels::fp4_scaled_value(uint8_t(n), e);
      ASSERT_TRUE(same_bits(got, want)) << "nibble " << n << " scale " << e;
      ASSERT_EQ(bf16_to_f32(f32_to_bf16(want)), want) << "nibble " << n << " scale " << e;
    }
  }
  // Code 8 (-0) is +0, as the reference.
  EXPECT_TRUE(same_bits(kernels::fp4_scaled_value(8, 127), 0.0f));
}

}  // namespace
}  // namespace dsv41rt::testing
