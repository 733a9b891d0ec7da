#include "runtime/model/cuda_weights.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <tuple>
#include <utility>

#include "kernels/cuda/synthetic_codes.cuh"
#include "runtime/model/cuda_resources.h"
#include "runtime/model/host_registration.h"
#include "runtime/model/synthetic_weights.h"

namespace dsv41rt::model {

namespace {

/// The checkpoint's stored bytes of a tensor loaded without host values (codes, scales).
struct Stored {
  const TensorSource* src;
  int64_t data_bytes, scale_bytes;
};

Stored stored(const Tensor& t) {
  const TensorSource& s = t.source;
  switch (s.dtype) {
    case DType::kBF16:
      return {&s, s.rows * s.cols * 2, 0};
    case DType::kFP8E4M3:
      return {&s, s.rows * s.cols,
              ((s.rows + s.block_rows - 1) / s.block_rows) *
                  ((s.cols + s.block_cols - 1) / s.block_cols)};
    case DType::kI8:
      return {&s, s.rows * (s.cols / 2), s.rows * ((s.cols + 31) / 32)};
    default:
      return {&s, 0, 0};
  }
}

WeightFormat released_format(DType d) {
  if (d == DType::kBF16) return WeightFormat::kBF16;
  if (d == DType::kFP8E4M3) return WeightFormat::kFp8Block;
  return WeightFormat::kMxfp4;
}

// Whether the current device reads host memory registered read-only by its host address
// (Linux with unified addressing: cudaDevAttrCanUseHostPointerForRegisteredMem) and accepts
// read-only registrations (a checkpoint is mapped PROT_READ).
bool reads_registered_memory() {
  int device = 0, host_pointer = 0, read_only = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  cudaDeviceGetAttribute(&host_pointer, cudaDevAttrCanUseHostPointerForRegisteredMem, device);
  cudaDeviceGetAttribute(&read_only, cudaDevAttrHostRegisterReadOnlySupported, device);
  cudaGetLastError();  // an attribute the driver does not know is a "no", not a sticky error
  return host_pointer == 1 && read_only == 1;
}

// Whether Engram tables are read in place from the checkpoint's pages (the default), else one
// pinned copy per process (DSV41RT_ENGRAM_REGISTER=0, a diagnostic switch). The checkpoint is
// mapped MAP_SHARED for this (core/safetensors.cc): registering a range of a MAP_PRIVATE file
// mapping did not return (session 36-37, H100 host, kernel 6.18), a shared one takes milliseconds.
bool register_in_place_requested() {
  const char* v = std::getenv("DSV41RT_ENGRAM_REGISTER");
  return v == nullptr || std::string(v) != "0";
}

// The process's registrations of host memory for the devices (one registry: a page can be
// registered once per process, whichever rank asks).
HostRegistry& cuda_host_registry() {
  static HostRegistry registry(
      size_t(sysconf(_SC_PAGESIZE)),
      [](void* base, size_t bytes) {
        const unsigned flags =
            cudaHostRegisterMapped | cudaHostRegisterPortable | cudaHostRegisterReadOnly;
        const auto start = std::chrono::steady_clock::now();
        const cudaError_t e = cudaHostRegister(base, bytes, flags);
        // Diagnosis of the slow in-place load (docs/design/parallelism.md): each registration's
        // size and time on stderr.
        if (const char* log = std::getenv("DSV41RT_LOG_HOST_REGISTER"); log && *log == '1') {
          const double ms =
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                  .count();
          std::fprintf(stderr, "cudaHostRegister(%p, %zu bytes) -> %d in %.3f ms\n", base, bytes,
                       int(e), ms);
        }
        if (e == cudaSuccess) return true;
        cudaGetLastError();  // not sticky: the caller falls back to a pinned copy
        return false;
      },
      [](void* base) { cudaHostUnregister(base); });
  return registry;
}

class Uploader {
 public:
  /// `mapping`: what keeps the checkpoint's pages mapped (held as long as the device reads
  /// them in place, and released only after their registration is undone).
  Uploader(BackendWeights& out, bool engram_host, std::shared_ptr<const void> mapping)
      : engram_host(engram_host),
        in_place(engram_host && register_in_place_requested() && reads_registered_memory()),
        out_(out),
        mapping_(std::move(mapping)) {}
  const bool engram_host;
  const bool in_place;  ///< Engram tables read from the checkpoint's pages (host_mapped)

