// Synthetic weight codes on one GPU, standalone (no project build): the CUDA kernel against the CPU
// reference (kernels/synthetic_codes.h) on tests/cpp/synthetic_codes_cases.h (numpy's hashes) and
// on whole multi-chunk tensors and row shares, then the generation rate at flash-full shapes
// (192 FP4 [2048, 4096] tensors: 64 routed experts' w1, w2, w3 by bytes; 32 FP8 [4096, 4096]).
//
//   bash bench/synthetic_codes_bench.sh   # nvcc alone, no project build; exit status 0 = all equal
// or, in a CUDA build with tests, the synthetic_codes_bench target (bench/kernels/CMakeLists.txt)
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "kernels/cuda/synthetic_codes.cuh"
#include "kernels/synthetic_codes.h"
#include "synthetic_codes_cases.h"

namespace k = dsv41rt::kernels;
using dsv41rt::testing::synth_crc;
using dsv41rt::testing::synth_hash;

#define CK(x)                                                                                 \
  do {                                                                                        \
    cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(2);                                                                           \
    }                                                                                         \
  } while (0)

static std::vector<uint8_t> device_tensor(k::SynthCodes kind, uint64_t seed,
                                          const std::string& name, int64_t rows, int64_t cols,
                                          int64_t align, int64_t rb, int64_t re) {
  const int64_t bytes = k::synth_code_bytes(kind, (re - rb) * cols);
  uint8_t* d = nullptr;
  CK(cudaMalloc(&d, size_t(bytes)));
  CK(cudaMemset(d, 0xA5, size_t(bytes)));
  CK(k::cuda::synth_tensor_codes(kind, seed, synth_crc(name), rows, cols, align, rb, re, d,
                                 nullptr));
  std::vector<uint8_t> out(static_cast<size_t>(bytes));
  CK(cudaMemcpy(out.data(), d, size_t(bytes), cudaMemcpyDeviceToHost));
  CK(cudaFree(d));
  return out;
}

static std::vector<uint8_t> host_tensor(k::SynthCodes kind, uint64_t seed, const std::string& name,
                                        int64_t rows, int64_t cols, int64_t align, int64_t rb,
                                        int64_t re) {
  std::vector<uint8_t> out(static_cast<size_t>(k::synth_code_bytes(kind, (re - rb) * cols)));
  k::cpu::synth_tensor_codes(kind, seed, synth_crc(name), rows, cols, align, rb, re, out.data());
  return out;
}

int main() {
  int failures = 0;
  for (const auto& c : dsv41rt::testing::kSynthChunkCases) {
    const k::Pcg64Start s = k::pcg64_seed(c.seed, synth_crc(c.name), c.chunk);
    const int64_t bytes = k::synth_code_bytes(c.kind, c.end - c.begin);
    uint8_t* d = nullptr;
    CK(cudaMalloc(&d, size_t(bytes)));
    CK(k::cuda::synth_chunk_codes(c.kind, s, c.n, c.begin, c.end, d, nullptr));
    std::vector<uint8_t> got(static_cast<size_t>(bytes));
    CK(cudaMemcpy(got.data(), d, size_t(bytes), cudaMemcpyDeviceToHost));
    CK(cudaFree(d));
    const bool ok = synth_hash(got) == c.hash;
    failures += !ok;
    std::printf("chunk %-34s [%lld, %lld) of %lld: %s\n", c.name.c_str(), (long long)c.begin,
                (long long)c.end, (long long)c.n, ok ? "== numpy" : "DIFFERS");
  }
  for (const auto& c : dsv41rt::testing::kSynthTensorCases) {
    const auto got =
        device_tensor(c.kind, c.seed, c.name, c.rows, c.cols, c.align, c.row_begin, c.row_end);
    const bool ok = synth_hash(got) == c.hash;
    failures += !ok;
    std::printf("tensor %-33s rows [%lld, %lld): %s\n", c.name.c_str(), (long long)c.row_begin,
                (long long)c.row_end, ok ? "== numpy" : "DIFFERS");
  }
  // Odd shapes and shares against the reference (no numpy hash needed: the reference is tested).
  struct Share {
    k::SynthCodes kind;
    int64_t rows, cols, align, rb, re;
  };
  for (const Share s : {Share{k::SynthCodes::kFp8, 5000, 4100, 128, 0, 5000},
                        Share{k::SynthCodes::kFp8, 5000, 4100, 128, 1234, 4321},
                        Share{k::SynthCodes::kFp4, 3, 96, 1, 1, 3},
                        Share{k::SynthCodes::kFp4, 9000, 2048, 1, 4500, 9000}}) {
    const bool ok = device_tensor(s.kind, 11, "share", s.rows, s.cols, s.align, s.rb, s.re) ==
                    host_tensor(s.kind, 11, "share", s.rows, s.cols, s.align, s.rb, s.re);
    failures += !ok;
    std::printf("share [%lld, %lld) x %lld rows [%lld, %lld): %s\n", (long long)s.rows,
                (long long)s.cols, (long long)s.cols, (long long)s.rb, (long long)s.re,
                ok ? "== reference" : "DIFFERS");
  }
  // Rate: 64 experts' w1, w2, w3 (flash-full: 2048 x 4096 FP4 each), then FP8 4096 x 4096 matrices.
  struct Rate {
    const char* what;
    k::SynthCodes kind;
    int64_t rows, cols, align, count;
  };
  for (const Rate r : {Rate{"FP4 expert 2048x4096", k::SynthCodes::kFp4, 2048, 4096, 1, 192},
                       Rate{"FP8 matrix 4096x4096", k::SynthCodes::kFp8, 4096, 4096, 128, 32}}) {
    const int64_t bytes = k::synth_code_bytes(r.kind, r.rows * r.cols);
    uint8_t* d = nullptr;
    CK(cudaMalloc(&d, size_t(bytes * r.count)));
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    for (int rep = 0; rep < 2; ++rep) {  // the first pass warms up
      const auto t0 = std::chrono::steady_clock::now();
      CK(cudaEventRecord(a));
      for (int64_t i = 0; i < r.count; ++i) {
        const std::string name = "layers.0.ffn.experts." + std::to_string(i) + ".w1.weight";
        CK(k::cuda::synth_tensor_codes(r.kind, 0, synth_crc(name), r.rows, r.cols, r.align, 0,
                                       r.rows, d + i * bytes, nullptr));
      }
      CK(cudaEventRecord(b));
      CK(cudaEventSynchronize(b));
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, a, b));
      const double wall =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (rep == 1) {
        std::printf("%s x %lld: %.3f GiB in %.2f ms (%.1f GB/s device, %.2f s wall)\n", r.what,
                    (long long)r.count, double(bytes * r.count) / (1 << 30), ms,
                    double(bytes * r.count) / (ms * 1e6), wall);
      }
    }
    CK(cudaFree(d));
  }
  std::printf("%s\n", failures == 0 ? "ALL EQUAL" : "FAILURES");
  return failures == 0 ? 0 : 1;
}
