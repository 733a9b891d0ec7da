#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/paged.cuh"
#include "kernels/cuda/quant_device.cuh"
#include "kernels/cuda/v4_row_device.cuh"

namespace dsv41rt::kernels::cuda {
namespace {

using qdev::Format;

// ---- row codecs ---------------------------------------------------------------------------------
// One element of a stored row: decode (any thread) and encode (warp-collective for the block
// formats: all 32 lanes call it on 32 consecutive elements, row == nullptr for skipped lanes).
// kV4Row encodes a row per warp instead (its 64-channel blocks span two warps' elements):
// pack_v4_rows below.

template <RowFormat R>
__device__ __forceinline__ float load_element(const uint8_t* row, int64_t dim, int64_t c) {
  if constexpr (R == RowFormat::kF32) {
    return reinterpret_cast<const float*>(row)[c];
  } else if constexpr (R == RowFormat::kFp8Window) {
    return qdev::unpack_element<Format::kFp8Window>(row, dim, c);
  } else if constexpr (R == RowFormat::kV4Row) {
    return v4dev::unpack_element(row, c);
  } else if constexpr (R == RowFormat::kNvfp4) {
    return qdev::unpack_element<Format::kNvfp4>(row, dim, c);
  } else {
    return qdev::unpack_element<Format::kMxfp4>(row, dim, c);
  }
}

template <RowFormat R>
__device__ __forceinline__ void store_element(float v, bool active, int64_t c, int64_t dim,
                                              uint8_t* row) {
  if constexpr (R == RowFormat::kF32) {
    if (active && row) reinterpret_cast<float*>(row)[c] = v;
  } else if constexpr (R == RowFormat::kFp8Window) {
    qdev::pack_lane<Format::kFp8Window>(v, active, c, dim, row);
  } else if constexpr (R == RowFormat::kNvfp4) {
    qdev::pack_lane<Format::kNvfp4>(v, active, c, dim, row);
  } else {
    qdev::pack_lane<Format::kMxfp4>(v, active, c, dim, row);
  }
}

__device__ __forceinline__ uint8_t* paged_row(const PagedRows& p, int64_t item, int64_t entry) {
  const int32_t page = p.page_table[item * p.max_pages + entry / p.per_page];
  return p.pool + int64_t(page) * p.page_bytes + p.offset + (entry % p.per_page) * p.row_bytes;
}

__device__ __forceinline__ uint8_t* ring_row(const RingRows& r, int64_t item, int64_t position) {
  return r.slots[item] + r.offset + (position % r.ring) * r.row_bytes;
}

// ---- kernels ------------------------------------------------------------------------------------

template <RowFormat R>
__global__ void unpack_paged_kernel(PagedRows src, int64_t dim, int64_t items, int64_t max_count,
                                    const int64_t* count, const int64_t* out_offset, float* out) {
  pdl_entry();
  const int64_t total = items * max_count * dim;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t c = i % dim, j = (i / dim) % max_count, b = i / (dim * max_count);
    if (j >= count[b]) continue;
    out[(out_offset[b] + j) * dim + c] = load_element<R>(paged_row(src, b, j), dim, c);
  }
}

template <RowFormat R>
__global__ void unpack_ring_kernel(RingRows src, int64_t dim, int64_t items, int64_t max_count,
                                   const int64_t* first, const int64_t* count,
                                   const int64_t* out_offset, float* out) {
  pdl_entry();
  const int64_t total = items * max_count * dim;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t c = i % dim, j = (i / dim) % max_count, b = i / (dim * max_count);
    if (j >= count[b]) continue;
    out[(out_offset[b] + j) * dim + c] = load_element<R>(ring_row(src, b, first[b] + j), dim, c);
  }
}

// Warp-uniform grid-stride over the elements (as quant.cu's quantize_kernel): a warp takes 32
// consecutive elements, so quantisation blocks map onto aligned lane groups; `dest` gives each
// lane's packed row (nullptr: not stored).
template <RowFormat R, class Dest>
__device__ __forceinline__ void pack_rows(const float* rows, int64_t n, int64_t dim, Dest dest) {
  const int lane = threadIdx.x & 31;
  const int64_t first = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) - lane;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t total = n * dim;
  for (int64_t base = first; base < total; base += stride) {
    const int64_t i = base + lane;
    const bool active = i < total;
    const int64_t r = active ? i / dim : 0, c = active ? i - r * dim : 0;
    uint8_t* row = active ? dest(r) : nullptr;
    store_element<R>(active ? rows[i] : 0.0f, active, c, dim, row);
  }
}

