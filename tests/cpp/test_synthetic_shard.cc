// Synthetic weights loaded lazily (open_checkpoint SyntheticLoad::kLazy, synthetic_weights.h): a
// rank generates only the rows it keeps. The fixture turns the tiny checkpoint
// (DSV41RT_TEST_CHECKPOINT, tiny-v41) into a synthetic one: every quantised matrix of at least
// 1024 elements (experts, attention matrices, the head, Engram tables) is left out of its file and
// listed in the manifest. The eager load (every listed tensor generated in full into the
// Checkpoint, as the Python reader sees it) is the reference:
//  - under TP 2 x EP 2 each rank's shard generates exactly its own rows (counted by
//    synthetic_bytes_generated), less than the whole model, and those rows equal the eager
//    tensor's rows byte for byte, as do their FP32 host values;
//  - executors of the lazy load (one rank; TP 2 x EP 2 LocalComm virtual ranks) give the eager
//    load's logits bitwise, and the group generates the sum of its ranks' shares only;
//  - a bad manifest (wrong shape, wrong storage, a tensor missing, one both stored and listed) is
//    refused naming the tensor.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/safetensors.h"
#include "core/status.h"
#include "executor_test_util.h"
#include "held_request.h"
#include "runtime/model/checkpoint_validation.h"
#include "runtime/model/engram_tables.h"
#include "runtime/model/executor.h"
#include "runtime/model/synthetic_weights.h"
#include "runtime/model/weights.h"

namespace dsv41rt::model {
namespace {

namespace fs = std::filesystem;
using dsv41rt::testing::bitwise_equal;

constexpr int64_t kMinNumel = 1024;
constexpr int kP = 2;  // TP 2 x EP 2: two ranks, each a tensor and an expert shard

struct Entry {
  std::string name, scale, storage;
  int64_t rows, cols, block_rows, block_cols, exponent;
};

std::string manifest_json(int64_t seed, const std::vector<Entry>& entries) {
  std::ostringstream o;
  o << "{\"seed\": " << seed << ", \"tensors\": [";
  for (size_t i = 0; i < entries.size(); ++i) {
    const Entry& e = entries[i];
    o << (i ? ", " : "") << "{\"name\": \"" << e.name << "\", \"scale\": \"" << e.scale
      << "\", \"storage\": \"" << e.storage << "\", \"rows\": " << e.rows
      << ", \"cols\": " << e.cols << ", \"block_rows\": " << e.block_rows
      << ", \"block_cols\": " << e.block_cols << ", \"scale_exponent\": " << e.exponent << "}";
  }
  o << "]}\n";
  return o.str();
}

void write_text(const fs::path& p, const std::string& s) {
  std::ofstream(p, std::ios::binary) << s;
}

// A safetensors file of `names` copied from `ck`.
void write_safetensors(const Checkpoint& ck, const std::vector<std::string>& names,
                       const fs::path& path) {
  std::ostringstream h;
  h << "{";
  uint64_t offset = 0;
  for (size_t i = 0; i < names.size(); ++i) {
    const TensorInfo& t = ck.info(names[i]);
    h << (i ? "," : "") << "\"" << t.name << "\":{\"dtype\":\"" << safetensors_name(t.dtype)
      << "\",\"shape\":[";
    for (size_t d = 0; d < t.shape.size(); ++d) h << (d ? "," : "") << t.shape[d];
    h << "],\"data_offsets\":[" << offset << "," << offset + t.nbytes << "]}";
    offset += t.nbytes;
  }
  h << "}";
  std::string header = h.str();
  header.append((8 - header.size() % 8) % 8, ' ');
  std::ofstream out(path, std::ios::binary);
  const uint64_t n = header.size();
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << header;
  for (const std::string& name : names) {
    out.write(reinterpret_cast<const char*>(ck.tensor_data(name)),
              std::streamsize(ck.info(name).nbytes));
  }
}

// The tiny checkpoint with its quantised matrices of >= kMinNumel elements made synthetic.
struct SyntheticDir {
  fs::path dir;
  std::vector<Entry> entries;

