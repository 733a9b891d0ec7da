// Backend gathers and small elementwise ops: embed_rows (FP32 and BF16 tables, hc_mult copies),
// engram_gather (FP8 E4M3 rows with UE8M0 scales), gather_rows, scale, and engram_forward
// (contracts: kernels/paged.h, kernels/engram.h).
//
// Gathers and scale: EXACT on both instances, against naive implementations written here (the
// FP8 / UE8M0 / BF16 decodes too, from their definitions); the CUDA ones additionally against
// the CPU backend (kernels/cuda/paged.cuh: bitwise). NaN codes compare NaN-aware (payloads of
// NaN products may differ between the host and the GPU).
// engram_forward: max|y − ref| <= 1e-5 · max|ref| on the output and on the update y − x, on the
// CPU against float64 (the kv projection is an FP32 dot of D terms, the three per-stream
// reductions are FP64, the rest a handful of FP32 roundings: ~1e-6 of the update), on CUDA
// against the CPU (kernels/cuda/engram.cuh: the same FP64 reductions, the FP32 projection in
// another order; the Python suite's bound).
#include "backend_test_util.h"
#include "core/status.h"

namespace dsv41rt::testing {
namespace {

using model::Matrix;
using model::WeightFormat;

class BackendGather : public BackendTest {};

// OCP E4M3 ("e4m3fn"): bias 7, subnormals m·2^-9, 0x7F / 0xFF NaN; UE8M0: 2^(e−127), 255 NaN.
double e4m3_value(uint8_t code) {
  const int sign = code >> 7, exp = (code >> 3) & 15, man = code & 7;
  if (exp == 15 && man == 7) return NAN;
  const double mag = exp == 0 ? std::ldexp(man, -9) : std::ldexp(8 + man, exp - 10);
  return sign ? -mag : mag;
}
double e8m0_value(uint8_t code) { return code == 255 ? NAN : std::ldexp(1.0, int(code) - 127); }

TEST_P(BackendGather, EmbedRowsCopiesTheTokenRow) {
  const int64_t V = 300, H = 96;
  for (const int64_t copies : {int64_t(1), int64_t(4)}) {  // 4 = hc_mult
    for (const bool bf16_table : {false, true}) {
      SCOPED_TRACE(std::to_string(copies) +
                   (bf16_table ? " copies, bf16 table" : " copies, fp32 table"));
      std::vector<float> table = normal(V * H);
      std::vector<uint16_t> table_bits;
      for (float& v : table) v = round_bf16(v), table_bits.push_back(bf16_bits(v));
      std::vector<int32_t> tokens(37);
      for (int32_t& t : tokens) t = int32_t(randint(0, V - 1));
      tokens[1] = tokens[0];  // a repeated token
      const int64_t n = int64_t(tokens.size());
      auto run = [&](Backend& b) {
        Buffer<float> t32 = upload(b, table);
        Buffer<uint16_t> t16 = upload(b, table_bits);
        Buffer<int32_t> dtok = upload(b, tokens);
        Buffer<float> X = poisoned<float>(b, n * copies * H);
        b.embed_rows(bf16_table ? nullptr : t32.get(), bf16_table ? t16.get() : nullptr, dtok.get(),
                     n, H, copies, X.get(), b.stream(0));
        return X.download();
      };
      std::vector<float> want;
      for (int64_t t = 0; t < n; ++t) {
        for (int64_t i = 0; i < copies; ++i)
          want.insert(want.end(), &table[tokens[t] * H], &table[(tokens[t] + 1) * H]);
      }
      const std::vector<float> got = run(backend());
      EXPECT_TRUE(bitwise_equal(got, want));
      if (on_cuda()) {
        EXPECT_TRUE(bitwise_equal(got, run(cpu())));
      }
    }
  }
}

TEST_P(BackendGather, EngramGatherDecodesFp8Rows) {
  const int64_t table_rows = 500, hd = 256, n = 64;  // engram_head_dim 256
  // Random bytes reach every E4M3 code (NaN included); scales 100..140 are realistic, one row
  // carries the extremes 0 (2^-127) and 255 (NaN).
  const std::vector<uint8_t> codes = random_bytes(table_rows * hd);
  std::vector<uint8_t> scales(static_cast<size_t>(table_rows * hd / 32));
  for (uint8_t& s : scales) s = uint8_t(randint(100, 140));
  std::vector<int64_t> rows(static_cast<size_t>(n));
  for (int64_t& r : rows) r = randint(0, table_rows - 1);
  scales[rows[3] * (hd / 32)] = 0;
  scales[rows[3] * (hd / 32) + 1] = 255;
  auto run = [&](Backend& b) {
    Buffer<uint8_t> dc = upload(b, codes), ds = upload(b, scales);
    Buffer<int64_t> dr = upload(b, rows);
    Buffer<float> out = poisoned<float>(b, n * hd);
    b.engram_gather(dc.get(), ds.get(), dr.get(), n, hd, out.get(), b.stream(0));
    return out.download();
  };
  // code × scale is exact in FP64 (4 significant bits times a power of two); one rounding to FP32.
  std::vector<float> want(static_cast<size_t>(n * hd));
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t c = 0; c < hd; ++c) {
      want[i * hd + c] = float(e4m3_value(codes[rows[i] * hd + c]) *
                               e8m0_value(scales[rows[i] * (hd / 32) + c / 32]));
    }
  }
  const std::vector<float> got = run(backend());
  EXPECT_TRUE(nan_aware_equal(got, want));
  if (on_cuda()) {
    EXPECT_TRUE(nan_aware_equal(got, run(cpu())));
  }
}

