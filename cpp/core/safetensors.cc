#include "core/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "core/json.h"
#include "core/status.h"

namespace dsv41rt {
namespace fs = std::filesystem;

// Prefix every header problem with the file so multi-shard loads point at the culprit.
#define FILE_FAIL(code, path, ...) \
  DSV41RT_THROW_CODE(code, "safetensors file '", path, "': ", __VA_ARGS__)
#define TENSOR_FAIL(path, tensor, ...)                                                    \
  DSV41RT_THROW_CODE(kInvalidArgument, "safetensors file '", path, "': tensor '", tensor, \
                     "': ", __VA_ARGS__)

namespace {

// Closes a descriptor on scope exit; the mapping stays valid after close.
class FdGuard {
 public:
  explicit FdGuard(int fd) : fd_(fd) {}
  ~FdGuard() {
    if (fd_ >= 0) ::close(fd_);
  }
  FdGuard(const FdGuard&) = delete;
  FdGuard& operator=(const FdGuard&) = delete;

 private:
  int fd_;
};

uint64_t read_u64_le(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

}  // namespace

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// ---- SafetensorsFile ----------------------------------------------------------------------

SafetensorsFile::SafetensorsFile(std::string path) : path_(std::move(path)) {
  const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) FILE_FAIL(kNotFound, path_, "does not exist");
    FILE_FAIL(kIoError, path_, "cannot open: ", std::strerror(err));
  }
  FdGuard guard(fd);
  struct stat st;
  if (::fstat(fd, &st) != 0) FILE_FAIL(kIoError, path_, "fstat failed: ", std::strerror(errno));
  if (!S_ISREG(st.st_mode)) FILE_FAIL(kInvalidArgument, path_, "not a regular file");
  size_ = static_cast<uint64_t>(st.st_size);
  if (size_ < 8) {
    FILE_FAIL(kInvalidArgument, path_, "file is ", size_,
              " bytes, too short for the 8-byte header length (truncated?)");
  }
  // MAP_SHARED (read-only): the same pages as MAP_PRIVATE for reading, and the CUDA backend can
  // register a range of it in place (Engram tables); cudaHostRegister of a 128 MiB range of a
  // private file mapping did not return within 40 s on an H100 host (kernel 6.18, driver
  // 580.159.04) where a shared one took 4 ms (bench/host_register_probe.py, session 37).
  void* map = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
  if (map == MAP_FAILED) FILE_FAIL(kIoError, path_, "mmap failed: ", std::strerror(errno));
  map_ = map;
  // From here on the destructor will not run if we throw, so unmap explicitly on failure.
  try {
    const auto* bytes = static_cast<const uint8_t*>(map_);
    const uint64_t header_len = read_u64_le(bytes);
    if (header_len > kSafetensorsMaxHeaderBytes) {
      FILE_FAIL(kInvalidArgument, path_, "header length ", header_len, " is absurd (limit ",
                kSafetensorsMaxHeaderBytes, " bytes); not a safetensors file?");
    }
    if (header_len > size_ - 8) {
      FILE_FAIL(kInvalidArgument, path_, "header length ", header_len, " exceeds the file size ",
                size_, " (truncated?)");
    }
    const uint64_t data_begin = 8 + header_len;
    const uint64_t data_size = size_ - data_begin;
    const std::string_view header_text(reinterpret_cast<const char*>(bytes + 8), header_len);

    Json header;
    try {
      header = json_parse(header_text);
    } catch (const Error& e) {
      FILE_FAIL(kInvalidArgument, path_, "header is not valid JSON: ", e.message());
    }
    if (!header.is_object()) {
      FILE_FAIL(kInvalidArgument, path_, "header must be a JSON object, got ", header.type_name());
    }

    int64_t past_end_count = 0;
    int64_t past_end_max = -1;
    std::string past_end_name;
    for (const auto& [name, entry] : header.as_object()) {
      if (name == "__metadata__") {
        if (!entry.is_object()) {
          FILE_FAIL(kInvalidArgument, path_, "__metadata__ must be an object of strings, got ",
                    entry.type_name());
        }
        for (const auto& [key, value] : entry.as_object()) {
          if (!value.is_string()) {
            FILE_FAIL(kInvalidArgument, path_, "__metadata__ value for key '", key,
                      "' must be a string, got ", value.type_name());
          }
          metadata_[key] = value.as_string();
        }
        continue;
      }
      if (!entry.is_object())
        TENSOR_FAIL(path_, name, "entry must be an object, got ", entry.type_name());
      const Json* dtype_json = entry.find("dtype");
      const Json* shape_json = entry.find("shape");
      const Json* offsets_json = entry.find("data_offsets");
      if (dtype_json == nullptr) TENSOR_FAIL(path_, name, "missing 'dtype'");
      if (shape_json == nullptr) TENSOR_FAIL(path_, name, "missing 'shape'");
      if (offsets_json == nullptr) TENSOR_FAIL(path_, name, "missing 'data_offsets'");
      if (!dtype_json->is_string()) {
        TENSOR_FAIL(path_, name, "'dtype' must be a string, got ", dtype_json->type_name());
      }
      if (!shape_json->is_array()) {
        TENSOR_FAIL(path_, name, "'shape' must be an array, got ", shape_json->type_name());
      }
      if (!offsets_json->is_array()) {
        TENSOR_FAIL(path_, name, "'data_offsets' must be an array, got ",
                    offsets_json->type_name());
      }

      TensorInfo info;
      info.name = name;
      info.file = path_;
      try {
        info.dtype = dtype_from_safetensors(dtype_json->as_string());
      } catch (const Error& e) {
        DSV41RT_THROW_CODE(kUnsupported, "safetensors file '", path_, "': tensor '", name,
                           "': ", e.message());
      }
      int64_t numel = 1;
      for (const Json& dim : shape_json->as_array()) {
        if (!dim.is_int()) {
          TENSOR_FAIL(path_, name, "shape entries must be integers, got ", dim.type_name());
        }
        if (dim.as_int() < 0) TENSOR_FAIL(path_, name, "negative shape dimension ", dim.as_int());
        if (__builtin_mul_overflow(numel, dim.as_int(), &numel)) {
          TENSOR_FAIL(path_, name, "shape element count overflows int64");
        }
        info.shape.push_back(dim.as_int());
      }
      const auto& offsets = offsets_json->as_array();
      if (offsets.size() != 2 || !offsets[0].is_int() || !offsets[1].is_int()) {
        TENSOR_FAIL(path_, name, "'data_offsets' must be [begin, end] integers");
      }
      const int64_t begin = offsets[0].as_int();
      const int64_t end = offsets[1].as_int();
      if (begin < 0 || end < 0 || begin > end) {
        TENSOR_FAIL(path_, name, "invalid data_offsets [", begin, ", ", end,
                    "] (need 0 <= begin <= end)");
      }
      if (static_cast<uint64_t>(end) > data_size) {
        // Reported after the loop, naming the tensor reaching furthest: with a cut-off file that
        // is the one whose tail was lost, whatever the alphabetical order.
        ++past_end_count;
        if (end > past_end_max) {
          past_end_max = end;
          past_end_name = name;
        }
      }
      int64_t expected = 0;
      try {
        expected = bytes_for(info.dtype, numel);
      } catch (const Error& e) {
        TENSOR_FAIL(path_, name, e.message());
      }
      if (end - begin != expected) {
        TENSOR_FAIL(path_, name, "data_offsets span ", end - begin, " bytes but shape x dtype (",
                    safetensors_name(info.dtype), ") needs ", expected, " bytes");
      }
      info.offset = data_begin + static_cast<uint64_t>(begin);
      info.nbytes = static_cast<uint64_t>(expected);
      names_.push_back(name);
      tensors_.emplace(name, std::move(info));
    }

    if (past_end_count > 0) {
      TENSOR_FAIL(path_, past_end_name, "data_offsets end ", past_end_max,
                  " lies beyond the data section (", data_size, " bytes): file truncated (",
                  past_end_count, past_end_count == 1 ? " tensor extends" : " tensors extend",
                  " past the end)");
    }

    // Overlap check: sort non-empty ranges by start; each must begin at or after the furthest
    // end seen so far (tracking the furthest, not just the previous, catches a large tensor
    // spanning several others).
    std::vector<const TensorInfo*> by_offset;
    for (const auto& [name, info] : tensors_) {
      if (info.nbytes > 0) by_offset.push_back(&info);
    }
    std::sort(by_offset.begin(), by_offset.end(), [](const TensorInfo* a, const TensorInfo* b) {
      return a->offset != b->offset ? a->offset < b->offset : a->name < b->name;
    });
    const TensorInfo* furthest = nullptr;
    for (const TensorInfo* t : by_offset) {
      if (furthest != nullptr && t->offset < furthest->offset + furthest->nbytes) {
        FILE_FAIL(kInvalidArgument, path_, "tensors '", furthest->name, "' and '", t->name,
                  "' have overlapping data ranges");
      }
      if (furthest == nullptr || t->offset + t->nbytes > furthest->offset + furthest->nbytes) {
        furthest = t;
      }
    }
    // Json objects are sorted by key, so names_ is already sorted.
  } catch (...) {
    unmap();
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() { unmap(); }

SafetensorsFile::SafetensorsFile(SafetensorsFile&& other) noexcept
    : path_(std::move(other.path_)),
      map_(std::exchange(other.map_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      tensors_(std::move(other.tensors_)),
      names_(std::move(other.names_)),
      metadata_(std::move(other.metadata_)) {}

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& other) noexcept {
  if (this != &other) {
    unmap();
    path_ = std::move(other.path_);
    map_ = std::exchange(other.map_, nullptr);
    size_ = std::exchange(other.size_, 0);
    tensors_ = std::move(other.tensors_);
    names_ = std::move(other.names_);
    metadata_ = std::move(other.metadata_);
  }
  return *this;
}

void SafetensorsFile::unmap() noexcept {
  if (map_ != nullptr) {
    ::munmap(map_, size_);
    map_ = nullptr;
  }
}

bool SafetensorsFile::contains(std::string_view name) const {
  return tensors_.find(name) != tensors_.end();
}

const TensorInfo& SafetensorsFile::info(std::string_view name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) FILE_FAIL(kNotFound, path_, "no tensor named '", name, "'");
  return it->second;
}

const uint8_t* SafetensorsFile::tensor_data(std::string_view name) const {
  return static_cast<const uint8_t*>(map_) + info(name).offset;
}

TensorView SafetensorsFile::view(std::string_view name) const {
  const TensorInfo& t = info(name);
  // const_cast: TensorView is a general-purpose view; the mapping itself is read-only.
  return TensorView(const_cast<uint8_t*>(static_cast<const uint8_t*>(map_) + t.offset), t.dtype,
                    t.shape);
}

// ---- Checkpoint ---------------------------------------------------------------------------

namespace {

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

std::string read_small_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) DSV41RT_THROW_CODE(kIoError, "cannot open '", path, "': ", std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) DSV41RT_THROW_CODE(kIoError, "error reading '", path, "'");
  return ss.str();
}

}  // namespace

