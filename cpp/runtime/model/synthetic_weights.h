// Synthetic weights: a checkpoint directory whose large quantised matrices are not in its files
// but listed in `dsv41rt_synthetic.json`, to be generated at load bit-identical to the bytes
// `make-checkpoint` writes for them (kernels/synthetic_codes.h). The control plane writes such a
// directory (python/dsv41rt/checkpoint/synthetic.py: config, small tensors, tokenizer, manifest).
//
// Manifest: {"seed": S, "tensors": [{"name": weight, "scale": scale tensor, "storage": "fp8" |
// "fp4", "rows": R, "cols": C, "block_rows": br, "block_cols": bc, "scale_exponent": e}, ...]}:
// FP8 -> F8_E4M3 [R, C] + F8_E8M0 [ceil(R / br), ceil(C / bc)]; FP4 -> I8 [R, C / 2] + F8_E8M0
// [R, C / 32]; every scale byte is e + 127 (the generator's tensor-wide scale).
//
// Two ways to load one (open_checkpoint's `synthetic`, checkpoint_validation.h):
//  - eager (add_synthetic_weights): every listed tensor generated in full into owned Checkpoint
//    tensors, read like mapped ones (the Python reader, `inspect`, the byte-for-byte tests);
//  - lazy (read_synthetic_manifest): the tensors stay descriptors (SyntheticTensor) in their
//    TensorSource (weights.h); expert_shard / tensor_shard narrow them to a rank's rows, and a
//    backend generates only those rows where it keeps the weights (CPU: host values via
//    generate_synthetic_rows; CUDA: kernels/cuda/synthetic_codes.cuh into the device buffer).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/export.h"
#include "core/safetensors.h"
#include "kernels/synthetic_codes.h"

namespace dsv41rt::model {

inline constexpr const char* kSyntheticManifest = "dsv41rt_synthetic.json";

/// One manifest entry: a direct-code tensor [rows, cols] (logical shape) and its scale tensor.
struct DSV41RT_API SyntheticTensor {
  std::string name, scale;
  kernels::SynthCodes kind = kernels::SynthCodes::kFp8;
  uint64_t seed = 0;
  uint32_t name_crc = 0;  ///< zlib.crc32 of name
  int64_t rows = 0, cols = 0, block_rows = 1, block_cols = 1, scale_exponent = 0;

  bool fp8() const { return kind == kernels::SynthCodes::kFp8; }
  /// Stored dtype and shape of the codes (FP8 E4M3 [R, C]; packed FP4 as I8 [R, C / 2]).
  DType dtype() const { return fp8() ? DType::kFP8E4M3 : DType::kI8; }
  std::vector<int64_t> shape() const;
  /// UE8M0 scales: FP8 [ceil(R / br), ceil(C / bc)], FP4 [R, C / 32].
  std::vector<int64_t> scale_shape() const;
  /// Stored bytes of one row of codes.
  int64_t row_bytes() const { return kernels::synth_code_bytes(kind, cols); }
  /// Rows per chunk alignment of the generator (the FP8 scale block's rows; 1 for FP4).
  int64_t align() const { return fp8() ? block_rows : 1; }
  /// Scale bytes of rows [begin, begin + n) (FP8: the blocks they fall in, begin on a block).
  int64_t scale_bytes(int64_t n) const;
  /// Every scale byte (the tensor-wide power of two).
  uint8_t scale_byte() const { return uint8_t(scale_exponent + 127); }
};

/// A directory's manifest, parsed and checked.
struct DSV41RT_API SyntheticManifest {
  std::string path;
  std::vector<SyntheticTensor> tensors;
  /// Weight and scale names -> index into tensors.
  std::map<std::string, size_t, std::less<>> index;
  /// The entry whose weight is `name`, or null.
  const SyntheticTensor* find(std::string_view name) const;
  /// The stored form (dtype, shape) the entry gives `name` as a weight or a scale, if it lists it.
  std::optional<TensorInfo> info(std::string_view name) const;
  /// Entry `t` as a shared pointer that keeps this manifest alive (`self` owns it).
  static std::shared_ptr<const SyntheticTensor> entry(
      const std::shared_ptr<const SyntheticManifest>& self, const SyntheticTensor& t);
};

/// `dir`'s manifest (null when it has none). Throws Error(kInvalidArgument) naming the manifest
/// and the entry that is malformed (bad storage, shape, block, exponent, a name listed twice).
DSV41RT_API std::shared_ptr<const SyntheticManifest> read_synthetic_manifest(
    const std::string& dir);

/// Rows [row_begin, row_end) of `t`'s stored codes, generated on the host (CPU reference) into
/// `out` (row_bytes() per row); FP8: row_begin on a scale block. Counted in
/// synthetic_bytes_generated.
DSV41RT_API void generate_synthetic_rows(const SyntheticTensor& t, int64_t row_begin,
                                         int64_t row_end, uint8_t* out);

/// Code bytes of synthetic tensors this process has generated (host and device), so a test can
/// see that a rank generated its share only; count_synthetic_bytes adds device generation.
DSV41RT_API int64_t synthetic_bytes_generated();
DSV41RT_API void count_synthetic_bytes(int64_t bytes);

/// Generates every tensor `dir`'s manifest lists (none when it has no manifest) into `ck` as owned
/// tensors (the eager way). Throws Error(kInvalidArgument) naming the manifest and the entry that
/// is malformed. Returns the number of tensors generated (weights and scales).
DSV41RT_API int64_t add_synthetic_weights(Checkpoint& ck, const std::string& dir);
DSV41RT_API int64_t add_synthetic_weights(Checkpoint& ck, const SyntheticManifest& manifest);

}  // namespace dsv41rt::model
