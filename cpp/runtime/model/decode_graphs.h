// Decode forwards replayed as graphs, one per decode bucket (forward_plan.h): the first forward
// of a bucket runs eagerly and is then captured; later ones replay it after the host uploaded
// their padded plan. A graph bakes buffer addresses in, so it is valid while nothing it uses has
// moved (the runner's buffers, the dequant workspaces, the plan buffer, the backend's own
// workspaces); when something has, it is captured again (and updated in place where the backend
// can).
#pragma once

#include <cstdint>
#include <map>
#include <memory>

#include "runtime/dequant_workspace.h"
#include "runtime/model/backend.h"
#include "runtime/model/forward_plan.h"
#include "runtime/model/model_runner.h"

namespace dsv41rt::model {

class DecodeGraphs {
 public:
  /// Runs `padded` (a decode plan padded to `bucket`, already begun on `runner`).
  void run(DecodeBucket bucket, const ForwardPlan& padded, ModelRunner& runner, Backend& be,
           DequantWorkspaces& workspaces);
  void clear() { graphs_.clear(); }
  int64_t size() const { return int64_t(graphs_.size()); }
  int64_t captures() const { return captures_; }
  int64_t replays() const { return replays_; }
  int64_t eager() const { return eager_; }

 private:
  struct Graph {
    std::unique_ptr<BackendGraph> exec;
    uint64_t generation = 0, ws_generation = 0, backend_generation = 0;
    const uint8_t* meta_base = nullptr;
    DequantCounters delta;  // the acquires of one captured forward
  };
  static bool valid(const Graph& g, const ModelRunner& runner, const DequantWorkspaces& ws,
                    const Backend& be) {
    return g.exec && g.generation == runner.generation() &&
           g.ws_generation == ws.storage_generation() && g.meta_base == runner.meta_base() &&
           g.backend_generation == be.workspace_generation();
  }
  void capture(Graph& g, const ForwardPlan& padded, ModelRunner& runner, Backend& be,
               DequantWorkspaces& workspaces);

  std::map<DecodeBucket, Graph> graphs_;
  int64_t captures_ = 0, replays_ = 0, eager_ = 0;
};

}  // namespace dsv41rt::model
