// The A8 decode GEMM (kernels/cuda/decode_gemv_a8.cuh): FP8 1x32 activations times FP8 block
// weights, promoted to FP32 per 32-column block. Built only in CUDA builds; skipped without a
// device unless DSV41RT_REQUIRE_CUDA=1.
//
// quantize_act_fp8: bitwise kernels::cpu::fp8_window_pack (the CPU codec) of the BF16-rounded
// activations, specials included.
// decode_gemv_a8, reference (host, FP64, exact): P_b = sum over the block of qx * qw (E4M3 values;
// every product and the 32-term sum are exact in FP64), y = y0 + sum_b P_b * sx * sw. Bound:
//   |y - ref| <= sum_b s_b * eps_tc * sum_{c in b} |qx qw|  +  2 gamma_{nb + S + 2} * M
// where M = |y0| + sum_b |P_b| s_b, nb the blocks, S the splits: the first term is the tensor
// core's FP8 block sum (its internal accumulation keeps fewer bits than FP32; eps_tc = 2^-10 is an
// upper bound we state, and the test prints the largest ratio it saw), the second the FP32
// promoted sum and the split reduce (factor 2: accumulators may truncate).
// Also: NaN scales propagate, determinism (eager twice, graph replay), a token at m = 1 is bitwise
// itself inside m = 64, and cudaErrorInvalidValue for unsupported inputs.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <functional>

#include "backend_test_util.h"
#include "core/dtype.h"
#include "host_weights.h"
#include "kernels/cuda/decode_gemv_a8.cuh"
#include "kernels/linear.h"
#include "kernels/quant.h"
#include "kernels/weight_view.h"

