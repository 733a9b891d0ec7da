// Backend ops of the request slot and the attention key list (contract: kernels/paged.h; layout:
// runtime/model/state_layout.h): the compressor's pending rows (store_pending), the pooled gather
// over pending + new rows (compress_pool_gather), and attention_indices. Slots sit at random,
// non-monotone places of one allocation; padding entries (item < 0) are mixed in.
//
// Reference and bound: store_pending and attention_indices BITWISE on both instances (pure data
// movement / index arithmetic): the slot bytes written out here over poisoned memory (bytes nobody
// may write keep the poison), and the contract's formula written out. compress_pool_gather:
// kernels::cpu::compress_pool of the group assembled by hand (pending rows from the slot, then the
// new rows), as paged.h states — bitwise on the CPU instance (the same function), within 1e-5
// relative on CUDA (device expf differs from the host's exp by up to 2 ulp in each of the ratio
// softmax terms; the softmax and the weighted sum add a few more FP32 roundings); a padding
// group's output keeps its poison on both.
#include <algorithm>

#include "backend_test_util.h"
#include "core/status.h"
#include "kernels/compressor.h"
#include "kernels/paged.h"

namespace dsv41rt::testing {
namespace {

class BackendPagedState : public BackendTest {};

TEST_P(BackendPagedState, CompressPoolGatherEqualsCompressPoolOfTheAssembledGroup) {
  Backend& be = backend();
  struct Case {
    int64_t ratio, D;
  };
  for (const Case c : {Case{2, 512}, Case{4, 128}, Case{128, 128}}) {
    SCOPED_TRACE("ratio " + std::to_string(c.ratio) + " D " + std::to_string(c.D));
    const int64_t ratio = c.ratio, D = c.D, items = 4, groups = 6;
    const int64_t pending_offset = 16 * randint(1, 8);
    const int64_t pending_floats = 2 * (ratio - 1) * D;  // (ratio-1) value rows, then gate rows
    const int64_t slot_bytes = (pending_offset + pending_floats * 4 + 64 + 15) / 16 * 16;
    const std::vector<int64_t> slot_of = permutation(items);
    std::vector<uint8_t> slot_image(size_t(items * slot_bytes), kPoison);
    for (int64_t b = 0; b < items; ++b) {
      std::vector<float> pend = normal(pending_floats, 2.0);
      std::memcpy(&slot_image[slot_of[b] * slot_bytes + pending_offset], pend.data(),
                  pend.size() * 4);
    }
    // Groups: an item, how many of its pending rows lead the group, and where its new rows are
    // (row ranges handed out in random order). Group 2 is padding.
    std::vector<int32_t> group_item(groups);
    std::vector<int64_t> n_pending(groups), first_row(groups), new_rows(groups);
    int64_t total_rows = 0;
    for (int64_t g = 0; g < groups; ++g) {
      group_item[g] = g == 2 ? -1 : int32_t(randint(0, items - 1));
      n_pending[g] = g == 0 ? ratio - 1 : (g == 1 ? 0 : randint(0, ratio - 1));
      new_rows[g] = ratio - n_pending[g];
    }
    for (int64_t g : permutation(groups)) first_row[g] = total_rows, total_rows += new_rows[g] + 1;
    const std::vector<float> values = normal(total_rows * D), scores = normal(total_rows * D, 4.0);

    Buffer<uint8_t> slots_mem = upload(be, slot_image);
    std::vector<uint8_t*> slot_ptr;
    for (int64_t b = 0; b < items; ++b)
      slot_ptr.push_back(slots_mem.get() + slot_of[b] * slot_bytes);
    Buffer<uint8_t*> slots = upload(be, slot_ptr);
    Buffer<float> d_values = upload(be, values), d_scores = upload(be, scores);
    Buffer<int32_t> d_group_item = upload(be, group_item);
    Buffer<int64_t> d_pending = upload(be, n_pending), d_first = upload(be, first_row);
    Buffer<float> pooled = poisoned<float>(be, groups * D);
    be.compress_pool_gather(d_values.get(), d_scores.get(), slots.get(), pending_offset, groups,
                            ratio, D, d_group_item.get(), d_pending.get(), d_first.get(),
                            pooled.get(), be.stream(0));

    std::vector<float> want(size_t(groups * D), poison_float());
    for (int64_t g = 0; g < groups; ++g) {
      if (group_item[g] < 0) continue;  // padding: untouched
      const float* pend = reinterpret_cast<const float*>(
          &slot_image[slot_of[group_item[g]] * slot_bytes + pending_offset]);
      std::vector<float> v(static_cast<size_t>(ratio * D)), s(size_t(ratio * D));
      for (int64_t t = 0; t < ratio; ++t) {
        const bool old = t < n_pending[g];
        const int64_t row = first_row[g] + t - n_pending[g];
        std::copy_n(old ? pend + t * D : &values[row * D], D, &v[t * D]);
        std::copy_n(old ? pend + (ratio - 1 + t) * D : &scores[row * D], D, &s[t * D]);
      }
      kernels::cpu::compress_pool(v.data(), s.data(), 1, ratio, D, &want[g * D]);
    }
    const std::vector<float> got = pooled.download();
    if (!on_cuda()) {
      EXPECT_TRUE(bitwise_equal(got, want));
    } else {
      for (int64_t g = 0; g < groups; ++g) {
        const std::vector<float> a(got.begin() + g * D, got.begin() + (g + 1) * D);
        const std::vector<float> b(want.begin() + g * D, want.begin() + (g + 1) * D);
        if (group_item[g] < 0) {
          EXPECT_TRUE(bitwise_equal(a, b)) << "padding group " << g;  // keeps the poison
        } else {
          EXPECT_LE(rel_error(a, b), 1e-5) << "group " << g;
        }
      }
    }
  }
}

TEST_P(BackendPagedState, StorePendingCopiesRowsIntoTheSlots) {
  Backend& be = backend();
  struct Case {
    int64_t ratio, D;
  };
  for (const Case c : {Case{2, 512}, Case{4, 128}}) {
    SCOPED_TRACE("ratio " + std::to_string(c.ratio) + " D " + std::to_string(c.D));
    const int64_t ratio = c.ratio, D = c.D, items = 3, src_rows = 20;
    const int64_t pending_offset = 16 * randint(1, 8);
    const int64_t slot_bytes = (pending_offset + 2 * (ratio - 1) * D * 4 + 64 + 15) / 16 * 16;
    const std::vector<int64_t> slot_of = permutation(items);
    // Each (item, pending row) written at most once; source rows in any order; padding rows.
    std::vector<int32_t> item;
    std::vector<int64_t> src_row, dst_row;
    for (int64_t b = 0; b < items; ++b) {
      for (int64_t d = 0; d < ratio - 1; ++d) {
        if (b == 0 || randint(0, 1)) {
          item.push_back(int32_t(b)), dst_row.push_back(d),
              src_row.push_back(randint(0, src_rows - 1));
        }
      }
    }
    for (int pad = 0; pad < 3; ++pad)
      item.push_back(-1), dst_row.push_back(0), src_row.push_back(randint(0, src_rows - 1));
    const int64_t n = int64_t(item.size());
    const std::vector<float> values = normal(src_rows * D), scores = normal(src_rows * D);

    Buffer<uint8_t> slots_mem = poisoned<uint8_t>(be, items * slot_bytes);
    std::vector<uint8_t*> slot_ptr;
    for (int64_t b = 0; b < items; ++b)
      slot_ptr.push_back(slots_mem.get() + slot_of[b] * slot_bytes);
    Buffer<uint8_t*> slots = upload(be, slot_ptr);
    Buffer<float> d_values = upload(be, values), d_scores = upload(be, scores);
    Buffer<int32_t> d_item = upload(be, item);
    Buffer<int64_t> d_src = upload(be, src_row), d_dst = upload(be, dst_row);
    be.store_pending(d_values.get(), d_scores.get(), slots.get(), pending_offset, ratio, D, n,
                     d_item.get(), d_src.get(), d_dst.get(), be.stream(0));

    std::vector<uint8_t> image(size_t(items * slot_bytes), kPoison);
    for (int64_t i = 0; i < n; ++i) {
      if (item[i] < 0) continue;
      uint8_t* pend = &image[slot_of[item[i]] * slot_bytes + pending_offset];
      std::memcpy(pend + dst_row[i] * D * 4, &values[src_row[i] * D], size_t(D) * 4);
      std::memcpy(pend + (ratio - 1 + dst_row[i]) * D * 4, &scores[src_row[i] * D], size_t(D) * 4);
    }
    EXPECT_TRUE(bitwise_equal(slots_mem.download(), image));
  }
}

TEST_P(BackendPagedState, AttentionIndicesWindowThenTopK) {
  // Release widths: a 128-row window and 512 top-k slots. Items: a fresh request (early positions
  // leave the window short), a long one whose window starts late, one in between; query rows in
  // any order, plus padding rows.
  Backend& be = backend();
  for (const int64_t KI : {int64_t(512), int64_t(0)}) {
    SCOPED_TRACE("KI " + std::to_string(KI));
    const int64_t W = 128, items = 3;
    const std::vector<int64_t> length = {0, randint(500, 5000), randint(1, 200)};
    std::vector<int64_t> window_first(items), old_offset(items), row0(items), comp_offset(items);
    std::vector<int64_t> fresh = {randint(1, 150), randint(1, 20), randint(1, 150)};
    int64_t old_rows = 0, new_rows = 0;
    for (int64_t b : {int64_t(2), int64_t(0), int64_t(1)}) {  // row ranges not in item order
      window_first[b] = std::max<int64_t>(0, length[b] - (W - 1));
      old_offset[b] = old_rows, old_rows += length[b] - window_first[b];
      row0[b] = new_rows, new_rows += fresh[b];
      comp_offset[b] = randint(0, 3000);
    }
    const int64_t new_offset = old_rows + randint(0, 9), comp_base = randint(0, 100000);
    std::vector<int32_t> row_item;
    std::vector<int64_t> positions;
    for (int64_t b = 0; b < items; ++b) {
      for (int64_t i = 0; i < fresh[b]; ++i)
        row_item.push_back(int32_t(b)), positions.push_back(length[b] + i);
    }
    for (int pad = 0; pad < 3; ++pad) row_item.push_back(-1), positions.push_back(randint(0, 99));
    const std::vector<int64_t> order = permutation(int64_t(row_item.size()));
    std::vector<int32_t> items_of;
    std::vector<int64_t> pos;
    for (int64_t i : order) items_of.push_back(row_item[i]), pos.push_back(positions[i]);
    const int64_t S = int64_t(items_of.size()), K = W + KI;
    std::vector<int32_t> topk(static_cast<size_t>(S * KI));
    for (int32_t& e : topk) e = randint(0, 9) < 3 ? -1 : int32_t(randint(0, 4000));

    Buffer<int32_t> d_item = upload(be, items_of), d_topk = upload(be, topk);
    Buffer<int64_t> d_pos = upload(be, pos), d_first = upload(be, window_first),
                    d_len = upload(be, length);
    Buffer<int64_t> d_old = upload(be, old_offset), d_row0 = upload(be, row0),
                    d_comp = upload(be, comp_offset);
    Buffer<int32_t> idx = poisoned<int32_t>(be, S * K, kIndexPoison);
    be.attention_indices(S, W, KI, d_item.get(), d_pos.get(), d_first.get(), d_len.get(),
                         d_old.get(), d_row0.get(), new_offset, KI ? d_topk.get() : nullptr,
                         KI ? d_comp.get() : nullptr, comp_base, idx.get(), be.stream(0));
    // The contract's formula (kernels/paged.h), exact on both instances.
    std::vector<int32_t> want(static_cast<size_t>(S * K), -1);
    for (int64_t s = 0; s < S; ++s) {
      const int32_t b = items_of[s];
      if (b < 0) continue;
      const int64_t t = pos[s], lo = std::max<int64_t>(0, t - W + 1);
      for (int64_t p = lo; p <= t; ++p) {
        want[s * K + p - lo] = int32_t(p < length[b] ? old_offset[b] + p - window_first[b]
                                                     : new_offset + row0[b] + p - length[b]);
      }
      for (int64_t j = 0; j < KI; ++j) {
        if (topk[s * KI + j] >= 0)
          want[s * K + W + j] = int32_t(comp_base + comp_offset[b] + topk[s * KI + j]);
      }
    }
    EXPECT_TRUE(bitwise_equal(idx.download(), want));
  }
}

TEST_P(BackendPagedState, RejectsBadSizes) {
  // The CPU reference throws Error; the CUDA launchers return cudaErrorInvalidValue, which the
  // backend turns into an Error.
  Backend& be = backend();
  Buffer<uint8_t> slot = poisoned<uint8_t>(be, 4096);
  Buffer<uint8_t*> slots = upload(be, std::vector<uint8_t*>{slot.get()});
  Buffer<float> rows = upload(be, normal(64));
  Buffer<int32_t> i32 = upload(be, std::vector<int32_t>(8, 0));
  Buffer<int64_t> i64 = upload(be, std::vector<int64_t>(8, 1));
  const Stream s = be.stream(0);
  EXPECT_THROW(be.compress_pool_gather(rows.get(), rows.get(), slots.get(), 0, 1, /*ratio=*/0, 16,
                                       i32.get(), i64.get(), i64.get(), rows.get(), s),
               Error);
  EXPECT_THROW(be.store_pending(rows.get(), rows.get(), slots.get(), 0, /*ratio=*/1, 16, 1,
                                i32.get(), i64.get(), i64.get(), s),
               Error);
  EXPECT_THROW(be.attention_indices(1, /*W=*/0, 0, i32.get(), i64.get(), i64.get(), i64.get(),
                                    i64.get(), i64.get(), 0, nullptr, nullptr, 0, i32.get(), s),
               Error);
}

DSV41RT_INSTANTIATE_BACKENDS(BackendPagedState);

}  // namespace
}  // namespace dsv41rt::testing
