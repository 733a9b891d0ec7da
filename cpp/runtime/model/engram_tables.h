// Loading the Engram hashing inputs (normalised-token map, per-layer multipliers / primes /
// offsets) from a checkpoint's engram_tables.st, for hosts without Python (the C API).
// The Python control plane computes them from tokenizer.json and writes that file
// (python/dsv41rt/tokenizer/engram_file.py; `dsv41rt prepare CHECKPOINT`).
#pragma once

#include <string>

#include "core/export.h"
#include "runtime/model/executor.h"
#include "runtime/model/model_config.h"

namespace dsv41rt::model {

inline constexpr const char* kEngramTablesFile = "engram_tables.st";

/// Empty tables for a model without Engram; otherwise the validated tables of `checkpoint_dir`.
/// Throws Error naming the file and tensor (missing file: how to write it).
DSV41RT_API EngramTables load_engram_tables(const std::string& checkpoint_dir,
                                            const ModelConfig& c);
/// The same from an explicit engram_tables.st path.
DSV41RT_API EngramTables load_engram_tables_file(const std::string& path, const ModelConfig& c);

}  // namespace dsv41rt::model
