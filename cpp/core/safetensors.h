// Zero-copy access to safetensors checkpoints.
//
// SafetensorsFile maps one file read-only and validates its whole header up front, so every
// later view() is a pointer into the mapping with no further checks. Checkpoint resolves a path to
// one or more such files (single file, a directory with model.safetensors, a sharded directory
// with model.safetensors.index.json, or a directory holding exactly one *.safetensors file) and
// cross-checks shards against the index. Every validation failure throws Error whose message
// names the file and, where one is involved, the tensor.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/export.h"
#include "core/tensor_view.h"

namespace dsv41rt {

// Header entries larger than this are rejected as corrupt rather than read.
inline constexpr uint64_t kSafetensorsMaxHeaderBytes = 100ull << 20;

struct DSV41RT_API TensorInfo {
  std::string name;
  DType dtype = DType::kU8;
  std::vector<int64_t> shape;
  uint64_t offset = 0;  // absolute byte offset of the data in `file`
  uint64_t nbytes = 0;
  std::string file;  // path of the file holding the data

  int64_t numel() const;
};

class DSV41RT_API SafetensorsFile {
 public:
  // Maps and validates `path`. Throws Error (kNotFound / kIoError / kInvalidArgument /
  // kUnsupported).
  explicit SafetensorsFile(std::string path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  SafetensorsFile(SafetensorsFile&& other) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& other) noexcept;

  const std::string& path() const { return path_; }
  // Sorted tensor names.
  const std::vector<std::string>& names() const { return names_; }
  size_t size() const { return names_.size(); }
  bool contains(std::string_view name) const;
  // Throws Error(kNotFound) naming the file and tensor.
  const TensorInfo& info(std::string_view name) const;
  // Read-only data (the mapping is PROT_READ; writing through the view faults).
  TensorView view(std::string_view name) const;
  const uint8_t* tensor_data(std::string_view name) const;
  // The "__metadata__" string map (empty when absent).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Total file size in bytes.
  uint64_t file_size() const { return size_; }

 private:
  void unmap() noexcept;

  std::string path_;
  void* map_ = nullptr;
  uint64_t size_ = 0;
  std::map<std::string, TensorInfo, std::less<>> tensors_;
  std::vector<std::string> names_;
  std::map<std::string, std::string> metadata_;
};

class DSV41RT_API Checkpoint {
 public:
  // `path` is a .safetensors file, a *.safetensors.index.json file or a directory (see top).
  explicit Checkpoint(const std::string& path);
  ~Checkpoint();
  Checkpoint(const Checkpoint&) = delete;
  Checkpoint& operator=(const Checkpoint&) = delete;
  Checkpoint(Checkpoint&&) noexcept;
  Checkpoint& operator=(Checkpoint&&) noexcept;

  const std::string& path() const { return path_; }
  // Sorted tensor names across all files.
  const std::vector<std::string>& names() const { return names_; }
  size_t size() const { return names_.size(); }
  bool contains(std::string_view name) const;
  // Throws Error(kNotFound) naming the checkpoint path and tensor.
  const TensorInfo& info(std::string_view name) const;
  TensorView view(std::string_view name) const;
  const uint8_t* tensor_data(std::string_view name) const;
  // Paths of the data files, sorted.
  std::vector<std::string> files() const;
  // Union of the files' "__metadata__" maps; on conflicting keys the first file (sorted by path)
  // wins, since shards written by one tool carry identical metadata.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Adds a tensor held in memory rather than in a file (synthetic weights generated at load:
  // runtime/model/synthetic_weights.h); `file` of its info is "<memory>". Throws Error
  // (kInvalidArgument) when the name is taken or the byte count does not match dtype and shape.
  void add_owned(const std::string& name, DType dtype, std::vector<int64_t> shape,
                 std::vector<uint8_t> bytes);

 private:
  void load_single(const std::string& file);
  void load_index(const std::string& index_path);
  void finish();

  std::string path_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  // name -> index into files_
  std::map<std::string, size_t, std::less<>> owner_;
  struct Owned {
    TensorInfo info;
    std::vector<uint8_t> bytes;
  };
  std::map<std::string, Owned, std::less<>> owned_;  // add_owned's tensors
  std::vector<std::string> names_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace dsv41rt
