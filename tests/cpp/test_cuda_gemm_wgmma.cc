// The prefill GEMM on BF16 wgmma (kernels/cuda/gemm_wgmma.cuh) with its staging kernels, called
// directly: FP32 activations rounded to BF16 (rows_to_bf16), weights in every stored format
// decoded to BF16 (weight_to_bf16), then C (+)= A B^T. Built only in CUDA builds; skipped without
// a device unless DSV41RT_REQUIRE_CUDA=1.
//
// Reference (host, FP64): ref[i, j] = c0 + sum_c bf16(x[i, c]) * W.value(j, c), bf16() the RNE
// rounding written out in backend_test_util.h. Products of BF16 values are exact in FP32, so the
// only error is FP32 summation (any order, tensor-core accumulation):
//   |y - ref| <= 2 * gamma_{k+1} * (|c0| + sum_c |bf16(x[i, c]) * w|)
// (the factor 2 covers accumulators that truncate instead of rounding). Every output must be
// written (y starts as NaN poison unless accumulating). Shapes cover tiles cut by m, n and k
// (TMA zero fill), odd n (the scalar epilogue), pitches wider than the rows and accumulation.
// Also: the staging kernels bitwise (BF16 RNE; exact weight decode; the row gather), grouped tiles
// in passes over chunks of groups (the MoE layout), FP32 operands split into BF16 parts
// (gemm_f32_split3), determinism (eager twice, graph replay),
// independence of m (row 5 alone == row 5 of 300, bitwise) and rejections.
#include <cuda_runtime_api.h>

#include <cmath>

#include "backend_test_util.h"
#include "core/dtype.h"
#include "grouped_tile_table_util.h"
#include "host_weights.h"
#include "kernels/cuda/gemm_wgmma.cuh"
#include "kernels/weight_view.h"

namespace dsv41rt::testing {
namespace {

namespace kc = kernels::cuda;
using kernels::WeightFormat;
using kernels::WeightView;

struct Shape {
  int64_t m, n, k;
  bool accumulate = false;
  int64_t pad = 0;  // extra elements per row of x, the BF16 operands and y
};

class BackendCudaGemmWgmma : public CudaKernelTest {
 protected:
  cudaStream_t stream() { return static_cast<cudaStream_t>(cuda().stream(0).handle); }

  HostWeights make_weights(WeightFormat f, int64_t rows, int64_t cols) {
    return random_host_weights(static_cast<RandomInputs&>(*this), f, rows, cols);
  }

  // x [m, k + pad] -> y [m, n + pad] through the staging kernels and the GEMM; y starts as y0
  // when accumulating, as poison otherwise.
  std::vector<float> run(const Shape& s, const HostWeights& hw, const std::vector<float>& x,
                         const std::vector<float>& y0, bool graph = false) {
    const int64_t ldx = s.k + s.pad, lda = (s.k + 7) / 8 * 8 + 8 * (s.pad > 0), ldc = s.n + s.pad;
    Buffer<float> dx = upload(cuda(), x);
    Buffer<uint8_t> dw = upload(cuda(), hw.data);
    Buffer<uint8_t> ds = upload(cuda(), hw.scale.empty() ? std::vector<uint8_t>(1) : hw.scale);
    Buffer<uint16_t> da = poisoned<uint16_t>(cuda(), s.m * lda);
    Buffer<uint16_t> db = poisoned<uint16_t>(cuda(), s.n * lda);
    Buffer<float> dy = s.accumulate ? upload(cuda(), y0) : poisoned<float>(cuda(), s.m * ldc);
    kc::WgmmaGemm g;
    g.a = da.get(), g.lda = lda, g.b = db.get(), g.ldb = lda, g.c = dy.get(), g.ldc = ldc;
    g.m = s.m, g.n = s.n, g.k = s.k, g.accumulate = s.accumulate;
    auto body = [&] {
      EXPECT_EQ(kc::rows_to_bf16(dx.get(), ldx, s.m, s.k, da.get(), lda, stream()), cudaSuccess);
      EXPECT_EQ(kc::weight_to_bf16(hw.view(dw.get(), ds.get()), 0, s.n, db.get(), lda, stream()),
                cudaSuccess);
      EXPECT_EQ(kc::gemm_bf16_wgmma(g, stream()), cudaSuccess);
    };
    if (graph) {
      auto gr = cuda().capture(cuda().stream(0), body, nullptr);
      cuda().replay(*gr, cuda().stream(0));
    } else {
      body();
    }
    return dy.download();
  }

