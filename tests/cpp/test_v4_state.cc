// The DeepSeek-V4 per-request state in the paged pool (issue 25, step 2): every CSA and HCA layer
// is a source of its own (no sharing), HCA layers keep no index keys, and each compressor's flat
// state (kernels/v4_compressor.h) sits in the request slot at the StateLayout's offsets, so that
// chunks fed through the slot emit prefill's entries bitwise while leaving every other byte of the
// slot alone.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "kernels/linear.h"
#include "kernels/rope.h"
#include "kernels/v4_compressor.h"
#include "runtime/model/backend.h"
#include "runtime/model/cache_bytes.h"
#include "runtime/model/engram_tables.h"
#include "runtime/model/forward_plan.h"
#include "runtime/model/layer_plan.h"
#include "runtime/model/model_config.h"
#include "runtime/model/state_layout.h"
#include "runtime/model/v4_compressor_stage.h"

namespace dsv41rt {
namespace {

using kernels::V4CompressorWeights;
using model::CacheFormats;
using model::StateLayout;

// tiny-v4's schedule (python/dsv41rt/config/presets.py): SWA, SWA, CSA, HCA, CSA, HCA, MTP.
const char* kTinyV4 = R"({
  "model_type": "deepseek_v4", "vocab_size": 1000, "hidden_size": 64,
  "moe_intermediate_size": 32, "num_hidden_layers": 6, "num_attention_heads": 4, "head_dim": 64,
  "qk_rope_head_dim": 16, "q_lora_rank": 32, "o_lora_rank": 32, "o_groups": 2,
  "n_routed_experts": 8, "num_experts_per_tok": 2, "routed_scaling_factor": 1.5,
  "sliding_window": 8, "compress_ratios": [0, 0, 4, 128, 4, 128, 0],
  "index_n_heads": 16, "index_head_dim": 32, "index_topk": 8, "num_hash_layers": 3,
  "num_nextn_predict_layers": 1, "hc_mult": 2,
  "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
                   "beta_fast": 32, "beta_slow": 1}
})";

ModelPlan tiny_v4_plan() { return build_model_plan(parse_model_config_json(kTinyV4, "tiny-v4")); }

constexpr int64_t kF32 = 4, kH = 64, kD = 64, kDI = 32, kWindow = 8;
// Flat states (kernels/v4_compressor.h): 2·m·W (+ 2·m·D with overlap) floats.
constexpr int64_t kCsaMain = (2 * 4 * 2 * kD + 2 * 4 * kD) * kF32;       // 6144 B
constexpr int64_t kCsaIndexer = (2 * 4 * 2 * kDI + 2 * 4 * kDI) * kF32;  // 3072 B
constexpr int64_t kHcaMain = 2 * 128 * kD * kF32;                        // 65536 B

