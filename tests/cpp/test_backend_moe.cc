// Backend MoE ops: the score router and the routed + shared clamped-SwiGLU experts on every
// weight path (contract: kernels/moe.h; CUDA: kernels/cuda/moe.cuh, moe_grouped.cuh).
//
// moe_route. CPU instance against float64: a selection is accepted iff it is the top-k of the
//   exact choice values up to their FP32 rounding bound δ (so it is exact wherever the gaps exceed
//   the rounding), an exact tie (two identical gate rows and biases) goes to the lower expert, and
//   the weights are within their rounding bound. CUDA against the CPU: the same experts exactly
//   (moe.cuh: the CPU's 8-lane FP32 logits, softplus through FP64, so only a last-ulp exp/log1p
//   difference at a 1-ulp near-tie could flip a choice; ~1e-7 per token), weights <= 1e-5 relative.
// moe_experts. FP32 weights: CPU against float64 within the bound built below; CUDA against the
//   CPU <= 1e-5 · max|cpu| (FP32 dot products in another order). BF16 weights on CUDA cores (the
//   split kernels): bitwise the FP32-weight result (BF16 widens exactly; same dot products, same
//   slot order). Tensor cores (set_tensor_cores(true), BF16 weights) against the CPU's emulation
//   (x and the hidden units rounded to BF16), and the CPU's emulation against a float64 one, within
//   the bound built in the test: FP32 sums, plus one BF16 step on the hidden units whose FP32 value
//   may round across a BF16 boundary.
#include <algorithm>
#include <cmath>

#include "backend_test_util.h"
#include "core/status.h"
#include "kernels/moe.h"

