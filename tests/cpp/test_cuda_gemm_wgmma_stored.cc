// The prefill GEMM with B in its stored format (kernels/cuda/gemm_wgmma.cuh, WgmmaGemm::bw): the
// producer warpgroup decodes each stage's B tile into shared memory, so C must be BITWISE that of
// the staged path (weight_to_bf16 into a BF16 copy, then the same GEMM on it): the same operand
// values, the same wgmma sequence. Checked for every stored format (BF16, FP8 32 x 32 and 128 x
// 128 blocks, MXFP4), tiles cut by m, n and k (a last stage narrower than 64 columns), a row
// offset into a larger stack, accumulation, grouped tiles (the MoE layout) in one launch and in
// passes over groups, graph replay, and the rejections. Every output must be written (C starts as
// NaN poison unless accumulating). Built only in CUDA builds; skipped without a device unless
// DSV41RT_REQUIRE_CUDA=1.
#include <cuda_runtime_api.h>

#include <string>
#include <tuple>
#include <utility>
#include <vector>

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

struct Case {
  WeightFormat format;
  int32_t block = 32;  // FP8 scale blocks (block x block)
  int64_t m, n, k;
  bool accumulate = false;
  int64_t row0 = 0;  // B = rows row0 .. row0 + n of a stack of row0 + n + 40 rows
};

std::string name(const Case& c) {
  return std::string(format_name(c.format)) +
         (c.format == WeightFormat::kFp8Block ? " block " + std::to_string(c.block)
                                              : std::string()) +
         " m " + std::to_string(c.m) + " n " + std::to_string(c.n) + " k " + std::to_string(c.k) +
         " row0 " + std::to_string(c.row0) + (c.accumulate ? " accumulate" : "");
}

class BackendCudaGemmWgmmaStored : public CudaKernelTest {
 protected:
  cudaStream_t stream() { return static_cast<cudaStream_t>(cuda().stream(0).handle); }

  HostWeights make_weights(WeightFormat f, int32_t block, int64_t rows, int64_t cols) {
    return random_host_weights(static_cast<RandomInputs&>(*this), f, rows, cols, block, block);
  }

