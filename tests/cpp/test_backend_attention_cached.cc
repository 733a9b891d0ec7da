// Backend sparse_attention_cached (contract: kernels/attention_cached.h): the keys read from a
// window ring and token pages as stored, instead of from unpacked FP32 arrays.
//
// References and bounds:
//   CPU instance: BITWISE kernels::cpu::sparse_attention_split over the arrays unpack_ring /
//     unpack_paged would produce (decoded here from the stored bytes with the codecs of
//     kernels/quant.h, at the rows attention_indices addresses).
//   CUDA instance: BITWISE the CUDA backend's own sparse_attention over those arrays (the same
//     tensor-core kernel with keys staged from FP32; the in-place staging must give it the same
//     BF16 keys), and the float64 reference within the CUDA kernels' rounding bound
//     (attention_reference_util.h, as in test_backend_attention.cc). The empirical bound it
//     replaced, max |cuda − cpu| <= 1e-5 · max |cpu|, failed at seed 9014549515147224315
//     (1.20e-4 against 1.11e-4, "release, aligned").
// Outputs are poisoned first. Layouts: ring and pages at random offsets (16-byte aligned, or not:
// the kernel then reads the rows with narrower loads), a random page table, items' rows in
// reverse order with gaps, a padding query.
#include <algorithm>

#include "attention_reference_util.h"
#include "backend_test_util.h"
#include "cache_row_util.h"
#include "core/status.h"
#include "kernels/attention.h"
#include "kernels/attention_cached.h"
#include "kernels/paged.h"
#include "kernels/quant.h"