  /// host[0, n), a checkpoint's read-only mapping, for the device to read over PCIe: its own
  /// pages registered (once per process, host_registration.h; the page cache holds them once per
  /// host), or a pinned copy where the device cannot read registered memory by its host address
  /// or the registration fails.
  template <typename T>
  const T* host_mapped(const T* host, int64_t n) {
    if (host == nullptr || n == 0) return nullptr;
    const size_t bytes = size_t(n) * sizeof(T);
    if (in_place) {
      std::vector<std::shared_ptr<void>> spans = cuda_host_registry().cover(host, bytes);
      if (!spans.empty()) {
        // Members go in reverse order: the span (unregisters) before the mapping (unmaps).
        struct MappedSpan {
          std::shared_ptr<const void> mapping;
          std::shared_ptr<void> span;
        };
        for (std::shared_ptr<void>& s : spans) {
          out_.owned.push_back(std::make_shared<MappedSpan>(MappedSpan{mapping_, std::move(s)}));
        }
        out_.host_bytes += int64_t(bytes);
        out_.host_in_place_bytes += int64_t(bytes);
        return host;  // the device reads registered memory by its host address
      }
    }
    return pinned(host, n);
  }
  /// A copy of host[0, n) in pinned host memory mapped into the device's address space: the
  /// device pointer the kernels read it by (over PCIe).
  template <typename T>
  const T* pinned(const T* host, int64_t n) {
    if (host == nullptr || n == 0) return nullptr;
    const size_t bytes = size_t(n) * sizeof(T);
    auto [p, d] = pinned_alloc(bytes);
    std::memcpy(p, host, bytes);
    return static_cast<const T*>(d);
  }
  /// `bytes` of pinned host memory mapped into the device's address space: {host, device}.
  std::pair<void*, void*> pinned_alloc(size_t bytes) {
    void* p = nullptr;
    const cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocMapped | cudaHostAllocPortable);
    DSV41RT_CHECK_CODE(kOutOfRange, e == cudaSuccess, "cudaHostAlloc of ", bytes,
                       " bytes for the Engram tables failed: ", cudaGetErrorString(e));
    out_.owned.push_back(std::shared_ptr<void>(p, [](void* q) { cudaFreeHost(q); }));
    out_.host_bytes += int64_t(bytes);
    void* d = nullptr;
    DSV41RT_CU(cudaHostGetDevicePointer(&d, p, 0));
    return {p, d};
  }

  /// A lazy synthetic source's rows generated on the device straight into `data` (the CUDA
  /// generator, bitwise the CPU reference's bytes), its scales a fill of the tensor-wide
  /// exponent. Asynchronous on the legacy default stream: upload_weights synchronises at its end.
  void synthesize(const TensorSource& s, uint8_t* data, uint8_t* scale, int64_t scale_bytes) {
    const SyntheticTensor& t = *s.synthetic;
    DSV41RT_CU(kernels::cuda::synth_tensor_codes(t.kind, t.seed, t.name_crc, t.rows, t.cols,
                                                 t.align(), s.synthetic_row,
                                                 s.synthetic_row + s.rows, data, nullptr));
    DSV41RT_CU(cudaMemset(scale, t.scale_byte(), size_t(scale_bytes)));
    count_synthetic_bytes(s.rows * t.row_bytes());
    generated = true;
  }
  /// A lazy synthetic Engram table generated whole: into pinned host memory with the CPU reference
  /// (engram_host), else on the device. {codes, scales} as the device reads them.
  std::pair<const uint8_t*, const uint8_t*> synthetic_table(
      const std::shared_ptr<const SyntheticTensor>& table) {
    const SyntheticTensor& t = *table;
    const int64_t code_bytes = t.rows * t.row_bytes(), scale_bytes = t.scale_bytes(t.rows);
    if (engram_host) {
      auto [p, d] = pinned_alloc(size_t(code_bytes + scale_bytes));
      uint8_t* host = static_cast<uint8_t*>(p);
      generate_synthetic_rows(t, 0, t.rows, host);
      std::memset(host + code_bytes, t.scale_byte(), size_t(scale_bytes));
      const uint8_t* dev = static_cast<const uint8_t*>(d);
      return {dev, dev + code_bytes};
    }
    uint8_t* data = alloc<uint8_t>(code_bytes);
    uint8_t* scale = alloc<uint8_t>(scale_bytes);
    TensorSource whole;
    whole.synthetic = table;
    whole.rows = t.rows;
    synthesize(whole, data, scale, scale_bytes);
    return {data, scale};
  }
  bool generated = false;  ///< a kernel generated weights (upload_weights then synchronises)

