#include <cmath>

#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/common.cuh"

namespace dsv41rt::kernels::cuda {
namespace {

// Keys per chunk held in shared memory (index + logit). K <= kChunk (the usual case: top-k plus
// window) is one pass with the CPU reference's exact structure (global max, then exp-sum);
// longer key lists run an online softmax over chunks (rescaling the partial sums).
constexpr int kChunk = 1024;

struct Sum {
  __device__ float operator()(float a, float b) const { return a + b; }
};
struct Max {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

template <class Op>
__device__ __forceinline__ float warp_reduce(float v, Op op) {
  for (int off = 16; off > 0; off >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) { return warp_reduce(v, Sum{}); }

// Block reduction: every thread gets the same value (warp partials combined in a fixed order).
// Must be called by all threads of the block; `red` holds >= 32 floats.
template <class Op>
__device__ float block_reduce(float v, float* red, Op op) {
  v = warp_reduce(v, op);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float r = red[0];
  for (int w = 1; w < nwarps; ++w) r = op(r, red[w]);
  __syncthreads();
  return r;
}

// One block per (query, head); blockDim.x is a multiple of 32. Per chunk of keys: the row
// indices are staged in shared memory (invalid ones, -1 or outside [0, T), become -1 and are
// skipped), one warp per key computes the logit, the block takes the max (including the sink
// and the previous chunks), turns logits into probabilities in place, and every thread updates
// its own output channels d = tid, tid + blockDim, ... (read-modify-write of out, owned by this
// block alone, so no races). Running state: m_run (max so far, starting at the sink) and denom
// (Σ exp(l - m_run), starting with the sink term exp(sink - m_run) = 1).
// Keys j < T1 are rows of kv, the rest rows j - T1 of kv2 (T = T1 + rows of kv2).
__global__ void sparse_attention_kernel(const float* __restrict__ q, const float* __restrict__ kv,
                                        int64_t T1, const float* __restrict__ kv2,
                                        const int32_t* __restrict__ indices,
                                        const float* __restrict__ sink, int64_t H, int64_t D,
                                        int64_t T, int64_t K, float scale,
                                        float* __restrict__ out) {
  auto key_row = [&](int32_t j) {
    return int64_t(j) < T1 ? kv + int64_t(j) * D : kv2 + (int64_t(j) - T1) * D;
  };
  __shared__ float logit[kChunk];
  __shared__ int32_t rows[kChunk];
  __shared__ float red[32];
  const int64_t sh = blockIdx.x;  // s * H + h
  const int64_t s = sh / H, h = sh % H;
  const float* qh = q + sh * D;
  const int32_t* idx = indices + s * K;
  float* oh = out + sh * D;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;

  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) oh[d] = 0.0f;
  float m_run = sink[h];
  float denom = 1.0f;
  for (int64_t base = 0; base < K; base += kChunk) {
    const int n = static_cast<int>(K - base < kChunk ? K - base : kChunk);
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      const int32_t j = idx[base + i];
      rows[i] = (j >= 0 && int64_t(j) < T) ? j : -1;
    }
    __syncthreads();
    for (int i = warp; i < n; i += nwarps) {
      const int32_t j = rows[i];
      if (j < 0) continue;  // warp-uniform
      const float* kr = key_row(j);
      float acc = 0.0f;
      for (int64_t d = lane; d < D; d += 32) acc += qh[d] * kr[d];
      acc = warp_sum(acc);
      if (lane == 0) logit[i] = acc * scale;
    }
    __syncthreads();
    float cm = -INFINITY;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      if (rows[i] >= 0) cm = fmaxf(cm, logit[i]);
    }
    cm = block_reduce(cm, red, Max{});
    const float m_new = fmaxf(m_run, cm);
    // m_new == m_run also covers m_run = m_new = -inf (sink -inf, no valid key yet): keep 1.
    const float rescale = m_new == m_run ? 1.0f : expf(m_run - m_new);
    float psum = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      const float p = rows[i] >= 0 ? expf(logit[i] - m_new) : 0.0f;
      logit[i] = p;
      psum += p;
    }
    psum = block_reduce(psum, red, Sum{});  // its barriers also publish the probabilities
    denom = denom * rescale + psum;
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
      float acc = oh[d] * rescale;
      for (int i = 0; i < n; ++i) {
        const int32_t j = rows[i];
        if (j >= 0) acc += logit[i] * key_row(j)[d];
      }
      oh[d] = acc;
    }
    m_run = m_new;
    __syncthreads();  // the next chunk overwrites rows / logit
  }
  // No valid key: every accumulator is still 0 and denom is 1, so the output is zero.
  const float inv = 1.0f / denom;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) oh[d] *= inv;
}

}  // namespace

cudaError_t sparse_attention_split(const float* q, const float* kv_a, int64_t T_a,
                                   const float* kv_b, int64_t T_b, const int32_t* indices,
                                   const float* sink, int64_t S, int64_t n_heads, int64_t D,
                                   int64_t K, float scale, float* out, cudaStream_t stream) {
  if (S < 0 || n_heads <= 0 || D <= 0 || T_a < 0 || T_b < 0 || K < 0) return cudaErrorInvalidValue;
  if (S == 0) return cudaSuccess;
  if (S > 0x7fffffff / n_heads) return cudaErrorInvalidValue;
  sparse_attention_kernel<<<static_cast<unsigned>(S * n_heads), kThreads, 0, stream>>>(
      q, kv_a, T_a, kv_b, indices, sink, n_heads, D, T_a + T_b, K, scale, out);
  return launch_status();
}

}  // namespace dsv41rt::kernels::cuda
