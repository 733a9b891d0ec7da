// Tensor-parallel shares of weights loaded without host values (what a device backend uploads):
// each share's stored bytes decode to exactly the rows the host-value share holds, in every stored
// format of the tiny checkpoint (FP8 blocks, BF16, FP32); a share that would cut an FP8 scale
// block is refused with the tensor's name.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "core/safetensors.h"
#include "core/status.h"
#include "executor_test_util.h"
#include "runtime/model/weights.h"

namespace dsv41rt::model {
namespace {

TEST(WeightsShard, ViewSharesDecodeToTheHostValueShares) {
  NEED_CHECKPOINT();
  const std::string dir = testing::checkpoint();
  const ModelPlan plan = build_model_plan(load_model_config(dir));
  auto ck = std::make_shared<Checkpoint>(dir);
  for (const int P : {2, 4}) {
    if (plan.config.num_attention_heads % P != 0) continue;
    for (int r = 0; r < P; ++r) {
      SCOPED_TRACE("rank " + std::to_string(r) + " of " + std::to_string(P));
      const ModelWeights host = tensor_shard(load_weights(ck, plan, true), plan, r, P);
      const ModelWeights view = tensor_shard(load_weights(ck, plan, false), plan, r, P);
      auto same = [](const Tensor& h, const Tensor& v, const std::string& what) {
        ASSERT_TRUE(v.data.empty()) << what;
        EXPECT_EQ(h.shape, v.shape) << what;
        EXPECT_EQ(v.source.rows, v.shape[0]) << what;
        EXPECT_TRUE(testing::bitwise_equal(host_values(v), h.data)) << what;
        EXPECT_EQ(h.source.data, v.source.data) << what << ": both view the same stored rows";
      };
      same(host.head, view.head, "head");
      for (size_t l = 0; l < plan.layers.size(); ++l) {
        const AttentionWeights &h = host.layers[l].attn, &v = view.layers[l].attn;
        const std::string at = " of layer " + std::to_string(l);
        same(h.wq_b, v.wq_b, "wq_b" + at);
        same(h.attn_sink, v.attn_sink, "attn_sink" + at);
        same(h.wo_a, v.wo_a, "wo_a" + at);
      }
    }
  }
}

TEST(WeightsShard, ASplitThroughAnFp8ScaleBlockIsRefused) {
  NEED_CHECKPOINT();
  const std::string dir = testing::checkpoint();
  const ModelPlan plan = build_model_plan(load_model_config(dir));
  ModelWeights w = load_weights(std::make_shared<Checkpoint>(dir), plan, false);
  const TensorSource& s = w.layers[0].attn.wq_b.source;
  ASSERT_EQ(s.dtype, DType::kFP8E4M3) << "the tiny checkpoint stores wq_b FP8";
  // Cut each layer's wq_b to one block row plus one row: a 2-way share is not block-aligned.
  const int64_t rows = s.block_rows + 2;
  for (BlockWeights& b : w.layers) b.attn.wq_b.shape[0] = rows, b.attn.wq_b.source.rows = rows;
  try {
    (void)tensor_shard(std::move(w), plan, 1, 2);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("attn.wq_b rows ["), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("scale blocks"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dsv41rt::model
