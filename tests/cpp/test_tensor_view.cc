#include <gtest/gtest.h>

#include "core/tensor_view.h"

namespace dsv41rt {
namespace {

TEST(TensorView, ContiguousDefaults) {
  float buf[24];
  TensorView v(buf, DType::kF32, {2, 3, 4});
  EXPECT_EQ(v.strides, (std::vector<int64_t>{12, 4, 1}));
  EXPECT_EQ(v.numel(), 24);
  EXPECT_EQ(v.nbytes(), 96);
  EXPECT_TRUE(v.is_contiguous());
  EXPECT_EQ(v.describe(), "f32[2, 3, 4] cpu contiguous");
}

TEST(TensorView, StridedAndPacked) {
  TensorView v(nullptr, DType::kBF16, {2, 3}, Device{DeviceType::kCuda, 1});
  v.strides = {1, 2};
  EXPECT_FALSE(v.is_contiguous());
  EXPECT_EQ(v.describe(), "bf16[2, 3] strides=[1, 2] cuda:1");
  TensorView p(nullptr, DType::kFP4E2M1, {3, 5});
  EXPECT_EQ(p.nbytes(), 8);  // 15 nibbles round up
  TensorView scalar(nullptr, DType::kI64, {});
  EXPECT_EQ(scalar.numel(), 1);
  EXPECT_TRUE(scalar.is_contiguous());
  TensorView ones(nullptr, DType::kU8, {1, 4});
  ones.strides = {99, 1};  // stride of a size-1 dim is irrelevant
  EXPECT_TRUE(ones.is_contiguous());
}

}  // namespace
}  // namespace dsv41rt