TEST(V4StateLayout, EveryCompressedLayerIsASourceOfItsOwn) {
  const ModelPlan plan = tiny_v4_plan();
  const StateLayout layout(plan, CacheFormats::of(false), 128);
  const int64_t kv = kD * kF32, key = kDI * kF32;  // FP32 rows (cache_quant off)
  EXPECT_EQ(layout.window_row_bytes(), kv);
  EXPECT_EQ(layout.kv_row_bytes(), kv);
  EXPECT_EQ(layout.key_row_bytes(), key);
  // Page: layer 2 (CSA) 32 entries + 32 keys, layer 3 (HCA) 1 entry, layer 4, layer 5.
  const int64_t csa_page = 32 * (kv + key), hca_page = kv;
  EXPECT_EQ(layout.entries_per_page(2), 32);
  EXPECT_EQ(layout.entries_per_page(3), 1);
  EXPECT_EQ(layout.entry_offset(2, false), 0);
  EXPECT_EQ(layout.entry_offset(2, true), 32 * kv);
  EXPECT_EQ(layout.entry_offset(3, false), csa_page);
  EXPECT_EQ(layout.entry_offset(4, false), csa_page + hca_page);
  EXPECT_EQ(layout.entry_offset(4, true), csa_page + hca_page + 32 * kv);
  EXPECT_EQ(layout.entry_offset(5, false), 2 * csa_page + hca_page);
  EXPECT_EQ(layout.geometry().page_bytes, 2 * (csa_page + hca_page));
  EXPECT_THROW(layout.entry_offset(3, true), Error);   // HCA: no index keys
  EXPECT_THROW(layout.entry_offset(1, false), Error);  // SWA: no entries
  // Slot: six backbone window rings and the MTP layer's (mtp.0, ring 6), then the states in layer
  // order (CSA: main, then indexer).
  const int64_t rings = 7 * kWindow * kv;
  EXPECT_EQ(layout.window_offset(6), 6 * kWindow * kv);
  EXPECT_EQ(layout.pending_offset(2), rings);
  EXPECT_EQ(layout.indexer_pending_offset(2), rings + kCsaMain);
  EXPECT_EQ(layout.pending_offset(3), rings + kCsaMain + kCsaIndexer);
  EXPECT_EQ(layout.pending_offset(4), rings + kCsaMain + kCsaIndexer + kHcaMain);
  EXPECT_EQ(layout.indexer_pending_offset(4), rings + 2 * kCsaMain + kCsaIndexer + kHcaMain);
  EXPECT_EQ(layout.pending_offset(5), rings + 2 * (kCsaMain + kCsaIndexer) + kHcaMain);
  EXPECT_EQ(layout.geometry().slot_bytes, rings + 2 * (kCsaMain + kCsaIndexer + kHcaMain));
  EXPECT_THROW(layout.indexer_pending_offset(3), Error);  // HCA: no indexer
  // The accounting `inspect` prints is the same as the layout's.
  EXPECT_EQ(model::cache_bytes(plan).compressor_state_per_request,
            2 * (kCsaMain + kCsaIndexer + kHcaMain));
  // Quantised caches: V4's own 584-byte rows (spec §5.4), not V4.1's.
  EXPECT_EQ(model::cache_row_bytes(plan.config, CacheFormats::of(true)).window,
            48 + 8 + 2 * 16);  // nope FP8 + one UE8M0 scale per 64 padded to 8 + rope BF16
}

TEST(V4StateLayout, PagesMustHoldWholeHcaGroups) {
  const ModelPlan plan = tiny_v4_plan();
  try {
    StateLayout(plan, CacheFormats::of(false), 64);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not a multiple of compression ratio 128 (layer 3)"),
              std::string::npos)
        << e.what();
  }
}

struct RandomCompressor {
  std::vector<float> wkv, wgate, ape, norm;
  V4CompressorWeights w;
  RandomCompressor(int64_t D, int64_t ratio, bool overlap, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> n01(0.0f, 1.0f);
    w.H = kH, w.D = D, w.ratio = ratio, w.overlap = overlap;
    for (auto* v : {&wkv, &wgate}) {
      v->resize(w.width() * kH);
      for (float& e : *v) e = 0.25f * n01(rng);
    }
    ape.resize(ratio * w.width());
    for (float& e : ape) e = n01(rng);
    norm.resize(D);
    for (float& e : norm) e = 1.0f + 0.1f * n01(rng);
    w.wkv = wkv.data(), w.wgate = wgate.data(), w.ape = ape.data(), w.norm_weight = norm.data();
  }
};

