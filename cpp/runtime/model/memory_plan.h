// The closed-form memory plan of an executor: how a KV memory budget splits into request slots,
// token pages (with the dequant workspaces and forward buffers that grow with context) and the
// fixed activation scratch of one forward.
#pragma once

#include <cstdint>
#include <string>

#include "core/export.h"
#include "runtime/model/layer_plan.h"
#include "runtime/model/state_layout.h"

namespace dsv41rt::model {

/// Where the memory budget goes. Everything that grows with the pool is charged per page,
/// everything that grows with the batch is fixed.
struct DSV41RT_API MemoryPlan {
  int64_t budget_bytes = 0;
  int64_t slot_bytes = 0, num_slots = 0;  ///< per-request fixed state
  int64_t page_bytes = 0, num_pages = 0;  ///< compressed KV + index keys of page_tokens positions
  int64_t page_tokens = 0;
  /// Dequant workspaces + forward buffers that scale with context, per page.
  int64_t workspace_bytes_per_page = 0;
  int64_t scratch_bytes = 0;  ///< activations of one forward (max_num_batched_tokens rows) + logits
  int64_t bytes_per_token() const { return page_bytes / page_tokens; }
  std::string describe() const;
};

/// The plan for `budget_bytes` with at most `max_num_seqs` running, `max_num_batched_tokens` tokens per
/// forward and requests of at most `max_model_len` positions (0: any, up to the whole pool);
/// throws Error(kOutOfRange) naming the shortfall when not one slot and one page fit.
MemoryPlan plan_memory(const ModelPlan& plan, const StateLayout& layout, int64_t budget_bytes,
                       int64_t max_num_seqs, int64_t max_num_batched_tokens, int64_t max_model_len);

}  // namespace dsv41rt::model