  template <typename T>
  T* alloc(int64_t n) {
    if (n == 0) return nullptr;
    std::shared_ptr<void> mem = cudart::device_alloc(n * int64_t(sizeof(T)));
    out_.owned.push_back(mem);
    out_.bytes += n * int64_t(sizeof(T));
    return static_cast<T*>(mem.get());
  }
  template <typename T>
  const T* raw(const T* host, int64_t n) {
    if (host == nullptr || n == 0) return nullptr;
    T* d = alloc<T>(n);
    to_device(d, host, size_t(n) * sizeof(T));
    return d;
  }
  /// A synchronous host-to-device copy, cut at the edges of this process's registrations
  /// (HostRegistry::pieces: a source straddling one is refused, and tensors share the edge
  /// pages of a registered Engram table).
  static void to_device(void* dst, const void* src, size_t bytes) {
    for (const auto& [at, n] : cuda_host_registry().pieces(src, bytes)) {
      DSV41RT_CU(cudaMemcpy(static_cast<uint8_t*>(dst) + at, static_cast<const uint8_t*>(src) + at,
                            n, cudaMemcpyHostToDevice));
    }
  }
  /// FP32 values (vectors and small tensors; decoded on the host when loaded lazily).
  const float* f32(const Tensor& t) {
    if (t.empty()) return nullptr;
    const std::vector<float> v = host_values(t);
    return raw(v.data(), int64_t(v.size()));
  }
  const float* f32(const std::vector<float>& v) { return raw(v.data(), int64_t(v.size())); }

  /// Matrices stacked along a new leading axis (one 2-D view of their rows), kept in the
  /// checkpoint's released form (BF16, FP8 E4M3 + UE8M0 block scales, MXFP4 + UE8M0 per 32):
  /// device bytes = checkpoint bytes. FP32 when a source has host values or another dtype.
  Matrix matrices(const std::vector<const Tensor*>& ts) {
    if (ts.empty() || ts[0]->empty()) return {};
    const TensorSource& s0 = ts[0]->source;
    bool released =
        s0.dtype == DType::kBF16 || s0.dtype == DType::kFP8E4M3 || s0.dtype == DType::kI8;
    for (const Tensor* t : ts) {
      const TensorSource& s = t->source;
      released = released && t->data.empty() && s.dtype == s0.dtype && s.rows == s0.rows &&
                 s.cols == s0.cols && s.block_rows == s0.block_rows &&
                 s.block_cols == s0.block_cols;
    }
    if (!released) return f32_matrices(ts);
    const int64_t n = int64_t(ts.size());
    // A stack is one 2-D view, so each FP8 matrix must start on a scale-block row.
    DSV41RT_CHECK_CODE(
        kUnsupported, s0.dtype != DType::kFP8E4M3 || n == 1 || s0.rows % s0.block_rows == 0,
        "a stack of FP8 matrices with ", s0.rows, " rows each (not a multiple of the scale block ",
        s0.block_rows, ") cannot be kept in its released form");
    const Stored one = stored(*ts[0]);
    uint8_t* data = alloc<uint8_t>(one.data_bytes * n);
    uint8_t* scale = alloc<uint8_t>(one.scale_bytes * n);
    for (int64_t i = 0; i < n; ++i) {
      const TensorSource& s = ts[size_t(i)]->source;
      if (s.lazy()) {  // synthetic: this rank's rows generated in place
        synthesize(s, data + i * one.data_bytes, scale + i * one.scale_bytes, one.scale_bytes);
        continue;
      }
      to_device(data + i * one.data_bytes, s.data, size_t(one.data_bytes));
      if (one.scale_bytes > 0) {
        to_device(scale + i * one.scale_bytes, s.scale, size_t(one.scale_bytes));
      }
    }
    Matrix m;
    m.data = data;
    m.format = released_format(s0.dtype);
    m.bf16_exact = true;
    m.fp8_input = s0.dtype != DType::kBF16;
    m.scale = scale;
    m.block_rows = int32_t(s0.block_rows);
    m.block_cols = int32_t(s0.block_cols);
    m.rows = s0.rows * n;
    m.cols = s0.cols;
    if (n == 1) m.whole_rows = ts[0]->whole_rows;
    if (m.format == WeightFormat::kBF16) m.scale = nullptr, m.block_rows = m.block_cols = 0;
    return m;
  }
  Matrix matrix(const Tensor& t) { return matrices({&t}); }
  /// FP32 stack whatever the sources.
  Matrix f32_matrices(const std::vector<const Tensor*>& ts) {
    if (ts.empty() || ts[0]->empty()) return {};
    const int64_t each = ts[0]->numel();
    float* d = alloc<float>(each * int64_t(ts.size()));
    for (size_t i = 0; i < ts.size(); ++i) {
      const std::vector<float> v = host_values(*ts[i]);
      DSV41RT_CU(
          cudaMemcpy(d + i * each, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice));
    }
    return {d, WeightFormat::kF32, false};
  }

