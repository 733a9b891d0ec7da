#include <algorithm>

#include "core/dtype.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/moe.cuh"
#include "kernels/cuda/swiglu.cuh"
#include "kernels/cuda/weight_decode.cuh"

namespace dsv41rt::kernels::cuda {
namespace {

constexpr int kWarp = 32;

__device__ __forceinline__ float widen(float v) { return v; }

// Warp-wide FP32 dot product of a[0, n) and b[0, n) (order differs from the CPU; values only).
template <typename W>
__device__ float warp_dot(const float* a, const W* b, int64_t n, int lane) {
  float acc = 0.0f;
  for (int64_t c = lane; c < n; c += kWarp) acc += a[c] * widen(b[c]);
  for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  return acc;
}

// The same dot product with b = row `row` of a stored weight matrix (decoded exactly to FP32, so
// the value equals warp_dot over FP32 weights of the same values).
template <WeightFormat F>
__device__ float warp_dot_row(const float* a, const WeightView& w, int64_t row, int64_t n,
                              int lane) {
  float acc = 0.0f;
  for (int64_t c = lane; c < n; c += kWarp) acc += a[c] * weight_at<F>(w, row, c);
  for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  return acc;
}

// The next routed slot of a token in ascending (expert id, slot) order after (prev_e, prev_j);
// be = -1 when none is left.
__device__ __forceinline__ void next_slot(const int32_t* it, int64_t k, int64_t prev_e,
                                          int64_t prev_j, int64_t& be, int64_t& bj) {
  be = -1, bj = -1;
  for (int64_t jj = 0; jj < k; ++jj) {
    const int64_t e = it[jj];
    const bool after = e > prev_e || (e == prev_e && jj > prev_j);
    if (after && (be < 0 || e < be || (e == be && jj < bj))) be = e, bj = jj;
  }
}

// h[i] = silu(min(g, L)) * clamp(u, -L, L) * scale for one expert, into shared memory.
template <typename W>
__device__ void swiglu_hidden(const float* xs, const W* w1, const W* w3, int64_t H, int64_t I,
                              float limit, bool has_scale, float scale, float* hs) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int warps = blockDim.x / kWarp;
  for (int64_t i = warp; i < I; i += warps) {
    float g = warp_dot(xs, w1 + i * H, H, lane);
    float u = warp_dot(xs, w3 + i * H, H, lane);
    if (lane == 0) hs[i] = swiglu_unit(g, u, limit, has_scale, scale);
  }
}

// yr[c] += h · w2[c, :] for c in [0, H).
template <typename W>
__device__ void swiglu_down(const float* hs, const W* w2, int64_t H, int64_t I, float* yr) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int warps = blockDim.x / kWarp;
  for (int64_t c = warp; c < H; c += warps) {
    const float v = warp_dot(hs, w2 + c * I, I, lane);
    if (lane == 0) yr[c] = yr[c] + v;
  }
}

// One block per token (grid-stride): y row = 0, then each routed slot in ascending (expert id,
// slot) order, then the shared expert. The slot order is recomputed by every thread (uniform).
template <typename W>
__global__ void moe_forward_kernel(const float* __restrict__ x, const int32_t* __restrict__ idx,
                                   const float* __restrict__ weight, int64_t S, int64_t H,
                                   int64_t k, int64_t E, int64_t I, const W* __restrict__ w1,
                                   const W* __restrict__ w3, const W* __restrict__ w2,
                                   const W* __restrict__ sw1, const W* __restrict__ sw3,
                                   const W* __restrict__ sw2, int64_t Is, float limit,
                                   float* __restrict__ y) {
  pdl_entry();
  extern __shared__ float smem[];
  float* xs = smem;      // [H]
  float* hs = smem + H;  // [max(I, Is)]
  for (int64_t t = blockIdx.x; t < S; t += gridDim.x) {
    float* yr = y + t * H;
    for (int64_t c = threadIdx.x; c < H; c += blockDim.x) {
      xs[c] = x[t * H + c];
      yr[c] = 0.0f;
    }
    __syncthreads();
    const int32_t* it = idx + t * k;
    int64_t prev_e = -1, prev_j = -1;
    for (int64_t n = 0; n < k; ++n) {
      int64_t be, bj;
      next_slot(it, k, prev_e, prev_j, be, bj);
      prev_e = be, prev_j = bj;
      if (be < 0 || be >= E) continue;  // invalid id: contract violation, skip (block-uniform)
      swiglu_hidden(xs, w1 + be * I * H, w3 + be * I * H, H, I, limit, true, weight[t * k + bj],
                    hs);
      __syncthreads();
      swiglu_down(hs, w2 + be * H * I, H, I, yr);
      __syncthreads();
    }
    if (sw1) {
      swiglu_hidden(xs, sw1, sw3, H, Is, limit, false, 1.0f, hs);
      __syncthreads();
      swiglu_down(hs, sw2, H, Is, yr);
      __syncthreads();
    }
  }
}