TEST(V4StateLayout, CompressorsInTheSlotEmitPrefillEntriesBitwise) {
  const ModelPlan plan = tiny_v4_plan();
  const StateLayout layout(plan, CacheFormats::of(false), 128);
  // Every compressor of the model, each at its slot offset.
  struct Placed {
    RandomCompressor c;
    int64_t offset;
  };
  std::vector<Placed> all;
  for (const LayerPlan& l : plan.layers) {
    if (l.role == LayerRole::kCsa) {
      all.push_back({RandomCompressor(kD, 4, true, 10 + l.index), layout.pending_offset(l.index)});
      all.push_back(
          {RandomCompressor(kDI, 4, true, 20 + l.index), layout.indexer_pending_offset(l.index)});
    } else if (l.role == LayerRole::kHca) {
      all.push_back(
          {RandomCompressor(kD, 128, false, 30 + l.index), layout.pending_offset(l.index)});
    }
  }
  ASSERT_EQ(all.size(), 6u);
  const int64_t T = 300;  // two HCA groups and a partial one
  std::vector<float> x(T * kH);
  std::mt19937 rng(1);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  for (float& e : x) e = n01(rng);
  // The slot starts as canary bytes: the compressors read only rows they wrote, and must not
  // touch the window rings nor each other's states.
  const int64_t slot_bytes = layout.geometry().slot_bytes;
  std::vector<float> slot_storage(slot_bytes / kF32 + 1);
  uint8_t* slot = reinterpret_cast<uint8_t*>(slot_storage.data());
  std::memset(slot, 0xA5, slot_bytes);
  std::vector<std::vector<float>> got(all.size());
  int64_t length = 0;  // the request length: the states' token count
  while (length < T) {
    const int64_t n = std::min<int64_t>(T - length, 1 + rng() % 11);
    for (size_t i = 0; i < all.size(); ++i) {
      const V4CompressorWeights& w = all[i].c.w;
      const kernels::V4CompressorRows rows =
          kernels::v4_compressor_rows(w, reinterpret_cast<float*>(slot + all[i].offset));
      std::vector<float> entries(((length % w.ratio + n) / w.ratio) * w.D);
      const int64_t k = kernels::cpu::v4_compress_append_rows(
          w, rows, length, x.data() + length * kH, n, entries.data());
      ASSERT_EQ(k * w.D, int64_t(entries.size()));
      got[i].insert(got[i].end(), entries.begin(), entries.end());
    }
    length += n;
  }
  for (size_t i = 0; i < all.size(); ++i) {
    const V4CompressorWeights& w = all[i].c.w;
    std::vector<float> want((T / w.ratio) * w.D);
    kernels::cpu::v4_compress_prefill(w, x.data(), T, want.data());
    ASSERT_EQ(got[i].size(), want.size()) << "compressor " << i;
    EXPECT_EQ(std::memcmp(got[i].data(), want.data(), want.size() * sizeof(float)), 0)
        << "compressor " << i;
  }
  // The window rings (slot bytes before the first state) are untouched.
  const int64_t rings = layout.pending_offset(2);
  for (int64_t b = 0; b < rings; ++b) ASSERT_EQ(slot[b], 0xA5) << "byte " << b;
}

