// CUDA DeepSeek-V4 compressors over the request slots' flat states (contract:
// kernels/v4_compressor.h v4_compress_paged; the Backend op v4_compress), FP32, device pointers:
// `slots` is the plan's device array of slot addresses, as for compress_pool_gather (paged.cuh).
//
// Two kernels, so that nothing reads a state row another thread of the same launch writes:
//   1. entries: one block per (item, completed group) (grid-stride over the item's groups). A
//      group's rows come from this forward's projected rows a, s (the APE added as the CPU adds
//      it) or, for the group in progress when the forward started, from the state's pending
//      rows; with overlap the previous group's A-halves likewise, or from the state's prev rows
//      when that group completed in an earlier forward. It only reads the state.
//   2. state: the pending rows every position of the forward leaves (slot t: the last position
//      p ≡ t mod ratio of the forward) and, with overlap, the A-halves of the last group it
//      completed: the flat state the CPU reference leaves, bitwise (copies and the one APE add).
//      The thread of element (t, c) reads the old pending row it may move to prev before it
//      overwrites it.
// Per channel the softmax pooling runs in the CPU's slot order with its roundings (no FMA
// contraction) and exp through FP64 rounded to FP32 (correctly rounded but for double-rounding
// ties; the CPU's std::exp is glibc's expf, within 0.502 ulp), and the RMSNorm sums the squares in
// double in index order as kernels/cpu/rms_norm.cc does: the entries are bitwise the CPU's except
// where the two exps round differently (the bound: tests/cpp/test_cuda_v4_ops.cc).
//
// Items with n[b] == 0 (a decode graph's padding, whose slot address is null) are skipped. The
// CPU's checks of null slots and metadata cannot be made on the device without a host
// synchronisation. items == 0 is a no-op; bad sizes are cudaErrorInvalidValue.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/export.h"
#include "kernels/v4_compressor.h"

namespace dsv41rt::kernels::cuda {

/// See kernels/v4_compressor.h v4_compress_paged; w's ape and norm_weight are device pointers
/// (wkv / wgate are not read).
DSV41RT_API cudaError_t v4_compress_paged(const kernels::V4CompressorWeights& w, const float* a,
                                          const float* s, uint8_t* const* slots,
                                          int64_t state_offset, int64_t items,
                                          const int64_t* length, const int64_t* row0,
                                          const int64_t* n, const int64_t* entry0, float* entries,
                                          cudaStream_t stream);

}  // namespace dsv41rt::kernels::cuda
