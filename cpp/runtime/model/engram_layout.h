// Engram hash-bucket layout: the distinct primes of every (layer, n-gram size, head).
//
// For each Engram layer in order, for each n-gram size n = 2..max, for each head: the next prime
// above `engram_vocab_size - 1` not used by any earlier (layer, size, head). A layer's table has
// (at least) the sum of its primes as rows; bucket (n, h) starts at the sum of the earlier primes
// of that layer. The validator checks engram_num_embeddings against it; the Engram hashing inputs
// (python/dsv41rt/runtime.py) and the generator presets read it through the bindings.
#pragma once

#include <cstdint>
#include <vector>

#include "core/export.h"
#include "runtime/model/model_config.h"

namespace dsv41rt {

struct DSV41RT_API EngramLayerLayout {
  int layer_id = 0;
  std::vector<int64_t> primes;   // order [n=2 h0..h(H-1), n=3 ..., ...]
  std::vector<int64_t> offsets;  // first row of each bucket
  int64_t required_rows = 0;     // sum of primes
};

// Reads layer_ids, max_ngram_size, vocab_size and n_heads of `engram` (num_embeddings may be
// empty: the presets size their tables from this).
DSV41RT_API std::vector<EngramLayerLayout> engram_layouts(const EngramSpec& engram);

}  // namespace dsv41rt
