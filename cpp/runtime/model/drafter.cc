#include "runtime/model/drafter.h"

#include "core/status.h"
#include "runtime/model/cache_bytes.h"
#include "runtime/model/checkpoint_validation.h"
#include "runtime/model/model_executor.h"
#include "runtime/model/weights.h"

namespace dsv41rt::model {

Drafter::Drafter(const std::string& checkpoint_dir, bool cache_quant, const std::string& device) {
  const bool cpu = device == "cpu";
  DSV41RT_CHECK_CODE(kInvalidArgument, cpu || device == "cuda" || device.rfind("cuda:", 0) == 0,
                     "unknown device '", device, "' (expected 'cpu', 'cuda' or 'cuda:N')");
  OpenedCheckpoint opened =
      open_checkpoint(checkpoint_dir, /*validate=*/true, SyntheticLoad::kLazy);
  plan_ = std::move(opened.plan);
  // load_weights' drafts also load V4's MTP layer, which is no DSpark drafter.
  DSV41RT_CHECK_CODE(kUnsupported, plan_.config.dspark.has_value(), checkpoint_dir,
                     ": the config has no DSpark drafter (dspark_* keys and "
                     "num_nextn_predict_layers > 0)");
  ModelWeights weights = load_weights(std::move(opened.tensors), plan_, /*host_values=*/cpu, {},
                                      /*drafts=*/true, opened.synthetic);
  backend_ = cpu ? make_cpu_backend() : make_cuda_backend(device);
  weights_ = backend_->load_weights(plan_, weights, rope_inv_freqs(plan_));
  runner_ = std::make_unique<DraftRunner>(plan_, *backend_, weights_,
                                          CacheFormats::of(cache_quant).window);
}

Drafter::~Drafter() = default;

}  // namespace dsv41rt::model
