// The skinny-M decode GEMM over released weight formats (kernels/cuda/decode_gemv.cuh), called
// directly: BF16, FP8 with 32 x 32 and 128 x 128 UE8M0 blocks (partial edge blocks included) and
// MXFP4. Built only in CUDA builds; skipped without a device unless DSV41RT_REQUIRE_CUDA=1.
//
// Reference (host, FP64): ref[i, j] = y0 + sum_c bf16(x[i, c]) * W.value(row_j, c), with
// WeightView::value() on the host copies (the exact decode) and bf16() the RNE rounding written
// out in backend_test_util.h. The products are exact in FP32, so the kernel's only error is FP32
// summation (any order, tensor-core accumulation, a split-K reduce on top):
//   |y - ref| <= 2 * gamma_{k+1} * (|y0| + sum_c |bf16(x[i, c]) * w|),  gamma_n = n u / (1 - n u),
// u = 2^-24; the factor 2 covers the split-K reduce and accumulators that truncate instead of
// rounding. Every output must be written (y starts as NaN poison unless accumulating). Scales
// are 2^-10..2^-4 (realistic), so every weight is a normal BF16 and the decode is exact.
// Also: determinism (bitwise equal eager, eager again, graph replay), independence of m (a token's
// result is bitwise the same at m = 1 and m = 64), batching over groups, large scales (the
// two-multiply path), and cudaErrorInvalidValue for unsupported inputs.
#include <cuda_runtime_api.h>

#include <functional>

#include "backend_test_util.h"
#include "core/dtype.h"
#include "host_weights.h"
#include "kernels/cuda/decode_gemv.cuh"
#include "kernels/weight_view.h"

namespace dsv41rt::testing {
namespace {

namespace kc = kernels::cuda;
using kernels::WeightFormat;
using kernels::WeightView;

struct Shape {
  int64_t m, n, k;
  bool accumulate = false;
  int64_t batch = 1, w_rows_per_batch = 0;
};

class BackendCudaDecodeGemv : public CudaKernelTest {
 protected:
  cudaStream_t stream() { return static_cast<cudaStream_t>(cuda().stream(0).handle); }

  // Random codes and scale codes in [e_lo, e_hi] (BF16: normal values, sigma 0.05).
  HostWeights make_weights(WeightFormat f, int64_t rows, int64_t cols, int32_t br, int32_t bc,
                           int e_lo = 117, int e_hi = 123) {
    return random_host_weights(static_cast<RandomInputs&>(*this), f, rows, cols, br, bc, e_lo,
                               e_hi);
  }

  // Runs the kernel on (x, w) with y0 as the initial y (poison unless accumulating); returns y.
  std::vector<float> run(const Shape& s, const HostWeights& hw, const std::vector<float>& x,
                         const std::vector<float>& y0, cudaError_t* status = nullptr,
                         bool graph = false) {
    Buffer<float> dx = upload(cuda(), x);
    Buffer<uint8_t> dw = upload(cuda(), hw.data);
    Buffer<uint8_t> ds = upload(cuda(), hw.scale.empty() ? std::vector<uint8_t>(1) : hw.scale);
    Buffer<float> dy =
        s.accumulate ? upload(cuda(), y0) : poisoned<float>(cuda(), int64_t(y0.size()));
    kc::DecodeGemv g = gemv(s, hw.view(dw.get(), ds.get()), dx.get(), dy.get());
    const int64_t wsf = kc::decode_gemv_workspace_floats(g);
    Buffer<float> ws = poisoned<float>(cuda(), wsf > 0 ? wsf : 1);
    cudaError_t e = cudaSuccess;
    if (graph) {
      EXPECT_TRUE(cuda().supports_graphs());
      auto gr = cuda().capture(
          cuda().stream(0), [&] { e = kc::decode_gemv_bf16(g, ws.get(), wsf, stream()); }, nullptr);
      cuda().replay(*gr, cuda().stream(0));
    } else {
      e = kc::decode_gemv_bf16(g, ws.get(), wsf, stream());
    }
    if (status) *status = e;
    EXPECT_EQ(e, cudaSuccess);
    return dy.download();
  }

  // x [m, batch, k] and y [m, batch, n] (the grouped-projection layout; batch 1 is plain).
  static kc::DecodeGemv gemv(const Shape& s, const WeightView& w, const float* x, float* y) {
    kc::DecodeGemv g;
    g.x = x, g.ldx = s.batch * s.k, g.w = w, g.y = y, g.ldy = s.batch * s.n;
    g.m = s.m, g.n = s.n, g.k = s.k, g.accumulate = s.accumulate;
    g.batch = s.batch, g.stride_x = s.k, g.stride_y = s.n, g.w_rows_per_batch = s.w_rows_per_batch;
    return g;
  }