TEST_P(BackendGather, GatherRowsAndScale) {
  const int64_t src_rows = 50, dim = 7168, n = 40;
  const std::vector<float> src = normal(src_rows * dim);
  std::vector<int64_t> rows(static_cast<size_t>(n));
  for (int64_t& r : rows) r = randint(0, src_rows - 1);  // any order, repeats allowed
  Buffer<float> dsrc = upload(backend(), src);
  Buffer<int64_t> drows = upload(backend(), rows);
  Buffer<float> dst = poisoned<float>(backend(), n * dim);
  backend().gather_rows(dsrc.get(), drows.get(), n, dim, dst.get(), backend().stream(0));
  std::vector<float> want;
  for (const int64_t r : rows) want.insert(want.end(), &src[r * dim], &src[(r + 1) * dim]);
  EXPECT_TRUE(bitwise_equal(dst.download(), want)) << "gather_rows";

  // copy_2d: a block of columns (rows 37 apart in the source) into columns 5.. of rows 50 apart;
  // the bytes around the block keep their poison.
  const int64_t block_rows = 9, cols = 11, src_pitch = 37, dst_pitch = 50, at = 5;
  Buffer<float> wide = poisoned<float>(backend(), block_rows * dst_pitch);
  backend().copy_2d(wide.get() + at, dst_pitch * 4, dsrc.get(), src_pitch * 4, cols * 4, block_rows,
                    backend().stream(0));
  std::vector<float> want2d(size_t(block_rows * dst_pitch), poison_float());
  for (int64_t r = 0; r < block_rows; ++r)
    std::copy_n(&src[r * src_pitch], cols, &want2d[r * dst_pitch + at]);
  EXPECT_TRUE(nan_aware_equal(wide.download(), want2d)) << "copy_2d";

  // scale: one FP32 product per element (subnormal results and signed zeros included).
  std::vector<float> x = normal(10000, 1e-36);
  x[0] = -0.0f, x[1] = 3.0e38f;
  const float factor = float(std::exp(double(randint(-5, 5)) + 0.5));
  Buffer<float> dx = upload(backend(), x);
  backend().scale(dx.get(), int64_t(x.size()), factor, backend().stream(0));
  for (float& v : x) v = v * factor;
  EXPECT_TRUE(bitwise_equal(dx.download(), x)) << "scale";
}

