// DeepSeek-V4's quantised cache rows and indexer rotation on CUDA (kernels/cuda/paged.cu kV4Row,
// quant.cu v4_row_qdq, hadamard.cu) through the CUDA Backend, against the CPU references
// (kernels/cpu/paged.cc, quant.cc v4_row_*, hadamard.cc) on fresh random inputs (the seed is
// printed with every failure). Built only in CUDA builds; skipped without a device unless
// DSV41RT_REQUIRE_CUDA=1.
//
// Every comparison is bitwise: packed bytes exactly, FP32 outputs bit for bit except NaN payloads
// (x86 propagates an operand's NaN through a product or sum, the GPU gives its canonical NaN;
// nan_aware_equal requires the same NaN positions). Outputs are poisoned with a finite pattern
// (0xA5 bytes) on both sides, so an element the GPU leaves unwritten differs from the CPU's, and
// elements of padding items must keep the poison; packed pools start as the same random bytes
// on both sides, so bytes of padding rows and of rows not stored must stay as they were.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backend_test_util.h"
#include "kernels/hadamard.h"
#include "kernels/paged.h"
#include "kernels/quant.h"

namespace dsv41rt::testing {
namespace {

using kernels::kV4RowBytes;
using kernels::kV4RowDim;
using kernels::PagedRows;
using kernels::RingRows;
using kernels::RowFormat;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Every element still holds the finite poison (0xA5 bytes).
bool all_poison(const std::vector<float>& v) {
  return std::all_of(v.begin(), v.end(), [](float e) { return bits_of(e) == 0xA5A5A5A5u; });
}

class BackendCudaV4Rows : public CudaKernelTest {
 protected:
  Stream stream() { return cuda().stream(0); }

  // Rows [n, 512] of normal values with a random power-of-two magnitude per 64-channel block
  // (scales across E4M3's and UE8M0's range), and special rows: zeros, huge values, inf, NaN,
  // subnormals, BF16 ties in the tail, -0.
  std::vector<float> v4_rows(int64_t n) {
    std::vector<float> x = normal(n * kV4RowDim);
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t k = 0; k < kV4RowDim / 64; ++k) {
        const float m = std::ldexp(1.0f, int(randint(-30, 30)));
        for (int64_t i = 0; i < 64; ++i) x[r * kV4RowDim + k * 64 + i] *= m;
      }
    }
    auto row = [&](int64_t r) { return x.data() + (r % n) * kV4RowDim; };
    if (n > 1) std::fill(row(1), row(1) + kV4RowDim, 0.0f);
    if (n > 2) {
      row(2)[3] = 3.0e38f, row(2)[70] = -3.4e38f, row(2)[460] = 3.4e38f;  // huge, BF16 overflow
      row(2)[130] = kInf, row(2)[200] = -kInf, row(2)[500] = -kInf;
    }
    if (n > 3) {
      row(3)[0] = kNaN, row(3)[64 * 6 + 5] = -kNaN, row(3)[449] = kNaN;
      row(3)[129] = kInf, row(3)[130] = kNaN;  // inf and NaN in one block
    }
    if (n > 4) {
      for (int64_t c = 0; c < 64; ++c) row(4)[c] = std::ldexp(float(c + 1), -140);  // subnormal
      row(4)[64] = -0.0f, row(4)[470] = -0.0f;
      row(4)[480] = std::bit_cast<float>(0x3F808000u);  // a BF16 tie (rounds to even)
      row(4)[481] = std::bit_cast<float>(0x3F818000u);  // a BF16 tie (rounds up)
      row(4)[482] = std::ldexp(1.0f, -135);             // BF16 subnormal
    }
    return x;
  }

  // A pool of `pages` pages of `per_page` rows after `offset` bytes (+ 8 spare bytes a page), the
  // same random bytes on the host and the device.
  struct Pool {
    std::vector<uint8_t> host;
    Buffer<uint8_t> dev;
    int64_t page_bytes;
  };
  Pool pool(int64_t pages, int64_t per_page, int64_t offset) {
    const int64_t page_bytes = offset + per_page * kV4RowBytes + 8;
    std::vector<uint8_t> host = random_bytes(pages * page_bytes);
    Buffer<uint8_t> dev = upload(cuda(), host);
    return Pool{std::move(host), std::move(dev), page_bytes};
  }
};

