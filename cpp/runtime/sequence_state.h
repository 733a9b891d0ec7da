// A sequence's cache state as one self-describing byte blob, for handing a request from one
// runtime to another (prefill/decode disaggregation, issue 26): the request slot's whole state
// (window rings, compressor pending rows, Engram history) and the token pages covering its length
// (compressed KV, index keys), behind a header that says what they are and a checksum over
// everything, so a receiver can refuse a blob that is truncated, corrupted or from another model
// or pool layout before anything is written into its pool.
//
// Layout (little-endian): SequenceStateHeader, then slot_bytes bytes of slot state, then n_pages x
// page_bytes bytes of pages. The checksum (FNV-1a 64) covers the header (with checksum = 0) and
// the payload.
#pragma once

#include <cstdint>
#include <vector>

#include "core/export.h"
#include "runtime/model/kv_pool.h"
#include "runtime/model/model_config.h"

namespace dsv41rt {
namespace model {
class Executor;
}

struct SequenceStateHeader {
  char magic[8];                                // "DSV41SEQ"
  int64_t version;                              // kSequenceStateVersion
  uint64_t model_fingerprint;                   // model_fingerprint() of the sender's config
  int64_t page_tokens, page_bytes, slot_bytes;  // the sender's page / slot state sizes
  int64_t length;                               // positions the state covers
  int64_t n_pages;                              // pages that follow: ceil(length / page_tokens)
  uint64_t checksum;
};

constexpr int64_t kSequenceStateVersion = 1;

/// FNV-1a 64 over the config fields that shape a sequence's state (widths, layer schedule,
/// window, indexer, Engram, DSpark stages).
DSV41RT_API uint64_t model_fingerprint(const ModelConfig& c);

/// The blob of a state: `slot` (geometry.slot_bytes) and `pages` (n_pages x page_bytes).
DSV41RT_API std::vector<uint8_t> encode_sequence_state(const model::PoolGeometry& geometry,
                                                       uint64_t fingerprint, int64_t length,
                                                       const std::vector<uint8_t>& slot,
                                                       const std::vector<uint8_t>& pages);

/// A checked view of a blob: Error(kInvalidArgument) naming what is wrong (size, magic,
/// version, checksum, another model or pool geometry than `geometry` / `fingerprint`).
struct SequenceStateView {
  SequenceStateHeader header;
  const uint8_t* slot;   // slot_bytes
  const uint8_t* pages;  // n_pages x page_bytes
};
DSV41RT_API SequenceStateView decode_sequence_state(const uint8_t* data, size_t size,
                                                    const model::PoolGeometry& geometry,
                                                    uint64_t fingerprint);

// ---- Over an executor (its host copy and pool): what the direct sequences and the engine's
// handoff share. Each throws Error(kUnsupported) when the executor cannot copy state to the host
// (context parallelism).

/// The blob of the state in `slot` and the pages covering `length` positions.
DSV41RT_API std::vector<uint8_t> export_sequence_state(model::Executor& exec, int32_t slot,
                                                       const int32_t* pages, int64_t length);
/// decode_sequence_state against the executor's model and state sizes.
DSV41RT_API SequenceStateView check_sequence_state(model::Executor& exec, const uint8_t* data,
                                                   size_t size);
/// Writes a checked state into `slot` and its header's n_pages `pages` (the caller's).
DSV41RT_API void write_sequence_state(model::Executor& exec, const SequenceStateView& state,
                                      int32_t slot, const int32_t* pages);

}  // namespace dsv41rt
