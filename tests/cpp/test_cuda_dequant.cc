// The release-weight dequantisers the CUDA backend uses to put FP8 / FP4 checkpoint weights on
// the device as BF16 (kernels/cuda/quant.cuh dequant_fp8_blocks_bf16 / dequant_fp4_rows_bf16).
// No Backend op reaches them, so they are called directly; built only in CUDA builds
// (tests/cpp/CMakeLists.txt), skipped without a device unless DSV41RT_REQUIRE_CUDA=1.
//
// Reference: kernels::cpu::dequant_fp8_blocks / dequant_fp4_rows rounded to BF16 (core/dtype.h
// f32_to_bf16, nearest even). Bound: BITWISE for every code with finite scales (quant.cuh: exact
// in FP32's normal range, nearest rounding below 2^-126); with NaN codes or the NaN scale 255, the
// same elements are NaN and all others bitwise equal (NaN payloads may differ).
#include <cuda_runtime_api.h>

#include "backend_test_util.h"
#include "core/dtype.h"
#include "core/status.h"
#include "kernels/cuda/quant.cuh"
#include "kernels/quant.h"

namespace dsv41rt::testing {
namespace {

namespace kc = kernels::cuda;

bool bf16_is_nan(uint16_t b) { return (b & 0x7F80) == 0x7F80 && (b & 0x7F) != 0; }

// BF16 codes equal, or both NaN.
::testing::AssertionResult bf16_equal(const std::vector<uint16_t>& got,
                                      const std::vector<uint16_t>& want) {
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
    if (got[i] != want[i] && !(bf16_is_nan(got[i]) && bf16_is_nan(want[i]))) {
      return ::testing::AssertionFailure()
             << "element " << i << ": got 0x" << std::hex << got[i] << ", want 0x" << want[i];
    }
  }
  if (got.size() != want.size()) return ::testing::AssertionFailure() << "sizes differ";
  return ::testing::AssertionSuccess();
}

std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> out;
  for (const float x : v) out.push_back(f32_to_bf16(x));
  return out;
}

class BackendCudaDequant : public CudaKernelTest {};

TEST_F(BackendCudaDequant, Fp8BlocksToBf16) {
  struct Case {
    int64_t rows, cols, br, bc;
  };
  // Partial edge blocks, and the release's 128 x 128 blocks.
  for (const Case c :
       {Case{1, 1, 1, 1}, Case{7, 5, 2, 3}, Case{300, 200, 128, 128}, Case{256, 384, 128, 128}}) {
    SCOPED_TRACE(std::to_string(c.rows) + "x" + std::to_string(c.cols) + " blocks " +
                 std::to_string(c.br) + "x" + std::to_string(c.bc));
    const int64_t srows = (c.rows + c.br - 1) / c.br, scols = (c.cols + c.bc - 1) / c.bc;
    for (const bool realistic : {false, true}) {
      // Every code and scale (0 = 2^-127, 255 = NaN), or no NaN code and scales 2^-27..2^13.
      std::vector<uint8_t> codes = random_bytes(c.rows * c.cols),
                           scales = random_bytes(srows * scols);
      if (realistic) {
        for (uint8_t& v : codes) v = (v & 0x7F) == 0x7F ? uint8_t(v - 1) : v;
        for (uint8_t& v : scales) v = uint8_t(100 + v % 41);
      } else {
        scales.front() = 0, scales.back() = 255;
      }
      std::vector<float> ref(static_cast<size_t>(c.rows * c.cols));
      kernels::cpu::dequant_fp8_blocks(codes.data(), scales.data(), c.rows, c.cols, c.br, c.bc,
                                       ref.data());
      Buffer<uint8_t> dc = upload(cuda(), codes), ds = upload(cuda(), scales);
      Buffer<uint16_t> out = poisoned<uint16_t>(cuda(), c.rows * c.cols);
      ASSERT_EQ(
          kc::dequant_fp8_blocks_bf16(dc.get(), ds.get(), c.rows, c.cols, c.br, c.bc, out.get(),
                                      static_cast<cudaStream_t>(cuda().stream(0).handle)),
          cudaSuccess);
      const std::vector<uint16_t> got = out.download();
      if (realistic) {
        EXPECT_TRUE(bitwise_equal(got, to_bf16(ref))) << "realistic codes and scales";
      } else {
        EXPECT_TRUE(bf16_equal(got, to_bf16(ref))) << "every code and scale";
      }
    }
  }
}

TEST_F(BackendCudaDequant, Fp4RowsToBf16) {
  struct Case {
    int64_t rows, cols;
  };
  // cols 70: a partial last scale group; 4096: a release expert row.
  for (const Case c : {Case{1, 2}, Case{5, 70}, Case{64, 256}, Case{3, 4096}}) {
    SCOPED_TRACE(std::to_string(c.rows) + "x" + std::to_string(c.cols));
    const int64_t scols = (c.cols + 31) / 32;
    for (const bool nan_scales : {true, false}) {
      const std::vector<uint8_t> packed = random_bytes(c.rows * c.cols / 2);
      std::vector<uint8_t> scales = random_bytes(c.rows * scols);
      if (!nan_scales) {
        for (uint8_t& v : scales) v = v == 255 ? 254 : v;
      }
      std::vector<float> ref(static_cast<size_t>(c.rows * c.cols));
      kernels::cpu::dequant_fp4_rows(packed.data(), scales.data(), c.rows, c.cols, ref.data());
      Buffer<uint8_t> dp = upload(cuda(), packed), ds = upload(cuda(), scales);
      Buffer<uint16_t> out = poisoned<uint16_t>(cuda(), c.rows * c.cols);
      ASSERT_EQ(kc::dequant_fp4_rows_bf16(dp.get(), ds.get(), c.rows, c.cols, out.get(),
                                          static_cast<cudaStream_t>(cuda().stream(0).handle)),
                cudaSuccess);
      const std::vector<uint16_t> got = out.download();
      if (nan_scales) {
        EXPECT_TRUE(bf16_equal(got, to_bf16(ref))) << "every scale code";
      } else {
        EXPECT_TRUE(bitwise_equal(got, to_bf16(ref))) << "finite scales";
      }
    }
  }
}

TEST_F(BackendCudaDequant, RejectsBadShapes) {
  Buffer<uint8_t> bytes = upload(cuda(), random_bytes(64));
  Buffer<uint16_t> out = poisoned<uint16_t>(cuda(), 64);
  const auto s = static_cast<cudaStream_t>(cuda().stream(0).handle);
  EXPECT_EQ(kc::dequant_fp8_blocks_bf16(bytes.get(), bytes.get(), 4, 4, /*block_rows=*/0, 4,
                                        out.get(), s),
            cudaErrorInvalidValue);
  EXPECT_EQ(kc::dequant_fp4_rows_bf16(bytes.get(), bytes.get(), 2, /*cols=*/7, out.get(), s),
            cudaErrorInvalidValue);
  // The CPU references reject the same shapes.
  std::vector<float> host(64);
  EXPECT_THROW(kernels::cpu::dequant_fp8_blocks(random_bytes(16).data(), random_bytes(4).data(), 4,
                                                4, 0, 4, host.data()),
               Error);
  EXPECT_THROW(kernels::cpu::dequant_fp4_rows(random_bytes(8).data(), random_bytes(2).data(), 2, 7,
                                              host.data()),
               Error);
}

}  // namespace
}  // namespace dsv41rt::testing
