// Backend indexer_scores_cached (contract: kernels/indexer_cached.h): the index keys read from the
// token pages as stored, instead of from the FP32 array unpack_paged writes.
//
// References and bounds:
//   CPU instance: BITWISE kernels::cpu::indexer_scores_offset over the array unpack_paged would
//     produce (decoded here from the stored bytes with the codecs of kernels/quant.h).
//   CUDA instance: BITWISE the CUDA backend's own indexer_scores over that array (the same
//     tensor-core kernel with keys staged from FP32; the in-place staging must give it the same
//     BF16 keys), and max |cuda − cpu| <= 1e-5 · max |cpu| over the finite scores (the bound of the
//     indexer op tests: FP32 sums in another order), with -inf at exactly the same places.
// Scores are poisoned first. Layouts: pages at a random offset (16-byte aligned, or not: the
// kernel then reads the rows with narrower loads), a random page table, items' keys in reverse
// order with gaps in the unpacked array, queries seeing part of their item's entries (n_visible),
// a padding query (item -1: -inf everywhere).
#include <algorithm>
#include <cmath>

#include "backend_test_util.h"
#include "cache_row_util.h"
#include "core/status.h"
#include "kernels/indexer.h"
#include "kernels/indexer_cached.h"
#include "kernels/paged.h"

