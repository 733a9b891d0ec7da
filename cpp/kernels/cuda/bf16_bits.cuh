// Bit-level helpers of the kernels that build BF16 operands from stored FP8 / FP4 codes by bit
// placement (moe_decode.cu, cache_row_decode.cuh). Internal to kernels/cuda.
#pragma once

#include <cstdint>

namespace dsv41rt::kernels::cuda::bits {

/// PTX prmt.b32: bytes of {b, a} picked (or sign-replicated) by the four selector nibbles.
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
}

/// a * b on BF16x2, exact whenever the product is a BF16 (fma with -0 keeps -0 and subnormals).
__device__ __forceinline__ uint32_t bmul(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(0x80008000u));
  return d;
}

}  // namespace dsv41rt::kernels::cuda::bits
