// Helpers of the C API tests (pure C ABI, like a host would use it): the greedy tokens a runtime
// created from given params generates for one prompt.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "dsv41rt/dsv41rt.h"

namespace dsv41rt::testing {

/// Creates a runtime from `p`, submits `prompt` for `max_new` tokens with the default request
/// params (greedy), waits for them, reads the runtime's stats into `stats` (optional), destroys
/// it. Failures are test failures; the tokens so far are returned.
inline std::vector<int32_t> c_api_generate(const dsv41rt_runtime_params& p,
                                           const std::vector<int32_t>& prompt, int64_t max_new,
                                           dsv41rt_stats* stats = nullptr) {
  dsv41rt_runtime* rt = nullptr;
  EXPECT_EQ(dsv41rt_runtime_create(DSV41RT_ABI_VERSION, &p, &rt), DSV41RT_OK)
      << dsv41rt_last_error(nullptr);
  std::vector<int32_t> out;
  if (!rt) return out;
  dsv41rt_request_params rp;
  dsv41rt_request_default_params(&rp);
  rp.max_new_tokens = max_new;
  int64_t id = 0;
  EXPECT_EQ(dsv41rt_submit(rt, prompt.data(), prompt.size(), &rp, &id), DSV41RT_OK)
      << dsv41rt_last_error(rt);
  int fin = 0;
  while (!fin) {
    int32_t buf[16];
    size_t n = 0;
    if (dsv41rt_wait(rt, id, 60000, buf, 16, &n, &fin) != DSV41RT_OK) {
      ADD_FAILURE() << dsv41rt_last_error(rt);
      break;
    }
    out.insert(out.end(), buf, buf + n);
  }
  if (stats) {
    EXPECT_EQ(dsv41rt_get_stats(rt, stats), DSV41RT_OK) << dsv41rt_last_error(rt);
  }
  EXPECT_EQ(dsv41rt_runtime_destroy(rt), DSV41RT_OK);
  return out;
}

}  // namespace dsv41rt::testing
