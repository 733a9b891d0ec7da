// The (seed, step) uniform of the token sampler (contract: kernels/sampling.h), one definition for
// host and device code so that every backend draws the same u: a counter-based generator with no
// state, x = mix(mix(seed + G) + (step + 1) G), u = (x >> 11) 2^-53, G the golden-ratio gamma and
// mix the splitmix64 finaliser.
#pragma once

#include <cstdint>

#include "core/dtype.h"  // DSV41RT_HOST_DEVICE

namespace dsv41rt::kernels {

DSV41RT_HOST_DEVICE inline uint64_t splitmix64_mix(uint64_t z) {
  z ^= z >> 30;
  z *= 0xBF58476D1CE4E5B9ull;
  z ^= z >> 27;
  z *= 0x94D049BB133111EBull;
  z ^= z >> 31;
  return z;
}

DSV41RT_HOST_DEVICE inline double uniform_of(uint64_t seed, uint64_t step) {
  constexpr uint64_t kGamma = 0x9E3779B97F4A7C15ull;
  const uint64_t key = splitmix64_mix(seed + kGamma);
  const uint64_t x = splitmix64_mix(key + (step + 1) * kGamma);
  return double(x >> 11) * 0x1.0p-53;
}

}  // namespace dsv41rt::kernels
