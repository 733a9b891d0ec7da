// Asynchronous global -> shared copies (cp.async, sm_80+) for multi-stage pipelines: 16-byte
// pieces that bypass L1 and zero-fill when the source is out of range, grouped per stage.
#pragma once

#include <cstdint>

namespace dsv41rt::kernels::cuda {

/// Copies 16 bytes global -> shared, or writes 16 zero bytes (reading nothing) when !valid.
/// Both addresses 16-byte aligned. src must be a valid address even when !valid (any one will do).
__device__ __forceinline__ void cp_async16(void* smem_dst, const void* src, bool valid) {
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;" ::"r"(dst), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
}

/// Closes the group of copies issued since the last commit (an empty group is fine).
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}

/// Waits until at most `Pending` of this thread's committed groups are still in flight. Other
/// threads' copies are visible only after a barrier that follows this wait.
template <int Pending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(Pending) : "memory");
}

}  // namespace dsv41rt::kernels::cuda
