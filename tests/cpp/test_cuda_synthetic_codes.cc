// Synthetic weight codes on the device (kernels/cuda/synthetic_codes.cuh) == the CPU reference
// (kernels/cpu/synthetic_codes.cc, itself == numpy's bytes: test_synthetic_codes.cc), BITWISE.
// Built only in CUDA builds; skipped without a device unless DSV41RT_REQUIRE_CUDA=1.
#include <cuda_runtime_api.h>

#include "backend_test_util.h"
#include "kernels/cuda/synthetic_codes.cuh"
#include "kernels/synthetic_codes.h"
#include "synthetic_codes_cases.h"

namespace dsv41rt::testing {
namespace {

namespace kc = kernels::cuda;

class BackendCudaSyntheticCodes : public CudaKernelTest {
 protected:
  cudaStream_t stream() { return static_cast<cudaStream_t>(cuda().stream(0).handle); }
};

TEST_F(BackendCudaSyntheticCodes, ChunksEqualReference) {
  for (const SynthChunkCase& c : kSynthChunkCases) {
    SCOPED_TRACE(c.name + " chunk " + std::to_string(c.chunk));
    const kernels::Pcg64Start s = kernels::pcg64_seed(c.seed, synth_crc(c.name), c.chunk);
    const int64_t bytes = kernels::synth_code_bytes(c.kind, c.end - c.begin);
    std::vector<uint8_t> ref(static_cast<size_t>(bytes));
    kernels::cpu::synth_chunk_codes(c.kind, s, c.n, c.begin, c.end, ref.data());
    Buffer<uint8_t> out = poisoned<uint8_t>(cuda(), bytes);
    ASSERT_EQ(kc::synth_chunk_codes(c.kind, s, c.n, c.begin, c.end, out.get(), stream()),
              cudaSuccess);
    EXPECT_TRUE(bitwise_equal(out.download(), ref));
    EXPECT_EQ(synth_hash(ref), c.hash);
  }
}

TEST_F(BackendCudaSyntheticCodes, TensorSharesEqualReference) {
  for (const SynthTensorCase& c : kSynthTensorCases) {
    SCOPED_TRACE(c.name + " rows [" + std::to_string(c.row_begin) + ", " +
                 std::to_string(c.row_end) + ")");
    const int64_t bytes = kernels::synth_code_bytes(c.kind, (c.row_end - c.row_begin) * c.cols);
    Buffer<uint8_t> out = poisoned<uint8_t>(cuda(), bytes);
    ASSERT_EQ(kc::synth_tensor_codes(c.kind, c.seed, synth_crc(c.name), c.rows, c.cols, c.align,
                                     c.row_begin, c.row_end, out.get(), stream()),
              cudaSuccess);
    EXPECT_EQ(synth_hash(out.download()), c.hash);
  }
}

TEST_F(BackendCudaSyntheticCodes, BadRangesRefused) {
  const kernels::Pcg64Start s = kernels::pcg64_seed(0, 0, 0);
  Buffer<uint8_t> out = poisoned<uint8_t>(cuda(), 8);
  EXPECT_EQ(kc::synth_chunk_codes(SynthCodes::kFp8, s, 4, 2, 5, out.get(), stream()),
            cudaErrorInvalidValue);
  EXPECT_EQ(kc::synth_chunk_codes(SynthCodes::kFp4, s, 8, 1, 5, out.get(), stream()),
            cudaErrorInvalidValue);
}

}  // namespace
}  // namespace dsv41rt::testing
