// The DeepSeek-V4-only Backend ops on CUDA (kernels/cuda/v4_*.cuh) against the CPU backend's
// (the references of kernels/mhc.h, moe.h, v4_compressor.h, indexer.h), through the Backend
// interface, on fresh random inputs (the seed is printed with every failure), outputs poisoned
// before each launch. Built only in CUDA builds; skipped without a device unless
// DSV41RT_REQUIRE_CUDA=1.
//
// Bounds, per op:
//   - visible_entries: bitwise (integers).
//   - moe_route_hash: idx bitwise (table look-ups); weights within 16 u relative: the logits are
//     the CPU's bits (same 8-lane FP32 dot), softplus goes through FP64 on the GPU and through
//     glibc's expf / log1pf (each within 0.502 ulp) on the CPU, so s differs by a few ulp at most
//     and the normalisation (a k-term sum, a division, a product, rounded alike) adds no more.
//   - hc_head_pre: bitwise the CUDA hc_mix's pre (the contract defines it as that pre); against the
//     CPU, with z = base + (mix · r) · scale and pre = sigmoid(z) + hc_eps, per element
//       |Δpre| <= 1/4 · |Δz| + 8 u,  |Δz| <= |scale| r (2 γ_K Σ_i |f_i fn_ji| + 8 u |mix|) + 4 u
//       |z|
//     (the two FP32 projections sum the same K products in different orders, each within γ_K
//     Σ |f fn| of the exact dot; r from Σ f² in double on both sides differs by a few roundings;
//     sigmoid's slope is at most 1/4; expf, the division and the adds a few ulp of values <= 2).
//   - v4_compress: the state rows bitwise (copies and one APE add, both sides); the entries within
//       |Δe_c| <= 2 |w_c| inv (E_c + |P_c| ρ) + 4 u |e_c|,  E_c = (4 u + γ_{2m+2}) A_c,
//       ρ = Σ_c |P_c| E_c / (Σ_c P_c² + D eps) + 6 u
//     with P the exact pooled vector and A_c = Σ_t |a_t| p_t (FP64 on the host): each side's exps
//     are within an ulp of exact, so each side's softmax weights are within a few u of exact and
//     its pooled sum within γ_{2m+2} A_c (the weights sum to 1); the RMSNorm's scale moves by at
//     most ρ relative (E_c over the sum of squares, and its roundings), and the final products by
//     4 u. In practice the entries are bitwise but where an exp rounds differently.
//   - graph capture: the four ops captured and replayed give the eager results bitwise.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "backend_test_util.h"
#include "kernels/indexer.h"
#include "kernels/mhc.h"
#include "kernels/moe.h"
#include "kernels/v4_compressor.h"

namespace dsv41rt::testing {
namespace {

using kernels::V4CompressorWeights;

class BackendCudaV4Ops : public CudaKernelTest {
 protected:
  void SetUp() override {
    CudaKernelTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    cpu_ = model::make_cpu_backend();
    ASSERT_TRUE(cuda().has_v4_ops());
  }
  Backend& cpu() { return *cpu_; }
  Stream stream() { return cuda().stream(0); }