namespace dsv41rt::testing {
namespace {

using model::LayerWeights;
using model::Matrix;
using model::WeightFormat;

class BackendMoe : public BackendTest {};

TEST_P(BackendMoe, RouteTopKOfSqrtSoftplusPlusBias) {
  struct Case {
    int64_t S, H, E, k;
  };
  // bench-40's router (32 experts over H 5120), H with a tail past the last chunk of 8 (and not a
  // multiple of 4: the CUDA kernel's scalar staging), and the release's router: 384 experts, 6 per
  // token (the CUDA kernel stages those rows in several column chunks).
  // From 384 tokens the CUDA backend routes tiles of 16 tokens (moe_route_tiled.cu): 400 and 385
  // tokens (a partial tile), 390 tokens at bench-40's shape, 40 experts (a partial second pass of
  // 32) with a tail, and 384 experts (12 passes). Below: 64 tokens (a decode batch) by clusters.
  for (const Case c : {Case{64, 96, 16, 4}, Case{7, 32, 8, 1}, Case{33, 64, 32, 6},
                       Case{2, 5120, 32, 6}, Case{3, 1029, 40, 5}, Case{5, 4096, 384, 6},
                       Case{64, 5120, 32, 6}, Case{400, 96, 16, 4}, Case{385, 64, 32, 6},
                       Case{390, 5120, 32, 6}, Case{385, 1029, 40, 5}, Case{385, 512, 384, 6}}) {
    const int64_t S = c.S, H = c.H, E = c.E, k = c.k, tie = E / 2;
    std::vector<float> x = normal(S * H), gate = normal(E * H, H < 1000 ? 0.2 : 0.02),
                       bias = normal(E, 0.2);
    for (int64_t h = 0; h < H; ++h) gate[h] *= 40.0f;    // past softplus' threshold on some tokens
    std::copy_n(&gate[tie * H], H, &gate[(E - 1) * H]);  // an exact tie: the lower id first
    bias[E - 1] = bias[tie];
    struct Variant {
      bool use_bias;
      float scale;
      bool normalize;
    };
    for (const Variant v :
         {Variant{true, 1.5f, true}, Variant{false, 1.0f, true}, Variant{true, 2.5f, false}}) {
      SCOPED_TRACE("E " + std::to_string(E) + " k " + std::to_string(k) +
                   (v.use_bias ? " bias" : "") + (v.normalize ? " normalize" : ""));
      auto run = [&](Backend& b) {
        Buffer<float> dx = upload(b, x), dg = upload(b, gate), db = upload(b, bias);
        Buffer<int32_t> idx = poisoned<int32_t>(b, S * k, kIndexPoison);
        Buffer<float> weight = poisoned<float>(b, S * k);
        b.moe_route(dx.get(), dg.get(), v.use_bias ? db.get() : nullptr, S, H, E, k, v.scale,
                    v.normalize, idx.get(), weight.get(), b.stream(0));
        return std::pair(idx.download(), weight.download());
      };
      const auto [idx, weight] = run(backend());
      if (on_cuda()) {
        const auto [cpu_idx, cpu_weight] = run(cpu());
        EXPECT_TRUE(bitwise_equal(idx, cpu_idx));
        EXPECT_LE(rel_error(weight, cpu_weight), 1e-5);
        continue;
      }
      for (int64_t t = 0; t < S; ++t) {
        // s_e = sqrt(softplus(l_e)): l is an FP32 dot (<= γ_H Σ|x·g|), d s / d l <= 1/2, then a
        // few roundings: δ_e = γ_H Σ|x·g| / 2 + 4u·s_e + u·|choice_e|.
        std::vector<double> s(static_cast<size_t>(E)), choice(static_cast<size_t>(E)),
            delta(static_cast<size_t>(E));
        for (int64_t e = 0; e < E; ++e) {
          double l = 0, abs_l = 0;
          for (int64_t h = 0; h < H; ++h)
            l += double(x[t * H + h]) * gate[e * H + h],
                abs_l += std::abs(double(x[t * H + h]) * gate[e * H + h]);
          s[e] = std::sqrt(l > 20 ? l : std::log1p(std::exp(l)));
          choice[e] = s[e] + (v.use_bias ? bias[e] : 0.0);
          delta[e] = gamma_n(H) * abs_l / 2 + 4 * kU * s[e] + kU * std::abs(choice[e]);
        }
        const int32_t* it = &idx[t * k];
        std::vector<bool> taken(static_cast<size_t>(E), false);
        for (int64_t j = 0; j < k; ++j) {
          ASSERT_TRUE(it[j] >= 0 && it[j] < E && !taken[it[j]]) << "token " << t << " slot " << j;
          taken[it[j]] = true;
          if (j > 0) {
            EXPECT_GE(choice[it[j - 1]] + delta[it[j - 1]] + delta[it[j]], choice[it[j]])
                << "order, token " << t;
          }
        }
        for (int64_t e = 0; e < E; ++e) {
          if (!taken[e]) {
            EXPECT_LE(choice[e], choice[it[k - 1]] + delta[e] + delta[it[k - 1]])
                << "expert " << e << " left out, token " << t;
          }
        }
        const auto pos_tie = std::find(it, it + k, tie), pos_last = std::find(it, it + k, E - 1);
        if (pos_last != it + k) {
          EXPECT_LT(pos_tie, pos_last) << "tie not to the lower id, token " << t;
        }
        // Weights from the chosen experts' unbiased scores.
        double sum = 0, rel_s = 0;
        for (int64_t j = 0; j < k; ++j)
          sum += s[it[j]], rel_s = std::max(rel_s, delta[it[j]] / s[it[j]]);
        for (int64_t j = 0; j < k; ++j) {
          const double want =
              (v.normalize && k > 1 ? s[it[j]] / (sum + 1e-20) : s[it[j]]) * v.scale;
          EXPECT_NEAR(weight[t * k + j], want, std::abs(want) * (2 * rel_s + double(k + 4) * kU))
              << "token " << t << " slot " << j;
        }
      }
    }
  }
}

// NaN choices follow the CPU's scan literally (best = first untaken, replaced only by a strictly
// greater choice): a NaN first untaken expert is taken, a NaN later one never displaces a number,
// and a token whose choices are all NaN takes experts 0, 1, ... in order.
TEST_P(BackendMoe, RouteNaNChoicesFollowTheScan) {
  const int64_t S = 3, H = 64, E = 32, k = 6;
  std::vector<float> x = normal(S * H), gate = normal(E * H, 0.2);
  std::fill_n(&gate[0], H, NAN);      // expert 0: NaN for every token, and first in the scan
  std::fill_n(&gate[9 * H], H, NAN);  // expert 9: NaN, never first while 0..8 are untaken
  x[2 * H + 5] = NAN;                 // token 2: every choice NaN
  auto run = [&](Backend& b) {
    Buffer<float> dx = upload(b, x), dg = upload(b, gate);
    Buffer<int32_t> idx = poisoned<int32_t>(b, S * k, kIndexPoison);
    Buffer<float> weight = poisoned<float>(b, S * k);
    b.moe_route(dx.get(), dg.get(), nullptr, S, H, E, k, 1.0f, true, idx.get(), weight.get(),
                b.stream(0));
    return idx.download();
  };
  const std::vector<int32_t> idx = run(backend());
  if (on_cuda()) {
    EXPECT_TRUE(bitwise_equal(idx, run(cpu())));
    return;
  }
  for (int64_t t = 0; t < 2; ++t) {
    EXPECT_EQ(idx[t * k], 0) << "token " << t;
    for (int64_t j = 1; j < k; ++j) EXPECT_NE(idx[t * k + j], 9) << "token " << t;
  }
  for (int64_t j = 0; j < k; ++j) EXPECT_EQ(idx[2 * k + j], j);
}

TEST_P(BackendMoe, ExpertsOnEveryWeightPath) {
  struct Case {
    int64_t S, H, I, E, k;
  };
  for (const Case c : {Case{40, 64, 32, 8, 2}, Case{9, 48, 24, 16, 6}, Case{3, 300, 70, 4, 4},
                       Case{130, 96, 40, 4, 3}}) {
    const int64_t S = c.S, H = c.H, I = c.I, E = c.E, k = c.k;
    const std::vector<float> x = normal(S * H, 2.0);  // large enough to reach both clamps
    // BF16-exact weights (the checkpoint's FP8/FP4 values are), so every path sees the same values.
    auto bf16_exact = [&](int64_t n, double sigma) {
      std::vector<float> w = normal(n, sigma);
      for (float& v : w) v = round_bf16(v);
      return w;
    };
    const std::vector<float> w1 = bf16_exact(E * I * H, 0.3), w3 = bf16_exact(E * I * H, 0.3),
                             w2 = bf16_exact(E * H * I, 0.1);
    const std::vector<float> s1 = bf16_exact(I * H, 0.3), s3 = bf16_exact(I * H, 0.3),
                             s2 = bf16_exact(H * I, 0.1);
    std::vector<int32_t> idx(static_cast<size_t>(S * k));
    for (int64_t t = 0; t < S; ++t) {
      const std::vector<int64_t> perm = permutation(E);
      for (int64_t j = 0; j < k; ++j)
        idx[t * k + j] = int32_t(t == 0 ? perm[0] : perm[j]);  // token 0: one expert k times
    }
    const std::vector<float> wt = uniform(S * k, 0.1, 1.0);
    for (const auto& [shared, limit] :
         {std::pair(true, 10.0f), std::pair(false, 10.0f), std::pair(true, 0.0f)}) {
      // y on backend b: bf16 = BF16 weight storage (CUDA only), tc = set_tensor_cores.
      auto run = [&](Backend& b, bool bf16, bool tc) {
        std::vector<Buffer<float>> keep32;  // the weights stay alive until the op has run
        std::vector<Buffer<uint16_t>> keep16;
        auto matrix = [&](const std::vector<float>& w) -> Matrix {
          if (!bf16) {
            keep32.push_back(upload(b, w));
            return {keep32.back().get(), WeightFormat::kF32, true};
          }
          std::vector<uint16_t> bits;
          for (const float v : w) bits.push_back(bf16_bits(v));
          keep16.push_back(upload(b, bits));
          return {keep16.back().get(), WeightFormat::kBF16, true};
        };
        LayerWeights L;
        L.w1 = matrix(w1), L.w3 = matrix(w3), L.w2 = matrix(w2);
        if (shared) L.shared_w1 = matrix(s1), L.shared_w3 = matrix(s3), L.shared_w2 = matrix(s2);
        Buffer<float> dx = upload(b, x), dwt = upload(b, wt);
        Buffer<int32_t> didx = upload(b, idx);
        Buffer<float> y = poisoned<float>(b, S * H);
        ScratchArena scratch(b);
        b.set_tensor_cores(tc);
        b.moe_experts(dx.get(), didx.get(), dwt.get(), S, H, k, E, I, L, limit, y.get(),
                      scratch.get(), b.stream(0));
        b.set_tensor_cores(false);
        return y.download();
      };
      // Float64 MoE (tc: x and the hidden units rounded to BF16, as the tensor-core path and the
      // CPU's emulation round them) and an elementwise bound on an FP32 evaluation of it whose
      // sums err by at most acc_scale·γ: the gate/up dots, silu·clamp (Lipschitz <= 1.1) and the
      // 5 roundings of silu(g)·u·weight per hidden unit (6u allowed), then the down projection
      // (γ_I) and the k + 1 slot sums. With tc, a hidden unit contributes error only where its FP32
      // value may round to another BF16 value than the exact one (then by that BF16 step);
      // elsewhere the rounding absorbs it.
      auto reference = [&](bool tc, double acc_scale) {
        std::vector<double> want(static_cast<size_t>(S * H), 0.0), tol(want.size(), 0.0);
        auto expert = [&](int64_t t, const float* e1, const float* e3, const float* e2,
                          double scale) {
          std::vector<double> h(static_cast<size_t>(I)), dh(static_cast<size_t>(I));
          for (int64_t i = 0; i < I; ++i) {
            double g = 0, u = 0, ag = 0, au = 0;
            for (int64_t j = 0; j < H; ++j) {
              const double xv = tc ? round_bf16(x[t * H + j]) : x[t * H + j];
              g += xv * e1[i * H + j], u += xv * e3[i * H + j];
              ag += std::abs(xv * e1[i * H + j]), au += std::abs(xv * e3[i * H + j]);
            }
            if (limit > 0)
              g = std::min(g, double(limit)), u = std::clamp(u, -double(limit), double(limit));
            const double silu = g / (1 + std::exp(-g)), exact = silu * u * scale;
            const double err = acc_scale * (std::abs(scale) * gamma_n(H) *
                                                (1.1 * ag * std::abs(u) + std::abs(silu) * au) +
                                            6 * kU * std::abs(exact));
            h[i] = exact, dh[i] = err;
            if (tc) {
              h[i] = round_bf16(float(exact));
              const double lo = round_bf16(float(exact - err)), hi = round_bf16(float(exact + err));
              dh[i] = std::max(h[i] - lo, hi - h[i]);
            }
          }
          for (int64_t o = 0; o < H; ++o) {
            double acc = 0, abs_acc = 0, prop = 0;
            for (int64_t i = 0; i < I; ++i) {
              acc += e2[o * I + i] * h[i], abs_acc += std::abs(e2[o * I + i] * h[i]);
              prop += std::abs(e2[o * I + i]) * dh[i];
            }
            want[t * H + o] += acc;
            tol[t * H + o] += (acc_scale * gamma_n(I) + double(k + 2) * kU) * abs_acc + prop;
          }
        };
        for (int64_t t = 0; t < S; ++t) {
          for (int64_t j = 0; j < k; ++j) {
            const int64_t e = idx[t * k + j];
            expert(t, &w1[e * I * H], &w3[e * I * H], &w2[e * H * I], wt[t * k + j]);
          }
          if (shared) expert(t, s1.data(), s3.data(), s2.data(), 1.0);
        }
        return std::pair(want, tol);
      };
      for (const bool tc : {false, true}) {
        SCOPED_TRACE("S " + std::to_string(S) + " E " + std::to_string(E) + " k " +
                     std::to_string(k) + (shared ? " shared" : "") + " limit " +
                     std::to_string(limit) + (tc ? " tensor cores" : " fp32"));
        const std::vector<float> got = run(backend(), on_cuda() && tc, tc);
        EXPECT_TRUE(all_written(got));
        if (on_cuda() && !tc) {
          EXPECT_LE(rel_error(got, run(cpu(), false, false)), 1e-5);
          EXPECT_TRUE(bitwise_equal(run(backend(), /*bf16=*/true, false), got))
              << "BF16 split path";
        } else if (on_cuda()) {
          // Against the CPU's emulation: each is within its bound of the float64 emulation, the
          // tensor cores' with acc_scale 2 (their FP32 accumulation need not round to nearest:
          // Fasi et al., "Numerical behavior of NVIDIA tensor cores", 2021).
          const std::vector<float> emulated = run(cpu(), false, true);
          const auto [want, tol_cpu] = reference(true, 1.0);
          const auto [unused, tol_gpu] = reference(true, 2.0);
          std::vector<double> cpu_y(emulated.begin(), emulated.end()), tol(tol_cpu.size());
          for (size_t i = 0; i < tol.size(); ++i) tol[i] = tol_cpu[i] + tol_gpu[i];
          EXPECT_TRUE(within(got, cpu_y, tol));
        } else {
          const auto [want, tol] = reference(tc, 1.0);
          EXPECT_TRUE(within(got, want, tol));
        }
      }
    }
  }
}

// V4 hash routing: the CPU backend's op is the kernel reference (int32 token ids from the plan),
// bitwise; a bad token id is an error naming it (on a device: that token's slots id -1, weight
// NaN); a backend without V4 ops refuses it by name.
TEST_P(BackendMoe, HashRouteIsTheReference) {
  Backend& be = backend();
  const int64_t S = 9, H = 16, E = 8, k = 2, V = 50;
  const std::vector<float> x = normal(S * H), gate = normal(E * H, 0.3);
  std::vector<int32_t> table(V * k), tokens(S);
  for (int64_t v = 0; v < V; ++v)
    table[v * k] = int32_t(v % E), table[v * k + 1] = int32_t((v + 3) % E);
  for (int64_t t = 0; t < S; ++t) tokens[t] = int32_t(randint(0, V - 1));
  Buffer<float> dx = upload(be, x), dgate = upload(be, gate), w = poisoned<float>(be, S * k);
  Buffer<int32_t> dtable = upload(be, table), dtokens = upload(be, tokens),
                  idx = poisoned<int32_t>(be, S * k);
  const Stream s = be.stream(0);
  auto route = [&](const int32_t* toks) {
    be.moe_route_hash(dx.get(), dgate.get(), dtable.get(), toks, S, H, E, k, V, 1.5f, idx.get(),
                      w.get(), s);
  };
  if (!be.has_v4_ops()) {
    try {
      route(dtokens.get());
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), StatusCode::kUnsupported);
      EXPECT_NE(std::string(e.what()).find("moe_route_hash"), std::string::npos) << e.what();
    }
    return;
  }
  route(dtokens.get());
  std::vector<int32_t> want_idx(S * k);
  std::vector<float> want_w(S * k);
  const std::vector<int64_t> ids(tokens.begin(), tokens.end());
  kernels::cpu::moe_route_hash(x.data(), gate.data(), table.data(), ids.data(), S, H, E, k, V, 1.5f,
                               want_idx.data(), want_w.data());
  EXPECT_EQ(idx.download(), want_idx);
  EXPECT_TRUE(bitwise_equal(w.download(), want_w));
  for (int64_t t = 0; t < S; ++t) EXPECT_EQ(want_idx[t * k], table[tokens[t] * k]) << t;
  tokens[4] = int32_t(V);  // outside the vocabulary
  Buffer<int32_t> bad = upload(be, tokens);
  if (GetParam() == "cpu") {
    try {
      route(bad.get());
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("token id 50 at 4 outside [0, 50)"), std::string::npos)
          << e.what();
    }
  } else {
    // A device kernel cannot raise without a host synchronisation: the token's slots get id -1
    // (skipped by the expert kernels) and weight NaN; the other tokens are unchanged.
    route(bad.get());
    const std::vector<int32_t> got_idx = idx.download();
    const std::vector<float> got_w = w.download();
    for (int64_t t = 0; t < S; ++t) {
      for (int64_t j = 0; j < k; ++j) {
        if (t == 4) {
          EXPECT_EQ(got_idx[t * k + j], -1) << j;
          EXPECT_TRUE(std::isnan(got_w[t * k + j])) << j;
        } else {
          EXPECT_EQ(got_idx[t * k + j], want_idx[t * k + j]) << t << " " << j;
        }
      }
    }
  }
}

