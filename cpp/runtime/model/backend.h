// The device Backend the model runner calls: memory, streams/events/graphs, and the ops of the
// V4.1 forward. One implementation per device (cpu_backend.cc: the FP32 reference kernels on the
// calling thread; cuda_backend.cc: the CUDA kernels on streams); the forward itself is written
// once, in model_runner*.cc, against this interface.
//
// Conventions:
//   - Every pointer an op takes is backend memory (alloc()), metadata arrays included; the model
//     runner uploads each forward's host plan once (to_device) and passes the device arrays.
//   - Ops are enqueued on the Stream they are given and return at once (CUDA) or after running
//     (CPU); nothing is allocated inside an op: scratch comes from the caller (Scratch).
//   - An op's semantics are those of its contract header (kernels/<op>.h, kernels/paged.h); the
//     CPU backend is their reference, the CUDA one matches it bitwise or within the bound its
//     contract states.
//   - Errors throw dsv41rt::Error (CUDA: the failing launch, by name).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/export.h"
#include "kernels/attention_cached.h"
#include "kernels/indexer_cached.h"
#include "kernels/paged.h"
#include "kernels/sampling.h"
#include "kernels/v4_compressor.h"
#include "runtime/model/backend_weights.h"
#include "runtime/model/device_array.h"
#include "runtime/model/layer_plan.h"
#include "runtime/model/weights.h"

namespace dsv41rt::model {

/// An ordered queue of a backend's ops (CUDA: a cudaStream_t). The CPU backend has one.
struct Stream {
  void* handle = nullptr;
  bool operator==(const Stream& o) const { return handle == o.handle; }
  bool operator!=(const Stream& o) const { return handle != o.handle; }
};

/// A recorded sequence of ops replayed as one unit (CUDA graph).
class DSV41RT_API BackendGraph {
 public:
  virtual ~BackendGraph() = default;
};

class DSV41RT_API Backend {
 public:
  virtual ~Backend() = default;
  /// "cpu" or "cuda:N".
  virtual std::string device() const = 0;
  /// Makes this backend's device current on the calling thread (CUDA: cudaSetDevice); called at
  /// every executor entry point, since one process may drive several GPUs from several threads.
  virtual void activate() {}

  // ---- weights and memory -----------------------------------------------------------------
  /// The backend's copy (or view) of the loaded weights; inv_freq: per layer RoPE frequencies.
  /// The CPU backend takes the host values over; CUDA uploads them.
  /// Before load_weights: keep the Engram tables in pinned host memory the device reads over
  /// PCIe (CUDA) instead of device memory. The CPU backend's memory is host memory already.
  virtual void keep_engram_in_host_memory(bool on) { (void)on; }
  virtual BackendWeights load_weights(const ModelPlan& plan, ModelWeights& weights,
                                      const std::vector<std::vector<float>>& inv_freq) = 0;
  /// Backend memory (never null for bytes > 0; throws Error naming the size when out of memory).
  virtual std::shared_ptr<void> alloc(int64_t bytes) = 0;
  /// Host memory the backend copies to and from fastest (CUDA: pinned).
  virtual std::shared_ptr<void> alloc_host(int64_t bytes) = 0;
  /// Host -> backend, ordered on `s` (the host bytes must stay valid until `s` is synchronised).
  virtual void to_device(void* dst, const void* src, int64_t bytes, Stream s) = 0;
  /// Backend -> host, ordered on `s` (valid after synchronize(s)); counted in stats() "d2h_bytes".
  virtual void to_host(void* dst, const void* src, int64_t bytes, Stream s) = 0;
  virtual void copy(void* dst, const void* src, int64_t bytes, Stream s) = 0;
  /// `rows` rows of `row_bytes` each, from src (rows src_pitch bytes apart) to dst (dst_pitch
  /// apart), in one operation: a block of columns into a wider or narrower layout.
  virtual void copy_2d(void* dst, int64_t dst_pitch, const void* src, int64_t src_pitch,
                       int64_t row_bytes, int64_t rows, Stream s) = 0;
  virtual void fill(void* dst, uint8_t byte, int64_t bytes, Stream s) = 0;
  virtual void synchronize(Stream s) = 0;

