// Backend paged-row ops (contract: kernels/paged.h; layout: runtime/model/state_layout.h): pack and
// unpack of token pages and window rings (the slot-side ops: test_backend_paged_state.cc). Release
// widths: FP8 window rows of head_dim 512 in a ring of 128, NVFP4 compressed KV
// of 512, MXFP4 index keys of 128, and the FP32 store of cache_quant = false.
//
// Reference and bound, both instances: BITWISE. The stored bytes are the row codecs of
// kernels/quant.h (kernels::cpu::*_pack) at the addresses the contract computes from the page
// table / ring (written out independently here, over poisoned memory, so bytes nobody may write
// must keep the poison); decoded rows are the codecs' decode, i.e. unpack(pack(x)) == cache_qdq(x).
// The CUDA header (kernels/cuda/paged.cuh) promises the same bits as the CPU reference.
#include <algorithm>
#include <numeric>

#include "backend_test_util.h"
#include "cache_row_util.h"
#include "core/status.h"
#include "kernels/paged.h"
#include "kernels/quant.h"

namespace dsv41rt::testing {
namespace {

using kernels::PagedRows;
using kernels::RingRows;
using kernels::RowFormat;

struct FormatCase {
  RowFormat format;
  int64_t dim;
  const char* name;
};
constexpr FormatCase kReleaseFormats[] = {
    {RowFormat::kFp8Window, 512, "fp8 window rows, head_dim 512"},
    {RowFormat::kNvfp4, 512, "nvfp4 compressed KV, head_dim 512"},
    {RowFormat::kMxfp4, 128, "mxfp4 index keys, index_head_dim 128"},
    {RowFormat::kF32, 512, "fp32 rows (cache_quant off), head_dim 512"},
};

// Token pages as the runtime lays them out: the kind under test sits at `offset` in each page
// between other kinds' rows (which stay poison); item b's entry e lives in physical page
// table[b, e / per_page]. The table is a random choice of distinct pages in random order, so it
// is neither the identity nor monotone, and a few pages belong to nobody.
struct PageLayout {
  int64_t items = 0, max_pages = 0, per_page = 0, offset = 0, row_bytes = 0, page_bytes = 0;
  int64_t n_pages = 0;
  std::vector<int32_t> table;
  int64_t address(int64_t item, int64_t entry) const {
    return int64_t(table[item * max_pages + entry / per_page]) * page_bytes + offset +
           (entry % per_page) * row_bytes;
  }
  PagedRows rows(uint8_t* pool, const int32_t* device_table) const {
    return {pool, page_bytes, device_table, max_pages, per_page, offset, row_bytes};
  }
};

class BackendPaged : public BackendTest {
 protected:
  // Cache values as the model produces them, with the codecs' corner cases: per-row magnitudes
  // from 2^-40 to 2^40, exact and negative zeros, a row below every amax floor.
  std::vector<float> cache_rows(int64_t rows, int64_t dim) {
    std::vector<float> x = normal(rows * dim);
    for (int64_t r = 0; r < rows; ++r) {
      const float scale = std::ldexp(1.0f, int(randint(-40, 40)));
      for (int64_t c = 0; c < dim; ++c) {
        float& v = x[r * dim + c];
        v *= scale;
        const int64_t pick = randint(0, 99);
        if (pick < 4) v = 0.0f;
        if (pick == 4) v = -0.0f;
      }
    }
    for (int64_t c = 0; c < dim; ++c) x[c] *= 1e-30f;
    return x;
  }