TEST_P(BackendMoe, RejectsBadSizesAndExpertIds) {
  Backend& be = backend();
  const int64_t H = 8, I = 4, E = 2;
  Buffer<float> x = upload(be, normal(2 * H)), w = upload(be, normal(E * I * H)),
                wt = upload(be, uniform(4, 0.1, 1));
  Buffer<int32_t> idx = upload(be, std::vector<int32_t>{0, 1, 1, 0}),
                  out_idx = poisoned<int32_t>(be, 4);
  Buffer<float> y = poisoned<float>(be, 2 * H);
  LayerWeights L;
  L.w1 = L.w3 = L.w2 = Matrix{w.get(), WeightFormat::kF32, false};
  ScratchArena scratch(be);
  const Stream s = be.stream(0);
  EXPECT_THROW(be.moe_route(x.get(), w.get(), nullptr, 1, H, E, /*k=*/3, 1.0f, true, out_idx.get(),
                            y.get(), s),
               Error);
  EXPECT_THROW(be.moe_experts(x.get(), idx.get(), wt.get(), 1, H, /*k=*/0, E, I, L, 10.0f, y.get(),
                              scratch.get(), s),
               Error);
  // An expert id outside [0, E): the CPU reference rejects it; the CUDA kernel cannot check
  // device data and skips the slot (moe.cuh), i.e. the token gets its other slots only.
  Buffer<int32_t> bad = upload(be, std::vector<int32_t>{0, int32_t(E), 1, 0});
  if (!on_cuda()) {
    EXPECT_THROW(be.moe_experts(x.get(), bad.get(), wt.get(), 2, H, 2, E, I, L, 10.0f, y.get(),
                                scratch.get(), s),
                 Error);
    return;
  }
  be.moe_experts(x.get(), bad.get(), wt.get(), 2, H, 2, E, I, L, 10.0f, y.get(), scratch.get(), s);
  std::vector<float> zero_weight = wt.download();
  zero_weight[1] = 0.0f;  // the skipped slot as a slot of weight 0 (its terms are exact zeros)
  Buffer<float> cx = upload(cpu(), x.download()), cw = upload(cpu(), w.download()),
                cwt = upload(cpu(), zero_weight);
  Buffer<int32_t> cidx = upload(cpu(), std::vector<int32_t>{0, 0, 1, 0});
  Buffer<float> cy = poisoned<float>(cpu(), 2 * H);
  LayerWeights CL;
  CL.w1 = CL.w3 = CL.w2 = Matrix{cw.get(), WeightFormat::kF32, false};
  ScratchArena cpu_scratch(cpu());
  cpu().moe_experts(cx.get(), cidx.get(), cwt.get(), 2, H, 2, E, I, CL, 10.0f, cy.get(),
                    cpu_scratch.get(), cpu().stream(0));
  EXPECT_LE(rel_error(y.download(), cy.download()), 1e-5);
}

DSV41RT_INSTANTIATE_BACKENDS(BackendMoe);

}  // namespace
}  // namespace dsv41rt::testing