// ---- cache_qdq ---------------------------------------------------------------------------------

TEST_F(BackendCudaV4Rows, QdqIsTheReferenceBitwise) {
  for (const int64_t rows : {int64_t(1), int64_t(5), int64_t(37), int64_t(700)}) {
    const std::vector<float> x = v4_rows(rows);
    Buffer<float> dx = upload(cuda(), x);
    cuda().cache_qdq(RowFormat::kV4Row, dx.get(), rows, kV4RowDim, stream());
    std::vector<float> want(x.size());
    kernels::cpu::v4_row_qdq(x.data(), rows, kV4RowDim, want.data());
    EXPECT_TRUE(nan_aware_equal(dx.download(), want)) << "rows " << rows;
  }
}

TEST_F(BackendCudaV4Rows, QdqOfNoRowsWritesNothing) {
  Buffer<float> x = poisoned<float>(cuda(), kV4RowDim, kIndexPoison);
  cuda().cache_qdq(RowFormat::kV4Row, x.get(), 0, kV4RowDim, stream());
  EXPECT_TRUE(all_poison(x.download()));
}

// ---- paged rows --------------------------------------------------------------------------------

// pack_paged: rows of items 0..B-1 at distinct entries through a shuffled page table, padding
// rows (item -1) pointing at entries nobody writes; the whole pool must equal the CPU's.
TEST_F(BackendCudaV4Rows, PackPagedIsTheReferenceBitwise) {
  for (const int64_t n : {int64_t(1), int64_t(9), int64_t(61)}) {
    const int64_t B = 3, per_page = 4, max_pages = (n + per_page) / per_page + 1, offset = 24;
    const int64_t pages = B * max_pages;
    Pool p = pool(pages, per_page, offset);
    std::vector<int64_t> perm = permutation(pages);
    std::vector<int32_t> table(perm.begin(), perm.end());
    std::vector<int32_t> item(n);
    std::vector<int64_t> entry(n);
    std::vector<int64_t> next(B, 0);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t b = randint(-1, B - 1);  // -1: padding
      item[i] = int32_t(b);
      entry[i] = b < 0 ? randint(0, max_pages * per_page - 1) : next[b]++;
    }
    const std::vector<float> x = v4_rows(n);
    Buffer<int32_t> dtable = upload(cuda(), table), ditem = upload(cuda(), item);
    Buffer<int64_t> dentry = upload(cuda(), entry);
    Buffer<float> dx = upload(cuda(), x);
    PagedRows dst{p.dev.get(), p.page_bytes, dtable.get(), max_pages,
                  per_page,    offset,       kV4RowBytes};
    cuda().pack_paged(RowFormat::kV4Row, dst, kV4RowDim, n, dx.get(), ditem.get(), dentry.get(),
                      stream());
    PagedRows hdst{p.host.data(), p.page_bytes, table.data(), max_pages,
                   per_page,      offset,       kV4RowBytes};
    kernels::cpu::pack_paged(RowFormat::kV4Row, hdst, kV4RowDim, n, x.data(), item.data(),
                             entry.data());
    EXPECT_TRUE(bitwise_equal(p.dev.download(), p.host)) << "n " << n;
  }
}

