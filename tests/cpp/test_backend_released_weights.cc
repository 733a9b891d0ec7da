// Backend matrix ops reading weights in the checkpoint's released formats (kernels/weight_view.h:
// FP8 E4M3 with UE8M0 block scales, MXFP4 with UE8M0 per 32 columns, BF16), as the CUDA backend
// now keeps them on the device.
//
// Contract checked (backend_weights.h, kernels/cuda/linear.cuh, gemm_tc.cuh, moe.cuh): a stored
// format decodes exactly (every E4M3 / E2M1 code times a power of two is exact in FP32 and, in the
// normal range, in BF16), so on every path the op's result is BITWISE the result of the same
// values stored FP32 (FP32 kernels) or BF16 (tensor cores, precision "bf16"). The FP32 / BF16
// paths themselves are checked against the CPU reference in test_backend_dense.cc and
// test_backend_moe.cc. Edge cases: partial FP8 scale blocks (rows and columns not multiples of the
// block), MXFP4 rows whose last scale block is partial (cols % 32 != 0), code 8 (-0) decoding to
// +0, stacked experts as one view, a view whose shape differs from the op's (Error, not a crash).
#include "backend_test_util.h"
#include "core/dtype.h"
#include "core/status.h"
#include "kernels/weight_view.h"

namespace dsv41rt::testing {
namespace {

using kernels::WeightView;
using model::LayerWeights;
using model::Matrix;
using model::WeightFormat;

class BackendReleasedWeights : public BackendTest {
 protected:
  /// A random matrix [rows, cols] stored in `format` (block: FP8 scale block, square), with its
  /// decoded values. Scales 2^-12 .. 2^-2 (real checkpoints' range); FP8 codes avoid NaN.
  struct Stored {
    WeightFormat format;
    int32_t block = 0;
    int64_t rows = 0, cols = 0;
    std::vector<uint8_t> data, scale;
    std::vector<float> values;
  };
  Stored make(WeightFormat format, int32_t block, int64_t rows, int64_t cols) {
    Stored s{format, block, rows, cols, {}, {}, {}};
    WeightView v;
    v.format = format, v.block_rows = v.block_cols = block, v.rows = rows, v.cols = cols;
    if (format == WeightFormat::kBF16) {
      for (float f : normal(rows * cols, 0.05)) {
        const uint16_t b = bf16_bits(round_bf16(f));
        s.data.push_back(uint8_t(b & 0xFF)), s.data.push_back(uint8_t(b >> 8));
      }
    } else {
      s.data = random_bytes(v.data_bytes());
      if (format == WeightFormat::kFp8Block) {
        for (uint8_t& c : s.data) c = (c & 0x7F) == 0x7F ? uint8_t(c - 1) : c;
      }
      s.scale.resize(size_t(v.scale_bytes()));
      for (uint8_t& e : s.scale) e = uint8_t(randint(127 - 12, 127 - 2));
    }
    v.data = s.data.data(), v.scale = s.scale.data();
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) s.values.push_back(v.value(r, c));
    }
    return s;
  }
  /// `s` in backend b's memory, as stored (kept alive by `keep`).
  Matrix stored(Backend& b, const Stored& s, std::vector<Buffer<uint8_t>>& keep) {
    keep.push_back(upload(b, s.data));
    Matrix m{keep.back().get(), s.format, true};
    if (!s.scale.empty()) {
      keep.push_back(upload(b, s.scale));
      m.scale = keep.back().get();
    }
    m.block_rows = m.block_cols = s.block;
    m.rows = s.rows, m.cols = s.cols;
    return m;
  }
  /// The same values as FP32 (fp32 path) or BF16 (tensor-core path).
  Matrix plain(Backend& b, const Stored& s, bool bf16, std::vector<Buffer<uint8_t>>& keep) {
    std::vector<uint8_t> bytes;
    for (float v : s.values) {
      if (bf16) {
        const uint16_t h = f32_to_bf16(v);
        EXPECT_EQ(bf16_to_f32(h), v) << "a test value is not BF16-exact";
        bytes.push_back(uint8_t(h & 0xFF)), bytes.push_back(uint8_t(h >> 8));
      } else {
        const uint32_t u = std::bit_cast<uint32_t>(v);
        for (int i = 0; i < 4; ++i) bytes.push_back(uint8_t(u >> (8 * i)));
      }
    }
    keep.push_back(upload(b, bytes));
    return {keep.back().get(), bf16 ? WeightFormat::kBF16 : WeightFormat::kF32, true};
  }
};

struct FormatCase {
  WeightFormat format;
  int32_t block;
  const char* name;
};
const FormatCase kFormats[] = {{WeightFormat::kFp8Block, 32, "fp8 32x32"},
                               {WeightFormat::kFp8Block, 128, "fp8 128x128"},
                               {WeightFormat::kMxfp4, 0, "mxfp4"},
                               {WeightFormat::kBF16, 0, "bf16"}};