  void run_and_check(const Shape& s, const HostWeights& hw) {
    SCOPED_TRACE(std::string(format_name(hw.format)) + " m " + std::to_string(s.m) + " n " +
                 std::to_string(s.n) + " k " + std::to_string(s.k) + " pad " +
                 std::to_string(s.pad) + (s.accumulate ? " accumulate" : ""));
    const int64_t ldx = s.k + s.pad, ldc = s.n + s.pad;
    const std::vector<float> x = normal(s.m * ldx), y0 = normal(s.m * ldc);
    std::vector<float> y = run(s, hw, x, y0);
    const WeightView w = hw.host();
    // Large products: every 7th row of C and the last 9 (the reference is FP64 on the host).
    const bool all = s.m * s.n * s.k <= int64_t(64) << 20;
    std::vector<float> got;
    std::vector<double> want, tol;
    std::vector<double> wrow(size_t(s.k));
    for (int64_t j = 0; j < s.n; ++j) {
      for (int64_t c = 0; c < s.k; ++c) wrow[c] = w.value(j, c);
      for (int64_t i = 0; i < s.m; ++i) {
        const float out = y[i * ldc + j];
        ASSERT_FALSE(!s.accumulate && bits_of(out) == bits_of(poison_float()))
            << "unwritten output " << i << ", " << j;
        if (!all && i % 7 != 0 && i < s.m - 9) continue;
        double sum = s.accumulate ? y0[i * ldc + j] : 0.0, mag = std::abs(sum);
        for (int64_t c = 0; c < s.k; ++c) {
          const double t = double(round_bf16(x[i * ldx + c])) * wrow[c];
          sum += t, mag += std::abs(t);
        }
        got.push_back(out), want.push_back(sum), tol.push_back(2 * gamma_n(s.k + 1) * mag);
      }
    }
    EXPECT_TRUE(within(got, want, tol));
  }
};

TEST_F(BackendCudaGemmWgmma, EveryFormatAndTail) {
  const std::vector<Shape> shapes = {
      {1, 64, 64},     {7, 100, 96, true},     {128, 128, 64}, {130, 136, 136, false, 8},
      {257, 257, 200}, {300, 384, 1024, true}, {64, 129, 520}, {512, 1280, 5120},
  };
  for (const WeightFormat f :
       {WeightFormat::kBF16, WeightFormat::kFp8Block, WeightFormat::kMxfp4}) {
    for (const Shape& s : shapes) {
      if (f == WeightFormat::kFp8Block && (s.n % 32 != 0 || s.k % 32 != 0)) continue;
      if (f == WeightFormat::kMxfp4 && s.k % 32 != 0) continue;
      run_and_check(s, make_weights(f, s.n, s.k));
    }
  }
}

// The staging kernels: BF16 RNE of the activations and the weight decode, bitwise; columns past
// k in a wider pitch are left alone.
TEST_F(BackendCudaGemmWgmma, StagingIsExact) {
  const int64_t m = 5, k = 200, ld = 208;
  std::vector<float> x = normal(m * k);
  x[3] = 1.0f + 0x1p-8f, x[4] = 1.0f + 0x1p-8f + 0x1p-20f;  // a tie to even, just above one
  Buffer<float> dx = upload(cuda(), x);
  Buffer<uint16_t> dy = poisoned<uint16_t>(cuda(), m * ld);
  ASSERT_EQ(kc::rows_to_bf16(dx.get(), k, m, k, dy.get(), ld, stream()), cudaSuccess);
  const std::vector<uint16_t> y = dy.download();
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t c = 0; c < ld; ++c) {
      const uint16_t want = c < k ? uint16_t(bits_of(round_bf16(x[r * k + c])) >> 16)
                                  : uint16_t(kPoison | (kPoison << 8));
      ASSERT_EQ(y[r * ld + c], want) << r << ", " << c;
    }
  }
  // The row gather: row r from x row gather[r] / 3, -1 a row of zeros.
  const std::vector<int32_t> gather = {14, -1, 0, 5, 13, -1};
  Buffer<int32_t> dg = upload(cuda(), gather);
  Buffer<uint16_t> dz = poisoned<uint16_t>(cuda(), 6 * k);
  ASSERT_EQ(kc::rows_to_bf16(dx.get(), k, 6, k, dz.get(), k, stream(), dg.get(), 3), cudaSuccess);
  const std::vector<uint16_t> z = dz.download();
  for (int64_t r = 0; r < 6; ++r) {
    for (int64_t c = 0; c < k; ++c) {
      const uint16_t want = gather[r] < 0
                                ? uint16_t(0)
                                : uint16_t(bits_of(round_bf16(x[(gather[r] / 3) * k + c])) >> 16);
      ASSERT_EQ(z[r * k + c], want) << "gathered row " << r << ", " << c;
    }
  }
  for (const WeightFormat f :
       {WeightFormat::kBF16, WeightFormat::kFp8Block, WeightFormat::kMxfp4}) {
    SCOPED_TRACE(format_name(f));
    const HostWeights hw = make_weights(f, 96, 160);
    Buffer<uint8_t> dw = upload(cuda(), hw.data);
    Buffer<uint8_t> ds = upload(cuda(), hw.scale.empty() ? std::vector<uint8_t>(1) : hw.scale);
    Buffer<uint16_t> db = poisoned<uint16_t>(cuda(), 40 * 160);
    ASSERT_EQ(kc::weight_to_bf16(hw.view(dw.get(), ds.get()), 32, 40, db.get(), 160, stream()),
              cudaSuccess);
    const std::vector<uint16_t> b = db.download();
    const WeightView w = hw.host();
    for (int64_t r = 0; r < 40; ++r) {
      for (int64_t c = 0; c < 160; ++c) {
        ASSERT_EQ(b[r * 160 + c], f32_to_bf16(w.value(32 + r, c))) << r << ", " << c;
      }
    }
  }
}