  SyntheticDir() {
    const fs::path src = dsv41rt::testing::checkpoint();
    dir = fs::temp_directory_path() / ("dsv41rt_synthetic_shard_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
    for (const char* f : {"config.json", "engram_tables.st"}) fs::copy_file(src / f, dir / f);
    const ModelPlan plan = build_model_plan(load_model_config(src.string()));
    const TensorSpec spec = build_tensor_spec(plan);
    std::vector<std::string> left_out;
    for (const LogicalTensor& t : spec.logical) {
      const bool fp8 = t.storage == WeightStorage::kFP8, fp4 = t.storage == WeightStorage::kFP4;
      if (!spec.quantized || !(fp8 || fp4) || t.shape.size() != 2 ||
          t.shape[0] * t.shape[1] < kMinNumel) {
        continue;
      }
      // A scale near 1/sqrt(cols) keeps the activations finite.
      const int64_t e = -int64_t(std::lround(0.5 * std::log2(double(t.shape[1])))) - 1;
      entries.push_back({t.name, scale_name(t.name), fp8 ? "fp8" : "fp4", t.shape[0], t.shape[1],
                         fp8 ? t.block_rows : 1, fp8 ? t.block_cols : 32, e});
      left_out.push_back(t.name);
      left_out.push_back(scale_name(t.name));
    }
    Checkpoint ck(src.string());
    std::vector<std::string> kept;
    for (const std::string& n : ck.names()) {
      if (std::find(left_out.begin(), left_out.end(), n) == left_out.end()) kept.push_back(n);
    }
    write_safetensors(ck, kept, dir / "model.safetensors");
    write_manifest(entries);
  }
  ~SyntheticDir() { fs::remove_all(dir); }
  void write_manifest(const std::vector<Entry>& es) const {
    write_text(dir / kSyntheticManifest, manifest_json(11, es));
  }
  std::string path() const { return dir.string(); }
};

// Visits every tensor of `w` with a name (experts, attention and MoE matrices, the head).
void for_each_tensor(const ModelWeights& w, const std::function<void(const Tensor&)>& f) {
  for (const Tensor* t : {&w.embed, &w.head, &w.norm}) f(*t);
  for (const BlockWeights& b : w.layers) {
    const AttentionWeights& a = b.attn;
    for (const Tensor* t : {&a.wq_a, &a.wq_b, &a.wkv, &a.wo_a, &a.wo_b, &a.comp_wkv, &a.comp_wgate,
                            &a.idx_wq_b, &a.idx_weights_proj, &a.idx_wk}) {
      f(*t);
    }
    const MoeWeights& m = b.moe;
    for (const Tensor* t : {&m.gate, &m.shared_w1, &m.shared_w2, &m.shared_w3}) f(*t);
    for (const std::vector<Tensor>* ts : {&m.w1, &m.w2, &m.w3}) {
      for (const Tensor& t : *ts) f(t);
    }
    if (b.engram) f(b.engram->wkv);
  }
}

// Code bytes of the lazy synthetic rows `w` holds, and of its lazy Engram tables.
int64_t lazy_bytes(const ModelWeights& w) {
  int64_t n = 0;
  for_each_tensor(w, [&](const Tensor& t) {
    if (t.source.lazy()) n += t.source.rows * t.source.synthetic->row_bytes();
  });
  for (const BlockWeights& b : w.layers) {
    if (b.engram && b.engram->synthetic) {
      n += b.engram->synthetic->rows * b.engram->synthetic->row_bytes();
    }
  }
  return n;
}

ModelWeights rank_shard(const ModelWeights& all, const ModelPlan& plan, int r) {
  return tensor_shard(expert_shard(all, plan, r, kP), plan, r, kP);
}

class SyntheticShard : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!dsv41rt::testing::checkpoint()) {
      GTEST_SKIP() << "set DSV41RT_TEST_CHECKPOINT to a tiny-v41 checkpoint";
    }
    dir_ = std::make_unique<SyntheticDir>();
    ASSERT_FALSE(dir_->entries.empty());
  }
  std::unique_ptr<SyntheticDir> dir_;
};

