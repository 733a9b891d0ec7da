#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/indexer.cuh"

namespace dsv41rt::kernels::cuda {
namespace {

// ---------------------------------------------------------------------------------------------
// indexer_scores: one warp per (query, entry); 8 warps of a block take 8 consecutive entries of
// the same query, so q[s] is shared through L1. Lanes stride D; the per-head dot is reduced with
// xor shuffles (every lane holds it) and accumulated over heads in the CPU reference's order.

constexpr int kWarpsPerBlock = kThreads / 32;

__global__ void indexer_scores_kernel(const float* __restrict__ q, const float* __restrict__ keys,
                                      const int64_t* __restrict__ key_offset,
                                      const float* __restrict__ w,
                                      const int64_t* __restrict__ n_visible, int64_t S, int64_t H,
                                      int64_t D, int64_t T, float* __restrict__ scores) {
  pdl_entry();
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t tiles = (T + kWarpsPerBlock - 1) / kWarpsPerBlock;
  // Grid-stride over (query, tile) blocks; only warp-level synchronisation inside.
  for (int64_t b = blockIdx.x; b < S * tiles; b += gridDim.x) {
    const int64_t s = b / tiles;
    const int64_t j = (b % tiles) * kWarpsPerBlock + warp;
    if (j >= T) continue;  // warp-uniform
    int64_t vis = n_visible[s];
    vis = vis < 0 ? 0 : (vis > T ? T : vis);
    if (j >= vis) {
      if (lane == 0) scores[s * T + j] = -INFINITY;
      continue;
    }
    const float* kj = keys + ((key_offset ? key_offset[s] : 0) + j) * D;
    float total = 0.0f;
    for (int64_t h = 0; h < H; ++h) {
      const float* qh = q + (s * H + h) * D;
      float dot = 0.0f;
      for (int64_t d = lane; d < D; d += 32) dot += qh[d] * kj[d];
      for (int off = 16; off > 0; off >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
      total += fmaxf(dot, 0.0f) * w[s * H + h];
    }
    if (lane == 0) scores[s * T + j] = total;
  }
}

// ---------------------------------------------------------------------------------------------
// Exact block-wide top-`take` selection (one block per row), shared by candidate_blocks and
// topk_select. Scores map to order-preserving uint32 keys (-0.0 canonicalised to +0.0, so the
// two rank equal as in the CPU comparator); an MSB-first 8-bit radix select over the row (4
// passes, streamed from global memory, so any row length works) finds the take-th largest key
// `thr` and how many entries equal to it are needed (`need`). The selected set is then every
// key > thr plus the first `need` keys == thr in index order (ties to the lower index), found
// by an ordered pass with block-wide prefix scans, which also emits in ascending index order.

struct SelectShared {
  unsigned hist[256];
  unsigned scan[32];
  unsigned prefix;
  unsigned long long remaining;
};

__device__ __forceinline__ uint32_t order_key(float x) {
  uint32_t u = __float_as_uint(x);
  if ((u << 1) == 0) u = 0;  // -0.0 -> +0.0
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Requires 1 <= take <= n; all threads of the block call it (blockDim.x a multiple of 32).
// kAggregate: count per warp and distinct digit (few long rows, where a row's keys share their
// top digits and per-key atomics serialise on one bin) or per key (many rows: the match costs
// more than the atomics it saves; measured on bench-40's 32k prefill, 84 -> 98 ms aggregated).
template <bool kAggregate, class KeyFn>
__device__ void radix_select(KeyFn key_of, int64_t n, int64_t take, SelectShared& sh, uint32_t& thr,
                             int64_t& need) {
  uint32_t prefix = 0, mask = 0;
  unsigned long long remaining = static_cast<unsigned long long>(take);
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) sh.hist[i] = 0;
    __syncthreads();
    // With kAggregate one shared-memory atomic per distinct digit per warp, not per key (per-key
    // atomics serialised on one bin: 144 us per 8192-entry decode row on the H200, 76 us after).
    for (int64_t base = 0; base < n; base += blockDim.x) {
      const int64_t i = base + threadIdx.x;
      bool hit = false;
      unsigned digit = 0;
      if (i < n) {
        const uint32_t u = key_of(i);
        hit = (u & mask) == prefix;
        digit = (u >> shift) & 255u;
      }
      if (!kAggregate) {
        if (hit) atomicAdd(&sh.hist[digit], 1u);
        continue;
      }
      const unsigned hits = __ballot_sync(0xffffffffu, hit);
      if (hit) {
        const unsigned same = __match_any_sync(hits, digit);
        if (int(threadIdx.x % 32) == __ffs(same) - 1) atomicAdd(&sh.hist[digit], __popc(same));
      }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      // Digits from the top: the bucket holding the remaining-th largest key of this prefix.
      unsigned long long above = 0;
      int d = 255;
      for (; d > 0; --d) {
        if (above + sh.hist[d] >= remaining) break;
        above += sh.hist[d];
      }
      sh.prefix = prefix | (uint32_t(d) << shift);
      sh.remaining = remaining - above;
    }
    __syncthreads();
    prefix = sh.prefix;
    remaining = sh.remaining;
    mask |= 255u << shift;
    // No barrier needed here: the next writes of hist happen after thread 0 finished reading it
    // (the barrier above), and of prefix/remaining only after two more barriers.
  }
  thr = prefix;
  need = static_cast<int64_t>(remaining);
}

// Exclusive prefix sum of v over the block (thread order) and the block total; all threads call
// it; blockDim.x a multiple of 32 (<= 1024).
__device__ unsigned block_exclusive_scan(unsigned v, unsigned* scan, unsigned& total) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
  unsigned x = v;
  for (int off = 1; off < 32; off <<= 1) {
    const unsigned y = __shfl_up_sync(0xffffffffu, x, off);
    if (lane >= off) x += y;
  }
  if (lane == 31) scan[warp] = x;
  __syncthreads();
  if (warp == 0) {
    unsigned t = lane < nwarps ? scan[lane] : 0u;
    for (int off = 1; off < 32; off <<= 1) {
      const unsigned y = __shfl_up_sync(0xffffffffu, t, off);
      if (lane >= off) t += y;
    }
    if (lane < nwarps) scan[lane] = t;  // inclusive warp totals
  }
  __syncthreads();
  const unsigned excl = x - v + (warp > 0 ? scan[warp - 1] : 0u);
  total = scan[nwarps - 1];
  __syncthreads();  // the next call overwrites scan
  return excl;
}

// ---------------------------------------------------------------------------------------------
// topk_select: one block per row.

template <bool kAggregate>
__global__ void topk_select_kernel(const float* __restrict__ scores, int64_t T, int64_t k,
                                   int32_t* __restrict__ indices) {
  pdl_entry();
  __shared__ SelectShared sh;
  const float* row = scores + int64_t(blockIdx.x) * T;
  int32_t* out = indices + int64_t(blockIdx.x) * k;
  const int64_t take = k < T ? k : T;
  int64_t written = 0;  // block-uniform
  if (take > 0) {
    uint32_t thr;
    int64_t need;
    radix_select<kAggregate>([row](int64_t i) { return order_key(row[i]); }, T, take, sh, thr,
                             need);
    int64_t eq_seen = 0;  // block-uniform: keys == thr before this chunk
    for (int64_t base = 0; base < T; base += blockDim.x) {
      const int64_t i = base + threadIdx.x;
      const bool in = i < T;
      const float x = in ? row[i] : 0.0f;
      const uint32_t u = order_key(x);
      const bool eq = in && u == thr;
      unsigned n_eq, n_emit;
      const unsigned eq_before = block_exclusive_scan(eq ? 1u : 0u, sh.scan, n_eq);
      const bool sel = in && (u > thr || (eq && eq_seen + int64_t(eq_before) < need));
      const bool emit = sel && isfinite(x);
      const unsigned pos = block_exclusive_scan(emit ? 1u : 0u, sh.scan, n_emit);
      if (emit) out[written + pos] = static_cast<int32_t>(i);
      eq_seen += n_eq;
      written += n_emit;  // total emitted <= take <= k
    }
  }
  for (int64_t i = written + threadIdx.x; i < k; i += blockDim.x) out[i] = -1;
}

// ---------------------------------------------------------------------------------------------
// candidate_blocks: one block per row; block scores are recomputed from the row on each pass
// (one thread per block of entries) rather than cached, so any T / block_size works without
// scratch memory. (Performance note: 5 passes over the row; fine for the block sizes in use.)

__device__ __forceinline__ float block_score(const float* row, int64_t T, int64_t block_size,
                                             int64_t forced, int64_t b) {
  if (b == forced) return INFINITY;  // the newest visible block is always kept
  float m = -INFINITY;
  const int64_t end = (b + 1) * block_size < T ? (b + 1) * block_size : T;
  for (int64_t j = b * block_size; j < end; ++j) m = fmaxf(m, row[j]);  // NaN ignored, as CPU
  return m;
}

__global__ void candidate_blocks_kernel(const float* __restrict__ scores,
                                        const int64_t* __restrict__ n_visible, int64_t T,
                                        int64_t topk_blocks, int64_t block_size,
                                        uint8_t* __restrict__ mask) {
  pdl_entry();
  __shared__ SelectShared sh;
  const int64_t s = blockIdx.x;
  const float* row = scores + s * T;
  uint8_t* out = mask + s * T;
  const int64_t n_blocks = (T + block_size - 1) / block_size;
  if (n_blocks == 0) return;  // block-uniform
  const int64_t vis = n_visible[s] < T ? n_visible[s] : T;
  const int64_t forced = vis > 0 ? (vis - 1) / block_size : -1;
  const int64_t keep = topk_blocks < n_blocks ? topk_blocks : n_blocks;
  uint32_t thr;
  int64_t need;
  radix_select<false>(
      [=](int64_t b) { return order_key(block_score(row, T, block_size, forced, b)); }, n_blocks,
      keep, sh, thr, need);
  int64_t eq_seen = 0;
  for (int64_t base = 0; base < n_blocks; base += blockDim.x) {
    const int64_t b = base + threadIdx.x;
    const bool in = b < n_blocks;
    const float v = in ? block_score(row, T, block_size, forced, b) : 0.0f;
    const uint32_t u = order_key(v);
    const bool eq = in && u == thr;
    unsigned n_eq;
    const unsigned eq_before = block_exclusive_scan(eq ? 1u : 0u, sh.scan, n_eq);
    const bool sel = in && (u > thr || (eq && eq_seen + int64_t(eq_before) < need));
    const bool kept = sel && v > -INFINITY;
    eq_seen += n_eq;
    if (in) {
      const int64_t end = (b + 1) * block_size < T ? (b + 1) * block_size : T;
      for (int64_t j = b * block_size; j < end; ++j) out[j] = (kept && j < vis) ? 1 : 0;
    }
  }
}

}  // namespace

