// Where the tensor-core sparse attention (attention_tc.cu) stages a chunk of keys from: FP32 key
// arrays (FlatKeys: the window rows and the ratio's dequant workspace), or the caches as stored
// (CachedKeys: kernels/attention_cached.h). Both write the chunk's rows as BF16 into the same
// swizzled shared-memory tile and the row's key index (or -1) into rows_sh; a stored element is
// decoded to FP32 exactly as unpack_ring / unpack_paged decode it and then rounded to BF16 the way
// the FP32 path rounds it, so both sources give the kernel the same bits (the stored formats go
// straight to those BF16 bits by bit placement: cache_row_decode.cuh decode_row_piece_bf16).
// Internal to kernels/cuda.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "core/dtype.h"
#include "kernels/attention_cached.h"
#include "kernels/cuda/cache_row_decode.cuh"
#include "kernels/cuda/mma_bf16.cuh"

namespace dsv41rt::kernels::cuda::attn {

constexpr int kStageThreads = 256;

using mma::pack_bf16x2;

/// Keys [T1 rows of kv | T - T1 rows of kv2], FP32 rows of D.
struct FlatKeys {
  const float* kv;
  const float* kv2;
  int64_t T1, T;

  __device__ void prepare(int64_t /*s*/) const {}

  __device__ void stage(__nv_bfloat16* keys_sh, int32_t* rows_sh, const int32_t* idx, int64_t c0,
                        int n, int chunk, int D, int64_t /*s*/) const {
    const int tid = threadIdx.x, q4 = D / 4, total = chunk * q4;
    for (int base = tid; base < total; base += kStageThreads * 8) {
      float4 v[8];
      int32_t jr[8];
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        const int i = base + u * kStageThreads;
        v[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        jr[u] = -1;
        if (i >= total) continue;
        const int row = i / q4;
        if (row < n) {
          const int32_t j = idx[c0 + row];
          if (j >= 0 && int64_t(j) < T) {
            jr[u] = j;
            const float* src = int64_t(j) < T1 ? kv + int64_t(j) * D : kv2 + (j - T1) * D;
            v[u] = *reinterpret_cast<const float4*>(src + 4 * (i % q4));
          }
        }
      }
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        const int i = base + u * kStageThreads;
        if (i >= total) continue;
        const int row = i / q4, col = 4 * (i % q4);
        if (col == 0) rows_sh[row] = jr[u];
        uint2 packed;
        packed.x = pack_bf16x2(v[u].x, v[u].y);
        packed.y = pack_bf16x2(v[u].z, v[u].w);
        *reinterpret_cast<uint2*>(keys_sh + mma::swz(row, col, D)) = packed;
      }
    }
  }
};

// The per-item values every row of a block's query needs, loaded once per block.
struct ItemRows {
  bool live;             // false: a padding query (every index skipped)
  const uint8_t* ring;   // the item's ring (slot + offset)
  const int32_t* pages;  // the item's page-table row
  int64_t first, old_offset, old_count, comp_offset, comp_count;
};

__device__ __forceinline__ ItemRows& item_rows_sh() {
  __shared__ ItemRows item;
  return item;
}

/// A piece the bit placement does not take (FP32 rows of this forward, NaN codes, extreme
/// scales): decoded to FP32 and rounded to BF16, stored at dst0 (channels 0-7) and dst1 (8-15).
/// Out of line on purpose: inlined into the staging loop's 8 unrolled pieces, these per-value
/// conversions made the kernel's code 188 KB, more than the instruction cache holds (Nsight
/// Compute on the bench-40 decode attention: "no instruction" the largest stall).
static __device__ __noinline__ void stage_piece_fp32(int f, uint4 raw, uint8_t sc,
                                                     const uint8_t* src, int piece,
                                                     __nv_bfloat16* dst0, __nv_bfloat16* dst1) {
  float v[16];
  if (f == int(RowFormat::kF32)) {
    const float* p = reinterpret_cast<const float*>(src) + piece * 16;
#pragma unroll
    for (int e = 0; e < 16; ++e) v[e] = p[e];
  } else {
    decode_row_piece(f, raw, sc, v);
  }
  uint32_t pairs[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) pairs[e] = pack_bf16x2(v[2 * e], v[2 * e + 1]);
  *reinterpret_cast<uint4*>(dst0) = make_uint4(pairs[0], pairs[1], pairs[2], pairs[3]);
  *reinterpret_cast<uint4*>(dst1) = make_uint4(pairs[4], pairs[5], pairs[6], pairs[7]);
}

/// The caches as stored (kernels/attention_cached.h); pieces of 16 channels per thread.
struct StoredKeys {
  CachedKeys k;