// The Backend op over a batch: three requests in their slots, prompts fed in chunks of different
// sizes per forward, one forward's rows concatenated as the model runner lays them out. Each
// request's entries equal its prompt's prefill bitwise.
TEST(V4StateLayout, BackendCompressorOverABatchOfSlotsEqualsPrefillBitwise) {
  std::unique_ptr<model::Backend> be = model::make_cpu_backend();
  ASSERT_TRUE(be->has_v4_ops());
  for (const auto& [ratio, overlap] : {std::pair<int64_t, bool>{4, true}, {128, false}}) {
    const RandomCompressor c(kD, ratio, overlap, 40 + uint32_t(ratio));
    const V4CompressorWeights& w = c.w;
    const int64_t W = w.width(), items = 3;
    const std::vector<int64_t> T = {1, 37, 300};
    std::vector<std::vector<float>> x(items), got(items);
    std::mt19937 rng(5);
    std::normal_distribution<float> n01(0.0f, 1.0f);
    for (int64_t b = 0; b < items; ++b) {
      x[b].resize(T[b] * kH);
      for (float& e : x[b]) e = n01(rng);
    }
    const int64_t state_bytes = kernels::v4_compressor_state_floats(w) * kF32, offset = 16;
    std::vector<std::vector<float>> slot_storage(items);
    std::vector<uint8_t*> slots(items);
    for (int64_t b = 0; b < items; ++b) {
      slot_storage[b].assign((offset + state_bytes) / kF32, -1.0f);
      slots[b] = reinterpret_cast<uint8_t*>(slot_storage[b].data());
    }
    std::vector<int64_t> length(items, 0);
    while (length != T) {
      std::vector<int64_t> n(items), row0(items), entry0(items);
      int64_t rows = 0, entries = 0;
      for (int64_t b = 0; b < items; ++b) {
        n[b] = std::min<int64_t>(T[b] - length[b], rng() % 40);
        row0[b] = rows, entry0[b] = entries;
        rows += n[b];
        entries += (length[b] % ratio + n[b]) / ratio;
      }
      std::vector<float> batch(std::max<int64_t>(rows, 1) * kH);
      for (int64_t b = 0; b < items; ++b) {
        std::copy_n(x[b].begin() + length[b] * kH, n[b] * kH, batch.begin() + row0[b] * kH);
      }
      std::vector<float> a(rows * W + 1), sc(rows * W + 1), out(entries * kD + 1);
      kernels::cpu::linear(batch.data(), w.wkv, rows, kH, W, a.data());
      kernels::cpu::linear(batch.data(), w.wgate, rows, kH, W, sc.data());
      be->v4_compress(w, a.data(), sc.data(), slots.data(), offset, items, length.data(),
                      row0.data(), n.data(), entry0.data(), out.data(), be->stream(0));
      for (int64_t b = 0; b < items; ++b) {
        const int64_t k = (length[b] % ratio + n[b]) / ratio;
        got[b].insert(got[b].end(), out.begin() + entry0[b] * kD,
                      out.begin() + (entry0[b] + k) * kD);
        length[b] += n[b];
      }
    }
    for (int64_t b = 0; b < items; ++b) {
      std::vector<float> want((T[b] / ratio) * kD);
      kernels::cpu::v4_compress_prefill(w, x[b].data(), T[b], want.data());
      ASSERT_EQ(got[b].size(), want.size()) << "ratio " << ratio << " item " << b;
      // Bitwise; memcmp of no entries would pass null pointers (UB), hence the guard.
      EXPECT_TRUE(want.empty() ||
                  std::memcmp(got[b].data(), want.data(), want.size() * sizeof(float)) == 0)
          << "ratio " << ratio << " item " << b;
      // The bytes before the state offset are untouched.
      EXPECT_EQ(slot_storage[b][0], -1.0f);
      EXPECT_EQ(slot_storage[b][offset / kF32 - 1], -1.0f);
    }
  }
}

TEST(V4StateLayout, BackendCompressorRefusesAMissingSlot) {
  std::unique_ptr<model::Backend> be = model::make_cpu_backend();
  const RandomCompressor c(kD, 4, true, 1);
  std::vector<float> a(2 * 2 * kD), s(2 * 2 * kD);
  uint8_t* slots[1] = {nullptr};
  const int64_t length = 0, row0 = 0, n = 2, entry0 = 0;
  try {
    be->v4_compress(c.w, a.data(), s.data(), slots, 0, 1, &length, &row0, &n, &entry0, nullptr,
                    be->stream(0));
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("v4_compress: item 0 has no slot"), std::string::npos)
        << e.what();
  }
}

