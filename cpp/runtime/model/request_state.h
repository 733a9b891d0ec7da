// Per-request decode state of the CPU executor (architecture spec §7.1), stored as the runtime
// keeps it: FP8 window rings per layer, packed NVFP4 compressed KV and MXFP4 index keys per KV
// source, the compressor's pending tokens, and the last Engram ids.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

namespace dsv41rt::model {

struct SourceState {
  int ratio = 0;
  int64_t entries = 0;
  std::vector<uint8_t> kv;    // entries x nvfp4_row_bytes(head_dim), RoPE'd at the group's start
  std::vector<uint8_t> keys;  // entries x mxfp4_row_bytes(index_head_dim)
  // Tokens of the incomplete trailing group (ratio >= 2): FP32 value and gate projections.
  std::vector<float> pending_values, pending_scores;
  int64_t pending = 0;
};

struct RequestState {
  int64_t length = 0;                        // tokens processed = next position
  std::vector<std::vector<uint8_t>> window;  // per backbone layer: W slots x fp8 window row bytes
  std::map<int, SourceState> sources;        // by KV source layer
  std::vector<int32_t> history;              // last (engram max_ngram - 1) token ids, oldest first
};

}  // namespace dsv41rt::model
