#include "runtime/sequence_state.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "core/status.h"
#include "runtime/model/executor.h"

namespace dsv41rt {
namespace {

constexpr char kMagic[8] = {'D', 'S', 'V', '4', '1', 'S', 'E', 'Q'};

struct Fnv {
  uint64_t h = 0xcbf29ce484222325ull;
  void bytes(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001b3ull;
  }
  void i64(int64_t v) { bytes(&v, sizeof v); }
};

uint64_t checksum(SequenceStateHeader h, const uint8_t* payload, size_t n) {
  h.checksum = 0;
  Fnv f;
  f.bytes(&h, sizeof h);
  f.bytes(payload, n);
  return f.h;
}

// The sizes a state blob carries: the host copy's (a slot's whole state may hold more than its
// pool bytes, e.g. the Engram history the executor keeps on the host).
model::HostStateCopy& host_copy(model::Executor& exec, const char* what) {
  model::HostStateCopy* copy = exec.host_state_copy();
  DSV41RT_CHECK_CODE(kUnsupported, copy != nullptr, what,
                     ": this executor cannot copy a sequence's state between the device and the "
                     "host (context parallelism)");
  return *copy;
}

model::PoolGeometry state_geometry(model::Executor& exec, model::HostStateCopy& copy) {
  return {exec.pool().geometry().page_tokens, copy.page_bytes(), copy.slot_state_bytes()};
}

}  // namespace

uint64_t model_fingerprint(const ModelConfig& c) {
  Fnv f;
  for (const int64_t v :
       {int64_t(c.arch), c.vocab_size, c.hidden_size, c.moe_intermediate_size,
        int64_t(c.num_hidden_layers), int64_t(c.num_attention_heads), int64_t(c.head_dim),
        int64_t(c.qk_rope_head_dim), int64_t(c.q_lora_rank), int64_t(c.sliding_window),
        int64_t(c.index_n_heads), int64_t(c.index_head_dim), int64_t(c.index_topk),
        int64_t(c.hc_mult), int64_t(c.num_nextn_predict_layers), int64_t(c.engram.has_value()),
        int64_t(c.dspark.has_value())}) {
    f.i64(v);
  }
  for (const int r : c.compress_ratios) f.i64(r);
  for (const int l : c.kv_source_layer_ids) f.i64(l);
  for (const int l : c.index_source_layer_ids) f.i64(l);
  return f.h;
}

std::vector<uint8_t> encode_sequence_state(const model::PoolGeometry& geometry,
                                           uint64_t fingerprint, int64_t length,
                                           const std::vector<uint8_t>& slot,
                                           const std::vector<uint8_t>& pages) {
  DSV41RT_CHECK(int64_t(slot.size()) == geometry.slot_bytes, "sequence state: slot of ",
                slot.size(), " bytes, the pool's slots hold ", geometry.slot_bytes);
  DSV41RT_CHECK(geometry.page_bytes > 0 && int64_t(pages.size()) % geometry.page_bytes == 0,
                "sequence state: ", pages.size(), " page bytes is not whole pages of ",
                geometry.page_bytes);
  SequenceStateHeader h{};
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  h.version = kSequenceStateVersion;
  h.model_fingerprint = fingerprint;
  h.page_tokens = geometry.page_tokens;
  h.page_bytes = geometry.page_bytes;
  h.slot_bytes = geometry.slot_bytes;
  h.length = length;
  h.n_pages = int64_t(pages.size()) / geometry.page_bytes;
  std::vector<uint8_t> out(sizeof h + slot.size() + pages.size());
  // (empty vectors may have a null data(), which memcpy must not be given even for 0 bytes)
  std::copy(slot.begin(), slot.end(), out.begin() + sizeof h);
  std::copy(pages.begin(), pages.end(), out.begin() + std::ptrdiff_t(sizeof h + slot.size()));
  h.checksum = checksum(h, out.data() + sizeof h, out.size() - sizeof h);
  std::memcpy(out.data(), &h, sizeof h);
  return out;
}

SequenceStateView decode_sequence_state(const uint8_t* data, size_t size,
                                        const model::PoolGeometry& geometry, uint64_t fingerprint) {
  SequenceStateHeader h{};
  DSV41RT_CHECK(data != nullptr && size >= sizeof h, "sequence state: ", size,
                " bytes is shorter than its header (", sizeof h, ")");
  std::memcpy(&h, data, sizeof h);
  DSV41RT_CHECK(std::memcmp(h.magic, kMagic, sizeof kMagic) == 0,
                "sequence state: not a dsv41rt sequence state (bad magic)");
  DSV41RT_CHECK(h.version == kSequenceStateVersion, "sequence state: version ", h.version,
                ", this runtime reads version ", kSequenceStateVersion);
  DSV41RT_CHECK(
      h.slot_bytes >= 0 && h.page_bytes > 0 && h.n_pages >= 0 && h.length >= 0 && h.page_tokens > 0,
      "sequence state: negative or zero sizes in the header");
  const size_t want = sizeof h + size_t(h.slot_bytes) + size_t(h.n_pages) * size_t(h.page_bytes);
  DSV41RT_CHECK(size == want, "sequence state: ", size, " bytes, its header describes ", want,
                " (truncated or padded)");
  DSV41RT_CHECK(checksum(h, data + sizeof h, size - sizeof h) == h.checksum,
                "sequence state: checksum mismatch (corrupted in transfer)");
  DSV41RT_CHECK(h.model_fingerprint == fingerprint,
                "sequence state: from another model (config fingerprint differs)");
  DSV41RT_CHECK(h.page_tokens == geometry.page_tokens && h.page_bytes == geometry.page_bytes &&
                    h.slot_bytes == geometry.slot_bytes,
                "sequence state: pool layout differs (page ", h.page_tokens, " tokens / ",
                h.page_bytes, " B, slot ", h.slot_bytes, " B; here ", geometry.page_tokens,
                " tokens / ", geometry.page_bytes, " B, slot ", geometry.slot_bytes, " B)");
  DSV41RT_CHECK(h.n_pages == (h.length + h.page_tokens - 1) / h.page_tokens,
                "sequence state: ", h.n_pages, " pages for ", h.length, " positions of ",
                h.page_tokens, " per page");
  return {h, data + sizeof h, data + sizeof h + h.slot_bytes};
}

std::vector<uint8_t> export_sequence_state(model::Executor& exec, int32_t slot,
                                           const int32_t* pages, int64_t length) {
  model::HostStateCopy& copy = host_copy(exec, "export a sequence's state");
  const model::PoolGeometry g = state_geometry(exec, copy);
  const int64_t n_pages = (length + g.page_tokens - 1) / g.page_tokens;
  std::vector<uint8_t> slot_bytes(size_t(g.slot_bytes)), page_bytes(size_t(n_pages * g.page_bytes));
  copy.slot_to_host(slot, slot_bytes.data());
  for (int64_t i = 0; i < n_pages; ++i) {
    copy.page_to_host(pages[i], page_bytes.data() + i * g.page_bytes);
  }
  return encode_sequence_state(g, model_fingerprint(exec.plan().config), length, slot_bytes,
                               page_bytes);
}

SequenceStateView check_sequence_state(model::Executor& exec, const uint8_t* data, size_t size) {
  model::HostStateCopy& copy = host_copy(exec, "import a sequence's state");
  return decode_sequence_state(data, size, state_geometry(exec, copy),
                               model_fingerprint(exec.plan().config));
}

void write_sequence_state(model::Executor& exec, const SequenceStateView& state, int32_t slot,
                          const int32_t* pages) {
  model::HostStateCopy& copy = host_copy(exec, "import a sequence's state");
  copy.slot_from_host(state.slot, slot);
  for (int64_t i = 0; i < state.header.n_pages; ++i) {
    copy.page_from_host(state.pages + i * state.header.page_bytes, pages[i]);
  }
}

}  // namespace dsv41rt