Checkpoint::Checkpoint(const std::string& path) : path_(path) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st)) {
    DSV41RT_THROW_CODE(kNotFound, "checkpoint path '", path, "' does not exist");
  }
  if (fs::is_regular_file(st)) {
    if (ends_with(path, ".json")) {
      load_index(path);
    } else {
      load_single(path);
    }
  } else if (fs::is_directory(st)) {
    const fs::path dir(path);
    if (fs::is_regular_file(dir / "model.safetensors.index.json", ec)) {
      load_index((dir / "model.safetensors.index.json").string());
    } else if (fs::is_regular_file(dir / "model.safetensors", ec)) {
      load_single((dir / "model.safetensors").string());
    } else {
      std::vector<std::string> indexes, singles;
      for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
        if (!it->is_regular_file(ec)) continue;
        const std::string name = it->path().filename().string();
        if (ends_with(name, ".safetensors.index.json")) indexes.push_back(it->path().string());
        if (ends_with(name, ".safetensors")) singles.push_back(it->path().string());
      }
      if (ec) {
        DSV41RT_THROW_CODE(kIoError, "cannot list checkpoint directory '", path,
                           "': ", ec.message());
      }
      if (indexes.size() == 1) {
        load_index(indexes[0]);
      } else if (indexes.size() > 1) {
        DSV41RT_THROW("checkpoint directory '", path, "' has ", indexes.size(),
                      " *.safetensors.index.json files; pass the index file to use");
      } else if (singles.size() == 1) {
        load_single(singles[0]);
      } else if (singles.empty()) {
        DSV41RT_THROW_CODE(kNotFound, "checkpoint directory '", path,
                           "' contains no .safetensors files");
      } else {
        DSV41RT_THROW("checkpoint directory '", path, "' has ", singles.size(),
                      " .safetensors files but no model.safetensors.index.json");
      }
    }
  } else {
    DSV41RT_THROW("checkpoint path '", path, "' is neither a file nor a directory");
  }
  finish();
}