TEST_F(SyntheticShard, EachRankGeneratesItsRowsOnlyAndTheyEqualTheWholeTensors) {
  const OpenedCheckpoint eager = open_checkpoint(dir_->path());
  const OpenedCheckpoint lazy = open_checkpoint(dir_->path(), true, SyntheticLoad::kLazy);
  ASSERT_EQ(eager.synthetic, nullptr);
  ASSERT_NE(lazy.synthetic, nullptr);
  EXPECT_EQ(lazy.synthetic->tensors.size(), dir_->entries.size());
  EXPECT_EQ(lazy.tensors->size() + 2 * dir_->entries.size(), eager.tensors->size());
  const ModelPlan& plan = lazy.plan;

  // Loading generates nothing; every listed matrix is lazy.
  const int64_t before_load = synthetic_bytes_generated();
  const ModelWeights all = load_weights(lazy.tensors, plan, true, {}, false, lazy.synthetic);
  const ModelWeights want = load_weights(eager.tensors, plan, true);
  EXPECT_EQ(synthetic_bytes_generated(), before_load);
  const int64_t whole = lazy_bytes(all);
  int64_t listed = 0, drafts = 0;  // the DSpark stages (mtp.*) load with drafts only
  for (const SyntheticTensor& t : lazy.synthetic->tensors) {
    (t.name.rfind("mtp.", 0) == 0 ? drafts : listed) += t.rows * t.row_bytes();
  }
  EXPECT_EQ(whole, listed) << "every listed backbone tensor is loaded lazily";
  {  // With the drafter (one rank): every listed tensor, its values the eager load's.
    ModelWeights with = load_weights(lazy.tensors, plan, true, {}, true, lazy.synthetic);
    const ModelWeights ref = load_weights(eager.tensors, plan, true, {}, true);
    ASSERT_GT(drafts, 0);
    EXPECT_EQ(materialize_host_values(with), listed + drafts);
    EXPECT_TRUE(bitwise_equal(with.drafts->main_proj.data, ref.drafts->main_proj.data));
    EXPECT_TRUE(bitwise_equal(with.drafts->markov_head.data, ref.drafts->markov_head.data));
    EXPECT_TRUE(
        bitwise_equal(with.drafts->stages[0].moe.w1[0].data, ref.drafts->stages[0].moe.w1[0].data));
  }

  int64_t ranks_total = 0;
  for (int r = 0; r < kP; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    ModelWeights mine = rank_shard(all, plan, r);
    const ModelWeights ref = rank_shard(want, plan, r);
    const int64_t share = lazy_bytes(mine);
    EXPECT_LT(share, whole);
    // The narrowed rows' codes equal the eager tensor's rows byte for byte.
    int64_t checked = 0;
    for_each_tensor(mine, [&](const Tensor& t) {
      if (!t.source.lazy()) return;
      const SyntheticTensor& s = *t.source.synthetic;
      const std::vector<uint8_t> got = synthetic_codes(t.source);
      const uint8_t* whole_codes = eager.tensors->tensor_data(s.name);
      ASSERT_EQ(got.size(), size_t(t.source.rows * s.row_bytes())) << s.name;
      EXPECT_EQ(
          std::memcmp(got.data(), whole_codes + t.source.synthetic_row * s.row_bytes(), got.size()),
          0)
          << s.name << " rows from " << t.source.synthetic_row;
      ++checked;
    });
    EXPECT_GT(checked, 0);
    // What the CPU backend keeps: this rank's rows, generated once, as the eager shard's values.
    const int64_t before = synthetic_bytes_generated();
    EXPECT_EQ(materialize_host_values(mine), share);
    EXPECT_EQ(synthetic_bytes_generated() - before, share);
    ranks_total += share;
    std::vector<const Tensor*> got, exp;
    for_each_tensor(mine, [&](const Tensor& t) { got.push_back(&t); });
    for_each_tensor(ref, [&](const Tensor& t) { exp.push_back(&t); });
    ASSERT_EQ(got.size(), exp.size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_TRUE(bitwise_equal(got[i]->data, exp[i]->data)) << "tensor " << i;
    }
    for (size_t l = 0; l < plan.layers.size(); ++l) {
      if (!mine.layers[l].engram) continue;
      const EngramWeights &e = *mine.layers[l].engram, &f = *ref.layers[l].engram;
      ASSERT_TRUE(e.table && f.table);
      const int64_t hd = plan.config.engram->head_dim;
      EXPECT_EQ(std::memcmp(e.table, f.table, size_t(e.rows * hd)), 0) << "Engram layer " << l;
      EXPECT_EQ(std::memcmp(e.table_scale, f.table_scale, size_t(e.rows * (hd / 32))), 0);
    }
  }
  EXPECT_LT(ranks_total, kP * whole) << "the ranks do not each generate the whole model";
}

