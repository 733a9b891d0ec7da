// Warp-level BF16 tensor-core building blocks shared by the sparse-attention kernels
// (attention_tc.cu, attention_prefill_tc.cu): ldmatrix, mma.sync m16n8k16 with FP32 accumulators,
// the exact three-part BF16 split of an FP32 operand, the 16-byte XOR swizzle of a BF16 tile and
// cp.async with zero fill.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace dsv41rt::kernels::cuda::mma {

constexpr int kParts = 3;  // BF16 parts of an FP32 operand

// Two FP32 values as BF16 (round to nearest even) in one register, a in the low half.
__device__ __forceinline__ uint32_t pack_bf16x2(float a, float b) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<const uint32_t*>(&v);
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Element offset of (row, col) in a BF16 tile of `row_elems` (>= 64) per row: 16-byte chunks are
// XOR-swizzled by the row so the 8 rows an ldmatrix reads fall in 8 different bank groups.
__device__ __forceinline__ int swz(int row, int col, int row_elems) {
  return row * row_elems + ((((col >> 3) ^ row) & 7) | ((col >> 3) & ~7)) * 8 + (col & 7);
}

__device__ __forceinline__ void ldsm_x4(const __nv_bfloat16* p, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldsm_x4_trans(const __nv_bfloat16* p, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
// c += a · b, m16n8k16, BF16 inputs, FP32 accumulators.
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The three BF16 parts of x (hi + mid + lo == x exactly for normal FP32 values).
struct Parts3 {
  __nv_bfloat16 p[kParts];
};
__device__ __forceinline__ Parts3 split3(float x) {
  Parts3 r;
  r.p[0] = __float2bfloat16_rn(x);
  const float r1 = x - __bfloat162float(r.p[0]);
  r.p[1] = __float2bfloat16_rn(r1);
  r.p[2] = __float2bfloat16_rn(r1 - __bfloat162float(r.p[1]));
  return r;
}
// Part `part` of the pair (x, y) packed as an mma operand register (x in the low half).
__device__ __forceinline__ uint32_t pack_part(const Parts3& x, const Parts3& y, int part) {
  const uint32_t lo = __bfloat16_as_ushort(x.p[part]), hi = __bfloat16_as_ushort(y.p[part]);
  return lo | (hi << 16);
}

// 16 bytes global -> shared, asynchronously; zeros instead when !valid (src is then not read).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_addr(dst)), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}
template <int Pending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(Pending) : "memory");
}

}  // namespace dsv41rt::kernels::cuda::mma
