#include "kernels/cuda/common.cuh"
#include "kernels/cuda/quant.cuh"
#include "kernels/cuda/quant_device.cuh"

namespace dsv41rt::kernels::cuda {
namespace {

using namespace qdev;

// Warp-uniform grid-stride loop over the elements: each warp takes 32 consecutive elements, so
// quantisation blocks (16 or 32 elements, rows being whole blocks) map onto aligned lane groups.
// kPack = false: y = QDQ(x) (y may alias x: every element is read and written by one thread).
// kPack = true: writes the packed rows to `packed`.
template <Format F, bool kPack>
__global__ void quantize_kernel(const float* x, int64_t total, int64_t dim, float* y,
                                uint8_t* packed) {
  constexpr int kB = block_of<F>();
  const int lane = threadIdx.x & 31;
  const int64_t first = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) - lane;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t base = first; base < total; base += stride) {
    const int64_t i = base + lane;
    const bool active = i < total;
    const float v = active ? x[i] : 0.0f;
    const Quantized q = quantize_lane<F>(v, active);
    if constexpr (!kPack) {
      if (active) y[i] = __fmul_rn(decode_element<F>(q.code), q.s);
    } else {
      const int64_t r = i / dim, c = i - r * dim;
      uint8_t* row = packed + r * row_bytes<F>(dim);
      if constexpr (F == Format::kFp8Window) {
        if (active) row[c] = q.code;
      } else {
        // The odd channel's code comes from the next lane (same block: blocks are even-sized).
        const unsigned hi = __shfl_down_sync(kFullMask, static_cast<unsigned>(q.code), 1);
        if (active && (c & 1) == 0) row[c / 2] = fp4_pack(q.code, static_cast<uint8_t>(hi));
      }
      if (active && c % kB == 0) row[data_bytes<F>(dim) + c / kB] = q.scale_code;
    }
  }
}

template <Format F>
__global__ void unpack_kernel(const uint8_t* __restrict__ in, int64_t total, int64_t dim,
                              float* __restrict__ y) {
  constexpr int kB = block_of<F>();
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += stride) {
    const int64_t r = i / dim, c = i - r * dim;
    const uint8_t* row = in + r * row_bytes<F>(dim);
    const uint8_t sc = row[data_bytes<F>(dim) + c / kB];
    const float s = F == Format::kNvfp4 ? fp8_e4m3_to_f32(sc) : e8m0_to_f32(sc);
    uint8_t code;
    if constexpr (F == Format::kFp8Window) {
      code = row[c];
    } else {
      code = (c & 1) ? fp4_unpack_hi(row[c / 2]) : fp4_unpack_lo(row[c / 2]);
    }
    y[i] = __fmul_rn(decode_element<F>(code), s);
  }
}

__device__ __forceinline__ void put(float* out, int64_t i, float v) { out[i] = v; }
__device__ __forceinline__ void put(uint16_t* out, int64_t i, float v) {
  out[i] = f32_to_bf16(v);  // exact for FP8/FP4 x power-of-two values in the normal range
}

template <typename Out>
__global__ void dequant_fp8_blocks_kernel(const uint8_t* __restrict__ codes,
                                          const uint8_t* __restrict__ scales, int64_t total,
                                          int64_t cols, int64_t block_rows, int64_t block_cols,
                                          int64_t scale_cols, Out* __restrict__ out) {
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

template <Format F>
cudaError_t launch_qdq(const float* x, int64_t rows, int64_t dim, float* y, cudaStream_t stream) {
  if (bad_dims<F>(rows, dim)) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  const int64_t total = rows * dim;
  quantize_kernel<F, false><<<blocks_for(total), kThreads, 0, stream>>>(x, total, dim, y, nullptr);
  return launch_status();
}

template <Format F>
cudaError_t launch_pack(const float* x, int64_t rows, int64_t dim, uint8_t* out,
                        cudaStream_t stream) {
  if (bad_dims<F>(rows, dim)) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  const int64_t total = rows * dim;
  quantize_kernel<F, true><<<blocks_for(total), kThreads, 0, stream>>>(x, total, dim, nullptr, out);
  return launch_status();
}

template <Format F>
cudaError_t launch_unpack(const uint8_t* in, int64_t rows, int64_t dim, float* y,
                          cudaStream_t stream) {
  if (bad_dims<F>(rows, dim)) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  const int64_t total = rows * dim;
  unpack_kernel<F><<<blocks_for(total), kThreads, 0, stream>>>(in, total, dim, y);
  return launch_status();
}

}  // namespace