// The forward plan of a V4 batch drives the op: every CSA / HCA ratio has compressor groups, each
// item's new entries start at its group0, RoPE positions are m·entry; two forwards of two requests
// (their states in their own slots) give each request's prefill entries bitwise.
TEST(V4StateLayout, ForwardPlanMetadataDrivesTheCompressorOp) {
  const ModelPlan plan = tiny_v4_plan();
  const StateLayout layout(plan, CacheFormats::of(false), 128);
  std::unique_ptr<model::Backend> be = model::make_cpu_backend();
  const RandomCompressor csa(kD, 4, true, 3), hca(kD, 128, false, 4);
  const int64_t csa_at = layout.pending_offset(2), hca_at = layout.pending_offset(3);
  ASSERT_EQ(plan.layers[2].role, LayerRole::kCsa);
  ASSERT_EQ(plan.layers[3].role, LayerRole::kHca);
  const std::vector<std::vector<int64_t>> chunks = {{11, 130}, {5, 131}};  // per forward, per item
  const int64_t T[2] = {16, 261};
  std::mt19937 rng(9);
  std::vector<int32_t> tokens[2];
  std::vector<float> x[2];
  for (int b = 0; b < 2; ++b) {
    tokens[b].resize(T[b]);
    for (int32_t& t : tokens[b]) t = int32_t(rng() % 1000);
    x[b].resize(T[b] * kH);
    std::normal_distribution<float> n01(0.0f, 1.0f);
    for (float& e : x[b]) e = n01(rng);
  }
  std::vector<std::vector<float>> slot_storage(
      2, std::vector<float>(layout.geometry().slot_bytes / 4));
  const std::vector<int32_t> pages = {0, 1, 2};
  std::vector<float> got_csa[2], got_hca[2];
  int64_t length[2] = {0, 0};
  for (size_t fwd = 0; fwd < chunks.size(); ++fwd) {
    std::vector<model::BatchItem> batch(2);
    for (int b = 0; b < 2; ++b) {
      batch[b].request.slot = reinterpret_cast<uint8_t*>(slot_storage[b].data());
      batch[b].request.pages = pages.data();
      batch[b].request.n_pages = 3;
      batch[b].request.length = length[b];
      batch[b].tokens = tokens[b].data() + length[b];
      batch[b].n = chunks[fwd][b];
    }
    const model::ForwardPlan f =
        model::plan_forward(plan, layout, batch, model::EngramTables{}, {nullptr, nullptr});
    ASSERT_EQ(f.ratios.size(), 2u);
    EXPECT_EQ(f.new_rows, chunks[fwd]);
    std::vector<float> rows(f.rows * kH);
    for (int b = 0; b < 2; ++b) {
      std::copy_n(x[b].begin() + length[b] * kH, chunks[fwd][b] * kH,
                  rows.begin() + f.row0[b] * kH);
    }
    for (const model::RatioPlan& rp : f.ratios) {
      ASSERT_TRUE(rp.compressor) << rp.ratio;
      const RandomCompressor& c = rp.ratio == 4 ? csa : hca;
      const int64_t W = c.w.width(), G = int64_t(rp.group_item.size());
      for (int64_t g = 0; g < G; ++g) {
        ASSERT_EQ(rp.group_position[g], rp.group_entry[g] * rp.ratio);  // RoPE at m·j
      }
      if (fwd == 0) {
        EXPECT_EQ(rp.group0,
                  rp.ratio == 4 ? std::vector<int64_t>({0, 2}) : std::vector<int64_t>({0, 0}));
      }
      std::vector<float> a(f.rows * W), s(f.rows * W), entries(std::max<int64_t>(G, 1) * kD);
      kernels::cpu::linear(rows.data(), c.w.wkv, f.rows, kH, W, a.data());
      kernels::cpu::linear(rows.data(), c.w.wgate, f.rows, kH, W, s.data());
      std::vector<uint8_t*> slots;
      for (uint64_t p : f.slots) slots.push_back(reinterpret_cast<uint8_t*>(p));
      be->v4_compress(c.w, a.data(), s.data(), slots.data(), rp.ratio == 4 ? csa_at : hca_at,
                      f.items, f.length.data(), f.row0.data(), f.new_rows.data(), rp.group0.data(),
                      entries.data(), be->stream(0));
      for (int64_t g = 0; g < G; ++g) {
        std::vector<float>& dst = (rp.ratio == 4 ? got_csa : got_hca)[rp.group_item[g]];
        ASSERT_EQ(int64_t(dst.size()), rp.group_entry[g] * kD) << "entries in order";
        dst.insert(dst.end(), entries.begin() + g * kD, entries.begin() + (g + 1) * kD);
      }
    }
    for (int b = 0; b < 2; ++b) length[b] += chunks[fwd][b];
  }
  for (int b = 0; b < 2; ++b) {
    for (const RandomCompressor* c : {&csa, &hca}) {
      std::vector<float> want((T[b] / c->w.ratio) * kD);
      kernels::cpu::v4_compress_prefill(c->w, x[b].data(), T[b], want.data());
      const std::vector<float>& got = c == &csa ? got_csa[b] : got_hca[b];
      ASSERT_EQ(got.size(), want.size()) << "item " << b << " ratio " << c->w.ratio;
      EXPECT_TRUE(want.empty() ||
                  std::memcmp(got.data(), want.data(), want.size() * sizeof(float)) == 0)
          << "item " << b << " ratio " << c->w.ratio;
    }
  }
}