  // Checks y against the FP64 reference on the rows `check_row` selects (all outputs must be
  // written in any case).
  void check(const Shape& s, const HostWeights& hw, const std::vector<float>& x,
             const std::vector<float>& y0, const std::vector<float>& y,
             const std::function<bool(int64_t)>& check_row) {
    ASSERT_TRUE(all_written(y));
    const WeightView w = hw.host();
    std::vector<float> got;
    std::vector<double> want, tol;
    std::vector<double> wrow(size_t(s.k));
    for (int64_t b = 0; b < s.batch; ++b) {
      for (int64_t j = 0; j < s.n; ++j) {
        if (!check_row(j)) continue;
        const int64_t r = b * s.w_rows_per_batch + j;
        for (int64_t c = 0; c < s.k; ++c) wrow[c] = w.value(r, c);
        for (int64_t i = 0; i < s.m; ++i) {
          const float* xr = x.data() + (i * s.batch + b) * s.k;
          const int64_t yi = (i * s.batch + b) * s.n + j;
          double sum = s.accumulate ? y0[yi] : 0.0, mag = s.accumulate ? std::abs(y0[yi]) : 0.0;
          for (int64_t c = 0; c < s.k; ++c) {
            const double t = double(round_bf16(xr[c])) * wrow[c];
            sum += t, mag += std::abs(t);
          }
          got.push_back(y[yi]), want.push_back(sum), tol.push_back(2 * gamma_n(s.k + 1) * mag);
        }
      }
    }
    EXPECT_TRUE(within(got, want, tol));
  }

  void run_and_check(const Shape& s, const HostWeights& hw) {
    SCOPED_TRACE(std::string(format_name(hw.format)) + " blocks " + std::to_string(hw.br) + "x" +
                 std::to_string(hw.bc) + " m " + std::to_string(s.m) + " n " + std::to_string(s.n) +
                 " k " + std::to_string(s.k) + " batch " + std::to_string(s.batch) +
                 (s.accumulate ? " accumulate" : ""));
    kc::DecodeGemv probe = gemv(s, hw.host(), nullptr, nullptr);
    probe.x = reinterpret_cast<const float*>(uintptr_t(256));  // alignment-only stand-ins
    probe.y = reinterpret_cast<float*>(uintptr_t(256));
    probe.w.data = reinterpret_cast<const void*>(uintptr_t(256));
    ASSERT_TRUE(kc::decode_gemv_supported(probe));
    const std::vector<float> x = normal(s.m * s.batch * s.k);
    const std::vector<float> y0 = normal(s.m * s.batch * s.n);
    const std::vector<float> y = run(s, hw, x, y0);
    // Large matrices: every 5th row and the last 16 (the reference is FP64 on the host).
    const bool all = s.n * s.k <= 1280 * 5120;
    check(s, hw, x, y0, y, [&](int64_t j) { return all || j % 5 == 0 || j >= s.n - 16; });
  }