  // ---- streams, events, graphs ---------------------------------------------------------------
  /// Stream i: 0 is the main stream, 1.. side streams (the CPU backend: always its one stream).
  virtual Stream stream(int i) = 0;
  /// Event `id` (created on first use) recorded on `s`; wait(): `s` waits for its last record.
  virtual void record(int id, Stream s) = 0;
  virtual void wait(Stream s, int id) = 0;
  /// Records `id` on `from` and makes `to` wait for it (nothing when they are one stream).
  void link(int id, Stream from, Stream to) {
    if (from == to) return;
    record(id, from);
    wait(to, id);
  }
  /// Timing markers (separate ids): record_time(id, s); after synchronising, the milliseconds
  /// between two of them.
  virtual void record_time(int id, Stream s) = 0;
  virtual double elapsed_ms(int from_id, int to_id) = 0;
  /// Graph capture of everything `body` enqueues on `s` (and streams forked from it). `reuse`: a
  /// previous graph of the same launch sequence, updated in place when the backend can.
  virtual bool supports_graphs() const { return false; }
  virtual std::unique_ptr<BackendGraph> capture(Stream s, const std::function<void()>& body,
                                                std::unique_ptr<BackendGraph> reuse);
  virtual void replay(BackendGraph& graph, Stream s);
  /// Whether graphs captured from now on chain their kernels by programmatic dependent launch
  /// (CUDA; kernels/cuda/common.cuh pdl_entry). Default: ignored.
  virtual void set_programmatic_launch(bool on) { (void)on; }
  /// Counters ("d2h_bytes", graph updates, ...).
  virtual std::map<std::string, int64_t> stats() const = 0;

  // ---- numerics of the current forward ---------------------------------------------------------
  /// Precision "bf16" for this forward: BF16-exact matrices multiply on BF16 tensor cores
  /// (activations rounded to BF16, FP32 accumulation); the CPU backend emulates the rounding.
  virtual void set_tensor_cores(bool on) = 0;
  /// Precision "fp8" (with tensor cores on): the inputs of matrices stored FP8 / FP4
  /// (Matrix::fp8_input) are quantised to FP8 E4M3 in 1 x 32 blocks with power-of-two scales
  /// (spec 5.2; kernels::cpu::fp8_act_qdq), the MoE's x and hidden units likewise
  /// (moe_fp8_inputs); the CPU backend emulates it. Off: BF16 inputs as above.
  virtual void set_fp8_activations(bool on) = 0;
  /// Rows of the current forward as it runs (after graph padding). A backend may choose kernels
  /// by it (CUDA: skinny decode kernels for <= 64 rows), never by an op's own row count, so the
  /// choice, and with it each row's result, is one per forward; the threshold must sit on a
  /// power-of-two boundary so that a decode graph bucket never straddles it. `decode_batch`:
  /// every item of the forward is one token, i.e. it may run as a captured decode graph; the
  /// backend then takes no kernel whose workspace grows with the forward (CUDA: the staged
  /// prefill GEMM), so such a batch runs the same kernels captured and eager. Default: ignored.
  virtual void set_forward_rows(int64_t rows, bool decode_batch) { (void)rows, (void)decode_batch; }
  /// The most rows of a decode-sized forward (a power of two, see set_forward_rows).
  static constexpr int64_t kDecodeForwardRows = 64;
  /// Changes whenever a workspace the backend keeps for its ops (not the caller's Scratch) moves,
  /// e.g. grows for a larger forward: a captured graph that baked the old address in is stale.
  virtual uint64_t workspace_generation() const { return 0; }

