#include "kernels/cuda/common.cuh"
#include "kernels/cuda/rope.cuh"

namespace dsv41rt::kernels::cuda {
namespace {

// One thread per (row, head, pair), grid-stride. The angle is recomputed per head (cheap) so
// every thread is independent; the pair index is fastest so a warp touches consecutive channels.
__global__ void apply_rope_kernel(float* __restrict__ x, int64_t total, int64_t heads,
                                  int64_t head_dim, int64_t pairs,
                                  const int64_t* __restrict__ positions,
                                  const float* __restrict__ inv_freq, bool inverse) {
  pdl_entry();
  const int64_t off = head_dim - 2 * pairs;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < total;
       t += stride) {
    const int64_t k = t % pairs;
    const int64_t rh = t / pairs;  // row * heads + head
    const int64_t r = rh / heads;
    const float pos = static_cast<float>(positions[r]);
    const float angle = __fmul_rn(pos, inv_freq[k]);
    const float c = cosf(angle);
    const float s0 = sinf(angle);
    const float s = inverse ? -s0 : s0;
    float* p = x + rh * head_dim + off + 2 * k;
    const float a = p[0], b = p[1];
    const float ac = __fmul_rn(a, c), bs = __fmul_rn(b, s), as = __fmul_rn(a, s),
                bc = __fmul_rn(b, c);
    p[0] = __fsub_rn(ac, bs);
    p[1] = __fadd_rn(as, bc);
  }
}

}  // namespace

cudaError_t apply_rope(float* x, int64_t rows, int64_t heads, int64_t head_dim, int64_t rope_dim,
                       const int64_t* positions, const float* inv_freq, bool inverse,
                       cudaStream_t stream) {
  if (rows < 0 || heads <= 0 || head_dim <= 0 || rope_dim <= 0 || rope_dim % 2 != 0 ||
      rope_dim > head_dim) {
    return cudaErrorInvalidValue;
  }
  if (rows == 0) return cudaSuccess;
  const int64_t pairs = rope_dim / 2;
  const int64_t total = rows * heads * pairs;
  apply_rope_kernel<<<blocks_for(total), kThreads, 0, stream>>>(x, total, heads, head_dim, pairs,
                                                                positions, inv_freq, inverse);
  return launch_status();
}

}  // namespace dsv41rt::kernels::cuda