namespace dsv41rt::testing {
namespace {

using kernels::RowFormat;

struct Shape {
  int64_t S, H, D, W, KI, items, per_page;
  RowFormat comp_format;
  bool aligned;
  const char* name;
  // Rows of random stored bytes instead of quantised values: every code (E4M3 NaNs aside) and
  // scales on both sides of the CUDA staging's bit-placement limits (kernels/cuda/
  // cache_row_decode.cuh decode_row_piece_bf16), the reference decoded from those bytes.
  bool raw_bytes = false;
};

// A stored row of random bytes: codes of every value (E4M3 NaN codes replaced), scale codes drawn
// from the edges of the CUDA fast path (FP8 window / MXFP4: E8M0 powers of two; NVFP4: E4M3
// scales incl. subnormal, zero and negative ones).
template <class Rand>
void random_row(RowFormat f, int64_t D, Rand&& randint, uint8_t* row) {
  const int64_t codes = f == RowFormat::kFp8Window ? D : D / 2;
  for (int64_t i = 0; i < codes; ++i) {
    uint8_t b = uint8_t(randint(0, 255));
    if (f == RowFormat::kFp8Window && (b & 0x7F) == 0x7F) b = uint8_t(b ^ 0x01);
    row[i] = b;
  }
  static constexpr uint8_t kE8m0Window[] = {15, 16, 17, 100, 127, 133, 134, 135};
  static constexpr uint8_t kE8m0Mx[] = {1, 2, 3, 120, 127, 130};
  static constexpr uint8_t kE4m3[] = {0x00, 0x01, 0x07, 0x08, 0x38, 0x7E, 0xB8, 0x85};
  const int64_t scales = f == RowFormat::kNvfp4 ? D / 16 : D / 32;
  for (int64_t i = 0; i < scales; ++i) {
    uint8_t& sc = row[codes + i];
    if (f == RowFormat::kFp8Window) sc = kE8m0Window[randint(0, 7)];
    if (f == RowFormat::kMxfp4) sc = kE8m0Mx[randint(0, 5)];
    if (f == RowFormat::kNvfp4) sc = kE4m3[randint(0, 7)];
  }
}

class BackendAttentionCached : public BackendTest {
 protected:
  void run(const Shape& c);
};

void BackendAttentionCached::run(const Shape& c) {
  SCOPED_TRACE(c.name);
  Backend& be = backend();
  const int64_t S = c.S, H = c.H, D = c.D, W = c.W, KI = c.KI, B = c.items, K = W + KI;
  const RowFormat wf = RowFormat::kFp8Window, cf = c.comp_format;
  const int64_t wrb = kernels::row_bytes(wf, D), crb = kernels::row_bytes(cf, D);
  const int64_t misalign = c.aligned ? 0 : 4;

  // Window rings: item b holds positions window_first[b] .. + old_count[b] - 1 (wrapping).
  const int64_t ring_offset = 16 * randint(1, 4) + misalign;
  const int64_t slot_bytes = (ring_offset + W * wrb + 16 + 15) / 16 * 16;
  std::vector<uint8_t> slots_host(size_t(B * slot_bytes), kPoison);
  std::vector<int64_t> window_first(B), old_count(B), old_offset(B);
  std::vector<std::vector<float>> old_rows_of(B);
  int64_t T_old = 0;
  for (int64_t b = B - 1; b >= 0; --b) {  // reverse item order, one gap row after each
    old_count[b] = b == 0 ? W - 1 : randint(0, W - 1);
    window_first[b] = randint(0, 3 * W);
    old_offset[b] = T_old;
    T_old += old_count[b] + 1;
  }
  auto rand = [this](int64_t lo, int64_t hi) { return randint(lo, hi); };
  for (int64_t b = 0; b < B; ++b) {
    old_rows_of[b] = host_qdq(wf, normal(old_count[b] * D, 3.0), D);
    for (int64_t r = 0; r < old_count[b]; ++r) {
      const int64_t p = window_first[b] + r;
      uint8_t* row = slots_host.data() + b * slot_bytes + ring_offset + (p % W) * wrb;
      if (c.raw_bytes) {
        random_row(wf, D, rand, row);
        decode_row(wf, row, D, old_rows_of[b].data() + r * D);
      } else {
        encode_row(wf, old_rows_of[b].data() + r * D, D, row);
      }
    }
  }
  // This forward's rows: FP32 after the cache QDQ (BF16 values).
  const int64_t n_new = S + 2;
  const std::vector<float> new_rows = host_qdq(wf, normal(n_new * D, 3.0), D);

  // Compressed entries in pages: item b's entry e in page table[b, e / per_page].
  const int64_t per_page = c.per_page, max_pages = 3;
  const int64_t page_offset = 16 * randint(1, 4) + misalign;
  const int64_t page_bytes = (page_offset + per_page * crb + 32 + 15) / 16 * 16;
  const int64_t n_pages = B * max_pages + 2;
  const std::vector<int64_t> perm = permutation(n_pages);
  std::vector<int32_t> table(size_t(B * max_pages));
  for (int64_t i = 0; i < B * max_pages; ++i) table[i] = int32_t(perm[i]);
  std::vector<uint8_t> pool_host(size_t(n_pages * page_bytes), kPoison);
  std::vector<int64_t> comp_count(B), comp_offset(B);
  std::vector<std::vector<float>> comp_of(B);
  int64_t T_comp = 0;
  for (int64_t b = B - 1; b >= 0; --b) {
    comp_count[b] = b == 0 ? max_pages * per_page : randint(1, max_pages * per_page);
    comp_offset[b] = T_comp;
    T_comp += comp_count[b] + 1;
  }
  for (int64_t b = 0; b < B; ++b) {
    comp_of[b] = host_qdq(cf, normal(comp_count[b] * D, 3.0), D);
    for (int64_t e = 0; e < comp_count[b]; ++e) {
      const int64_t at = int64_t(table[b * max_pages + e / per_page]) * page_bytes + page_offset +
                         (e % per_page) * crb;
      if (c.raw_bytes) {
        random_row(cf, D, rand, pool_host.data() + at);
        decode_row(cf, pool_host.data() + at, D, comp_of[b].data() + e * D);
      } else {
        encode_row(cf, comp_of[b].data() + e * D, D, pool_host.data() + at);
      }
    }
  }

  // Queries: item per query (the last one padding), indices as attention_indices lays them out.
  const int64_t T_a = T_old + n_new, comp_base = T_a;
  std::vector<int32_t> query_item(S);
  std::vector<int32_t> idx(size_t(S * K), -1);
  for (int64_t s = 0; s < S; ++s) {
    const int64_t b = s == S - 1 ? -1 : randint(0, B - 1);
    query_item[s] = int32_t(b);
    if (b < 0) continue;
    for (int64_t k = 0; k < W; ++k) {
      const int64_t pick = randint(0, 9);
      if (pick < 7 && old_count[b] > 0) {
        idx[s * K + k] = int32_t(old_offset[b] + randint(0, old_count[b] - 1));
      } else if (pick < 9) {
        idx[s * K + k] = int32_t(T_old + randint(0, n_new - 1));
      }
    }
    for (int64_t k = W; k < K; ++k) {
      if (randint(0, 9) < 9)
        idx[s * K + k] = int32_t(comp_base + comp_offset[b] + randint(0, comp_count[b] - 1));
    }
  }
  // Reference arrays: what unpack_ring / unpack_paged write (gaps zero; never read).
  std::vector<float> kv_a(size_t(T_a * D), 0.0f),
      kv_b(size_t(std::max<int64_t>(T_comp, 1) * D), 0.0f);
  for (int64_t b = 0; b < B; ++b) {
    std::copy(old_rows_of[b].begin(), old_rows_of[b].end(), kv_a.begin() + old_offset[b] * D);
    std::copy(comp_of[b].begin(), comp_of[b].end(), kv_b.begin() + comp_offset[b] * D);
  }
  std::copy(new_rows.begin(), new_rows.end(), kv_a.begin() + T_old * D);
  // Raw rows reach 448 * 2^8 (NVFP4: 6 * 448): small queries keep the logits in softmax range.
  const std::vector<float> q = normal(S * H * D, c.raw_bytes ? 1.0 / 4096 : 1.0);
  const std::vector<float> sink = normal(H);
  const float scale = float(1.0 / std::sqrt(double(D)));
  std::vector<float> want(size_t(S * H * D));
  kernels::cpu::sparse_attention_split(q.data(), kv_a.data(), T_a, kv_b.data(), T_comp, idx.data(),
                                       sink.data(), S, H, D, K, scale, want.data());

  // The same on the backend under test.
  Buffer<uint8_t> slots_mem = upload(be, slots_host), pool_mem = upload(be, pool_host);
  std::vector<uint8_t*> slot_ptr(B);
  for (int64_t b = 0; b < B; ++b) slot_ptr[b] = slots_mem.get() + b * slot_bytes;
  Buffer<uint8_t*> slot_ptrs = upload(be, slot_ptr);
  Buffer<int32_t> table_d = upload(be, table), items_d = upload(be, query_item),
                  idx_d = upload(be, idx);
  Buffer<int64_t> first_d = upload(be, window_first), old_count_d = upload(be, old_count),
                  old_offset_d = upload(be, old_offset), comp_count_d = upload(be, comp_count),
                  comp_offset_d = upload(be, comp_offset);
  Buffer<float> new_d = upload(be, new_rows), q_d = upload(be, q), sink_d = upload(be, sink);
  kernels::CachedKeys keys;
  keys.window_format = wf;
  keys.ring = {slot_ptrs.get(), ring_offset, W, wrb};
  keys.window_first = first_d.get();
  keys.old_offset = old_offset_d.get();
  keys.old_count = old_count_d.get();
  keys.old_rows = T_old;
  keys.new_rows = new_d.get();
  keys.new_count = n_new;
  keys.comp_format = cf;
  keys.comp = {pool_mem.get(), page_bytes, table_d.get(), max_pages, per_page, page_offset, crb};
  keys.comp_offset = comp_offset_d.get();
  keys.comp_count = comp_count_d.get();
  keys.comp_rows = T_comp;
  keys.query_item = items_d.get();

  be.set_forward_rows(S, /*decode_batch=*/true);
  ASSERT_TRUE(be.attention_reads_caches(/*keys_bf16=*/true, D));
  Buffer<float> out = poisoned<float>(be, S * H * D);
  be.sparse_attention_cached(q_d.get(), keys, idx_d.get(), sink_d.get(), S, H, D, K, scale,
                             out.get(), be.stream(0));
  const std::vector<float> got = out.download();
  if (!on_cuda()) {
    EXPECT_TRUE(bitwise_equal(got, want));
    return;
  }
  // CUDA: bitwise its own kernel on the unpacked arrays, and within the bound of the CPU.
  Buffer<float> kv_a_d = upload(be, kv_a), kv_b_d = upload(be, kv_b);
  Buffer<float> flat = poisoned<float>(be, S * H * D);
  be.sparse_attention(q_d.get(), kv_a_d.get(), T_a, kv_b_d.get(), T_comp, idx_d.get(), sink_d.get(),
                      S, H, D, K, scale, /*keys_bf16=*/true, flat.get(), be.stream(0));
  EXPECT_TRUE(bitwise_equal(got, flat.download()));
  const AttentionF64 ref = attention_f64(q, kv_a, T_a, kv_b, idx, sink, S, H, D, K, scale);
  EXPECT_TRUE(within(got, ref.out, attention_bound(ref, D, cuda_rounding(D, K))));
}

TEST_P(BackendAttentionCached, ReadsTheStoredRowsAsTheUnpackedOnes) {
  // The release shapes (64 heads x 512, window 128, top-k 512, NVFP4 compressed KV), a partial
  // head tile, MXFP4 compressed rows, and head_dim 64 (2-byte aligned FP8 window rows).
  for (const Shape& c : {
           Shape{3, 64, 512, 128, 512, 3, 64, RowFormat::kNvfp4, true, "release, aligned"},
           Shape{4, 20, 512, 128, 64, 2, 16, RowFormat::kNvfp4, false, "20 heads, misaligned"},
           Shape{5, 16, 256, 32, 40, 3, 8, RowFormat::kMxfp4, true, "MXFP4 compressed rows"},
           Shape{6, 8, 64, 16, 24, 4, 4, RowFormat::kNvfp4, false, "head_dim 64"},
           Shape{3, 16, 512, 32, 64, 2, 16, RowFormat::kNvfp4, true, "raw bytes, NVFP4", true},
           Shape{3, 16, 256, 32, 40, 2, 8, RowFormat::kMxfp4, false, "raw bytes, MXFP4", true},
       }) {
    run(c);
  }
}

TEST_P(BackendAttentionCached, DecodeSizedForwardsOnly) {
  Backend& be = backend();
  be.set_forward_rows(1, /*decode_batch=*/true);
  EXPECT_TRUE(be.attention_reads_caches(/*keys_bf16=*/true, 512));
  be.set_forward_rows(4096, /*decode_batch=*/false);  // a prefill chunk: unpacked, reused
  EXPECT_FALSE(be.attention_reads_caches(/*keys_bf16=*/true, 512));
  be.set_forward_rows(128, /*decode_batch=*/true);  // a decode batch past 64 rows
  EXPECT_TRUE(be.attention_reads_caches(/*keys_bf16=*/true, 512));
}

TEST(AttentionCachedCpu, IndexOutsideItsItemThrows) {
  // One item with 2 ring rows; index 2 is inside [0, old_rows) but not one of the item's rows.
  std::vector<uint8_t> slot(size_t(4 * kernels::row_bytes(RowFormat::kFp8Window, 32)), 0);
  uint8_t* slots[1] = {slot.data()};
  const int64_t first = 0, count = 2, offset = 0;
  const int32_t item = 0;
  kernels::CachedKeys keys;
  keys.window_format = RowFormat::kFp8Window;
  keys.ring = {slots, 0, 4, kernels::row_bytes(RowFormat::kFp8Window, 32)};
  keys.window_first = &first, keys.old_count = &count, keys.old_offset = &offset;
  keys.old_rows = 3;
  keys.query_item = &item;
  const std::vector<float> q(32, 1.0f);
  const float sink = 0.0f;
  std::vector<float> out(32);
  const int32_t good[2] = {0, 1}, bad[2] = {0, 2};
  kernels::cpu::sparse_attention_cached(q.data(), keys, good, &sink, 1, 1, 32, 2, 1.0f, out.data());
  EXPECT_THROW(kernels::cpu::sparse_attention_cached(q.data(), keys, bad, &sink, 1, 1, 32, 2, 1.0f,
                                                     out.data()),
               Error);
}

DSV41RT_INSTANTIATE_BACKENDS(BackendAttentionCached);

}  // namespace
}  // namespace dsv41rt::testing
