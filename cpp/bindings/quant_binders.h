// The numpy wrappers of the quant-op family (cache QDQ, packed cache rows, release-format weight
// dequantisation), shared by dsv41rt._core.ops (CPU references) and dsv41rt._core.cuda_ops (CUDA
// kernels through host-pointer test entries): one set of shape checks and array handling, the
// implementation passed in as function pointers with the CPU signatures of kernels/quant.h.
#pragma once

#include <nanobind/nanobind.h>

#include <cstdint>

namespace dsv41rt::bindings {

struct QuantFns {
  using Qdq = void (*)(const float*, int64_t, int64_t, float*);
  using Pack = void (*)(const float*, int64_t, int64_t, uint8_t*);
  using Unpack = void (*)(const uint8_t*, int64_t, int64_t, float*);
  using DequantFp8 = void (*)(const uint8_t*, const uint8_t*, int64_t, int64_t, int64_t, int64_t,
                              float*);
  using DequantFp4 = void (*)(const uint8_t*, const uint8_t*, int64_t, int64_t, float*);
  Qdq fp8_window_qdq, nvfp4_qdq, mxfp4_qdq;
  Pack fp8_window_pack, nvfp4_pack, mxfp4_pack;
  Unpack fp8_window_unpack, nvfp4_unpack, mxfp4_unpack;
  DequantFp8 dequant_fp8_blocks;
  DequantFp4 dequant_fp4_rows;
};

/// Defines fp8_window_qdq ... dequant_fp4_rows on `ops` with the implementations in `fns`.
void register_quant_family(nanobind::module_& ops, const QuantFns& fns);

}  // namespace dsv41rt::bindings
