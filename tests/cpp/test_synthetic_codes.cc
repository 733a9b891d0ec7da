// Synthetic weight codes, CPU reference (kernels/synthetic_codes.h) == numpy's bytes as
// make-checkpoint draws them (hashes from tests/python/synthetic_codes_golden.py).
#include <gtest/gtest.h>

#include <vector>

#include "core/status.h"
#include "kernels/synthetic_codes.h"
#include "synthetic_codes_cases.h"

namespace dsv41rt::testing {
namespace {

TEST(SyntheticCodes, NameCrcIsZlibs) {
  EXPECT_EQ(synth_crc(""), 0u);
  EXPECT_EQ(synth_crc("a.weight"), 0x50eec96fu);  // zlib.crc32(b"a.weight")
}

TEST(SyntheticCodes, SeedIsNumpys) {
  // np.random.PCG64(np.random.SeedSequence([3, 7, 2])).state
  const kernels::Pcg64Start s = kernels::pcg64_seed(3, 7, 2);
  const kernels::u128 state = (kernels::u128{s.state_hi} << 64) | s.state_lo;
  const kernels::u128 inc = (kernels::u128{s.inc_hi} << 64) | s.inc_lo;
  EXPECT_EQ(uint64_t(state >> 64), 0x4e9ca800fb44ce39ULL);
  EXPECT_EQ(uint64_t(state), 0x3c9b559c1641a148ULL);
  EXPECT_EQ(uint64_t(inc >> 64), 0x7888ed9446a84ea7ULL);
  EXPECT_EQ(uint64_t(inc), 0x90e5a122974cda73ULL);
}

TEST(SyntheticCodes, ChunksEqualNumpy) {
  for (const SynthChunkCase& c : kSynthChunkCases) {
    SCOPED_TRACE(c.name + " chunk " + std::to_string(c.chunk) + " [" + std::to_string(c.begin) +
                 ", " + std::to_string(c.end) + ") of " + std::to_string(c.n));
    std::vector<uint8_t> out(size_t(kernels::synth_code_bytes(c.kind, c.end - c.begin)));
    kernels::cpu::synth_chunk_codes(c.kind, kernels::pcg64_seed(c.seed, synth_crc(c.name), c.chunk),
                                    c.n, c.begin, c.end, out.data());
    EXPECT_EQ(synth_hash(out), c.hash);
  }
}

TEST(SyntheticCodes, TensorSharesEqualNumpy) {
  for (const SynthTensorCase& c : kSynthTensorCases) {
    SCOPED_TRACE(c.name + " rows [" + std::to_string(c.row_begin) + ", " +
                 std::to_string(c.row_end) + ")");
    std::vector<uint8_t> out(
        size_t(kernels::synth_code_bytes(c.kind, (c.row_end - c.row_begin) * c.cols)));
    kernels::cpu::synth_tensor_codes(c.kind, c.seed, synth_crc(c.name), c.rows, c.cols, c.align,
                                     c.row_begin, c.row_end, out.data());
    EXPECT_EQ(synth_hash(out), c.hash);
  }
}

TEST(SyntheticCodes, SplitRangesConcatenate) {
  // Any split of a chunk gives the same bytes: what lets threads and ranks generate apart.
  const kernels::Pcg64Start s = kernels::pcg64_seed(1, 2, 3);
  for (const SynthCodes kind : {SynthCodes::kFp8, SynthCodes::kFp4}) {
    const int64_t n = 1030;
    std::vector<uint8_t> whole(size_t(kernels::synth_code_bytes(kind, n)));
    kernels::cpu::synth_chunk_codes(kind, s, n, 0, n, whole.data());
    for (const int64_t cut : {int64_t{2}, int64_t{6}, int64_t{512}, int64_t{1028}}) {
      std::vector<uint8_t> parts(whole.size());
      kernels::cpu::synth_chunk_codes(kind, s, n, 0, cut, parts.data());
      kernels::cpu::synth_chunk_codes(kind, s, n, cut, n,
                                      parts.data() + kernels::synth_code_bytes(kind, cut));
      EXPECT_EQ(parts, whole) << "cut at " << cut;
    }
  }
}

TEST(SyntheticCodes, BadRangesThrow) {
  const kernels::Pcg64Start s = kernels::pcg64_seed(0, 0, 0);
  uint8_t out[8];
  EXPECT_THROW(kernels::cpu::synth_chunk_codes(SynthCodes::kFp8, s, 4, 2, 5, out), Error);
  EXPECT_THROW(kernels::cpu::synth_chunk_codes(SynthCodes::kFp4, s, 8, 1, 5, out), Error);
  EXPECT_THROW(kernels::cpu::synth_tensor_codes(SynthCodes::kFp8, 0, 0, 4, 4, 1, 3, 5, out), Error);
}

}  // namespace
}  // namespace dsv41rt::testing
