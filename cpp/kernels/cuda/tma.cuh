// Hopper bulk-copy (TMA) helpers shared by the wgmma kernels (decode A8 GEMM, prefill GEMM): the
// tensor-map encoder (host), the mbarrier / 2-D tensor load instructions, the shared-memory
// descriptor of a TMA-landed 128-byte-swizzled tile and the wgmma group fences (device). Only
// built for sm_90a.
#pragma once

#include <cuda.h>  // CUtensorMap (the encoder is reached through the runtime: no libcuda link)
#include <cuda_runtime.h>

#include <cstdint>

namespace dsv41rt::kernels::cuda::tma {

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                 const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                 const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                 CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

/// cuTensorMapEncodeTiled through the runtime's driver entry point (found once; null when absent).
inline EncodeTiled encoder() {
  static const EncodeTiled fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault,
                                         &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      return EncodeTiled{nullptr};
    }
    return reinterpret_cast<EncodeTiled>(f);
  }();
  return fn;
}

/// A [rows, row_bytes] byte matrix (row pitch `pitch_bytes`, a multiple of 16; 0 = row_bytes)
/// as a 2-D TMA tensor with box_bytes x box_rows boxes; parts of a box past the matrix arrive as
/// zeros. Host only; a map is passed by value as a __grid_constant__ kernel parameter (graph
/// capture keeps it).
inline cudaError_t byte_matrix_map(CUtensorMap* map, const void* data, int64_t row_bytes,
                                   int64_t rows, uint32_t box_bytes, uint32_t box_rows,
                                   CUtensorMapSwizzle swizzle, int64_t pitch_bytes = 0) {
  const EncodeTiled encode = encoder();
  if (!encode) return cudaErrorNotSupported;
  const cuuint64_t dims[2] = {cuuint64_t(row_bytes), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {cuuint64_t(pitch_bytes ? pitch_bytes : row_bytes)};
  const cuuint32_t box[2] = {box_bytes, box_rows};
  const cuuint32_t elem[2] = {1, 1};
  const CUresult r = encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<void*>(data), dims,
                            strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

#ifdef __CUDACC__
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
/// Makes initialised mbarriers visible to the async proxy (then __syncthreads).
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
/// Arrives once and expects `bytes` more of transactions in the current phase.
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
               : "memory");
}
/// Arrives once (no transaction bytes).
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
/// Waits until the phase of parity `parity` completed.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  while (!done) {
    asm volatile(
        "{.reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; "
        "selp.u32 %0, 1, 0, p;}"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  }
}
/// The box at (byte column c0, row c1) of the tensor map into shared memory at dst; completes its
/// bytes (the whole box, zero-filled parts included) on the mbarrier.
__device__ __forceinline__ void load_2d(uint32_t dst, const CUtensorMap* map, int c0, int c1,
                                        uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, "
      "{%2, %3}], [%4];" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}

// wgmma operand descriptor of a K-major tile as a 128-byte-swizzled TMA box lands it (1024-byte
// aligned): 8-row groups 1024 bytes apart (SBO), LBO unused in this mode. Advancing 32 bytes along
// K inside the 128-byte row is adding 2 to the start address field (the hardware swizzles).
__device__ __forceinline__ uint64_t desc_sw128(uint32_t addr) {
  return uint64_t((addr & 0x3FFFFu) >> 4) | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32) |
         (uint64_t(1) << 62);
}
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
/// Waits until at most N committed wgmma groups of this warpgroup are pending.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
#endif

}  // namespace dsv41rt::kernels::cuda::tma
