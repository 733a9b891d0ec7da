// Synthetic weight codes on the device (contract: kernels/synthetic_codes.h).
#include <algorithm>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/synthetic_codes.cuh"

namespace dsv41rt::kernels::cuda {
namespace {

// Codes per thread: one jump amortised over 64 uint32 words (FP8: two streams, two jumps).
constexpr int64_t kSpan = 256;
constexpr int kSynthThreads = 128;

// Byte i % 4 of word i / 4 of the stream from word `first_word`, for i in [lo, hi), sequentially.
struct ByteCursor {
  Pcg64Words words;
  uint32_t word;
  int left;
  __device__ ByteCursor(const Pcg64Start& s, uint64_t first_word, int64_t lo)
      : words(s, first_word + uint64_t(lo) / 4), word(0), left(0) {
    for (int skip = int(lo % 4); skip > 0; --skip) next();
  }
  __device__ uint8_t next() {
    if (left == 0) word = words.next(), left = 4;
    const uint8_t b = uint8_t(word);
    word >>= 8, --left;
    return b;
  }
};

__global__ void synth_codes_kernel(SynthCodes kind, Pcg64Start start, int64_t n, int64_t begin,
                                   int64_t end, uint8_t* out) {
  pdl_entry();
  const int64_t lo = begin + (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * kSpan;
  if (lo >= end) return;
  const int64_t hi = lo + kSpan < end ? lo + kSpan : end;
  ByteCursor bits(start, 0, lo);
  if (kind == SynthCodes::kFp8) {
    ByteCursor exps(start, uint64_t(n + 3) / 4, lo);
    for (int64_t i = lo; i < hi; ++i) {
      const uint8_t b = bits.next(), e = exps.next();
      out[i - begin] = uint8_t((b & 0x87) | (((e >> 6) + 5) << 3));
    }
    return;
  }
  // kSpan is even and begin is even (checked), so every thread starts on a code pair.
  for (int64_t i = lo; i < hi; i += 2) {
    const uint8_t c0 = bits.next() >> 4, c1 = bits.next() >> 4;
    out[(i - begin) / 2] = uint8_t(c0 | (c1 << 4));
  }
}

}  // namespace

cudaError_t synth_chunk_codes(SynthCodes kind, const Pcg64Start& start, int64_t n, int64_t begin,
                              int64_t end, uint8_t* out, cudaStream_t stream) {
  if (begin < 0 || begin > end || end > n) return cudaErrorInvalidValue;
  if (kind == SynthCodes::kFp4 && (begin % 2 || end % 2 || n % 2)) return cudaErrorInvalidValue;
  if (begin == end) return cudaSuccess;
  const int64_t threads = (end - begin + kSpan - 1) / kSpan;
  const int64_t blocks = (threads + kSynthThreads - 1) / kSynthThreads;
  if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
  synth_codes_kernel<<<unsigned(blocks), kSynthThreads, 0, stream>>>(kind, start, n, begin, end, out);
  return cudaGetLastError();
}

cudaError_t synth_tensor_codes(SynthCodes kind, uint64_t seed, uint32_t name_crc, int64_t rows,
                               int64_t cols, int64_t align, int64_t row_begin, int64_t row_end,
                               uint8_t* out, cudaStream_t stream) {
  if (rows < 0 || cols < 1 || align < 1 || row_begin < 0 || row_begin > row_end || row_end > rows) {
    return cudaErrorInvalidValue;
  }
  const int64_t step = synth_chunk_rows(cols, align);
  for (int64_t c = row_begin / step; c * step < row_end; ++c) {
    const int64_t cs = c * step, ce = std::min(rows, cs + step);
    const int64_t lo = std::max(row_begin, cs), hi = std::min(row_end, ce);
    const cudaError_t err =
        synth_chunk_codes(kind, pcg64_seed(seed, name_crc, uint64_t(c)), (ce - cs) * cols,
                          (lo - cs) * cols, (hi - cs) * cols, out, stream);
    if (err != cudaSuccess) return err;
    out += synth_code_bytes(kind, (hi - lo) * cols);
  }
  return cudaSuccess;
}

}  // namespace dsv41rt::kernels::cuda
