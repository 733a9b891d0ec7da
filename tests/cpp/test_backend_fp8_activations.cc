// Precision "fp8" on the Backend's matrix ops (Backend::set_fp8_activations; spec 5.2): the input
// of a matrix the checkpoint stores FP8 / FP4 (Matrix::fp8_input) is rounded to BF16 and quantised
// to FP8 E4M3 in 1 x 32 blocks with power-of-two scales (kernels::cpu::fp8_act_qdq); the input of
// any other BF16-exact matrix is rounded to BF16 as under precision "bf16".
//
// Checked on every backend:
//   - outside decode-sized forwards: the op is BITWISE the precision-"bf16" op on the host-QDQ'd
//     x (the CUDA QDQ kernel is bitwise the CPU codec, and QDQ'd values are BF16-exact, so the
//     same kernels see the same values); BF16 matrices (fp8_input false) are untouched by the mode;
//   - decode-sized forwards (set_forward_rows(rows <= 64, ...)): CUDA runs FP8 32 x 32 blocks on
//   the FP8
//     tensor cores (kernels/cuda/decode_gemv_a8.cuh); checked against an FP64 sum over the QDQ'd
//     x within that header's bound: 2^-10 Σ|qx·w| per block for the tensor core's block sums plus
//     FP32 rounding of the promoted sum (γ_(k/32 + 66) Σ|qx·w|, splits included). The CPU
//     evaluates the same values in FP32 and must meet the same bound.
// The MoE op under "fp8" (hidden units quantised too) is checked against an interval reference in
// test_cuda_moe_decode.cc (kernel) and, end to end, by the GPU-vs-CPU-emulation model tests.
#include <cmath>

#include "backend_test_util.h"
#include "core/dtype.h"
#include "kernels/quant.h"
#include "kernels/weight_view.h"

namespace dsv41rt::testing {
namespace {

using kernels::WeightView;
using model::Matrix;
using model::WeightFormat;

class BackendFp8Activations : public BackendTest {
 protected:
  // A random [rows, cols] matrix stored in `format` (FP8 blocks 32 x 32, MXFP4, or BF16), its
  // bytes kept in `keep`, and its decoded values.
  Matrix make(Backend& b, WeightFormat format, int64_t rows, int64_t cols,
              std::vector<Buffer<uint8_t>>& keep, std::vector<float>& values) {
    WeightView v;
    v.format = format, v.rows = rows, v.cols = cols;
    std::vector<uint8_t> data, scale;
    if (format == WeightFormat::kBF16) {
      for (float f : normal(rows * cols, 0.05)) {
        const uint16_t h = bf16_bits(round_bf16(f));
        data.push_back(uint8_t(h & 0xFF)), data.push_back(uint8_t(h >> 8));
      }
    } else {
      if (format == WeightFormat::kFp8Block) v.block_rows = v.block_cols = 32;
      data = random_bytes(v.data_bytes());
      if (format == WeightFormat::kFp8Block) {
        for (uint8_t& c : data) c = (c & 0x7F) == 0x7F ? uint8_t(c - 1) : c;  // no NaN codes
      }
      scale.resize(size_t(v.scale_bytes()));
      for (uint8_t& e : scale) e = uint8_t(randint(127 - 12, 127 - 4));
    }
    v.data = data.data(), v.scale = scale.empty() ? nullptr : scale.data();
    values.clear();
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) values.push_back(v.value(r, c));
    }
    keep.push_back(upload(b, data));
    Matrix m{keep.back().get(), format, true};
    m.fp8_input = format != WeightFormat::kBF16;
    if (!scale.empty()) {
      keep.push_back(upload(b, scale));
      m.scale = keep.back().get();
    }
    m.block_rows = m.block_cols = v.block_rows;
    m.rows = rows, m.cols = cols;
    return m;
  }
  static std::vector<float> act_qdq(std::vector<float> x, int64_t rows, int64_t k) {
    kernels::cpu::fp8_act_qdq(x.data(), rows, k, x.data());
    return x;
  }
};

