// A request held directly on an Executor (outside an engine), for the executor-level tests: its
// pool slot, its page table (pages may be shared with other holders) and its length.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "runtime/model/executor.h"

namespace dsv41rt::testing {

struct Held {
  model::Executor& e;
  int32_t slot;
  std::vector<int32_t> pages;
  int64_t length = 0;
  explicit Held(model::Executor& ex) : e(ex), slot(ex.pool().alloc_slot()) { EXPECT_GE(slot, 0); }
  ~Held() {
    e.pool().free_pages(pages);
    e.pool().free_slot(slot);
  }
  model::RequestView view() {
    return {e.pool().slot_data(slot), pages.data(), int64_t(pages.size()), length};
  }
  // Forwards `tokens` after the held ones; the logits of every new position.
  std::vector<float> run(const std::vector<int32_t>& tokens) {
    EXPECT_TRUE(e.pool().ensure_pages(pages, length + int64_t(tokens.size())));
    std::vector<float> logits(tokens.size() * size_t(e.plan().config.vocab_size));
    std::vector<model::BatchItem> batch(1);
    batch[0].request = view();
    batch[0].tokens = tokens.data();
    batch[0].n = int64_t(tokens.size());
    batch[0].logits = logits.data();
    e.forward(batch);
    length += int64_t(tokens.size());
    return logits;
  }
};

}  // namespace dsv41rt::testing