namespace dsv41rt::testing {
namespace {

namespace kc = kernels::cuda;
using kernels::WeightFormat;
using kernels::WeightView;

constexpr double kEpsTc = 0x1p-10;

// Every test runs on both tensor-core paths (kc::A8Path).
class BackendCudaDecodeGemvA8 : public CudaKernelTest,
                                public ::testing::WithParamInterface<kc::A8Path> {
 protected:
  cudaStream_t stream() { return static_cast<cudaStream_t>(cuda().stream(0).handle); }

  HostWeights make_weights(int64_t rows, int64_t cols, int32_t br, int32_t bc) {
    return random_host_weights(static_cast<RandomInputs&>(*this), WeightFormat::kFp8Block, rows,
                               cols, br, bc);
  }

  // Packed activation rows of the CPU codec, stride ldq.
  static std::vector<uint8_t> pack_host(const std::vector<float>& x, int64_t m, int64_t k,
                                        int64_t ldq) {
    const int64_t rb = kc::act_fp8_row_bytes(k);
    std::vector<uint8_t> dense(size_t(m * rb)), out(size_t(m * ldq), 0);
    std::vector<float> xb = x;  // the quantiser's BF16 rounding first
    kernels::cpu::round_to_bf16(xb.data(), m * k);
    kernels::cpu::fp8_window_pack(xb.data(), m, k, dense.data());
    for (int64_t i = 0; i < m; ++i) std::copy_n(dense.data() + i * rb, rb, out.data() + i * ldq);
    return out;
  }

  static int64_t ldq_of(int64_t k) { return (kc::act_fp8_row_bytes(k) + 15) / 16 * 16; }

  std::vector<float> run(const HostWeights& hw, int64_t m, int64_t n,
                         const std::vector<uint8_t>& xq, const std::vector<float>& y0,
                         bool accumulate, bool graph = false) {
    const int64_t k = hw.cols;
    Buffer<uint8_t> dq = upload(cuda(), xq);
    Buffer<uint8_t> dw = upload(cuda(), hw.data), ds = upload(cuda(), hw.scale);
    Buffer<float> dy = accumulate ? upload(cuda(), y0) : poisoned<float>(cuda(), m * n);
    kc::DecodeGemvA8 g;
    g.xq = dq.get(), g.ldq = ldq_of(k), g.w = hw.view(dw.get(), ds.get());
    g.y = dy.get(), g.ldy = n, g.m = m, g.n = n, g.k = k, g.accumulate = accumulate;
    g.path = GetParam();
    EXPECT_TRUE(kc::decode_gemv_a8_supported(g));
    const int64_t wsf = kc::decode_gemv_a8_workspace_floats(g);
    Buffer<float> ws = poisoned<float>(cuda(), wsf > 0 ? wsf : 1);
    cudaError_t e = cudaSuccess;
    if (graph) {
      auto gr = cuda().capture(
          cuda().stream(0), [&] { e = kc::decode_gemv_a8(g, ws.get(), wsf, stream()); }, nullptr);
      cuda().replay(*gr, cuda().stream(0));
    } else {
      e = kc::decode_gemv_a8(g, ws.get(), wsf, stream());
    }
    EXPECT_EQ(e, cudaSuccess);
    return dy.download();
  }

  // Checks y against the exact reference; returns the largest |error| / (block-sum bound) seen.
  double check(const HostWeights& hw, int64_t m, int64_t n, const std::vector<uint8_t>& xq,
               const std::vector<float>& y0, bool accumulate, const std::vector<float>& y,
               int64_t splits) {
    EXPECT_TRUE(all_written(y));
    const int64_t k = hw.cols, nb = k / 32, ldq = ldq_of(k);
    const WeightView w = hw.host();
    std::vector<float> got;
    std::vector<double> want, tol;
    double worst_tc = 0;
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t i = 0; i < m; ++i) {
        const uint8_t* row = xq.data() + i * ldq;
        double sum = accumulate ? y0[i * n + j] : 0.0, mag = std::abs(sum), tc = 0;
        for (int64_t b = 0; b < nb; ++b) {
          double p = 0, pabs = 0;
          for (int64_t c = b * 32; c < b * 32 + 32; ++c) {
            const double t = double(fp8_e4m3_to_f32(row[c])) * fp8_e4m3_to_f32(hw.data[j * k + c]);
            p += t, pabs += std::abs(t);
          }
          const double s =
              double(e8m0_to_f32(row[k + b])) *
              e8m0_to_f32(w.scale[(j / w.block_rows) * w.scale_cols() + b * 32 / w.block_cols]);
          sum += p * s, mag += std::abs(p) * s, tc += kEpsTc * pabs * s;
        }
        got.push_back(y[i * n + j]), want.push_back(sum);
        tol.push_back(tc + 2 * gamma_n(nb + splits + 2) * mag);
        const double fp32_part = 2 * gamma_n(nb + splits + 2) * mag;
        const double err = std::abs(double(y[i * n + j]) - sum);
        if (tc > 0) worst_tc = std::max(worst_tc, std::max(0.0, err - fp32_part) / tc * kEpsTc);
      }
    }
    EXPECT_TRUE(within(got, want, tol));
    return worst_tc;
  }

  void run_and_check(int64_t m, int64_t n, int64_t k, int32_t br, int32_t bc, bool accumulate) {
    SCOPED_TRACE("m " + std::to_string(m) + " n " + std::to_string(n) + " k " + std::to_string(k) +
                 " blocks " + std::to_string(br) + "x" + std::to_string(bc));
    const HostWeights hw = make_weights(n, k, br, bc);
    const std::vector<float> x = normal(m * k), y0 = normal(m * n);
    const std::vector<uint8_t> xq = pack_host(x, m, k, ldq_of(k));
    const std::vector<float> y = run(hw, m, n, xq, y0, accumulate);
    kc::DecodeGemvA8 probe;
    probe.n = n, probe.k = k, probe.path = GetParam();
    const double worst = check(hw, m, n, xq, y0, accumulate, y, kc::decode_gemv_a8_splits(probe));
    std::printf("  m %lld n %lld k %lld: largest tensor-core block-sum error %.3g x sum|qx qw|\n",
                (long long)m, (long long)n, (long long)k, worst);
  }
};

