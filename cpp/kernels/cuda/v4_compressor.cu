#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/v4_compressor.cuh"

namespace dsv41rt::kernels::cuda {
namespace {

// Blocks per item: the entries kernel's blocks walk the item's groups with this stride, the state
// kernel's its ratio x W state elements. The group count is only known on the device (it follows
// from the lengths), so the grid is fixed; a decode step's blocks beyond its one group exit at
// once.
constexpr unsigned kGroupBlocks = 32;
constexpr unsigned kStateBlocks = 8;

struct Shape {
  int64_t D, W, m;  // entry width, projection width, ratio
  bool overlap;
  int64_t offset;  // bytes of the state into each slot
  float eps;
  const float* ape;   // [m, W]
  const float* norm;  // [D]
};

// exp as a correctly rounded FP32 value (through FP64; the CPU's glibc expf is within 0.502 ulp).
__device__ inline float exp_ref(float x) { return static_cast<float>(exp(static_cast<double>(x))); }

// One item's rows by absolute position q: this forward's projected rows (q >= L, the APE added as
// the CPU adds it to the pending score), else the state's pending rows (q in the group in progress
// when the forward started) or its prev rows (the group before that; A-half columns only).
struct ItemRows {
  Shape sh;
  const float *a, *s;
  const float *pend_a, *pend_s, *prev_a, *prev_s;
  int64_t L, r0;

  __device__ ItemRows(const Shape& shape, const float* a_, const float* s_, uint8_t* const* slots,
                      int64_t b, int64_t length, int64_t row0)
      : sh(shape), a(a_), s(s_), L(length), r0(row0) {
    const float* base = reinterpret_cast<const float*>(slots[b] + shape.offset);
    pend_a = base;
    pend_s = base + shape.m * shape.W;
    prev_a = base + 2 * shape.m * shape.W;
    prev_s = prev_a + shape.m * shape.D;
  }
  __device__ float value(int64_t q, int64_t col) const {
    if (q >= L) return a[(r0 + q - L) * sh.W + col];
    if (q / sh.m == L / sh.m) return pend_a[(q % sh.m) * sh.W + col];
    return prev_a[(q % sh.m) * sh.D + col];
  }
  __device__ float score(int64_t q, int64_t col) const {
    if (q >= L) return __fadd_rn(s[(r0 + q - L) * sh.W + col], sh.ape[(q % sh.m) * sh.W + col]);
    if (q / sh.m == L / sh.m) return pend_s[(q % sh.m) * sh.W + col];
    return prev_s[(q % sh.m) * sh.D + col];
  }
};

// Channel c of group g's pooled vector, in kernels/cpu/v4_compressor.cc pool_entry's order: the
// A-halves of group g - 1 (overlap, g > 0) then the rows of group g (their B-halves with overlap).
__device__ float pool_channel(const ItemRows& it, int64_t g, int64_t c) {
  const Shape& sh = it.sh;
  const int64_t m = sh.m, col = sh.overlap ? sh.D + c : c;
  const bool prev = sh.overlap && g > 0;
  const int64_t p0 = (g - 1) * m, g0 = g * m;
  float mx = -INFINITY;
  if (prev)
    for (int64_t t = 0; t < m; ++t) mx = fmaxf(mx, it.score(p0 + t, c));
  for (int64_t t = 0; t < m; ++t) mx = fmaxf(mx, it.score(g0 + t, col));
  float denom = 0.0f;
  if (prev)
    for (int64_t t = 0; t < m; ++t)
      denom = __fadd_rn(denom, exp_ref(__fsub_rn(it.score(p0 + t, c), mx)));
  for (int64_t t = 0; t < m; ++t)
    denom = __fadd_rn(denom, exp_ref(__fsub_rn(it.score(g0 + t, col), mx)));
  float acc = 0.0f;
  if (prev) {
    for (int64_t t = 0; t < m; ++t) {
      const float p = __fdiv_rn(exp_ref(__fsub_rn(it.score(p0 + t, c), mx)), denom);
      acc = __fadd_rn(acc, __fmul_rn(it.value(p0 + t, c), p));
    }
  }
  for (int64_t t = 0; t < m; ++t) {
    const float p = __fdiv_rn(exp_ref(__fsub_rn(it.score(g0 + t, col), mx)), denom);
    acc = __fadd_rn(acc, __fmul_rn(it.value(g0 + t, col), p));
  }
  return acc;
}

// Grid (items, kGroupBlocks): block (b, y) writes the entries of item b's completed groups y,
// y + kGroupBlocks, ... Dynamic shared memory: the pooled vector [D].
__global__ void v4_entries_kernel(Shape sh, const float* __restrict__ a,
                                  const float* __restrict__ s, uint8_t* const* slots,
                                  const int64_t* length, const int64_t* row0, const int64_t* n,
                                  const int64_t* entry0, float* __restrict__ entries) {
  pdl_entry();
  extern __shared__ float pooled[];
  __shared__ float inv;
  const int64_t b = blockIdx.x, rows = n[b];
  if (rows <= 0 || entries == nullptr) return;  // padding (null slot), nothing new / to write
  const int64_t L = length[b];
  const int64_t count = (L % sh.m + rows) / sh.m;  // groups this forward completes
  if (count <= int64_t(blockIdx.y)) return;
  const ItemRows it(sh, a, s, slots, b, L, row0[b]);
  for (int64_t q = blockIdx.y; q < count; q += gridDim.y) {
    const int64_t g = L / sh.m + q;
    for (int64_t c = threadIdx.x; c < sh.D; c += blockDim.x) pooled[c] = pool_channel(it, g, c);
    __syncthreads();
    if (threadIdx.x == 0) {  // kernels/cpu/rms_norm.cc rms_inv: Σ x² in double, index order
      double acc = 0.0;
      for (int64_t c = 0; c < sh.D; ++c) acc += __fmul_rn(pooled[c], pooled[c]);
      const float mean = __fdiv_rn(static_cast<float>(acc), static_cast<float>(sh.D));
      inv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean, sh.eps)));
    }
    __syncthreads();
    float* out = entries + (entry0[b] + q) * sh.D;
    for (int64_t c = threadIdx.x; c < sh.D; c += blockDim.x) {
      out[c] = __fmul_rn(sh.norm[c], __fmul_rn(pooled[c], inv));
    }
    __syncthreads();  // pooled is reused by the next group
  }
}

