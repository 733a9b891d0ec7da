// Device discovery. Lets tests and the control plane ask whether a CUDA device is usable without
// linking CUDA themselves; a CPU-only build always reports zero devices.
#pragma once

#include "core/export.h"

namespace dsv41rt {

/// Number of CUDA devices the driver reports; 0 for CPU-only builds, a missing driver, or any
/// CUDA error (never throws: used to decide whether GPU tests run).
DSV41RT_API int cuda_device_count() noexcept;

}  // namespace dsv41rt
