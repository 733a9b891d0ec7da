// V4's MTP layer after an eager forward (docs/design/v4.md, spec 4.3): row t's input is the token
// at t + 1, the item's next row or, for its last row, the token the forward sampled for it (a
// prompt's first generated token, a decode step's next) or BatchItem::mtp_next (a prefill chunk
// followed by more prompt).
#include "core/status.h"
#include "runtime/model/model_executor.h"

namespace dsv41rt::model {

void ModelExecutor::run_mtp(const ForwardPlan& f, const std::vector<BatchItem>& batch) {
  std::vector<int32_t> next(f.tokens.size());
  for (size_t r = 0; r < next.size(); ++r) {
    const int32_t item = f.row_item[r];
    if (r + 1 < next.size() && f.row_item[r + 1] == item) {
      next[r] = f.tokens[r + 1];
      continue;
    }
    const BatchItem& b = batch[size_t(item)];
    const int32_t token = b.sample ? b.sampled->token : b.mtp_next;
    DSV41RT_CHECK_CODE(kInvalidArgument, token >= 0, "batch item ", item,
                       ": its last row has no next token for V4's MTP layer (the item neither "
                       "samples nor gives mtp_next)");
    next[r] = token;
  }
  runner_->run_mtp(f, next);
}

}  // namespace dsv41rt::model