// Grid (items, kStateBlocks), one thread per state element (t, c) of [m, W] (grid-stride).
__global__ void v4_state_kernel(Shape sh, const float* __restrict__ a, const float* __restrict__ s,
                                uint8_t* const* slots, const int64_t* length, const int64_t* row0,
                                const int64_t* n) {
  pdl_entry();
  const int64_t b = blockIdx.x, rows = n[b];
  if (rows <= 0) return;
  const int64_t L = length[b], r0 = row0[b], m = sh.m, W = sh.W, D = sh.D;
  float* base = reinterpret_cast<float*>(slots[b] + sh.offset);
  float *pend_a = base, *pend_s = base + m * W;
  float *prev_a = base + 2 * m * W, *prev_s = prev_a + m * D;
  const int64_t done = (L + rows) / m;  // groups complete after the forward
  const int64_t last = L + rows - 1;    // the forward's last position
  for (int64_t e = int64_t(blockIdx.y) * blockDim.x + threadIdx.x; e < m * W;
       e += int64_t(gridDim.y) * blockDim.x) {
    const int64_t t = e / W, c = e % W;
    // prev: the A-halves of the last group this forward completed (read before pending row t is
    // overwritten below: that group may have started in the pending rows).
    if (sh.overlap && c < D && done > L / m) {
      const int64_t q = (done - 1) * m + t;
      float va, vs;
      if (q >= L) {
        va = a[(r0 + q - L) * W + c];
        vs = __fadd_rn(s[(r0 + q - L) * W + c], sh.ape[t * W + c]);
      } else {
        va = pend_a[t * W + c];
        vs = pend_s[t * W + c];
      }
      prev_a[t * D + c] = va;
      prev_s[t * D + c] = vs;
    }
    // pending row t: the forward's last position p ≡ t (mod m), if the forward has one.
    if (last >= t) {
      const int64_t p = last - (last - t) % m;
      if (p >= L) {
        pend_a[t * W + c] = a[(r0 + p - L) * W + c];
        pend_s[t * W + c] = __fadd_rn(s[(r0 + p - L) * W + c], sh.ape[t * W + c]);
      }
    }
  }
}

}  // namespace

cudaError_t v4_compress_paged(const kernels::V4CompressorWeights& w, const float* a, const float* s,
                              uint8_t* const* slots, int64_t state_offset, int64_t items,
                              const int64_t* length, const int64_t* row0, const int64_t* n,
                              const int64_t* entry0, float* entries, cudaStream_t stream) {
  if (items < 0 || state_offset < 0 || w.D <= 0 || w.ratio < 1 || w.H <= 0) {
    return cudaErrorInvalidValue;
  }
  if (!std::isfinite(w.eps) || w.eps < 0) return cudaErrorInvalidValue;
  if (items == 0) return cudaSuccess;
  if (!slots || !length || !row0 || !n || !entry0 || !w.ape || !w.norm_weight || items > 0x7fffffff)
    return cudaErrorInvalidValue;
  const Shape sh{w.D, w.width(), w.ratio, w.overlap, state_offset, w.eps, w.ape, w.norm_weight};
  const size_t smem = size_t(w.D) * sizeof(float);
  if (smem > 48 * 1024) return cudaErrorInvalidValue;
  // Entries first: they read the state as the forward found it; the state kernel then moves it on
  // (stream order; under programmatic launch it waits at pdl_entry for this grid to complete).
  v4_entries_kernel<<<dim3(unsigned(items), kGroupBlocks), kThreads, smem, stream>>>(
      sh, a, s, slots, length, row0, n, entry0, entries);
  cudaError_t e = launch_status();
  if (e != cudaSuccess) return e;
  v4_state_kernel<<<dim3(unsigned(items), kStateBlocks), kThreads, 0, stream>>>(sh, a, s, slots,
                                                                                length, row0, n);
  return launch_status();
}

}  // namespace dsv41rt::kernels::cuda
