// The CUDA quantisers (kernels/cuda/quant.cuh) called directly against the CPU reference
// (kernels/cpu/quant.cc): every format's QDQ over blocks built to reach each path of the codec —
// amax exactly at and just above a scale step, ties of the element rounding, values clamped at the
// format's largest code, zero / -0 / subnormal / floor-sized blocks, inf and NaN blocks,
// magnitudes from 2^-40 to near FLT_MAX — equal bitwise but for NaN payloads (same NaN places).
// This pins the device's quotient by a power-of-two scale (the product with its exact reciprocal,
// quant_device.cuh div_pow2_like_host) and its one-reduction amax to the reference's IEEE
// division and NaN-aware max. Also fp8_act_qdq_bf16 (precision fp8's activation staging for the
// wgmma GEMM): bitwise rows_to_bf16(fp8_act_qdq(x)), with pitches wider than the rows, k not a
// multiple of a warp's 128 columns, the padding keeping its poison, and its rejections. Built only
// in CUDA builds; skipped without a device unless DSV41RT_REQUIRE_CUDA=1.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include "backend_test_util.h"
#include "core/dtype.h"
#include "kernels/cuda/gemm_wgmma.cuh"
#include "kernels/cuda/quant.cuh"
#include "kernels/quant.h"

namespace dsv41rt::testing {
namespace {

namespace kc = kernels::cuda;
namespace kcpu = kernels::cpu;

using DeviceQdq = std::function<cudaError_t(const float*, int64_t, int64_t, float*, cudaStream_t)>;
using HostQdq = std::function<void(const float*, int64_t, int64_t, float*)>;

struct Codec {
  std::string name;
  int64_t block, dim;
  float largest;  // the format's largest element magnitude (the clamp)
  DeviceQdq device;
  HostQdq host;
};

class BackendCudaQdq : public CudaKernelTest {
 protected:
  cudaStream_t stream() { return static_cast<cudaStream_t>(cuda().stream(0).handle); }

  float pow2(int e) { return std::ldexp(1.0f, e); }
  float sign() { return randint(0, 1) ? -1.0f : 1.0f; }

  // One block of n values of a randomly chosen kind (see the file comment).
  void fill_block(float* b, int64_t n, float largest) {
    const int kind = int(randint(0, 10));
    const std::vector<float> z = normal(n);
    const int e = int(randint(-40, 40));
    for (int64_t i = 0; i < n; ++i) b[i] = z[size_t(i)] * pow2(e);
    const int64_t j = randint(0, n - 1);
    switch (kind) {
      case 0:  // plain normal values
        break;
      case 1:  // zeros of both signs, one small value
        for (int64_t i = 0; i < n; ++i) b[i] = randint(0, 1) ? -0.0f : 0.0f;
        b[j] = z[0] * 1e-3f;
        break;
      case 2:  // subnormals
        for (int64_t i = 0; i < n; ++i) {
          b[i] = sign() * f32_from_bits(uint32_t(randint(1, 0x7FFFFF)));
        }
        break;
      case 3:  // an infinity among normal values
        b[j] = sign() * std::numeric_limits<float>::infinity();
        break;
      case 4:  // a NaN (random payload and sign) among normal values
        b[j] = f32_from_bits(uint32_t(randint(0, 1)) << 31 | 0x7F800000u |
                             uint32_t(randint(1, 0x7FFFFF)));
        break;
      case 5:  // few significant bits: element roundings land on ties
        for (int64_t i = 0; i < n; ++i) {
          b[i] = sign() * (1.0f + float(randint(0, 31)) / 32.0f) * pow2(int(randint(-8, 2)) + e);
        }
        break;
      case 6:  // amax exactly the largest code times a power of two (no scale step)
        b[j] = sign() * largest * pow2(e);
        break;
      case 7:  // amax just above it (the scale doubles)
        b[j] = sign() * std::nextafter(largest * pow2(e), INFINITY);
        break;
      case 8:  // near FLT_MAX
        for (int64_t i = 0; i < n; ++i) b[i] = sign() * FLT_MAX * pow2(-int(randint(0, 3)));
        break;
      case 9:  // below the amax floors (1e-4, 6 * 2^-9)
        for (int64_t i = 0; i < n; ++i) b[i] = z[size_t(i)] * 1e-6f;
        break;
      default:  // equal magnitudes of both signs
        for (int64_t i = 0; i < n; ++i) b[i] = sign() * pow2(e);
        break;
    }
  }

