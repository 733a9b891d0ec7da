// CUDA synthetic weights (contract: kernels/synthetic_codes.h): code bytes generated straight into
// device memory, BITWISE equal to the CPU reference (kernels/cpu/synthetic_codes.cc), which equals
// make-checkpoint's bytes. Each thread jumps once (O(log n) 128-bit steps) to its 256 codes and
// reads the stream sequentially from there; the seeds (SeedSequence, per chunk) are computed on the
// host. All pointers are device pointers.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/export.h"
#include "kernels/synthetic_codes.h"

namespace dsv41rt::kernels::cuda {

/// kernels::cpu::synth_chunk_codes on the device (cudaErrorInvalidValue on a bad range).
DSV41RT_API cudaError_t synth_chunk_codes(SynthCodes kind, const Pcg64Start& start, int64_t n,
                                          int64_t begin, int64_t end, uint8_t* out,
                                          cudaStream_t stream);

/// kernels::cpu::synth_tensor_codes on the device: one launch per row chunk the rows touch.
DSV41RT_API cudaError_t synth_tensor_codes(SynthCodes kind, uint64_t seed, uint32_t name_crc,
                                           int64_t rows, int64_t cols, int64_t align,
                                           int64_t row_begin, int64_t row_end, uint8_t* out,
                                           cudaStream_t stream);

}  // namespace dsv41rt::kernels::cuda