  __device__ void prepare(int64_t s) const {
    if (threadIdx.x == 0) {
      ItemRows& it = item_rows_sh();
      const int64_t b = k.query_item[s];
      it.live = b >= 0;
      if (b >= 0) {
        it.ring = k.ring.slots ? k.ring.slots[b] + k.ring.offset : nullptr;
        it.first = k.window_first ? k.window_first[b] : 0;
        it.old_offset = k.old_offset ? k.old_offset[b] : 0;
        it.old_count = k.old_count ? k.old_count[b] : 0;
        it.pages = k.comp.page_table ? k.comp.page_table + b * k.comp.max_pages : nullptr;
        it.comp_offset = k.comp_offset ? k.comp_offset[b] : 0;
        it.comp_count = k.comp_count ? k.comp_count[b] : 0;
      }
    }
    __syncthreads();
  }

  // Row of key index j of the block's query: a stored row (format >= 0) or nullptr.
  __device__ const uint8_t* locate(int32_t j, int D, int* format) const {
    const ItemRows& it = item_rows_sh();
    *format = -1;
    if (j < 0 || !it.live) return nullptr;
    if (j < k.old_rows) {
      const int64_t r = j - it.old_offset;
      if (r < 0 || r >= it.old_count) return nullptr;
      *format = int(k.window_format);
      // (first + r) mod ring without a 64-bit division on the chunk's critical path: first is a
      // ring slot and r < ring, so one subtraction is the common case.
      int64_t slot = it.first + r;
      if (slot >= k.ring.ring) slot -= k.ring.ring;
      if (slot >= k.ring.ring) slot %= k.ring.ring;
      return it.ring + slot * k.ring.row_bytes;
    }
    const int64_t comp_base = k.old_rows + k.new_count;
    if (j < comp_base) {
      *format = int(RowFormat::kF32);
      return reinterpret_cast<const uint8_t*>(k.new_rows + (j - k.old_rows) * D);
    }
    const int64_t e = j - comp_base - it.comp_offset;
    if (j - comp_base >= k.comp_rows || e < 0 || e >= it.comp_count) return nullptr;
    *format = int(k.comp_format);
    const PagedRows& p = k.comp;
    // 32-bit quotient and remainder (entries and rows per page fit; a 64-bit division is a long
    // dependent sequence on the chunk's critical path).
    const uint32_t e32 = uint32_t(e), per = uint32_t(p.per_page), page = e32 / per;
    return p.pool + int64_t(it.pages[page]) * p.page_bytes + p.offset +
           int64_t(e32 - page * per) * p.row_bytes;
  }

  __device__ void stage(__nv_bfloat16* keys_sh, int32_t* rows_sh, const int32_t* idx, int64_t c0,
                        int n, int chunk, int D, int64_t /*s*/) const {
    __shared__ const uint8_t* src_sh[64];
    __shared__ int format_sh[64];
    const int tid = threadIdx.x;
    if (tid < chunk) {
      const int32_t j = tid < n ? idx[c0 + tid] : -1;
      int f = -1;
      src_sh[tid] = locate(j, D, &f);
      format_sh[tid] = f;
      rows_sh[tid] = f >= 0 ? j : -1;
    }
    __syncthreads();
    const int pieces = D / 16, total = chunk * pieces;
    for (int base = tid; base < total; base += kStageThreads * 8) {
      uint4 raw[8];
      uint8_t sc[8];
      // Every stored piece of this round in flight at once, then the decodes.
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        const int i = base + u * kStageThreads;
        raw[u] = make_uint4(0u, 0u, 0u, 0u);
        sc[u] = 0;
        if (i >= total) continue;
        const int row = i / pieces, piece = i % pieces;
        load_row_piece(format_sh[row], src_sh[row], piece, D, raw[u], sc[u]);
      }
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        const int i = base + u * kStageThreads;
        if (i >= total) continue;
        const int row = i / pieces, piece = i % pieces, f = format_sh[row];
        __nv_bfloat16* dst0 = keys_sh + mma::swz(row, piece * 16, D);
        __nv_bfloat16* dst1 = keys_sh + mma::swz(row, piece * 16 + 8, D);
        uint32_t pairs[8];
        if (f < 0) {  // a skipped row: zeros
#pragma unroll
          for (int e = 0; e < 8; ++e) pairs[e] = 0u;
        } else if (!decode_row_piece_bf16(f, raw[u], sc[u], pairs)) {
          stage_piece_fp32(f, raw[u], sc[u], src_sh[row], piece, dst0, dst1);
          continue;
        }
        *reinterpret_cast<uint4*>(dst0) = make_uint4(pairs[0], pairs[1], pairs[2], pairs[3]);
        *reinterpret_cast<uint4*>(dst1) = make_uint4(pairs[4], pairs[5], pairs[6], pairs[7]);
      }
    }
  }
};

}  // namespace dsv41rt::kernels::cuda::attn
