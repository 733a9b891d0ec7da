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

}  // namespace dsv41rt