// The runner's compressor stage over the paged state: two forwards of two requests (chunked
// prefill and a decode-sized step), entries RoPE'd at m·j and stored in the source's page rows;
// every stored entry equals one-shot prefill's entry rotated at m·j, bitwise, for CSA and HCA.
TEST(V4StateLayout, CompressorStageStoresRotatedPrefillEntriesInThePages) {
  const ModelPlan plan = tiny_v4_plan();
  const StateLayout layout(plan, CacheFormats::of(false), 128);
  std::unique_ptr<model::Backend> be = model::make_cpu_backend();
  const int64_t R = plan.config.qk_rope_head_dim;
  const std::vector<float> inv_freq = kernels::cpu::rope_inv_freq(R, 160000.0, nullptr);
  const std::vector<std::vector<int64_t>> chunks = {{37, 200}, {1, 58}};
  const int64_t T[2] = {38, 258}, n_pages = 3;
  std::mt19937 rng(21);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  std::vector<float> x[2];
  std::vector<int32_t> tokens[2];
  for (int b = 0; b < 2; ++b) {
    x[b].resize(T[b] * kH);
    for (float& e : x[b]) e = n01(rng);
    tokens[b].assign(T[b], 7);
  }
  const model::PoolGeometry geo = layout.geometry();
  std::vector<std::vector<float>> slot_storage(2, std::vector<float>(geo.slot_bytes / 4));
  std::vector<float> pool_storage(2 * n_pages * geo.page_bytes / 4, -7.0f);
  uint8_t* pool = reinterpret_cast<uint8_t*>(pool_storage.data());
  const std::vector<int32_t> pages[2] = {{0, 1, 2}, {5, 3, 4}};  // item 1's pages out of order
  for (const int layer : {2, 3}) {                               // CSA (ratio 4), HCA (ratio 128)
    const int64_t m = plan.layers[layer].ratio;
    const RandomCompressor c(kD, m, m == 4, 50 + layer);
    const model::Matrix wkv{c.w.wkv, model::WeightFormat::kF32, false};
    const model::Matrix wgate{c.w.wgate, model::WeightFormat::kF32, false};
    int64_t length[2] = {0, 0};
    for (const std::vector<int64_t>& chunk : chunks) {
      std::vector<model::BatchItem> batch(2);
      for (int b = 0; b < 2; ++b) {
        batch[b].request = {reinterpret_cast<uint8_t*>(slot_storage[b].data()), pages[b].data(),
                            n_pages, length[b]};
        batch[b].tokens = tokens[b].data() + length[b];
        batch[b].n = chunk[b];
      }
      const model::ForwardPlan f =
          model::plan_forward(plan, layout, batch, model::EngramTables{}, {nullptr, nullptr});
      const model::RatioPlan& rp = f.ratios[m == 4 ? 0 : 1];
      ASSERT_EQ(rp.ratio, m);
      std::vector<float> rows(f.rows * kH);
      for (int b = 0; b < 2; ++b) {
        std::copy_n(x[b].begin() + length[b] * kH, chunk[b] * kH, rows.begin() + f.row0[b] * kH);
      }
      std::vector<uint8_t*> slots;
      for (uint64_t p : f.slots) slots.push_back(reinterpret_cast<uint8_t*>(p));
      model::V4CompressorBatch in;
      in.x = rows.data(), in.rows = f.rows, in.items = f.items;
      in.groups = int64_t(rp.group_item.size());
      in.slots = slots.data(), in.length = f.length.data(), in.row0 = f.row0.data();
      in.new_rows = f.new_rows.data(), in.group0 = rp.group0.data();
      in.group_item = rp.group_item.data(), in.group_entry = rp.group_entry.data();
      in.group_position = rp.group_position.data();
      model::V4CompressorTarget out;
      out.state_offset = layout.pending_offset(layer);
      out.pages = {pool,
                   geo.page_bytes,
                   f.page_table.data(),
                   f.max_pages,
                   layout.entries_per_page(layer),
                   layout.entry_offset(layer, false),
                   layout.kv_row_bytes()};
      std::vector<float> a(f.rows * c.w.width()), s(f.rows * c.w.width());
      std::vector<float> entries(std::max<int64_t>(in.groups, 1) * kD);
      model::v4_compressor_stage(*be, c.w, wkv, wgate, in, out, R, inv_freq.data(), a.data(),
                                 s.data(), entries.data(), be->stream(0));
      for (int b = 0; b < 2; ++b) length[b] += chunk[b];
    }
    for (int b = 0; b < 2; ++b) {
      const int64_t n = T[b] / m;
      std::vector<float> want(std::max<int64_t>(n, 1) * kD);
      kernels::cpu::v4_compress_prefill(c.w, x[b].data(), T[b], want.data());
      std::vector<int64_t> pos(n);
      for (int64_t j = 0; j < n; ++j) pos[j] = j * m;
      if (n > 0)
        kernels::cpu::apply_rope(want.data(), n, 1, kD, R, pos.data(), inv_freq.data(), false);
      const int64_t per_page = layout.entries_per_page(layer);
      for (int64_t j = 0; j < n; ++j) {
        const uint8_t* row = pool + pages[b][j / per_page] * geo.page_bytes +
                             layout.entry_offset(layer, false) +
                             (j % per_page) * layout.kv_row_bytes();
        EXPECT_EQ(std::memcmp(row, want.data() + j * kD, kD * sizeof(float)), 0)
            << "layer " << layer << " item " << b << " entry " << j;
      }
    }
  }
}

