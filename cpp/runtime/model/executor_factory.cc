// Executor selection by device name (the only place that knows both backends).
#include <string>

#include "runtime/model/executor.h"
#include "runtime/status.h"
#if DSV41RT_WITH_CUDA
#include "runtime/model/cuda_executor.h"
#endif

namespace dsv41rt::model {

void Executor::set_backend_option(const std::string& name, bool) {
  DSV41RT_THROW_CODE(kUnsupported, "backend option '", name, "' does not apply to the ", device(),
                     " executor");
}

void check_copy_state(const engine::KvPool& pool, const RequestView& src, const RequestView& dst) {
  const int64_t pages = pool.pages_for(src.length);
  DSV41RT_CHECK(src.slot && dst.slot && src.slot != dst.slot,
                "copy_state: need two distinct slots");
  DSV41RT_CHECK(src.n_pages >= pages && dst.n_pages >= pages, "copy_state: ", src.length,
                " positions need ", pages, " pages; source has ", src.n_pages, ", destination ",
                dst.n_pages);
}

std::shared_ptr<Executor> make_executor(ModelPlan plan, ModelWeights weights, EngramTables engram,
                                        ExecutorOptions options) {
  const std::string& d = options.device;
  DSV41RT_CHECK_CODE(kInvalidArgument, options.precision == "fp32" || options.precision == "bf16",
                     "unknown precision '", options.precision, "' (expected 'fp32' or 'bf16')");
  if (d == "cpu") {
    DSV41RT_CHECK_CODE(kUnsupported, options.precision == "fp32", "precision '", options.precision,
                       "' needs a CUDA device (the CPU executor is the FP32 reference)");
    return std::make_shared<CpuExecutor>(std::move(plan), std::move(weights), std::move(engram),
                                         options);
  }
  if (d == "cuda" || d.rfind("cuda:", 0) == 0) {
#if DSV41RT_WITH_CUDA
    return make_cuda_executor(std::move(plan), std::move(weights), std::move(engram), options);
#else
    DSV41RT_THROW_CODE(kInvalidArgument, "device '", d,
                       "': this build of dsv41rt has no CUDA backend (configure with nvcc "
                       "available and DSV41RT_WITH_CUDA=ON)");
#endif
  }
  DSV41RT_THROW_CODE(kInvalidArgument, "unknown device '", d,
                     "' (expected 'cpu', 'cuda' or 'cuda:N')");
}

}  // namespace dsv41rt::model