Checkpoint::~Checkpoint() = default;
Checkpoint::Checkpoint(Checkpoint&&) noexcept = default;
Checkpoint& Checkpoint::operator=(Checkpoint&&) noexcept = default;

void Checkpoint::load_single(const std::string& file) {
  files_.push_back(std::make_unique<SafetensorsFile>(file));
  for (const std::string& name : files_.back()->names()) owner_.emplace(name, 0);
}

void Checkpoint::load_index(const std::string& index_path) {
  Json index;
  try {
    index = json_parse(read_small_file(index_path));
  } catch (const Error& e) {
    DSV41RT_THROW_CODE(kInvalidArgument, "safetensors index '", index_path,
                       "' is not valid JSON: ", e.message());
  }
  if (!index.is_object()) {
    DSV41RT_THROW("safetensors index '", index_path, "' must be a JSON object, got ",
                  index.type_name());
  }
  const Json* weight_map = index.find("weight_map");
  if (weight_map == nullptr || !weight_map->is_object()) {
    DSV41RT_THROW("safetensors index '", index_path, "' has no 'weight_map' object");
  }

  // shard file name -> one tensor mapped to it (for error messages)
  std::map<std::string, std::string> shards;
  for (const auto& [tensor, shard] : weight_map->as_object()) {
    if (!shard.is_string()) {
      DSV41RT_THROW("safetensors index '", index_path, "': weight_map entry for tensor '", tensor,
                    "' must be a string, got ", shard.type_name());
    }
    const fs::path rel(shard.as_string());
    bool escapes = rel.is_absolute() || rel.empty();
    for (const auto& part : rel) escapes = escapes || part == "..";
    if (escapes) {
      DSV41RT_THROW("safetensors index '", index_path, "': shard '", shard.as_string(),
                    "' (tensor '", tensor, "') must be a relative path inside the directory");
    }
    shards.emplace(shard.as_string(), tensor);
  }

  const fs::path dir = fs::path(index_path).parent_path();
  std::map<std::string, size_t> shard_index;
  for (const auto& [shard, some_tensor] : shards) {
    const std::string shard_path = (dir / shard).string();
    std::error_code ec;
    if (!fs::exists(shard_path, ec)) {
      DSV41RT_THROW_CODE(kNotFound, "safetensors index '", index_path, "': shard '", shard_path,
                         "' (holding tensor '", some_tensor, "') does not exist");
    }
    shard_index[shard] = files_.size();
    files_.push_back(std::make_unique<SafetensorsFile>(shard_path));
  }

  for (size_t i = 0; i < files_.size(); ++i) {
    for (const std::string& name : files_[i]->names()) {
      auto [it, inserted] = owner_.emplace(name, i);
      if (!inserted) {
        DSV41RT_THROW("tensor '", name, "' appears in two shards: '", files_[it->second]->path(),
                      "' and '", files_[i]->path(), "'");
      }
    }
  }
  for (const auto& [tensor, shard] : weight_map->as_object()) {
    const SafetensorsFile& file = *files_[shard_index.at(shard.as_string())];
    if (!file.contains(tensor)) {
      DSV41RT_THROW_CODE(kNotFound, "safetensors index '", index_path, "' maps tensor '", tensor,
                         "' to shard '", file.path(), "', which does not contain it");
    }
  }
  for (const auto& file : files_) {
    for (const std::string& name : file->names()) {
      if (weight_map->find(name) == nullptr) {
        DSV41RT_THROW("tensor '", name, "' in shard '", file->path(),
                      "' is not listed in the weight_map of '", index_path, "'");
      }
    }
  }
}

