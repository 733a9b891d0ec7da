// Device copies of the model weights for the CUDA backend: FP32 vectors uploaded from the loaded
// ModelWeights, matrices kept BF16 on the device when the checkpoint stores them in a format BF16
// holds exactly (FP8 / FP4 / BF16; FP32 otherwise), routed experts stacked per layer ([E, I, H] /
// [E, H, I]), Engram tables uploaded raw (FP8 + UE8M0 scales). Built with DSV41RT_WITH_CUDA.
#pragma once

#include <vector>

#include "runtime/model/backend_weights.h"
#include "runtime/model/weights.h"

namespace dsv41rt::model {

/// Uploads `w` (and per-layer RoPE inverse frequencies) to the current device.
BackendWeights upload_weights(const ModelPlan& plan, const ModelWeights& w,
                              const std::vector<std::vector<float>>& inv_freq);

}  // namespace dsv41rt::model
