#include "runtime/model/synthetic_weights.h"

#include <atomic>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/json.h"
#include "core/status.h"

namespace dsv41rt::model {
namespace {

std::atomic<int64_t> g_generated{0};

SyntheticTensor parse_entry(const Json& j, const std::string& where, uint64_t seed) {
  SyntheticTensor e;
  e.name = j.at("name").as_string();
  const std::string at = where + " tensor " + e.name;
  e.scale = j.at("scale").as_string();
  const std::string& storage = j.at("storage").as_string();
  DSV41RT_CHECK_CODE(kInvalidArgument, storage == "fp8" || storage == "fp4", at,
                     ": storage must be \"fp8\" or \"fp4\", got \"", storage, "\"");
  e.kind = storage == "fp8" ? kernels::SynthCodes::kFp8 : kernels::SynthCodes::kFp4;
  e.seed = seed;
  e.name_crc = kernels::synth_name_crc(e.name.data(), int64_t(e.name.size()));
  e.rows = j.at("rows").as_int();
  e.cols = j.at("cols").as_int();
  e.block_rows = j.at("block_rows").as_int();
  e.block_cols = j.at("block_cols").as_int();
  e.scale_exponent = j.at("scale_exponent").as_int();
  DSV41RT_CHECK_CODE(kInvalidArgument, e.rows >= 1 && e.cols >= 1, at, ": bad shape [", e.rows,
                     ", ", e.cols, "]");
  DSV41RT_CHECK_CODE(kInvalidArgument, e.fp8() || e.cols % 32 == 0, at,
                     ": FP4 columns must be a multiple of 32, got ", e.cols);
  DSV41RT_CHECK_CODE(kInvalidArgument, !e.fp8() || (e.block_rows >= 1 && e.block_cols >= 1), at,
                     ": bad FP8 block ", e.block_rows, " x ", e.block_cols);
  DSV41RT_CHECK_CODE(kInvalidArgument, e.scale_exponent >= -127 && e.scale_exponent <= 127, at,
                     ": scale exponent ", e.scale_exponent, " outside UE8M0's [-127, 127]");
  return e;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  DSV41RT_CHECK_CODE(kIoError, in.good(), "cannot open ", path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

std::vector<int64_t> SyntheticTensor::shape() const { return {rows, fp8() ? cols : cols / 2}; }

std::vector<int64_t> SyntheticTensor::scale_shape() const {
  if (!fp8()) return {rows, cols / 32};
  return {(rows + block_rows - 1) / block_rows, (cols + block_cols - 1) / block_cols};
}

int64_t SyntheticTensor::scale_bytes(int64_t n) const {
  if (!fp8()) return n * (cols / 32);
  return ((n + block_rows - 1) / block_rows) * ((cols + block_cols - 1) / block_cols);
}

const SyntheticTensor* SyntheticManifest::find(std::string_view name) const {
  const auto it = index.find(name);
  return it != index.end() && tensors[it->second].name == name ? &tensors[it->second] : nullptr;
}

std::optional<TensorInfo> SyntheticManifest::info(std::string_view name) const {
  const auto it = index.find(name);
  if (it != index.end()) {
    const SyntheticTensor& t = tensors[it->second];
    TensorInfo info;
    info.name = std::string(name);
    info.dtype = t.name == name ? t.dtype() : DType::kE8M0;
    info.shape = t.name == name ? t.shape() : t.scale_shape();
    info.nbytes = uint64_t(bytes_for(info.dtype, info.numel()));
    info.file = path;
    return info;
  }
  return std::nullopt;
}

std::shared_ptr<const SyntheticTensor> SyntheticManifest::entry(
    const std::shared_ptr<const SyntheticManifest>& self, const SyntheticTensor& t) {
  return std::shared_ptr<const SyntheticTensor>(self, &t);
}

std::shared_ptr<const SyntheticManifest> read_synthetic_manifest(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / kSyntheticManifest).string();
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return nullptr;
  const Json manifest = json_parse(read_file(path));
  const int64_t seed = manifest.at("seed").as_int();
  DSV41RT_CHECK_CODE(kInvalidArgument, seed >= 0, path, ": seed must be non-negative, got ", seed);
  auto out = std::make_shared<SyntheticManifest>();
  out->path = path;
  for (const Json& j : manifest.at("tensors").as_array()) {
    SyntheticTensor e = parse_entry(j, path, uint64_t(seed));
    for (const std::string* n : {&e.name, &e.scale}) {
      DSV41RT_CHECK_CODE(kInvalidArgument, out->index.emplace(*n, out->tensors.size()).second, path,
                         " tensor ", e.name, ": ", *n, " is listed twice");
    }
    out->tensors.push_back(std::move(e));
  }
  return out;
}

void generate_synthetic_rows(const SyntheticTensor& t, int64_t row_begin, int64_t row_end,
                             uint8_t* out) {
  DSV41RT_CHECK_CODE(kInternal, 0 <= row_begin && row_begin <= row_end && row_end <= t.rows, t.name,
                     ": rows [", row_begin, ", ", row_end, ") of ", t.rows);
  // FP8 chunks are whole scale blocks of rows (generator.py _align); FP4 chunks any rows.
  kernels::cpu::synth_tensor_codes(t.kind, t.seed, t.name_crc, t.rows, t.cols, t.align(), row_begin,
                                   row_end, out);
  count_synthetic_bytes((row_end - row_begin) * t.row_bytes());
}

int64_t synthetic_bytes_generated() { return g_generated.load(); }

void count_synthetic_bytes(int64_t bytes) { g_generated += bytes; }

int64_t add_synthetic_weights(Checkpoint& ck, const SyntheticManifest& manifest) {
  int64_t added = 0;
  for (const SyntheticTensor& e : manifest.tensors) {
    std::vector<uint8_t> codes(size_t(e.rows * e.row_bytes()));
    generate_synthetic_rows(e, 0, e.rows, codes.data());
    std::vector<int64_t> scale_shape = e.scale_shape();
    std::vector<uint8_t> scales(size_t(scale_shape[0] * scale_shape[1]), e.scale_byte());
    ck.add_owned(e.name, e.dtype(), e.shape(), std::move(codes));
    ck.add_owned(e.scale, DType::kE8M0, std::move(scale_shape), std::move(scales));
    added += 2;
  }
  return added;
}

int64_t add_synthetic_weights(Checkpoint& ck, const std::string& dir) {
  const std::shared_ptr<const SyntheticManifest> manifest = read_synthetic_manifest(dir);
  return manifest ? add_synthetic_weights(ck, *manifest) : 0;
}

}  // namespace dsv41rt::model