TEST_F(BackendCudaGemmWgmma, DeterministicAndIndependentOfM) {
  const HostWeights hw = make_weights(WeightFormat::kFp8Block, 384, 1024);
  const Shape s300{300, 384, 1024}, s1{1, 384, 1024};
  const std::vector<float> x = normal(300 * 1024), y0(300 * 384, 0.f);
  const std::vector<float> a = run(s300, hw, x, y0), b = run(s300, hw, x, y0);
  const std::vector<float> c = run(s300, hw, x, y0, /*graph=*/true);
  EXPECT_TRUE(bitwise_equal(a, b)) << "eager runs";
  EXPECT_TRUE(bitwise_equal(a, c)) << "graph replay";
  const std::vector<float> x5(x.begin() + 5 * 1024, x.begin() + 6 * 1024);
  const std::vector<float> one = run(s1, hw, x5, std::vector<float>(384, 0.f));
  EXPECT_TRUE(bitwise_equal(one, std::vector<float>(a.begin() + 5 * 384, a.begin() + 6 * 384)))
      << "row 5 alone vs in a product of 300 rows";
}

// Grouped tiles (the MoE layout): 5 groups of 0, 130, 1, 257 and 40 rows in kWgmmaTileM-row tiles
// (a table with unused entries at the end), B decoded per pass for groups [0, 2), [2, 4), [4, 5)
// only, as moe_grouped stages a chunk of experts: every row must come from its own group's B.
TEST_F(BackendCudaGemmWgmma, GroupedTilesInPasses) {
  const std::vector<int32_t> counts = {0, 130, 1, 257, 40};
  const int64_t E = 5, n = 96, k = 136;
  const GroupedTileTable tiles = grouped_tile_table(counts, kc::kWgmmaTileM);
  const std::vector<int32_t>& table = tiles.table;
  const int64_t m = tiles.m, entries = tiles.entries, max_tiles = tiles.max_tiles;
  std::vector<uint16_t> a(size_t(m * k)), b(size_t(E * n * k));
  for (uint16_t& v : a) v = uint16_t(bits_of(round_bf16(float(normal(1)[0]))) >> 16);
  for (uint16_t& v : b) v = uint16_t(bits_of(round_bf16(float(normal(1, 0.1)[0]))) >> 16);
  Buffer<uint16_t> da = upload(cuda(), a);
  Buffer<int32_t> dt = upload(cuda(), table);
  Buffer<float> dc = poisoned<float>(cuda(), m * n);
  for (const auto& [lo, hi] : {std::pair(0, 2), std::pair(2, 4), std::pair(4, 5)}) {
    Buffer<uint16_t> db =
        upload(cuda(), std::vector<uint16_t>(b.begin() + lo * n * k, b.begin() + hi * n * k));
    kc::WgmmaGemm g;
    g.a = da.get(), g.lda = k, g.b = db.get(), g.ldb = k, g.c = dc.get(), g.ldc = n;
    g.m = m, g.n = n, g.k = k;
    g.tiles = dt.get(), g.max_tiles = max_tiles, g.tile_entries = entries;
    g.b_rows_per_group = n, g.group_lo = lo, g.group_hi = hi;
    ASSERT_TRUE(kc::gemm_bf16_wgmma_supported(g));
    ASSERT_EQ(kc::gemm_bf16_wgmma(g, stream()), cudaSuccess);
  }
  const std::vector<float> c = dc.download();
  ASSERT_TRUE(all_written(c));
  std::vector<float> got;
  std::vector<double> want, tol;
  int64_t r = 0;
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t i = 0; i < counts[e]; ++i, ++r) {
      for (int64_t j = 0; j < n; ++j) {
        double sum = 0, mag = 0;
        for (int64_t q = 0; q < k; ++q) {
          const double t = double(bf16_to_f32(a[r * k + q])) * bf16_to_f32(b[(e * n + j) * k + q]);
          sum += t, mag += std::abs(t);
        }
        got.push_back(c[r * n + j]), want.push_back(sum), tol.push_back(2 * gamma_n(k + 1) * mag);
      }
    }
  }
  EXPECT_TRUE(within(got, want, tol));
}