  // ---- ops (contracts: kernels/*.h)
  // --------------------------------------------------------------
  /// y[m, n] (=|+=) x[m, k] · w[n, k]^T.
  virtual void linear(const float* x, const Matrix& w, int64_t m, int64_t k, int64_t n, float* y,
                      bool accumulate, Stream s) = 0;
  /// x [m, groups, k], w [groups, n, k] -> y [m, groups, n].
  virtual void grouped_linear(const float* x, const Matrix& w, int64_t m, int64_t groups, int64_t k,
                              int64_t n, float* y, Stream s) = 0;
  virtual void rms_norm(const float* x, const float* weight, int64_t rows, int64_t dim, float eps,
                        float* y, Stream s) = 0;
  virtual void apply_rope(float* x, int64_t rows, int64_t heads, int64_t head_dim, int64_t rope_dim,
                          const int64_t* positions, const float* inv_freq, bool inverse,
                          Stream s) = 0;
  virtual void hc_mix(const float* X, const float* fn, const float* base, const float* scale,
                      int64_t S, int64_t n, int64_t H, float rms_eps, float hc_eps, int iters,
                      float* pre, float* post, float* comb, Scratch scratch, Stream s) = 0;
  virtual void hc_collapse(const float* X, const float* w, int64_t S, int64_t n, int64_t H,
                           float* u, Stream s) = 0;
  /// V4's hyper-head collapse weights (kernels/mhc.h hc_head_pre). A V4-only op: the default
  /// throws kUnsupported naming it (see has_v4_ops()).
  virtual void hc_head_pre(const float* X, const float* fn, const float* base, const float* scale,
                           int64_t S, int64_t n, int64_t H, float rms_eps, float hc_eps, float* pre,
                           Stream s);
  virtual void hc_expand(const float* X, const float* y, const float* post, const float* comb,
                         int64_t S, int64_t n, int64_t H, float* out, Stream s) = 0;
  virtual void embed_rows(const float* table_f32, const uint16_t* table_bf16, const int32_t* tokens,
                          int64_t n, int64_t H, int64_t copies, float* X, Stream s) = 0;
  virtual void engram_gather(const uint8_t* table, const uint8_t* scales, const int64_t* rows,
                             int64_t n, int64_t hd, float* out, Stream s) = 0;
  /// In place on X [S, n, H] (kernels/engram.h); wkv [(n + 1) H, D] in any stored format.
  virtual void engram_forward(float* X, const float* emb, const Matrix& wkv, const float* q_weight,
                              const float* k_weight, int64_t S, int64_t n, int64_t H, int64_t D,
                              float eps, Scratch scratch, Stream s) = 0;
  virtual void moe_route(const float* x, const float* gate, const float* bias, int64_t S, int64_t H,
                         int64_t E, int64_t k, float scale, bool normalize, int32_t* idx,
                         float* weight, Stream s) = 0;
  /// V4 hash routing (kernels/moe.h moe_route_hash, normalised): experts tid2eid[tokens[t]]
  /// (tid2eid [vocab, k]), weights from the gate. A V4-only op: the default throws kUnsupported
  /// naming it (see has_v4_ops()).
  virtual void moe_route_hash(const float* x, const float* gate, const int32_t* tid2eid,
                              const int32_t* tokens, int64_t S, int64_t H, int64_t E, int64_t k,
                              int64_t vocab, float scale, int32_t* idx, float* weight, Stream s);
  /// y [S, H] = routed experts (w1/w3 [E, I, H], w2 [E, H, I]) + shared expert (may be empty).
  virtual void moe_experts(const float* x, const int32_t* idx, const float* weight, int64_t S,
                           int64_t H, int64_t k, int64_t E, int64_t I, const LayerWeights& w,
                           float limit, float* y, Scratch scratch, Stream s) = 0;
  /// How expert-parallel ranks combine a MoE block on this backend (the runner dispatches on it).
  /// kSlots: moe_expert_slots, the slots summed over the ranks, moe_combine: bitwise the one-rank
  /// moe_experts. kPartialSums: each rank runs moe_experts over its own stack with the ids made
  /// local (moe_local_ids; the backend's moe_experts skips ids outside [0, E)), rank 0 adding the
  /// shared expert, and the ranks' outputs are summed: the one-rank result up to FP32 summation
  /// order (one [S, H] sum instead of [S, k, H] slots; no combine pass).
  enum class ExpertSplit { kSlots, kPartialSums };
  virtual ExpertSplit expert_split() const { return ExpertSplit::kSlots; }
  /// A rank's local expert ids: idx - begin inside [0, count), else count (kernels/moe.h).
  virtual void moe_local_ids(const int32_t* idx, int64_t n, int64_t begin, int64_t count,
                             int32_t* out, Stream s) = 0;
  /// Expert parallelism (kernels/moe.h moe_slots / moe_combine): slots [S, k, H] = the routed
  /// outputs of the (token, slot) pairs whose expert this rank holds (w.expert_begin, ..
  /// + w.expert_count), 0 elsewhere; after the ranks' slots are summed, moe_combine gives
  /// moe_experts' y bitwise.
  virtual void moe_expert_slots(const float* x, const int32_t* idx, const float* weight, int64_t S,
                                int64_t H, int64_t k, int64_t E, int64_t I, const LayerWeights& w,
                                float limit, float* slots, Scratch scratch, Stream s) = 0;
  virtual void moe_combine(const float* x, const int32_t* idx, const float* slots, int64_t S,
                           int64_t H, int64_t k, int64_t I, const LayerWeights& w, float limit,
                           float* y, Scratch scratch, Stream s) = 0;
  /// Cache quantise-dequantise in `f`'s format (kF32: nothing).
  virtual void cache_qdq(kernels::RowFormat f, float* x, int64_t rows, int64_t dim, Stream s) = 0;
  // Paged state (kernels/paged.h).
  virtual void unpack_paged(kernels::RowFormat f, const kernels::PagedRows& src, int64_t dim,
                            int64_t items, int64_t max_count, const int64_t* count,
                            const int64_t* out_offset, float* out, Stream s) = 0;
  virtual void pack_paged(kernels::RowFormat f, const kernels::PagedRows& dst, int64_t dim,
                          int64_t n, const float* rows, const int32_t* item, const int64_t* entry,
                          Stream s) = 0;
  virtual void unpack_ring(kernels::RowFormat f, const kernels::RingRows& src, int64_t dim,
                           int64_t items, int64_t max_count, const int64_t* first,
                           const int64_t* count, const int64_t* out_offset, float* out,
                           Stream s) = 0;
  virtual void pack_ring(kernels::RowFormat f, const kernels::RingRows& dst, int64_t dim, int64_t n,
                         const float* rows, const int32_t* item, const int64_t* positions,
                         const uint8_t* store, Stream s) = 0;
  virtual void compress_pool_gather(const float* values, const float* scores, uint8_t* const* slots,
                                    int64_t pending_offset, int64_t groups, int64_t ratio,
                                    int64_t D, const int32_t* group_item, const int64_t* n_pending,
                                    const int64_t* first_row, float* pooled, Stream s) = 0;
  virtual void store_pending(const float* values, const float* scores, uint8_t* const* slots,
                             int64_t pending_offset, int64_t ratio, int64_t D, int64_t n,
                             const int32_t* item, const int64_t* src_row, const int64_t* dst_row,
                             Stream s) = 0;
  /// DeepSeek-V4 compressors over the request slots' flat states (kernels/v4_compressor.h,
  /// v4_compress_paged: the projected rows a, s continue each item's state and emit the entries
  /// of the groups they complete). `w` holds backend pointers; wkv / wgate are not read. Only the
  /// CPU backend has it so far: the default throws kUnsupported naming the op, and
  /// has_v4_ops() lets the executor refuse V4 checkpoints at load instead.
  virtual void v4_compress(const kernels::V4CompressorWeights& w, const float* a, const float* s,
                           uint8_t* const* slots, int64_t state_offset, int64_t items,
                           const int64_t* length, const int64_t* row0, const int64_t* n,
                           const int64_t* entry0, float* entries, Stream stream);
  /// DeepSeek-V4's indexer keys and queries under cache_quant: y = x · H_dim · dim^-0.5 row by row
  /// (kernels/hadamard.h walsh_hadamard; y may alias x). A V4-only op of the quantised cache mode
  /// (CPU and CUDA backends: the default throws kUnsupported naming it).
  virtual void walsh_hadamard(const float* x, int64_t rows, int64_t dim, float* y, Stream s);
  /// Whether this backend implements the V4-only ops (v4_compress, hc_head_pre, moe_route_hash,
  /// visible_entries).
  virtual bool has_v4_ops() const { return false; }
  virtual void attention_indices(int64_t S, int64_t W, int64_t KI, const int32_t* row_item,
                                 const int64_t* positions, const int64_t* window_first,
                                 const int64_t* length, const int64_t* old_offset,
                                 const int64_t* row0, int64_t new_offset, const int32_t* topk,
                                 const int64_t* comp_offset, int64_t comp_base, int32_t* idx,
                                 Stream s) = 0;
  // Indexer (kernels/indexer.h).
  /// values_bf16: the caller promises every query and key element is a BF16 value (the MXFP4
  /// index caches'), which lets a backend multiply them on BF16 tensor cores exactly.
  virtual void indexer_scores(const float* q, const float* keys, const int64_t* key_offset,
                              const float* w, const int64_t* n_visible, int64_t S, int64_t H,
                              int64_t D, int64_t T, bool values_bf16, float* scores, Stream s) = 0;
  virtual void candidate_blocks(const float* scores, const int64_t* n_visible, int64_t S, int64_t T,
                                int64_t topk_blocks, int64_t block_size, uint8_t* mask,
                                Stream s) = 0;
  virtual void apply_candidate_mask(float* scores, const uint8_t* mask, int64_t n, Stream s) = 0;
  virtual void topk_select(const float* scores, int64_t S, int64_t T, int64_t k, int32_t* idx,
                           Stream s) = 0;
  /// V4 HCA: every visible entry as a selection list (kernels/indexer.h visible_entries). A
  /// V4-only op: the default throws kUnsupported naming it (see has_v4_ops()).
  virtual void visible_entries(const int64_t* n_visible, int64_t S, int64_t k, int32_t* idx,
                               Stream s);
  /// Sparse attention with sink over [kv_a (T_a rows) | kv_b (T_b rows)] (kernels/attention.h).
  /// keys_bf16: the caller promises every key element is a BF16 value (the quantised caches'
  /// rows), which lets a backend run the products on BF16 tensor cores without rounding them.
  virtual void sparse_attention(const float* q, const float* kv_a, int64_t T_a, const float* kv_b,
                                int64_t T_b, const int32_t* idx, const float* sink, int64_t S,
                                int64_t n_heads, int64_t D, int64_t K, float scale, bool keys_bf16,
                                float* out, Stream s) = 0;
  /// Whether this forward's sparse attention reads its keys from the caches as stored
  /// (sparse_attention_cached) instead of from unpacked FP32 copies. Decided per forward (after
  /// set_forward_rows: decode-sized forwards and decode batches) for keys that are BF16 values
  /// (`keys_bf16`, as in sparse_attention) of head dimension D; the runner then skips the window
  /// and compressed-KV unpacks of the layer.
  virtual bool attention_reads_caches(bool keys_bf16, int64_t D) const = 0;
  /// Whether sparse_attention_cached decodes rows stored in `format` (default: every format).
  /// Where it does not, the runner unpacks the rows into FP32 first, as when
  /// attention_reads_caches is false: the same bits either way.
  virtual bool attention_reads_format(kernels::RowFormat /*format*/) const { return true; }
  /// sparse_attention over the keys `keys` locates in the ring and the pages
  /// (kernels/attention_cached.h): the same bits as unpacking them and calling sparse_attention.
  virtual void sparse_attention_cached(const float* q, const kernels::CachedKeys& keys,
                                       const int32_t* idx, const float* sink, int64_t S,
                                       int64_t n_heads, int64_t D, int64_t K, float scale,
                                       float* out, Stream s) = 0;
  /// Whether this forward's indexer scores read the index keys from the pages as stored
  /// (indexer_scores_cached) instead of from an unpacked FP32 copy; decided per forward like
  /// attention_reads_caches, for keys stored in `format` with H heads of dimension D.
  virtual bool indexer_reads_caches(kernels::RowFormat format, int64_t H, int64_t D) const = 0;
  /// indexer_scores over the keys `keys` locates in the pages (kernels/indexer_cached.h): the same
  /// bits as unpacking them and calling indexer_scores.
  virtual void indexer_scores_cached(const float* q, const kernels::IndexKeys& keys, const float* w,
                                     const int64_t* n_visible, int64_t S, int64_t H, int64_t D,
                                     int64_t T, float* scores, Stream s) = 0;
  virtual void gather_rows(const float* src, const int64_t* rows, int64_t n, int64_t dim,
                           float* dst, Stream s) = 0;
  virtual void scale(float* x, int64_t n, float factor, Stream s) = 0;
  /// Token masks (kernels/sampling.h): logits rows rows[i] (i < n) get -inf at every token mask
  /// words[i * token_mask_words(V) ...] does not allow.
  virtual void mask_tokens(float* logits, const int64_t* rows, int64_t n, int64_t V,
                           const uint32_t* words, Stream s) = 0;
  /// Draws one token for each of `rows` rows (kernels/sampling.h): row r samples logits row
  /// logit_rows[r] with params[r] at step steps[r]; history holds the penalty inputs (row r's
  /// prompt history[prompt_off[r]..prompt_off[r+1]), its output
  /// history[output_off[r]..output_off[r+1]); both offset arrays have rows + 1 entries). Writes
  /// tokens/logprobs [rows] and, for the first min(top_logprobs, max_top) of each row,
  /// top_ids/top_logprobs [rows, max_top].
  virtual void sample(const float* logits, const int64_t* logit_rows, int64_t rows, int64_t V,
                      const kernels::SamplingParams* params, const int32_t* history,
                      const int64_t* prompt_off, const int64_t* output_off, const uint64_t* steps,
                      int32_t* tokens, float* logprobs, int32_t max_top, int32_t* top_ids,
                      float* top_logprobs, Scratch scratch, Stream s) = 0;
};

/// The CPU reference backend (FP32, the calling thread, OpenMP inside ops).
DSV41RT_API std::unique_ptr<Backend> make_cpu_backend();
/// The CUDA backend of device "cuda" / "cuda:N"; throws Error when this build has no CUDA
/// backend or no such GPU is visible.
DSV41RT_API std::unique_ptr<Backend> make_cuda_backend(const std::string& device);

}  // namespace dsv41rt::model