// unpack_paged over random pool bytes (every FP8, UE8M0 and BF16 code, NaN codes included);
// items with fewer entries than max_count (and none) leave their output rows poisoned.
TEST_F(BackendCudaV4Rows, UnpackPagedIsTheReferenceBitwise) {
  const int64_t B = 4, per_page = 3, max_pages = 5, max_count = per_page * max_pages, offset = 8;
  Pool p = pool(B * max_pages, per_page, offset);
  std::vector<int64_t> perm = permutation(B * max_pages);
  std::vector<int32_t> table(perm.begin(), perm.end());
  std::vector<int64_t> count{max_count, 0, randint(1, max_count - 1), randint(1, max_count)};
  std::vector<int64_t> out_offset(B);
  int64_t total = 0;
  for (int64_t b = 0; b < B; ++b) out_offset[b] = total, total += max_count;
  Buffer<int32_t> dtable = upload(cuda(), table);
  Buffer<int64_t> dcount = upload(cuda(), count), doff = upload(cuda(), out_offset);
  Buffer<float> out = poisoned<float>(cuda(), total * kV4RowDim, kIndexPoison);
  PagedRows src{p.dev.get(), p.page_bytes, dtable.get(), max_pages, per_page, offset, kV4RowBytes};
  cuda().unpack_paged(RowFormat::kV4Row, src, kV4RowDim, B, max_count, dcount.get(), doff.get(),
                      out.get(), stream());
  std::vector<float> want(size_t(total * kV4RowDim), std::bit_cast<float>(0xA5A5A5A5u));
  PagedRows hsrc{p.host.data(), p.page_bytes, table.data(), max_pages,
                 per_page,      offset,       kV4RowBytes};
  kernels::cpu::unpack_paged(RowFormat::kV4Row, hsrc, kV4RowDim, B, max_count, count.data(),
                             out_offset.data(), want.data());
  EXPECT_TRUE(nan_aware_equal(out.download(), want));
  EXPECT_TRUE(bitwise_equal(p.dev.download(), p.host));  // read only
}

// ---- ring rows ---------------------------------------------------------------------------------

TEST_F(BackendCudaV4Rows, PackAndUnpackRingAreTheReferenceBitwise) {
  const int64_t B = 3, ring = 7, offset = 40, slot_bytes = offset + ring * kV4RowBytes + 16;
  std::vector<uint8_t> init = random_bytes(B * slot_bytes);
  Buffer<uint8_t> dslots_mem = upload(cuda(), init);
  std::vector<uint8_t> hslots_mem = init;
  std::vector<uint8_t*> dslots(B), hslots(B);
  for (int64_t b = 0; b < B; ++b) {
    dslots[b] = dslots_mem.get() + b * slot_bytes, hslots[b] = hslots_mem.data() + b * slot_bytes;
  }
  // Distinct ring positions per item (no two rows of one item on one ring row), some rows not
  // stored, some padding.
  std::vector<int32_t> item;
  std::vector<int64_t> positions;
  std::vector<uint8_t> store;
  for (int64_t b = -1; b < B; ++b) {
    const int64_t base = randint(0, 100);
    const int64_t k = randint(1, ring);
    for (int64_t j = 0; j < k; ++j) {
      item.push_back(int32_t(b));
      positions.push_back(base + j);
      store.push_back(uint8_t(randint(0, 3) != 0));
    }
  }
  const int64_t n = int64_t(item.size());
  const std::vector<float> x = v4_rows(n);
  Buffer<uint8_t*> ds = upload(cuda(), dslots);
  Buffer<int32_t> ditem = upload(cuda(), item);
  Buffer<int64_t> dpos = upload(cuda(), positions);
  Buffer<uint8_t> dstore = upload(cuda(), store);
  Buffer<float> dx = upload(cuda(), x);
  cuda().pack_ring(RowFormat::kV4Row, RingRows{ds.get(), offset, ring, kV4RowBytes}, kV4RowDim, n,
                   dx.get(), ditem.get(), dpos.get(), dstore.get(), stream());
  kernels::cpu::pack_ring(RowFormat::kV4Row, RingRows{hslots.data(), offset, ring, kV4RowBytes},
                          kV4RowDim, n, x.data(), item.data(), positions.data(), store.data());
  EXPECT_TRUE(bitwise_equal(dslots_mem.download(), hslots_mem));

  // unpack: every item's whole ring from a random first position (wrapping), one item empty.
  std::vector<int64_t> first(B), count(B), out_offset(B);
  for (int64_t b = 0; b < B; ++b) {
    first[b] = randint(0, 50), count[b] = b == 1 ? 0 : randint(1, ring), out_offset[b] = b * ring;
  }
  Buffer<int64_t> dfirst = upload(cuda(), first), dcount = upload(cuda(), count),
                  doff = upload(cuda(), out_offset);
  Buffer<float> out = poisoned<float>(cuda(), B * ring * kV4RowDim, kIndexPoison);
  cuda().unpack_ring(RowFormat::kV4Row, RingRows{ds.get(), offset, ring, kV4RowBytes}, kV4RowDim, B,
                     ring, dfirst.get(), dcount.get(), doff.get(), out.get(), stream());
  std::vector<float> want(size_t(B * ring * kV4RowDim), std::bit_cast<float>(0xA5A5A5A5u));
  kernels::cpu::unpack_ring(RowFormat::kV4Row, RingRows{hslots.data(), offset, ring, kV4RowBytes},
                            kV4RowDim, B, ring, first.data(), count.data(), out_offset.data(),
                            want.data());
  EXPECT_TRUE(nan_aware_equal(out.download(), want));
}