// FP32 operands with FP32-exact products (three BF16 parts each, 9 part products): the sum of
// the exact products in another order, so the any-order bound of an FP32 dot product over 9 k
// terms holds. Workspaces of one tile each force several passes over m and n; values spread over
// 2^-20 .. 2^20 so the low parts matter.
TEST_F(BackendCudaGemmWgmma, Fp32Split3IsExactProductsInAnotherOrder) {
  const int64_t m = 300, n = 260, k = 136, tm = kc::kWgmmaTileM;
  std::vector<float> a = normal(m * k), b = normal(n * k);
  for (float& v : a) v = std::ldexp(v, int(randint(-20, 20)));
  for (float& v : b) v = std::ldexp(v, int(randint(-20, 20)));
  Buffer<float> da = upload(cuda(), a), db = upload(cuda(), b);
  Buffer<float> dc = poisoned<float>(cuda(), m * n);
  Buffer<uint16_t> aw = poisoned<uint16_t>(cuda(), 9 * k * tm),
                   bw = poisoned<uint16_t>(cuda(), 3 * k * 128);
  ASSERT_EQ(kc::gemm_f32_split3(da.get(), k, db.get(), k, m, n, k, dc.get(), n, aw.get(),
                                9 * k * tm, bw.get(), 3 * k * 128, stream()),
            cudaSuccess);
  const std::vector<float> c = dc.download();
  ASSERT_TRUE(all_written(c));
  std::vector<float> got;
  std::vector<double> want, tol;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0, mag = 0;
      for (int64_t q = 0; q < k; ++q) {
        const double t = double(a[i * k + q]) * b[j * k + q];
        sum += t, mag += std::abs(t);
      }
      got.push_back(c[i * n + j]), want.push_back(sum), tol.push_back(2 * gamma_n(9 * k + 3) * mag);
    }
  }
  EXPECT_TRUE(within(got, want, tol));
  // A workspace smaller than one tile of rows is refused.
  EXPECT_EQ(kc::gemm_f32_split3(da.get(), k, db.get(), k, m, n, k, dc.get(), n, aw.get(),
                                9 * k * tm - 1, bw.get(), 3 * k * 128, stream()),
            cudaErrorInvalidValue);
}

