// Backend mHC ops: the hyper-connection mixer hc_mix (sigmoids and Sinkhorn), hc_collapse and
// hc_expand (contract: kernels/mhc.h; CUDA: kernels/cuda/mhc.cuh).
//
// CPU instance: hc_mix against a float64 mixer within the bound stated at the test; hc_collapse /
// hc_expand against the FP32 operation order their contract fixes, bitwise.
// CUDA instance, against the CPU backend: hc_mix |log cuda − log cpu| <= 2e-6 + 8·u·c per token
// (mhc.cuh: Σ f² in double as the CPU, the projection f·fn^T in another order, ~u·c per logit,
// passed to log(output) with gain <= ~3, and device expf <= 2 ulp; c below); hc_collapse /
// hc_expand bitwise (the header promises the CPU's order and roundings).
#include "backend_test_util.h"
#include "core/status.h"

namespace dsv41rt::testing {
namespace {

class BackendMhc : public BackendTest {};

// n = 6 runs the CUDA Sinkhorn's per-row loop; n <= 5 its one-warp version.

TEST_P(BackendMhc, HyperConnectionMixer) {
  struct Case {
    int64_t n, H;
  };
  for (const Case c : {Case{4, 1000}, Case{1, 64}, Case{4, 64}, Case{6, 40}}) {
    const int64_t S = 13, n = c.n, H = c.H, W = (2 + n) * n, K = n * H;
    const std::vector<float> X = normal(S * K, std::exp(double(randint(-2, 2))));
    const std::vector<float> base = normal(W, 0.5), scale = uniform(3, 0.5, 2.0);
    // fn = 0 makes the FP32 logits exact (z = base), isolating sigmoid and Sinkhorn.
    for (const auto& [zero_fn, iters] :
         {std::pair(false, 1), std::pair(false, 20), std::pair(true, 20)}) {
      SCOPED_TRACE("n " + std::to_string(n) + " H " + std::to_string(H) + " iters " +
                   std::to_string(iters) + (zero_fn ? " fn = 0" : ""));
      const std::vector<float> fn =
          zero_fn ? std::vector<float>(size_t(W * K), 0.0f) : normal(W * K, 0.02);
      auto run = [&](Backend& b) {
        Buffer<float> dX = upload(b, X), dfn = upload(b, fn), dbase = upload(b, base),
                      dscale = upload(b, scale);
        Buffer<float> pre = poisoned<float>(b, S * n), post = poisoned<float>(b, S * n),
                      comb = poisoned<float>(b, S * n * n);
        ScratchArena scratch(b);
        b.hc_mix(dX.get(), dfn.get(), dbase.get(), dscale.get(), S, n, H, 1e-20f, 1e-6f, iters,
                 pre.get(), post.get(), comb.get(), scratch.get(), b.stream(0));
        std::vector<float> all = pre.download(), p = post.download(), cb = comb.download();
        all.insert(all.end(), p.begin(), p.end());
        all.insert(all.end(), cb.begin(), cb.end());
        return all;  // [pre | post | comb]
      };
      const std::vector<float> got = run(backend());
      EXPECT_TRUE(all_written(got));
      // Float64 mixer per token; c = max_j Σ|f·fn_j| · r · |scale_j| bounds the logits' scale.
      std::vector<double> want(got.size());
      std::vector<double> c_tok(static_cast<size_t>(S));
      for (int64_t s = 0; s < S; ++s) {
        const float* f = &X[s * K];
        double ss = 0;
        for (int64_t i = 0; i < K; ++i) ss += double(f[i]) * f[i];
        const double r = 1.0 / std::sqrt(ss / double(K) + 1e-20);
        std::vector<double> z(static_cast<size_t>(W));
        for (int64_t j = 0; j < W; ++j) {
          double dot = 0, abs_dot = 0;
          for (int64_t i = 0; i < K; ++i)
            dot += double(f[i]) * fn[j * K + i], abs_dot += std::abs(double(f[i]) * fn[j * K + i]);
          const double sc = scale[j < n ? 0 : (j < 2 * n ? 1 : 2)];
          z[j] = base[j] + dot * r * sc;
          c_tok[s] = std::max(c_tok[s], abs_dot * r * std::abs(sc));
        }
        for (int64_t i = 0; i < n; ++i) {
          want[s * n + i] = 1.0 / (1.0 + std::exp(-z[i])) + 1e-6;
          want[S * n + s * n + i] = 2.0 / (1.0 + std::exp(-z[n + i]));
        }
        std::vector<double> C(z.begin() + 2 * n, z.end()), sum(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) {  // softmax over o, + eps
          double mx = -INFINITY, t = 0;
          for (int64_t o = 0; o < n; ++o) mx = std::max(mx, C[i * n + o]);
          for (int64_t o = 0; o < n; ++o) t += C[i * n + o] = std::exp(C[i * n + o] - mx);
          for (int64_t o = 0; o < n; ++o) C[i * n + o] = C[i * n + o] / t + 1e-6;
        }
        for (int it = 0; it < 2 * iters - 1; ++it) {  // column, then (row, column) x (iters - 1)
          const bool cols = it % 2 == 0;
          std::fill(sum.begin(), sum.end(), 1e-6);
          for (int64_t i = 0; i < n; ++i)
            for (int64_t o = 0; o < n; ++o) sum[cols ? o : i] += C[i * n + o];
          for (int64_t i = 0; i < n; ++i)
            for (int64_t o = 0; o < n; ++o) C[i * n + o] /= sum[cols ? o : i];
        }
        std::copy(C.begin(), C.end(), &want[2 * S * n + s * n * n]);
      }
      const std::vector<float> cpu_out = on_cuda() ? run(cpu()) : std::vector<float>();
      for (size_t i = 0; i < got.size(); ++i) {
        const int64_t s = int64_t(i) < 2 * S * n ? (int64_t(i) % (S * n)) / n
                                                 : (int64_t(i) - 2 * S * n) / (n * n);
        // CPU vs float64: the FP32 logits are off by <= e = γ_K·c + 8u·c (8-lane dot, then r,
        // scale and base); sigmoid / softmax / Sinkhorn pass that to log(output) with gain <= 3,
        // and the Sinkhorn's FP32 roundings add <= (n + 2)·u per normalisation, accumulating at
        // most linearly (each normalisation is non-expansive in log space).
        const double tol =
            on_cuda() ? 2e-6 + 8 * kU * c_tok[s]
                      : 3 * (gamma_n(K) + 8 * kU) * c_tok[s] + (16 + 4 * iters * (n + 2)) * kU;
        const double ref = on_cuda() ? double(cpu_out[i]) : want[i];
        ASSERT_LE(std::abs(std::log(double(got[i])) - std::log(ref)), tol) << "output " << i;
      }
    }
  }
}

TEST_P(BackendMhc, HyperConnectionCollapseAndExpandBitwise) {
  struct Case {
    int64_t S, n, H;
  };
  for (const Case c : {Case{1, 1, 1}, Case{23, 4, 96}, Case{5, 7, 7168}}) {
    SCOPED_TRACE("S " + std::to_string(c.S) + " n " + std::to_string(c.n) + " H " +
                 std::to_string(c.H));
    const int64_t S = c.S, n = c.n, H = c.H;
    const std::vector<float> X = normal(S * n * H), w = normal(S * n), y = normal(S * H);
    const std::vector<float> post = uniform(S * n, 0, 2), comb = uniform(S * n * n, 0, 1);
    auto run = [&](Backend& b) {
      Buffer<float> dX = upload(b, X), dw = upload(b, w), dy = upload(b, y),
                    dpost = upload(b, post), dcomb = upload(b, comb);
      Buffer<float> u = poisoned<float>(b, S * H), out = poisoned<float>(b, S * n * H);
      b.hc_collapse(dX.get(), dw.get(), S, n, H, u.get(), b.stream(0));
      b.hc_expand(dX.get(), dy.get(), dpost.get(), dcomb.get(), S, n, H, out.get(), b.stream(0));
      return std::pair(u.download(), out.download());
    };
    const auto [u, out] = run(backend());
    if (on_cuda()) {
      const auto [cu, cout] = run(cpu());
      EXPECT_TRUE(bitwise_equal(u, cu)) << "hc_collapse";
      EXPECT_TRUE(bitwise_equal(out, cout)) << "hc_expand";
      continue;
    }
    // The contract's FP32 order: products rounded, summed over i ascending from 0; expand adds
    // post·y last.
    std::vector<float> want_u(static_cast<size_t>(S * H), 0.0f),
        want_out(static_cast<size_t>(S * n * H), 0.0f);
    for (int64_t s = 0; s < S; ++s) {
      for (int64_t h = 0; h < H; ++h) {
        for (int64_t i = 0; i < n; ++i) {
          const float p = w[s * n + i] * X[(s * n + i) * H + h];
          want_u[s * H + h] += p;
        }
        for (int64_t o = 0; o < n; ++o) {
          float acc = 0.0f;
          for (int64_t i = 0; i < n; ++i) {
            const float p = comb[(s * n + i) * n + o] * X[(s * n + i) * H + h];
            acc += p;
          }
          const float upd = post[s * n + o] * y[s * H + h];
          want_out[(s * n + o) * H + h] = upd + acc;
        }
      }
    }
    EXPECT_TRUE(bitwise_equal(u, want_u)) << "hc_collapse";
    EXPECT_TRUE(bitwise_equal(out, want_out)) << "hc_expand";
  }
}

// A token's mixer outputs do not depend on the other tokens of the batch (the CUDA projection
// runs in fixed K chunks whatever S is, and groups tokens 8 to a block): each row alone is bitwise
// the row inside the batch (13 rows: a full group of 8 and a partial one).
TEST_P(BackendMhc, MixerRowsDoNotDependOnTheBatch) {
  Backend& b = backend();
  const int64_t S = 13, n = 4, H = 1280, W = (2 + n) * n, K = n * H;
  const std::vector<float> X = normal(S * K), fn = normal(W * K, 0.02), base = normal(W, 0.5),
                           scale = uniform(3, 0.5, 2.0);
  Buffer<float> dfn = upload(b, fn), dbase = upload(b, base), dscale = upload(b, scale);
  auto run = [&](int64_t s0, int64_t rows) {
    Buffer<float> dX = upload(b, std::vector<float>(&X[s0 * K], &X[(s0 + rows) * K]));
    Buffer<float> pre = poisoned<float>(b, rows * n), post = poisoned<float>(b, rows * n),
                  comb = poisoned<float>(b, rows * n * n);
    ScratchArena scratch(b);
    b.hc_mix(dX.get(), dfn.get(), dbase.get(), dscale.get(), rows, n, H, 1e-6f, 1e-6f, 20,
             pre.get(), post.get(), comb.get(), scratch.get(), b.stream(0));
    std::vector<float> all = pre.download(), p = post.download(), c = comb.download();
    all.insert(all.end(), p.begin(), p.end());
    all.insert(all.end(), c.begin(), c.end());
    return all;  // [pre | post | comb]
  };
  const std::vector<float> batch = run(0, S);
  for (int64_t s = 0; s < S; ++s) {
    const std::vector<float> alone = run(s, 1);
    std::vector<float> inside;
    for (int64_t i = 0; i < n; ++i) inside.push_back(batch[s * n + i]);
    for (int64_t i = 0; i < n; ++i) inside.push_back(batch[S * n + s * n + i]);
    for (int64_t i = 0; i < n * n; ++i) inside.push_back(batch[2 * S * n + s * n * n + i]);
    EXPECT_TRUE(bitwise_equal(alone, inside)) << "token " << s;
  }
}

// V4's hyper-head (hc_head_pre): the mixer's pre for a head of n rows, bitwise the pre of hc_mix
// given those rows (kernels/mhc.h). A V4-only op: a backend without V4 ops refuses it by name.
TEST_P(BackendMhc, HyperHeadIsTheMixersPre) {
  Backend& b = backend();
  const int64_t S = 13, n = 4, H = 64, W = (2 + n) * n, K = n * H;
  const std::vector<float> X = normal(S * K), head_fn = normal(n * K, 0.02),
                           head_base = normal(n, 0.5), head_scale = uniform(1, 0.5, 2.0);
  std::vector<float> fn(W * K, 0.0f), base(W, 0.0f), scale = {head_scale[0], 1.0f, 1.0f};
  std::copy(head_fn.begin(), head_fn.end(), fn.begin());
  std::copy(head_base.begin(), head_base.end(), base.begin());
  Buffer<float> dX = upload(b, X), dhfn = upload(b, head_fn), dhbase = upload(b, head_base),
                dhscale = upload(b, head_scale);
  Buffer<float> pre = poisoned<float>(b, S * n);
  if (!b.has_v4_ops()) {
    try {
      b.hc_head_pre(dX.get(), dhfn.get(), dhbase.get(), dhscale.get(), S, n, H, 1e-6f, 1e-6f,
                    pre.get(), b.stream(0));
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), StatusCode::kUnsupported);
      EXPECT_NE(std::string(e.what()).find("hc_head_pre"), std::string::npos) << e.what();
    }
    return;
  }
  b.hc_head_pre(dX.get(), dhfn.get(), dhbase.get(), dhscale.get(), S, n, H, 1e-6f, 1e-6f, pre.get(),
                b.stream(0));
  Buffer<float> dfn = upload(b, fn), dbase = upload(b, base), dscale = upload(b, scale);
  Buffer<float> mpre = poisoned<float>(b, S * n), post = poisoned<float>(b, S * n),
                comb = poisoned<float>(b, S * n * n);
  ScratchArena scratch(b);
  b.hc_mix(dX.get(), dfn.get(), dbase.get(), dscale.get(), S, n, H, 1e-6f, 1e-6f, 1, mpre.get(),
           post.get(), comb.get(), scratch.get(), b.stream(0));
  EXPECT_TRUE(bitwise_equal(pre.download(), mpre.download()));
}

TEST_P(BackendMhc, RejectsBadSizes) {
  Backend& be = backend();
  Buffer<float> f = upload(be, normal(64));
  const Stream s = be.stream(0);
  ScratchArena scratch(be);
  EXPECT_THROW(be.hc_mix(f.get(), f.get(), f.get(), f.get(), 1, 2, 4, 0, 0, /*iters=*/0, f.get(),
                         f.get(), f.get(), scratch.get(), s),
               Error);
  EXPECT_THROW(be.hc_collapse(f.get(), f.get(), 1, /*n=*/0, 4, f.get(), s), Error);
  EXPECT_THROW(be.hc_expand(f.get(), f.get(), f.get(), f.get(), 1, 2, /*H=*/0, f.get(), s), Error);
}

DSV41RT_INSTANTIATE_BACKENDS(BackendMhc);

}  // namespace
}  // namespace dsv41rt::testing