  void format_suite(WeightFormat f, int32_t br, int32_t bc) {
    const std::vector<std::pair<int64_t, int64_t>> nk = {
        {64, 32}, {100, 96}, {1280, 5120}, {4096, 1280}, {5120, 2304}};
    for (const auto& [n, k] : nk) {
      const HostWeights hw = make_weights(f, n, k, br, bc);
      const bool big = n * k > 100 * 96;
      for (const int64_t m : {1, 2, 7, 8, 9, 33, 64}) {
        if (big && (m == 2 || m == 8 || m == 33)) continue;  // host reference time
        run_and_check(Shape{m, n, k, /*accumulate=*/m == 7 || m == 33}, hw);
      }
    }
    // Grouped: 8 groups of n = 64 rows, k = 256; contiguous groups and groups with gaps.
    for (const int64_t stride : {64, 96}) {
      const HostWeights hw = make_weights(f, 7 * stride + 64, 256, br, bc);
      for (const int64_t m : {1, 9}) run_and_check(Shape{m, 64, 256, m == 9, 8, stride}, hw);
    }
  }
};

TEST_F(BackendCudaDecodeGemv, Bf16) { format_suite(WeightFormat::kBF16, 0, 0); }
TEST_F(BackendCudaDecodeGemv, Fp8Blocks32) { format_suite(WeightFormat::kFp8Block, 32, 32); }
TEST_F(BackendCudaDecodeGemv, Fp8Blocks128) { format_suite(WeightFormat::kFp8Block, 128, 128); }
TEST_F(BackendCudaDecodeGemv, Mxfp4) { format_suite(WeightFormat::kMxfp4, 0, 0); }

// Scales far from real checkpoints' (2^-2 .. 2^23): the kernel's two-multiply decode path.
TEST_F(BackendCudaDecodeGemv, LargeScales) {
  run_and_check(Shape{3, 100, 256},
                make_weights(WeightFormat::kFp8Block, 100, 256, 32, 32, 125, 150));
  run_and_check(Shape{3, 100, 256}, make_weights(WeightFormat::kMxfp4, 100, 256, 0, 0, 125, 150));
}

// Bitwise: eager twice, graph replay, and a token's row at m = 1 vs the same row inside m = 64.
TEST_F(BackendCudaDecodeGemv, DeterministicAndIndependentOfM) {
  for (const WeightFormat f :
       {WeightFormat::kFp8Block, WeightFormat::kMxfp4, WeightFormat::kBF16}) {
    SCOPED_TRACE(format_name(f));
    const HostWeights hw = make_weights(f, 1280, 5120, 32, 32);
    const Shape s64{64, 1280, 5120}, s1{1, 1280, 5120};
    ASSERT_GT(kc::decode_gemv_splits(gemv(s64, hw.host(), nullptr, nullptr)), 1)
        << "the split-K reduce must be exercised";
    const std::vector<float> x = normal(64 * 5120), y0(64 * 1280, 0.f);
    const std::vector<float> a = run(s64, hw, x, y0), b = run(s64, hw, x, y0);
    const std::vector<float> c = run(s64, hw, x, y0, nullptr, /*graph=*/true);
    EXPECT_TRUE(bitwise_equal(a, b)) << "eager runs";
    EXPECT_TRUE(bitwise_equal(a, c)) << "graph replay";
    const std::vector<float> x1(x.begin() + 5 * 5120, x.begin() + 6 * 5120);  // token 5
    const std::vector<float> one = run(s1, hw, x1, std::vector<float>(1280, 0.f));
    EXPECT_TRUE(bitwise_equal(one, std::vector<float>(a.begin() + 5 * 1280, a.begin() + 6 * 1280)))
        << "token 5 alone vs in a batch of 64";
  }
}

TEST_F(BackendCudaDecodeGemv, ScaleNanPropagates) {
  HostWeights hw = make_weights(WeightFormat::kFp8Block, 64, 64, 32, 32);
  hw.scale[2] = 255;  // block (1, 0): rows 32..63, columns 0..31
  const Shape s{2, 64, 64};
  const std::vector<float> y = run(s, hw, normal(2 * 64), std::vector<float>(2 * 64, 0.f));
  for (int64_t i = 0; i < 2; ++i) {
    for (int64_t j = 0; j < 64; ++j)
      EXPECT_EQ(std::isnan(y[i * 64 + j]), j >= 32) << i << ", " << j;
  }
}

TEST_F(BackendCudaDecodeGemv, RejectsUnsupported) {
  const HostWeights hw = make_weights(WeightFormat::kFp8Block, 64, 64, 32, 32);
  Buffer<float> x = upload(cuda(), normal(65 * 64));
  Buffer<uint8_t> w = upload(cuda(), hw.data), sc = upload(cuda(), hw.scale);
  Buffer<float> y = poisoned<float>(cuda(), 65 * 64), ws = poisoned<float>(cuda(), 1);
  const kc::DecodeGemv ok = gemv(Shape{1, 64, 64}, hw.view(w.get(), sc.get()), x.get(), y.get());
  ASSERT_TRUE(kc::decode_gemv_supported(ok));
  std::vector<std::pair<std::string, kc::DecodeGemv>> bad;
  auto add = [&](const std::string& what, const std::function<void(kc::DecodeGemv&)>& edit) {
    kc::DecodeGemv g = ok;
    edit(g);
    bad.emplace_back(what, g);
  };
  add("m = 0", [](kc::DecodeGemv& g) { g.m = 0; });
  add("m = 65", [](kc::DecodeGemv& g) { g.m = 65; });
  add("fp8 k % 32 != 0", [](kc::DecodeGemv& g) { g.k = 48, g.w.cols = 48; });
  add("w.cols != k", [](kc::DecodeGemv& g) { g.k = 32; });
  add("misaligned x", [](kc::DecodeGemv& g) { g.x += 1; });
  add("rows beyond w", [](kc::DecodeGemv& g) { g.n = 65; });
  add("no scales", [](kc::DecodeGemv& g) { g.w.scale = nullptr; });
  add("block_cols 24", [](kc::DecodeGemv& g) { g.w.block_cols = 24; });
  add("bf16 k % 8 != 0",
      [](kc::DecodeGemv& g) { g.w.format = WeightFormat::kBF16, g.k = 60, g.w.cols = 60; });
  for (const auto& [what, g] : bad) {
    EXPECT_FALSE(kc::decode_gemv_supported(g)) << what;
    EXPECT_EQ(kc::decode_gemv_bf16(g, ws.get(), 1, stream()), cudaErrorInvalidValue) << what;
  }
  // A workspace smaller than decode_gemv_workspace_floats.
  const HostWeights big = make_weights(WeightFormat::kFp8Block, 64, 4096, 32, 32);
  Buffer<uint8_t> bw = upload(cuda(), big.data), bs = upload(cuda(), big.scale);
  Buffer<float> bx = upload(cuda(), normal(4096));
  const kc::DecodeGemv g =
      gemv(Shape{1, 64, 4096}, big.view(bw.get(), bs.get()), bx.get(), y.get());
  const int64_t need = kc::decode_gemv_workspace_floats(g);
  ASSERT_GT(need, 1) << "this shape must split K";
  EXPECT_EQ(kc::decode_gemv_bf16(g, ws.get(), need - 1, stream()), cudaErrorInvalidValue);
  EXPECT_EQ(kc::decode_gemv_bf16(g, nullptr, 0, stream()), cudaErrorInvalidValue);
  // Nothing was launched: y still holds the poison.
  const std::vector<float> after = y.download();
  for (const float v : after) ASSERT_EQ(bits_of(v), 0xFFFFFFFFu);
}

}  // namespace
}  // namespace dsv41rt::testing