 private:
  BackendWeights& out_;
  const std::shared_ptr<const void> mapping_;
};

// One block's weights (a backbone layer or a DSpark stage) with its RoPE table.
LayerWeights upload_layer(Uploader& up, const ModelConfig& c, const BlockWeights& b,
                          const std::vector<float>& inv_freq) {
  LayerWeights L;
  L.attn_norm = up.f32(b.attn_norm);
  L.ffn_norm = up.f32(b.ffn_norm);
  L.hc_attn_fn = up.f32(b.hc_attn_fn);
  L.hc_attn_base = up.f32(b.hc_attn_base);
  L.hc_attn_scale = up.f32(b.hc_attn_scale);
  L.hc_ffn_fn = up.f32(b.hc_ffn_fn);
  L.hc_ffn_base = up.f32(b.hc_ffn_base);
  L.hc_ffn_scale = up.f32(b.hc_ffn_scale);
  const AttentionWeights& a = b.attn;
  L.wq_a = up.matrix(a.wq_a);
  L.q_norm = up.f32(a.q_norm);
  L.wq_b = up.matrix(a.wq_b);
  L.wkv = up.matrix(a.wkv);
  L.kv_norm = up.f32(a.kv_norm);
  L.wo_a = up.matrix(a.wo_a);
  L.wo_b = up.matrix(a.wo_b);
  L.attn_sink = up.f32(a.attn_sink);
  L.comp_wkv = up.matrix(a.comp_wkv);
  L.comp_wgate = up.matrix(a.comp_wgate);
  L.comp_norm = up.f32(a.comp_norm);
  L.idx_wq_b = up.matrix(a.idx_wq_b);
  L.idx_weights_proj = up.matrix(a.idx_weights_proj);
  L.idx_wk = up.matrix(a.idx_wk);
  L.idx_k_norm = up.f32(a.idx_k_norm);
  // V4: the compressor's APE (its wkv / wgate / norm above) and the CSA indexer's own compressor.
  L.comp_ape = up.f32(a.comp_ape);
  L.idx_comp_wkv = up.matrix(a.idx_comp_wkv);
  L.idx_comp_wgate = up.matrix(a.idx_comp_wgate);
  L.idx_comp_ape = up.f32(a.idx_comp_ape);
  L.idx_comp_norm = up.f32(a.idx_comp_norm);
  L.inv_freq = up.f32(inv_freq);
  const MoeWeights& m = b.moe;
  L.gate = up.f32(m.gate);
  L.bias = up.f32(m.bias);
  // V4 hash-routed layers: tid2eid [vocab, k] (every entry checked against E by the loader).
  L.tid2eid = up.raw(m.tid2eid.data(), int64_t(m.tid2eid.size()));
  // Each matrix as released (routed experts MXFP4, the shared expert FP8 in V4.1).
  auto stack = [&](const std::vector<Tensor>& ts) {
    std::vector<const Tensor*> p;
    for (const Tensor& t : ts) p.push_back(&t);
    return p;
  };
  L.expert_begin = m.expert_begin, L.expert_count = int64_t(m.w1.size());
  L.w1 = up.matrices(stack(m.w1));
  L.w3 = up.matrices(stack(m.w3));
  L.w2 = up.matrices(stack(m.w2));
  L.shared_w1 = up.matrix(m.shared_w1);
  L.shared_w3 = up.matrix(m.shared_w3);
  L.shared_w2 = up.matrix(m.shared_w2);
  if (b.engram) {
    const EngramWeights& e = *b.engram;
    const int64_t hd = c.engram->head_dim;
    if (e.synthetic && !e.table) {
      std::tie(L.engram_table, L.engram_scale) = up.synthetic_table(e.synthetic);
    } else {
      L.engram_table =
          up.engram_host ? up.host_mapped(e.table, e.rows * hd) : up.raw(e.table, e.rows * hd);
      L.engram_scale = up.engram_host ? up.host_mapped(e.table_scale, e.rows * (hd / 32))
                                      : up.raw(e.table_scale, e.rows * (hd / 32));
    }
    L.engram_rows = e.rows;
    L.engram_wkv = up.matrix(e.wkv);
    L.engram_q = up.f32(e.q_weight);
    L.engram_k = up.f32(e.k_weight);
  }
  return L;
}

}  // namespace

