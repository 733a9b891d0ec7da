#include "runtime/model/memory_plan.h"

#include <algorithm>

#include "core/status.h"

namespace dsv41rt::model {

MemoryPlan plan_memory(const ModelPlan& plan, const StateLayout& layout, int64_t budget_bytes,
                       int64_t max_num_seqs, int64_t max_num_batched_tokens,
                       int64_t max_model_len) {
  const ModelConfig& c = plan.config;
  const model::PoolGeometry g = layout.geometry();
  MemoryPlan m;
  m.budget_bytes = budget_bytes;
  m.slot_bytes = g.slot_bytes;
  m.page_bytes = g.page_bytes;
  m.page_tokens = g.page_tokens;
  const int64_t P = g.page_tokens, D = c.head_dim, DI = c.index_head_dim, f = sizeof(float);
  // Per page: each ratio's dequant workspace holds P/m FP32 rows per page of context; attention
  // copies a request's rows next to its window rows (<= P rows); the indexer unpacks P index keys
  // and scores P entries for every query of the forward (FP32) with a byte of candidate mask each.
  std::vector<int> ratios;
  for (const LayerPlan& l : plan.layers) {
    if (l.role == LayerRole::kFull &&
        std::find(ratios.begin(), ratios.end(), l.ratio) == ratios.end()) {
      ratios.push_back(l.ratio);
    }
  }
  for (int r : ratios) m.workspace_bytes_per_page += (P / r) * D * f;
  m.workspace_bytes_per_page += P * D * f + P * DI * f;
  const int64_t scores_per_position = max_num_batched_tokens * (f + 1);  // FP32 score + mask byte
  if (max_model_len == 0) m.workspace_bytes_per_page += P * scores_per_position;
  // Fixed: per-token activations of one forward (streams, projections, attention, MoE) and the
  // logits of every sampled row.
  const int64_t hc = c.hc_mult, H = c.hidden_size, nh = c.num_attention_heads;
  const int64_t per_token =
      f * (2 * hc * H + 4 * H + 3 * hc + 2 * hc * hc + c.q_lora_rank + 2 * nh * D + 2 * D +
           int64_t(c.o_groups) * c.o_lora_rank + int64_t(c.index_n_heads) * (DI + 1) +
           3 * c.moe_intermediate_size + int64_t(c.sliding_window) + c.index_topk);
  m.scratch_bytes = max_num_batched_tokens * per_token + max_num_seqs * c.vocab_size * f;
  if (max_model_len > 0) m.scratch_bytes += max_model_len * scores_per_position;
  const int64_t per_page = g.page_bytes + m.workspace_bytes_per_page;
  const int64_t left = budget_bytes - m.scratch_bytes;
  m.num_slots = max_num_seqs;
  if (g.slot_bytes > 0) m.num_slots = std::min(m.num_slots, (left - per_page) / g.slot_bytes);
  m.num_pages = m.num_slots >= 1 ? (left - m.num_slots * g.slot_bytes) / per_page : 0;
  DSV41RT_CHECK_CODE(kOutOfRange, m.num_slots >= 1 && m.num_pages >= 1, "KV memory budget of ",
                     budget_bytes, " bytes is too small: scratch ", m.scratch_bytes,
                     " + one request slot ", g.slot_bytes, " + one page (with workspaces) ",
                     per_page, " = ", m.scratch_bytes + g.slot_bytes + per_page,
                     " bytes: raise kv-memory (kv_memory) to at least that, or lower "
                     "max-num-batched-tokens / max-num-seqs (they size the scratch)");
  return m;
}

std::string MemoryPlan::describe() const {
  auto mib = [](int64_t b) {
    return std::to_string(b / 1024 / 1024) + "." + std::to_string((b / 1024 % 1024) * 10 / 1024) +
           " MiB";
  };
  return "memory plan: " + mib(budget_bytes) + " = " + std::to_string(num_slots) +
         " request slots x " + std::to_string(slot_bytes) + " B + " + std::to_string(num_pages) +
         " pages x (" + std::to_string(page_bytes) + " B state + " +
         std::to_string(workspace_bytes_per_page) + " B workspaces) + " + mib(scratch_bytes) +
         " scratch; " + std::to_string(bytes_per_token()) + " B/token of state, capacity " +
         std::to_string(num_pages * page_tokens) + " tokens";
}

}  // namespace dsv41rt::model