TEST_P(BackendCudaDecodeGemvA8, QuantizeIsTheCpuCodecBitwise) {
  for (const auto& [m, k] :
       std::vector<std::pair<int64_t, int64_t>>{{1, 32}, {3, 1280}, {64, 5120}}) {
    std::vector<float> x = normal(m * k, 3.0);
    if (k >= 1280) {  // specials: an all-zero block, tiny values, inf, NaN, a huge value
      std::fill_n(x.begin() + 64, 32, 0.f);
      std::fill_n(x.begin() + 96, 32, 1e-7f);
      x[130] = std::numeric_limits<float>::infinity();
      x[170] = std::numeric_limits<float>::quiet_NaN();
      x[200] = 3e38f;
      x[230] = -0.f;
    }
    const int64_t ldq = ldq_of(k);
    Buffer<float> dx = upload(cuda(), x);
    Buffer<uint8_t> dq = poisoned<uint8_t>(cuda(), m * ldq, 0x5A);
    ASSERT_EQ(kc::quantize_act_fp8(dx.get(), m, k, k, dq.get(), ldq, stream()), cudaSuccess);
    const std::vector<uint8_t> got = dq.download(), want = pack_host(x, m, k, ldq);
    for (int64_t i = 0; i < m; ++i) {
      const std::vector<uint8_t> g(got.begin() + i * ldq,
                                   got.begin() + i * ldq + kc::act_fp8_row_bytes(k));
      const std::vector<uint8_t> w(want.begin() + i * ldq,
                                   want.begin() + i * ldq + kc::act_fp8_row_bytes(k));
      ASSERT_TRUE(bitwise_equal(g, w)) << "row " << i << " of m " << m << ", k " << k;
    }
  }
}

TEST_P(BackendCudaDecodeGemvA8, MatchesTheExactBlockSums) {
  // bench-40's FP8 shapes (wq_a, wo_b-like k, wq_b-like k), m from 1 to 64, both block sizes.
  for (const int64_t m : {1, 2, 9, 20, 33, 64}) run_and_check(m, 300, 1280, 32, 32, m == 9);
  run_and_check(1, 1280, 5120, 32, 32, false);
  run_and_check(5, 512, 8192, 32, 32, true);
  run_and_check(64, 256, 1280, 128, 128, false);
  run_and_check(7, 100, 256, 16, 64, false);
  // Many stages per split (the wgmma path's shared-memory ring wraps): wq_b's shape, and more.
  run_and_check(1, 32768, 1280, 32, 32, false);
  run_and_check(3, 16384, 2048, 128, 128, true);
}

TEST_P(BackendCudaDecodeGemvA8, NanScalesPropagate) {
  HostWeights hw = make_weights(64, 256, 32, 32);
  hw.scale[8] = 255;  // weight block (1, 0): rows 32..63, columns 0..31
  std::vector<float> x = normal(2 * 256);
  x[256 + 40] = std::numeric_limits<float>::quiet_NaN();  // token 1, block 1 -> scale NaN
  const std::vector<uint8_t> xq = pack_host(x, 2, 256, ldq_of(256));
  const std::vector<float> y = run(hw, 2, 64, xq, {}, false);
  for (int64_t j = 0; j < 64; ++j) {
    EXPECT_EQ(std::isnan(y[j]), j >= 32) << "token 0, row " << j;
    EXPECT_TRUE(std::isnan(y[64 + j])) << "token 1, row " << j;
  }
}

TEST_P(BackendCudaDecodeGemvA8, DeterministicAndIndependentOfM) {
  const HostWeights hw = make_weights(1280, 5120, 32, 32);
  kc::DecodeGemvA8 probe;
  probe.n = 1280, probe.k = 5120, probe.path = GetParam();
  ASSERT_GT(kc::decode_gemv_a8_splits(probe), 1) << "the split-K reduce must be exercised";
  const std::vector<float> x = normal(64 * 5120);
  const std::vector<uint8_t> xq = pack_host(x, 64, 5120, ldq_of(5120));
  const std::vector<float> a = run(hw, 64, 1280, xq, {}, false),
                           b = run(hw, 64, 1280, xq, {}, false);
  const std::vector<float> c = run(hw, 64, 1280, xq, {}, false, /*graph=*/true);
  EXPECT_TRUE(bitwise_equal(a, b)) << "eager runs";
  EXPECT_TRUE(bitwise_equal(a, c)) << "graph replay";
  const int64_t ldq = ldq_of(5120);
  const std::vector<uint8_t> one(xq.begin() + 5 * ldq, xq.begin() + 6 * ldq);  // token 5
  const std::vector<float> y1 = run(hw, 1, 1280, one, {}, false);
  EXPECT_TRUE(bitwise_equal(y1, std::vector<float>(a.begin() + 5 * 1280, a.begin() + 6 * 1280)))
      << "token 5 alone vs in a batch of 64";
}

