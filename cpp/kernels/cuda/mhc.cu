#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mhc.cuh"

namespace dsv41rt::kernels::cuda {
namespace {

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kMaxMixSmemBytes = 48 * 1024;

// The mixer projection is split over K in fixed chunks of kMixChunk (a constant, so a token's
// summation order never depends on the batch): one block per (kMixTokens tokens, chunk) writes
// the chunk's partial dots and Σ f² of each token, then one block per token adds the chunks in
// order and finishes. At decode batch sizes this spreads the 2 MB fn read of every sublayer over
// the GPU instead of one SM.
constexpr int64_t kMixChunk = 512;

// Tokens per block of the partial kernel: the block's warps read each fn row piece once for all
// of them (one token per block re-read the 2 MB fn from L2 per token: 2.3 ms of a 64-request
// decode step, 91 ms of a 4,096-token prefill, H200 profiles 2026-12-04).
constexpr int kMixTokens = 8;

// Block (g, c), tokens s = g * kMixTokens + t: part[(s * C + c) * W + j] = Σ_{i in chunk} f_i
// fn[j, i] (one warp per j, lanes strided, FMA, xor-shuffle reduction); sq[s * C + c] = Σ f_i² in
// double (thread-strided, then the warps in order). Each token's arithmetic is the same whatever
// the other tokens of its block: a row never depends on the batch.
__global__ void hc_mix_partial_kernel(const float* __restrict__ X, const float* __restrict__ fn,
                                      int64_t S, int64_t W, int64_t K, int64_t C,
                                      float* __restrict__ part, double* __restrict__ sq) {
  pdl_entry();
  __shared__ double warp_acc[kMixTokens][32];
  __shared__ float xs[kMixTokens][kMixChunk];
  const int64_t s0 = int64_t(blockIdx.x) * kMixTokens, c = blockIdx.y;
  const int nt = S - s0 < kMixTokens ? int(S - s0) : kMixTokens;
  const int64_t i0 = c * kMixChunk, i1 = i0 + kMixChunk < K ? i0 + kMixChunk : K;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  // The tokens' chunk of inputs (zeros past K), staged once for every row j and for Σ f².
  for (int e = threadIdx.x; e < nt * int(kMixChunk); e += blockDim.x) {
    const int t = e / int(kMixChunk), u = e % int(kMixChunk);
    const int64_t i = i0 + u;
    xs[t][u] = i < i1 ? X[(s0 + t) * K + i] : 0.0f;
  }
  __syncthreads();
  // Σ f² of each token: a thread's elements i0 + tid, + blockDim, ... in order, the warp's xor
  // reduction, the warps in order (below); the tokens' sums side by side (one after another, the
  // shuffle chains were the block's critical path: 76 ms of a 4k prefill).
  {
    double acc[kMixTokens];
#pragma unroll
    for (int t = 0; t < kMixTokens; ++t) {
      acc[t] = 0.0;
      if (t >= nt) continue;
      for (int64_t i = i0 + threadIdx.x; i < i1; i += blockDim.x) {
        const float f = xs[t][i - i0];
        acc[t] += __fmul_rn(f, f);
      }
    }
    for (int off = 16; off > 0; off >>= 1) {
#pragma unroll
      for (int t = 0; t < kMixTokens; ++t) acc[t] += __shfl_xor_sync(kFullMask, acc[t], off);
    }
    if (lane == 0) {
#pragma unroll
      for (int t = 0; t < kMixTokens; ++t) warp_acc[t][warp] = acc[t];
    }
  }
  constexpr int kPerLane = int(kMixChunk / 32);
  for (int64_t j = warp; j < W; j += nwarps) {
    const float* wj = fn + j * K;
    // All of this lane's weights in flight at once (a plain loop waits on each load in turn),
    // then each token's FMAs in index order.
    float wv[kPerLane];
#pragma unroll
    for (int u = 0; u < kPerLane; ++u) {
      const int64_t i = i0 + lane + 32 * u;
      wv[u] = i < i1 ? wj[i] : 0.0f;
    }
    for (int t = 0; t < nt; ++t) {
      float d = 0.0f;
#pragma unroll
      for (int u = 0; u < kPerLane; ++u) {
        if (i0 + lane + 32 * u < i1) d = __fmaf_rn(xs[t][lane + 32 * u], wv[u], d);
      }
      for (int off = 16; off > 0; off >>= 1) d += __shfl_xor_sync(kFullMask, d, off);
      if (lane == 0) part[((s0 + t) * C + c) * W + j] = d;
    }
  }
  __syncthreads();
  if (threadIdx.x < nt) {
    double total = 0.0;
    for (int w = 0; w < nwarps; ++w) total += warp_acc[threadIdx.x][w];
    sq[(s0 + threadIdx.x) * C + c] = total;
  }
}

// Sinkhorn of one n x n matrix (n * n <= 32) by warp 0 (all 32 lanes call it): lane l < n * n
// holds element (l / n, l % n). Same operations in the same order as the per-row loop below.
__device__ void sinkhorn_warp(const float* c, int n, float hc_eps, int iters, float* out) {
  const int lane = threadIdx.x & 31;
  const bool live = lane < n * n;
  const int i = live ? lane / n : 0, o = live ? lane % n : 0;
  const float v0 = live ? c[lane] : 0.0f;
  float mx = __shfl_sync(kFullMask, v0, i * n);
  for (int q = 1; q < n; ++q) mx = fmaxf(mx, __shfl_sync(kFullMask, v0, i * n + q));
  const float e = expf(__fsub_rn(v0, mx));
  float sum = 0.0f;
  for (int q = 0; q < n; ++q) sum = __fadd_rn(sum, __shfl_sync(kFullMask, e, i * n + q));
  float v = __fadd_rn(__fmul_rn(e, __fdiv_rn(1.0f, sum)), hc_eps);
  for (int t = 0; t < iters; ++t) {
    if (t > 0) {  // row normalisation (skipped before the first column normalisation)
      float rs = 0.0f;
      for (int q = 0; q < n; ++q) rs = __fadd_rn(rs, __shfl_sync(kFullMask, v, i * n + q));
      v = __fdiv_rn(v, __fadd_rn(rs, hc_eps));
    }
    float cs = 0.0f;
    for (int q = 0; q < n; ++q) cs = __fadd_rn(cs, __shfl_sync(kFullMask, v, q * n + o));
    v = __fdiv_rn(v, __fadd_rn(cs, hc_eps));
  }
  if (live) out[lane] = v;
}

// One block per token s (blockDim a multiple of 32, <= 1024). Dynamic shared memory: z [W]
// (mixer logits, then the Sinkhorn matrix in z[2n:]) and sums [n].
__global__ void hc_mix_finish_kernel(const float* __restrict__ part, const double* __restrict__ sq,
                                     int64_t C, const float* __restrict__ base,
                                     const float* __restrict__ scale, int64_t n, int64_t H,
                                     float rms_eps, float hc_eps, int iters,
                                     float* __restrict__ pre, float* __restrict__ post,
                                     float* __restrict__ comb) {
  pdl_entry();
  extern __shared__ float smem[];
  __shared__ float r_shared;
  const int64_t W = (2 + n) * n, K = n * H;
  float* z = smem;
  float* sums = smem + W;
  // The token's partials, loaded by all threads at once (a thread summing them straight from
  // global memory waits on each load in turn), then added in chunk order.
  double* sq_sh = reinterpret_cast<double*>(smem + ((W + n + 1) / 2) * 2);
  float* part_sh = reinterpret_cast<float*>(sq_sh + C);
  const int64_t s = blockIdx.x;
  for (int64_t i = threadIdx.x; i < C * W; i += blockDim.x) part_sh[i] = part[s * C * W + i];
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) sq_sh[c] = sq[s * C + c];
  __syncthreads();
  for (int64_t j = threadIdx.x; j < W; j += blockDim.x) {
    float d = 0.0f;
    for (int64_t c = 0; c < C; ++c) d = __fadd_rn(d, part_sh[c * W + j]);
    z[j] = d;
  }
  if (threadIdx.x == 0) {
    double total = 0.0;
    for (int64_t c = 0; c < C; ++c) total += sq_sh[c];
    const float mean = __fdiv_rn(static_cast<float>(total), static_cast<float>(K));
    r_shared = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean, rms_eps)));
  }
  __syncthreads();
  const float r = r_shared;
  const float s0 = scale[0], s1 = scale[1], s2 = scale[2];
  for (int64_t j = threadIdx.x; j < W; j += blockDim.x) {
    const float m = __fmul_rn(z[j], r);
    const float sc = j < n ? s0 : (j < 2 * n ? s1 : s2);
    z[j] = __fadd_rn(base[j], __fmul_rn(m, sc));  // addcmul: base + (mix * scale)
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    pre[s * n + i] = __fadd_rn(__fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-z[i]))), hc_eps);
    post[s * n + i] = __fmul_rn(2.0f, __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-z[n + i]))));
  }

  // Sinkhorn on c = z[2n:] viewed [n, n] (row i = input stream, column o = output stream), every
  // sum in the CPU's sequential order, so the results differ from the CPU only through expf.
  float* c = z + 2 * n;
  if (n * n <= 32) {
    // One warp, one lane per element: each lane gathers its row's (column's) values by shuffles
    // and adds them in order itself, so the n divisions of a pass run side by side instead of
    // one after another in a thread per row (this serial chain was most of the kernel's time).
    if (threadIdx.x < 32) sinkhorn_warp(c, int(n), hc_eps, iters, comb + s * n * n);
    return;
  }
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    float* row = c + i * n;
    float mx = row[0];
    for (int64_t o = 1; o < n; ++o) mx = fmaxf(mx, row[o]);
    float sum = 0.0f;
    for (int64_t o = 0; o < n; ++o) {
      row[o] = expf(__fsub_rn(row[o], mx));
      sum = __fadd_rn(sum, row[o]);
    }
    const float inv = __fdiv_rn(1.0f, sum);
    for (int64_t o = 0; o < n; ++o) row[o] = __fadd_rn(__fmul_rn(row[o], inv), hc_eps);
  }
  __syncthreads();
  for (int t = 0; t < iters; ++t) {
    if (t > 0) {  // row normalisation (skipped before the first column normalisation)
      for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        float sum = 0.0f;
        for (int64_t o = 0; o < n; ++o) sum = __fadd_rn(sum, c[i * n + o]);
        sum = __fadd_rn(sum, hc_eps);
        for (int64_t o = 0; o < n; ++o) c[i * n + o] = __fdiv_rn(c[i * n + o], sum);
      }
      __syncthreads();
    }
    for (int64_t o = threadIdx.x; o < n; o += blockDim.x) {
      float sum = 0.0f;
      for (int64_t i = 0; i < n; ++i) sum = __fadd_rn(sum, c[i * n + o]);
      sums[o] = __fadd_rn(sum, hc_eps);
      for (int64_t i = 0; i < n; ++i) c[i * n + o] = __fdiv_rn(c[i * n + o], sums[o]);
    }
    __syncthreads();
  }
  for (int64_t j = threadIdx.x; j < n * n; j += blockDim.x) comb[s * n * n + j] = c[j];
}