 private:
  std::unique_ptr<Backend> cpu_;
};

// ---- visible_entries -------------------------------------------------------------------------

TEST_F(BackendCudaV4Ops, VisibleEntriesAreTheReferenceBitwise) {
  for (const int64_t S : {int64_t(1), int64_t(37), int64_t(300)}) {
    for (const int64_t k : {int64_t(1), int64_t(7), int64_t(260)}) {
      std::vector<int64_t> nv(static_cast<size_t>(S));
      for (int64_t& v : nv) v = randint(0, 2 * k);
      nv[0] = 0, nv[S - 1] = k;  // none, and exactly the width
      Buffer<int64_t> dnv = upload(cuda(), nv);
      Buffer<int32_t> got = poisoned<int32_t>(cuda(), S * k, kIndexPoison);
      cuda().visible_entries(dnv.get(), S, k, got.get(), stream());
      std::vector<int32_t> want(size_t(S * k));
      cpu().visible_entries(nv.data(), S, k, want.data(), cpu().stream(0));
      EXPECT_TRUE(bitwise_equal(got.download(), want)) << "S " << S << " k " << k;
    }
  }
}

TEST_F(BackendCudaV4Ops, VisibleEntriesOfNoRowsWriteNothing) {
  Buffer<int64_t> dnv = upload(cuda(), std::vector<int64_t>{3});
  Buffer<int32_t> out = poisoned<int32_t>(cuda(), 4, kIndexPoison);
  cuda().visible_entries(dnv.get(), 0, 4, out.get(), stream());
  cuda().visible_entries(dnv.get(), 1, 0, out.get(), stream());
  for (int32_t v : out.download()) EXPECT_EQ(uint32_t(v), 0xA5A5A5A5u);
}

// The CPU throws on a negative count (naming the row); the device cannot report it without a
// host synchronisation, so such a row sees nothing (kernels/cuda/v4_visible_entries.cuh).
TEST_F(BackendCudaV4Ops, VisibleEntriesOfANegativeCountAreNone) {
  Buffer<int64_t> dnv = upload(cuda(), std::vector<int64_t>{2, -1});
  Buffer<int32_t> out = poisoned<int32_t>(cuda(), 6, kIndexPoison);
  cuda().visible_entries(dnv.get(), 2, 3, out.get(), stream());
  EXPECT_EQ(out.download(), std::vector<int32_t>({0, 1, -1, -1, -1, -1}));
}

// ---- moe_route_hash --------------------------------------------------------------------------

struct HashCase {
  int64_t S, H, E, k, V;
};

TEST_F(BackendCudaV4Ops, HashRouteIsTheReference) {
  // H 61: a tail past the last chunk of 8; k 1: normalised too; k 40: slots beyond one pass of
  // the block's 32 lane groups; S 0 and 1 the edges.
  for (const HashCase c :
       {HashCase{0, 16, 8, 2, 50}, HashCase{1, 16, 8, 2, 50}, HashCase{9, 61, 16, 1, 50},
        HashCase{130, 256, 64, 6, 300}, HashCase{5, 64, 48, 40, 20}}) {
    const std::vector<float> x = normal(std::max<int64_t>(c.S, 1) * c.H),
                             gate = normal(c.E * c.H, 0.3);
    std::vector<int32_t> table(size_t(c.V * c.k)), tokens(size_t(std::max<int64_t>(c.S, 1)));
    for (int32_t& e : table) e = int32_t(randint(0, c.E - 1));
    for (int32_t& t : tokens) t = int32_t(randint(0, c.V - 1));
    if (c.S > 1) tokens[0] = 0, tokens[1] = int32_t(c.V - 1);  // the table's first and last rows
    Buffer<float> dx = upload(cuda(), x), dgate = upload(cuda(), gate);
    Buffer<int32_t> dtable = upload(cuda(), table), dtokens = upload(cuda(), tokens);
    const int64_t out = std::max<int64_t>(c.S * c.k, 1);
    Buffer<int32_t> idx = poisoned<int32_t>(cuda(), out, kIndexPoison);
    Buffer<float> w = poisoned<float>(cuda(), out);
    cuda().moe_route_hash(dx.get(), dgate.get(), dtable.get(), dtokens.get(), c.S, c.H, c.E, c.k,
                          c.V, 1.5f, idx.get(), w.get(), stream());
    const std::vector<int32_t> got_idx = idx.download();
    const std::vector<float> got_w = w.download();
    if (c.S == 0) {
      EXPECT_EQ(uint32_t(got_idx[0]), 0xA5A5A5A5u);  // nothing written
      EXPECT_TRUE(std::isnan(got_w[0]));
      continue;
    }
    std::vector<int32_t> want_idx(static_cast<size_t>(out));
    std::vector<float> want_w(static_cast<size_t>(out));
    cpu().moe_route_hash(x.data(), gate.data(), table.data(), tokens.data(), c.S, c.H, c.E, c.k,
                         c.V, 1.5f, want_idx.data(), want_w.data(), cpu().stream(0));
    EXPECT_TRUE(bitwise_equal(got_idx, want_idx)) << "S " << c.S << " k " << c.k;
    std::vector<double> want(want_w.begin(), want_w.end()), tol(want.size());
    for (size_t i = 0; i < tol.size(); ++i) tol[i] = 16 * kU * std::abs(want[i]);
    EXPECT_TRUE(within(got_w, want, tol)) << "S " << c.S << " k " << c.k;
  }
}

// An id the planner would refuse (the CPU reference throws) gives the token's slots idx -1 and
// weight NaN on the device (kernels/cuda/v4_hash_route.cuh); the other tokens are unaffected.
TEST_F(BackendCudaV4Ops, HashRouteMarksAnUnroutableToken) {
  const int64_t S = 3, H = 8, E = 4, k = 2, V = 5;
  std::vector<int32_t> table(V * k, 1);
  table[3 * k + 1] = int32_t(E);  // token 3's second expert is outside [0, E)
  Buffer<float> dx = upload(cuda(), normal(S * H)), dgate = upload(cuda(), normal(E * H));
  Buffer<int32_t> dtable = upload(cuda(), table);
  for (const int32_t bad : {int32_t(V), int32_t(-1), int32_t(3)}) {
    Buffer<int32_t> dtokens = upload(cuda(), std::vector<int32_t>{2, bad, 0});
    Buffer<int32_t> idx = poisoned<int32_t>(cuda(), S * k, kIndexPoison);
    Buffer<float> w = poisoned<float>(cuda(), S * k);
    cuda().moe_route_hash(dx.get(), dgate.get(), dtable.get(), dtokens.get(), S, H, E, k, V, 1.0f,
                          idx.get(), w.get(), stream());
    const std::vector<int32_t> gi = idx.download();
    const std::vector<float> gw = w.download();
    EXPECT_EQ(gi, std::vector<int32_t>({1, 1, -1, -1, 1, 1})) << "token " << bad;
    EXPECT_TRUE(std::isnan(gw[2]) && std::isnan(gw[3])) << "token " << bad;
    for (int i : {0, 1, 4, 5}) EXPECT_TRUE(std::isfinite(gw[i])) << "token " << bad;
  }
}

// ---- hc_head_pre -----------------------------------------------------------------------------

TEST_F(BackendCudaV4Ops, HyperHeadIsWithinTheStatedBoundOfTheReference) {
  struct Case {
    int64_t S, n, H;
  };
  // K = n H: 256 (one partial chunk), 1200 (chunks of 512 and a partial one), 4096 (whole ones).
  for (const Case c : {Case{1, 4, 64}, Case{13, 4, 300}, Case{70, 4, 1024}, Case{3, 3, 100}}) {
    const int64_t K = c.n * c.H;
    const std::vector<float> X = normal(c.S * K), fn = normal(c.n * K, 0.02),
                             base = normal(c.n, 0.5), scale = uniform(1, 0.5, 2.0);
    Buffer<float> dX = upload(cuda(), X), dfn = upload(cuda(), fn), dbase = upload(cuda(), base),
                  dscale = upload(cuda(), scale);
    Buffer<float> pre = poisoned<float>(cuda(), c.S * c.n);
    cuda().hc_head_pre(dX.get(), dfn.get(), dbase.get(), dscale.get(), c.S, c.n, c.H, 1e-6f, 1e-6f,
                       pre.get(), stream());
    const std::vector<float> got = pre.download();
    EXPECT_TRUE(all_written(got));
    std::vector<float> want(size_t(c.S * c.n));
    cpu().hc_head_pre(X.data(), fn.data(), base.data(), scale.data(), c.S, c.n, c.H, 1e-6f, 1e-6f,
                      want.data(), cpu().stream(0));
    std::vector<double> ref(want.begin(), want.end()), tol(want.size());
    for (int64_t s = 0; s < c.S; ++s) {
      const float* f = X.data() + s * K;
      double sq = 0;
      for (int64_t i = 0; i < K; ++i) sq += double(f[i]) * f[i];
      const double r = 1.0 / std::sqrt(sq / double(K) + 1e-6);
      for (int64_t j = 0; j < c.n; ++j) {
        double mix = 0, mag = 0;
        for (int64_t i = 0; i < K; ++i) {
          mix += double(f[i]) * fn[j * K + i];
          mag += std::abs(double(f[i]) * fn[j * K + i]);
        }
        const double z = base[j] + mix * r * scale[0];
        const double dz = std::abs(scale[0]) * r * (2 * gamma_n(K) * mag + 8 * kU * std::abs(mix)) +
                          4 * kU * std::abs(z);
        tol[s * c.n + j] = 0.25 * dz + 8 * kU;
      }
    }
    EXPECT_TRUE(within(got, ref, tol)) << "S " << c.S << " n " << c.n << " H " << c.H;
  }
}

// The contract's definition on this backend: hc_head_pre is the CUDA mixer's pre, bitwise, for the
// head's n rows (the other mixer rows zero). S 70 spans several of the mixer's token tiles.
TEST_F(BackendCudaV4Ops, HyperHeadIsBitwiseTheCudaMixersPre) {
  const int64_t S = 70, n = 4, H = 300, W = (2 + n) * n, K = n * H;
  const std::vector<float> X = normal(S * K), head_fn = normal(n * K, 0.02),
                           head_base = normal(n, 0.5), head_scale = uniform(1, 0.5, 2.0);
  std::vector<float> fn(W * K, 0.0f), base(W, 0.0f), scale = {head_scale[0], 1.0f, 1.0f};
  std::copy(head_fn.begin(), head_fn.end(), fn.begin());
  std::copy(head_base.begin(), head_base.end(), base.begin());
  Buffer<float> dX = upload(cuda(), X), dhfn = upload(cuda(), head_fn),
                dhbase = upload(cuda(), head_base), dhscale = upload(cuda(), head_scale);
  Buffer<float> pre = poisoned<float>(cuda(), S * n);
  cuda().hc_head_pre(dX.get(), dhfn.get(), dhbase.get(), dhscale.get(), S, n, H, 1e-6f, 1e-6f,
                     pre.get(), stream());
  Buffer<float> dfn = upload(cuda(), fn), dbase = upload(cuda(), base),
                dscale = upload(cuda(), scale);
  Buffer<float> mpre = poisoned<float>(cuda(), S * n), post = poisoned<float>(cuda(), S * n),
                comb = poisoned<float>(cuda(), S * n * n);
  ScratchArena scratch(cuda());
  cuda().hc_mix(dX.get(), dfn.get(), dbase.get(), dscale.get(), S, n, H, 1e-6f, 1e-6f, 1,
                mpre.get(), post.get(), comb.get(), scratch.get(), stream());
  EXPECT_TRUE(bitwise_equal(pre.download(), mpre.download()));
}

TEST_F(BackendCudaV4Ops, HyperHeadOfNoRowsWritesNothingAndBadSizesThrow) {
  Buffer<float> f = upload(cuda(), normal(64));
  Buffer<float> pre = poisoned<float>(cuda(), 4);
  cuda().hc_head_pre(f.get(), f.get(), f.get(), f.get(), 0, 4, 16, 1e-6f, 1e-6f, pre.get(),
                     stream());
  for (float v : pre.download()) EXPECT_TRUE(std::isnan(v));
  EXPECT_THROW(cuda().hc_head_pre(f.get(), f.get(), f.get(), f.get(), 1, 0, 16, 1e-6f, 1e-6f,
                                  pre.get(), stream()),
               Error);
  EXPECT_THROW(cuda().hc_head_pre(f.get(), f.get(), f.get(), f.get(), 1, 4, 0, 1e-6f, 1e-6f,
                                  pre.get(), stream()),
               Error);
}

// ---- v4_compress -----------------------------------------------------------------------------

// One compressor, its requests' histories (host) and their flat states on both backends.
class CompressorRun {
 public:
  CompressorRun(Backend& cuda, Backend& cpu, RandomInputs& rnd, int64_t D, int64_t ratio,
                bool overlap, int64_t items)
      : cuda_(cuda), cpu_(cpu), rnd_(rnd), items_(items) {
    w_.H = 8, w_.D = D, w_.ratio = ratio, w_.overlap = overlap, w_.eps = 1e-6f;
    W_ = w_.width();
    ape_ = rnd.normal(ratio * W_, 0.5);
    norm_ = rnd.uniform(D, 0.5, 1.5);
    d_ape_.emplace(cuda, int64_t(ape_.size()));
    d_ape_->upload(ape_);
    d_norm_.emplace(cuda, D);
    d_norm_->upload(norm_);
    state_bytes_ = kernels::v4_compressor_state_floats(w_) * 4;
    slot_bytes_ = kOffset + state_bytes_;
    // Both sides start from the same random bytes: rows the state does not hold yet are garbage
    // that neither side may read, and every row is compared bitwise after each step.
    for (int64_t b = 0; b < items; ++b) {
      std::vector<float> init = rnd.normal(slot_bytes_ / 4, 3.0);
      host_slots_.push_back(init);
      dev_slots_.emplace_back(cuda, slot_bytes_ / 4);
      dev_slots_.back().upload(init);
    }
    length_.assign(size_t(items), 0);
    hist_a_.resize(static_cast<size_t>(items)), hist_s_.resize(static_cast<size_t>(items));
  }

