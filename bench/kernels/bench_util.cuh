// Shared pieces of the kernel micro-benchmarks (bench/kernels/*_bench.cu): the CUDA error check,
// deterministic operand fills (hash-based bytes, codes, scales), the median, graph timing with
// events and the device-to-device copy bandwidth (the decode roofline's denominator). Header-only;
// each benchmark is one translation unit, so everything here has internal linkage.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

#define CHECK(call)                                                                           \
  do {                                                                                        \
    const cudaError_t e_ = (call);                                                            \
    if (e_ != cudaSuccess) {                                                                  \
      std::printf("CUDA error %s at %s:%d: %s\n", cudaGetErrorString(e_), __FILE__, __LINE__, \
                  #call);                                                                     \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)

// Hash bytes: realistic code mixes (E4M3 NaN codes avoided), scales fixed at 2^-7.
__global__ void fill_codes(uint8_t* p, int64_t n, uint32_t seed, int fmt) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
    uint8_t b = uint8_t(h);
    if (fmt == 1 && (b & 0x7F) == 0x7F) b = 0x3F;
    if (fmt == 0 && (i & 1)) b = uint8_t(0x3C | (b & 0x80));  // BF16 high byte: |v| ~ 2^-7
    p[i] = b;
  }
}

// SplitMix64 of (i, seed): the fills' random bits, the same on every device and run.
__device__ uint32_t hash(uint64_t i, uint32_t seed) {
  uint64_t z = i * 0x9E3779B97F4A7C15ull + seed;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return uint32_t(z ^ (z >> 31));
}

// kind 0: random bytes; 1: E4M3 codes without NaN; 2: UE8M0 codes in [lo, lo + 6].
__global__ void fill_bytes(uint8_t* p, int64_t n, uint32_t seed, int kind, int lo) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    uint8_t b = uint8_t(hash(uint64_t(i), seed));
    if (kind == 1 && (b & 0x7F) == 0x7F) b ^= 1;
    if (kind == 2) b = uint8_t(lo + b % 7);
    p[i] = b;
  }
}

__global__ void fill_f32(float* p, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    p[i] = float(int(i % 17) - 8) * 0.125f;
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median microseconds per call of `launch(i)` (i = 0 .. launches - 1), captured in one CUDA graph
// of `launches` calls and replayed `reps` times.
template <class F>
double time_graph(cudaStream_t s, int launches, int reps, const F& launch) {
  launch(0);  // loads the module outside capture
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < launches; ++i) launch(i);
  CHECK(cudaStreamEndCapture(s, &graph));
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  CHECK(cudaGraphLaunch(exec, s));  // warm-up
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  std::vector<double> us;
  for (int r = 0; r < reps; ++r) {
    CHECK(cudaEventRecord(e0, s));
    CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaEventRecord(e1, s));
    CHECK(cudaEventSynchronize(e1));
    float ms_ = 0;
    CHECK(cudaEventElapsedTime(&ms_, e0, e1));
    us.push_back(double(ms_) * 1e3 / launches);
  }
  CHECK(cudaEventDestroy(e0));
  CHECK(cudaEventDestroy(e1));
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(graph));
  return median(us);
}

double copy_bandwidth(bool quick, cudaStream_t s) {
  const size_t bytes = quick ? (size_t(512) << 20) : (size_t(2) << 30);
  void *a = nullptr, *b = nullptr;
  CHECK(cudaMalloc(&a, bytes));
  CHECK(cudaMalloc(&b, bytes));
  CHECK(cudaMemsetAsync(a, 1, bytes, s));
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, s));  // warm-up
  std::vector<double> gbs;
  for (int i = 0; i < 5; ++i) {
    CHECK(cudaEventRecord(e0, s));
    CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, s));
    CHECK(cudaEventRecord(e1, s));
    CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, e0, e1));
    gbs.push_back(2.0 * double(bytes) / (ms * 1e-3) / 1e9);
  }
  CHECK(cudaEventDestroy(e0));
  CHECK(cudaEventDestroy(e1));
  CHECK(cudaFree(a));
  CHECK(cudaFree(b));
  return median(gbs);
}

}  // namespace
