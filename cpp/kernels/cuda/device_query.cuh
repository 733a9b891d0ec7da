// CUDA device queries, kept in a .cu so the host-only core never includes CUDA headers.
#pragma once

namespace dsv41rt::kernels {

/// Devices visible to the CUDA runtime; 0 when the driver is missing or reports an error.
int cuda_device_count() noexcept;

}  // namespace dsv41rt::kernels