  // C of the staged path (staged = true: weight_to_bf16 then B = the copy) or of the stored one,
  // for the same BF16 A; C starts as y0 when accumulating, as poison otherwise.
  std::vector<float> run(const Case& c, const WeightView& w, const Buffer<uint16_t>& a,
                         const std::vector<float>& y0, bool staged, bool graph = false) {
    Buffer<float> dy = c.accumulate ? upload(cuda(), y0) : poisoned<float>(cuda(), c.m * c.n);
    Buffer<uint16_t> db = poisoned<uint16_t>(cuda(), c.n * c.k);
    kc::WgmmaGemm g;
    g.a = a.get(), g.lda = c.k, g.c = dy.get(), g.ldc = c.n;
    g.m = c.m, g.n = c.n, g.k = c.k, g.accumulate = c.accumulate;
    if (staged) {
      g.b = db.get(), g.ldb = c.k;
    } else {
      g.bw = w, g.bw_row0 = c.row0;
    }
    EXPECT_TRUE(kc::gemm_bf16_wgmma_supported(g));
    auto body = [&] {
      if (staged) {
        EXPECT_EQ(kc::weight_to_bf16(w, c.row0, c.n, db.get(), c.k, stream()), cudaSuccess);
      }
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

  void check(const Case& c, bool graph = false) {
    SCOPED_TRACE(name(c));
    const HostWeights hw = make_weights(c.format, c.block, c.row0 + c.n + 40, c.k);
    Buffer<uint8_t> dw = upload(cuda(), hw.data);
    Buffer<uint8_t> ds = upload(cuda(), hw.scale.empty() ? std::vector<uint8_t>(1) : hw.scale);
    const WeightView w = hw.view(dw.get(), ds.get());
    Buffer<float> dx = upload(cuda(), normal(c.m * c.k));
    Buffer<uint16_t> da = poisoned<uint16_t>(cuda(), c.m * c.k);
    ASSERT_EQ(kc::rows_to_bf16(dx.get(), c.k, c.m, c.k, da.get(), c.k, stream()), cudaSuccess);
    const std::vector<float> y0 = normal(c.m * c.n);
    const std::vector<float> staged = run(c, w, da, y0, true);
    const std::vector<float> stored = run(c, w, da, y0, false, graph);
    if (!c.accumulate) {
      EXPECT_TRUE(all_written(stored));
    }
    EXPECT_TRUE(bitwise_equal(stored, staged));
  }
};

TEST_F(BackendCudaGemmWgmmaStored, BitwiseTheStagedGemmInEveryFormat) {
  const std::vector<std::tuple<int64_t, int64_t, int64_t, bool>> shapes = {
      {1, 64, 64, false},      {7, 96, 96, true},     {130, 160, 136, false},
      {257, 256, 200, false},  {64, 129, 520, false}, {300, 384, 1024, true},
      {512, 1280, 5120, false}};
  for (const auto& [m, n, k, acc] : shapes) {
    for (const WeightFormat f :
         {WeightFormat::kBF16, WeightFormat::kFp8Block, WeightFormat::kMxfp4}) {
      for (const int32_t block : {32, 128}) {
        if (f != WeightFormat::kFp8Block && block != 32) continue;
        if (f != WeightFormat::kBF16 && k % 32 != 0) continue;  // whole scale blocks along k
        for (const int64_t row0 : {int64_t(0), int64_t(24)}) {
          check(Case{f, block, m, n, k, acc, row0});
        }
      }
    }
  }
}

TEST_F(BackendCudaGemmWgmmaStored, GraphReplayIsEager) {
  check(Case{WeightFormat::kMxfp4, 32, 300, 384, 1024, false, 0}, /*graph=*/true);
  check(Case{WeightFormat::kFp8Block, 32, 130, 256, 512, true, 24}, /*graph=*/true);
}

// Grouped tiles (the MoE layout): 5 groups of 0, 130, 1, 257 and 40 rows; the staged path decodes
// the groups of each pass [0, 2), [2, 4), [4, 5) into the copy (as moe_grouped does), the stored
// path reads the stack, in one launch over all groups and in the same passes.
TEST_F(BackendCudaGemmWgmmaStored, GroupedTilesBitwiseTheStagedPasses) {
  const std::vector<int32_t> counts = {0, 130, 1, 257, 40};
  const int64_t E = 5, n = 96, k = 160;
  const GroupedTileTable tiles = grouped_tile_table(counts, kc::kWgmmaTileM);
  const std::vector<int32_t>& table = tiles.table;
  const int64_t m = tiles.m, entries = tiles.entries, max_tiles = tiles.max_tiles;
  Buffer<int32_t> dt = upload(cuda(), table);
  Buffer<float> dx = upload(cuda(), normal(m * k));
  Buffer<uint16_t> da = poisoned<uint16_t>(cuda(), m * k);
  ASSERT_EQ(kc::rows_to_bf16(dx.get(), k, m, k, da.get(), k, stream()), cudaSuccess);
  const std::vector<std::pair<int32_t, int32_t>> passes = {{0, 2}, {2, 4}, {4, 5}};
  for (const WeightFormat f : {WeightFormat::kFp8Block, WeightFormat::kMxfp4}) {
    SCOPED_TRACE(format_name(f));
    const HostWeights hw = make_weights(f, 32, E * n, k);
    Buffer<uint8_t> dw = upload(cuda(), hw.data);
    Buffer<uint8_t> ds = upload(cuda(), hw.scale);
    const WeightView w = hw.view(dw.get(), ds.get());
    auto gemm = [&](float* c, int32_t lo, int32_t hi, const uint16_t* b) {
      kc::WgmmaGemm g;
      g.a = da.get(), g.lda = k, g.c = c, g.ldc = n, g.m = m, g.n = n, g.k = k;
      g.tiles = dt.get(), g.max_tiles = max_tiles, g.tile_entries = entries;
      g.b_rows_per_group = n, g.group_lo = lo, g.group_hi = hi;
      if (b) {
        g.b = b, g.ldb = k;
      } else {
        g.bw = w;
      }
      ASSERT_TRUE(kc::gemm_bf16_wgmma_supported(g));
      ASSERT_EQ(kc::gemm_bf16_wgmma(g, stream()), cudaSuccess);
    };
    Buffer<float> staged = poisoned<float>(cuda(), m * n);
    Buffer<uint16_t> db = poisoned<uint16_t>(cuda(), 2 * n * k);
    for (const auto& [lo, hi] : passes) {
      ASSERT_EQ(kc::weight_to_bf16(w, lo * n, (hi - lo) * n, db.get(), k, stream()), cudaSuccess);
      gemm(staged.get(), lo, hi, db.get());
    }
    Buffer<float> one = poisoned<float>(cuda(), m * n);
    gemm(one.get(), 0, int32_t(E), nullptr);
    Buffer<float> in_passes = poisoned<float>(cuda(), m * n);
    for (const auto& [lo, hi] : passes) gemm(in_passes.get(), lo, hi, nullptr);
    const std::vector<float> want = staged.download();
    ASSERT_TRUE(all_written(want));
    EXPECT_TRUE(bitwise_equal(one.download(), want)) << "one launch";
    EXPECT_TRUE(bitwise_equal(in_passes.download(), want)) << "in passes";
  }
}

TEST_F(BackendCudaGemmWgmmaStored, RejectsWhatItCannotDecode) {
  Buffer<uint16_t> a = poisoned<uint16_t>(cuda(), 64 * 64);
  Buffer<float> c = poisoned<float>(cuda(), 64 * 64);
  Buffer<uint8_t> codes = poisoned<uint8_t>(cuda(), 128 * 64 * 4 + 16);
  Buffer<uint8_t> scales = poisoned<uint8_t>(cuda(), 128 * 8);
  auto gemm_of = [&](WeightFormat f, int64_t rows, int64_t cols) {
    kc::WgmmaGemm g;
    g.a = a.get(), g.lda = 64, g.c = c.get(), g.ldc = 64, g.m = 64, g.n = 64, g.k = 64;
    g.bw.data = codes.get(), g.bw.scale = scales.get(), g.bw.format = f;
    g.bw.block_rows = g.bw.block_cols = 32, g.bw.rows = rows, g.bw.cols = cols;
    return g;
  };
  EXPECT_TRUE(kc::gemm_bf16_wgmma_supported(gemm_of(WeightFormat::kFp8Block, 64, 64)));
  EXPECT_FALSE(kc::gemm_bf16_wgmma_supported(gemm_of(WeightFormat::kF32, 64, 64))) << "FP32 B";
  EXPECT_FALSE(kc::gemm_bf16_wgmma_supported(gemm_of(WeightFormat::kFp8Block, 64, 128)))
      << "cols != k";
  EXPECT_FALSE(kc::gemm_bf16_wgmma_supported(gemm_of(WeightFormat::kFp8Block, 63, 64)))
      << "fewer rows than n";
  kc::WgmmaGemm g = gemm_of(WeightFormat::kFp8Block, 128, 64);
  g.bw_row0 = 65;
  EXPECT_FALSE(kc::gemm_bf16_wgmma_supported(g)) << "row0 + n past the rows";
  g = gemm_of(WeightFormat::kMxfp4, 64, 64);
  g.bw.data = codes.get() + 2;
  EXPECT_FALSE(kc::gemm_bf16_wgmma_supported(g)) << "MXFP4 codes not 4-byte aligned";
  g = gemm_of(WeightFormat::kFp8Block, 64, 64);
  g.bw.scale = nullptr;
  EXPECT_FALSE(kc::gemm_bf16_wgmma_supported(g)) << "no scales";
  EXPECT_EQ(kc::gemm_bf16_wgmma(gemm_of(WeightFormat::kF32, 64, 64), stream()),
            cudaErrorInvalidValue);
}

}  // namespace
}  // namespace dsv41rt::testing
