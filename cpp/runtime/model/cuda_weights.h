// Device copies of the model weights for the CUDA backend: FP32 vectors uploaded from the loaded
// ModelWeights; matrices in the checkpoint's released form (BF16, FP8 E4M3 + UE8M0 block scales,
// MXFP4 + UE8M0 per 32 columns: device bytes = checkpoint bytes; FP32 only for FP32/F16 sources
// or tensors given with host values), routed experts stacked per layer (one [E * I, H] /
// [E * H, I] view), Engram tables uploaded raw (FP8 + UE8M0 scales). Built with
// DSV41RT_WITH_CUDA.
#pragma once

#include <vector>

#include "runtime/model/backend_weights.h"
#include "runtime/model/weights.h"

namespace dsv41rt::model {

/// Uploads `w` (and per-layer RoPE inverse frequencies) to the current device. engram_host: the
/// Engram tables go to pinned, device-mapped host memory instead (the gathers read them over
/// PCIe; BackendWeights::host_bytes counts them).
BackendWeights upload_weights(const ModelPlan& plan, const ModelWeights& w,
                              const std::vector<std::vector<float>>& inv_freq,
                              bool engram_host = false);

}  // namespace dsv41rt::model
