// Backend dense ops: linear / grouped_linear (FP32 weights, BF16 weights on CUDA cores, BF16
// tensor cores), rms_norm and apply_rope (contracts: kernels/linear.h, rms_norm.h, rope.h; the mHC
// ops: test_backend_mhc.cc).
//
// CPU instance: naive float64 references written here, within the FP32 rounding bound stated at
// each test (γ_n as in backend_test_util.h).
// CUDA instance: the CPU backend on the same inputs, with the bounds of the CUDA headers:
//   linear, grouped_linear: max|cuda − cpu| <= 1e-5 · max|cpu| (kernels/cuda/linear.cuh: FP32
//     sums of k products in another order, "~1e-6 relative"); BF16 weights on CUDA cores are
//     bitwise the FP32-weight result (same header); tensor cores against the CPU's emulation
//     (set_tensor_cores(true) on both: BF16-rounded activations, exact products, FP32 sums in
//     another order; the tiled GEMM or, for k % 8 == 0, the wgmma one): the same 1e-5.
//   rms_norm: |cuda − cpu| <= 1e-5 · |cpu| per element (each output is x·r·w with one per-row r
//     whose FP32 sum of squares runs in another order: a few ulp).
//   apply_rope: |cuda − cpu| <= 5e-7 · (|a| + |b|) per pair: device cosf/sinf (<= 2 ulp) against
//     glibc (<= 1 ulp), i.e. <= 1.8e-7 in c and s, plus one rounding of each product and sum.
#include "backend_test_util.h"
#include "core/status.h"

