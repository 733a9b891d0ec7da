// Cases of the synthetic-code tests (test_synthetic_codes.cc, test_cuda_synthetic_codes.cc): the
// hashes are numpy's bytes, printed by tests/python/synthetic_codes_golden.py (numpy 2.4.6).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/synthetic_codes.h"

namespace dsv41rt::testing {

/// codes [begin, end) of chunk `chunk` (n codes) of tensor `name`.
struct SynthChunkCase {
  kernels::SynthCodes kind;
  uint64_t seed;
  std::string name;
  uint64_t chunk;
  int64_t n, begin, end;
  uint64_t hash;
};

/// rows [row_begin, row_end) of a [rows, cols] tensor (several chunks).
struct SynthTensorCase {
  kernels::SynthCodes kind;
  uint64_t seed;
  std::string name;
  int64_t rows, cols, align, row_begin, row_end;
  uint64_t hash;
};

using kernels::SynthCodes;

// Odd n (a call's leftover bytes dropped; the exponent call starting on a high half), partial
// ranges starting mid-word, a seed of two uint32 words.
inline const std::vector<SynthChunkCase> kSynthChunkCases = {
    {SynthCodes::kFp8, 0ULL, "a.weight", 0, 13, 0, 13, 0xf9fd813e9be7b30eULL},
    {SynthCodes::kFp8, 7ULL, "layers.1.attn.wq_b.weight", 2, 1027, 5, 1023, 0x2e5e3b5413b06091ULL},
    {SynthCodes::kFp8, 4294967299ULL, "x", 1, 4096, 1000, 4096, 0xb567f2ca7562b4b9ULL},
    {SynthCodes::kFp4, 0ULL, "layers.0.ffn.experts.3.w1.weight", 0, 1026, 0, 1026,
     0xe72a8573f328ea60ULL},
    {SynthCodes::kFp4, 5ULL, "y", 4, 998, 6, 994, 0xe6689730f76ea018ULL},
};

// Tensors of 2 and 3 chunks (chunks of 2^24 codes, FP8 chunk rows a multiple of 128); a share of
// rows starting mid-tensor and one inside the last chunk.
inline const std::vector<SynthTensorCase> kSynthTensorCases = {
    {SynthCodes::kFp4, 3ULL, "layers.2.ffn.experts.7.w2.weight", 4100, 8192, 1, 1000, 4100,
     0x0b3e2c975e5cb5cdULL},
    {SynthCodes::kFp8, 9ULL, "layers.0.attn.wq_b.weight", 2560, 7168, 128, 0, 2560,
     0x40854d2c7c21b32eULL},
    {SynthCodes::kFp8, 9ULL, "layers.0.attn.wq_b.weight", 2560, 7168, 128, 2304, 2432,
     0xb0b01f1cc258975aULL},
};

/// sum of byte_i * P^(i+1) mod 2^64 (P the FNV prime): what the golden script prints.
inline uint64_t synth_hash(const std::vector<uint8_t>& bytes) {
  uint64_t h = 0, p = 1;
  for (const uint8_t b : bytes) {
    p *= 0x100000001b3ULL;
    h += uint64_t(b) * p;
  }
  return h;
}

inline uint32_t synth_crc(const std::string& name) {
  return kernels::synth_name_crc(name.data(), int64_t(name.size()));
}

}  // namespace dsv41rt::testing