TEST_P(BackendReleasedWeights, LinearIsBitwiseTheSameValuesStoredPlain) {
  Backend& b = backend();
  struct Shape {
    int64_t m, groups, k, n;
  };
  // groups 0: linear; otherwise grouped_linear (wo_a-like). Partial blocks: n 200 / k 100.
  for (const Shape sh :
       {Shape{3, 0, 96, 200}, Shape{1, 0, 100, 70}, Shape{70, 0, 256, 64}, Shape{2, 4, 64, 32}}) {
    for (const FormatCase& f : kFormats) {
      const int64_t g = std::max<int64_t>(sh.groups, 1);
      SCOPED_TRACE(std::string(f.name) + " m " + std::to_string(sh.m) + " groups " +
                   std::to_string(sh.groups) + " k " + std::to_string(sh.k) + " n " +
                   std::to_string(sh.n));
      const Stored w = make(f.format, f.block, g * sh.n, sh.k);
      Buffer<float> x = upload(b, normal(sh.m * g * sh.k));
      for (const bool tc : {false, true}) {
        auto run = [&](const Matrix& mat) {
          Buffer<float> y = poisoned<float>(b, sh.m * g * sh.n);
          b.set_tensor_cores(tc);
          if (sh.groups == 0) {
            b.linear(x.get(), mat, sh.m, sh.k, sh.n, y.get(), false, b.stream(0));
          } else {
            b.grouped_linear(x.get(), mat, sh.m, g, sh.k, sh.n, y.get(), b.stream(0));
          }
          b.set_tensor_cores(false);
          return y.download();
        };
        std::vector<Buffer<uint8_t>> keep;
        const std::vector<float> got = run(stored(b, w, keep));
        EXPECT_TRUE(all_written(got));
        // Tensor cores read BF16 on CUDA; the CPU emulation of them reads FP32 values.
        EXPECT_TRUE(bitwise_equal(got, run(plain(b, w, tc && on_cuda(), keep))))
            << (tc ? "tensor cores" : "fp32");
      }
    }
  }
}

TEST_P(BackendReleasedWeights, MoeExpertsAreBitwiseTheSameValuesStoredPlain) {
  Backend& b = backend();
  // Routed experts MXFP4 (stacked: one view of E * I rows), the shared expert FP8 32 x 32, as in
  // the V4.1 release; then both BF16.
  const int64_t S = 6, H = 96, I = 64, E = 8, k = 3;
  std::vector<int32_t> idx;
  for (int64_t t = 0; t < S; ++t) {
    const std::vector<int64_t> perm = permutation(E);
    for (int64_t j = 0; j < k; ++j) idx.push_back(int32_t(t == 0 ? perm[0] : perm[j]));
  }
  Buffer<float> x = upload(b, normal(S * H, 2.0)), wt = upload(b, uniform(S * k, 0.1, 1.0));
  Buffer<int32_t> didx = upload(b, idx);
  for (const auto& [routed, shared] :
       {std::pair(kFormats[2], kFormats[0]), std::pair(kFormats[3], kFormats[3])}) {
    SCOPED_TRACE(std::string("routed ") + routed.name + ", shared " + shared.name);
    const Stored w1 = make(routed.format, routed.block, E * I, H);
    const Stored w3 = make(routed.format, routed.block, E * I, H);
    const Stored w2 = make(routed.format, routed.block, E * H, I);
    const Stored s1 = make(shared.format, shared.block, I, H);
    const Stored s3 = make(shared.format, shared.block, I, H);
    const Stored s2 = make(shared.format, shared.block, H, I);
    for (const bool tc : {false, true}) {
      auto run = [&](bool as_stored) {
        std::vector<Buffer<uint8_t>> keep;
        auto mat = [&](const Stored& s) {
          return as_stored ? stored(b, s, keep) : plain(b, s, tc && on_cuda(), keep);
        };
        LayerWeights L;
        L.w1 = mat(w1), L.w3 = mat(w3), L.w2 = mat(w2);
        L.shared_w1 = mat(s1), L.shared_w3 = mat(s3), L.shared_w2 = mat(s2);
        Buffer<float> y = poisoned<float>(b, S * H);
        ScratchArena scratch(b);
        b.set_tensor_cores(tc);
        b.moe_experts(x.get(), didx.get(), wt.get(), S, H, k, E, I, L, 10.0f, y.get(),
                      scratch.get(), b.stream(0));
        b.set_tensor_cores(false);
        return y.download();
      };
      const std::vector<float> got = run(true);
      EXPECT_TRUE(all_written(got));
      EXPECT_TRUE(bitwise_equal(got, run(false))) << (tc ? "tensor cores" : "fp32");
    }
  }
}

TEST_P(BackendReleasedWeights, ViewOfAnotherShapeIsAnError) {
  Backend& b = backend();
  const Stored w = make(WeightFormat::kFp8Block, 32, 64, 64);
  std::vector<Buffer<uint8_t>> keep;
  const Matrix m = stored(b, w, keep);
  Buffer<float> x = upload(b, normal(64)), y = poisoned<float>(b, 128);
  EXPECT_THROW(b.linear(x.get(), m, 1, 64, 128, y.get(), false, b.stream(0)), Error);
  EXPECT_THROW(b.linear(x.get(), m, 1, 32, 64, y.get(), false, b.stream(0)), Error);
  Matrix no_scale = m;
  no_scale.scale = nullptr;
  EXPECT_THROW(b.linear(x.get(), no_scale, 1, 64, 64, y.get(), false, b.stream(0)), Error);
}

DSV41RT_INSTANTIATE_BACKENDS(BackendReleasedWeights);

}  // namespace
}  // namespace dsv41rt::testing
