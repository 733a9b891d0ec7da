// DeepSeek-V4's 584-byte cache row (kernels/quant.h v4_row_*, RowFormat::kV4Row; spec 5.4):
// the codec against a readable reference written here, its byte layout, corner values, and the
// CPU paged / ring ops and the CPU backend's cache_qdq with the format.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "kernels/paged.h"
#include "kernels/quant.h"
#include "runtime/model/backend.h"

namespace dsv41rt::kernels::cpu {
namespace {

constexpr int64_t kDim = 512, kNope = 448, kRope = 64, kBlock = 64, kBytes = 584;

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// ---- The reference, written from the spec's words and not from quant.cc ----

// Every finite E4M3 magnitude (0 .. 448), ascending; index = code.
std::vector<float> e4m3_levels() {
  std::vector<float> g;
  for (int e = 0; e < 16; ++e) {
    for (int m = 0; m < 8; ++m) {
      if (e == 15 && m == 7) break;  // 0x7F is NaN
      g.push_back(e == 0 ? std::ldexp(float(m) / 8.0f, -6)
                         : std::ldexp(1.0f + float(m) / 8.0f, e - 7));
    }
  }
  return g;
}

// Round |v| (<= 448 after the clamp) to the nearest level, ties to the even code, sign kept.
float e4m3_rne(float v) {
  static const std::vector<float> g = e4m3_levels();
  const float a = std::fabs(v);
  size_t best = 0;
  for (size_t i = 1; i < g.size(); ++i) {
    const float d = std::fabs(g[i] - a), db = std::fabs(g[best] - a);
    if (d < db || (d == db && i % 2 == 0)) best = i;
  }
  return std::copysign(g[best], v);
}

// BF16 round to nearest even, in double: the two neighbours of v and the even one on a tie.
float bf16_rne(float v) {
  if (!std::isfinite(v)) return v;
  if (v == 0.0f) return v;
  int e;
  std::frexp(double(v), &e);                                  // |v| in [2^(e-1), 2^e)
  const double ulp = std::ldexp(1.0, std::max(e - 8, -133));  // 8 significant bits
  const double q = double(v) / ulp, lo = std::floor(q), frac = q - lo;
  double r = lo;
  if (frac > 0.5 || (frac == 0.5 && std::fmod(lo, 2.0) != 0.0)) r = lo + 1.0;
  return float(r * ulp);
}

// One row: per block of 64 nope channels the scale is the smallest power of two >= amax / 448
// (amax floored at 1e-4), values / scale clamped to +-448 and rounded to E4M3; tail to BF16.
std::vector<float> reference_row(const float* x, std::vector<int>* scale_exp = nullptr) {
  std::vector<float> y(kDim);
  for (int64_t k = 0; k < kNope / kBlock; ++k) {
    float amax = 0.0f;
    for (int64_t i = 0; i < kBlock; ++i) amax = std::max(amax, std::fabs(x[k * kBlock + i]));
    const float need = std::max(amax, float(1e-4)) * float(1.0 / 448.0);
    int e = -126;
    while (std::ldexp(1.0f, e) < need) ++e;
    if (scale_exp) scale_exp->push_back(e);
    const float s = std::ldexp(1.0f, e);
    for (int64_t i = 0; i < kBlock; ++i) {
      const float q = std::min(448.0f, std::max(-448.0f, x[k * kBlock + i] / s));
      y[k * kBlock + i] = e4m3_rne(q) * s;
    }
  }
  for (int64_t c = kNope; c < kDim; ++c) y[c] = bf16_rne(x[c]);
  return y;
}

// Rows with per-row magnitudes from 2^-40 to 2^40, exact and negative zeros, a tiny block.
std::vector<float> cache_rows(int64_t rows, unsigned seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> nd;
  std::uniform_int_distribution<int> ed(-40, 40);
  std::vector<float> x(size_t(rows * kDim));
  for (int64_t r = 0; r < rows; ++r) {
    const float mag = std::ldexp(1.0f, ed(g));
    for (int64_t c = 0; c < kDim; ++c) x[r * kDim + c] = nd(g) * mag;
    x[r * kDim + 5] = 0.0f;
    x[r * kDim + 6] = -0.0f;
    x[r * kDim + 470] = -0.0f;
  }
  for (int64_t c = 64; c < 128; ++c) x[c] = 1e-7f * float(c % 5);  // below the amax floor
  return x;
}

TEST(V4Row, SizesAndLayoutConstants) {
  EXPECT_EQ(kV4RowBytes, kBytes);
  EXPECT_EQ(row_bytes(RowFormat::kV4Row, kDim), kBytes);
  EXPECT_EQ(kV4RowNope, kNope);
  EXPECT_EQ(kV4RowDim - kV4RowNope, kRope);
  // Other widths are refused naming the dim (tiny-v4's head_dim 64, V4.1's index dim 128).
  for (int64_t dim : {64, 128, 576}) {
    try {
      row_bytes(RowFormat::kV4Row, dim);
      ADD_FAILURE() << "dim " << dim << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("got dim " + std::to_string(dim)), std::string::npos)
          << e.what();
    }
  }
  std::vector<float> x(64), y(64);
  std::vector<uint8_t> p(600);
  EXPECT_THROW(v4_row_qdq(x.data(), 1, 64, y.data()), Error);
  EXPECT_THROW(v4_row_pack(x.data(), 1, 64, p.data()), Error);
  EXPECT_THROW(v4_row_unpack(p.data(), 1, 64, y.data()), Error);
}

TEST(V4Row, QdqPackAndUnpackMatchTheReferenceBitwise) {
  const unsigned seed = std::random_device{}();
  const int64_t rows = 9;
  const std::vector<float> x = cache_rows(rows, seed);
  std::vector<float> y(x.size(), NAN), z(x.size(), NAN);
  std::vector<uint8_t> p(size_t(rows * kBytes), 0xAB);
  v4_row_qdq(x.data(), rows, kDim, y.data());
  v4_row_pack(x.data(), rows, kDim, p.data());
  v4_row_unpack(p.data(), rows, kDim, z.data());
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<int> exps;
    const std::vector<float> want = reference_row(&x[r * kDim], &exps);
    const uint8_t* row = &p[r * kBytes];
    for (int64_t c = 0; c < kDim; ++c) {
      ASSERT_EQ(bits(y[r * kDim + c]), bits(want[c]))
          << "qdq seed " << seed << " row " << r << " channel " << c << " x=" << x[r * kDim + c];
      ASSERT_EQ(bits(z[r * kDim + c]), bits(want[c])) << "unpack(pack) seed " << seed;
    }
    // Layout: 448 E4M3 codes, 7 UE8M0 scales (biased exponents) + a zero pad, 64 BF16 LE.
    for (int64_t k = 0; k < 7; ++k) EXPECT_EQ(int(row[kNope + k]), exps[size_t(k)] + 127);
    EXPECT_EQ(row[kNope + 7], 0);
    for (int64_t c = 0; c < kNope; ++c) {
      const float s = std::ldexp(1.0f, exps[size_t(c / kBlock)]);
      ASSERT_EQ(bits(fp8_e4m3_to_f32(row[c]) * s), bits(want[c])) << "code of channel " << c;
    }
    for (int64_t c = kNope; c < kDim; ++c) {
      const uint16_t b = uint16_t(row[kNope + 8 + 2 * (c - kNope)] |
                                  (uint16_t(row[kNope + 8 + 2 * (c - kNope) + 1]) << 8));
      ASSERT_EQ(bits(bf16_to_f32(b)), bits(want[c])) << "tail channel " << c;
    }
  }
  // In place.
  std::vector<float> w = x;
  v4_row_qdq(w.data(), rows, kDim, w.data());
  EXPECT_EQ(std::memcmp(w.data(), y.data(), w.size() * 4), 0);
}