  // The codec's kernel on `x` (rows of c.dim) into a poisoned output, and in place when asked
  // (the contract allows it): the reference's values, NaN for NaN.
  void expect_matches_reference(const Codec& c, const std::vector<float>& x, bool also_in_place) {
    const int64_t rows = int64_t(x.size()) / c.dim;
    std::vector<float> want(x.size());
    c.host(x.data(), rows, c.dim, want.data());
    Buffer<float> dx = upload(cuda(), x);
    Buffer<float> dy = poisoned<float>(cuda(), int64_t(x.size()));
    ASSERT_EQ(c.device(dx.get(), rows, c.dim, dy.get(), stream()), cudaSuccess);
    EXPECT_TRUE(nan_aware_equal(dy.download(), want));
    if (!also_in_place) return;
    ASSERT_EQ(c.device(dx.get(), rows, c.dim, dx.get(), stream()), cudaSuccess);
    EXPECT_TRUE(nan_aware_equal(dx.download(), want)) << "in place";
  }

  std::vector<float> inputs(int64_t rows, int64_t dim, int64_t block, float largest) {
    std::vector<float> x(size_t(rows * dim));
    for (int64_t b = 0; b < rows * dim / block; ++b)
      fill_block(&x[size_t(b * block)], block, largest);
    return x;
  }
};

std::vector<Codec> codecs() {
  return {
      {"fp8_window", 32, 512, 448.0f, kc::fp8_window_qdq, kcpu::fp8_window_qdq},
      {"fp8_act", 32, 4096, 448.0f, kc::fp8_act_qdq, kcpu::fp8_act_qdq},
      {"nvfp4", 16, 512, 6.0f, kc::nvfp4_qdq, kcpu::nvfp4_qdq},
      {"mxfp4", 32, 128, 6.0f, kc::mxfp4_qdq, kcpu::mxfp4_qdq},
      {"v4_row", 64, 512, 448.0f, kc::v4_row_qdq, kcpu::v4_row_qdq},
  };
}

TEST_F(BackendCudaQdq, EveryCodecMatchesTheReferenceOnHardBlocks) {
  for (const Codec& c : codecs()) {
    SCOPED_TRACE(c.name);
    const int64_t rows = 300;
    const std::vector<float> x = inputs(rows, c.dim, c.block, c.largest);
    expect_matches_reference(c, x, /*also_in_place=*/true);
  }
}

// Every power-of-two scale the fp8 and mxfp4 codecs can take (2^-22 .. 2^126 and the edges), with
// values whose quotients cover the element codes, their ties and the clamp: the reciprocal product
// against the reference's division.
TEST_F(BackendCudaQdq, EveryPowerOfTwoScaleDividesLikeTheReference) {
  for (const Codec& c : codecs()) {
    if (c.name != "fp8_window" && c.name != "mxfp4") continue;
    SCOPED_TRACE(c.name);
    std::vector<float> x;
    for (int e = -150; e <= 127; ++e) {
      for (int64_t b = 0; b < 4; ++b) {
        const int64_t at = int64_t(x.size());
        x.resize(size_t(at + c.block));
        const std::vector<float> z = normal(c.block);
        for (int64_t i = 0; i < c.block; ++i) {
          const float q = b < 2 ? float(randint(0, 1 << 12)) / 256.0f : z[size_t(i)];
          x[size_t(at + i)] = sign() * q * c.largest / 16.0f * std::ldexp(1.0f, std::min(e, 110));
        }
        x[size_t(at + randint(0, c.block - 1))] = sign() * c.largest * std::ldexp(1.0f, e);
      }
    }
    for (float& v : x) v = std::isfinite(v) ? v : FLT_MAX;
    const int64_t rows = int64_t(x.size()) / c.dim;
    x.resize(size_t(rows * c.dim));
    expect_matches_reference(c, x, /*also_in_place=*/false);
  }
}

TEST_F(BackendCudaQdq, ActivationStagingIsTheTwoPassesBitwise) {
  struct Case {
    int64_t rows, k, ldx, ldy;
  };
  for (const Case& cs : std::vector<Case>{{1, 32, 32, 32},
                                          {7, 96, 100, 104},
                                          {33, 160, 160, 168},
                                          {300, 4096, 4096, 4096},
                                          {65, 5120, 5124, 5128}}) {
    SCOPED_TRACE("rows " + std::to_string(cs.rows) + " k " + std::to_string(cs.k));
    std::vector<float> x(size_t(cs.rows * cs.ldx));
    for (int64_t r = 0; r < cs.rows; ++r) {
      std::vector<float> row = inputs(1, cs.k, 32, 448.0f);
      std::copy(row.begin(), row.end(), x.begin() + r * cs.ldx);
    }
    Buffer<float> dx = upload(cuda(), x);
    Buffer<uint16_t> fused = poisoned<uint16_t>(cuda(), cs.rows * cs.ldy);
    ASSERT_TRUE(kc::fp8_act_qdq_bf16_supported(dx.get(), cs.ldx, cs.k, fused.get(), cs.ldy));
    ASSERT_EQ(kc::fp8_act_qdq_bf16(dx.get(), cs.ldx, cs.rows, cs.k, fused.get(), cs.ldy, stream()),
              cudaSuccess);
    // The two passes: fp8_act_qdq over the rows (contiguous copy), then rows_to_bf16.
    std::vector<float> dense(size_t(cs.rows * cs.k));
    for (int64_t r = 0; r < cs.rows; ++r) {
      std::copy_n(x.begin() + r * cs.ldx, cs.k, dense.begin() + r * cs.k);
    }
    Buffer<float> dd = upload(cuda(), dense);
    ASSERT_EQ(kc::fp8_act_qdq(dd.get(), cs.rows, cs.k, dd.get(), stream()), cudaSuccess);
    Buffer<uint16_t> two = poisoned<uint16_t>(cuda(), cs.rows * cs.ldy);
    ASSERT_EQ(kc::rows_to_bf16(dd.get(), cs.k, cs.rows, cs.k, two.get(), cs.ldy, stream()),
              cudaSuccess);
    const std::vector<uint16_t> got = fused.download();
    EXPECT_TRUE(bitwise_equal(got, two.download()));
    // Against the reference too (finite values: BF16 of the CPU's QDQ), and the padding untouched.
    std::vector<float> want(dense.size());
    kcpu::fp8_act_qdq(dense.data(), cs.rows, cs.k, want.data());
    int64_t bad = 0;
    for (int64_t r = 0; r < cs.rows; ++r) {
      for (int64_t c = 0; c < cs.ldy; ++c) {
        const uint16_t g = got[size_t(r * cs.ldy + c)];
        if (c >= cs.k) {
          bad += g != uint16_t(kPoison | kPoison << 8);
          continue;
        }
        const float w = want[size_t(r * cs.k + c)];
        bad += std::isnan(w) ? !std::isnan(bf16_to_f32(g)) : g != f32_to_bf16(w);
      }
    }
    EXPECT_EQ(bad, 0);
  }
}

TEST_F(BackendCudaQdq, ActivationStagingRejectsWhatItCannotTake) {
  Buffer<float> x = poisoned<float>(cuda(), 4 * 128 + 4);
  Buffer<uint16_t> y = poisoned<uint16_t>(cuda(), 4 * 128 + 4);
  EXPECT_EQ(kc::fp8_act_qdq_bf16(x.get(), 48, 2, 48, y.get(), 48, stream()), cudaErrorInvalidValue)
      << "k % 32 != 0";
  EXPECT_EQ(kc::fp8_act_qdq_bf16(x.get(), 30, 2, 32, y.get(), 32, stream()), cudaErrorInvalidValue)
      << "ldx < k";
  EXPECT_EQ(kc::fp8_act_qdq_bf16(x.get(), 34, 2, 32, y.get(), 32, stream()), cudaErrorInvalidValue)
      << "ldx % 4 != 0";
  EXPECT_EQ(kc::fp8_act_qdq_bf16(x.get() + 1, 32, 2, 32, y.get(), 32, stream()),
            cudaErrorInvalidValue)
      << "x not 16-byte aligned";
  EXPECT_EQ(kc::fp8_act_qdq_bf16(x.get(), 32, 2, 32, y.get() + 1, 32, stream()),
            cudaErrorInvalidValue)
      << "y not 8-byte aligned";
  EXPECT_EQ(kc::fp8_act_qdq_bf16(x.get(), 32, -1, 32, y.get(), 32, stream()), cudaErrorInvalidValue)
      << "rows < 0";
  EXPECT_EQ(kc::fp8_act_qdq_bf16(x.get(), 32, 0, 32, y.get(), 32, stream()), cudaSuccess);
}

}  // namespace
}  // namespace dsv41rt::testing
