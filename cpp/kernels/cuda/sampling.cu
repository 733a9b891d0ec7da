#include <climits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/sampling.cuh"
#include "kernels/sampling_uniform.h"

namespace dsv41rt::kernels::cuda {
namespace {

using kernels::SamplingParams;

constexpr int kSampleThreads = 1024;
constexpr int kWarp = 32;

int64_t align8(int64_t b) { return (b + 7) / 8 * 8; }

int64_t pow2_at_least(int64_t v) {
  int64_t p = 1;
  while (p < v) p <<= 1;
  return p;
}

// Workspace layout of one row: w [V] f64 | key [P] f64 | id [P] i32 | cnt [V] i32 | seen [V] u8.
struct RowWorkspace {
  double* w;
  double* key;
  int32_t* id;
  int32_t* cnt;
  uint8_t* seen;
};

__device__ RowWorkspace row_workspace(unsigned char* base, int64_t V, int64_t P) {
  RowWorkspace r;
  int64_t off = 0;
  r.w = reinterpret_cast<double*>(base + off);
  off += 8 * V;
  r.key = reinterpret_cast<double*>(base + off);
  off += 8 * P;
  r.id = reinterpret_cast<int32_t*>(base + off);
  off += 4 * P;
  r.cnt = reinterpret_cast<int32_t*>(base + off);
  off += 4 * V;
  r.seen = reinterpret_cast<uint8_t*>(base + off);
  return r;
}

// (value desc, id asc): is a before b?
__device__ bool before(double va, int32_t ia, double vb, int32_t ib) {
  return va > vb || (va == vb && ia < ib);
}

// Block argmax with ties to the lowest id; every thread gets the result.
__device__ void block_argmax(double& v, int32_t& id) {
  __shared__ double sv[32];
  __shared__ int32_t si[32];
  for (int off = 16; off > 0; off >>= 1) {
    const double ov = __shfl_xor_sync(0xffffffffu, v, off);
    const int32_t oi = __shfl_xor_sync(0xffffffffu, id, off);
    if (before(ov, oi, v, id)) v = ov, id = oi;
  }
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  if (lane == 0) sv[warp] = v, si[warp] = id;
  __syncthreads();
  v = sv[0], id = si[0];
  for (int w = 1; w < int(blockDim.x / kWarp); ++w) {
    if (before(sv[w], si[w], v, id)) v = sv[w], id = si[w];
  }
  __syncthreads();
}

__device__ double block_sum(double v) {
  __shared__ double sv[32];
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  if (lane == 0) sv[warp] = v;
  __syncthreads();
  v = 0;
  for (int w = 0; w < int(blockDim.x / kWarp); ++w) v += sv[w];
  __syncthreads();
  return v;
}

// Sorts (key, id)[0, P) (P a power of 2) in (key desc, id asc) order: bitonic network, one block.
__device__ void block_sort(double* key, int32_t* id, int64_t P) {
  for (int64_t k = 2; k <= P; k <<= 1) {
    for (int64_t j = k >> 1; j > 0; j >>= 1) {
      for (int64_t i = threadIdx.x; i < P; i += blockDim.x) {
        const int64_t l = i ^ j;
        if (l <= i) continue;
        const bool first_before = (i & k) == 0;  // this pair's run is in sorted (not reverse) order
        const double ki = key[i], kl = key[l];
        const int32_t ii = id[i], il = id[l];
        const bool swap = first_before ? before(kl, il, ki, ii) : before(ki, ii, kl, il);
        if (swap) {
          key[i] = kl, key[l] = ki;
          id[i] = il, id[l] = ii;
        }
      }
      __syncthreads();
    }
  }
}

// One block per row. Mirrors kernels/cpu/sampling.cc: filtered_weights, then the probs and/or the
// draw plus raw logprobs. Explicit _rn intrinsics keep nvcc from contracting into FMAs (the CPU
// reference has none), so the FP64 values match the CPU's up to exp's last ulp.
__global__ void sampling_kernel(
    const float* __restrict__ logits, const int64_t* __restrict__ logit_rows, int64_t rows,
    int64_t V, int64_t P, const SamplingParams* __restrict__ params,
    const int32_t* __restrict__ prompt, const int64_t* __restrict__ prompt_off,
    const int32_t* __restrict__ output, const int64_t* __restrict__ output_off,
    const uint64_t* __restrict__ steps, unsigned char* ws, int64_t ws_stride,
    float* __restrict__ probs, int32_t* __restrict__ tokens, float* __restrict__ logprobs,
    int32_t max_top, int32_t* __restrict__ top_ids, float* __restrict__ top_lps) {
  pdl_entry();
  __shared__ int64_t s_m;
  __shared__ double s_total;
  __shared__ int32_t s_token;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const SamplingParams p = params[r];
    const float* lr = logits + (logit_rows ? logit_rows[r] : r) * V;
    const RowWorkspace rw = row_workspace(ws + r * ws_stride, V, P);
    double* w = rw.w;
    const int32_t* pr = prompt_off ? prompt + prompt_off[r] : nullptr;
    const int64_t n_prompt = prompt_off ? prompt_off[r + 1] - prompt_off[r] : 0;
    const int32_t* out = output_off ? output + output_off[r] : nullptr;
    const int64_t n_output = output_off ? output_off[r + 1] - output_off[r] : 0;

    // 1. Penalties (the counts only when a penalty reads them).
    const bool rep = p.repetition_penalty != 1.0f;
    const bool freq = p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f;
    const bool greedy = double(p.temperature) < 1e-5;
    if (rep || freq) {
      for (int64_t t = threadIdx.x; t < V; t += blockDim.x) rw.cnt[t] = 0, rw.seen[t] = 0;
      __syncthreads();
      for (int64_t i = threadIdx.x; i < n_prompt; i += blockDim.x) rw.seen[pr[i]] = 1;
      for (int64_t i = threadIdx.x; i < n_output; i += blockDim.x) {
        rw.seen[out[i]] = 1;
        atomicAdd(&rw.cnt[out[i]], 1);
      }
      __syncthreads();
    }
    const double rp = p.repetition_penalty, fp = p.frequency_penalty, pp = p.presence_penalty;
    // The penalised logits w, and (2. greedy / 3. temperature) their argmax (first maximum),
    // also the max for the softmax, in the same pass. A greedy row without probabilities to
    // write needs only the argmax: w is not stored.
    const bool keep_w = !greedy || probs;
    int bad = 0, finite = 0;
    double mx = -INFINITY;
    int32_t best = INT_MAX;
    for (int64_t t = threadIdx.x; t < V; t += blockDim.x) {
      double l = lr[t];
      bad |= isnan(lr[t]) || lr[t] == INFINITY;
      finite |= isfinite(lr[t]);
      if (rep && rw.seen[t]) l = l > 0 ? __ddiv_rn(l, rp) : __dmul_rn(l, rp);
      if (freq && rw.cnt[t] > 0) l = __dsub_rn(l, __dadd_rn(__dmul_rn(fp, double(rw.cnt[t])), pp));
      if (keep_w) w[t] = l;
      if (before(l, int32_t(t), mx, best)) mx = l, best = int32_t(t);
    }
    // Logits the CPU sampler refuses (NaN, +inf, no finite one): token -1, for the caller to
    // report (block-uniform, so every thread skips the row together).
    if (__syncthreads_or(bad) || !__syncthreads_or(finite)) {
      if (threadIdx.x == 0 && tokens) tokens[r] = -1;
      __syncthreads();
      continue;
    }
    block_argmax(mx, best);  // ends with a barrier: every w written above is visible
    if (greedy) {
      if (probs) {
        for (int64_t t = threadIdx.x; t < V; t += blockDim.x) w[t] = t == best ? 1.0 : 0.0;
        __syncthreads();
      }
    } else {
      const double temp = p.temperature;
      for (int64_t t = threadIdx.x; t < V; t += blockDim.x) {
        w[t] = exp(__ddiv_rn(__dsub_rn(w[t], mx), temp));
      }
      __syncthreads();
      // 4. top-k / 5. top-p over the (w desc, id asc) order.
      const bool use_k = p.top_k >= 1 && p.top_k < V;
      const bool use_p = p.top_p < 1.0f;
      if (use_k || use_p) {
        for (int64_t i = threadIdx.x; i < P; i += blockDim.x) {
          rw.key[i] = i < V ? w[i] : -1.0;  // pads (weight -1 < every w) sort last
          rw.id[i] = i < V ? int32_t(i) : INT_MAX;
        }
        __syncthreads();
        block_sort(rw.key, rw.id, P);
        if (threadIdx.x == 0) {
          const int64_t n = use_k ? p.top_k : V;
          double kept_mass = 0;
          for (int64_t j = 0; j < n; ++j) kept_mass = __dadd_rn(kept_mass, rw.key[j]);
          const double thr = __dmul_rn(double(p.top_p), kept_mass);
          double before_mass = 0;
          int64_t m = 0;
          for (; m < n; ++m) {
            if (use_p && before_mass >= thr) break;
            before_mass = __dadd_rn(before_mass, rw.key[m]);
          }
          s_m = m;
        }
        __syncthreads();
        const int64_t m = s_m;
        for (int64_t j = m + threadIdx.x; j < V; j += blockDim.x) w[rw.id[j]] = 0;
        __syncthreads();
      }
      // 6. min_p (w = p / p_max).
      if (p.min_p > 0.0f) {
        const double min_p = p.min_p;
        for (int64_t t = threadIdx.x; t < V; t += blockDim.x) {
          if (w[t] < min_p) w[t] = 0;
        }
        __syncthreads();
      }
    }

    // 7. Total in token-id order (std::accumulate), then probs and / or the draw. Greedy: the
    // weights are one-hot at `best`, so the total is exactly 1 and the draw is `best` (the
    // sequential sum over the vocabulary would cost a millisecond for nothing).
    if (threadIdx.x == 0 && greedy) {
      s_total = 1.0;
      if (tokens) s_token = tokens[r] = best;
    } else if (threadIdx.x == 0) {
      double total = 0;
      for (int64_t t = 0; t < V; ++t) total = __dadd_rn(total, w[t]);
      s_total = total;
      if (tokens) {
        const double target = __dmul_rn(uniform_of(p.seed, steps[r]), total);
        int64_t token = -1;
        double cum = 0;
        for (int64_t t = 0; t < V; ++t) {
          if (w[t] <= 0) continue;
          token = t;
          cum = __dadd_rn(cum, w[t]);
          if (target < cum) break;
        }
        s_token = int32_t(token);  // >= 0 for valid inputs (the max always survives)
        tokens[r] = s_token;
      }
    }
    __syncthreads();
    const double total = s_total;
    if (probs) {
      for (int64_t t = threadIdx.x; t < V; t += blockDim.x) {
        probs[r * V + t] = float(__ddiv_rn(w[t], total));
      }
    }
    if (tokens) {
      // Raw logprobs: log_softmax of the unmodified logits. Without penalties their max is the
      // argmax above (w was the logits).
      double rmx = mx;
      if (rep || freq) {
        int32_t rid = INT_MAX;
        rmx = -INFINITY;
        for (int64_t t = threadIdx.x; t < V; t += blockDim.x) {
          if (before(double(lr[t]), int32_t(t), rmx, rid)) rmx = lr[t], rid = int32_t(t);
        }
        block_argmax(rmx, rid);
      }
      double sum = 0;
      for (int64_t t = threadIdx.x; t < V; t += blockDim.x) sum += exp(double(lr[t]) - rmx);
      sum = block_sum(sum);
      const double lse = rmx + log(sum);
      const int32_t token = s_token;  // written by thread 0 before the barriers above
      if (threadIdx.x == 0) logprobs[r] = float(double(lr[token]) - lse);
      int64_t n_top = p.top_logprobs < V ? p.top_logprobs : V;
      if (n_top > max_top) n_top = max_top;
      if (n_top > 0) {
        for (int64_t i = threadIdx.x; i < P; i += blockDim.x) {
          rw.key[i] = i < V ? double(lr[i]) : -INFINITY;  // pads: -inf with id INT_MAX, last
          rw.id[i] = i < V ? int32_t(i) : INT_MAX;
        }
        __syncthreads();
        block_sort(rw.key, rw.id, P);
        for (int64_t j = threadIdx.x; j < n_top; j += blockDim.x) {
          const int32_t id = rw.id[j];
          top_ids[r * max_top + j] = id;
          top_lps[r * max_top + j] = float(double(lr[id]) - lse);
        }
      }
    }
    __syncthreads();  // the workspace and shared scalars are reused by the next row
  }
}

cudaError_t launch(const float* logits, const int64_t* logit_rows, int64_t rows, int64_t V,
                   const SamplingParams* params, const int32_t* prompt,
                   const int64_t* prompt_offsets, const int32_t* output,
                   const int64_t* output_offsets, const uint64_t* steps, void* workspace,
                   float* probs, int32_t* tokens, float* logprobs, int32_t max_top,
                   int32_t* top_ids, float* top_logprobs, cudaStream_t stream) {
  if (rows <= 0) return rows == 0 ? cudaSuccess : cudaErrorInvalidValue;
  if (V < 1 || V > INT_MAX || !workspace || !params || max_top < 0) return cudaErrorInvalidValue;
  if (max_top > 0 && (!top_ids || !top_logprobs)) return cudaErrorInvalidValue;
  const int blocks = static_cast<int>(rows < kMaxBlocks ? rows : kMaxBlocks);
  sampling_kernel<<<blocks, kSampleThreads, 0, stream>>>(
      logits, logit_rows, rows, V, pow2_at_least(V), params, prompt, prompt_offsets, output,
      output_offsets, steps, static_cast<unsigned char*>(workspace), sampling_workspace_bytes(V),
      probs, tokens, logprobs, max_top, top_ids, top_logprobs);
  return launch_status();
}

// One thread per (token, row): the 32 threads of a warp share one mask word.
__global__ void mask_tokens_kernel(float* __restrict__ logits, const int64_t* __restrict__ rows,
                                   int64_t V, int64_t W, const uint32_t* __restrict__ words) {
  pdl_entry();
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t i = blockIdx.y;
  if (t >= V) return;
  if (!((words[i * W + t / 32] >> (t % 32)) & 1u)) logits[rows[i] * V + t] = -INFINITY;
}

}  // namespace

