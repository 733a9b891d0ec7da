// The direct sequences' speculative decoding (Runtime::verify_greedy / draft_greedy,
// docs/design/dspark.md): one verify forward with exact rollback of the rejected positions, and
// the DSpark drafter over the target features each sequence keeps.
#include <algorithm>
#include <string>

#include "core/status.h"
#include "runtime/model/draft_runner.h"
#include "runtime/runtime_sequences.h"

namespace dsv41rt {

int64_t Sequences::feature_width() const {
  const ModelConfig& c = exec_.plan().config;
  return c.dspark ? int64_t(c.dspark->target_layer_ids.size()) * c.hidden_size : 0;
}

void Sequences::keep_features(Sequence& s, const std::vector<float>& rows, int64_t n) {
  const int64_t width = feature_width(), W = exec_.layout().sliding_window();
  if (int64_t(s.features.size()) != (s.length - n - s.features_first) * width) {
    s.features.clear();  // a gap (a failed forward): only the new rows are known
    s.features_first = s.length - n;
  }
  s.features.insert(s.features.end(), rows.begin(), rows.end());
  // A draft at any length down to the undo floor reads sliding_window rows before it.
  const int64_t undo_floor = s.undo.recorded() ? s.undo.length : s.length;
  const int64_t keep_from = std::max<int64_t>(s.features_first, undo_floor - W);
  if (keep_from > s.features_first) {
    s.features.erase(s.features.begin(),
                     s.features.begin() + (keep_from - s.features_first) * width);
    s.features_first = keep_from;
  }
}

DraftBlock Sequences::draft_greedy(int64_t seq, int32_t last) {
  Sequence& s = find(seq);
  DSV41RT_CHECK_CODE(kUnsupported, exec_.has_drafter(),
                     "draft_greedy: the runtime was loaded without the DSpark drafter "
                     "(load_drafter)");
  const ModelConfig& c = exec_.plan().config;
  DSV41RT_CHECK_CODE(kInvalidArgument, last >= 0 && last < c.vocab_size, "draft_greedy: token ",
                     last, " is outside the vocabulary [0, ", c.vocab_size, ")");
  const int64_t width = feature_width(), W = exec_.layout().sliding_window();
  const int64_t ring_first = std::max<int64_t>(0, s.length - W);
  const bool have = s.features_first <= ring_first &&
                    int64_t(s.features.size()) == (s.length - s.features_first) * width;
  DSV41RT_CHECK_CODE(kOutOfRange, have, "draft_greedy: sequence ", seq,
                     " holds the target features of positions [", s.features_first, ", ",
                     s.features_first + int64_t(s.features.size()) / std::max<int64_t>(width, 1),
                     "), the drafter reads [", ring_first, ", ", s.length,
                     ") (an imported sequence has none: feed it more positions first)");
  model::DraftInputs in;
  in.features = s.features.data();
  in.context = s.length - s.features_first;
  in.width = width;
  in.first = s.features_first;
  in.anchor = s.length;
  in.ids.assign(size_t(c.dspark->block_size), c.dspark->noise_token_id);
  in.ids[0] = last;
  in.previous.assign(size_t(c.dspark->block_size), last);
  model::DraftOutputs out;
  exec_.draft_greedy(in, out);
  return {std::move(out.tokens), std::move(out.confidence)};
}

std::vector<int32_t> Sequences::verify_greedy(int64_t seq, int32_t last,
                                              const std::vector<int32_t>& draft) {
  find(seq);
  const int64_t k = int64_t(draft.size()), V = exec_.plan().config.vocab_size;
  const int64_t W = exec_.layout().sliding_window();
  // A partial rollback needs the verify forward to fit the window ring (state_undo.h).
  DSV41RT_CHECK_CODE(kInvalidArgument, k + 1 <= W, "verify_greedy: a draft of ", k,
                     " tokens makes a verify forward of ", k + 1,
                     " positions; at most the sliding window (", W, ") can be taken back in part");
  std::vector<int32_t> fed{last};
  fed.insert(fed.end(), draft.begin(), draft.end());
  for (size_t i = 0; i < fed.size(); ++i) {
    DSV41RT_CHECK_CODE(kInvalidArgument, fed[i] >= 0 && fed[i] < V,
                       "verify_greedy: ", i == 0 ? "last token " : "draft token ", fed[i],
                       i == 0 ? "" : " at index ", i == 0 ? "" : std::to_string(i - 1),
                       " is outside the vocabulary [0, ", V, ")");
  }
  std::vector<float> logits(size_t((k + 1) * V));
  forward(seq, fed.data(), k + 1, true, logits.data(), /*undoable=*/k > 0);
  // The target's greedy token after row i: the argmax, ties to the lowest id (as the sampler's
  // greedy mode, kernels/sampling.h), so the tokens are plain greedy decoding's.
  auto greedy = [&](int64_t i) {
    const float* row = logits.data() + i * V;
    return int32_t(std::max_element(row, row + V) - row);
  };
  std::vector<int32_t> out;
  int32_t next = greedy(0);
  while (int64_t(out.size()) < k && next == draft[out.size()]) {
    out.push_back(next);
    next = greedy(int64_t(out.size()));
  }
  rollback(seq, k - int64_t(out.size()));
  out.push_back(next);
  return out;
}

}  // namespace dsv41rt