TEST(V4Row, HandPickedValues) {
  std::vector<float> x(kDim, 0.0f), y(kDim, NAN);
  x[0] = 448.0f;                            // block scale 1 exactly
  x[1] = -1.1f;                             // E4M3 step 0.125 near 1 -> -1.125
  x[2] = 300.0f;                            // step 32 in [256, 512) -> 288
  x[64] = std::nextafter(448.0f, 1000.0f);  // * f32(1/448) > 1 -> scale 2, saturates to 448 * 2
  x[65] = 3.0f;
  x[128] = 1e-6f;                      // amax floor 1e-4 -> scale 2^-22: 1e-6 / 2^-22 = 4.19 -> 4
  x[448] = 1.0f + 0x1p-8f;             // BF16 tie between 1 and 1 + 2^-7: to even 1
  x[449] = 1.0f + 0x1p-8f + 0x1p-20f;  // above the tie: up
  x[450] = -3.0e38f;                   // BF16 of a huge value stays finite
  v4_row_qdq(x.data(), 1, kDim, y.data());
  EXPECT_EQ(y[0], 448.0f);
  EXPECT_EQ(y[1], -1.125f);
  EXPECT_EQ(y[2], 288.0f);
  EXPECT_EQ(y[64], 448.0f);
  EXPECT_EQ(y[65], 3.0f);  // 3 / 2 = 1.5 exactly
  EXPECT_EQ(y[128], std::ldexp(4.0f, -22));
  for (int64_t c = 192; c < kNope; ++c) EXPECT_EQ(bits(y[c]), 0u) << c;  // zero blocks
  EXPECT_EQ(y[448], 1.0f);
  EXPECT_EQ(y[449], 1.0f + 0x1p-7f);
  EXPECT_EQ(y[450], bf16_to_f32(f32_to_bf16(-3.0e38f)));
  EXPECT_TRUE(std::isfinite(y[450]));
  std::vector<uint8_t> p(kBytes);
  v4_row_pack(x.data(), 1, kDim, p.data());
  EXPECT_EQ(p[0], 0x7E);  // +448
  EXPECT_EQ(p[kNope + 0], 127);
  EXPECT_EQ(p[kNope + 1], 128);
  EXPECT_EQ(p[kNope + 2], 127 - 22);
  EXPECT_EQ(p[kNope + 3], 127 - 22);  // an all-zero block also takes the floor's scale
}