TEST_P(BackendCudaDecodeGemvA8, RejectsUnsupported) {
  const HostWeights hw = make_weights(64, 256, 32, 32);
  Buffer<uint8_t> q = poisoned<uint8_t>(cuda(), 2 * ldq_of(256));
  Buffer<uint8_t> w = upload(cuda(), hw.data), sc = upload(cuda(), hw.scale);
  Buffer<float> y = poisoned<float>(cuda(), 2 * 64), ws = poisoned<float>(cuda(), 1);
  kc::DecodeGemvA8 ok;
  ok.xq = q.get(), ok.ldq = ldq_of(256), ok.w = hw.view(w.get(), sc.get());
  ok.y = y.get(), ok.ldy = 64, ok.m = 2, ok.n = 64, ok.k = 256, ok.path = GetParam();
  ASSERT_TRUE(kc::decode_gemv_a8_supported(ok));
  std::vector<std::pair<std::string, kc::DecodeGemvA8>> bad;
  auto add = [&](const std::string& what, const std::function<void(kc::DecodeGemvA8&)>& edit) {
    kc::DecodeGemvA8 g = ok;
    edit(g);
    bad.emplace_back(what, g);
  };
  add("m = 0", [](kc::DecodeGemvA8& g) { g.m = 0; });
  add("m = 65", [](kc::DecodeGemvA8& g) { g.m = 65; });
  add("k % 128 != 0", [](kc::DecodeGemvA8& g) { g.k = 160, g.w.cols = 160; });
  add("w.cols != k", [](kc::DecodeGemvA8& g) { g.k = 128; });
  add("ldq too small", [](kc::DecodeGemvA8& g) { g.ldq = 256; });
  add("rows beyond w", [](kc::DecodeGemvA8& g) { g.n = 65; });
  add("bf16 weights", [](kc::DecodeGemvA8& g) { g.w.format = WeightFormat::kBF16; });
  add("block_cols 16", [](kc::DecodeGemvA8& g) { g.w.block_cols = 16; });
  add("block_rows 8", [](kc::DecodeGemvA8& g) { g.w.block_rows = 8; });
  add("no scales", [](kc::DecodeGemvA8& g) { g.w.scale = nullptr; });
  add("unknown path", [](kc::DecodeGemvA8& g) { g.path = static_cast<kc::A8Path>(7); });
  if (GetParam() == kc::A8Path::kWgmma) {  // its scale codes of a split live in shared memory
    add("k > 16384", [](kc::DecodeGemvA8& g) {
      g.k = 16384 + 128, g.w.cols = g.k, g.ldq = ldq_of(g.k);  // only k is wrong
    });
  }
  for (const auto& [what, g] : bad) {
    EXPECT_FALSE(kc::decode_gemv_a8_supported(g)) << what;
    EXPECT_EQ(kc::decode_gemv_a8(g, ws.get(), 1, stream()), cudaErrorInvalidValue) << what;
  }
  EXPECT_EQ(kc::quantize_act_fp8(nullptr, 1, 48, 48, q.get(), 64, stream()), cudaErrorInvalidValue)
      << "k % 32 != 0";
  const std::vector<float> after = y.download();
  for (const float v : after) ASSERT_EQ(bits_of(v), 0xFFFFFFFFu) << "nothing was launched";
}

INSTANTIATE_TEST_SUITE_P(Paths, BackendCudaDecodeGemvA8,
                         ::testing::Values(kc::A8Path::kWgmma, kc::A8Path::kMmaSync),
                         [](const ::testing::TestParamInfo<kc::A8Path>& info) {
                           return info.param == kc::A8Path::kWgmma ? "wgmma" : "mma_sync";
                         });

}  // namespace
}  // namespace dsv41rt::testing