// kV4Row: a warp-uniform grid-stride loop over the rows, one warp a row (dim is 512).
template <class Dest>
__device__ __forceinline__ void pack_v4_rows(const float* rows, int64_t n, Dest dest) {
  const int lane = threadIdx.x & 31;
  const int64_t warp = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int64_t warps = (int64_t(gridDim.x) * blockDim.x) >> 5;
  for (int64_t r = warp; r < n; r += warps) {
    uint8_t* row = dest(r);
    if (row) v4dev::pack_row(rows + r * kV4RowDim, row, lane);  // warp-uniform branch
  }
}

template <RowFormat R, class Dest>
__device__ __forceinline__ void pack_any(const float* rows, int64_t n, int64_t dim, Dest dest) {
  if constexpr (R == RowFormat::kV4Row) {
    pack_v4_rows(rows, n, dest);
  } else {
    pack_rows<R>(rows, n, dim, dest);
  }
}

template <RowFormat R>
__global__ void pack_paged_kernel(PagedRows dst, int64_t dim, int64_t n, const float* rows,
                                  const int32_t* item, const int64_t* entry) {
  pdl_entry();
  pack_any<R>(rows, n, dim, [&](int64_t r) -> uint8_t* {
    return item[r] < 0 ? nullptr : paged_row(dst, item[r], entry[r]);
  });
}

template <RowFormat R>
__global__ void pack_ring_kernel(RingRows dst, int64_t dim, int64_t n, const float* rows,
                                 const int32_t* item, const int64_t* positions,
                                 const uint8_t* store) {
  pdl_entry();
  pack_any<R>(rows, n, dim, [&](int64_t r) -> uint8_t* {
    return (item[r] < 0 || !store[r]) ? nullptr : ring_row(dst, item[r], positions[r]);
  });
}

// Threads of a pack launch: one a row element, or one warp a row for kV4Row.
int pack_blocks(RowFormat f, int64_t n, int64_t dim) {
  return blocks_for(f == RowFormat::kV4Row ? n * 32 : n * dim);
}

// One thread per (group, channel): the exact per-channel sequence of compress_pool.
__global__ void compress_pool_gather_kernel(const float* values, const float* scores,
                                            uint8_t* const* slots, int64_t pending_offset,
                                            int64_t groups, int64_t ratio, int64_t D,
                                            const int32_t* group_item, const int64_t* n_pending,
                                            const int64_t* first_row, float* pooled) {
  pdl_entry();
  const int64_t n = groups * D;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t g = i / D, c = i % D;
    const int32_t b = group_item[g];
    if (b < 0) continue;
    const int64_t np = n_pending[g], r0 = first_row[g];
    const float* pv = reinterpret_cast<const float*>(slots[b] + pending_offset);
    const float* ps = pv + (ratio - 1) * D;
    auto val = [&](int64_t t) { return t < np ? pv[t * D + c] : values[(r0 + t - np) * D + c]; };
    auto sco = [&](int64_t t) { return t < np ? ps[t * D + c] : scores[(r0 + t - np) * D + c]; };
    float m = -INFINITY;
    for (int64_t t = 0; t < ratio; ++t) m = fmaxf(m, sco(t));
    float denom = 0.0f;
    for (int64_t t = 0; t < ratio; ++t) denom += expf(sco(t) - m);
    float acc = 0.0f;
    for (int64_t t = 0; t < ratio; ++t) acc += val(t) * (expf(sco(t) - m) / denom);
    pooled[i] = acc;
  }
}

__global__ void store_pending_kernel(const float* values, const float* scores,
                                     uint8_t* const* slots, int64_t pending_offset, int64_t ratio,
                                     int64_t D, int64_t n, const int32_t* item,
                                     const int64_t* src_row, const int64_t* dst_row) {
  pdl_entry();
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n * D;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / D, c = i % D;
    const int32_t b = item[r];
    if (b < 0) continue;
    float* pv = reinterpret_cast<float*>(slots[b] + pending_offset);
    pv[dst_row[r] * D + c] = values[src_row[r] * D + c];
    pv[(ratio - 1) * D + dst_row[r] * D + c] = scores[src_row[r] * D + c];
  }
}

__global__ void attention_indices_kernel(int64_t S, int64_t W, int64_t KI, const int32_t* row_item,
                                         const int64_t* positions, const int64_t* window_first,
                                         const int64_t* length, const int64_t* old_offset,
                                         const int64_t* row0, int64_t new_offset,
                                         const int32_t* topk, const int64_t* comp_offset,
                                         int64_t comp_base, int32_t* idx) {
  pdl_entry();
  const int64_t K = W + KI;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < S * K;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t s = i / K, slot = i % K;
    const int32_t b = row_item[s];
    int32_t v = -1;
    if (b >= 0) {
      if (slot < W) {
        const int64_t t = positions[s], lo = t - W + 1 > 0 ? t - W + 1 : 0, p = lo + slot;
        if (p <= t) {
          v = p < length[b] ? int32_t(old_offset[b] + p - window_first[b])
                            : int32_t(new_offset + row0[b] + p - length[b]);
        }
      } else {
        const int32_t e = topk[s * KI + (slot - W)];
        v = e < 0 ? -1 : int32_t(comp_base + comp_offset[b] + e);
      }
    }
    idx[i] = v;
  }
}

