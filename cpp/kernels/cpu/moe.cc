#include "kernels/moe.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/status.h"
#include "kernels/linear.h"

namespace dsv41rt::kernels::cpu {
namespace {

void check_route_args(const float* x, const float* gate_w, int64_t S, int64_t H, int64_t E,
                      int64_t k, const int32_t* idx, const float* weight) {
  DSV41RT_CHECK(S >= 0 && H > 0 && E > 0, "moe_route: S=", S, " H=", H, " E=", E);
  DSV41RT_CHECK(k >= 1 && k <= E, "moe_route: k=", k, " must be in [1, E=", E, "]");
  DSV41RT_CHECK(S == 0 || (x && gate_w && idx && weight), "moe_route: null pointer");
}

// s = sqrt(softplus(logits)) for every row, in place.
void sqrt_softplus_inplace(float* v, int64_t n) {
  for (int64_t i = 0; i < n; ++i) v[i] = std::sqrt(softplus(v[i]));
}

// Weights from the unbiased scores of the selected experts (NeMo `_route_scores`):
// w = s[idx] / (Σ s[idx] + 1e-20) · scale, the sum in slot order. The score-routed gate normalises
// only when k > 1 (NeMo: norm_topk_prob and topk > 1); the hash gate always (normalize_single).
void gather_weights(const float* s, const int32_t* idx, int64_t k, float scale, bool normalize,
                    float* w, bool normalize_single = false) {
  for (int64_t j = 0; j < k; ++j) w[j] = s[idx[j]];
  if (normalize && (k > 1 || normalize_single)) {
    float sum = 0;
    for (int64_t j = 0; j < k; ++j) sum += w[j];
    const float denom = sum + 1e-20f;
    for (int64_t j = 0; j < k; ++j) w[j] = w[j] / denom;
  }
  for (int64_t j = 0; j < k; ++j) w[j] = w[j] * scale;
}

// s = sqrt(softplus(x · gate_w^T)) of every row: the unbiased gate scores [S, E].
std::vector<float> gate_scores(const float* x, const float* gate_w, int64_t S, int64_t H,
                               int64_t E) {
  std::vector<float> scores(S * E);
  linear(x, gate_w, S, H, E, scores.data());
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < S; ++t) sqrt_softplus_inplace(scores.data() + t * E, E);
  return scores;
}

}  // namespace

float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

void moe_route(const float* x, const float* gate_w, const float* bias, int64_t S, int64_t H,
               int64_t E, int64_t k, float routed_scaling_factor, int32_t* idx, float* weight,
               bool normalize) {
  check_route_args(x, gate_w, S, H, E, k, idx, weight);
  if (S == 0) return;
  std::vector<float> scores = gate_scores(x, gate_w, S, H, E);
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < S; ++t) {
    const float* s = scores.data() + t * E;
    std::vector<float> choice(s, s + E);
    if (bias) {
      for (int64_t e = 0; e < E; ++e) choice[e] = choice[e] + bias[e];
    }
    int32_t* it = idx + t * k;
    // k passes of a strict-greater scan: descending order, ties to the lower index, no UB on NaN.
    std::vector<char> taken(E, 0);
    for (int64_t j = 0; j < k; ++j) {
      int64_t best = -1;
      for (int64_t e = 0; e < E; ++e) {
        if (taken[e]) continue;
        if (best < 0 || choice[e] > choice[best]) best = e;
      }
      taken[best] = 1;
      it[j] = static_cast<int32_t>(best);
    }
    gather_weights(s, it, k, routed_scaling_factor, normalize, weight + t * k);
  }
}

void moe_route_hash(const float* x, const float* gate_w, const int32_t* tid2eid,
                    const int64_t* token_ids, int64_t S, int64_t H, int64_t E, int64_t k,
                    int64_t vocab, float routed_scaling_factor, int32_t* idx, float* weight,
                    bool normalize) {
  check_route_args(x, gate_w, S, H, E, k, idx, weight);
  DSV41RT_CHECK(S == 0 || (tid2eid && token_ids), "moe_route_hash: null pointer");
  for (int64_t t = 0; t < S; ++t) {
    DSV41RT_CHECK(token_ids[t] >= 0 && token_ids[t] < vocab, "moe_route_hash: token id ",
                  token_ids[t], " at ", t, " outside [0, ", vocab, ")");
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = tid2eid[token_ids[t] * k + j];
      DSV41RT_CHECK(e >= 0 && e < E, "moe_route_hash: tid2eid[", token_ids[t], ", ", j, "] = ", e,
                    " outside [0, ", E, ")");
    }
  }
  if (S == 0) return;
  std::vector<float> scores = gate_scores(x, gate_w, S, H, E);
  for (int64_t t = 0; t < S; ++t) {
    const float* s = scores.data() + t * E;
    int32_t* it = idx + t * k;
    for (int64_t j = 0; j < k; ++j) it[j] = tid2eid[token_ids[t] * k + j];
    // transformers 5.23 DeepseekV4HashRouter.forward (modeling_deepseek_v4.py:1119-1128):
    // weights = scores.gather(1, tid2eid[ids]); weights / (weights.sum(-1) + 1e-20) ·
    // routed_scaling_factor, for every k (k = 1 included).
    gather_weights(s, it, k, routed_scaling_factor, normalize, weight + t * k,
                   /*normalize_single=*/true);
  }
}

