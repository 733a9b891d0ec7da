#include "runtime/model/checkpoint_validation.h"

#include <algorithm>
#include <filesystem>
#include <optional>
#include <string_view>
#include <utility>

#include "runtime/model/model_config.h"
#include "runtime/model/synthetic_weights.h"

namespace dsv41rt {
namespace {

bool starts_with(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// Text-only runtime: the vision tower and its glue are not checked.
bool ignored(std::string_view name) {
  return starts_with(name, "vision.") || starts_with(name, "aligner.") || name == "image_start" ||
         name == "image_end" || name == "image_newline";
}

// The image-token routing bias: text requests never read it, so checkpoints may leave it out.
bool optional(std::string_view name) { return ends_with(name, ".ffn.gate.bias_vl"); }

}  // namespace

CheckpointMismatch::CheckpointMismatch(const char* file, int line, const std::string& message,
                                       std::vector<std::string> problems)
    : Error(StatusCode::kInvalidArgument, file, line, message), problems_(std::move(problems)) {}

std::vector<std::string> checkpoint_problems(const TensorSpec& spec, const Checkpoint& ck,
                                             const model::SyntheticManifest* synthetic) {
  std::vector<std::string> missing, unexpected, mismatched;
  // A synthetic tensor loaded lazily is checked by its descriptor (dtype and shape).
  auto listed = [&](const std::string& name) {
    return synthetic ? synthetic->info(name) : std::nullopt;
  };
  for (const PhysicalTensor& t : spec.physical) {
    const std::optional<TensorInfo> generated = listed(t.name);
    if (generated && ck.contains(t.name)) {
      mismatched.push_back("tensor " + t.name + " is both stored in " + ck.info(t.name).file +
                           " and listed in " + synthetic->path);
      continue;
    }
    if (!ck.contains(t.name) && !generated) {
      if (!optional(t.name)) {
        missing.push_back("missing tensor " + t.name + " (expected " + safetensors_name(t.dtype) +
                          " " + shape_text(t.shape) + ")");
      }
      continue;
    }
    append_tensor_problems(t, generated ? *generated : ck.info(t.name), mismatched);
  }
  auto unexpected_tensor = [&](const std::string& name, const TensorInfo& info) {
    if (spec.find_physical(name) == nullptr && !ignored(name)) {
      unexpected.push_back("unexpected tensor " + name + " (" + safetensors_name(info.dtype) + " " +
                           shape_text(info.shape) + ")");
    }
  };
  for (const std::string& name : ck.names()) unexpected_tensor(name, ck.info(name));
  if (synthetic) {
    for (const auto& [name, index] : synthetic->index) unexpected_tensor(name, *listed(name));
    std::sort(unexpected.begin(), unexpected.end());
  }
  std::vector<std::string> out = std::move(missing);
  out.insert(out.end(), unexpected.begin(), unexpected.end());
  out.insert(out.end(), mismatched.begin(), mismatched.end());
  return out;
}

void validate_checkpoint(const TensorSpec& spec, const Checkpoint& ck, const std::string& where,
                         const model::SyntheticManifest* synthetic) {
  std::vector<std::string> problems = checkpoint_problems(spec, ck, synthetic);
  if (problems.empty()) return;
  std::string msg = where + ": checkpoint does not match its config (" +
                    std::to_string(problems.size()) + " problems):";
  for (size_t i = 0; i < problems.size() && i < kMaxListedProblems; ++i) {
    msg += "\n  " + problems[i];
  }
  if (problems.size() > kMaxListedProblems) {
    msg += "\n  ... and " + std::to_string(problems.size() - kMaxListedProblems) + " more";
  }
  throw CheckpointMismatch(__FILE__, __LINE__, msg, std::move(problems));
}

OpenedCheckpoint open_checkpoint(const std::string& dir, bool validate, SyntheticLoad synthetic) {
  std::error_code ec;
  DSV41RT_CHECK_CODE(kNotFound, std::filesystem::is_directory(dir, ec), dir,
                     ": not a checkpoint directory");
  OpenedCheckpoint out{build_model_plan(load_model_config(dir)), {}, nullptr, nullptr};
  out.spec = build_tensor_spec(out.plan);
  auto tensors = std::make_shared<Checkpoint>(dir);
  // Synthetic weights (a manifest beside the files). Eager: generated now, so validation and the
  // loader see them as any other tensor. Lazy: validated by their descriptors, generated per rank
  // by the backend (load_weights' `synthetic`).
  std::shared_ptr<const model::SyntheticManifest> manifest = model::read_synthetic_manifest(dir);
  if (manifest && synthetic == SyntheticLoad::kEager) {
    model::add_synthetic_weights(*tensors, *manifest);
    manifest.reset();
  }
  out.tensors = std::move(tensors);
  out.synthetic = std::move(manifest);
  if (validate) validate_checkpoint(out.spec, *out.tensors, dir, out.synthetic.get());
  return out;
}

}  // namespace dsv41rt