TEST_P(BackendGather, EngramForwardGatedUpdate) {
  struct Case {
    int64_t S, n, H, D;
  };
  // D = 8 hash heads x 256 (engram_head_dim) is the release width; n = hc_mult.
  for (const Case c : {Case{23, 4, 64, 96}, Case{5, 1, 1000, 40}, Case{3, 4, 512, 2048}}) {
    const int64_t S = c.S, n = c.n, H = c.H, D = c.D;
    SCOPED_TRACE("S " + std::to_string(S) + " n " + std::to_string(n) + " H " + std::to_string(H) +
                 " D " + std::to_string(D));
    std::vector<float> X = normal(S * n * H);
    std::fill_n(&X[(S / 2) * n * H], H, 0.0f);  // a zero stream: dot exactly 0, the 1e-6 clamp
    const std::vector<float> emb = normal(S * D),
                             wkv = normal((n + 1) * H * D, 10.0 / std::sqrt(double(D)));
    std::vector<float> qw = normal(n * H, 0.3), kw = normal(n * H, 0.3);
    for (float& v : qw) v += 1.0f;
    for (float& v : kw) v += 1.0f;
    for (const float eps : {1e-20f, 1e-6f}) {
      auto run = [&](Backend& b) {
        Buffer<float> dX = upload(b, X), de = upload(b, emb), dw = upload(b, wkv),
                      dq = upload(b, qw), dk = upload(b, kw);
        ScratchArena scratch(b);
        b.engram_forward(dX.get(), de.get(), {dw.get(), WeightFormat::kF32}, dq.get(), dk.get(), S,
                         n, H, D, eps, scratch.get(), b.stream(0));
        return dX.download();
      };
      const std::vector<float> got = run(backend());
      std::vector<float> want(got.size());
      if (on_cuda()) {
        want = run(cpu());
        // A token's update does not depend on the batch (the CUDA projection shares weight reads
        // between tokens): the last token alone gives the same bits.
        Backend& b = backend();
        Buffer<float> dX = upload(b, std::vector<float>(X.end() - n * H, X.end()));
        Buffer<float> de = upload(b, std::vector<float>(emb.end() - D, emb.end()));
        Buffer<float> dw = upload(b, wkv), dq = upload(b, qw), dk = upload(b, kw);
        ScratchArena scratch(b);
        b.engram_forward(dX.get(), de.get(), {dw.get(), WeightFormat::kF32}, dq.get(), dk.get(), 1,
                         n, H, D, eps, scratch.get(), b.stream(0));
        EXPECT_TRUE(bitwise_equal(dX.download(), std::vector<float>(got.end() - n * H, got.end())))
            << "last token alone";
      } else {
        for (int64_t t = 0; t < S; ++t) {
          std::vector<double> kv(static_cast<size_t>((n + 1) * H));
          for (int64_t o = 0; o < (n + 1) * H; ++o) {
            for (int64_t d = 0; d < D; ++d) kv[o] += double(emb[t * D + d]) * wkv[o * D + d];
          }
          const double* value = &kv[n * H];
          for (int64_t i = 0; i < n; ++i) {
            const float* xi = &X[(t * n + i) * H];
            const double* key = &kv[i * H];
            double sx = 0, sk = 0, sd = 0;
            for (int64_t h = 0; h < H; ++h) {
              sx += double(xi[h]) * xi[h], sk += key[h] * key[h];
              sd += double(xi[h]) * qw[i * H + h] * kw[i * H + h] * key[h];
            }
            const double rstd =
                1.0 / std::sqrt(sx / double(H) + eps) / std::sqrt(sk / double(H) + eps);
            const double dot = sd * rstd / std::sqrt(double(H));
            const double gate =
                1.0 /
                (1.0 + std::exp(-std::copysign(std::sqrt(std::max(std::abs(dot), 1e-6)), dot)));
            for (int64_t h = 0; h < H; ++h)
              want[(t * n + i) * H + h] = float(xi[h] + gate * value[h]);
          }
        }
      }
      std::vector<float> got_update, want_update;
      for (size_t i = 0; i < got.size(); ++i)
        got_update.push_back(got[i] - X[i]), want_update.push_back(want[i] - X[i]);
      EXPECT_LE(rel_error(got, want), 1e-5) << "eps " << eps;
      EXPECT_LE(rel_error(got_update, want_update), 1e-5) << "update, eps " << eps;
    }
  }
}