__global__ void hc_collapse_kernel(const float* __restrict__ X, const float* __restrict__ w,
                                   int64_t total, int64_t n, int64_t H, float* __restrict__ u) {
  pdl_entry();
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < total;
       t += stride) {
    const int64_t s = t / H, h = t - s * H;
    float acc = 0.0f;
    for (int64_t i = 0; i < n; ++i) {
      acc = __fadd_rn(acc, __fmul_rn(w[s * n + i], X[(s * n + i) * H + h]));
    }
    u[t] = acc;
  }
}

__global__ void hc_expand_kernel(const float* __restrict__ X, const float* __restrict__ y,
                                 const float* __restrict__ post, const float* __restrict__ comb,
                                 int64_t total, int64_t n, int64_t H, float* __restrict__ out) {
  pdl_entry();
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < total;
       t += stride) {
    const int64_t so = t / H, h = t - so * H;  // so = s * n + o
    const int64_t s = so / n, o = so - s * n;
    float acc = 0.0f;
    for (int64_t i = 0; i < n; ++i) {
      acc = __fadd_rn(acc, __fmul_rn(comb[(s * n + i) * n + o], X[(s * n + i) * H + h]));
    }
    out[t] = __fadd_rn(__fmul_rn(post[so], y[s * H + h]), acc);
  }
}