namespace dsv41rt::testing {
namespace {

using model::Matrix;
using model::WeightFormat;

class BackendDense : public BackendTest {};

TEST_P(BackendDense, LinearAndGroupedLinearOnEveryWeightPath) {
  struct Case {
    int64_t m, groups, k, n;
  };
  // groups == 0: linear; otherwise grouped_linear (8 groups of 4096 -> 64 is wo_a's grouping).
  const Case cases[] = {{1, 0, 1, 1},
                        {3, 0, 7, 5},
                        {33, 0, 100, 65},
                        {64, 0, 4096, 96},
                        {130, 0, 37, 257},
                        {1, 1, 1, 1},
                        {5, 8, 64, 32},
                        {3, 8, 4096, 64},
                        // CUDA: the wgmma GEMM (k % 8 == 0, tiles cut by m and n)
                        {200, 0, 264, 300},
                        {150, 4, 64, 72}};
  for (const Case& c : cases) {
    const int64_t g = std::max<int64_t>(c.groups, 1), m = c.m, k = c.k, n = c.n;
    SCOPED_TRACE("m " + std::to_string(m) + " groups " + std::to_string(c.groups) + " k " +
                 std::to_string(k) + " n " + std::to_string(n));
    const std::vector<float> x = normal(m * g * k), y0 = normal(m * g * n);
    // BF16-exact weights (as the checkpoint's), so one set of values serves every path.
    std::vector<float> w = normal(g * n * k, 1.0 / std::sqrt(double(k)));
    std::vector<uint16_t> w_bits;
    for (float& v : w) v = round_bf16(v), w_bits.push_back(bf16_bits(v));
    // y for x rows [row0, row0 + rows) on backend b.
    auto run = [&](Backend& b, bool bf16_weights, bool tensor_cores, bool accumulate, int64_t row0,
                   int64_t rows) {
      b.set_tensor_cores(tensor_cores);
      Buffer<float> dx = upload(b, std::vector<float>(&x[row0 * g * k], &x[(row0 + rows) * g * k]));
      Buffer<float> w32 = upload(b, w);
      Buffer<uint16_t> w16 = upload(b, w_bits);
      const Matrix mat = bf16_weights ? Matrix{w16.get(), WeightFormat::kBF16, true}
                                      : Matrix{w32.get(), WeightFormat::kF32, true};
      Buffer<float> y = poisoned<float>(b, rows * g * n);
      if (accumulate) y.upload(std::vector<float>(&y0[row0 * g * n], &y0[(row0 + rows) * g * n]));
      if (c.groups == 0) {
        b.linear(dx.get(), mat, rows, k, n, y.get(), accumulate, b.stream(0));
      } else {
        b.grouped_linear(dx.get(), mat, rows, g, k, n, y.get(), b.stream(0));
      }
      b.set_tensor_cores(false);
      return y.download();
    };
    for (const bool tc : {false, true}) {
      for (const bool acc :
           c.groups == 0 ? std::vector<bool>{false, true} : std::vector<bool>{false}) {
        SCOPED_TRACE(std::string(tc ? "tensor cores" : "fp32") + (acc ? ", accumulate" : ""));
        const std::vector<float> got =
            run(backend(), /*bf16_weights=*/on_cuda() && tc, tc, acc, 0, m);
        EXPECT_TRUE(all_written(got));
        // Rows do not depend on the batch (both headers): the first and last row alone.
        for (const int64_t r : {int64_t(0), m - 1}) {
          const std::vector<float> alone = run(backend(), on_cuda() && tc, tc, acc, r, 1);
          EXPECT_TRUE(
              bitwise_equal(alone, std::vector<float>(&got[r * g * n], &got[(r + 1) * g * n])))
              << "row " << r << " alone";
        }
        if (on_cuda()) {
          EXPECT_LE(rel_error(got, run(cpu(), false, tc, acc, 0, m)), 1e-5);
          if (!tc) {
            EXPECT_TRUE(bitwise_equal(run(backend(), /*bf16_weights=*/true, false, acc, 0, m), got))
                << "BF16 weights on CUDA cores";
          }
          continue;
        }
        // Float64 of the values the GEMM multiplies (x rounded to BF16 in the emulated
        // tensor-core mode); any-order FP32 dot: |error| <= γ_{k+1} (Σ|x·w| + |y0|).
        std::vector<double> want(got.size()), tol(got.size());
        for (int64_t r = 0; r < m; ++r) {
          for (int64_t gi = 0; gi < g; ++gi) {
            for (int64_t o = 0; o < n; ++o) {
              double dot = 0, abs_dot = 0;
              for (int64_t i = 0; i < k; ++i) {
                const double xv =
                    tc ? round_bf16(x[(r * g + gi) * k + i]) : x[(r * g + gi) * k + i];
                dot += xv * w[(gi * n + o) * k + i],
                    abs_dot += std::abs(xv * w[(gi * n + o) * k + i]);
              }
              const int64_t at = (r * g + gi) * n + o;
              want[at] = dot + (acc ? y0[at] : 0.0);
              tol[at] = gamma_n(k + 1) * (abs_dot + (acc ? std::abs(y0[at]) : 0.0));
            }
          }
        }
        EXPECT_TRUE(within(got, want, tol));
      }
    }
  }
}

TEST_P(BackendDense, RmsNorm) {
  struct Case {
    int64_t rows, dim;
  };
  for (const Case c : {Case{1, 64}, Case{7, 512}, Case{33, 7168}, Case{3, 100}}) {
    SCOPED_TRACE("rows " + std::to_string(c.rows) + " dim " + std::to_string(c.dim));
    const std::vector<float> x = normal(c.rows * c.dim, std::exp(double(randint(-3, 3))));
    const std::vector<float> weight = normal(c.dim);
    for (const bool weighted : {true, false}) {
      const float eps = weighted ? 1e-20f : 1e-6f;
      auto run = [&](Backend& b, bool in_place) {
        Buffer<float> dx = upload(b, x), dw = upload(b, weight);
        Buffer<float> y = in_place ? dx : poisoned<float>(b, c.rows * c.dim);
        b.rms_norm(dx.get(), weighted ? dw.get() : nullptr, c.rows, c.dim, eps, y.get(),
                   b.stream(0));
        return y.download();
      };
      const std::vector<float> got = run(backend(), false);
      EXPECT_TRUE(bitwise_equal(run(backend(), true), got)) << "y aliasing x";
      std::vector<double> want(got.size()), tol(got.size());
      const std::vector<float> cpu_y = on_cuda() ? run(cpu(), false) : std::vector<float>();
      for (int64_t r = 0; r < c.rows; ++r) {
        double ss = 0;
        for (int64_t i = 0; i < c.dim; ++i) ss += double(x[r * c.dim + i]) * x[r * c.dim + i];
        const double inv = 1.0 / std::sqrt(ss / double(c.dim) + double(eps));
        for (int64_t i = 0; i < c.dim; ++i) {
          const int64_t at = r * c.dim + i;
          want[at] = on_cuda() ? cpu_y[at] : x[at] * inv * (weighted ? weight[i] : 1.0);
          // CPU: the squares (u), one rounding of the FP64 sum (u), mean, +eps, sqrt and 1/ (4u)
          // give r within ~4u; x·r and w·v add 2u: 8u covers it. CUDA: 1e-5 relative (header).
          tol[at] = (on_cuda() ? 1e-5 : 8 * kU) * std::abs(want[at]);
        }
      }
      EXPECT_TRUE(within(got, want, tol)) << (weighted ? "weighted" : "no weight");
    }
  }
}

// A row's bits do not depend on how many rows there are (the CUDA backend takes a split kernel for
// up to 64 rows and one block per row past that; both promise the same arithmetic).
TEST_P(BackendDense, RmsNormRowsDoNotDependOnTheBatch) {
  for (const int64_t dim : {int64_t(20480), int64_t(300), int64_t(5)}) {
    const int64_t rows = 70;
    const std::vector<float> x = normal(rows * dim), weight = normal(dim);
    auto run = [&](const float* xs, int64_t n) {
      Buffer<float> dx = upload(backend(), std::vector<float>(xs, xs + n * dim));
      Buffer<float> dw = upload(backend(), weight);
      Buffer<float> y = poisoned<float>(backend(), n * dim);
      backend().rms_norm(dx.get(), dw.get(), n, dim, 1e-6f, y.get(), backend().stream(0));
      return y.download();
    };
    const std::vector<float> all = run(x.data(), rows);
    for (const int64_t r : {int64_t(0), int64_t(41), rows - 1}) {
      const std::vector<float> alone = run(&x[r * dim], 1);
      EXPECT_TRUE(bitwise_equal(
          alone, std::vector<float>(all.begin() + r * dim, all.begin() + (r + 1) * dim)))
          << "dim " << dim << " row " << r;
    }
  }
}

TEST_P(BackendDense, ApplyRopeForwardAndInverse) {
  struct Case {
    int64_t rows, heads, head_dim, rope_dim;
  };
  // 512/64 is the release's head: the last 64 channels rotate.
  for (const Case c :
       {Case{1, 1, 2, 2}, Case{37, 3, 40, 16}, Case{19, 8, 512, 64}, Case{5, 2, 64, 64}}) {
    SCOPED_TRACE("head_dim " + std::to_string(c.head_dim) + " rope_dim " +
                 std::to_string(c.rope_dim));
    const int64_t pairs = c.rope_dim / 2, n = c.rows * c.heads * c.head_dim;
    const std::vector<float> x = normal(n, 3.0);
    std::vector<int64_t> pos(static_cast<size_t>(c.rows));
    for (int64_t& p : pos) p = randint(0, 1 << 20);
    pos[0] = 0;
    std::vector<float> inv_freq(static_cast<size_t>(pairs));
    for (int64_t k = 0; k < pairs; ++k)
      inv_freq[k] = float(std::pow(160000.0, -2.0 * double(k) / double(c.rope_dim)));
    for (const bool inverse : {false, true}) {
      auto run = [&](Backend& b) {
        Buffer<float> dx = upload(b, x), df = upload(b, inv_freq);
        Buffer<int64_t> dp = upload(b, pos);
        b.apply_rope(dx.get(), c.rows, c.heads, c.head_dim, c.rope_dim, dp.get(), df.get(), inverse,
                     b.stream(0));
        return dx.download();
      };
      const std::vector<float> got = run(backend());
      const std::vector<float> cpu_y = on_cuda() ? run(cpu()) : std::vector<float>();
      std::vector<double> want(static_cast<size_t>(n)), tol(static_cast<size_t>(n));
      for (int64_t r = 0; r < c.rows; ++r) {
        for (int64_t h = 0; h < c.heads; ++h) {
          const int64_t base = (r * c.heads + h) * c.head_dim, off = c.head_dim - c.rope_dim;
          for (int64_t i = 0; i < off; ++i)
            want[base + i] = x[base + i], tol[base + i] = 0;  // untouched
          for (int64_t k = 0; k < pairs; ++k) {
            const int64_t at = base + off + 2 * k;
            const double a = x[at], b = x[at + 1];
            // The angle is the FP32 product the contract fixes; cos/sin in FP64. CPU: libm's
            // cosf/sinf within 1 ulp, each product and the sum rounded: <= 4u (|a| + |b|).
            const double phi = float(float(pos[r]) * inv_freq[k]);
            const double co = std::cos(phi), si = inverse ? -std::sin(phi) : std::sin(phi);
            want[at] = on_cuda() ? cpu_y[at] : a * co - b * si;
            want[at + 1] = on_cuda() ? cpu_y[at + 1] : a * si + b * co;
            tol[at] = tol[at + 1] = (on_cuda() ? 5e-7 : 4 * kU) * (std::abs(a) + std::abs(b));
          }
        }
      }
      EXPECT_TRUE(within(got, want, tol)) << (inverse ? "inverse" : "forward");
    }
  }
}

TEST_P(BackendDense, RejectsBadSizes) {
  // Not linear / grouped_linear: their CPU reference checks no sizes (CUDA rejects negative ones),
  // so there is no shared error behaviour to test.
  Backend& be = backend();
  Buffer<float> f = upload(be, normal(64));
  Buffer<int64_t> pos = upload(be, std::vector<int64_t>(4, 1));
  const Stream s = be.stream(0);
  EXPECT_THROW(be.rms_norm(f.get(), nullptr, 2, /*dim=*/0, 1e-6f, f.get(), s), Error);
  EXPECT_THROW(be.apply_rope(f.get(), 2, 1, 8, /*rope_dim=*/3, pos.get(), f.get(), false, s),
               Error);
}

DSV41RT_INSTANTIATE_BACKENDS(BackendDense);

}  // namespace
}  // namespace dsv41rt::testing