// ---- split path: many blocks per token (decode-sized batches keep every SM busy) -------------
// Hidden: one warp per (token, slot, hidden unit); slot k is the shared expert. hidden is
// [S, k + 1, ld]. Same warp_dot and swiglu_unit as the per-token kernel, so the values are
// bitwise equal to it.
template <WeightFormat FR, WeightFormat FS>
__global__ void moe_hidden_kernel(const float* __restrict__ x, const int32_t* __restrict__ idx,
                                  const float* __restrict__ weight, int64_t S, int64_t H, int64_t k,
                                  int64_t E, int64_t I, const WeightView w1, const WeightView w3,
                                  const WeightView sw1, const WeightView sw3, int64_t Is,
                                  float limit, int64_t ld, float* __restrict__ hidden) {
  pdl_entry();
  const int lane = threadIdx.x % kWarp;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / kWarp);
  const int64_t total = S * (k + 1) * ld;
  for (int64_t w = int64_t(blockIdx.x) * (blockDim.x / kWarp) + threadIdx.x / kWarp; w < total;
       w += warps) {
    const int64_t i = w % ld, j = (w / ld) % (k + 1), t = w / (ld * (k + 1));
    const float* xr = x + t * H;
    float h;
    if (j < k) {
      const int64_t e = idx[t * k + j];
      if (i >= I || e < 0 || e >= E) continue;  // warp-uniform
      const float g = warp_dot_row<FR>(xr, w1, e * I + i, H, lane);
      const float u = warp_dot_row<FR>(xr, w3, e * I + i, H, lane);
      h = swiglu_unit(g, u, limit, true, weight[t * k + j]);
    } else {
      if (i >= Is || sw1.data == nullptr) continue;
      const float g = warp_dot_row<FS>(xr, sw1, i, H, lane);
      const float u = warp_dot_row<FS>(xr, sw3, i, H, lane);
      h = swiglu_unit(g, u, limit, false, 1.0f);
    }
    if (lane == 0) hidden[(t * (k + 1) + j) * ld + i] = h;
  }
}

// Down: one warp per (token, output channel): 0, then each routed slot in ascending (expert id,
// slot) order, then the shared expert, accumulated as the per-token kernel does.
template <WeightFormat FR, WeightFormat FS>
__global__ void moe_down_kernel(const int32_t* __restrict__ idx, int64_t S, int64_t H, int64_t k,
                                int64_t E, int64_t I, const WeightView w2, const WeightView sw2,
                                int64_t Is, int64_t ld, const float* __restrict__ hidden,
                                float* __restrict__ y) {
  pdl_entry();
  const int lane = threadIdx.x % kWarp;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / kWarp);
  for (int64_t w = int64_t(blockIdx.x) * (blockDim.x / kWarp) + threadIdx.x / kWarp; w < S * H;
       w += warps) {
    const int64_t c = w % H, t = w / H;
    const int32_t* it = idx + t * k;
    float yc = 0.0f;
    int64_t prev_e = -1, prev_j = -1;
    for (int64_t n = 0; n < k; ++n) {
      int64_t be, bj;
      next_slot(it, k, prev_e, prev_j, be, bj);
      prev_e = be, prev_j = bj;
      if (be < 0 || be >= E) continue;
      const float v = warp_dot_row<FR>(hidden + (t * (k + 1) + bj) * ld, w2, be * H + c, I, lane);
      yc = yc + v;
    }
    if (sw2.data != nullptr) {
      const float v = warp_dot_row<FS>(hidden + (t * (k + 1) + k) * ld, sw2, c, Is, lane);
      yc = yc + v;
    }
    if (lane == 0) y[t * H + c] = yc;
  }
}

int grid_for_rows(int64_t rows) { return static_cast<int>(rows < kMaxBlocks ? rows : kMaxBlocks); }

}  // namespace

