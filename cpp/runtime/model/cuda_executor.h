// The GPU executor (design: docs/design/cuda-executor.md). Same forward as CpuExecutor, with the
// weights, the paged pool, the per-ratio dequant workspaces and every activation in device
// memory. Each forward is planned on the host (row/item metadata, page tables, compressor groups,
// Engram hash rows: one upload) and then run as a fixed sequence of kernel launches that read
// only device memory, which is what makes decode steps capturable as CUDA graphs.
//
// Streams: a main stream plus three side streams (window-KV store, compressor, indexer) forked
// from the main stream once the layer's shared inputs are ready and joined before attention; the
// Q projection runs on the main stream meanwhile. Built only with DSV41RT_WITH_CUDA.
#pragma once

#include <memory>

#include "runtime/model/executor.h"

namespace dsv41rt::model {

/// options.device "cuda" or "cuda:N"; throws Error when no such GPU is visible.
std::shared_ptr<Executor> make_cuda_executor(ModelPlan plan, ModelWeights weights,
                                             EngramTables engram, ExecutorOptions options);

}  // namespace dsv41rt::model