cudaError_t fp8_window_qdq(const float* x, int64_t rows, int64_t dim, float* y,
                           cudaStream_t stream) {
  return launch_qdq<Format::kFp8Window>(x, rows, dim, y, stream);
}
cudaError_t nvfp4_qdq(const float* x, int64_t rows, int64_t dim, float* y, cudaStream_t stream) {
  return launch_qdq<Format::kNvfp4>(x, rows, dim, y, stream);
}
cudaError_t mxfp4_qdq(const float* x, int64_t rows, int64_t dim, float* y, cudaStream_t stream) {
  return launch_qdq<Format::kMxfp4>(x, rows, dim, y, stream);
}

cudaError_t fp8_window_pack(const float* x, int64_t rows, int64_t dim, uint8_t* out,
                            cudaStream_t stream) {
  return launch_pack<Format::kFp8Window>(x, rows, dim, out, stream);
}
cudaError_t fp8_window_unpack(const uint8_t* in, int64_t rows, int64_t dim, float* y,
                              cudaStream_t stream) {
  return launch_unpack<Format::kFp8Window>(in, rows, dim, y, stream);
}
cudaError_t nvfp4_pack(const float* x, int64_t rows, int64_t dim, uint8_t* out,
                       cudaStream_t stream) {
  return launch_pack<Format::kNvfp4>(x, rows, dim, out, stream);
}
cudaError_t nvfp4_unpack(const uint8_t* in, int64_t rows, int64_t dim, float* y,
                         cudaStream_t stream) {
  return launch_unpack<Format::kNvfp4>(in, rows, dim, y, stream);
}
cudaError_t mxfp4_pack(const float* x, int64_t rows, int64_t dim, uint8_t* out,
                       cudaStream_t stream) {
  return launch_pack<Format::kMxfp4>(x, rows, dim, out, stream);
}
cudaError_t mxfp4_unpack(const uint8_t* in, int64_t rows, int64_t dim, float* y,
                         cudaStream_t stream) {
  return launch_unpack<Format::kMxfp4>(in, rows, dim, y, stream);
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

cudaError_t dequant_fp8_blocks(const uint8_t* codes, const uint8_t* scales, int64_t rows,
                               int64_t cols, int64_t block_rows, int64_t block_cols, float* out,
                               cudaStream_t stream) {
  return launch_fp8_blocks(codes, scales, rows, cols, block_rows, block_cols, out, stream);
}

cudaError_t dequant_fp8_blocks_bf16(const uint8_t* codes, const uint8_t* scales, int64_t rows,
                                    int64_t cols, int64_t block_rows, int64_t block_cols,
                                    uint16_t* out, cudaStream_t stream) {
  return launch_fp8_blocks(codes, scales, rows, cols, block_rows, block_cols, out, stream);
}

cudaError_t dequant_fp4_rows(const uint8_t* packed, const uint8_t* scales, int64_t rows,
                             int64_t cols, float* out, cudaStream_t stream) {
  return launch_fp4_rows(packed, scales, rows, cols, out, stream);
}

cudaError_t dequant_fp4_rows_bf16(const uint8_t* packed, const uint8_t* scales, int64_t rows,
                                  int64_t cols, uint16_t* out, cudaStream_t stream) {
  return launch_fp4_rows(packed, scales, rows, cols, out, stream);
}

}  // namespace dsv41rt::kernels::cuda
