#include <cuda_bf16.h>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/quant.cuh"
#include "kernels/cuda/quant_device.cuh"
#include "kernels/cuda/v4_row_device.cuh"

namespace dsv41rt::kernels::cuda {
namespace {

using namespace qdev;

// Warp-uniform grid-stride loop over the elements: each warp takes 32 consecutive elements, so
// quantisation blocks (16 or 32 elements, rows being whole blocks) map onto aligned lane groups.
// y = QDQ(x) (y may alias x: every element is read and written by one thread).
// Bf16First: each value is first rounded to BF16 (the GEMM activation QDQ, fp8_act_qdq).
template <Format F, bool Bf16First = false>
__global__ void qdq_kernel(const float* x, int64_t total, float* y) {
  pdl_entry();
  const int lane = threadIdx.x & 31;
  const int64_t first = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) - lane;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t base = first; base < total; base += stride) {
    const int64_t i = base + lane;
    const bool active = i < total;
    float v = active ? x[i] : 0.0f;
    if constexpr (Bf16First) v = bf16_to_f32(f32_to_bf16(v));
    const Quantized q = quantize_lane<F>(v, active);
    if (active) y[i] = __fmul_rn(decode_element<F>(q.code), q.s);
  }
}

// fp8_act_qdq_bf16: a warp takes 128 consecutive columns of a row, a lane 4 of them (one float4),
// 8 lanes one quantisation block (k % 32 == 0: a block is whole or entirely past the row's end).
// The values are those of qdq_kernel<kFp8Window, true>; the BF16 conversion is rows_to_bf16's.
__global__ void fp8_act_qdq_bf16_kernel(const float* __restrict__ x, int64_t ldx, int64_t rows,
                                        int64_t k, uint16_t* __restrict__ y, int64_t ldy) {
  pdl_entry();
  const int lane = threadIdx.x & 31;
  const int64_t chunks = (k + 127) / 128, warps = int64_t(gridDim.x) * (blockDim.x >> 5);
  for (int64_t w = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5; w < rows * chunks;
       w += warps) {
    const int64_t r = w / chunks, c = (w - r * chunks) * 128 + 4 * lane;
    const bool active = c < k;
    float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (active) {
      const float4 t = *reinterpret_cast<const float4*>(x + r * ldx + c);
      v[0] = t.x, v[1] = t.y, v[2] = t.z, v[3] = t.w;
    }
    uint32_t m = 0;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      v[e] = bf16_to_f32(f32_to_bf16(v[e]));  // the GEMM activation's BF16 rounding first
      m = max(m, abs_bits(v[e]));
    }
    for (int off = 4; off > 0; off >>= 1) m = max(m, __shfl_xor_sync(kFullMask, m, off));
    Quantized q;
    block_scale<Format::kFp8Window>(amax_of_bits(m), q);
    if (active) {
      uint16_t h[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const uint8_t code = element_code<Format::kFp8Window>(v[e], q.s);
        const float d = __fmul_rn(decode_element<Format::kFp8Window>(code), q.s);
        h[e] = __bfloat16_as_ushort(__float2bfloat16_rn(d));
      }
      *reinterpret_cast<uint2*>(y + r * ldy + c) =
          make_uint2(h[0] | (uint32_t(h[1]) << 16), h[2] | (uint32_t(h[3]) << 16));
    }
  }
}

// DeepSeek-V4 rows: one warp a row (its 64-channel blocks are wider than a warp), warp-uniform
// grid-stride over the rows.
__global__ void v4_row_qdq_kernel(const float* x, int64_t rows, float* y) {
  pdl_entry();
  const int lane = threadIdx.x & 31;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int64_t warps = (static_cast<int64_t>(gridDim.x) * blockDim.x) >> 5;
  for (int64_t r = warp; r < rows; r += warps) {
    v4dev::qdq_row(x + r * kV4RowDim, y + r * kV4RowDim, lane);
  }
}

__device__ __forceinline__ void put(uint16_t* out, int64_t i, float v) {
  out[i] = f32_to_bf16(v);  // exact for FP8/FP4 x power-of-two values in the normal range
}

template <typename Out>
__global__ void dequant_fp8_blocks_kernel(const uint8_t* __restrict__ codes,
                                          const uint8_t* __restrict__ scales, int64_t total,
                                          int64_t cols, int64_t block_rows, int64_t block_cols,
                                          int64_t scale_cols, Out* __restrict__ out) {
  pdl_entry();
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += stride) {
    const int64_t r = i / cols, c = i - r * cols;
    const float s = e8m0_to_f32(scales[(r / block_rows) * scale_cols + c / block_cols]);
    put(out, i, __fmul_rn(fp8_e4m3_to_f32(codes[i]), s));
  }
}

template <typename Out>
__global__ void dequant_fp4_rows_kernel(const uint8_t* __restrict__ packed,
                                        const uint8_t* __restrict__ scales, int64_t total,
                                        int64_t cols, int64_t scale_cols, Out* __restrict__ out) {
  pdl_entry();
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += stride) {
    const int64_t r = i / cols, c = i - r * cols;
    const uint8_t byte = packed[r * (cols / 2) + c / 2];
    const uint8_t code = (c & 1) ? fp4_unpack_hi(byte) : fp4_unpack_lo(byte);
    const float v = code == 8 ? 0.0f : fp4_e2m1_to_f32(code);  // NeMo's table: code 8 -> +0
    put(out, i, __fmul_rn(v, e8m0_to_f32(scales[r * scale_cols + c / 32])));
  }
}