  const V4CompressorWeights& weights() const { return w_; }
  int64_t length(int64_t b) const { return length_[size_t(b)]; }

  /// One forward feeding n[b] positions to item b (plus a padding item on the GPU: null slot,
  /// n = 0, as a decode graph's); checks entries and states. Returns the entries compared.
  int64_t step(const std::vector<int64_t>& n) {
    std::vector<int64_t> row0(static_cast<size_t>(items_)), entry0(static_cast<size_t>(items_));
    int64_t rows = 0, entries = 0;
    for (int64_t b = 0; b < items_; ++b) {
      row0[b] = rows, entry0[b] = entries;
      rows += n[b];
      entries += (length_[b] % w_.ratio + n[b]) / w_.ratio;
    }
    const std::vector<float> a = rnd_.normal(std::max<int64_t>(rows, 1) * W_),
                             s = rnd_.normal(std::max<int64_t>(rows, 1) * W_, 2.0);
    // CPU: the reference on the host slots.
    std::vector<float> want(size_t(std::max<int64_t>(entries, 1) * w_.D), 0.0f);
    std::vector<uint8_t*> hslots;
    for (auto& v : host_slots_) hslots.push_back(reinterpret_cast<uint8_t*>(v.data()));
    V4CompressorWeights hw = w_;
    hw.ape = ape_.data(), hw.norm_weight = norm_.data();
    cpu_.v4_compress(hw, a.data(), s.data(), hslots.data(), kOffset, items_, length_.data(),
                     row0.data(), n.data(), entry0.data(), want.data(), cpu_.stream(0));
    // GPU: the same, plus the padding item.
    std::vector<uint8_t*> dslots;
    for (auto& d : dev_slots_) dslots.push_back(reinterpret_cast<uint8_t*>(d.get()));
    dslots.push_back(nullptr);
    std::vector<int64_t> glen = length_, grow0 = row0, gn = n, gentry0 = entry0;
    glen.push_back(0), grow0.push_back(rows), gn.push_back(0), gentry0.push_back(entries);
    Buffer<uint8_t*> dsl = upload(cuda_, dslots);
    Buffer<int64_t> dlen = upload(cuda_, glen), drow0 = upload(cuda_, grow0),
                    dn = upload(cuda_, gn), dentry0 = upload(cuda_, gentry0);
    Buffer<float> da = upload(cuda_, a), ds = upload(cuda_, s);
    Buffer<float> got = poisoned<float>(cuda_, int64_t(want.size()));
    V4CompressorWeights dw = w_;
    dw.ape = d_ape_->get(), dw.norm_weight = d_norm_->get();
    cuda_.v4_compress(dw, da.get(), ds.get(), dsl.get(), kOffset, items_ + 1, dlen.get(),
                      drow0.get(), dn.get(), dentry0.get(), got.get(), cuda_.stream(0));
    // Host history of every position's (a, s + ape) row, for the FP64 bound.
    for (int64_t b = 0; b < items_; ++b) {
      for (int64_t r = 0; r < n[b]; ++r) {
        const int64_t p = length_[b] + r, slot = p % w_.ratio;
        for (int64_t c = 0; c < W_; ++c) {
          hist_a_[b].push_back(a[(row0[b] + r) * W_ + c]);
          hist_s_[b].push_back(s[(row0[b] + r) * W_ + c] + ape_[slot * W_ + c]);
        }
      }
    }
    const std::vector<float> got_h = got.download();
    if (entries > 0) {
      std::vector<double> ref(size_t(entries * w_.D)), tol(ref.size());
      for (int64_t b = 0; b < items_; ++b) {
        const int64_t g0 = length_[b] / w_.ratio;
        const int64_t count = (length_[b] % w_.ratio + n[b]) / w_.ratio;
        for (int64_t q = 0; q < count; ++q) {
          bound(b, g0 + q, &want[(entry0[b] + q) * w_.D], &ref[(entry0[b] + q) * w_.D],
                &tol[(entry0[b] + q) * w_.D]);
        }
      }
      std::vector<float> g(got_h.begin(), got_h.begin() + entries * w_.D);
      EXPECT_TRUE(within(g, ref, tol)) << "ratio " << w_.ratio;
    } else {
      EXPECT_TRUE(std::isnan(got_h[0])) << "no entry, yet one was written";
    }
    for (int64_t b = 0; b < items_; ++b) {
      length_[b] += n[b];
      EXPECT_TRUE(bitwise_equal(dev_slots_[b].download(), host_slots_[b]))
          << "state of item " << b << " at length " << length_[b] << ", ratio " << w_.ratio;
    }
    return entries;
  }

