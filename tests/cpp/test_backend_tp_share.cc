// A tensor-parallel share of a matrix (Matrix::whole_rows, weights.h tensor_shard) multiplies to
// BITWISE the whole matrix's columns on every backend, in decode-sized forwards too: the CUDA
// decode GEMVs choose their split-K count from the matrix's width, and a share's is the whole
// matrix's. Shapes are picked so that a share alone would get another split count (the whole
// matrix has 4x the output tiles), in FP8 32 x 32 blocks (precision "fp8": the FP8 tensor-core
// GEMV; "bf16": the BF16 GEMV on the decoded codes) and BF16, for linear and grouped_linear (a
// share of the groups).
#include "backend_test_util.h"
#include "kernels/weight_view.h"

namespace dsv41rt::testing {
namespace {

using kernels::WeightView;
using model::Matrix;
using model::WeightFormat;

class BackendTpShare : public BackendTest {
 protected:
  // A random [rows, cols] matrix in `format` (FP8 blocks 32 x 32 or BF16) on b; bytes in keep.
  Matrix make(Backend& b, WeightFormat format, int64_t rows, int64_t cols,
              std::vector<Buffer<uint8_t>>& keep) {
    WeightView v;
    v.format = format, v.rows = rows, v.cols = cols;
    if (format == WeightFormat::kFp8Block) v.block_rows = v.block_cols = 32;
    std::vector<uint8_t> data = random_bytes(v.data_bytes()), scale;
    if (format == WeightFormat::kFp8Block) {
      for (uint8_t& c : data) c = (c & 0x7F) == 0x7F ? uint8_t(c - 1) : c;  // no NaN codes
      scale.resize(size_t(v.scale_bytes()));
      for (uint8_t& e : scale) e = uint8_t(randint(127 - 12, 127 - 4));
    } else {
      for (size_t i = 1; i < data.size(); i += 2) data[i] = uint8_t(0x3C + (data[i] & 0x81));
    }
    keep.push_back(upload(b, data));
    Matrix m{keep.back().get(), format, true};
    m.fp8_input = format == WeightFormat::kFp8Block;
    m.rows = rows, m.cols = cols;
    if (!scale.empty()) {
      keep.push_back(upload(b, scale));
      m.scale = keep.back().get(), m.block_rows = m.block_cols = 32;
    }
    if (format == WeightFormat::kBF16) m.rows = m.cols = 0;
    return m;
  }
  // Rows [begin, begin + n) of `whole` as the share tensor_shard makes of it.
  static Matrix share(const Matrix& whole, int64_t total, int64_t k, int64_t begin, int64_t n) {
    Matrix m = whole;
    const auto* base = static_cast<const uint8_t*>(whole.data);
    if (whole.format == WeightFormat::kFp8Block) {
      m.data = base + begin * k;
      m.scale = whole.scale + (begin / 32) * (k / 32);
      m.rows = n;
    } else {
      m.data = base + begin * k * 2;
    }
    m.whole_rows = total;
    return m;
  }
};

TEST_P(BackendTpShare, ShareColumnsAreBitwiseTheWholeMatrixs) {
  Backend& b = backend();
  struct Case {
    int64_t m, groups, k, n;  // groups 0: linear [n, k]; else grouped_linear of groups x [n, k]
  };
  for (const Case c : {Case{4, 0, 4096, 8192}, Case{1, 0, 2048, 4096}, Case{3, 8, 1024, 512}}) {
    for (const WeightFormat f : {WeightFormat::kFp8Block, WeightFormat::kBF16}) {
      for (const bool fp8 : {true, false}) {
        SCOPED_TRACE("m " + std::to_string(c.m) + " groups " + std::to_string(c.groups) +
                     (f == WeightFormat::kBF16 ? " bf16 weights" : " fp8 weights") +
                     (fp8 ? " fp8 acts" : ""));
        const int64_t g = std::max<int64_t>(c.groups, 1), rows = g * c.n;
        std::vector<Buffer<uint8_t>> keep;
        const Matrix whole = make(b, f, rows, c.k, keep);
        const std::vector<float> x = normal(c.m * g * c.k, 2.0);
        Buffer<float> dx = upload(b, x);
        b.set_tensor_cores(true);
        b.set_fp8_activations(fp8);
        b.set_forward_rows(c.m, true);
        // y [m, width]: linear over w's `width` rows, or grouped over groups [g0, g0 + gs) (each
        // share reads its own groups' columns of x, contiguous, as the runner passes its heads).
        auto run = [&](const Matrix& w, int64_t g0, int64_t gs, int64_t width) {
          Buffer<float> y = poisoned<float>(b, c.m * width);
          if (c.groups == 0) {
            b.linear(dx.get(), w, c.m, c.k, width, y.get(), false, b.stream(0));
          } else {
            std::vector<float> xs;
            for (int64_t i = 0; i < c.m; ++i) {
              const auto row = x.begin() + (i * g + g0) * c.k;
              xs.insert(xs.end(), row, row + gs * c.k);
            }
            Buffer<float> dxs = upload(b, xs);
            b.grouped_linear(dxs.get(), w, c.m, gs, c.k, c.n, y.get(), b.stream(0));
          }
          return y.download();
        };
        const std::vector<float> all = run(whole, 0, g, rows);
        ASSERT_TRUE(all_written(all));
        for (const int64_t P : {int64_t(2), int64_t(4)}) {
          const int64_t per = rows / P;  // output columns (weight rows) of one share
          for (int64_t r = 0; r < P; ++r) {
            const std::vector<float> got =
                run(share(whole, rows, c.k, r * per, per), r * g / P, g / P, per);
            std::vector<float> want;
            for (int64_t i = 0; i < c.m; ++i) {
              const auto row = all.begin() + i * rows + r * per;
              want.insert(want.end(), row, row + per);
            }
            EXPECT_TRUE(bitwise_equal(got, want)) << "rank " << r << " of " << P;
          }
        }
        b.set_forward_rows(1 << 20, false);
        b.set_fp8_activations(false);
        b.set_tensor_cores(false);
      }
    }
  }
}

DSV41RT_INSTANTIATE_BACKENDS(BackendTpShare);

}  // namespace
}  // namespace dsv41rt::testing