  PageLayout page_layout(int64_t items, int64_t max_pages, int64_t per_page, int64_t row_bytes) {
    PageLayout L;
    L.items = items, L.max_pages = max_pages, L.per_page = per_page, L.row_bytes = row_bytes;
    L.offset = 16 * randint(1, 8);  // 16-byte aligned: FP32 rows are read as floats
    L.page_bytes = (L.offset + per_page * row_bytes + 16 * randint(1, 4) + 15) / 16 * 16;
    L.n_pages = items * max_pages + 3;
    const std::vector<int64_t> perm = permutation(L.n_pages);
    for (int64_t i = 0; i < items * max_pages; ++i) L.table.push_back(int32_t(perm[i]));
    if (std::is_sorted(L.table.begin(), L.table.end()))
      std::reverse(L.table.begin(), L.table.end());
    return L;
  }

  // Output offsets for `counts`: the items' rows in reverse item order with one gap row after
  // each (gaps must keep their poison). Returns the total number of output rows.
  int64_t reversed_offsets(const std::vector<int64_t>& counts, std::vector<int64_t>& offsets) {
    offsets.assign(counts.size(), 0);
    int64_t next = 0;
    for (int64_t b = int64_t(counts.size()) - 1; b >= 0; --b)
      offsets[b] = next, next += counts[b] + 1;
    return next;
  }
};

TEST_P(BackendPaged, PackPagedThenUnpackPagedIsCacheQdq) {
  Backend& be = backend();
  for (const FormatCase& fc : kReleaseFormats) {
    SCOPED_TRACE(fc.name);
    const int64_t dim = fc.dim, rb = kernels::row_bytes(fc.format, dim);
    const PageLayout L = page_layout(/*items=*/3, /*max_pages=*/3, /*per_page=*/16, rb);
    // Item 0 fills all its pages, the others stop inside a page.
    const std::vector<int64_t> count = {48, randint(17, 47), randint(1, 16)};
    std::vector<int32_t> item;
    std::vector<int64_t> entry;
    for (int64_t b = 0; b < L.items; ++b) {
      for (int64_t e = 0; e < count[b]; ++e) item.push_back(int32_t(b)), entry.push_back(e);
    }
    for (int pad = 0; pad < 5; ++pad) item.push_back(-1), entry.push_back(randint(0, 47));
    const std::vector<int64_t> order = permutation(int64_t(item.size()));  // rows in any order
    std::vector<int32_t> item_rows;
    std::vector<int64_t> entry_rows;
    for (int64_t i : order) item_rows.push_back(item[i]), entry_rows.push_back(entry[i]);
    const int64_t n = int64_t(item_rows.size());
    const std::vector<float> x = cache_rows(n, dim);

    Buffer<uint8_t> pool = poisoned<uint8_t>(be, L.n_pages * L.page_bytes);
    Buffer<int32_t> table = upload(be, L.table);
    Buffer<float> rows = upload(be, x);
    Buffer<int32_t> d_item = upload(be, item_rows);
    Buffer<int64_t> d_entry = upload(be, entry_rows);
    be.pack_paged(fc.format, L.rows(pool.get(), table.get()), dim, n, rows.get(), d_item.get(),
                  d_entry.get(), be.stream(0));

    std::vector<uint8_t> image(size_t(L.n_pages * L.page_bytes), kPoison);
    for (int64_t i = 0; i < n; ++i) {
      if (item_rows[i] >= 0) {
        encode_row(fc.format, &x[i * dim], dim, &image[L.address(item_rows[i], entry_rows[i])]);
      }
    }
    EXPECT_TRUE(bitwise_equal(pool.download(), image)) << "pool bytes after pack_paged";

    // unpack(pack(x)) == cache_qdq(x), with the backend's own cache_qdq and the codec's QDQ.
    Buffer<float> qdq = upload(be, x);
    be.cache_qdq(fc.format, qdq.get(), n, dim, be.stream(0));
    const std::vector<float> qdq_x = qdq.download();
    EXPECT_TRUE(bitwise_equal(qdq_x, host_qdq(fc.format, x, dim))) << "cache_qdq";

    std::vector<int64_t> out_offset;
    const int64_t out_rows = reversed_offsets(count, out_offset);
    Buffer<float> out = poisoned<float>(be, out_rows * dim);
    Buffer<int64_t> d_count = upload(be, count), d_off = upload(be, out_offset);
    be.unpack_paged(fc.format, L.rows(pool.get(), table.get()), dim, L.items, /*max_count=*/48,
                    d_count.get(), d_off.get(), out.get(), be.stream(0));
    std::vector<float> want(size_t(out_rows * dim), poison_float());
    for (int64_t i = 0; i < n; ++i) {
      if (item_rows[i] < 0) continue;
      std::copy_n(&qdq_x[i * dim], dim, &want[(out_offset[item_rows[i]] + entry_rows[i]) * dim]);
    }
    EXPECT_TRUE(bitwise_equal(out.download(), want)) << "unpack_paged(pack_paged(x))";
  }
}

TEST_P(BackendPaged, PackRingThenUnpackRingWrapsAroundTheRing) {
  Backend& be = backend();
  constexpr int64_t kRing = 128;  // the release sliding window
  for (const FormatCase& fc : kReleaseFormats) {
    SCOPED_TRACE(fc.name);
    const int64_t dim = fc.dim, rb = kernels::row_bytes(fc.format, dim), items = 3;
    const int64_t ring_offset = 16 * randint(1, 8);
    const int64_t slot_bytes = (ring_offset + kRing * rb + 64 + 15) / 16 * 16;
    // Slots in one allocation, item b's at a random place (not in item order).
    const std::vector<int64_t> slot_of = permutation(items + 1);
    // Item b writes positions first[b] .. first[b] + len[b] - 1: past the ring length, so the
    // rows wrap; one run covers the whole ring. store = 0 rows and padding rows write nothing.
    std::vector<int64_t> first(items), len = {kRing, randint(40, 100), randint(1, 30)};
    std::vector<int32_t> item;
    std::vector<int64_t> pos;
    std::vector<uint8_t> store;
    for (int64_t b = 0; b < items; ++b) {
      first[b] = randint(kRing, 20 * kRing);
      for (int64_t j = 0; j < len[b]; ++j) {
        item.push_back(int32_t(b)), pos.push_back(first[b] + j);
        store.push_back(randint(0, 3) != 0);
      }
    }
    for (int pad = 0; pad < 4; ++pad)
      item.push_back(-1), pos.push_back(randint(0, 999)), store.push_back(1);
    const int64_t n = int64_t(item.size());
    const std::vector<float> x = cache_rows(n, dim);

    Buffer<uint8_t> slots_mem = poisoned<uint8_t>(be, (items + 1) * slot_bytes);
    std::vector<uint8_t*> slot_ptr;
    for (int64_t b = 0; b < items; ++b)
      slot_ptr.push_back(slots_mem.get() + slot_of[b] * slot_bytes);
    Buffer<uint8_t*> slots = upload(be, slot_ptr);
    const RingRows ring{slots.get(), ring_offset, kRing, rb};
    Buffer<float> rows = upload(be, x);
    Buffer<int32_t> d_item = upload(be, item);
    Buffer<int64_t> d_pos = upload(be, pos);
    Buffer<uint8_t> d_store = upload(be, store);
    be.pack_ring(fc.format, ring, dim, n, rows.get(), d_item.get(), d_pos.get(), d_store.get(),
                 be.stream(0));

    std::vector<uint8_t> image(size_t((items + 1) * slot_bytes), kPoison);
    auto ring_address = [&](int64_t b, int64_t p) {
      return slot_of[b] * slot_bytes + ring_offset + (p % kRing) * rb;
    };
    for (int64_t i = 0; i < n; ++i) {
      if (item[i] >= 0 && store[i])
        encode_row(fc.format, &x[i * dim], dim, &image[ring_address(item[i], pos[i])]);
    }
    EXPECT_TRUE(bitwise_equal(slots_mem.download(), image)) << "slot bytes after pack_ring";

    // Read every item's run back: stored rows are cache_qdq(x), unstored ones decode the poison.
    std::vector<int64_t> out_offset;
    const int64_t out_rows = reversed_offsets(len, out_offset);
    Buffer<float> out = poisoned<float>(be, out_rows * dim);
    Buffer<int64_t> d_first = upload(be, first), d_count = upload(be, len),
                    d_off = upload(be, out_offset);
    be.unpack_ring(fc.format, ring, dim, items, /*max_count=*/kRing, d_first.get(), d_count.get(),
                   d_off.get(), out.get(), be.stream(0));
    const std::vector<float> qdq_x = host_qdq(fc.format, x, dim);
    std::vector<float> want(size_t(out_rows * dim), poison_float());
    for (int64_t i = 0; i < n; ++i) {
      if (item[i] < 0) continue;
      float* dst = &want[(out_offset[item[i]] + pos[i] - first[item[i]]) * dim];
      if (store[i]) {
        std::copy_n(&qdq_x[i * dim], dim, dst);
      } else {
        decode_row(fc.format, &image[ring_address(item[i], pos[i])], dim, dst);
      }
    }
    EXPECT_TRUE(nan_aware_equal(out.download(), want)) << "unpack_ring(pack_ring(x))";
  }
}

TEST_P(BackendPaged, UnpackDecodesEveryByteLikeTheCodec) {
  // Random bytes reach every element and scale code, NaN codes included (the bound: the codec's
  // decode, NaN payloads aside).
  Backend& be = backend();
  for (const FormatCase& fc : kReleaseFormats) {
    SCOPED_TRACE(fc.name);
    const int64_t dim = fc.dim, rb = kernels::row_bytes(fc.format, dim);
    const PageLayout L = page_layout(2, 2, 8, rb);
    const std::vector<uint8_t> bytes = random_bytes(L.n_pages * L.page_bytes);
    Buffer<uint8_t> pool = upload(be, bytes);
    Buffer<int32_t> table = upload(be, L.table);
    const std::vector<int64_t> count = {16, randint(1, 15)};
    std::vector<int64_t> out_offset;
    const int64_t out_rows = reversed_offsets(count, out_offset);
    Buffer<float> out = poisoned<float>(be, out_rows * dim);
    Buffer<int64_t> d_count = upload(be, count), d_off = upload(be, out_offset);
    be.unpack_paged(fc.format, L.rows(pool.get(), table.get()), dim, L.items, 16, d_count.get(),
                    d_off.get(), out.get(), be.stream(0));
    std::vector<float> want(size_t(out_rows * dim), poison_float());
    for (int64_t b = 0; b < L.items; ++b) {
      for (int64_t e = 0; e < count[b]; ++e) {
        decode_row(fc.format, &bytes[L.address(b, e)], dim, &want[(out_offset[b] + e) * dim]);
      }
    }
    EXPECT_TRUE(nan_aware_equal(out.download(), want));
  }
}

TEST_P(BackendPaged, PackedNonFiniteBlocksDecodeAsTheContractSays) {
  // kernels/quant.h: nvfp4 keeps unpack(pack(x)) == qdq(x) with inf/NaN too; an fp8/mxfp4 block
  // holding inf or NaN is stored with scale code 0xFF and decodes to NaN throughout.
  Backend& be = backend();
  for (const FormatCase& fc : kReleaseFormats) {
    SCOPED_TRACE(fc.name);
    const int64_t dim = fc.dim, rb = kernels::row_bytes(fc.format, dim), n = 24;
    const int64_t block = fc.format == RowFormat::kNvfp4 ? 16 : 32;
    std::vector<float> x = cache_rows(n, dim);
    for (float& v : x) {
      const int64_t pick = randint(0, 299);
      if (pick == 0) v = INFINITY;
      if (pick == 1) v = -INFINITY;
      if (pick == 2) v = NAN;
    }
    const PageLayout L = page_layout(1, 2, 16, rb);
    std::vector<int32_t> item(size_t(n), 0);
    std::vector<int64_t> entry(static_cast<size_t>(n));
    std::iota(entry.begin(), entry.end(), 0);
    Buffer<uint8_t> pool = poisoned<uint8_t>(be, L.n_pages * L.page_bytes);
    Buffer<int32_t> table = upload(be, L.table);
    Buffer<float> rows = upload(be, x);
    Buffer<int32_t> d_item = upload(be, item);
    Buffer<int64_t> d_entry = upload(be, entry);
    const PagedRows paged = L.rows(pool.get(), table.get());
    be.pack_paged(fc.format, paged, dim, n, rows.get(), d_item.get(), d_entry.get(), be.stream(0));
    Buffer<float> out = poisoned<float>(be, n * dim);
    Buffer<int64_t> d_count = upload(be, std::vector<int64_t>{n}),
                    d_off = upload(be, std::vector<int64_t>{0});
    be.unpack_paged(fc.format, paged, dim, 1, n, d_count.get(), d_off.get(), out.get(),
                    be.stream(0));

    std::vector<float> want = host_qdq(fc.format, x, dim);
    if (fc.format == RowFormat::kFp8Window || fc.format == RowFormat::kMxfp4) {
      for (int64_t b0 = 0; b0 < n * dim; b0 += block) {
        if (std::any_of(&x[b0], &x[b0 + block], [](float v) { return !std::isfinite(v); })) {
          std::fill_n(&want[b0], block, NAN);
        }
      }
    }
    EXPECT_TRUE(nan_aware_equal(out.download(), want));
  }
}

TEST_P(BackendPaged, RejectsBadSizes) {
  // The CPU reference throws Error; the CUDA launchers return cudaErrorInvalidValue, which the
  // backend turns into an Error.
  Backend& be = backend();
  Buffer<uint8_t> pool = poisoned<uint8_t>(be, 4096);
  Buffer<int32_t> zeros32 = upload(be, std::vector<int32_t>(8, 0));
  Buffer<int64_t> zeros64 = upload(be, std::vector<int64_t>(8, 0));
  Buffer<float> rows = upload(be, normal(8 * 48));
  Buffer<uint8_t*> slots = upload(be, std::vector<uint8_t*>{pool.get()});
  Buffer<uint8_t> store = upload(be, std::vector<uint8_t>(8, 1));
  const PagedRows paged{pool.get(), 1024, zeros32.get(), 1, 1, 0, 32};
  const Stream s = be.stream(0);
  EXPECT_THROW(be.pack_paged(RowFormat::kNvfp4, paged, /*dim=*/24, 1, rows.get(), zeros32.get(),
                             zeros64.get(), s),
               Error);
  EXPECT_THROW(be.unpack_paged(RowFormat::kMxfp4, paged, /*dim=*/48, 1, 1, zeros64.get(),
                               zeros64.get(), rows.get(), s),
               Error);
  EXPECT_THROW(be.pack_ring(RowFormat::kFp8Window, RingRows{slots.get(), 0, 128, 32}, /*dim=*/0, 1,
                            rows.get(), zeros32.get(), zeros64.get(), store.get(), s),
               Error);
  EXPECT_THROW(be.unpack_ring(RowFormat::kF32, RingRows{slots.get(), 0, /*ring=*/0, 64}, 16, 1, 1,
                              zeros64.get(), zeros64.get(), zeros64.get(), rows.get(), s),
               Error);
}

DSV41RT_INSTANTIATE_BACKENDS(BackendPaged);

#if !DSV41RT_WITH_CUDA
TEST(BackendPolicy, RequireCudaFailsInABuildWithoutCuda) {
  if (cuda_required()) FAIL() << "DSV41RT_REQUIRE_CUDA=1 but this build has no CUDA backend";
}
#endif

}  // namespace
}  // namespace dsv41rt::testing