 private:
  static constexpr int64_t kOffset = 32;  // bytes before the state in each slot (left untouched)

  // ref = the CPU's entry (the comparison's centre); tol per the module comment, from the exact
  // pooled vector of group g of item b in FP64.
  void bound(int64_t b, int64_t g, const float* cpu_entry, double* ref, double* tol) const {
    const int64_t m = w_.ratio, D = w_.D;
    const bool prev = w_.overlap && g > 0;
    const double gam = gamma_n(2 * m + 2);
    std::vector<double> P(static_cast<size_t>(D)), E(static_cast<size_t>(D));
    for (int64_t c = 0; c < D; ++c) {
      std::vector<std::pair<double, double>> slots;  // (value, score)
      auto at = [&](int64_t p, int64_t col) {
        return std::make_pair(double(hist_a_[b][p * W_ + col]), double(hist_s_[b][p * W_ + col]));
      };
      if (prev)
        for (int64_t t = 0; t < m; ++t) slots.push_back(at((g - 1) * m + t, c));
      for (int64_t t = 0; t < m; ++t) slots.push_back(at(g * m + t, w_.overlap ? D + c : c));
      double mx = -INFINITY, den = 0, pooled = 0, mag = 0;
      for (auto& [v, sc] : slots) mx = std::max(mx, sc);
      for (auto& [v, sc] : slots) den += std::exp(sc - mx);
      for (auto& [v, sc] : slots) {
        const double p = std::exp(sc - mx) / den;
        pooled += v * p, mag += std::abs(v) * p;
      }
      P[c] = pooled, E[c] = (4 * kU + gam) * mag;
    }
    double sq = 0, cross = 0;
    for (int64_t c = 0; c < D; ++c) sq += P[c] * P[c], cross += std::abs(P[c]) * E[c];
    const double inv = 1.0 / std::sqrt(sq / double(D) + w_.eps);
    const double rho = cross / (sq + double(D) * w_.eps) + 6 * kU;
    for (int64_t c = 0; c < D; ++c) {
      ref[c] = cpu_entry[c];
      tol[c] = 2 * std::abs(norm_[c]) * inv * (E[c] + std::abs(P[c]) * rho) +
               4 * kU * std::abs(double(cpu_entry[c]));
    }
  }