// HCA attends every visible entry through a selection list whose width is the attention kernel's
// key count, and the CUDA kernel splits its keys over blocks by that count. A decode batch run
// eagerly must hand it the width its bucket's graph was captured with, or graph and eager differ
// in summation order (seen on an H100: 5e-6 at prompt 37 of test_v4_cuda). Prefill chunks get the
// width of their longest item's context bucket too, which covers every entry they can see.
TEST(V4StateLayout, HcaSelectionWidthOfAnEagerDecodeIsItsGraphBuckets) {
  const ModelPlan plan = tiny_v4_plan();
  const StateLayout layout(plan, CacheFormats::of(false), 128);
  std::vector<std::vector<float>> slot_storage(
      3, std::vector<float>(layout.geometry().slot_bytes / 4));
  const std::vector<int32_t> pages = {0, 1, 2, 3, 4};
  const std::vector<int32_t> tokens(600, 7);
  auto plan_of = [&](const std::vector<int64_t>& lengths, const std::vector<int64_t>& n) {
    std::vector<model::BatchItem> batch(lengths.size());
    for (size_t b = 0; b < batch.size(); ++b) {
      batch[b].request.slot = reinterpret_cast<uint8_t*>(slot_storage[b].data());
      batch[b].request.pages = pages.data();
      batch[b].request.n_pages = 5;
      batch[b].request.length = lengths[b];
      batch[b].tokens = tokens.data();
      batch[b].n = n[b];
    }
    std::vector<const int32_t*> histories(batch.size(), nullptr);
    return std::pair(batch,
                     model::plan_forward(plan, layout, batch, model::EngramTables{}, histories));
  };
  for (const std::vector<int64_t>& lengths :
       {std::vector<int64_t>{36}, {255, 40}, {300, 40, 511}}) {
    const auto [batch, f] = plan_of(lengths, std::vector<int64_t>(lengths.size(), 1));
    const model::DecodeBucket bucket = model::decode_bucket(plan.config, batch);
    ASSERT_GT(bucket.items, 0);
    const model::ForwardPlan padded = model::pad_decode_plan(f, plan.config, layout, bucket);
    for (int ratio : {4, 128}) {
      EXPECT_EQ(f.ratio(ratio).visible_width, padded.ratio(ratio).max_count)
          << "ratio " << ratio << ", longest " << lengths.back();
      EXPECT_EQ(padded.ratio(ratio).visible_width, padded.ratio(ratio).max_count);
      EXPECT_GE(f.ratio(ratio).visible_width, f.ratio(ratio).max_count);
    }
  }
  // A prefill chunk: its longest item's context bucket (600 positions -> 1024) over the ratio.
  const auto [batch, f] = plan_of({0, 100}, {600, 5});
  EXPECT_EQ(f.ratio(128).visible_width, 1024 / 128);
  EXPECT_GE(f.ratio(128).visible_width, f.ratio(128).max_count);
}

}  // namespace
}  // namespace dsv41rt