// A row of the wrong width is refused (kV4Row holds head_dim 512 only), as on the CPU.
TEST_F(BackendCudaV4Rows, OtherWidthsAreRefused) {
  Buffer<float> x = poisoned<float>(cuda(), 256);
  EXPECT_ANY_THROW(cuda().cache_qdq(RowFormat::kV4Row, x.get(), 1, 256, stream()));
}

// ---- walsh_hadamard ----------------------------------------------------------------------------

TEST_F(BackendCudaV4Rows, WalshHadamardIsTheReferenceBitwise) {
  for (const int64_t dim :
       {int64_t(1), int64_t(2), int64_t(32), int64_t(128), int64_t(1024), int64_t(8192)}) {
    for (const int64_t rows : {int64_t(1), int64_t(3), int64_t(70)}) {
      std::vector<float> x = normal(rows * dim);
      for (int64_t r = 0; r < rows; ++r) {
        const float m = std::ldexp(1.0f, int(randint(-20, 20)));
        for (int64_t i = 0; i < dim; ++i) x[r * dim + i] *= m;
      }
      if (rows > 1) std::fill(x.begin() + dim, x.begin() + 2 * dim, 0.0f);
      if (rows > 2) {  // overflow to inf, inf - inf = NaN, NaN
        x[2 * dim] = 3.0e38f;
        if (dim > 1) x[2 * dim + 1] = 3.0e38f;
        if (dim > 2) x[2 * dim + 2] = kInf;
        if (dim > 3) x[2 * dim + 3] = kNaN;
      }
      std::vector<float> want(x.size());
      kernels::cpu::walsh_hadamard(x.data(), rows, dim, want.data());
      Buffer<float> dx = upload(cuda(), x);
      Buffer<float> y = poisoned<float>(cuda(), rows * dim, kIndexPoison);
      cuda().walsh_hadamard(dx.get(), rows, dim, y.get(), stream());
      EXPECT_TRUE(nan_aware_equal(y.download(), want)) << "dim " << dim << " rows " << rows;
      cuda().walsh_hadamard(dx.get(), rows, dim, dx.get(), stream());  // in place
      EXPECT_TRUE(nan_aware_equal(dx.download(), want)) << "in place, dim " << dim;
    }
  }
}

TEST_F(BackendCudaV4Rows, WalshHadamardOfNoRowsWritesNothing) {
  Buffer<float> y = poisoned<float>(cuda(), 128, kIndexPoison);
  cuda().walsh_hadamard(y.get(), 0, 128, y.get(), stream());
  EXPECT_TRUE(all_poison(y.download()));
}

// ---- graph capture -----------------------------------------------------------------------------