namespace {

template <typename W>
cudaError_t launch_moe_forward(const float* x, const int32_t* idx, const float* weight, int64_t S,
                               int64_t H, int64_t k, int64_t E, int64_t I, const W* w1, const W* w3,
                               const W* w2, const W* shared_w1, const W* shared_w3,
                               const W* shared_w2, int64_t I_shared, float limit, float* y,
                               cudaStream_t stream) {
  if (S <= 0) return S == 0 ? cudaSuccess : cudaErrorInvalidValue;
  if (H <= 0 || k < 1 || E <= 0 || I <= 0) return cudaErrorInvalidValue;
  const bool shared = shared_w1 != nullptr;
  if (shared && (!shared_w3 || !shared_w2 || I_shared <= 0)) return cudaErrorInvalidValue;
  const int64_t imax = shared ? std::max(I, I_shared) : I;
  const size_t smem = size_t(H + imax) * sizeof(float);
  if (smem > 48 * 1024) {
    const cudaError_t err = cudaFuncSetAttribute(
        moe_forward_kernel<W>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (err != cudaSuccess) return err;
  }
  moe_forward_kernel<W><<<grid_for_rows(S), kThreads, smem, stream>>>(
      x, idx, weight, S, H, k, E, I, w1, w3, w2, shared ? shared_w1 : nullptr, shared_w3, shared_w2,
      shared ? I_shared : 0, limit, y);
  return launch_status();
}

cudaError_t launch_moe_split(const float* x, const int32_t* idx, const float* weight, int64_t S,
                             int64_t H, int64_t k, int64_t E, int64_t I, const WeightView& w1,
                             const WeightView& w3, const WeightView& w2, const WeightView& sw1,
                             const WeightView& sw3, const WeightView& sw2, int64_t Is, float limit,
                             float* y, float* workspace, int64_t workspace_floats,
                             cudaStream_t stream) {
  if (S <= 0) return S == 0 ? cudaSuccess : cudaErrorInvalidValue;
  if (H <= 0 || k < 1 || E <= 0 || I <= 0) return cudaErrorInvalidValue;
  const bool shared = sw1.data != nullptr;
  if (shared && (!sw3.data || !sw2.data || Is <= 0)) return cudaErrorInvalidValue;
  // Every matrix must cover the shapes it is read with.
  const bool routed_ok = w1.data && w3.data && w2.data && w1.format == w3.format &&
                         w1.format == w2.format && w1.rows == E * I && w1.cols == H &&
                         w3.rows == E * I && w3.cols == H && w2.rows == E * H && w2.cols == I;
  const bool shared_ok = !shared || (sw1.format == sw3.format && sw1.format == sw2.format &&
                                     sw1.rows == Is && sw1.cols == H && sw3.rows == Is &&
                                     sw3.cols == H && sw2.rows == H && sw2.cols == Is);
  if (!routed_ok || !shared_ok) return cudaErrorInvalidValue;
  const WeightView none{};
  const int64_t ld = shared ? std::max(I, Is) : I;
  const int64_t per_token = (k + 1) * ld;
  const int64_t chunk = workspace ? workspace_floats / per_token : 0;
  if (chunk < 1) return cudaErrorInvalidValue;
  for (int64_t t0 = 0; t0 < S; t0 += chunk) {
    const int64_t n = std::min(chunk, S - t0);
    const int64_t hidden_warps = n * per_token, down_warps = n * H;
    dispatch_format(w1.format, [&]<WeightFormat FR>() {
      dispatch_format(shared ? sw1.format : WeightFormat::kF32, [&]<WeightFormat FS>() {
        moe_hidden_kernel<FR, FS><<<blocks_for(hidden_warps * kWarp), kThreads, 0, stream>>>(
            x + t0 * H, idx + t0 * k, weight + t0 * k, n, H, k, E, I, w1, w3, shared ? sw1 : none,
            shared ? sw3 : none, shared ? Is : 0, limit, ld, workspace);
        moe_down_kernel<FR, FS><<<blocks_for(down_warps * kWarp), kThreads, 0, stream>>>(
            idx + t0 * k, n, H, k, E, I, w2, shared ? sw2 : none, shared ? Is : 0, ld, workspace,
            y + t0 * H);
      });
    });
    const cudaError_t err = launch_status();
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace

int64_t moe_split_workspace_floats(int64_t S, int64_t k, int64_t I, int64_t I_shared) {
  return S * (k + 1) * std::max(I, I_shared);
}

cudaError_t moe_forward_split(const float* x, const int32_t* idx, const float* weight, int64_t S,
                              int64_t H, int64_t k, int64_t E, int64_t I, const WeightView& w1,
                              const WeightView& w3, const WeightView& w2,
                              const WeightView& shared_w1, const WeightView& shared_w3,
                              const WeightView& shared_w2, int64_t I_shared, float limit, float* y,
                              float* workspace, int64_t workspace_floats, cudaStream_t stream) {
  return launch_moe_split(x, idx, weight, S, H, k, E, I, w1, w3, w2, shared_w1, shared_w3,
                          shared_w2, I_shared, limit, y, workspace, workspace_floats, stream);
}

cudaError_t moe_forward(const float* x, const int32_t* idx, const float* weight, int64_t S,
                        int64_t H, int64_t k, int64_t E, int64_t I, const float* w1,
                        const float* w3, const float* w2, const float* shared_w1,
                        const float* shared_w3, const float* shared_w2, int64_t I_shared,
                        float limit, float* y, cudaStream_t stream) {
  return launch_moe_forward(x, idx, weight, S, H, k, E, I, w1, w3, w2, shared_w1, shared_w3,
                            shared_w2, I_shared, limit, y, stream);
}

namespace {
__global__ void local_ids_kernel(const int32_t* __restrict__ idx, int64_t n, int64_t begin,
                                 int64_t count, int32_t* __restrict__ out) {
  pdl_entry();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t e = int64_t(idx[i]) - begin;
    out[i] = int32_t(e >= 0 && e < count ? e : count);
  }
}
}  // namespace

cudaError_t moe_local_ids(const int32_t* idx, int64_t n, int64_t begin, int64_t count, int32_t* out,
                          cudaStream_t stream) {
  if (n < 0 || count < 1 || (n > 0 && (!idx || !out))) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  const int64_t blocks = std::min<int64_t>((n + 255) / 256, 1024);
  local_ids_kernel<<<unsigned(blocks), 256, 0, stream>>>(idx, n, begin, count, out);
  return cudaGetLastError();
}

}  // namespace dsv41rt::kernels::cuda
