// One DeepSeek-V4 compressor over a forward (spec §2.6.2-§2.6.4, docs/design/v4.md): the stage the
// model runner calls for a CSA layer's compressor, its indexer's compressor and an HCA layer's
// compressor, written once against the Backend so that every backend with the V4 ops runs it.
//
//   a = x · wkv^T, s = x · wgate^T             (Backend::linear over the batch rows)
//   entries of the completed groups             (Backend::v4_compress: APE, each request's
//                                                state in its slot, pooling, RMSNorm)
//   RoPE at the groups' positions m·j           (the compress rope, last rope_dim channels)
//   stored as the source's entry rows           (Backend::pack_paged)
//
// Decode and chunked prefill give the one-shot prefill entries bitwise (the rows of `linear` do
// not depend on the batch, the op is the kernels/v4_compressor.h reference). Not here: the
// official reference's BF16 cast before the norm and, for the indexer keys, the Hadamard rotation
// and FP4 QDQ (the quantised cache mode; docs/design/v4.md).
#pragma once

#include <cstdint>

#include "kernels/paged.h"
#include "kernels/v4_compressor.h"
#include "runtime/model/backend.h"

namespace dsv41rt::model {

/// One forward's inputs (backend memory): the batch rows x [rows, H]; per item its slot, length
/// before the forward, first row and row count; per completed group of the ratio (`groups`) its
/// item, entry index and RoPE position, and per item its first group (RatioPlan / ForwardMeta).
struct V4CompressorBatch {
  const float* x = nullptr;
  int64_t rows = 0, items = 0, groups = 0;
  uint8_t* const* slots = nullptr;
  const int64_t *length = nullptr, *row0 = nullptr, *new_rows = nullptr, *group0 = nullptr;
  const int32_t* group_item = nullptr;
  const int64_t *group_entry = nullptr, *group_position = nullptr;
};

/// Where the compressor keeps its state (bytes into each slot: StateLayout::pending_offset or
/// indexer_pending_offset) and stores its entries (the source's page rows, in `format`).
struct V4CompressorTarget {
  int64_t state_offset = 0;
  kernels::PagedRows pages;
  kernels::RowFormat format = kernels::RowFormat::kF32;
  /// The CSA indexer's keys under cache_quant (spec 2.6.4): Walsh-Hadamard rotated after RoPE,
  /// before the MXFP4 store (Backend::walsh_hadamard). FP32 caches keep them unrotated, as
  /// transformers does (the rotation is orthogonal: it only moves the FP4 rounding).
  bool rotate = false;
};

/// Scratch (backend memory): a, s [rows, w.width()], entries [groups, w.D]; entries holds the
/// rotated entries afterwards. `w` gives the shape, APE and norm (its wkv / wgate pointers are not
/// read: the projections are `wkv`, `wgate`); inv_freq [rope_dim / 2] is the layer's compress rope.
DSV41RT_API void v4_compressor_stage(Backend& be, const kernels::V4CompressorWeights& w,
                                     const Matrix& wkv, const Matrix& wgate,
                                     const V4CompressorBatch& b, const V4CompressorTarget& t,
                                     int64_t rope_dim, const float* inv_freq, float* a, float* s,
                                     float* entries, Stream stream);

}  // namespace dsv41rt::model