void Checkpoint::finish() {
  names_.clear();
  names_.reserve(owner_.size());
  for (const auto& [name, idx] : owner_) names_.push_back(name);
  std::vector<const SafetensorsFile*> sorted;
  for (const auto& f : files_) sorted.push_back(f.get());
  std::sort(sorted.begin(), sorted.end(), [](const SafetensorsFile* a, const SafetensorsFile* b) {
    return a->path() < b->path();
  });
  for (const SafetensorsFile* f : sorted) {
    for (const auto& [k, v] : f->metadata()) metadata_.emplace(k, v);  // first wins
  }
}

bool Checkpoint::contains(std::string_view name) const {
  return owner_.find(name) != owner_.end() || owned_.find(name) != owned_.end();
}

const TensorInfo& Checkpoint::info(std::string_view name) const {
  if (auto o = owned_.find(name); o != owned_.end()) return o->second.info;
  auto it = owner_.find(name);
  if (it == owner_.end()) {
    DSV41RT_THROW_CODE(kNotFound, "checkpoint '", path_, "' has no tensor named '", name, "'");
  }
  return files_[it->second]->info(name);
}

TensorView Checkpoint::view(std::string_view name) const {
  if (auto o = owned_.find(name); o != owned_.end()) {
    // const_cast: as for the mappings, callers only read through TensorView.
    return TensorView(const_cast<uint8_t*>(o->second.bytes.data()), o->second.info.dtype,
                      o->second.info.shape);
  }
  auto it = owner_.find(name);
  if (it == owner_.end()) {
    DSV41RT_THROW_CODE(kNotFound, "checkpoint '", path_, "' has no tensor named '", name, "'");
  }
  return files_[it->second]->view(name);
}

void Checkpoint::add_owned(const std::string& name, DType dtype, std::vector<int64_t> shape,
                           std::vector<uint8_t> bytes) {
  DSV41RT_CHECK_CODE(kInvalidArgument, !contains(name), "checkpoint '", path_, "': tensor '", name,
                     "' is already present");
  TensorInfo info;
  info.name = name;
  info.dtype = dtype;
  info.shape = std::move(shape);
  info.nbytes = bytes.size();
  info.file = "<memory>";
  const uint64_t want = uint64_t(bytes_for(dtype, info.numel()));
  DSV41RT_CHECK_CODE(kInvalidArgument, want == bytes.size(), "checkpoint '", path_, "': tensor '",
                     name, "' has ", bytes.size(), " bytes, its dtype and shape need ", want);
  owned_.emplace(name, Owned{std::move(info), std::move(bytes)});
  names_.insert(std::lower_bound(names_.begin(), names_.end(), name), name);
}

const uint8_t* Checkpoint::tensor_data(std::string_view name) const {
  return static_cast<const uint8_t*>(view(name).data);
}

std::vector<std::string> Checkpoint::files() const {
  std::vector<std::string> out;
  for (const auto& f : files_) out.push_back(f->path());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace dsv41rt
