#include "kernels/cuda/linear.cuh"
#include "kernels/cuda/mhc.cuh"
#include "kernels/cuda/rope.cuh"
#include "kernels/cuda/testing/device_buffer.cuh"
#include "kernels/cuda/testing/rope_mhc_test_entry.h"

namespace dsv41rt::kernels::cuda::testing {

void apply_rope(const float* x, int64_t rows, int64_t heads, int64_t head_dim, int64_t rope_dim,
                const int64_t* positions, const float* inv_freq, bool inverse, float* y) {
  DSV41RT_CHECK(rows >= 0 && heads > 0 && head_dim > 0 && rope_dim > 0 && rope_dim % 2 == 0 &&
                    rope_dim <= head_dim,
                "apply_rope: bad shape rows=", rows, " heads=", heads, " head_dim=", head_dim,
                " rope_dim=", rope_dim);
  DeviceBuffer<float> dx(x, rows * heads * head_dim), df(inv_freq, rope_dim / 2);
  DeviceBuffer<int64_t> dp(positions, rows);
  finish(cuda::apply_rope(dx.get(), rows, heads, head_dim, rope_dim, dp.get(), df.get(), inverse,
                          nullptr));
  dx.to_host(y);
}

void hc_mix(const float* X, const float* fn, const float* base, const float* scale, int64_t S,
            int64_t n, int64_t H, float rms_eps, float hc_eps, int iters, float* pre, float* post,
            float* comb) {
  DSV41RT_CHECK(S >= 0 && n > 0 && H > 0 && iters >= 1, "hc_mix: bad S/n/H/iters ", S, " ", n, " ",
                H, " ", iters);
  const int64_t W = (2 + n) * n;
  DeviceBuffer<float> dX(X, S * n * H), dfn(fn, W * n * H), dbase(base, W), dscale(scale, 3);
  DeviceBuffer<float> dpre(S * n), dpost(S * n), dcomb(S * n * n);
  dpre.poison();
  dpost.poison();
  dcomb.poison();
  finish(cuda::hc_mix(dX.get(), dfn.get(), dbase.get(), dscale.get(), S, n, H, rms_eps, hc_eps,
                      iters, dpre.get(), dpost.get(), dcomb.get(), nullptr));
  dpre.to_host(pre);
  dpost.to_host(post);
  dcomb.to_host(comb);
}

void hc_collapse(const float* X, const float* w, int64_t S, int64_t n, int64_t H, float* u) {
  DSV41RT_CHECK(S >= 0 && n > 0 && H > 0, "hc_collapse: bad S/n/H ", S, " ", n, " ", H);
  DeviceBuffer<float> dX(X, S * n * H), dw(w, S * n), du(S * H);
  du.poison();
  finish(cuda::hc_collapse(dX.get(), dw.get(), S, n, H, du.get(), nullptr));
  du.to_host(u);
}

void hc_expand(const float* X, const float* y, const float* post, const float* comb, int64_t S,
               int64_t n, int64_t H, float* out) {
  DSV41RT_CHECK(S >= 0 && n > 0 && H > 0, "hc_expand: bad S/n/H ", S, " ", n, " ", H);
  DeviceBuffer<float> dX(X, S * n * H), dy(y, S * H), dpost(post, S * n), dcomb(comb, S * n * n);
  DeviceBuffer<float> dout(S * n * H);
  dout.poison();
  finish(
      cuda::hc_expand(dX.get(), dy.get(), dpost.get(), dcomb.get(), S, n, H, dout.get(), nullptr));
  dout.to_host(out);
}

void linear(const float* x, const float* w, int64_t m, int64_t k, int64_t n, float* y,
            bool accumulate) {
  DSV41RT_CHECK(m >= 0 && k >= 0 && n >= 0, "linear: bad shape m=", m, " k=", k, " n=", n);
  DeviceBuffer<float> dx(x, m * k), dw(w, n * k);
  DeviceBuffer<float> dy(m * n);
  if (accumulate) {
    DeviceBuffer<float> init(y, m * n);
    if (m * n > 0) {
      DSV41RT_CUDA_CHECK(cudaMemcpy(dy.get(), init.get(), dy.bytes(), cudaMemcpyDeviceToDevice));
    }
  } else {
    dy.poison();
  }
  finish(cuda::linear(dx.get(), dw.get(), m, k, n, dy.get(), accumulate, nullptr));
  dy.to_host(y);
}

void grouped_linear(const float* x, const float* w, int64_t m, int64_t groups, int64_t k_g,
                    int64_t n_g, float* y) {
  DSV41RT_CHECK(m >= 0 && groups >= 0 && k_g >= 0 && n_g >= 0, "grouped_linear: bad shape m=", m,
                " groups=", groups, " k_g=", k_g, " n_g=", n_g);
  DeviceBuffer<float> dx(x, m * groups * k_g), dw(w, groups * n_g * k_g);
  DeviceBuffer<float> dy(m * groups * n_g);
  dy.poison();
  finish(cuda::grouped_linear(dx.get(), dw.get(), m, groups, k_g, n_g, dy.get(), nullptr));
  dy.to_host(y);
}

}  // namespace dsv41rt::kernels::cuda::testing
