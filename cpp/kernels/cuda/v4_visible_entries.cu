#include "kernels/cuda/common.cuh"
#include "kernels/cuda/v4_visible_entries.cuh"

namespace dsv41rt::kernels::cuda {
namespace {

// One thread per output element (grid-stride).
__global__ void visible_entries_kernel(const int64_t* __restrict__ n_visible, int64_t S, int64_t k,
                                       int32_t* __restrict__ indices) {
  pdl_entry();
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < S * k;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t s = i / k, j = i % k;
    const int64_t seen = n_visible[s];
    const int64_t n = seen < 0 ? 0 : (seen < k ? seen : k);
    indices[i] = j < n ? int32_t(j) : -1;
  }
}

}  // namespace

cudaError_t visible_entries(const int64_t* n_visible, int64_t S, int64_t k, int32_t* indices,
                            cudaStream_t stream) {
  if (S < 0 || k < 0) return cudaErrorInvalidValue;
  if (S == 0 || k == 0) return cudaSuccess;
  if (n_visible == nullptr || indices == nullptr) return cudaErrorInvalidValue;
  visible_entries_kernel<<<blocks_for(S * k), kThreads, 0, stream>>>(n_visible, S, k, indices);
  return launch_status();
}

}  // namespace dsv41rt::kernels::cuda
