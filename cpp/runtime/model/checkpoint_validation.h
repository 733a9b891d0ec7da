// Opening a checkpoint directory once and checking it against the tensors its config implies.
//
// Every mismatch is collected (missing, unexpected, wrong dtype, wrong shape) and reported
// together by name. Vision tensors are skipped (this is a text runtime), and so is the optional
// image-token routing bias `ffn.gate.bias_vl`. Python's dsv41rt.checkpoint.reader binds
// open_checkpoint; C++ hosts can call it before loading weights.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/export.h"
#include "core/safetensors.h"
#include "core/status.h"
#include "runtime/model/layer_plan.h"
#include "runtime/model/tensor_spec.h"

namespace dsv41rt {
namespace model {
struct SyntheticManifest;  // synthetic_weights.h
}  // namespace model

// A checkpoint whose tensors do not match its config: the message lists up to
// kMaxListedProblems of them, problems() has them all (bindings raise Python's CheckpointError
// with both).
class DSV41RT_API CheckpointMismatch : public Error {
 public:
  CheckpointMismatch(const char* file, int line, const std::string& message,
                     std::vector<std::string> problems);
  const std::vector<std::string>& problems() const noexcept { return problems_; }

 private:
  std::vector<std::string> problems_;
};

inline constexpr size_t kMaxListedProblems = 40;

// One line per problem, naming the tensor, in the order missing, unexpected, mismatched (each
// sorted by name). `synthetic`: the manifest of lazily loaded synthetic weights, whose tensors
// count as present with the dtype and shape their descriptors give (a tensor both stored and
// listed is a problem).
DSV41RT_API std::vector<std::string> checkpoint_problems(
    const TensorSpec& spec, const Checkpoint& checkpoint,
    const model::SyntheticManifest* synthetic = nullptr);

// Throws CheckpointMismatch "<where>: checkpoint does not match its config (N problems): ..."
// when checkpoint_problems() is not empty.
DSV41RT_API void validate_checkpoint(const TensorSpec& spec, const Checkpoint& checkpoint,
                                     const std::string& where,
                                     const model::SyntheticManifest* synthetic = nullptr);

// How open_checkpoint takes synthetic weights (a `dsv41rt_synthetic.json` manifest, see
// synthetic_weights.h): kEager generates every listed tensor in full into `tensors` (what the
// Python reader and `inspect` read: every tensor has bytes); kLazy generates nothing, validates
// the listed tensors by their descriptors and returns the manifest in `synthetic`, for
// load_weights (a rank then generates only the rows it keeps, where its backend keeps them).
enum class SyntheticLoad { kEager, kLazy };

struct DSV41RT_API OpenedCheckpoint {
  ModelPlan plan;
  TensorSpec spec;
  std::shared_ptr<Checkpoint> tensors;
  std::shared_ptr<const model::SyntheticManifest> synthetic;  // kLazy with a manifest only
};

// Reads <dir>/config.json (ConfigError naming the field), maps the safetensors files (Error
// naming the file and tensor), reads the synthetic manifest (Error naming the entry) and, with
// `validate`, checks every tensor against the spec.
DSV41RT_API OpenedCheckpoint open_checkpoint(const std::string& dir, bool validate = true,
                                             SyntheticLoad synthetic = SyntheticLoad::kEager);

}  // namespace dsv41rt