void swiglu_expert(const float* x, const float* w1, const float* w3, const float* w2,
                   const float* row_scale, int64_t m, int64_t H, int64_t I, float limit, float* y,
                   bool accumulate, GemmInputs inputs) {
  DSV41RT_CHECK(m >= 0 && H > 0 && I > 0, "swiglu_expert: m=", m, " H=", H, " I=", I);
  if (m == 0) return;
  DSV41RT_CHECK(x && w1 && w3 && w2 && y, "swiglu_expert: null pointer");
  DSV41RT_CHECK(x != y, "swiglu_expert: y must not alias x");
  std::vector<float> g(m * I), u(m * I), xr;
  if (inputs != GemmInputs::kFp32) {
    xr.assign(x, x + m * H);
    round_gemm_inputs(xr.data(), m, H, inputs);
    x = xr.data();
  }
  linear(x, w1, m, H, I, g.data());
  linear(x, w3, m, H, I, u.data());
  const bool clamp = limit > 0.0f;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < m; ++r) {
    float* gr = g.data() + r * I;
    const float* ur = u.data() + r * I;
    const float scale = row_scale ? row_scale[r] : 1.0f;
    for (int64_t c = 0; c < I; ++c) {
      float gv = gr[c], uv = ur[c];
      if (clamp) {
        // torch.clamp semantics: one-sided on the gate, symmetric on up, NaN propagates.
        gv = gv > limit ? limit : gv;
        uv = uv > limit ? limit : (uv < -limit ? -limit : uv);
      }
      const float h = gv / (1.0f + std::exp(-gv)) * uv;
      gr[c] = row_scale ? h * scale : h;
    }
  }
  round_gemm_inputs(g.data(), m, I, inputs);
  linear(g.data(), w2, m, I, H, y, accumulate);
}

namespace {

// Runs the routed experts [e_begin, e_begin + count) over their (token, slot) pairs, expert by
// expert in ascending id with each expert's pairs token-major, and hands every pair's output row
// to sink(pair = t * k + slot, row). experts[i] is expert e_begin + i.
template <typename Sink>
void run_routed(const float* x, const int32_t* idx, const float* weight, int64_t S, int64_t H,
                int64_t k, int64_t E, int64_t I, const SwigluWeights* experts, int64_t e_begin,
                int64_t count, float limit, GemmInputs inputs, Sink sink) {
  std::vector<std::vector<int64_t>> pairs(E);
  for (int64_t t = 0; t < S; ++t) {
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = idx[t * k + j];
      DSV41RT_CHECK(e >= 0 && e < E, "moe: idx[", t, ", ", j, "] = ", e, " outside [0, ", E, ")");
      pairs[e].push_back(t * k + j);
    }
  }
  std::vector<float> xg, sg, out;
  for (int64_t e = e_begin; e < e_begin + count; ++e) {
    const auto& p = pairs[e];
    if (p.empty()) continue;
    const SwigluWeights& w = experts[e - e_begin];
    DSV41RT_CHECK(w.w1 && w.w3 && w.w2, "moe: expert ", e, " has no weights");
    const int64_t m = static_cast<int64_t>(p.size());
    xg.resize(m * H);
    sg.resize(m);
    out.resize(m * H);
    for (int64_t r = 0; r < m; ++r) {
      const int64_t t = p[r] / k;
      for (int64_t c = 0; c < H; ++c) xg[r * H + c] = x[t * H + c];
      sg[r] = weight[p[r]];
    }
    swiglu_expert(xg.data(), w.w1, w.w3, w.w2, sg.data(), m, H, I, limit, out.data(), false,
                  inputs);
    for (int64_t r = 0; r < m; ++r) sink(p[r], out.data() + r * H);
  }
}