// hc_expand for a compile-time n: a thread takes one (token, channel) and writes its n outputs,
// reading the token's n input rows once instead of once per output stream (the kernel above reads
// X n times: 43 ms of a 4,096-token prefill). The same products and sums per output.
template <int N>
__global__ void hc_expand_rows_kernel(const float* __restrict__ X, const float* __restrict__ y,
                                      const float* __restrict__ post,
                                      const float* __restrict__ comb, int64_t total, int64_t H,
                                      float* __restrict__ out) {
  pdl_entry();
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < total;
       t += stride) {
    const int64_t s = t / H, h = t - s * H;
    float x[N];
#pragma unroll
    for (int i = 0; i < N; ++i) x[i] = X[(s * N + i) * H + h];
    const float yv = y[t];
#pragma unroll
    for (int o = 0; o < N; ++o) {
      float acc = 0.0f;
#pragma unroll
      for (int i = 0; i < N; ++i) acc = __fadd_rn(acc, __fmul_rn(comb[(s * N + i) * N + o], x[i]));
      out[(s * N + o) * H + h] = __fadd_rn(__fmul_rn(post[s * N + o], yv), acc);
    }
  }
}

}  // namespace

int64_t hc_mix_workspace_bytes(int64_t S, int64_t n, int64_t H) {
  const int64_t W = (2 + n) * n, C = (n * H + kMixChunk - 1) / kMixChunk;
  const int64_t parts = S * C;
  return parts * int64_t(sizeof(double)) + ((parts * W * 4 + 15) / 16) * 16;
}

