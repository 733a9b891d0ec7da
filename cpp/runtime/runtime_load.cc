// Loading for the Runtime facade: options checked (errors name the option as docs/options.md
// spells it), the checkpoint's config parsed into a plan, the checkpoint opened and every tensor
// validated once, the Engram inputs read from engram_tables.st, the executor built for the device.
#include "runtime/runtime_load.h"

#include <cmath>

#include "core/safetensors.h"
#include "core/status.h"
#include "runtime/model/checkpoint_validation.h"
#include "runtime/model/engram_tables.h"
#include "runtime/model/layer_plan.h"
#include "runtime/model/model_config.h"
#include "runtime/model/v4_support.h"
#include "runtime/model/weights.h"

namespace dsv41rt {
namespace {

void check_options(const RuntimeOptions& o) {
  DSV41RT_CHECK(!o.checkpoint.empty(), "checkpoint: no checkpoint directory given");
  const PoolOptions& p = o.pool;
  DSV41RT_CHECK(p.kv_memory > 0, "kv_memory must be positive, got ", p.kv_memory);
  DSV41RT_CHECK(p.max_num_seqs >= 1, "max_num_seqs must be >= 1, got ", p.max_num_seqs);
  DSV41RT_CHECK(p.max_num_batched_tokens >= 1, "max_num_batched_tokens must be >= 1, got ",
                p.max_num_batched_tokens);
  DSV41RT_CHECK(p.max_model_len >= 0, "max_model_len must be >= 0 (0: what the pool holds), got ",
                p.max_model_len);
  DSV41RT_CHECK(p.page_size >= 1, "page_size must be >= 1, got ", p.page_size);
  DSV41RT_CHECK(p.max_prefill_tokens_while_decoding >= 0,
                "max_prefill_tokens_while_decoding must be >= 0 (0: no cap), got ",
                p.max_prefill_tokens_while_decoding);
  DSV41RT_CHECK(std::isfinite(p.max_decode_slowdown) &&
                    (p.max_decode_slowdown == 0 || p.max_decode_slowdown >= 1),
                "max_decode_slowdown must be a finite number >= 1 (0: off), got ",
                p.max_decode_slowdown);
  DSV41RT_CHECK(p.host_cache_memory >= 0, "host_cache_memory must be >= 0 (0: off), got ",
                p.host_cache_memory);
  DSV41RT_CHECK(o.num_speculative_tokens >= -1,
                "speculative-config: num_speculative_tokens must be >= 0 (or -1: self-tuned up to "
                "the drafter's block), got ",
                o.num_speculative_tokens);
  DSV41RT_CHECK(o.speculative_disable_by_batch_size >= 0,
                "speculative-config: disable_by_batch_size must be >= 1 (0: never), got ",
                o.speculative_disable_by_batch_size);
  const ParallelOptions& c = o.parallel;
  DSV41RT_CHECK(c.context_parallel_size >= 1 && c.context_parallel_size <= 64,
                "context_parallel_size ", c.context_parallel_size, " must be in [1, 64]");
  DSV41RT_CHECK(c.expert_parallel_size >= 1 && c.expert_parallel_size <= 64,
                "expert_parallel_size ", c.expert_parallel_size, " must be in [1, 64]");
  DSV41RT_CHECK(c.tensor_parallel_size >= 1 && c.tensor_parallel_size <= 64,
                "tensor_parallel_size ", c.tensor_parallel_size, " must be in [1, 64]");
}

const char* backend_name(CpBackend b) {
  switch (b) {
    case CpBackend::kLocal:
      return "local";
    case CpBackend::kNccl:
      return "nccl";
    case CpBackend::kSocket:
      return "socket";
  }
  return "?";
}

// DeepSeek-V4: speculation is refused by name (rollback of V4 slots is built, state_undo_v4.cc;
// the engine's drafter is V4.1's DSpark, speculation with V4's MTP layer is not built, and
// draft_source is not tested on V4);
// load_drafter loads the MTP layer (spec 4.3; its logits in Decisions, cpu only, no parallelism).
// The executor checks the rest (model/v4_support.h). The prefix cache copies whole slots and
// pages, V4's compressor state (and the MTP's ring) included (docs/design/v4.md step 6).
void check_v4_runtime(const RuntimeOptions& o, const ModelPlan& plan) {
  const std::string& src = plan.config.source;
  DSV41RT_CHECK_CODE(kUnsupported, o.num_speculative_tokens == 0 && !o.draft_source, src,
                     ": speculative decoding is not built for DeepSeek-V4 yet (the engine drafts "
                     "with V4.1's DSpark; speculation with V4's MTP layer is not built)");
  if (!o.load_drafter) return;
  const ParallelOptions& par = o.parallel;
  DSV41RT_CHECK_CODE(kUnsupported, !plan.draft_layers.empty(), "load_drafter: ", src,
                     " has no MTP layer (num_nextn_predict_layers = 0)");
  DSV41RT_CHECK_CODE(kUnsupported,
                     o.device.device == "cpu" && par.tensor_parallel_size == 1 &&
                         par.expert_parallel_size == 1 && par.context_parallel_size == 1,
                     "load_drafter: V4's MTP layer runs on the cpu backend without parallelism "
                     "only (device ",
                     o.device.device, ")");
  // The MTP's ring row of a position depends on the token after it, which a request sharing a
  // cached prefix need not share.
  DSV41RT_CHECK_CODE(kUnsupported, !o.pool.enable_prefix_caching,
                     "load_drafter: V4's MTP layer runs without the prefix cache (its ring row at "
                     "a cached prefix's end reads the token after it); set "
                     "enable_prefix_caching false");
}

// V4 pages hold whole HCA groups: the default page size (64) becomes 128 for a V4 checkpoint;
// another size that is not a multiple of 128 is an error (model/v4_support.h).
int64_t page_tokens(const RuntimeOptions& o, const ModelPlan& plan) {
  const bool default_size = o.pool.page_size == PoolOptions{}.page_size;
  return !plan.config.is_v41() && default_size ? model::kV4PageMultiple : o.pool.page_size;
}

model::ExecutorOptions executor_options(const RuntimeOptions& o) {
  model::ExecutorOptions e;
  e.cache_quant = o.numerics.kv_cache_dtype == KvCacheDtype::kAuto;
  e.precision = o.numerics.precision == Precision::kBf16  ? "bf16"
                : o.numerics.precision == Precision::kFp8 ? "fp8"
                                                          : "fp32";
  e.record_decisions = o.record_decisions;
  e.kv_memory = o.pool.kv_memory;
  e.max_num_seqs = o.pool.max_num_seqs;
  e.page_tokens = o.pool.page_size;
  e.max_num_batched_tokens = o.pool.max_num_batched_tokens;
  e.max_model_len = o.pool.max_model_len;
  e.device = o.device.device;
  e.multistream = o.device.multistream;
  e.engram_host_memory = o.device.engram_host_memory;
  e.cuda_graphs = !o.device.enforce_eager;
  e.cp_size = o.parallel.context_parallel_size;
  e.cp_comm = backend_name(o.parallel.context_parallel_backend);
  e.cp_rank = o.parallel.rank;
  e.cp_id = o.parallel.group_id;
  e.cp_workers = o.parallel.worker_threads;
  e.ep_size = o.parallel.expert_parallel_size;
  e.tp_size = o.parallel.tensor_parallel_size;
  return e;
}

}  // namespace

LoadedModel load_model(const RuntimeOptions& o) {
  check_options(o);
  // Every tensor is checked against the config's spec here, so a mismatch lists all problems
  // at once (the loader below re-checks only the tensors it reads, as it reads them).
  // Synthetic tensors stay descriptors until a backend takes its rank's rows (parallelism.md).
  OpenedCheckpoint opened = open_checkpoint(o.checkpoint, /*validate=*/true, SyntheticLoad::kLazy);
  ModelPlan plan = std::move(opened.plan);
  std::shared_ptr<Checkpoint> ck = std::move(opened.tensors);
  // Before any weight is read: what V4 cannot run with yet (docs/design/v4.md).
  if (!plan.config.is_v41()) check_v4_runtime(o, plan);
  model::EngramTables tables = o.engram_tables.empty()
                                   ? model::load_engram_tables(o.checkpoint, plan.config)
                                   : model::load_engram_tables_file(o.engram_tables, plan.config);
  // The CPU backend computes from FP32 host copies; the CUDA backend dequantises the stored
  // tensors on the device (a released checkpoint does not fit in host memory as FP32).
  // Speculation drafts with DSpark: the drafter is loaded for it.
  const bool drafter = o.load_drafter || (o.num_speculative_tokens != 0 && !o.draft_source);
  DSV41RT_CHECK(!o.draft_source || o.num_speculative_tokens > 0,
                "draft_source: give num_speculative_tokens > 0 (the drafts' count per step), got ",
                o.num_speculative_tokens);
  DSV41RT_CHECK(!o.forced_acceptance || o.num_speculative_tokens > 0,
                "forced_acceptance: give num_speculative_tokens > 0 (the drafts' count per step), "
                "got ",
                o.num_speculative_tokens);
  const char* asker = o.load_drafter ? "load_drafter" : "speculative-config (method dspark)";
  // Speculation runs with context parallelism in this process (its verify forwards run whole on
  // every rank: model/cp_executor.cc); not under tensor / expert parallelism (the drafter reads
  // the whole head) nor with one process per rank.
  const ParallelOptions& par = o.parallel;
  const bool speculation_fits =
      par.tensor_parallel_size == 1 && par.expert_parallel_size == 1 &&
      (par.context_parallel_size == 1 ||
       (par.rank < 0 && !par.worker_threads && par.context_parallel_backend != CpBackend::kSocket));
  if (drafter) {
    // V4's MTP layer loads the same way (check_v4_runtime allowed it).
    DSV41RT_CHECK_CODE(kInvalidArgument,
                       (plan.config.dspark || !plan.config.is_v41()) && !plan.draft_layers.empty(),
                       asker, ": ", o.checkpoint, " has no DSpark drafter");
    DSV41RT_CHECK_CODE(kUnsupported, speculation_fits, asker,
                       ": the drafter is not built for tensor or expert parallelism or one "
                       "process per context-parallel rank");
  }
  if (o.draft_source) {
    DSV41RT_CHECK_CODE(kUnsupported, speculation_fits,
                       "draft_source: speculation is not built for tensor or expert parallelism "
                       "or one process per context-parallel rank");
  }
  model::ModelWeights weights =
      model::load_weights(ck, plan, /*host_values=*/o.device.device == "cpu", o.progress,
                          /*drafts=*/drafter, opened.synthetic);
  LoadedModel m;
  m.engine.speculation.num_speculative_tokens =
      o.num_speculative_tokens < 0 ? plan.config.dspark->block_size : o.num_speculative_tokens;
  m.engine.speculation.self_tuning = o.num_speculative_tokens < 0;
  m.engine.speculation.disable_by_batch_size = o.speculative_disable_by_batch_size;
  m.engine.speculation.draft_source = o.draft_source;
  m.engine.speculation.forced_acceptance = o.forced_acceptance;
  m.engine.max_num_seqs = o.pool.max_num_seqs;
  m.engine.max_num_batched_tokens = o.pool.max_num_batched_tokens;
  m.engine.max_model_len = o.pool.max_model_len;
  m.engine.max_prefill_tokens_while_decoding = o.pool.max_prefill_tokens_while_decoding;
  m.engine.max_decode_slowdown = o.pool.max_decode_slowdown;
  m.engine.enable_prefix_caching = o.pool.enable_prefix_caching;
  // A worker rank (rank > 0 of a group of processes) replays rank 0's calls: the host tier lives in
  // rank 0's engine, whose state copies reach the worker through the group's channel.
  m.engine.host_cache_bytes = o.parallel.rank > 0 ? 0 : o.pool.host_cache_memory;
  model::ExecutorOptions e = executor_options(o);
  e.page_tokens = page_tokens(o, plan);
  m.executor =
      model::make_executor(std::move(plan), std::move(weights), std::move(tables), std::move(e));
  return m;
}

}  // namespace dsv41rt
