#include "runtime/engine/speculation.h"

#include <algorithm>
#include <cmath>

#include "core/status.h"
#include "runtime/model/draft_runner.h"

namespace dsv41rt::engine {

Speculator::Speculator(model::Executor& exec, SpeculationConfig config)
    : exec_(exec), config_(std::move(config)) {
  const ModelConfig& c = exec_.plan().config;
  window_ = exec_.layout().sliding_window();
  const int64_t k = config_.num_speculative_tokens;
  DSV41RT_CHECK(k >= 0, "speculative-config: num_speculative_tokens must be >= 0, got ", k);
  DSV41RT_CHECK(config_.disable_by_batch_size >= 0,
                "speculative-config: disable_by_batch_size must be >= 1 (0: never), got ",
                config_.disable_by_batch_size);
  if (k == 0) return;
  // The verify forward of k + 1 positions is taken back in part only within the window ring.
  DSV41RT_CHECK(k + 1 <= window_, "speculative-config: num_speculative_tokens ", k,
                " makes verify forwards of ", k + 1, " positions; at most the sliding window (",
                window_, ") can be taken back in part");
  stats_.accepted_per_pos.assign(size_t(k), 0);
  if (config_.draft_source) return;
  DSV41RT_CHECK_CODE(
      kInvalidArgument, c.dspark.has_value() && exec_.has_drafter(),
      "speculative-config: method dspark needs the DSpark drafter, and this ",
      c.dspark ? "runtime was loaded without it (load_drafter)" : "checkpoint has none");
  DSV41RT_CHECK(k <= c.dspark->block_size, "speculative-config: num_speculative_tokens ", k,
                " exceeds the DSpark drafter's block of ", c.dspark->block_size, " tokens");
  width_ = int64_t(c.dspark->target_layer_ids.size()) * c.hidden_size;
}

bool Speculator::eligible(const kernels::SamplingParams&, bool grammar, bool handoff) const {
  // A grammar's mask would have to follow every draft; a handoff ends after its first token.
  return k() > 0 && !grammar && !handoff;
}

int64_t Speculator::planned_length(const SchedRequest& r, int64_t k_max) const {
  if (!config_.self_tuning) return k_max;
  return lengths_.before_drafting(r.id, r.generated(), k_max);
}

Drafts Speculator::draft(const SchedRequest& r, int64_t k) {
  const int64_t V = exec_.plan().config.vocab_size;
  Drafts out_drafts;
  std::vector<int32_t>& d = out_drafts.tokens;
  if (config_.draft_source) {
    d = config_.draft_source(r.id, r.tokens, k);
    if (int64_t(d.size()) > k) d.resize(size_t(k));
  } else {
    auto it = features_.find(r.id);
    if (it == features_.end()) return out_drafts;
    const Features& f = it->second;
    const int64_t L = r.computed, ring_first = std::max<int64_t>(0, L - window_);
    if (f.first > ring_first || int64_t(f.rows.size()) != (L - f.first) * width_) {
      return out_drafts;
    }
    const ModelConfig& c = exec_.plan().config;
    model::DraftInputs in;
    in.features = f.rows.data();
    in.context = L - f.first;
    in.width = width_;
    in.first = f.first;
    in.anchor = L;
    in.ids.assign(size_t(c.dspark->block_size), c.dspark->noise_token_id);
    in.ids[0] = r.tokens[size_t(L)];
    in.previous.assign(size_t(c.dspark->block_size), in.ids[0]);
    model::DraftOutputs out;
    exec_.draft_greedy(in, out);
    const int64_t n = std::min<int64_t>(k, out.tokens.size());
    d.assign(out.tokens.begin(), out.tokens.begin() + n);
    out_drafts.confidence.assign(
        out.confidence.begin(),
        out.confidence.begin() + std::min<int64_t>(n, out.confidence.size()));
  }
  for (size_t i = 0; i < d.size(); ++i) {
    DSV41RT_CHECK(d[i] >= 0 && d[i] < V, "speculation: draft token ", i, " = ", d[i],
                  " of request ", r.id, " is outside the vocabulary [0, ", V, ")");
  }
  if (config_.self_tuning && !d.empty()) {
    const int64_t keep = lengths_.after_drafting(r.id, int64_t(d.size()), out_drafts.confidence);
    d.resize(size_t(keep));
    if (int64_t(out_drafts.confidence.size()) > keep) out_drafts.confidence.resize(size_t(keep));
  }
  return out_drafts;
}

void Speculator::keep_features(int64_t id, int64_t start, const std::vector<float>& rows,
                               int64_t n) {
  Features& f = features_[id];
  if (int64_t(f.rows.size()) != (start - f.first) * width_) {
    f.rows.clear();  // a gap (recompute after preemption, a prefix-cache hit): start over
    f.first = start;
  }
  f.rows.insert(f.rows.end(), rows.begin(), rows.begin() + n * width_);
  const int64_t keep_from = std::max<int64_t>(f.first, start + n - window_);
  if (keep_from > f.first) {
    f.rows.erase(f.rows.begin(), f.rows.begin() + (keep_from - f.first) * width_);
    f.first = keep_from;
  }
}

namespace {

// The raw logprob of `token` in `row`, with the sampler's arithmetic (kernels/cpu/sampling.cc).
float raw_logprob(const float* row, int64_t V, int32_t token) {
  const double mx = *std::max_element(row, row + V);
  double sum = 0;
  for (int64_t t = 0; t < V; ++t) sum += std::exp(double(row[t]) - mx);
  return float(double(row[token]) - (mx + std::log(sum)));
}

// The accept test's and the residual draw's uniforms: (seed, step) on streams of their own.
constexpr uint64_t kAcceptStream = 0x5EC0DE0000000001ull, kResidualStream = 0x5EC0DE0000000002ull;

}  // namespace

namespace {

// Rows 0, 1, ... of a verify block: each row's sampler draw, given the tokens emitted before it;
// `adjust(j, draw)` may replace the draw, `more(j, token)` says whether row j + 1 follows. A stop
// token or max_new_tokens ends the block in every mode.
template <typename Adjust, typename More>
std::vector<kernels::SampledToken> walk_rows(const Verify& v, int64_t vocab,
                                             const kernels::SamplingParams& params,
                                             const SchedRequest& r,
                                             const std::function<bool(int32_t)>& stops,
                                             Adjust adjust, More more) {
  std::vector<int32_t> history(r.tokens.begin() + r.prompt_len, r.tokens.end());
  const int64_t generated = r.generated();
  std::vector<kernels::SampledToken> out;
  for (int64_t j = 0;; ++j) {
    kernels::SampledToken s = kernels::cpu::sample_token(
        v.logits.data() + j * vocab, vocab, params, r.tokens.data(), r.prompt_len,
        history.data(), int64_t(history.size()), uint64_t(generated + j));
    adjust(j, s);
    out.push_back(std::move(s));
    const int32_t t = out.back().token;
    history.push_back(t);
    if (stops(t) || generated + j + 1 >= r.max_new_tokens || !more(j, t)) break;
  }
  return out;
}

}  // namespace

std::vector<kernels::SampledToken> accept_greedy(const Verify& v, int64_t vocab,
                                                 const kernels::SamplingParams& params,
                                                 const SchedRequest& r,
                                                 const std::function<bool(int32_t)>& stops) {
  const int64_t k = int64_t(v.fed.size()) - 1;
  // The next row follows while this row's token is the draft fed after it.
  return walk_rows(
      v, vocab, params, r, stops, [](int64_t, kernels::SampledToken&) {},
      [&](int64_t j, int32_t t) { return j < k && t == v.fed[size_t(j + 1)]; });
}

std::vector<kernels::SampledToken> accept_forced(const Verify& v, int64_t vocab,
                                                 const kernels::SamplingParams& params,
                                                 const SchedRequest& r,
                                                 const std::function<bool(int32_t)>& stops,
                                                 int64_t accepted) {
  const int64_t k = int64_t(v.fed.size()) - 1;
  DSV41RT_CHECK(accepted >= 0 && accepted <= k, "accept_forced: ", accepted,
                " drafts to accept of ", k);
  // The sampler's draw gives the token of the last row and the top logprobs of every row; a
  // forced draft the target rejects replaces the draw's token (with its raw logprob).
  return walk_rows(
      v, vocab, params, r, stops,
      [&](int64_t j, kernels::SampledToken& s) {
        if (j < accepted && s.token != v.fed[size_t(j + 1)]) {
          s.token = v.fed[size_t(j + 1)];
          s.logprob = raw_logprob(v.logits.data() + j * vocab, vocab, s.token);
        }
      },
      [&](int64_t j, int32_t) { return j < accepted; });
}

std::vector<kernels::SampledToken> accept_sampled(const Verify& v, int64_t vocab,
                                                  const kernels::SamplingParams& params,
                                                  const SchedRequest& r,
                                                  const std::function<bool(int32_t)>& stops) {
  std::vector<int32_t> history(r.tokens.begin() + r.prompt_len, r.tokens.end());
  const int64_t generated = r.generated(), k = int64_t(v.fed.size()) - 1;
  std::vector<float> p(static_cast<size_t>(vocab));
  std::vector<kernels::SampledToken> out;
  for (int64_t j = 0; j <= k; ++j) {
    const float* row = v.logits.data() + j * vocab;
    const uint64_t step = uint64_t(generated + j);
    // The sampler's own draw: the token when every draft before was accepted (j == k), and the
    // top logprobs of the row in any case.
    kernels::SampledToken s =
        kernels::cpu::sample_token(row, vocab, params, r.tokens.data(), r.prompt_len,
                                   history.data(), int64_t(history.size()), step);
    bool accepted = false;
    if (j < k) {
      const int32_t d = v.fed[size_t(j + 1)];
      kernels::cpu::sampling_probs(row, vocab, params, r.tokens.data(), r.prompt_len,
                                   history.data(), int64_t(history.size()), p.data());
      accepted = kernels::sampling_uniform(params.seed ^ kAcceptStream, step) < double(p[d]);
      int32_t token = d;
      if (!accepted) {  // the residual: p without d (p(d) < 1 here, so some mass is left)
        p[size_t(d)] = 0.0f;
        double total = 0;
        for (float x : p) total += x;
        const double target =
            kernels::sampling_uniform(params.seed ^ kResidualStream, step) * total;
        double cum = 0;
        for (int64_t t = 0; t < vocab; ++t) {
          if (p[size_t(t)] <= 0) continue;
          token = int32_t(t);  // the last kept token: the fallback if rounding runs past the end
          cum += p[size_t(t)];
          if (target < cum) break;
        }
      }
      if (token != s.token) {
        s.token = token;
        s.logprob = raw_logprob(row, vocab, token);
      }
    }
    out.push_back(std::move(s));
    const int32_t t = out.back().token;
    history.push_back(t);
    if (stops(t) || generated + j + 1 >= r.max_new_tokens) break;
    if (j == k || !accepted) break;
  }
  return out;
}

void Speculator::count(int64_t id, int64_t drafted, int64_t accepted,
                       const std::vector<float>& confidence) {
  if (drafted == 0) return;
  lengths_.observe(id, drafted, accepted, confidence);
  ++stats_.drafts;
  stats_.draft_tokens += drafted;
  stats_.accepted_tokens += accepted;
  for (int64_t j = 0; j < accepted; ++j) ++stats_.accepted_per_pos[size_t(j)];
}

}  // namespace dsv41rt::engine