template <Format F>
bool bad_dims(int64_t rows, int64_t dim) {
  return rows < 0 || dim <= 0 || dim % block_of<F>() != 0;
}

template <Format F, bool Bf16First = false>
cudaError_t launch_qdq(const float* x, int64_t rows, int64_t dim, float* y, cudaStream_t stream) {
  if (bad_dims<F>(rows, dim)) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  const int64_t total = rows * dim;
  qdq_kernel<F, Bf16First><<<blocks_for(total), kThreads, 0, stream>>>(x, total, y);
  return launch_status();
}

}  // namespace

cudaError_t fp8_window_qdq(const float* x, int64_t rows, int64_t dim, float* y,
                           cudaStream_t stream) {
  return launch_qdq<Format::kFp8Window>(x, rows, dim, y, stream);
}
cudaError_t fp8_act_qdq(const float* x, int64_t rows, int64_t dim, float* y, cudaStream_t stream) {
  return launch_qdq<Format::kFp8Window, true>(x, rows, dim, y, stream);
}
bool fp8_act_qdq_bf16_supported(const float* x, int64_t ldx, int64_t k, const uint16_t* y,
                                int64_t ldy) {
  return k > 0 && k % 32 == 0 && ldx >= k && ldy >= k && ldx % 4 == 0 && ldy % 4 == 0 &&
         reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(y) % 8 == 0;
}
cudaError_t fp8_act_qdq_bf16(const float* x, int64_t ldx, int64_t rows, int64_t k, uint16_t* y,
                             int64_t ldy, cudaStream_t stream) {
  if (rows < 0 || !fp8_act_qdq_bf16_supported(x, ldx, k, y, ldy)) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  if (!x || !y) return cudaErrorInvalidValue;
  const int64_t warps = rows * ((k + 127) / 128);
  fp8_act_qdq_bf16_kernel<<<blocks_for(warps * 32), kThreads, 0, stream>>>(x, ldx, rows, k, y, ldy);
  return launch_status();
}
cudaError_t v4_row_qdq(const float* x, int64_t rows, int64_t dim, float* y, cudaStream_t stream) {
  if (rows < 0 || dim != kV4RowDim) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  v4_row_qdq_kernel<<<blocks_for(rows * 32), kThreads, 0, stream>>>(x, rows, y);
  return launch_status();
}
cudaError_t nvfp4_qdq(const float* x, int64_t rows, int64_t dim, float* y, cudaStream_t stream) {
  return launch_qdq<Format::kNvfp4>(x, rows, dim, y, stream);
}
cudaError_t mxfp4_qdq(const float* x, int64_t rows, int64_t dim, float* y, cudaStream_t stream) {
  return launch_qdq<Format::kMxfp4>(x, rows, dim, y, stream);
}

namespace {

template <typename Out>
cudaError_t launch_fp8_blocks(const uint8_t* codes, const uint8_t* scales, int64_t rows,
                              int64_t cols, int64_t block_rows, int64_t block_cols, Out* out,
                              cudaStream_t stream) {
  if (rows < 0 || cols < 0 || block_rows <= 0 || block_cols <= 0) return cudaErrorInvalidValue;
  const int64_t total = rows * cols;
  if (total == 0) return cudaSuccess;
  const int64_t scale_cols = (cols + block_cols - 1) / block_cols;
  dequant_fp8_blocks_kernel<Out><<<blocks_for(total), kThreads, 0, stream>>>(
      codes, scales, total, cols, block_rows, block_cols, scale_cols, out);
  return launch_status();
}

template <typename Out>
cudaError_t launch_fp4_rows(const uint8_t* packed, const uint8_t* scales, int64_t rows,
                            int64_t cols, Out* out, cudaStream_t stream) {
  if (rows < 0 || cols < 0 || cols % 2 != 0) return cudaErrorInvalidValue;
  const int64_t total = rows * cols;
  if (total == 0) return cudaSuccess;
  dequant_fp4_rows_kernel<Out><<<blocks_for(total), kThreads, 0, stream>>>(
      packed, scales, total, cols, (cols + 31) / 32, out);
  return launch_status();
}

}  // namespace

cudaError_t dequant_fp8_blocks_bf16(const uint8_t* codes, const uint8_t* scales, int64_t rows,
                                    int64_t cols, int64_t block_rows, int64_t block_cols,
                                    uint16_t* out, cudaStream_t stream) {
  return launch_fp8_blocks(codes, scales, rows, cols, block_rows, block_cols, out, stream);
}

cudaError_t dequant_fp4_rows_bf16(const uint8_t* packed, const uint8_t* scales, int64_t rows,
                                  int64_t cols, uint16_t* out, cudaStream_t stream) {
  return launch_fp4_rows(packed, scales, rows, cols, out, stream);
}

}  // namespace dsv41rt::kernels::cuda
