// Synthetic weights: a checkpoint directory whose large quantised matrices are not in its files
// but listed in `dsv41rt_synthetic.json`, to be generated at load bit-identical to the bytes
// `make-checkpoint` writes for them (kernels/synthetic_codes.h). The control plane writes such a
// directory (python/dsv41rt/checkpoint/synthetic.py: config, small tensors, tokenizer, manifest).
//
// Manifest: {"seed": S, "tensors": [{"name": weight, "scale": scale tensor, "storage": "fp8" |
// "fp4", "rows": R, "cols": C, "block_rows": br, "block_cols": bc, "scale_exponent": e}, ...]}:
// FP8 -> F8_E4M3 [R, C] + F8_E8M0 [ceil(R / br), ceil(C / bc)]; FP4 -> I8 [R, C / 2] + F8_E8M0
// [R, C / 32]; every scale byte is e + 127 (the generator's tensor-wide scale).
//
// Built: the host path (CPU reference, every listed tensor into host memory, before validation,
// so the loader reads them like mapped ones). Not built: generating on the device into the CUDA
// backend's weight buffers, per rank (the kernel, kernels/cuda/synthetic_codes.cuh, exists).
#pragma once

#include <string>

#include "core/export.h"
#include "core/safetensors.h"

namespace dsv41rt::model {

inline constexpr const char* kSyntheticManifest = "dsv41rt_synthetic.json";

/// Generates the tensors `dir`'s manifest lists (none when it has no manifest) into `ck` as owned
/// tensors. Throws Error(kInvalidArgument) naming the manifest and the entry that is malformed.
/// Returns the number of tensors generated (weights and scales).
DSV41RT_API int64_t add_synthetic_weights(Checkpoint& ck, const std::string& dir);

}  // namespace dsv41rt::model
