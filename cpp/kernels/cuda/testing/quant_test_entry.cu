#include "kernels/cuda/quant.cuh"
#include "kernels/cuda/testing/device_buffer.cuh"
#include "kernels/cuda/testing/quant_test_entry.h"
#include "kernels/quant.h"

namespace dsv41rt::kernels::cuda::testing {
namespace {

using QdqFn = cudaError_t (*)(const float*, int64_t, int64_t, float*, cudaStream_t);
using PackFn = cudaError_t (*)(const float*, int64_t, int64_t, uint8_t*, cudaStream_t);
using UnpackFn = cudaError_t (*)(const uint8_t*, int64_t, int64_t, float*, cudaStream_t);

void check_shape(const char* op, int64_t rows, int64_t dim, int64_t block) {
  DSV41RT_CHECK(rows >= 0 && dim > 0 && dim % block == 0, op, ": bad shape rows=", rows,
                " dim=", dim, " (dim must be a positive multiple of ", block, ")");
}

void run_qdq(QdqFn fn, const char* op, int64_t block, const float* x, int64_t rows, int64_t dim,
             float* y) {
  check_shape(op, rows, dim, block);
  DeviceBuffer<float> dx(x, rows * dim), dy(rows * dim);
  dy.poison();
  finish(fn(dx.get(), rows, dim, dy.get(), nullptr));
  dy.to_host(y);
}

void run_pack(PackFn fn, const char* op, int64_t block, int64_t row_bytes, const float* x,
              int64_t rows, int64_t dim, uint8_t* out) {
  check_shape(op, rows, dim, block);
  DeviceBuffer<float> dx(x, rows * dim);
  DeviceBuffer<uint8_t> dout(rows * row_bytes);
  dout.poison();
  finish(fn(dx.get(), rows, dim, dout.get(), nullptr));
  dout.to_host(out);
}

void run_unpack(UnpackFn fn, const char* op, int64_t block, int64_t row_bytes, const uint8_t* in,
                int64_t rows, int64_t dim, float* y) {
  check_shape(op, rows, dim, block);
  DeviceBuffer<uint8_t> din(in, rows * row_bytes);
  DeviceBuffer<float> dy(rows * dim);
  dy.poison();
  finish(fn(din.get(), rows, dim, dy.get(), nullptr));
  dy.to_host(y);
}

}  // namespace

void fp8_window_qdq(const float* x, int64_t rows, int64_t dim, float* y) {
  run_qdq(cuda::fp8_window_qdq, "fp8_window_qdq", kernels::kFp8WindowBlock, x, rows, dim, y);
}
void nvfp4_qdq(const float* x, int64_t rows, int64_t dim, float* y) {
  run_qdq(cuda::nvfp4_qdq, "nvfp4_qdq", kernels::kNvfp4Block, x, rows, dim, y);
}
void mxfp4_qdq(const float* x, int64_t rows, int64_t dim, float* y) {
  run_qdq(cuda::mxfp4_qdq, "mxfp4_qdq", kernels::kMxfp4Block, x, rows, dim, y);
}

void fp8_window_pack(const float* x, int64_t rows, int64_t dim, uint8_t* out) {
  run_pack(cuda::fp8_window_pack, "fp8_window_pack", kernels::kFp8WindowBlock,
           kernels::fp8_window_row_bytes(dim), x, rows, dim, out);
}
void fp8_window_unpack(const uint8_t* in, int64_t rows, int64_t dim, float* y) {
  run_unpack(cuda::fp8_window_unpack, "fp8_window_unpack", kernels::kFp8WindowBlock,
             kernels::fp8_window_row_bytes(dim), in, rows, dim, y);
}
void nvfp4_pack(const float* x, int64_t rows, int64_t dim, uint8_t* out) {
  run_pack(cuda::nvfp4_pack, "nvfp4_pack", kernels::kNvfp4Block, kernels::nvfp4_row_bytes(dim), x, rows,
           dim, out);
}
void nvfp4_unpack(const uint8_t* in, int64_t rows, int64_t dim, float* y) {
  run_unpack(cuda::nvfp4_unpack, "nvfp4_unpack", kernels::kNvfp4Block, kernels::nvfp4_row_bytes(dim), in,
             rows, dim, y);
}
void mxfp4_pack(const float* x, int64_t rows, int64_t dim, uint8_t* out) {
  run_pack(cuda::mxfp4_pack, "mxfp4_pack", kernels::kMxfp4Block, kernels::mxfp4_row_bytes(dim), x, rows,
           dim, out);
}
void mxfp4_unpack(const uint8_t* in, int64_t rows, int64_t dim, float* y) {
  run_unpack(cuda::mxfp4_unpack, "mxfp4_unpack", kernels::kMxfp4Block, kernels::mxfp4_row_bytes(dim), in,
             rows, dim, y);
}

void dequant_fp8_blocks(const uint8_t* codes, const uint8_t* scales, int64_t rows, int64_t cols,
                        int64_t block_rows, int64_t block_cols, float* out) {
  DSV41RT_CHECK(rows >= 0 && cols >= 0 && block_rows > 0 && block_cols > 0,
                "dequant_fp8_blocks: bad shape [", rows, ", ", cols, "] blocks ", block_rows, "x",
                block_cols);
  const int64_t sr = (rows + block_rows - 1) / block_rows;
  const int64_t sc = (cols + block_cols - 1) / block_cols;
  DeviceBuffer<uint8_t> dc(codes, rows * cols), ds(scales, sr * sc);
  DeviceBuffer<float> dout(rows * cols);
  dout.poison();
  finish(cuda::dequant_fp8_blocks(dc.get(), ds.get(), rows, cols, block_rows, block_cols,
                                  dout.get(), nullptr));
  dout.to_host(out);
}

void dequant_fp4_rows(const uint8_t* packed, const uint8_t* scales, int64_t rows, int64_t cols,
                      float* out) {
  DSV41RT_CHECK(rows >= 0 && cols >= 0 && cols % 2 == 0, "dequant_fp4_rows: bad shape [", rows,
                ", ", cols, "]");
  DeviceBuffer<uint8_t> dp(packed, rows * (cols / 2)), ds(scales, rows * ((cols + 31) / 32));
  DeviceBuffer<float> dout(rows * cols);
  dout.poison();
  finish(cuda::dequant_fp4_rows(dp.get(), ds.get(), rows, cols, dout.get(), nullptr));
  dout.to_host(out);
}

}  // namespace dsv41rt::kernels::cuda::testing
