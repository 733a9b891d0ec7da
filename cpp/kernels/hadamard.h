// Contract: the orthonormal Walsh-Hadamard transform of the V4 indexer keys (architecture spec
// §2.6.4, §5.4: after norm and RoPE each 128-wide index key is rotated by H_128 · 128^-0.5 before
// its FP4 QDQ; official reference: `rotate_activation` = fast_hadamard_transform's
// hadamard_transform(x, scale=dim**-0.5)). transformers 5.23 and NeMo omit it (it is orthogonal,
// so it changes only the FP4 rounding); the test checks it against the Sylvester matrix in double.
//
//   x, y [rows, dim] FP32 row-major, dim a power of two (128 for V4); y may alias x.
//   y[r] = H_dim · x[r] · dim^-0.5 with H_dim the Sylvester (natural-order) Hadamard matrix,
//   H[i][j] = (-1)^popcount(i & j)  (= scipy.linalg.hadamard, = hadamard_transform's ordering).
//
// Exact FP32 order: the in-place butterfly over log2(dim) stages with spans h = 1, 2, 4, ...,
// dim/2; each stage maps every pair (i, i + h), i with bit h clear, to (v_i + v_{i+h},
// v_i - v_{i+h}); after the last stage every element is multiplied once by the FP32 value of
// dim^-0.5 (rounded from double). So each output is a fixed binary tree of log2(dim) rounded
// additions, then one product with the rounded scale: |y - exact| <= (log2(dim) + 2) · u · dim^-0.5
// · Σ|x| to first order (u = 2^-24: γ_log2(dim) for the tree, u each for the scale and product).
// CUDA: kernels/cuda/hadamard.cuh, the same sequence, so bitwise equal (dim up to 8192 there).
#pragma once

#include <cstdint>

#include "core/export.h"

namespace dsv41rt::kernels::cpu {

/// y = x · H_dim^T · dim^-0.5 row by row (H is symmetric). Throws Error on null pointers,
/// rows < 0 or a dim that is not a power of two >= 1.
DSV41RT_API void walsh_hadamard(const float* x, int64_t rows, int64_t dim, float* y);

}  // namespace dsv41rt::kernels::cpu
