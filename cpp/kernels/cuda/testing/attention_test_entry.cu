#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/compressor.cuh"
#include "kernels/cuda/indexer.cuh"
#include "kernels/cuda/testing/attention_test_entry.h"
#include "kernels/cuda/testing/device_buffer.cuh"

namespace dsv41rt::kernels::cuda::testing {

void sparse_attention(const float* q, const float* kv, const int32_t* indices, const float* sink,
                      int64_t S, int64_t n_heads, int64_t D, int64_t T, int64_t K, float scale,
                      float* out) {
  DeviceBuffer<float> dq(q, S * n_heads * D), dkv(kv, T * D), dsink(sink, n_heads);
  DeviceBuffer<int32_t> didx(indices, S * K);
  DeviceBuffer<float> dout(S * n_heads * D);
  dout.poison();
  finish(cuda::sparse_attention(dq.get(), dkv.get(), didx.get(), dsink.get(), S, n_heads, D, T, K,
                                scale, dout.get(), nullptr));
  dout.to_host(out);
}

void compress_pool(const float* values, const float* scores, int64_t groups, int64_t ratio,
                   int64_t D, float* pooled) {
  DeviceBuffer<float> dv(values, groups * ratio * D), ds(scores, groups * ratio * D);
  DeviceBuffer<float> dout(groups * D);
  dout.poison();
  finish(cuda::compress_pool(dv.get(), ds.get(), groups, ratio, D, dout.get(), nullptr));
  dout.to_host(pooled);
}

void indexer_scores(const float* q, const float* keys, const float* w, const int64_t* n_visible,
                    int64_t S, int64_t H, int64_t D, int64_t T, float* scores) {
  DeviceBuffer<float> dq(q, S * H * D), dk(keys, T * D), dw(w, S * H);
  DeviceBuffer<int64_t> dvis(n_visible, S);
  DeviceBuffer<float> dout(S * T);
  dout.poison();
  finish(cuda::indexer_scores(dq.get(), dk.get(), dw.get(), dvis.get(), S, H, D, T, dout.get(),
                              nullptr));
  dout.to_host(scores);
}

void candidate_blocks(const float* scores, const int64_t* n_visible, int64_t S, int64_t T,
                      int64_t topk_blocks, int64_t block_size, uint8_t* mask) {
  DeviceBuffer<float> ds(scores, S * T);
  DeviceBuffer<int64_t> dvis(n_visible, S);
  DeviceBuffer<uint8_t> dout(S * T);
  dout.poison();
  finish(cuda::candidate_blocks(ds.get(), dvis.get(), S, T, topk_blocks, block_size, dout.get(),
                                nullptr));
  dout.to_host(mask);
}

void topk_select(const float* scores, int64_t S, int64_t T, int64_t k, int32_t* indices) {
  DeviceBuffer<float> ds(scores, S * T);
  DeviceBuffer<int32_t> dout(S * k);
  dout.poison();
  finish(cuda::topk_select(ds.get(), S, T, k, dout.get(), nullptr));
  dout.to_host(indices);
}

}  // namespace dsv41rt::kernels::cuda::testing