TEST_F(SyntheticShard, LazyExecutorsGiveTheEagerLogitsAndTheGroupGeneratesItsSharesOnly) {
  const OpenedCheckpoint eager = open_checkpoint(dir_->path());
  const OpenedCheckpoint lazy = open_checkpoint(dir_->path(), true, SyntheticLoad::kLazy);
  const ModelPlan& plan = lazy.plan;
  const EngramTables tables = load_engram_tables(dir_->path(), plan.config);
  const ModelWeights all = load_weights(lazy.tensors, plan, true, {}, false, lazy.synthetic);
  const std::vector<int32_t> p = dsv41rt::testing::prompt(29);
  for (const int64_t size : {1, kP}) {
    SCOPED_TRACE("tp = ep = " + std::to_string(size));
    ExecutorOptions o;
    o.kv_memory = 64ll << 20, o.max_num_seqs = 2, o.tp_size = size, o.ep_size = size;
    auto want_exec = make_executor(plan, load_weights(eager.tensors, plan, true), tables, o);
    int64_t expected = 0;
    for (int r = 0; r < size; ++r) {
      expected += lazy_bytes(size == 1 ? all : rank_shard(all, plan, r));
    }
    const int64_t before = synthetic_bytes_generated();
    auto got_exec = make_executor(plan, all, tables, o);
    EXPECT_EQ(synthetic_bytes_generated() - before, expected);
    dsv41rt::testing::Held a(*want_exec), b(*got_exec);
    const std::vector<float> want = a.run(p), got = b.run(p);
    bool finite = true;
    for (float v : want) finite = finite && std::isfinite(v);
    EXPECT_TRUE(finite) << "the fixture's scales keep the logits finite";
    EXPECT_TRUE(bitwise_equal(got, want));
  }
}

#if DSV41RT_WITH_CUDA
// The CUDA upload of the lazy load: each rank's rows generated on the device straight into its
// weight buffers (Engram tables on the device, or with engram_host_memory into pinned host memory
// by the CPU reference): the same device bytes as the eager load's, so the same logits bitwise.
// (Named BackendCuda*: scripts/test.sh's skip policy expects it to skip without a device.)
class BackendCudaSyntheticShard : public SyntheticShard {};