TEST(V4Row, NonFiniteValuesFollowTheFp8CodecsContract) {
  // quant.h: a block holding inf or NaN is stored with scale code 0xFF and decodes to NaN
  // throughout; the BF16 tail keeps NaN as NaN and inf as inf per channel.
  std::vector<float> x = cache_rows(1, 3);
  x[10] = INFINITY;    // block 0
  x[200] = NAN;        // block 3
  x[460] = -INFINITY;  // tail
  x[461] = NAN;        // tail
  std::vector<uint8_t> p(kBytes);
  std::vector<float> z(kDim);
  v4_row_pack(x.data(), 1, kDim, p.data());
  v4_row_unpack(p.data(), 1, kDim, z.data());
  EXPECT_EQ(p[kNope + 0], 0xFF);
  EXPECT_EQ(p[kNope + 3], 0xFF);
  for (int64_t c = 0; c < 64; ++c) EXPECT_TRUE(std::isnan(z[c])) << c;
  for (int64_t c = 192; c < 256; ++c) EXPECT_TRUE(std::isnan(z[c])) << c;
  const std::vector<float> want = reference_row(x.data());
  for (int64_t c = 64; c < 192; ++c) EXPECT_EQ(bits(z[c]), bits(want[c])) << c;  // other blocks
  EXPECT_EQ(z[460], -INFINITY);
  EXPECT_TRUE(std::isnan(z[461]));
  EXPECT_EQ(bits(z[462]), bits(want[462]));
}

