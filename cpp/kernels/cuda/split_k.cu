// Split-K reduction of the decode GEMMs (contract: split_k.cuh).
#include "kernels/cuda/split_k.cuh"

namespace dsv41rt::kernels::cuda {

__global__ void __launch_bounds__(kThreads) reduce_split_partials(const SplitPartials p) {
  const int64_t mn = p.m * p.n, total = p.batch * mn;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t b = e / mn, rem = e % mn, tok = rem / p.n, r = rem % p.n;
    const float* src = p.ws + b * p.splits * mn + rem;
    float sum = 0.f;
    for (int64_t s = 0; s < p.splits; ++s) sum += src[s * mn];
    float* o = p.y + b * p.stride_y + tok * p.ldy + r;
    *o = p.accumulate ? *o + sum : sum;
  }
}

}  // namespace dsv41rt::kernels::cuda
