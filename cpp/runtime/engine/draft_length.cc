#include "runtime/engine/draft_length.h"

#include <algorithm>
#include <cmath>

namespace dsv41rt::engine {

double DraftLengthModel::engine_rate() const {
  return (engine_.accepted + 1.0) / (engine_.reached + 2.0);
}

double DraftLengthModel::request_rate(int64_t id) const {
  const double a = engine_rate();
  auto it = requests_.find(id);
  if (it == requests_.end()) return a;
  return (it->second.accepted + kPriorWeight * a) / (it->second.reached + kPriorWeight);
}

int DraftLengthModel::bin(float confidence_logit) {
  const double p = 1.0 / (1.0 + std::exp(-double(confidence_logit)));
  if (!(p >= 0.0)) return 0;  // a NaN logit: the lowest tenth
  return std::min(int(p * kBins), kBins - 1);
}

double DraftLengthModel::position_rate(double request_rate, float confidence_logit) const {
  const double a = engine_rate();
  const Counts& b = bins_[size_t(bin(confidence_logit))];
  const double calibrated = (b.accepted + kPriorWeight * a) / (b.reached + kPriorWeight);
  return std::min(1.0, calibrated * request_rate / a);
}

int64_t DraftLengthModel::before_drafting(int64_t id, int64_t generated, int64_t k_max) const {
  if (k_max <= 0) return 0;
  const double a_r = request_rate(id);
  if (a_r >= kBreakEven) return k_max;  // the confidences trim it (after_drafting)
  return generated % kProbeEvery == 0 ? 1 : 0;
}

int64_t DraftLengthModel::after_drafting(int64_t id, int64_t n,
                                         const std::vector<float>& confidence) const {
  if (n <= 0) return 0;
  const double a_r = request_rate(id);
  double p = 1.0;
  int64_t keep = 0;
  for (int64_t j = 0; j < n; ++j) {
    p *= j < int64_t(confidence.size()) ? position_rate(a_r, confidence[size_t(j)]) : a_r;
    if (p < kBreakEven) break;
    keep = j + 1;
  }
  return std::max<int64_t>(keep, 1);
}

void DraftLengthModel::observe(int64_t id, int64_t drafted, int64_t accepted,
                               const std::vector<float>& confidence) {
  const int64_t reached = std::min(drafted, accepted + 1);
  Counts& r = requests_[id];
  r.accepted += double(accepted);
  r.reached += double(reached);
  engine_.accepted += double(accepted);
  engine_.reached += double(reached);
  for (int64_t j = 0; j < reached && j < int64_t(confidence.size()); ++j) {
    Counts& b = bins_[size_t(bin(confidence[size_t(j)]))];
    b.reached += 1;
    if (j < accepted) b.accepted += 1;
  }
}

}  // namespace dsv41rt::engine