namespace dsv41rt::testing {
namespace {

using kernels::RowFormat;

struct Shape {
  int64_t S, H, D, items, per_page;
  RowFormat format;
  bool aligned;
  const char* name;
};

class BackendIndexerCached : public BackendTest {
 protected:
  void run(const Shape& c);
};

void BackendIndexerCached::run(const Shape& c) {
  SCOPED_TRACE(c.name);
  Backend& be = backend();
  const int64_t S = c.S, H = c.H, D = c.D, B = c.items, per_page = c.per_page, max_pages = 4;
  const RowFormat f = c.format;
  const int64_t rb = kernels::row_bytes(f, D);
  const int64_t page_offset = 16 * randint(1, 4) + (c.aligned ? 0 : 4);
  const int64_t page_bytes = (page_offset + per_page * rb + 32 + 15) / 16 * 16;
  const int64_t n_pages = B * max_pages + 2;
  const std::vector<int64_t> perm = permutation(n_pages);
  std::vector<int32_t> table(size_t(B * max_pages));
  for (int64_t i = 0; i < B * max_pages; ++i) table[i] = int32_t(perm[i]);
  std::vector<uint8_t> pool_host(size_t(n_pages * page_bytes), kPoison);
  std::vector<int64_t> count(B), offset(B);
  std::vector<std::vector<float>> keys_of(B);
  int64_t rows = 0, T = 0;
  for (int64_t b = B - 1; b >= 0; --b) {  // reverse item order, one gap row after each
    count[b] = b == 0 ? max_pages * per_page : randint(1, max_pages * per_page);
    offset[b] = rows;
    rows += count[b] + 1;
    T = std::max(T, count[b]);
  }
  for (int64_t b = 0; b < B; ++b) {
    keys_of[b] = host_qdq(f, normal(count[b] * D, 2.0), D);
    for (int64_t e = 0; e < count[b]; ++e) {
      const int64_t at = int64_t(table[b * max_pages + e / per_page]) * page_bytes + page_offset +
                         (e % per_page) * rb;
      encode_row(f, keys_of[b].data() + e * D, D, pool_host.data() + at);
    }
  }
  // Queries: an item each (the last one padding), part of the item's entries visible.
  std::vector<int32_t> query_item(S);
  std::vector<int64_t> n_visible(S), key_offset(S);
  for (int64_t s = 0; s < S; ++s) {
    const int64_t b = s == S - 1 ? -1 : randint(0, B - 1);
    query_item[s] = int32_t(b);
    n_visible[s] = b < 0 ? 0 : (s % 3 == 0 ? count[b] : randint(0, count[b]));
    key_offset[s] = b < 0 ? 0 : offset[b];
  }
  // Reference array: what unpack_paged writes (gaps zero; never read).
  std::vector<float> flat(size_t(std::max<int64_t>(rows, 1) * D), 0.0f);
  for (int64_t b = 0; b < B; ++b)
    std::copy(keys_of[b].begin(), keys_of[b].end(), flat.begin() + offset[b] * D);
  const std::vector<float> q = host_qdq(f, normal(S * H * D), D);  // the queries are QDQ'd too
  std::vector<float> w = normal(S * H, 0.2);
  std::vector<float> want(size_t(S * T));
  kernels::cpu::indexer_scores_offset(q.data(), flat.data(), key_offset.data(), w.data(),
                                      n_visible.data(), S, H, D, T, want.data());

  Buffer<uint8_t> pool = upload(be, pool_host);
  Buffer<int32_t> table_d = upload(be, table), items_d = upload(be, query_item);
  Buffer<int64_t> vis_d = upload(be, n_visible), off_d = upload(be, key_offset);
  Buffer<float> q_d = upload(be, q), w_d = upload(be, w);
  kernels::IndexKeys keys;
  keys.format = f;
  keys.rows = {pool.get(), page_bytes, table_d.get(), max_pages, per_page, page_offset, rb};
  keys.query_item = items_d.get();
  be.set_forward_rows(S, /*decode_batch=*/true);
  ASSERT_TRUE(be.indexer_reads_caches(f, H, D));
  Buffer<float> out = poisoned<float>(be, S * T);
  be.indexer_scores_cached(q_d.get(), keys, w_d.get(), vis_d.get(), S, H, D, T, out.get(),
                           be.stream(0));
  const std::vector<float> got = out.download();
  if (!on_cuda()) {
    EXPECT_TRUE(bitwise_equal(got, want));
    return;
  }
  Buffer<float> flat_d = upload(be, flat);
  Buffer<float> ref = poisoned<float>(be, S * T);
  be.indexer_scores(q_d.get(), flat_d.get(), off_d.get(), w_d.get(), vis_d.get(), S, H, D, T,
                    /*values_bf16=*/true, ref.get(), be.stream(0));
  EXPECT_TRUE(bitwise_equal(got, ref.download()));
  double peak = 0.0, err = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(std::isinf(got[i]), std::isinf(want[i])) << "entry " << i;
    if (std::isinf(want[i])) continue;
    peak = std::max(peak, double(std::fabs(want[i])));
    err = std::max(err, double(std::fabs(got[i] - want[i])));
  }
  EXPECT_LE(err, 1e-5 * peak) << "max |cuda - cpu| " << err << ", max |cpu| " << peak;
}

TEST_P(BackendIndexerCached, ReadsTheStoredKeysAsTheUnpackedOnes) {
  // The release shape (64 heads x 128, MXFP4 keys, 64-row pages of one ratio-4 KV source), a
  // partial head tile with misaligned rows, and the other stored formats.
  for (const Shape& c : {
           Shape{5, 64, 128, 3, 64, RowFormat::kMxfp4, true, "release, aligned"},
           Shape{4, 20, 128, 2, 16, RowFormat::kMxfp4, false, "20 heads, misaligned"},
           Shape{3, 16, 64, 3, 8, RowFormat::kNvfp4, true, "NVFP4 keys"},
           Shape{3, 8, 256, 2, 8, RowFormat::kFp8Window, false, "FP8 keys, head_dim 256"},
       }) {
    run(c);
  }
}

TEST_P(BackendIndexerCached, DecodeSizedForwardsOfStoredFormats) {
  Backend& be = backend();
  be.set_forward_rows(1, /*decode_batch=*/true);
  EXPECT_TRUE(be.indexer_reads_caches(RowFormat::kMxfp4, 64, 128));
  be.set_forward_rows(128, /*decode_batch=*/true);  // a decode batch past 64 rows
  EXPECT_TRUE(be.indexer_reads_caches(RowFormat::kMxfp4, 64, 128));
  // FP32 keys need no decode on CUDA: the unpacked array is already what the kernel reads.
  if (on_cuda()) {
    EXPECT_FALSE(be.indexer_reads_caches(RowFormat::kF32, 64, 128));
  }
  // Prefill chunks read the unpacked keys (each row serves many queries of its request).
  be.set_forward_rows(4096, /*decode_batch=*/false);
  EXPECT_FALSE(be.indexer_reads_caches(RowFormat::kMxfp4, 64, 128));
}

DSV41RT_INSTANTIATE_BACKENDS(BackendIndexerCached);

}  // namespace
}  // namespace dsv41rt::testing
