#include "runtime/model/synthetic_weights.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "core/json.h"
#include "core/status.h"
#include "kernels/synthetic_codes.h"

namespace dsv41rt::model {
namespace {

struct Entry {
  std::string name, scale;
  kernels::SynthCodes kind = kernels::SynthCodes::kFp8;
  int64_t rows = 0, cols = 0, block_rows = 1, block_cols = 1, scale_exponent = 0;
};

Entry parse_entry(const Json& j, const std::string& where) {
  Entry e;
  e.name = j.at("name").as_string();
  const std::string at = where + " tensor " + e.name;
  e.scale = j.at("scale").as_string();
  const std::string& storage = j.at("storage").as_string();
  DSV41RT_CHECK_CODE(kInvalidArgument, storage == "fp8" || storage == "fp4", at,
                     ": storage must be \"fp8\" or \"fp4\", got \"", storage, "\"");
  e.kind = storage == "fp8" ? kernels::SynthCodes::kFp8 : kernels::SynthCodes::kFp4;
  e.rows = j.at("rows").as_int();
  e.cols = j.at("cols").as_int();
  e.block_rows = j.at("block_rows").as_int();
  e.block_cols = j.at("block_cols").as_int();
  e.scale_exponent = j.at("scale_exponent").as_int();
  DSV41RT_CHECK_CODE(kInvalidArgument, e.rows >= 1 && e.cols >= 1, at, ": bad shape [", e.rows,
                     ", ", e.cols, "]");
  DSV41RT_CHECK_CODE(kInvalidArgument, e.kind == kernels::SynthCodes::kFp8 || e.cols % 32 == 0, at,
                     ": FP4 columns must be a multiple of 32, got ", e.cols);
  DSV41RT_CHECK_CODE(
      kInvalidArgument,
      e.kind == kernels::SynthCodes::kFp4 || (e.block_rows >= 1 && e.block_cols >= 1), at,
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

int64_t add_synthetic_weights(Checkpoint& ck, const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / kSyntheticManifest).string();
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return 0;
  const Json manifest = json_parse(read_file(path));
  const int64_t seed = manifest.at("seed").as_int();
  DSV41RT_CHECK_CODE(kInvalidArgument, seed >= 0, path, ": seed must be non-negative, got ", seed);
  int64_t added = 0;
  for (const Json& j : manifest.at("tensors").as_array()) {
    const Entry e = parse_entry(j, path);
    const bool fp8 = e.kind == kernels::SynthCodes::kFp8;
    std::vector<uint8_t> codes(size_t(kernels::synth_code_bytes(e.kind, e.rows * e.cols)));
    // FP8 chunks are whole scale blocks of rows (generator.py _align); FP4 chunks any rows.
    kernels::cpu::synth_tensor_codes(
        e.kind, uint64_t(seed), kernels::synth_name_crc(e.name.data(), int64_t(e.name.size())),
        e.rows, e.cols, fp8 ? e.block_rows : 1, 0, e.rows, codes.data());
    std::vector<int64_t> scale_shape =
        fp8 ? std::vector<int64_t>{(e.rows + e.block_rows - 1) / e.block_rows,
                                   (e.cols + e.block_cols - 1) / e.block_cols}
            : std::vector<int64_t>{e.rows, e.cols / 32};
    std::vector<uint8_t> scales(size_t(scale_shape[0] * scale_shape[1]),
                                uint8_t(e.scale_exponent + 127));
    ck.add_owned(
        e.name, fp8 ? DType::kFP8E4M3 : DType::kI8,
        fp8 ? std::vector<int64_t>{e.rows, e.cols} : std::vector<int64_t>{e.rows, e.cols / 2},
        std::move(codes));
    ck.add_owned(e.scale, DType::kE8M0, std::move(scale_shape), std::move(scales));
    added += 2;
  }
  return added;
}

}  // namespace dsv41rt::model
