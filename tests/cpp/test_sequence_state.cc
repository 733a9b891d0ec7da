// The sequence-state blob (runtime/sequence_state.h): a round trip keeps every byte, and every
// kind of bad blob is refused with an error naming what is wrong. End to end (export from one
// runtime, import into another, decoding continues bitwise): tests/python/test_sequence_state.py.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "core/status.h"
#include "runtime/sequence_state.h"

namespace dsv41rt {
namespace {

const model::PoolGeometry kGeometry{64, 96, 200};  // page tokens, page bytes, slot bytes

std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = uint8_t(seed + 31 * i);
  return v;
}

std::string refusal(const std::vector<uint8_t>& blob, const model::PoolGeometry& g = kGeometry,
                    uint64_t fingerprint = 7) {
  try {
    decode_sequence_state(blob.data(), blob.size(), g, fingerprint);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(SequenceState, RoundTripKeepsEveryByte) {
  for (const int64_t length : {0, 1, 64, 65, 300}) {
    const int64_t n_pages = (length + 63) / 64;
    const auto slot = pattern(200, 1), pages = pattern(size_t(n_pages * 96), 2);
    const auto blob = encode_sequence_state(kGeometry, 7, length, slot, pages);
    const SequenceStateView v = decode_sequence_state(blob.data(), blob.size(), kGeometry, 7);
    EXPECT_EQ(v.header.length, length);
    EXPECT_EQ(v.header.n_pages, n_pages);
    // std::equal, not memcmp: `pages` is empty (null data()) for length 0
    EXPECT_TRUE(std::equal(slot.begin(), slot.end(), v.slot));
    EXPECT_TRUE(std::equal(pages.begin(), pages.end(), v.pages));
  }
}

TEST(SequenceState, BadBlobsAreNamed) {
  const auto blob = encode_sequence_state(kGeometry, 7, 100, pattern(200, 1), pattern(192, 2));
  EXPECT_NE(refusal({blob.begin(), blob.begin() + 8}).find("shorter than its header"),
            std::string::npos);
  EXPECT_NE(refusal({blob.begin(), blob.end() - 1}).find("truncated or padded"), std::string::npos);
  for (const size_t at : {size_t(70), blob.size() - 1}) {  // header field, payload byte
    auto bad = blob;
    bad[at] ^= 0x40;
    const std::string why = refusal(bad);
    EXPECT_TRUE(why.find("checksum mismatch") != std::string::npos ||
                why.find("describes") != std::string::npos)
        << why;
  }
  auto magic = blob;
  magic[0] = 'X';
  EXPECT_NE(refusal(magic).find("bad magic"), std::string::npos);
  EXPECT_NE(refusal(blob, kGeometry, 8).find("from another model"), std::string::npos);
  EXPECT_NE(refusal(blob, {128, 96, 200}).find("pool layout differs"), std::string::npos);
  EXPECT_NE(refusal(blob, {64, 96, 208}).find("pool layout differs"), std::string::npos);
  EXPECT_EQ(refusal(blob), "");
}

TEST(SequenceState, EncodeChecksItsInputs) {
  EXPECT_THROW(encode_sequence_state(kGeometry, 7, 10, pattern(199, 1), pattern(96, 2)), Error);
  EXPECT_THROW(encode_sequence_state(kGeometry, 7, 10, pattern(200, 1), pattern(95, 2)), Error);
}

}  // namespace
}  // namespace dsv41rt
