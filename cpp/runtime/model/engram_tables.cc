#include "runtime/model/engram_tables.h"

#include <cstring>
#include <filesystem>

#include "core/safetensors.h"
#include "core/status.h"

namespace dsv41rt::model {

namespace {

template <typename T>
std::vector<T> read(const SafetensorsFile& f, const std::string& name, DType dtype, int64_t n) {
  DSV41RT_CHECK_CODE(kNotFound, f.contains(name), f.path(), ": missing tensor ", name);
  const TensorInfo& info = f.info(name);
  DSV41RT_CHECK(info.dtype == dtype && info.shape == std::vector<int64_t>{n}, f.path(), ": tensor ",
                name, " must be ", dtype_name(dtype), " [", n, "]");
  std::vector<T> values(static_cast<size_t>(n));
  std::memcpy(values.data(), f.tensor_data(name), static_cast<size_t>(n) * sizeof(T));
  return values;
}

}  // namespace

EngramTables load_engram_tables(const std::string& checkpoint_dir, const ModelConfig& c) {
  if (!c.engram) return {};
  const std::string path = (std::filesystem::path(checkpoint_dir) / kEngramTablesFile).string();
  DSV41RT_CHECK_CODE(kNotFound, std::filesystem::is_regular_file(path), checkpoint_dir,
                     ": this model has Engram layers and their hashing inputs (", kEngramTablesFile,
                     ") are missing; write them with `dsv41rt prepare ", checkpoint_dir,
                     "` (Python, reads tokenizer.json)");
  return load_engram_tables_file(path, c);
}

EngramTables load_engram_tables_file(const std::string& path, const ModelConfig& c) {
  EngramTables t;
  if (!c.engram) return t;
  const EngramSpec& e = *c.engram;
  DSV41RT_CHECK_CODE(kNotFound, std::filesystem::is_regular_file(path), "engram_tables: ", path,
                     " is not a file");
  const SafetensorsFile f(path);
  t.token_map = read<int32_t>(f, "token_map", DType::kI32, c.vocab_size);
  for (int32_t id : t.token_map) {
    DSV41RT_CHECK(id >= 0 && id < e.compressed_vocab_size, path, ": token_map value ", id,
                  " outside [0, engram_compressed_vocab_size ", e.compressed_vocab_size, ")");
  }
  const int64_t cols = int64_t(e.max_ngram_size - 1) * e.n_heads;
  for (size_t i = 0; i < e.layer_ids.size(); ++i) {
    const std::string p = "layer" + std::to_string(i) + ".";
    EngramTables::Layer L;
    L.multipliers = read<int64_t>(f, p + "multipliers", DType::kI64, e.max_ngram_size);
    L.primes = read<int64_t>(f, p + "primes", DType::kI64, cols);
    L.offsets = read<int64_t>(f, p + "offsets", DType::kI64, cols);
    for (int64_t prime : L.primes) {
      DSV41RT_CHECK(prime > 0, path, ": ", p, "primes holds ", prime, " (must be > 0)");
    }
    t.layers.push_back(std::move(L));
  }
  DSV41RT_CHECK(!f.contains("layer" + std::to_string(e.layer_ids.size()) + ".primes"), path,
                ": tables for more Engram layers than the config's ", e.layer_ids.size());
  return t;
}

}  // namespace dsv41rt::model
