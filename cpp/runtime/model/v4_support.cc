#include "runtime/model/v4_support.h"

#include "core/status.h"
#include "runtime/model/cache_bytes.h"

namespace dsv41rt::model {

void check_v4_backend(const ModelPlan& plan, const std::string& device, bool has_v4_ops) {
  DSV41RT_CHECK_CODE(kUnsupported, plan.config.is_v41() || has_v4_ops, plan.config.source, ": the ",
                     device,
                     " backend has no DeepSeek-V4 ops (v4_compress, moe_route_hash, hc_head_pre, "
                     "visible_entries); DeepSeek-V4 runs on the cpu and cuda backends (fp32)");
}

void check_v4_options(const ModelPlan& plan, const ExecutorOptions& o) {
  const ModelConfig& c = plan.config;
  if (c.is_v41()) return;
  const std::string& src = c.source;
  DSV41RT_CHECK_CODE(kInvalidArgument, o.page_tokens % kV4PageMultiple == 0, src, ": page_size ",
                     o.page_tokens, " is not a multiple of ", kV4PageMultiple,
                     " (DeepSeek-V4's HCA compresses groups of 128 positions; use 128)");
  // The 584-byte rows hold head_dim 512 / qk_rope_head_dim 64 only (names them otherwise).
  if (o.cache_quant) CacheFormats::of(c, true);
  DSV41RT_CHECK_CODE(kUnsupported, o.precision == "fp32", src, ": precision ", o.precision,
                     " is not built for DeepSeek-V4 (fp32 only)");
}

}  // namespace dsv41rt::model
