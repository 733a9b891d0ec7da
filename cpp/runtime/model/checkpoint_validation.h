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
// sorted by name).
DSV41RT_API std::vector<std::string> checkpoint_problems(const TensorSpec& spec,
                                                         const Checkpoint& checkpoint);

// Throws CheckpointMismatch "<where>: checkpoint does not match its config (N problems): ..."
// when checkpoint_problems() is not empty.
DSV41RT_API void validate_checkpoint(const TensorSpec& spec, const Checkpoint& checkpoint,
                                     const std::string& where);

struct DSV41RT_API OpenedCheckpoint {
  ModelPlan plan;
  TensorSpec spec;
  std::shared_ptr<Checkpoint> tensors;
};

// Reads <dir>/config.json (ConfigError naming the field), maps the safetensors files (Error
// naming the file and tensor) and, with `validate`, checks every tensor against the spec.
DSV41RT_API OpenedCheckpoint open_checkpoint(const std::string& dir, bool validate = true);

}  // namespace dsv41rt