  Backend& cuda_;
  Backend& cpu_;
  RandomInputs& rnd_;
  int64_t items_;
  V4CompressorWeights w_;
  int64_t W_ = 0, state_bytes_ = 0, slot_bytes_ = 0;
  std::vector<float> ape_, norm_;
  std::optional<Buffer<float>> d_ape_, d_norm_;
  std::vector<std::vector<float>> host_slots_;
  std::vector<Buffer<float>> dev_slots_;
  std::vector<int64_t> length_;
  std::vector<std::vector<float>> hist_a_, hist_s_;
};

struct CompressorCase {
  int64_t D, ratio;
  bool overlap;
};

// Scripted chunks (group boundaries: a prompt ending one position short of a group, exactly on
// one, one past one; single-token decode steps across boundaries; chunks spanning several groups;
// items idle in a step), then random ones, over three requests side by side.
TEST_F(BackendCudaV4Ops, CompressorEntriesAndStatesMatchTheReference) {
  for (const CompressorCase cc :
       {CompressorCase{16, 4, true}, CompressorCase{64, 4, true}, CompressorCase{32, 128, false}}) {
    const int64_t m = cc.ratio;
    CompressorRun run(cuda(), cpu(), *this, cc.D, m, cc.overlap, 3);
    int64_t compared = 0;
    const std::vector<std::vector<int64_t>> script = {
        {m - 1, m, m + 1},  // short of, on, past the first boundary
        {1, 0, m - 1},      // item 0 completes group 0; item 2 ends exactly on group 1
        {1, 1, 1},          // single decode steps
        {3 * m, 2 * m + 3, 1},
        {0, 0, 0},  // nothing at all
        {m, 1, 2 * m - 1},
    };
    for (const auto& n : script) compared += run.step(n);
    for (int step = 0; step < 12; ++step) {
      std::vector<int64_t> n(3);
      for (int64_t& v : n) v = randint(0, 1) ? randint(0, 2) : randint(0, 3 * m);
      compared += run.step(n);
    }
    EXPECT_GT(compared, 10) << "ratio " << m;  // the bound was exercised on many entries
  }
}

// A decode-graph-like step of only padding items (null slots, n = 0) writes nothing.
TEST_F(BackendCudaV4Ops, CompressorSkipsPaddingItems) {
  V4CompressorWeights w;
  w.H = 8, w.D = 16, w.ratio = 4, w.overlap = true;
  Buffer<float> ape = upload(cuda(), normal(4 * 32)), norm = upload(cuda(), normal(16));
  w.ape = ape.get(), w.norm_weight = norm.get();
  Buffer<uint8_t*> slots = upload(cuda(), std::vector<uint8_t*>{nullptr, nullptr});
  Buffer<int64_t> zeros = upload(cuda(), std::vector<int64_t>{0, 0});
  Buffer<float> a = upload(cuda(), normal(32)), entries = poisoned<float>(cuda(), 16);
  cuda().v4_compress(w, a.get(), a.get(), slots.get(), 0, 2, zeros.get(), zeros.get(), zeros.get(),
                     zeros.get(), entries.get(), stream());
  for (float v : entries.download()) EXPECT_TRUE(std::isnan(v));
}

// ---- graph capture ---------------------------------------------------------------------------

// The four ops captured into one graph and replayed give the eager results bitwise (no host
// synchronisation, allocation or workspace growth inside them).
TEST_F(BackendCudaV4Ops, CapturedOpsReplayTheEagerResults) {
  Backend& be = cuda();
  const int64_t S = 6, H = 40, n = 4, E = 8, k = 2, V = 30, D = 16, m = 4, W = 2 * D;
  Buffer<float> X = upload(be, normal(S * n * H)), fn = upload(be, normal(n * n * H, 0.02)),
                base = upload(be, normal(n)), scale = upload(be, uniform(1, 0.5, 2.0));
  Buffer<float> x = upload(be, normal(S * H)), gate = upload(be, normal(E * H));
  std::vector<int32_t> table(V * k), tokens(S);
  for (int32_t& e : table) e = int32_t(randint(0, E - 1));
  for (int32_t& t : tokens) t = int32_t(randint(0, V - 1));
  Buffer<int32_t> dtable = upload(be, table), dtokens = upload(be, tokens);
  Buffer<int64_t> nv = upload(be, std::vector<int64_t>{0, 1, 2, 5, 3, 9});
  V4CompressorWeights w;
  w.H = H, w.D = D, w.ratio = m, w.overlap = true;
  Buffer<float> ape = upload(be, normal(m * W)), norm = upload(be, uniform(D, 0.5, 1.5));
  w.ape = ape.get(), w.norm_weight = norm.get();
  const int64_t state = kernels::v4_compressor_state_floats(w);
  const std::vector<float> init = normal(state);
  Buffer<float> a = upload(be, normal(S * W)), s = upload(be, normal(S * W));
  // Two items: lengths 3 and 6, 4 and 2 new rows: each completes one group.
  Buffer<int64_t> len = upload(be, std::vector<int64_t>{3, 6}),
                  row0 = upload(be, std::vector<int64_t>{0, 4}),
                  cnt = upload(be, std::vector<int64_t>{4, 2}),
                  e0 = upload(be, std::vector<int64_t>{0, 1});
  struct Outputs {
    Buffer<float> pre, w, entries, slot0, slot1;
    Buffer<int32_t> idx, sel;
    Buffer<uint8_t*> slots;  // {slot0, slot1}
  };
  auto outputs = [&] {
    Outputs o{poisoned<float>(be, S * n),
              poisoned<float>(be, S * k),
              poisoned<float>(be, 2 * D),
              Buffer<float>(be, state),
              Buffer<float>(be, state),
              poisoned<int32_t>(be, S * k, kIndexPoison),
              poisoned<int32_t>(be, S * 8, kIndexPoison),
              Buffer<uint8_t*>(be, 2)};
    o.slot0.upload(init), o.slot1.upload(init);
    o.slots.upload(
        {reinterpret_cast<uint8_t*>(o.slot0.get()), reinterpret_cast<uint8_t*>(o.slot1.get())});
    return o;
  };
  auto enqueue = [&](Outputs& o) {
    const Stream st = be.stream(0);
    be.hc_head_pre(X.get(), fn.get(), base.get(), scale.get(), S, n, H, 1e-6f, 1e-6f, o.pre.get(),
                   st);
    be.moe_route_hash(x.get(), gate.get(), dtable.get(), dtokens.get(), S, H, E, k, V, 1.5f,
                      o.idx.get(), o.w.get(), st);
    be.visible_entries(nv.get(), S, 8, o.sel.get(), st);
    be.v4_compress(w, a.get(), s.get(), o.slots.get(), 0, 2, len.get(), row0.get(), cnt.get(),
                   e0.get(), o.entries.get(), st);
  };
  const auto [eager, graph] = eager_and_replayed(be, outputs, enqueue);
  EXPECT_TRUE(all_written(graph.pre.download()));
  EXPECT_TRUE(all_written(graph.entries.download()));
  EXPECT_TRUE(bitwise_equal(graph.pre.download(), eager.pre.download()));
  EXPECT_TRUE(bitwise_equal(graph.w.download(), eager.w.download()));
  EXPECT_TRUE(bitwise_equal(graph.idx.download(), eager.idx.download()));
  EXPECT_TRUE(bitwise_equal(graph.sel.download(), eager.sel.download()));
  EXPECT_TRUE(bitwise_equal(graph.entries.download(), eager.entries.download()));
  EXPECT_TRUE(bitwise_equal(graph.slot0.download(), eager.slot0.download()));
  EXPECT_TRUE(bitwise_equal(graph.slot1.download(), eager.slot1.download()));
}

}  // namespace
}  // namespace dsv41rt::testing