BackendWeights upload_weights(const ModelPlan& plan, const ModelWeights& w,
                              const std::vector<std::vector<float>>& inv_freq, bool engram_host) {
  const ModelConfig& c = plan.config;
  BackendWeights d;
  Uploader up(d, engram_host, w.checkpoint);
  if (w.embed_bf16) {
    d.embed_bf16 = up.raw(w.embed_bf16, c.vocab_size * c.hidden_size);
  } else {
    d.embed = up.f32(w.embed);
  }
  d.head = up.matrix(w.head);
  d.norm = up.f32(w.norm);
  // V4: the hyper-head (kernels/mhc.h hc_head_pre); empty for V4.1.
  d.hc_head_fn = up.f32(w.hc_head_fn);
  d.hc_head_base = up.f32(w.hc_head_base);
  d.hc_head_scale = up.f32(w.hc_head_scale);
  for (size_t li = 0; li < plan.layers.size(); ++li) {
    d.layers.push_back(upload_layer(up, c, w.layers[li], inv_freq[li]));
  }
  // The DSpark stages (loaded on request) after the backbone, their RoPE tables after its tables.
  if (w.drafts) {
    const DraftWeights& dw = *w.drafts;
    DSV41RT_CHECK_CODE(kInternal, inv_freq.size() == plan.layers.size() + dw.stages.size(),
                       "the CUDA backend needs RoPE tables of the backbone and draft layers");
    for (size_t s = 0; s < dw.stages.size(); ++s) {
      d.drafts.push_back(upload_layer(up, c, dw.stages[s], inv_freq[plan.layers.size() + s]));
    }
    DraftHeadWeights& h = d.draft_heads;
    h.main_proj = up.matrix(dw.main_proj);
    h.main_norm = up.f32(dw.main_norm);
    h.norm = up.f32(dw.norm);
    h.markov_embed = up.f32(dw.markov_embed);
    h.markov_head = up.matrix(dw.markov_head);
    h.confidence = up.matrix(dw.confidence);
  }
  // Synthetic weights were generated by kernels on the legacy default stream: done before use.
  if (up.generated) DSV41RT_CU(cudaDeviceSynchronize());
  return d;
}

}  // namespace dsv41rt::model