__global__ void embed_rows_kernel(const float* table_f32, const uint16_t* table_bf16,
                                  const int32_t* tokens, int64_t n, int64_t H, int64_t copies,
                                  float* X) {
  pdl_entry();
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n * copies * H;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t h = i % H, t = i / (copies * H);
    const int64_t src = int64_t(tokens[t]) * H + h;
    X[i] = table_f32 ? table_f32[src] : bf16_to_f32(table_bf16[src]);
  }
}

__global__ void engram_gather_kernel(const uint8_t* table, const uint8_t* scales,
                                     const int64_t* rows, int64_t n, int64_t hd, float* out) {
  pdl_entry();
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n * hd;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t k = i / hd, c = i % hd, r = rows[k];
    out[i] =
        __fmul_rn(fp8_e4m3_to_f32(table[r * hd + c]), e8m0_to_f32(scales[r * (hd / 32) + c / 32]));
  }
}

__global__ void candidate_mask_kernel(float* scores, const uint8_t* mask, int64_t n) {
  pdl_entry();
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    if (!mask[i]) scores[i] = -INFINITY;
  }
}

__global__ void gather_rows_kernel(const float* src, const int64_t* rows, int64_t n, int64_t dim,
                                   float* dst) {
  pdl_entry();
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n * dim;
       i += int64_t(gridDim.x) * blockDim.x) {
    dst[i] = src[rows[i / dim] * dim + i % dim];
  }
}

__global__ void scale_kernel(float* x, int64_t n, float factor) {
  pdl_entry();
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    x[i] = __fmul_rn(x[i], factor);
  }
}

bool bad_format(RowFormat f, int64_t dim) {
  switch (f) {
    case RowFormat::kF32:
      return dim <= 0;
    case RowFormat::kNvfp4:
      return dim <= 0 || dim % 16 != 0;
    case RowFormat::kFp8Window:
    case RowFormat::kMxfp4:
      return dim <= 0 || dim % 32 != 0;
    case RowFormat::kV4Row:  // DeepSeek-V4's 584-byte rows hold head_dim 512 only
      return dim != kV4RowDim;
  }
  return true;
}

// Runs `launch.template operator()<R>()` for the runtime format.
template <class Launch>
cudaError_t dispatch(RowFormat f, Launch&& launch) {
  switch (f) {
    case RowFormat::kF32:
      launch.template operator()<RowFormat::kF32>();
      break;
    case RowFormat::kFp8Window:
      launch.template operator()<RowFormat::kFp8Window>();
      break;
    case RowFormat::kNvfp4:
      launch.template operator()<RowFormat::kNvfp4>();
      break;
    case RowFormat::kMxfp4:
      launch.template operator()<RowFormat::kMxfp4>();
      break;
    case RowFormat::kV4Row:
      launch.template operator()<RowFormat::kV4Row>();
      break;
  }
  return launch_status();
}

}  // namespace

cudaError_t unpack_paged(RowFormat f, const PagedRows& src, int64_t dim, int64_t items,
                         int64_t max_count, const int64_t* count, const int64_t* out_offset,
                         float* out, cudaStream_t stream) {
  if (bad_format(f, dim) || items < 0 || max_count < 0) return cudaErrorInvalidValue;
  if (items == 0 || max_count == 0) return cudaSuccess;
  const int blocks = blocks_for(items * max_count * dim);
  return dispatch(f, [&]<RowFormat R>() {
    unpack_paged_kernel<R>
        <<<blocks, kThreads, 0, stream>>>(src, dim, items, max_count, count, out_offset, out);
  });
}

