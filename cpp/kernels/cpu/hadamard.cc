#include "kernels/hadamard.h"

#include <cmath>
#include <cstring>

#include "core/status.h"

namespace dsv41rt::kernels::cpu {

void walsh_hadamard(const float* x, int64_t rows, int64_t dim, float* y) {
  DSV41RT_CHECK(rows >= 0, "walsh_hadamard: rows=", rows);
  DSV41RT_CHECK(dim >= 1 && (dim & (dim - 1)) == 0, "walsh_hadamard: dim ", dim,
                " is not a power of two");
  if (rows == 0) return;
  DSV41RT_CHECK(x && y, "walsh_hadamard: null x or y");
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(dim)));
  for (int64_t r = 0; r < rows; ++r) {
    float* v = y + r * dim;
    if (v != x + r * dim) std::memcpy(v, x + r * dim, sizeof(float) * dim);
    for (int64_t h = 1; h < dim; h *= 2) {
      for (int64_t i0 = 0; i0 < dim; i0 += 2 * h) {
        for (int64_t i = i0; i < i0 + h; ++i) {
          const float a = v[i], b = v[i + h];
          v[i] = a + b;
          v[i + h] = a - b;
        }
      }
    }
    for (int64_t i = 0; i < dim; ++i) v[i] *= scale;
  }
}

}  // namespace dsv41rt::kernels::cpu
