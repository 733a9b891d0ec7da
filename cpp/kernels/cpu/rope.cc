#include "kernels/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/status.h"

namespace dsv41rt::kernels::cpu {

void yarn_low_high(int64_t rope_dim, double base, const YarnParams& yarn, int64_t* low,
                   int64_t* high) {
  DSV41RT_CHECK(rope_dim > 0 && base > 0 && base != 1.0, "yarn: bad rope_dim/base ", rope_dim, " ",
                base);
  DSV41RT_CHECK(yarn.original_max_position > 0 && yarn.beta_fast > 0 && yarn.beta_slow > 0,
                "yarn: bad parameters");
  // Same double expressions, same order as NeMo: dim * log(L0 / (beta * 2 * pi)) / (2 * log(base)).
  const double d = static_cast<double>(rope_dim);
  const double l0 = static_cast<double>(yarn.original_max_position);
  const double pi = std::numbers::pi;
  const double lo = std::floor(d * std::log(l0 / (yarn.beta_fast * 2 * pi)) / (2 * std::log(base)));
  const double hi = std::ceil(d * std::log(l0 / (yarn.beta_slow * 2 * pi)) / (2 * std::log(base)));
  *low = std::max<int64_t>(static_cast<int64_t>(lo), 0);
  *high = std::min<int64_t>(static_cast<int64_t>(hi), rope_dim - 1);
}

std::vector<float> rope_inv_freq(int64_t rope_dim, double base, const YarnParams* yarn) {
  DSV41RT_CHECK(rope_dim > 0 && rope_dim % 2 == 0, "rope_inv_freq: rope_dim must be even, got ",
                rope_dim);
  DSV41RT_CHECK(base > 0 && std::isfinite(base), "rope_inv_freq: bad base ", base);
  const int64_t pairs = rope_dim / 2;
  std::vector<float> freq(pairs);
  const float fdim = static_cast<float>(rope_dim);
  for (int64_t k = 0; k < pairs; ++k) {
    const float e = static_cast<float>(2 * k) / fdim;  // torch.arange(0, dim, 2) / dim in FP32
    // torch evaluates base ** e in FP32 (Sleef powf, 1 ulp); pow in double rounded once matches it
    // bit for bit for the tables the model uses (R = 16, 64 at base 1e4 and 1.6e5; see tests).
    const float p = static_cast<float>(std::pow(base, static_cast<double>(e)));
    freq[k] = 1.0f / p;  // 1.0 / tensor == reciprocal in FP32
  }
  if (yarn != nullptr && yarn->original_max_position > 0) {
    DSV41RT_CHECK(yarn->factor > 0 && std::isfinite(yarn->factor), "rope_inv_freq: bad factor ",
                  yarn->factor);
    int64_t low = 0, high = 0;
    yarn_low_high(rope_dim, base, *yarn, &low, &high);
    // max(high - low, 1e-3): an int when >= 1, else the FP32 value of 1e-3.
    const float span = (high - low) >= 1 ? static_cast<float>(high - low) : 1e-3f;
    const float factor = static_cast<float>(yarn->factor);
    for (int64_t k = 0; k < pairs; ++k) {
      const float num = static_cast<float>(k) - static_cast<float>(low);
      const float ramp = std::clamp(num / span, 0.0f, 1.0f);
      // Separate FP32 roundings (no fused multiply-add), as the torch expression evaluates them.
      const float scaled = freq[k] / factor;
      const float a = scaled * ramp;
      const float one_minus = 1.0f - ramp;
      const float b = freq[k] * one_minus;
      freq[k] = a + b;
    }
  }
  return freq;
}

void apply_rope(float* x, int64_t rows, int64_t heads, int64_t head_dim, int64_t rope_dim,
                const int64_t* positions, const float* inv_freq, bool inverse) {
  DSV41RT_CHECK(x != nullptr && positions != nullptr && inv_freq != nullptr,
                "apply_rope: null pointer");
  DSV41RT_CHECK(rows >= 0 && heads > 0 && head_dim > 0, "apply_rope: bad shape rows=", rows,
                " heads=", heads, " head_dim=", head_dim);
  DSV41RT_CHECK(rope_dim > 0 && rope_dim % 2 == 0 && rope_dim <= head_dim,
                "apply_rope: rope_dim must be even and in (0, head_dim], got ", rope_dim);
  const int64_t pairs = rope_dim / 2;
  const int64_t off = head_dim - rope_dim;
#pragma omp parallel for schedule(static) if (rows * heads * rope_dim > (1 << 16))
  for (int64_t r = 0; r < rows; ++r) {
    const float pos = static_cast<float>(positions[r]);
    for (int64_t k = 0; k < pairs; ++k) {
      const float angle = pos * inv_freq[k];
      // torch.polar(1, angle): (1 * cos(angle), 1 * sin(angle)) with the FP32 libm functions.
      const float c = std::cos(angle);
      const float s0 = std::sin(angle);
      const float s = inverse ? -s0 : s0;
      for (int64_t h = 0; h < heads; ++h) {
        float* p = x + (r * heads + h) * head_dim + off + 2 * k;
        const float a = p[0], b = p[1];
        // Complex multiply (a + ib)(c + is): each product rounded, then one add/sub.
        const float ac = a * c, bs = b * s, as = a * s, bc = b * c;
        p[0] = ac - bs;
        p[1] = as + bc;
      }
    }
  }
}

}  // namespace dsv41rt::kernels::cpu