// The new ops captured into one graph and replayed give the eager results bitwise (no host
// synchronisation or allocation inside them).
TEST_F(BackendCudaV4Rows, CapturedOpsReplayTheEagerResults) {
  Backend& be = cuda();
  const int64_t n = 6, per_page = 4, max_pages = 2, ring = 5, DI = 128;
  const std::vector<float> x = v4_rows(n);
  const std::vector<float> q = normal(n * DI);
  std::vector<int32_t> table{1, 0, 3, 2};
  std::vector<int32_t> item{0, 1, -1, 0, 1, 1};
  std::vector<int64_t> entry{0, 0, 5, 1, 1, 2}, count{2, 3}, out_offset{0, 2}, first{0, 0};
  std::vector<uint8_t> store{1, 1, 1, 0, 1, 1};
  Buffer<float> dx = upload(be, x), dq = upload(be, q);
  Buffer<int32_t> dtable = upload(be, table), ditem = upload(be, item);
  Buffer<int64_t> dentry = upload(be, entry), dcount = upload(be, count),
                  doff = upload(be, out_offset), dfirst = upload(be, first);
  Buffer<uint8_t> dstore = upload(be, store);
  const int64_t page_bytes = per_page * kV4RowBytes;
  const std::vector<uint8_t> pool_init = random_bytes(4 * page_bytes);
  const std::vector<uint8_t> ring_init = random_bytes(2 * ring * kV4RowBytes);
  struct Outputs {
    Buffer<uint8_t> pool, slots_mem;
    Buffer<uint8_t*> slots;
    Buffer<float> paged_rows, ring_rows, qdq, rotated;
  };
  auto outputs = [&] {
    Outputs o{upload(be, pool_init),
              upload(be, ring_init),
              Buffer<uint8_t*>(be, 2),
              poisoned<float>(be, 5 * kV4RowDim, kIndexPoison),
              poisoned<float>(be, 5 * kV4RowDim, kIndexPoison),
              upload(be, x),
              poisoned<float>(be, n * DI, kIndexPoison)};
    o.slots.upload({o.slots_mem.get(), o.slots_mem.get() + ring * kV4RowBytes});
    return o;
  };
  auto enqueue = [&](Outputs& o) {
    const Stream st = be.stream(0);
    const PagedRows paged{o.pool.get(), page_bytes, dtable.get(), max_pages,
                          per_page,     0,          kV4RowBytes};
    const RingRows rr{o.slots.get(), 0, ring, kV4RowBytes};
    be.pack_paged(RowFormat::kV4Row, paged, kV4RowDim, n, dx.get(), ditem.get(), dentry.get(), st);
    be.unpack_paged(RowFormat::kV4Row, paged, kV4RowDim, 2, 3, dcount.get(), doff.get(),
                    o.paged_rows.get(), st);
    be.pack_ring(RowFormat::kV4Row, rr, kV4RowDim, n, dx.get(), ditem.get(), dentry.get(),
                 dstore.get(), st);
    be.unpack_ring(RowFormat::kV4Row, rr, kV4RowDim, 2, 3, dfirst.get(), dcount.get(), doff.get(),
                   o.ring_rows.get(), st);
    be.cache_qdq(RowFormat::kV4Row, o.qdq.get(), n, kV4RowDim, st);
    be.walsh_hadamard(dq.get(), n, DI, o.rotated.get(), st);
  };
  const auto [eager, graph] = eager_and_replayed(be, outputs, enqueue);
  EXPECT_TRUE(all_written(graph.rotated.download(), kIndexPoison));
  EXPECT_TRUE(bitwise_equal(graph.pool.download(), eager.pool.download()));
  EXPECT_TRUE(bitwise_equal(graph.slots_mem.download(), eager.slots_mem.download()));
  EXPECT_TRUE(bitwise_equal(graph.paged_rows.download(), eager.paged_rows.download()));
  EXPECT_TRUE(bitwise_equal(graph.ring_rows.download(), eager.ring_rows.download()));
  EXPECT_TRUE(bitwise_equal(graph.qdq.download(), eager.qdq.download()));
  EXPECT_TRUE(bitwise_equal(graph.rotated.download(), eager.rotated.download()));
}

}  // namespace
}  // namespace dsv41rt::testing