cudaError_t indexer_scores_offset(const float* q, const float* keys, const int64_t* key_offset,
                                  const float* w, const int64_t* n_visible, int64_t S, int64_t H,
                                  int64_t D, int64_t T, float* scores, cudaStream_t stream) {
  if (S < 0 || H <= 0 || D <= 0 || T < 0) return cudaErrorInvalidValue;
  if (S == 0 || T == 0) return cudaSuccess;
  const int64_t tiles = (T + kWarpsPerBlock - 1) / kWarpsPerBlock;
  const int64_t work = S * tiles;
  const int64_t blocks = work < (int64_t{1} << 20) ? work : (int64_t{1} << 20);
  indexer_scores_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      q, keys, key_offset, w, n_visible, S, H, D, T, scores);
  return launch_status();
}

cudaError_t candidate_blocks(const float* scores, const int64_t* n_visible, int64_t S, int64_t T,
                             int64_t topk_blocks, int64_t block_size, uint8_t* mask,
                             cudaStream_t stream) {
  if (S < 0 || T < 0 || block_size <= 0 || topk_blocks <= 0 || S > 0x7fffffff) {
    return cudaErrorInvalidValue;
  }
  if (S == 0 || T == 0) return cudaSuccess;
  candidate_blocks_kernel<<<static_cast<unsigned>(S), kThreads, 0, stream>>>(
      scores, n_visible, T, topk_blocks, block_size, mask);
  return launch_status();
}

cudaError_t topk_select(const float* scores, int64_t S, int64_t T, int64_t k, int32_t* indices,
                        cudaStream_t stream) {
  if (S < 0 || T < 0 || k < 0 || S > 0x7fffffff || T > 0x7fffffff) return cudaErrorInvalidValue;
  if (S == 0 || k == 0) return cudaSuccess;
  // Few rows (a decode step's queries): wider blocks, as most SMs would idle (the selection is
  // exact, so the block width never changes a result).
  if (S < 32) {
    topk_select_kernel<true><<<static_cast<unsigned>(S), 1024, 0, stream>>>(scores, T, k, indices);
  } else {
    topk_select_kernel<false>
        <<<static_cast<unsigned>(S), kThreads, 0, stream>>>(scores, T, k, indices);
  }
  return launch_status();
}

}  // namespace dsv41rt::kernels::cuda