cudaError_t hc_mix(const float* X, const float* fn, const float* base, const float* scale,
                   int64_t S, int64_t n, int64_t H, float rms_eps, float hc_eps, int iters,
                   float* pre, float* post, float* comb, void* workspace, int64_t workspace_bytes,
                   cudaStream_t stream) {
  if (S < 0 || n <= 0 || H <= 0 || iters < 1 || S > 0x7fffffff) return cudaErrorInvalidValue;
  const int64_t W = (2 + n) * n, K = n * H, C = (K + kMixChunk - 1) / kMixChunk;
  // z, sums (rounded up to a double boundary), then the partials: C doubles, C * W floats.
  const int64_t smem = ((W + n + 1) / 2) * 8 + C * 8 + C * W * 4;
  if (smem > kMaxMixSmemBytes) return cudaErrorInvalidValue;
  if (S == 0) return cudaSuccess;
  if (C > 65535 || workspace == nullptr || workspace_bytes < hc_mix_workspace_bytes(S, n, H)) {
    return cudaErrorInvalidValue;
  }
  double* sq = static_cast<double*>(workspace);
  float* part = reinterpret_cast<float*>(sq + S * C);
  const unsigned groups = unsigned((S + kMixTokens - 1) / kMixTokens);
  hc_mix_partial_kernel<<<dim3(groups, unsigned(C)), kThreads, 0, stream>>>(X, fn, S, W, K, C, part,
                                                                            sq);
  hc_mix_finish_kernel<<<static_cast<unsigned>(S), kThreads, static_cast<size_t>(smem), stream>>>(
      part, sq, C, base, scale, n, H, rms_eps, hc_eps, iters, pre, post, comb);
  return launch_status();
}

cudaError_t hc_collapse(const float* X, const float* w, int64_t S, int64_t n, int64_t H, float* u,
                        cudaStream_t stream) {
  if (S < 0 || n <= 0 || H <= 0) return cudaErrorInvalidValue;
  if (S == 0) return cudaSuccess;
  const int64_t total = S * H;
  hc_collapse_kernel<<<blocks_for(total), kThreads, 0, stream>>>(X, w, total, n, H, u);
  return launch_status();
}

cudaError_t hc_expand(const float* X, const float* y, const float* post, const float* comb,
                      int64_t S, int64_t n, int64_t H, float* out, cudaStream_t stream) {
  if (S < 0 || n <= 0 || H <= 0) return cudaErrorInvalidValue;
  if (S == 0) return cudaSuccess;
  if (n == 4) {  // V4.1's hc_mult
    const int64_t rows = S * H;
    hc_expand_rows_kernel<4>
        <<<blocks_for(rows), kThreads, 0, stream>>>(X, y, post, comb, rows, H, out);
    return launch_status();
  }
  const int64_t total = S * n * H;
  hc_expand_kernel<<<blocks_for(total), kThreads, 0, stream>>>(X, y, post, comb, total, n, H, out);
  return launch_status();
}

}  // namespace dsv41rt::kernels::cuda