TEST_P(BackendFp8Activations, InputsOfFp8AndFp4MatricesAreQuantised) {
  Backend& b = backend();
  struct Shape {
    int64_t m, groups, k, n;
  };
  // groups 0: linear; otherwise grouped_linear. m 70: past the decode kernels (tiled GEMM).
  for (const Shape sh : {Shape{3, 0, 256, 96}, Shape{70, 0, 128, 64}, Shape{2, 4, 64, 32}}) {
    for (const WeightFormat f :
         {WeightFormat::kFp8Block, WeightFormat::kMxfp4, WeightFormat::kBF16}) {
      const int64_t g = std::max<int64_t>(sh.groups, 1), rows = sh.m * g;
      SCOPED_TRACE("format " + std::to_string(int(f)) + " m " + std::to_string(sh.m) + " groups " +
                   std::to_string(sh.groups) + " k " + std::to_string(sh.k));
      std::vector<Buffer<uint8_t>> keep;
      std::vector<float> values;
      const Matrix w = make(b, f, g * sh.n, sh.k, keep, values);
      const std::vector<float> x = normal(rows * sh.k, 2.0);
      auto run = [&](const std::vector<float>& in, bool fp8) {
        Buffer<float> dx = upload(b, in);
        Buffer<float> y = poisoned<float>(b, rows * sh.n);
        b.set_tensor_cores(true);
        b.set_fp8_activations(fp8);
        b.set_forward_rows(1 << 20, false);  // not decode-sized: the FP8 tensor-core GEMV stays out
        if (sh.groups == 0) {
          b.linear(dx.get(), w, sh.m, sh.k, sh.n, y.get(), false, b.stream(0));
        } else {
          b.grouped_linear(dx.get(), w, sh.m, g, sh.k, sh.n, y.get(), b.stream(0));
        }
        b.set_fp8_activations(false);
        b.set_tensor_cores(false);
        return y.download();
      };
      const std::vector<float> got = run(x, true);
      EXPECT_TRUE(all_written(got));
      if (w.fp8_input) {
        EXPECT_TRUE(bitwise_equal(got, run(act_qdq(x, rows, sh.k), false)))
            << "not the bf16 op on the QDQ'd activations";
        EXPECT_FALSE(bitwise_equal(got, run(x, false))) << "the mode changed nothing";
      } else {
        EXPECT_TRUE(bitwise_equal(got, run(x, false))) << "a BF16 matrix's input was quantised";
      }
    }
  }
}

TEST_P(BackendFp8Activations, DecodeSizedFp8BlocksMeetTheBlockSumBound) {
  Backend& b = backend();
  const int64_t k = 1280, n = 300;
  std::vector<Buffer<uint8_t>> keep;
  std::vector<float> w;
  const Matrix mat = make(b, WeightFormat::kFp8Block, n, k, keep, w);
  for (const int64_t m : {1, 8, 64}) {
    for (const bool acc : {false, true}) {
      SCOPED_TRACE("m " + std::to_string(m) + (acc ? " accumulate" : ""));
      const std::vector<float> x = normal(m * k, 2.0), y0 = normal(m * n);
      Buffer<float> dx = upload(b, x);
      Buffer<float> y = poisoned<float>(b, m * n);
      if (acc) y.upload(y0);
      b.set_tensor_cores(true);
      b.set_fp8_activations(true);
      b.set_forward_rows(m, false);
      b.linear(dx.get(), mat, m, k, n, y.get(), acc, b.stream(0));
      b.set_forward_rows(1 << 20, false);
      b.set_fp8_activations(false);
      b.set_tensor_cores(false);
      const std::vector<float> got = y.download(), xq = act_qdq(x, m, k);
      EXPECT_TRUE(all_written(got));
      std::vector<double> want, tol;
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          double sum = acc ? y0[i * n + j] : 0.0, mag = std::abs(sum);
          for (int64_t c = 0; c < k; ++c) {
            const double t = double(xq[i * k + c]) * w[j * k + c];
            sum += t, mag += std::abs(t);
          }
          want.push_back(sum);
          tol.push_back((0x1p-10 + 2 * gamma_n(k / 32 + 66)) * mag);
        }
      }
      EXPECT_TRUE(within(got, want, tol));
    }
  }
}

DSV41RT_INSTANTIATE_BACKENDS(BackendFp8Activations);

}  // namespace
}  // namespace dsv41rt::testing
