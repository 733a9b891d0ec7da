#include "runtime/model/engram_layout.h"

#include <set>

namespace dsv41rt {
namespace {

bool is_prime(int64_t n) {
  if (n < 2) return false;
  if (n % 2 == 0) return n == 2;
  for (int64_t d = 3; d * d <= n; d += 2) {
    if (n % d == 0) return false;
  }
  return true;
}

}  // namespace

std::vector<EngramLayerLayout> engram_layouts(const EngramSpec& e) {
  std::set<int64_t> used;
  std::vector<EngramLayerLayout> out;
  for (int layer_id : e.layer_ids) {
    EngramLayerLayout layout;
    layout.layer_id = layer_id;
    for (int n = 0; n < e.max_ngram_size - 1; ++n) {
      int64_t current = e.vocab_size - 1;  // each n-gram size restarts above the vocabulary
      for (int h = 0; h < e.n_heads; ++h) {
        do {
          ++current;
        } while (!is_prime(current) || used.count(current));
        used.insert(current);
        layout.offsets.push_back(layout.required_rows);
        layout.primes.push_back(current);
        layout.required_rows += current;
      }
    }
    out.push_back(std::move(layout));
  }
  return out;
}

}  // namespace dsv41rt