cudaError_t mask_tokens(float* logits, const int64_t* rows, int64_t n, int64_t V,
                        const uint32_t* words, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (!logits || !rows || !words || V < 1 || n < 0 || n > 65535) return cudaErrorInvalidValue;
  constexpr int kThreads = 256;
  const dim3 grid(unsigned((V + kThreads - 1) / kThreads), unsigned(n));
  mask_tokens_kernel<<<grid, kThreads, 0, stream>>>(logits, rows, V, token_mask_words(V), words);
  return launch_status();
}

int64_t sampling_workspace_bytes(int64_t V) {
  const int64_t P = pow2_at_least(V);
  return align8(8 * V + 8 * P + 4 * P + 4 * V + V);
}

cudaError_t sample_token(const float* logits, const int64_t* logit_rows, int64_t rows, int64_t V,
                         const SamplingParams* params, const int32_t* prompt,
                         const int64_t* prompt_offsets, const int32_t* output,
                         const int64_t* output_offsets, const uint64_t* steps, void* workspace,
                         int32_t* tokens, float* logprobs, int32_t max_top, int32_t* top_ids,
                         float* top_logprobs, cudaStream_t stream) {
  if (!tokens || !logprobs || !steps) return cudaErrorInvalidValue;
  return launch(logits, logit_rows, rows, V, params, prompt, prompt_offsets, output, output_offsets,
                steps, workspace, nullptr, tokens, logprobs, max_top, top_ids, top_logprobs,
                stream);
}

}  // namespace dsv41rt::kernels::cuda