cudaError_t pack_paged(RowFormat f, const PagedRows& dst, int64_t dim, int64_t n, const float* rows,
                       const int32_t* item, const int64_t* entry, cudaStream_t stream) {
  if (bad_format(f, dim) || n < 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  const int blocks = pack_blocks(f, n, dim);
  return dispatch(f, [&]<RowFormat R>() {
    pack_paged_kernel<R><<<blocks, kThreads, 0, stream>>>(dst, dim, n, rows, item, entry);
  });
}

cudaError_t unpack_ring(RowFormat f, const RingRows& src, int64_t dim, int64_t items,
                        int64_t max_count, const int64_t* first, const int64_t* count,
                        const int64_t* out_offset, float* out, cudaStream_t stream) {
  if (bad_format(f, dim) || items < 0 || max_count < 0 || src.ring <= 0)
    return cudaErrorInvalidValue;
  if (items == 0 || max_count == 0) return cudaSuccess;
  const int blocks = blocks_for(items * max_count * dim);
  return dispatch(f, [&]<RowFormat R>() {
    unpack_ring_kernel<R><<<blocks, kThreads, 0, stream>>>(src, dim, items, max_count, first, count,
                                                           out_offset, out);
  });
}

cudaError_t pack_ring(RowFormat f, const RingRows& dst, int64_t dim, int64_t n, const float* rows,
                      const int32_t* item, const int64_t* positions, const uint8_t* store,
                      cudaStream_t stream) {
  if (bad_format(f, dim) || n < 0 || dst.ring <= 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  const int blocks = pack_blocks(f, n, dim);
  return dispatch(f, [&]<RowFormat R>() {
    pack_ring_kernel<R><<<blocks, kThreads, 0, stream>>>(dst, dim, n, rows, item, positions, store);
  });
}

cudaError_t compress_pool_gather(const float* values, const float* scores, uint8_t* const* slots,
                                 int64_t pending_offset, int64_t groups, int64_t ratio, int64_t D,
                                 const int32_t* group_item, const int64_t* n_pending,
                                 const int64_t* first_row, float* pooled, cudaStream_t stream) {
  if (groups < 0 || ratio < 1 || D <= 0) return cudaErrorInvalidValue;
  if (groups == 0) return cudaSuccess;
  compress_pool_gather_kernel<<<blocks_for(groups * D), kThreads, 0, stream>>>(
      values, scores, slots, pending_offset, groups, ratio, D, group_item, n_pending, first_row,
      pooled);
  return launch_status();
}

cudaError_t store_pending(const float* values, const float* scores, uint8_t* const* slots,
                          int64_t pending_offset, int64_t ratio, int64_t D, int64_t n,
                          const int32_t* item, const int64_t* src_row, const int64_t* dst_row,
                          cudaStream_t stream) {
  if (n < 0 || ratio < 2 || D <= 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  store_pending_kernel<<<blocks_for(n * D), kThreads, 0, stream>>>(
      values, scores, slots, pending_offset, ratio, D, n, item, src_row, dst_row);
  return launch_status();
}

cudaError_t attention_indices(int64_t S, int64_t W, int64_t KI, const int32_t* row_item,
                              const int64_t* positions, const int64_t* window_first,
                              const int64_t* length, const int64_t* old_offset, const int64_t* row0,
                              int64_t new_offset, const int32_t* topk, const int64_t* comp_offset,
                              int64_t comp_base, int32_t* idx, cudaStream_t stream) {
  if (S < 0 || W < 1 || KI < 0 || (KI > 0 && (topk == nullptr || comp_offset == nullptr)))
    return cudaErrorInvalidValue;
  if (S == 0) return cudaSuccess;
  attention_indices_kernel<<<blocks_for(S * (W + KI)), kThreads, 0, stream>>>(
      S, W, KI, row_item, positions, window_first, length, old_offset, row0, new_offset, topk,
      comp_offset, comp_base, idx);
  return launch_status();
}

cudaError_t embed_rows(const float* table_f32, const uint16_t* table_bf16, const int32_t* tokens,
                       int64_t n, int64_t H, int64_t copies, float* X, cudaStream_t stream) {
  if (n < 0 || H <= 0 || copies < 1 || (!table_f32 && !table_bf16)) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  embed_rows_kernel<<<blocks_for(n * copies * H), kThreads, 0, stream>>>(table_f32, table_bf16,
                                                                         tokens, n, H, copies, X);
  return launch_status();
}

cudaError_t engram_gather(const uint8_t* table, const uint8_t* scales, const int64_t* rows,
                          int64_t n, int64_t hd, float* out, cudaStream_t stream) {
  if (n < 0 || hd <= 0 || hd % 32 != 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  engram_gather_kernel<<<blocks_for(n * hd), kThreads, 0, stream>>>(table, scales, rows, n, hd,
                                                                    out);
  return launch_status();
}

cudaError_t apply_candidate_mask(float* scores, const uint8_t* mask, int64_t n,
                                 cudaStream_t stream) {
  if (n < 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  candidate_mask_kernel<<<blocks_for(n), kThreads, 0, stream>>>(scores, mask, n);
  return launch_status();
}

cudaError_t gather_rows(const float* src, const int64_t* rows, int64_t n, int64_t dim, float* dst,
                        cudaStream_t stream) {
  if (n < 0 || dim <= 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  gather_rows_kernel<<<blocks_for(n * dim), kThreads, 0, stream>>>(src, rows, n, dim, dst);
  return launch_status();
}

cudaError_t scale_inplace(float* x, int64_t n, float factor, cudaStream_t stream) {
  if (n < 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  scale_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, n, factor);
  return launch_status();
}

}  // namespace dsv41rt::kernels::cuda
