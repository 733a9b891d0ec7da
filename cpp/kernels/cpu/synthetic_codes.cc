// CPU reference of synthetic weights (contract: kernels/synthetic_codes.h): numpy's SeedSequence
// and PCG64 seeding, then the code bytes read sequentially from one jump.
#include "kernels/synthetic_codes.h"

#include <algorithm>
#include <vector>

#include "core/status.h"

namespace dsv41rt::kernels {
namespace {

constexpr uint32_t kInitA = 0x43b0d7e5, kMultA = 0x931e8875;
constexpr uint32_t kInitB = 0x8b51f9dd, kMultB = 0x58f38ded;
constexpr uint32_t kMixL = 0xca01f9dd, kMixR = 0x4973f715;
constexpr int kPool = 4;

// numpy's _coerce_to_uint32_array of one integer: little-endian 32-bit words, 0 -> [0].
void append_words(uint64_t v, std::vector<uint32_t>& out) {
  do {
    out.push_back(uint32_t(v));
    v >>= 32;
  } while (v != 0);
}

}  // namespace

Pcg64Start pcg64_seed(uint64_t seed, uint32_t name_crc, uint64_t chunk) {
  std::vector<uint32_t> ent;
  append_words(seed, ent);
  append_words(name_crc, ent);
  append_words(chunk, ent);
  uint32_t hc = kInitA;
  const auto hashmix = [&hc](uint32_t v) {
    v ^= hc;
    hc *= kMultA;
    v *= hc;
    return v ^ (v >> 16);
  };
  const auto mix = [](uint32_t x, uint32_t y) {
    const uint32_t r = kMixL * x - kMixR * y;
    return r ^ (r >> 16);
  };
  uint32_t pool[kPool];
  for (int i = 0; i < kPool; ++i) pool[i] = hashmix(i < int(ent.size()) ? ent[size_t(i)] : 0);
  for (int s = 0; s < kPool; ++s) {
    for (int d = 0; d < kPool; ++d) {
      if (s != d) pool[d] = mix(pool[d], hashmix(pool[s]));
    }
  }
  for (size_t s = kPool; s < ent.size(); ++s) {
    for (int d = 0; d < kPool; ++d) pool[d] = mix(pool[d], hashmix(ent[s]));
  }
  // generate_state(4, uint64): 8 words, read pairwise as little-endian uint64.
  uint32_t hb = kInitB, w32[8];
  for (int i = 0; i < 8; ++i) {
    uint32_t v = pool[i % kPool] ^ hb;
    hb *= kMultB;
    v *= hb;
    w32[i] = v ^ (v >> 16);
  }
  uint64_t w[4];
  for (int i = 0; i < 4; ++i) w[i] = uint64_t(w32[2 * i]) | (uint64_t(w32[2 * i + 1]) << 32);
  // pcg_setseq_128_srandom_r: inc = initseq << 1 | 1; state = 0; step; += initstate; step.
  const u128 initstate = (u128{w[0]} << 64) | w[1], initseq = (u128{w[2]} << 64) | w[3];
  const u128 inc = (initseq << 1) | 1;
  u128 state = inc;  // 0 * mult + inc
  state += initstate;
  state = state * pcg64_mult() + inc;
  return Pcg64Start{uint64_t(state >> 64), uint64_t(state), uint64_t(inc >> 64), uint64_t(inc)};
}

uint32_t synth_name_crc(const char* name, int64_t len) {
  uint32_t crc = 0xFFFFFFFFu;
  for (int64_t i = 0; i < len; ++i) {
    crc ^= uint8_t(name[i]);
    for (int b = 0; b < 8; ++b) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1)));
  }
  return ~crc;
}

}  // namespace dsv41rt::kernels

namespace dsv41rt::kernels::cpu {
namespace {

// Codes per thread task (even, so FP4 pieces start on a code pair).
constexpr int64_t kPieceCodes = int64_t{1} << 20;

}  // namespace

void synth_chunk_codes(SynthCodes kind, const Pcg64Start& start, int64_t n, int64_t begin,
                       int64_t end, uint8_t* out) {
  DSV41RT_CHECK_CODE(kInvalidArgument, 0 <= begin && begin <= end && end <= n,
                     "synthetic codes: range [", begin, ", ", end, ") outside a chunk of ", n);
  DSV41RT_CHECK_CODE(
      kInvalidArgument, kind == SynthCodes::kFp8 || (begin % 2 == 0 && end % 2 == 0 && n % 2 == 0),
      "synthetic codes: FP4 codes pack in pairs, got range [", begin, ", ", end, ") of ", n);
  if (begin == end) return;
  // The byte of code i is byte i % 4 of word i / 4: start at begin's word, skip its lower bytes.
  const auto byte_stream = [&](uint64_t first_word) {
    return [w = Pcg64Words(start, first_word + uint64_t(begin) / 4), word = uint32_t(0), left = 0,
            skip = int(begin % 4)]() mutable {
      for (;;) {
        if (left == 0) word = w.next(), left = 4;
        const uint8_t b = uint8_t(word);
        word >>= 8, --left;
        if (skip == 0) return b;
        --skip;
      }
    };
  };
  auto bits = byte_stream(0);
  if (kind == SynthCodes::kFp8) {
    auto exps = byte_stream(uint64_t(n + 3) / 4);
    for (int64_t i = begin; i < end; ++i) {
      const uint8_t b = bits(), e = exps();
      out[i - begin] = uint8_t((b & 0x87) | (((e >> 6) + 5) << 3));
    }
    return;
  }
  for (int64_t i = begin; i < end; i += 2) {
    const uint8_t lo = bits() >> 4, hi = bits() >> 4;
    out[(i - begin) / 2] = uint8_t(lo | (hi << 4));
  }
}

void synth_tensor_codes(SynthCodes kind, uint64_t seed, uint32_t name_crc, int64_t rows,
                        int64_t cols, int64_t align, int64_t row_begin, int64_t row_end,
                        uint8_t* out) {
  DSV41RT_CHECK_CODE(kInvalidArgument, rows >= 0 && cols >= 1 && align >= 1,
                     "synthetic codes: bad tensor [", rows, ", ", cols, "] align ", align);
  DSV41RT_CHECK_CODE(kInvalidArgument, 0 <= row_begin && row_begin <= row_end && row_end <= rows,
                     "synthetic codes: rows [", row_begin, ", ", row_end, ") outside ", rows);
  const int64_t step = synth_chunk_rows(cols, align);
  for (int64_t c = row_begin / step; c * step < row_end; ++c) {
    const int64_t cs = c * step, ce = std::min(rows, cs + step);
    const int64_t lo = std::max(row_begin, cs), hi = std::min(row_end, ce);
    const Pcg64Start start = pcg64_seed(seed, name_crc, uint64_t(c));
    // Pieces of a chunk are independent (one jump each), so threads split it.
    const int64_t begin = (lo - cs) * cols, end = (hi - cs) * cols;
    const int64_t pieces = (end - begin + kPieceCodes - 1) / kPieceCodes;
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < pieces; ++p) {
      const int64_t b = begin + p * kPieceCodes, e = std::min(end, b + kPieceCodes);
      synth_chunk_codes(kind, start, (ce - cs) * cols, b, e,
                        out + synth_code_bytes(kind, b - begin));
    }
    out += synth_code_bytes(kind, end - begin);
  }
}

}  // namespace dsv41rt::kernels::cpu