TEST_F(BackendCudaSyntheticShard, UploadGeneratesEachRanksRowsOnTheDevice) {
  if (cuda_device_count() == 0) {
    if (const char* v = std::getenv("DSV41RT_REQUIRE_CUDA"); v && std::string(v) == "1") {
      FAIL() << "DSV41RT_REQUIRE_CUDA=1 but no CUDA device";
    }
    GTEST_SKIP() << "no CUDA device visible";
  }
  const OpenedCheckpoint eager = open_checkpoint(dir_->path());
  const OpenedCheckpoint lazy = open_checkpoint(dir_->path(), true, SyntheticLoad::kLazy);
  const ModelPlan& plan = lazy.plan;
  const EngramTables tables = load_engram_tables(dir_->path(), plan.config);
  const ModelWeights all = load_weights(lazy.tensors, plan, false, {}, false, lazy.synthetic);
  const std::vector<int32_t> p = dsv41rt::testing::prompt(29);
  for (const int64_t size : {1, kP}) {
    for (const bool engram_host : {false, true}) {
      SCOPED_TRACE("tp = ep = " + std::to_string(size) + ", engram_host_memory " +
                   std::to_string(engram_host));
      ExecutorOptions o;
      o.device = "cuda:0";
      o.kv_memory = 64ll << 20, o.max_num_seqs = 2, o.tp_size = size, o.ep_size = size;
      o.engram_host_memory = engram_host;
      auto want_exec = make_executor(plan, load_weights(eager.tensors, plan, false), tables, o);
      int64_t expected = 0;
      for (int r = 0; r < size; ++r) {
        expected += lazy_bytes(size == 1 ? all : rank_shard(all, plan, r));
      }
      const int64_t before = synthetic_bytes_generated();
      auto got_exec = make_executor(plan, all, tables, o);
      EXPECT_EQ(synthetic_bytes_generated() - before, expected);
      dsv41rt::testing::Held a(*want_exec), b(*got_exec);
      const std::vector<float> want = a.run(p), got = b.run(p);
      EXPECT_TRUE(bitwise_equal(got, want));
    }
  }
}
#endif

// Opening the directory lazily fails naming `name` and `text`.
void expect_refused(const std::string& dir, const std::string& name, const std::string& text) {
  try {
    (void)open_checkpoint(dir, true, SyntheticLoad::kLazy);
    ADD_FAILURE() << "opened; expected an error naming " << name;
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(name), std::string::npos) << what;
    EXPECT_NE(what.find(text), std::string::npos) << what;
  }
}

TEST_F(SyntheticShard, ABadManifestIsRefusedNamingTheTensor) {
  const std::vector<Entry> good = dir_->entries;
  std::vector<Entry> es = good;
  es[0].rows += 1;  // wrong shape
  dir_->write_manifest(es);
  expect_refused(dir_->path(), es[0].name, "shape");
  es = good;
  Entry& swapped =
      *std::find_if(es.begin(), es.end(), [](const Entry& e) { return e.cols % 32 == 0; });
  swapped.storage = swapped.storage == "fp8" ? "fp4" : "fp8";  // wrong storage
  swapped.block_rows = swapped.block_cols = 32;
  dir_->write_manifest(es);
  expect_refused(dir_->path(), swapped.name, "dtype");
  es = good;
  es[0].storage = "fp16";
  dir_->write_manifest(es);
  expect_refused(dir_->path(), es[0].name, "storage must be");
  es = good;
  const std::string dropped = es.back().name;
  es.pop_back();  // missing tensor
  dir_->write_manifest(es);
  expect_refused(dir_->path(), dropped, "missing tensor");
  // A tensor the file stores listed too.
  const std::string stored = "layers.0.attn_norm.weight";
  es = good;
  es.push_back({stored, stored + ".scale_x", "fp8", 1, 1024, 1, 128, 0});
  dir_->write_manifest(es);
  expect_refused(dir_->path(), stored, "both stored in");
  dir_->write_manifest(good);
  EXPECT_NO_THROW((void)open_checkpoint(dir_->path(), true, SyntheticLoad::kLazy));
}

}  // namespace
}  // namespace dsv41rt::model