TEST(V4Row, PagedAndRingRoundTripsEqualDecodeRowOfThePackedBytes) {
  const unsigned seed = std::random_device{}();
  std::mt19937 g(seed);
  const int64_t n = 10, per_page = 4, max_pages = 3, pages = 7, offset = 40;
  const int64_t page_bytes = offset + per_page * kBytes + 24;
  const std::vector<float> x = cache_rows(n, seed + 1);
  // Two items, pages out of order; entry i of item i % 2 at i / 2.
  std::vector<int32_t> table = {5, 1, 3, 0, 6, 2};
  std::vector<uint8_t> pool(size_t(pages * page_bytes), 0xCD);
  std::vector<int32_t> item(n);
  std::vector<int64_t> entry(n);
  for (int64_t i = 0; i < n; ++i) item[i] = int32_t(i % 2), entry[i] = i / 2;
  item[3] = -1;  // padding: skipped
  const PagedRows pr{pool.data(), page_bytes, table.data(), max_pages, per_page, offset, kBytes};
  pack_paged(RowFormat::kV4Row, pr, kDim, n, x.data(), item.data(), entry.data());
  const std::vector<int64_t> count = {5, 5}, out_offset = {5, 0};
  std::vector<float> out(size_t(10 * kDim), NAN);
  unpack_paged(RowFormat::kV4Row, pr, kDim, 2, 5, count.data(), out_offset.data(), out.data());
  std::vector<float> qdq(x.size());
  v4_row_qdq(x.data(), n, kDim, qdq.data());
  for (int64_t i = 0; i < n; ++i) {
    const int64_t b = i % 2, e = i / 2;
    const uint8_t* row = pool.data() + table[size_t(b * max_pages + e / per_page)] * page_bytes +
                         offset + (e % per_page) * kBytes;
    std::vector<float> dec(kDim);
    decode_row(RowFormat::kV4Row, row, kDim, dec.data());
    const float* got = &out[size_t((out_offset[b] + e) * kDim)];
    ASSERT_EQ(std::memcmp(got, dec.data(), kDim * 4), 0) << "paged entry " << i;
    if (item[i] >= 0) {
      ASSERT_EQ(std::memcmp(got, &qdq[i * kDim], kDim * 4), 0) << "paged entry " << i << " qdq";
    }
  }
  // Ring: 3 slots' rings of 4 rows; positions 0..9 of item 0 keep the last 4.
  const int64_t ring = 4, slot_bytes = 16 + ring * kBytes;
  std::vector<uint8_t> slots_mem(size_t(2 * slot_bytes), 0xEE);
  uint8_t* slots[2] = {slots_mem.data() + slot_bytes, slots_mem.data()};
  const RingRows rr{slots, 16, ring, kBytes};
  std::vector<int32_t> ritem(n, 0);
  std::vector<int64_t> pos(n);
  std::vector<uint8_t> store(n, 1);
  for (int64_t i = 0; i < n; ++i) pos[i] = i;
  store[8] = 0;  // position 8 not stored: its ring row keeps position 4's bytes
  pack_ring(RowFormat::kV4Row, rr, kDim, n, x.data(), ritem.data(), pos.data(), store.data());
  const std::vector<int64_t> first = {6}, rcount = {4}, roff = {0};
  std::vector<float> rout(size_t(4 * kDim), NAN);
  unpack_ring(RowFormat::kV4Row, rr, kDim, 1, 4, first.data(), rcount.data(), roff.data(),
              rout.data());
  for (int64_t p = 6; p < 10; ++p) {
    std::vector<float> dec(kDim);
    decode_row(RowFormat::kV4Row, slots[0] + 16 + (p % ring) * kBytes, kDim, dec.data());
    ASSERT_EQ(std::memcmp(&rout[(p - 6) * kDim], dec.data(), kDim * 4), 0) << "ring " << p;
    const int64_t src = p == 8 ? 4 : p;
    ASSERT_EQ(std::memcmp(&rout[(p - 6) * kDim], &qdq[src * kDim], kDim * 4), 0) << "ring " << p;
  }
  EXPECT_EQ(slots_mem[size_t(slot_bytes - 1)], 0xEE);  // item 1's slot untouched
  EXPECT_THROW(pack_paged(RowFormat::kV4Row, pr, 64, 1, x.data(), item.data(), entry.data()),
               Error);
}

TEST(V4Row, CpuBackendCacheQdqIsTheCodec) {
  auto be = model::make_cpu_backend();
  std::vector<float> x = cache_rows(3, 11), want(x.size());
  v4_row_qdq(x.data(), 3, kDim, want.data());
  be->cache_qdq(RowFormat::kV4Row, x.data(), 3, kDim, be->stream(0));
  EXPECT_EQ(std::memcmp(x.data(), want.data(), x.size() * 4), 0);
}

}  // namespace
}  // namespace dsv41rt::kernels::cpu