void add_shared(const float* x, int64_t S, int64_t H, const SwigluWeights* shared, int64_t I_shared,
                float limit, float* y, GemmInputs inputs) {
  if (!shared) return;
  DSV41RT_CHECK(shared->w1 && shared->w3 && shared->w2, "moe: shared expert weights");
  swiglu_expert(x, shared->w1, shared->w3, shared->w2, nullptr, S, H, I_shared, limit, y,
                /*accumulate=*/true, inputs);
}

}  // namespace

void moe_forward(const float* x, const int32_t* idx, const float* weight, int64_t S, int64_t H,
                 int64_t k, int64_t E, int64_t I, const SwigluWeights* experts,
                 const SwigluWeights* shared, int64_t I_shared, float limit, float* y,
                 GemmInputs inputs) {
  DSV41RT_CHECK(S >= 0 && H > 0 && k >= 1 && E > 0 && I > 0, "moe_forward: S=", S, " H=", H,
                " k=", k, " E=", E, " I=", I);
  if (S == 0) return;
  DSV41RT_CHECK(x && idx && weight && experts && y, "moe_forward: null pointer");
  DSV41RT_CHECK(!shared || I_shared > 0, "moe_forward: I_shared=", I_shared);
  for (int64_t i = 0; i < S * H; ++i) y[i] = 0.0f;
  run_routed(x, idx, weight, S, H, k, E, I, experts, 0, E, limit, inputs,
             [&](int64_t pair, const float* o) {
               float* yr = y + (pair / k) * H;
               for (int64_t c = 0; c < H; ++c) yr[c] += o[c];
             });
  add_shared(x, S, H, shared, I_shared, limit, y, inputs);
}

void moe_slots(const float* x, const int32_t* idx, const float* weight, int64_t S, int64_t H,
               int64_t k, int64_t E, int64_t I, const SwigluWeights* experts, int64_t e_begin,
               int64_t count, float limit, float* slots, GemmInputs inputs) {
  DSV41RT_CHECK(S >= 0 && H > 0 && k >= 1 && E > 0 && I > 0, "moe_slots: S=", S, " H=", H, " k=", k,
                " E=", E, " I=", I);
  DSV41RT_CHECK(e_begin >= 0 && count >= 0 && e_begin + count <= E, "moe_slots: experts [", e_begin,
                ", ", e_begin + count, ") outside [0, ", E, ")");
  if (S == 0) return;
  DSV41RT_CHECK(x && idx && weight && slots && (experts || count == 0), "moe_slots: null pointer");
  for (int64_t i = 0; i < S * k * H; ++i) slots[i] = 0.0f;
  run_routed(x, idx, weight, S, H, k, E, I, experts, e_begin, count, limit, inputs,
             [&](int64_t pair, const float* o) { std::copy(o, o + H, slots + pair * H); });
}

void moe_local_ids(const int32_t* idx, int64_t n, int64_t begin, int64_t count, int32_t* out) {
  DSV41RT_CHECK(n >= 0 && count >= 1 && (n == 0 || (idx && out)), "moe_local_ids: n=", n,
                " count=", count, " or null pointer");
  for (int64_t i = 0; i < n; ++i) {
    const int64_t e = int64_t(idx[i]) - begin;
    out[i] = int32_t(e >= 0 && e < count ? e : count);
  }
}

void moe_combine(const float* x, const int32_t* idx, const float* slots, int64_t S, int64_t H,
                 int64_t k, const SwigluWeights* shared, int64_t I_shared, float limit, float* y,
                 GemmInputs inputs) {
  DSV41RT_CHECK(S >= 0 && H > 0 && k >= 1, "moe_combine: S=", S, " H=", H, " k=", k);
  if (S == 0) return;
  DSV41RT_CHECK(x && idx && slots && y, "moe_combine: null pointer");
  DSV41RT_CHECK(!shared || I_shared > 0, "moe_combine: I_shared=", I_shared);
  std::vector<int64_t> order(static_cast<size_t>(k));
  for (int64_t t = 0; t < S; ++t) {
    // moe_forward adds a token's slots expert by expert in ascending id (ties keep slot order).
    for (int64_t j = 0; j < k; ++j) order[j] = j;
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return idx[t * k + a] < idx[t * k + b]; });
    float* yr = y + t * H;
    for (int64_t c = 0; c < H; ++c) yr[c] = 0.0f;
    for (int64_t j : order) {
      const float* o = slots + (t * k + j) * H;
      for (int64_t c = 0; c < H; ++c) yr[c] += o[c];
    }
  }
  add_shared(x, S, H, shared, I_shared, limit, y, inputs);
}

}  // namespace dsv41rt::kernels::cpu
