#include "kernels/mhc.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/status.h"
#include "kernels/linear.h"
#include "kernels/rms_norm.h"

namespace dsv41rt::kernels::cpu {
namespace {

// One n×n matrix, in place: NeMo's sinkhorn_normalize_torch.
void sinkhorn_one(float* c, int64_t n, float eps, int iters, float* sums) {
  // softmax over the last dim (o), per row i: exp(z - max) * (1 / Σ).
  for (int64_t i = 0; i < n; ++i) {
    float* row = c + i * n;
    float m = row[0];
    for (int64_t o = 1; o < n; ++o) m = std::max(m, row[o]);
    float s = 0;
    for (int64_t o = 0; o < n; ++o) {
      row[o] = std::exp(row[o] - m);
      s += row[o];
    }
    const float inv = 1.0f / s;
    for (int64_t o = 0; o < n; ++o) row[o] = row[o] * inv + eps;
  }
  auto col_norm = [&] {
    for (int64_t o = 0; o < n; ++o) sums[o] = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t o = 0; o < n; ++o) sums[o] += c[i * n + o];
    for (int64_t o = 0; o < n; ++o) sums[o] += eps;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t o = 0; o < n; ++o) c[i * n + o] /= sums[o];
  };
  auto row_norm = [&] {
    for (int64_t i = 0; i < n; ++i) {
      float s = 0;
      for (int64_t o = 0; o < n; ++o) s += c[i * n + o];
      s += eps;
      for (int64_t o = 0; o < n; ++o) c[i * n + o] /= s;
    }
  };
  col_norm();
  for (int t = 1; t < iters; ++t) {
    row_norm();
    col_norm();
  }
}

}  // namespace

void hc_sinkhorn(float* logits, int64_t count, int64_t n, float hc_eps, int iters) {
  DSV41RT_CHECK(logits != nullptr || count == 0, "hc_sinkhorn: null logits");
  DSV41RT_CHECK(count >= 0 && n > 0 && iters >= 1, "hc_sinkhorn: bad count/n/iters ", count, " ", n,
                " ", iters);
#pragma omp parallel if (count > 256)
  {
    std::vector<float> sums(n);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < count; ++t)
      sinkhorn_one(logits + t * n * n, n, hc_eps, iters, sums.data());
  }
}

void hc_mix(const float* X, const float* fn, const float* base, const float* scale, int64_t S,
            int64_t n, int64_t H, float rms_eps, float hc_eps, int iters, float* pre, float* post,
            float* comb) {
  DSV41RT_CHECK(X && fn && base && scale && pre && post && comb, "hc_mix: null pointer");
  DSV41RT_CHECK(S >= 0 && n > 0 && H > 0, "hc_mix: bad shape S=", S, " n=", n, " H=", H);
  DSV41RT_CHECK(iters >= 1, "hc_mix: iters must be >= 1, got ", iters);
  DSV41RT_CHECK(rms_eps >= 0 && hc_eps >= 0, "hc_mix: negative eps");
  if (S == 0) return;
  const int64_t W = (2 + n) * n, K = n * H;
  std::vector<float> mix(S * W);
  linear(X, fn, S, K, W, mix.data());  // (f · fn^T), before the RMS scale
  const float s0 = scale[0], s1 = scale[1], s2 = scale[2];
#pragma omp parallel for schedule(static) if (S * K > (1 << 16))
  for (int64_t s = 0; s < S; ++s) {
    const float r = rms_inv(X + s * K, K, rms_eps);
    float* z = mix.data() + s * W;
    for (int64_t j = 0; j < W; ++j) {
      const float m = z[j] * r;
      const float sc = j < n ? s0 : (j < 2 * n ? s1 : s2);
      const float prod = m * sc;  // addcmul: base + (mix * scale), two roundings
      z[j] = base[j] + prod;
    }
    for (int64_t i = 0; i < n; ++i) {
      pre[s * n + i] = 1.0f / (1.0f + std::exp(-z[i])) + hc_eps;
      post[s * n + i] = 2.0f * (1.0f / (1.0f + std::exp(-z[n + i])));
    }
    for (int64_t j = 0; j < n * n; ++j) comb[s * n * n + j] = z[2 * n + j];
  }
  hc_sinkhorn(comb, S, n, hc_eps, iters);
}

void hc_head_pre(const float* X, const float* fn, const float* base, const float* scale, int64_t S,
                 int64_t n, int64_t H, float rms_eps, float hc_eps, float* pre) {
  DSV41RT_CHECK(X && fn && base && scale && pre, "hc_head_pre: null pointer");
  DSV41RT_CHECK(S >= 0 && n > 0 && H > 0, "hc_head_pre: bad shape S=", S, " n=", n, " H=", H);
  DSV41RT_CHECK(rms_eps >= 0 && hc_eps >= 0, "hc_head_pre: negative eps");
  if (S == 0) return;
  const int64_t K = n * H;
  std::vector<float> mix(S * n);
  linear(X, fn, S, K, n, mix.data());  // (f · fn^T), before the RMS scale, as hc_mix
  for (int64_t s = 0; s < S; ++s) {
    const float r = rms_inv(X + s * K, K, rms_eps);
    for (int64_t i = 0; i < n; ++i) {
      const float prod = (mix[s * n + i] * r) * scale[0];
      pre[s * n + i] = 1.0f / (1.0f + std::exp(-(base[i] + prod))) + hc_eps;
    }
  }
}

void hc_collapse(const float* X, const float* w, int64_t S, int64_t n, int64_t H, float* u) {
  DSV41RT_CHECK(X && w && u, "hc_collapse: null pointer");
  DSV41RT_CHECK(S >= 0 && n > 0 && H > 0, "hc_collapse: bad shape S=", S, " n=", n, " H=", H);
#pragma omp parallel for schedule(static) if (S * n * H > (1 << 16))
  for (int64_t s = 0; s < S; ++s) {
    float* ur = u + s * H;
    for (int64_t h = 0; h < H; ++h) ur[h] = 0.0f;
    for (int64_t i = 0; i < n; ++i) {
      const float wi = w[s * n + i];
      const float* xi = X + (s * n + i) * H;
      for (int64_t h = 0; h < H; ++h) {
        const float p = wi * xi[h];
        ur[h] += p;
      }
    }
  }
}

void hc_expand(const float* X, const float* y, const float* post, const float* comb, int64_t S,
               int64_t n, int64_t H, float* out) {
  DSV41RT_CHECK(X && y && post && comb && out, "hc_expand: null pointer");
  DSV41RT_CHECK(S >= 0 && n > 0 && H > 0, "hc_expand: bad shape S=", S, " n=", n, " H=", H);
#pragma omp parallel for collapse(2) schedule(static) if (S * n * n * H > (1 << 16))
  for (int64_t s = 0; s < S; ++s) {
    for (int64_t o = 0; o < n; ++o) {
      float* dst = out + (s * n + o) * H;
      for (int64_t h = 0; h < H; ++h) dst[h] = 0.0f;
      for (int64_t i = 0; i < n; ++i) {
        const float c = comb[(s * n + i) * n + o];
        const float* xi = X + (s * n + i) * H;
        for (int64_t h = 0; h < H; ++h) {
          const float p = c * xi[h];
          dst[h] += p;
        }
      }
      const float po = post[s * n + o];
      const float* yr = y + s * H;
      for (int64_t h = 0; h < H; ++h) {
        const float upd = po * yr[h];
        dst[h] = upd + dst[h];
      }
    }
  }
}

}  // namespace dsv41rt::kernels::cpu
