// Split-K reduction of the decode GEMMs (contract: split_k.cuh).
#include "kernels/cuda/split_k.cuh"

namespace dsv41rt::kernels::cuda {

// Indices in 32 bits (the launcher checks batch * m * n fits): three 64-bit divisions per
// element were most of this short kernel's instructions.
__global__ void __launch_bounds__(kThreads) reduce_split_partials(const SplitPartials p) {
  pdl_entry();
  const uint32_t n = uint32_t(p.n), mn = uint32_t(p.m) * n, total = uint32_t(p.batch) * mn;
  for (uint32_t e = blockIdx.x * blockDim.x + threadIdx.x; e < total; e += gridDim.x * blockDim.x) {
    const uint32_t b = e / mn, rem = e - b * mn, tok = rem / n, r = rem - tok * n;
    const float* src = p.ws + b * p.splits * mn + rem;
    float sum = 0.f;
    for (int64_t s = 0; s < p.splits; ++s) sum += src[s * mn];
    float* o = p.y + b * p.stride_y + tok * p.ldy + r;
    *o = p.accumulate ? *o + sum : sum;
  }
}

}  // namespace dsv41rt::kernels::cuda
