// Names of the enumerators of a dense enum (values 0..N-1 in declaration order), from one table:
// the same mapping a switch with a case per enumerator spells out, without the repetition.
#pragma once

#include <cstddef>

namespace dsv41rt {

/// names[e] for 0 <= e < N, else `fallback`.
template <class E, size_t N>
constexpr const char* enum_name(E e, const char* const (&names)[N], const char* fallback) noexcept {
  const auto i = static_cast<size_t>(e);
  return i < N ? names[i] : fallback;
}

}  // namespace dsv41rt