TEST_F(BackendCudaGemmWgmma, RejectsUnsupported) {
  Buffer<uint16_t> a = poisoned<uint16_t>(cuda(), 64 * 72), b = poisoned<uint16_t>(cuda(), 64 * 72);
  Buffer<float> c = poisoned<float>(cuda(), 64 * 64);
  kc::WgmmaGemm ok;
  ok.a = a.get(), ok.lda = 72, ok.b = b.get(), ok.ldb = 72, ok.c = c.get(), ok.ldc = 64;
  ok.m = 64, ok.n = 64, ok.k = 64;
  ASSERT_TRUE(kc::gemm_bf16_wgmma_supported(ok));
  std::vector<std::pair<std::string, kc::WgmmaGemm>> bad;
  auto add = [&](const std::string& what, const std::function<void(kc::WgmmaGemm&)>& edit) {
    kc::WgmmaGemm g = ok;
    edit(g);
    bad.emplace_back(what, g);
  };
  add("m = 0", [](kc::WgmmaGemm& g) { g.m = 0; });
  add("k % 8 != 0", [](kc::WgmmaGemm& g) { g.k = 60; });
  add("lda % 8 != 0", [](kc::WgmmaGemm& g) { g.lda = 68; });
  add("lda < k", [](kc::WgmmaGemm& g) { g.k = 80; });
  add("misaligned a", [](kc::WgmmaGemm& g) { g.a += 4; });
  add("ldc < n", [](kc::WgmmaGemm& g) { g.ldc = 63; });
  add("no c", [](kc::WgmmaGemm& g) { g.c = nullptr; });
  for (const auto& [what, g] : bad) {
    EXPECT_FALSE(kc::gemm_bf16_wgmma_supported(g)) << what;
    EXPECT_EQ(kc::gemm_bf16_wgmma(g, stream()), cudaErrorInvalidValue) << what;
  }
  const std::vector<uint8_t> f32(64 * 4 * 64);
  Buffer<uint8_t> w = upload(cuda(), f32);
  WeightView v;
  v.data = w.get(), v.format = WeightFormat::kF32, v.rows = 64, v.cols = 64;
  EXPECT_EQ(kc::weight_to_bf16(v, 0, 64, a.get(), 72, stream()), cudaErrorInvalidValue)
      << "FP32 weights would be rounded";
  v.format = WeightFormat::kBF16;
  EXPECT_EQ(kc::weight_to_bf16(v, 32, 40, a.get(), 72, stream()), cudaErrorInvalidValue)
      << "rows past the matrix";
  EXPECT_EQ(kc::rows_to_bf16(c.get(), 64, 64, 64, a.get(), 32, stream()), cudaErrorInvalidValue)
      << "ldy < k";
}

}  // namespace
}  // namespace dsv41rt::testing