// The Engram projection as the checkpoint stores it (FP8 E4M3, 32 x 32 UE8M0 blocks) with emb
// rows of decoded FP8 table blocks (as engram_gather gives), so BF16 rounding and the 1 x 32 FP8
// requantisation of precision fp8 leave emb unchanged (cuda_backend.cc engram_kv_tensor_cores).
// CUDA: precision fp32 / bf16 (the CUDA-core kernel decoding the codes) is BITWISE the same matrix
// stored FP32; precision fp8 (tensor cores, decode-sized and prefill-sized forwards) is within
// 1e-5 · max of the CPU's FP32 projection (summation order only), and a decode-sized token's
// update does not depend on its batch. The CPU takes the decoded FP32 values.
TEST_P(BackendGather, EngramForwardStoredFp8Projection) {
  const int64_t n = 4, H = 128, D = 768, kvw = (n + 1) * H, br = 32;
  std::vector<uint8_t> codes = random_bytes(kvw * D), scales((kvw / br) * (D / br));
  for (uint8_t& c : codes) c = (c & 0x7F) == 0x7F ? uint8_t(c - 1) : c;  // no NaN codes
  for (uint8_t& e : scales) e = uint8_t(randint(127 - 9, 127 - 6));
  std::vector<float> wkv(size_t(kvw * D));
  for (int64_t r = 0; r < kvw; ++r) {
    for (int64_t c = 0; c < D; ++c) {
      wkv[r * D + c] =
          float(e4m3_value(codes[r * D + c]) * e8m0_value(scales[(r / br) * (D / br) + c / br]));
    }
  }
  std::vector<float> qw = normal(n * H, 0.3), kw = normal(n * H, 0.3);
  for (float& v : qw) v += 1.0f;
  for (float& v : kw) v += 1.0f;
  for (const int64_t S : {int64_t(64), int64_t(200)}) {
    SCOPED_TRACE("S " + std::to_string(S));
    std::vector<float> emb(size_t(S * D));
    for (int64_t b = 0; b < S * D / 32; ++b) {
      const double scale = std::ldexp(1.0, int(randint(-8, 0)));
      for (int64_t i = 0; i < 32; ++i) {
        emb[b * 32 + i] =
            float(e4m3_value(uint8_t(randint(0, 0x7E) | (randint(0, 1) << 7))) * scale);
      }
    }
    const std::vector<float> X = normal(S * n * H);
    // rows: the forward's rows; stored: the FP8 matrix (else the FP32 values); mode 0 fp32, 1
    // bf16, 2 fp8.
    auto run = [&](Backend& b, int64_t rows, bool stored, int mode) {
      Buffer<float> dX = upload(b, std::vector<float>(X.end() - rows * n * H, X.end()));
      Buffer<float> de = upload(b, std::vector<float>(emb.end() - rows * D, emb.end()));
      Buffer<float> dq = upload(b, qw), dk = upload(b, kw), dw = upload(b, wkv);
      Buffer<uint8_t> dc = upload(b, codes), ds = upload(b, scales);
      Matrix m{dw.get(), WeightFormat::kF32, true, true};
      if (stored) {
        m = {dc.get(), WeightFormat::kFp8Block, true, true, ds.get(), int32_t(br), int32_t(br), kvw,
             D};
      }
      ScratchArena scratch(b);
      b.set_forward_rows(rows, /*decode_batch=*/rows <= Backend::kDecodeForwardRows);
      b.set_tensor_cores(mode > 0);
      b.set_fp8_activations(mode == 2);
      b.engram_forward(dX.get(), de.get(), m, dq.get(), dk.get(), rows, n, H, D, 1e-20f,
                       scratch.get(), b.stream(0));
      b.set_fp8_activations(false);
      b.set_tensor_cores(false);
      b.set_forward_rows(4096, false);
      return dX.download();
    };
    const std::vector<float> want = run(cpu(), S, false, 0);
    std::vector<float> want_update(want.size());
    for (size_t i = 0; i < want.size(); ++i) want_update[i] = want[i] - X[i];
    if (!on_cuda()) {
      EXPECT_TRUE(all_written(want));
      EXPECT_THROW(run(cpu(), S, true, 0), Error) << "the CPU maps FP32 values only";
      continue;
    }
    for (const int mode : {0, 1}) {
      EXPECT_TRUE(bitwise_equal(run(backend(), S, true, mode), run(backend(), S, false, mode)))
          << "mode " << mode;
    }
    const std::vector<float> got = run(backend(), S, true, 2);
    std::vector<float> got_update(got.size());
    for (size_t i = 0; i < got.size(); ++i) got_update[i] = got[i] - X[i];
    EXPECT_LE(rel_error(got, want), 1e-5) << "fp8";
    EXPECT_LE(rel_error(got_update, want_update), 1e-5) << "fp8 update";
    if (S <= Backend::kDecodeForwardRows) {
      EXPECT_TRUE(bitwise_equal(run(backend(), 1, true, 2),
                                std::vector<float>(got.end() - n * H, got.end())))
          << "last token alone";
    }
  }
}

TEST_P(BackendGather, RejectsBadSizes) {
  // Not gather_rows / scale: their CPU reference checks no sizes (CUDA rejects dim <= 0, n < 0),
  // so there is no shared error behaviour to test.
  Backend& be = backend();
  Buffer<float> f = upload(be, normal(256));
  Buffer<uint16_t> t16 = upload(be, std::vector<uint16_t>(64, 0x3F80));
  Buffer<int32_t> tok = upload(be, std::vector<int32_t>(4, 0));
  Buffer<int64_t> rows = upload(be, std::vector<int64_t>(4, 0));
  Buffer<uint8_t> bytes = upload(be, random_bytes(256));
  ScratchArena scratch(be);
  const Stream s = be.stream(0);
  EXPECT_THROW(be.embed_rows(nullptr, t16.get(), tok.get(), 2, 8, /*copies=*/0, f.get(), s), Error);
  EXPECT_THROW(be.embed_rows(nullptr, nullptr, tok.get(), 2, 8, 1, f.get(), s), Error)
      << "no table";
  EXPECT_THROW(be.engram_gather(bytes.get(), bytes.get(), rows.get(), 2, /*hd=*/48, f.get(), s),
               Error);
  EXPECT_THROW(be.engram_forward(f.get(), f.get(), {f.get(), WeightFormat::kF32}, f.get(), f.get(),
                                 1, /*n=*/0, 4, 4, 1e-6f, scratch.get(), s),
               Error);
}

DSV41RT_INSTANTIATE_BACKENDS(BackendGather);

}  // namespace
}  // namespace dsv41rt::testing
