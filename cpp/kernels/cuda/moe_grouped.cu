#include <algorithm>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemm_tc.cuh"
#include "kernels/cuda/gemm_wgmma.cuh"
#include "kernels/cuda/moe_grouped.cuh"
#include "kernels/cuda/quant.cuh"
#include "kernels/cuda/swiglu.cuh"
#include "kernels/cuda/weight_decode.cuh"

namespace dsv41rt::kernels::cuda {
namespace {

__global__ void count_kernel(const int32_t* __restrict__ idx, int64_t pairs, int64_t E,
                             int32_t* __restrict__ counts) {
  pdl_entry();
  for (int64_t p = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; p < pairs;
       p += int64_t(gridDim.x) * blockDim.x) {
    const int32_t e = idx[p];
    if (e >= 0 && e < E) atomicAdd(&counts[e], 1);
  }
}

// One thread: exclusive scan of the counts into placement cursors, and the tile table (each
// expert's rows in tile_rows-row tiles); the rest of the table is marked empty in parallel.
__global__ void tile_table_kernel(int32_t* __restrict__ counts, int64_t E, int64_t max_tiles,
                                  int32_t* __restrict__ tiles, int32_t tile_rows) {
  pdl_entry();
  __shared__ int32_t used;
  int32_t* group = tiles;
  int32_t* row0 = tiles + max_tiles;
  int32_t* row_end = tiles + 2 * max_tiles;
  if (threadIdx.x == 0) {
    int32_t offset = 0, n = 0;
    for (int64_t e = 0; e < E; ++e) {
      const int32_t count = counts[e];
      for (int32_t r = 0; r < count; r += tile_rows) {
        group[n] = int32_t(e);
        row0[n] = offset + r;
        row_end[n] = offset + count;
        ++n;
      }
      counts[E + e] = offset;  // cursor
      offset += count;
    }
    used = n;
  }
  __syncthreads();
  for (int64_t i = used + threadIdx.x; i < max_tiles; i += blockDim.x) group[i] = -1;
}

// Each pair takes the next free position of its expert. The order inside an expert's rows is
// not deterministic, and need not be: every row of the GEMMs is computed independently of the
// others, and the combine reads each pair's row back through `inv`.
__global__ void place_kernel(const int32_t* __restrict__ idx, int64_t pairs, int64_t E,
                             int32_t* __restrict__ cursors, int32_t* __restrict__ perm,
                             int32_t* __restrict__ inv) {
  pdl_entry();
  for (int64_t p = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; p < pairs;
       p += int64_t(gridDim.x) * blockDim.x) {
    const int32_t e = idx[p];
    if (e < 0 || e >= E) {
      inv[p] = -1;
      continue;
    }
    const int32_t pos = atomicAdd(&cursors[e], 1);
    perm[pos] = int32_t(p);
    inv[p] = pos;
  }
}

// gate[pos, i] = swiglu(gate, up) * weight of the pair (in place).
__global__ void routed_act_kernel(float* __restrict__ gate, const float* __restrict__ up,
                                  const int32_t* __restrict__ perm, const int32_t* __restrict__ cnt,
                                  int64_t E, const float* __restrict__ weight, int64_t I,
                                  float limit) {
  pdl_entry();
  int64_t rows = 0;
  for (int64_t e = 0; e < E; ++e) rows += cnt[e];
  for (int64_t v = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; v < rows * I;
       v += int64_t(gridDim.x) * blockDim.x) {
    const int64_t pos = v / I;
    gate[v] = swiglu_unit(gate[v], up[v], limit, true, weight[perm[pos]]);
  }
}

__global__ void shared_act_kernel(float* __restrict__ gate, const float* __restrict__ up, int64_t n,
                                  float limit) {
  pdl_entry();
  for (int64_t v = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; v < n;
       v += int64_t(gridDim.x) * blockDim.x) {
    gate[v] = swiglu_unit(gate[v], up[v], limit, false, 1.0f);
  }
}

// The token's next slot (be = expert id, bj = slot) after (prev_e, prev_j) in ascending
// (expert id, slot) order; be = -1 when none is left.
__device__ __forceinline__ void next_slot(const int32_t* it, int64_t k, int64_t prev_e,
                                          int64_t prev_j, int64_t& be, int64_t& bj) {
  for (int64_t j = 0; j < k; ++j) {
    const int64_t e = it[j];
    const bool after = e > prev_e || (e == prev_e && j > prev_j);
    if (after && (be < 0 || e < be || (e == be && j < bj))) be = e, bj = j;
  }
}

// y[t, c] = 0 + each routed slot in ascending (expert id, slot) order + the shared expert: the
// FP32 path's accumulation order.
__global__ void combine_kernel(const int32_t* __restrict__ idx, const int32_t* __restrict__ inv,
                               const float* __restrict__ out, const float* __restrict__ shared,
                               int64_t S, int64_t H, int64_t k, float* __restrict__ y) {
  pdl_entry();
  for (int64_t v = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; v < S * H;
       v += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = v / H, c = v % H;
    const int32_t* it = idx + t * k;
    float acc = 0.0f;
    int64_t prev_e = -1, prev_j = -1;
    for (int64_t n = 0; n < k; ++n) {
      int64_t be = -1, bj = -1;
      next_slot(it, k, prev_e, prev_j, be, bj);
      prev_e = be, prev_j = bj;
      if (be < 0) break;
      const int32_t pos = inv[t * k + bj];
      if (pos >= 0) acc = acc + out[int64_t(pos) * H + c];
    }
    if (shared) acc = acc + shared[t * H + c];
    y[v] = acc;
  }
}

// The same sums with a token's (expert id, slot) order found once per token instead of once per
// channel (the selection above runs k * k steps for each of the S * H outputs: 51 ms of a
// 4,096-token prefill on bench-40, H200 profile 2026-12-04). A block takes one token at a time.
constexpr int kCombineMaxK = 64;

__global__ void combine_rows_kernel(const int32_t* __restrict__ idx,
                                    const int32_t* __restrict__ inv, const float* __restrict__ out,
                                    const float* __restrict__ shared, int64_t S, int64_t H,
                                    int64_t k, float* __restrict__ y) {
  pdl_entry();
  __shared__ int32_t pos_sh[kCombineMaxK];
  __shared__ int n_sh;
  for (int64_t t = blockIdx.x; t < S; t += gridDim.x) {
    if (threadIdx.x == 0) {
      const int32_t* it = idx + t * k;
      int64_t prev_e = -1, prev_j = -1;
      int n = 0;
      for (int64_t r = 0; r < k; ++r) {
        int64_t be = -1, bj = -1;
        next_slot(it, k, prev_e, prev_j, be, bj);
        prev_e = be, prev_j = bj;
        if (be < 0) break;
        const int32_t pos = inv[t * k + bj];
        if (pos >= 0) pos_sh[n++] = pos;
      }
      n_sh = n;
    }
    __syncthreads();
    const int n = n_sh;
    for (int64_t c = threadIdx.x; c < H; c += blockDim.x) {
      float acc = 0.0f;
      for (int r = 0; r < n; ++r) acc = acc + out[int64_t(pos_sh[r]) * H + c];
      if (shared) acc = acc + shared[t * H + c];
      y[t * H + c] = acc;
    }
    __syncthreads();  // the next token's order overwrites pos_sh
  }
}

cudaError_t launch_combine(const int32_t* idx, const int32_t* inv, const float* out,
                           const float* shared, int64_t S, int64_t H, int64_t k, float* y,
                           cudaStream_t stream) {
  if (k <= kCombineMaxK) {
    combine_rows_kernel<<<blocks_for(S * kThreads), kThreads, 0, stream>>>(idx, inv, out, shared, S,
                                                                           H, k, y);
  } else {
    combine_kernel<<<blocks_for(S * H), kThreads, 0, stream>>>(idx, inv, out, shared, S, H, k, y);
  }
  return launch_status();
}

int64_t align4(int64_t n) { return (n + 3) / 4 * 4; }  // 16-byte alignment of every carve

// C[pairs, n] of the grouped rows: A staged once by the caller (ws.a_bf16, pitch kk), each
// expert's [n, kk] matrix of w decoded into ws.b_bf16, as many experts per pass as fit.
cudaError_t grouped_wgmma(const MoeGroupedWorkspace& ws, int64_t pairs, int64_t E, int64_t kk,
                          int64_t n, const WeightView& w, int64_t max_tiles, float* c,
                          cudaStream_t stream) {
  const int64_t per = std::max<int64_t>(1, std::min(E, ws.b_bf16_elems / (n * kk)));
  for (int64_t e0 = 0; e0 < E; e0 += per) {
    const int64_t e1 = std::min(E, e0 + per);
    cudaError_t err = weight_to_bf16(w, e0 * n, (e1 - e0) * n, ws.b_bf16, kk, stream);
    if (err != cudaSuccess) return err;
    WgmmaGemm g;
    g.a = ws.a_bf16, g.lda = kk, g.b = ws.b_bf16, g.ldb = kk, g.c = c, g.ldc = n;
    g.m = pairs, g.n = n, g.k = kk;
    g.tiles = ws.tiles, g.max_tiles = max_tiles;
    g.tile_entries = (pairs + kWgmmaTileM - 1) / kWgmmaTileM + E;
    g.b_rows_per_group = n, g.group_lo = int32_t(e0), g.group_hi = int32_t(e1);
    if ((err = gemm_bf16_wgmma(g, stream)) != cudaSuccess) return err;
  }
  return cudaSuccess;
}

// C[m, n] = A[m, kk] W^T for a dense matrix through the staging buffers.
cudaError_t dense_wgmma(const MoeGroupedWorkspace& ws, const float* a, int64_t m, int64_t kk,
                        int64_t n, const WeightView& w, float* c, cudaStream_t stream) {
  cudaError_t err = rows_to_bf16(a, kk, m, kk, ws.a_bf16, kk, stream);
  if (err == cudaSuccess) err = weight_to_bf16(w, 0, n, ws.b_bf16, kk, stream);
  if (err != cudaSuccess) return err;
  WgmmaGemm g;
  g.a = ws.a_bf16, g.lda = kk, g.b = ws.b_bf16, g.ldb = kk, g.c = c, g.ldc = n;
  g.m = m, g.n = n, g.k = kk;
  return gemm_bf16_wgmma(g, stream);
}

// The routed and shared experts with every GEMM on the wgmma kernel (the tile table is in
// kWgmmaTileM rows); otherwise the steps of moe_grouped_bf16 below, in the same order.
cudaError_t moe_grouped_wgmma(const float* x, const float* weight, int64_t S, int64_t H, int64_t k,
                              int64_t E, int64_t I, const WeightView& w1, const WeightView& w3,
                              const WeightView& w2, const WeightView& sw1, const WeightView& sw3,
                              const WeightView& sw2, int64_t Is, float limit, float* y,
                              const MoeGroupedWorkspace& ws, int64_t max_tiles, cudaStream_t stream,
                              bool fp8_hidden, const int32_t* idx) {
  const int64_t pairs = S * k;
  cudaError_t err = rows_to_bf16(x, H, pairs, H, ws.a_bf16, H, stream, ws.perm, k);
  if (err != cudaSuccess) return err;
  if ((err = grouped_wgmma(ws, pairs, E, H, I, w1, max_tiles, ws.gate, stream))) return err;
  if ((err = grouped_wgmma(ws, pairs, E, H, I, w3, max_tiles, ws.up, stream))) return err;
  routed_act_kernel<<<blocks_for(pairs * I), kThreads, 0, stream>>>(ws.gate, ws.up, ws.perm,
                                                                    ws.counts, E, weight, I, limit);
  if (fp8_hidden && (err = fp8_act_qdq(ws.gate, pairs, I, ws.gate, stream)) != cudaSuccess) {
    return err;
  }
  if ((err = rows_to_bf16(ws.gate, I, pairs, I, ws.a_bf16, I, stream))) return err;
  if ((err = grouped_wgmma(ws, pairs, E, I, H, w2, max_tiles, ws.out, stream))) return err;
  const bool shared = sw1.data != nullptr;
  if (shared) {
    if ((err = dense_wgmma(ws, x, S, H, Is, sw1, ws.shared_gate, stream))) return err;
    if ((err = dense_wgmma(ws, x, S, H, Is, sw3, ws.shared_up, stream))) return err;
    shared_act_kernel<<<blocks_for(S * Is), kThreads, 0, stream>>>(ws.shared_gate, ws.shared_up,
                                                                   S * Is, limit);
    if (fp8_hidden &&
        (err = fp8_act_qdq(ws.shared_gate, S, Is, ws.shared_gate, stream)) != cudaSuccess) {
      return err;
    }
    if ((err = dense_wgmma(ws, ws.shared_gate, S, Is, H, sw2, ws.shared_out, stream))) return err;
  }
  return launch_combine(idx, ws.inv, ws.out, shared ? ws.shared_out : nullptr, S, H, k, y, stream);
}

}  // namespace

MoeGroupedSizes moe_grouped_sizes(int64_t S, int64_t H, int64_t k, int64_t E, int64_t I,
                                  int64_t Is) {
  const int64_t pairs = S * k;
  const int64_t max_tiles = (pairs + kTcTileM - 1) / kTcTileM + E;
  const int64_t ints = align4(2 * E) + 2 * align4(pairs) + align4(3 * max_tiles);
  const int64_t floats =
      2 * align4(pairs * I) + align4(pairs * H) + 2 * align4(S * Is) + align4(Is > 0 ? S * H : 0);
  return {max_tiles, ints, floats};
}

MoeGroupedWorkspace moe_grouped_carve(int32_t* ints, float* floats, int64_t S, int64_t H, int64_t k,
                                      int64_t E, int64_t I, int64_t Is) {
  const int64_t pairs = S * k;
  const int64_t max_tiles = moe_grouped_sizes(S, H, k, E, I, Is).max_tiles;
  MoeGroupedWorkspace w;
  w.counts = ints;
  w.perm = w.counts + align4(2 * E);
  w.inv = w.perm + align4(pairs);
  w.tiles = w.inv + align4(pairs);
  w.gate = floats;
  w.up = w.gate + align4(pairs * I);
  w.out = w.up + align4(pairs * I);
  w.shared_gate = w.out + align4(pairs * H);
  w.shared_up = w.shared_gate + align4(S * Is);
  w.shared_out = w.shared_up + align4(S * Is);
  return w;
}

cudaError_t moe_grouped_bf16(const float* x, const int32_t* idx, const float* weight, int64_t S,
                             int64_t H, int64_t k, int64_t E, int64_t I, const WeightView& w1,
                             const WeightView& w3, const WeightView& w2, const WeightView& sw1,
                             const WeightView& sw3, const WeightView& sw2, int64_t Is, float limit,
                             float* y, const MoeGroupedWorkspace& ws, cudaStream_t stream,
                             bool fp8_hidden) {
  if (S <= 0) return S == 0 ? cudaSuccess : cudaErrorInvalidValue;
  if (H <= 0 || k < 1 || E <= 0 || I <= 0) return cudaErrorInvalidValue;
  const bool shared = sw1.data != nullptr;
  if (shared && (!sw3.data || !sw2.data || Is <= 0)) return cudaErrorInvalidValue;
  if (w1.rows != E * I || w3.rows != E * I || w2.rows != E * H) return cudaErrorInvalidValue;
  if (fp8_hidden && (I % 32 != 0 || (shared && Is % 32 != 0))) return cudaErrorInvalidValue;
  const int64_t pairs = S * k;
  const int64_t max_tiles = moe_grouped_sizes(S, H, k, E, I, shared ? Is : 0).max_tiles;
  const bool wgmma = ws.a_bf16 && ws.b_bf16 && H % 8 == 0 && I % 8 == 0 &&
                     (!shared || Is % 8 == 0) && ws.b_bf16_elems >= I * H &&
                     (!shared || ws.b_bf16_elems >= Is * H);
  cudaError_t err = cudaMemsetAsync(ws.counts, 0, sizeof(int32_t) * E, stream);
  if (err != cudaSuccess) return err;
  // The wgmma path stages whole 128-row boxes of grouped rows: positions no pair takes read -1.
  if (wgmma && (err = cudaMemsetAsync(ws.perm, 0xFF, sizeof(int32_t) * pairs, stream))) return err;
  count_kernel<<<blocks_for(pairs), kThreads, 0, stream>>>(idx, pairs, E, ws.counts);
  tile_table_kernel<<<1, kThreads, 0, stream>>>(ws.counts, E, max_tiles, ws.tiles,
                                                int32_t(wgmma ? kWgmmaTileM : kTcTileM));
  place_kernel<<<blocks_for(pairs), kThreads, 0, stream>>>(idx, pairs, E, ws.counts + E, ws.perm,
                                                           ws.inv);
  if ((err = launch_status()) != cudaSuccess) return err;
  if (wgmma)
    return moe_grouped_wgmma(x, weight, S, H, k, E, I, w1, w3, w2, sw1, sw3, sw2, Is, limit, y, ws,
                             max_tiles, stream, fp8_hidden, idx);

  // Routed experts: the gate and up projections of every expert's rows (tokens gathered through
  // perm), the scaled hidden units, then the down projections, all in grouped positions.
  TcGemm g;
  g.a = x, g.lda = H, g.a_rows = ws.perm, g.a_row_div = k;
  g.m = pairs, g.k = H, g.n = I, g.ldc = I, g.b_rows_per_group = I;
  g.tile_group = ws.tiles, g.tile_row0 = ws.tiles + max_tiles;
  g.tile_row_end = ws.tiles + 2 * max_tiles, g.max_tiles = max_tiles;
  g.b = w1, g.c = ws.gate;
  if ((err = gemm_bf16_tc(g, stream)) != cudaSuccess) return err;
  g.b = w3, g.c = ws.up;
  if ((err = gemm_bf16_tc(g, stream)) != cudaSuccess) return err;
  routed_act_kernel<<<blocks_for(pairs * I), kThreads, 0, stream>>>(ws.gate, ws.up, ws.perm,
                                                                    ws.counts, E, weight, I, limit);
  if (fp8_hidden && (err = fp8_act_qdq(ws.gate, pairs, I, ws.gate, stream)) != cudaSuccess) {
    return err;
  }
  g.a = ws.gate, g.lda = I, g.a_rows = nullptr, g.a_row_div = 1;
  g.k = I, g.n = H, g.ldc = H, g.b_rows_per_group = H;
  g.b = w2, g.c = ws.out;
  if ((err = gemm_bf16_tc(g, stream)) != cudaSuccess) return err;

  if (shared) {
    TcGemm s;
    s.a = x, s.lda = H, s.m = S, s.k = H, s.n = Is, s.ldc = Is;
    s.b = sw1, s.c = ws.shared_gate;
    if ((err = gemm_bf16_tc(s, stream)) != cudaSuccess) return err;
    s.b = sw3, s.c = ws.shared_up;
    if ((err = gemm_bf16_tc(s, stream)) != cudaSuccess) return err;
    shared_act_kernel<<<blocks_for(S * Is), kThreads, 0, stream>>>(ws.shared_gate, ws.shared_up,
                                                                   S * Is, limit);
    if (fp8_hidden &&
        (err = fp8_act_qdq(ws.shared_gate, S, Is, ws.shared_gate, stream)) != cudaSuccess) {
      return err;
    }
    s.a = ws.shared_gate, s.lda = Is, s.k = Is, s.n = H, s.ldc = H;
    s.b = sw2, s.c = ws.shared_out;
    if ((err = gemm_bf16_tc(s, stream)) != cudaSuccess) return err;
  }
  return launch_combine(idx, ws.inv, ws.out, shared ? ws.shared_out : nullptr, S, H, k, y, stream);
}

}  // namespace dsv41rt::kernels::cuda
