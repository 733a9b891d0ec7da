// Contract: synthetic weights, the direct-code bytes `make-checkpoint` writes for a large quantised
// tensor (python/dsv41rt/checkpoint/generator.py _direct_codes), produced without numpy and at any
// position, so each device thread (or each rank, for its shard) generates only its own bytes.
//
// A tensor [rows, cols] is drawn in row chunks of chunk_rows(cols, align) rows (generator.py
// _row_chunks; align is the FP8 scale block's rows, 1 for FP4); chunk c draws from
// np.random.default_rng([seed, crc32(name), c]): SeedSequence -> PCG64. Within a chunk of n codes,
// flattened row-major (python/dsv41rt/checkpoint/direct_stream.py spells out why and is checked
// against numpy byte for byte):
//   uint32 word k of the stream = half (k % 2) of PCG64 output k / 2 (low half first);
//   byte j of a call starting at word w = byte (j % 4) of word w + j / 4 (low byte first);
//   FP8 E4M3 code i = (b & 0x87) | (((e >> 6) + 5) << 3), b = byte i of the call at word 0,
//                     e = byte i of the call at word ceil(n / 4)    (integers(0,256),
//                     integers(5,9))
//   FP4 code i      = byte i of the call at word 0, >> 4             (integers(0, 16))
//   FP4 stored byte = code 2i | code (2i + 1) << 4                   (cols even)
// The scales are one tensor-wide byte (e + 127), written by whoever holds the manifest.
//
// The PCG64 arithmetic below is shared by the CPU reference and the CUDA kernel (host/device).
#pragma once

#include <cstdint>

#include "core/export.h"

#if defined(__CUDACC__)
#define DSV41RT_SYNTH_HD __host__ __device__ __forceinline__
#else
#define DSV41RT_SYNTH_HD inline
#endif

namespace dsv41rt::kernels {

using u128 = unsigned __int128;

inline constexpr int64_t kSynthChunkElements = int64_t{1} << 24;  // generator.py CHUNK_ELEMENTS

enum class SynthCodes { kFp8, kFp4 };

/// A PCG64 before its first output (numpy's `bit_generator.state` after seeding).
struct Pcg64Start {
  uint64_t state_hi = 0, state_lo = 0, inc_hi = 0, inc_lo = 0;
};

DSV41RT_SYNTH_HD u128 pcg64_mult() {
  return (u128{0x2360ed051fc65da4ULL} << 64) | u128{0x4385df649fccf645ULL};
}

/// The state after `delta` steps from `state`, in O(log delta) (PCG's pcg_advance_lcg_128).
DSV41RT_SYNTH_HD u128 pcg64_advance(u128 state, u128 inc, uint64_t delta) {
  u128 acc_mult = 1, acc_plus = 0, cur_mult = pcg64_mult(), cur_plus = inc;
  while (delta > 0) {
    if (delta & 1) {
      acc_mult *= cur_mult;
      acc_plus = acc_plus * cur_mult + cur_plus;
    }
    cur_plus = (cur_mult + 1) * cur_plus;
    cur_mult *= cur_mult;
    delta >>= 1;
  }
  return acc_mult * state + acc_plus;
}

/// XSL-RR output of a state.
DSV41RT_SYNTH_HD uint64_t pcg64_output(u128 state) {
  const uint64_t v = uint64_t(state >> 64) ^ uint64_t(state);
  const unsigned rot = unsigned(state >> 122);
  return (v >> rot) | (v << ((64 - rot) & 63));
}

/// numpy's uint32 stream of a PCG64 read from word k0 on: one jump, then a step per two words.
struct Pcg64Words {
  u128 state, inc;
  uint64_t out, k;
  DSV41RT_SYNTH_HD Pcg64Words(const Pcg64Start& s, uint64_t k0)
      : state(pcg64_advance((u128{s.state_hi} << 64) | s.state_lo,
                            (u128{s.inc_hi} << 64) | s.inc_lo, k0 / 2 + 1)),
        inc((u128{s.inc_hi} << 64) | s.inc_lo),
        out(pcg64_output(state)),
        k(k0) {}
  DSV41RT_SYNTH_HD uint32_t next() {
    const uint32_t w = (k & 1) ? uint32_t(out >> 32) : uint32_t(out);
    if (++k % 2 == 0) {
      state = state * pcg64_mult() + inc;
      out = pcg64_output(state);
    }
    return w;
  }
};

/// Rows per chunk of a [rows, cols] tensor (generator.py _row_chunks); align >= 1.
constexpr int64_t synth_chunk_rows(int64_t cols, int64_t align) {
  const int64_t per = (kSynthChunkElements / (cols > 1 ? cols : 1)) / align * align;
  return per > align ? per : align;
}

/// Bytes that codes [begin, end) of a chunk occupy (FP4: two codes a byte).
constexpr int64_t synth_code_bytes(SynthCodes kind, int64_t codes) {
  return kind == SynthCodes::kFp8 ? codes : codes / 2;
}

/// np.random.default_rng([seed, name_crc, chunk])'s PCG64 (SeedSequence mixing, PCG64 seeding).
DSV41RT_API Pcg64Start pcg64_seed(uint64_t seed, uint32_t name_crc, uint64_t chunk);

/// zlib.crc32 of a tensor name.
DSV41RT_API uint32_t synth_name_crc(const char* name, int64_t len);

}  // namespace dsv41rt::kernels

namespace dsv41rt::kernels::cpu {

/// Codes [begin, end) of a chunk of n codes into out (synth_code_bytes(kind, end - begin) bytes).
/// FP4: begin, end and n even. Throws Error(kInvalidArgument) on a bad range.
DSV41RT_API void synth_chunk_codes(SynthCodes kind, const Pcg64Start& start, int64_t n,
                                   int64_t begin, int64_t end, uint8_t* out);

/// Rows [row_begin, row_end) of the stored codes of a direct-code tensor [rows, cols] (a rank's
/// share, or all of it), as make-checkpoint writes them: FP8 [.., cols] bytes, FP4 [.., cols / 2].
/// align: the FP8 scale block's rows (1 for FP4).
DSV41RT_API void synth_tensor_codes(SynthCodes kind, uint64_t seed, uint32_t name_crc, int64_t rows,
                                    int64_t cols, int64_t align, int64_t row_begin, int64_t row_end,
                                    uint8_t* out);

}  // namespace dsv41rt::kernels::cpu
