// Shared by the suites that drive the scripting API's direct sequences on the tiny checkpoint
// (test_rollback.cc, test_verify_greedy.cc, test_runtime_drafter.cc): where the checkpoint is, the
// skip when it is not given, and the status code an API call fails with.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>

#include "core/status.h"

namespace dsv41rt::testing {

/// The tiny-v41 checkpoint of DSV41RT_TEST_CHECKPOINT, or null.
inline const char* tiny_checkpoint() { return std::getenv("DSV41RT_TEST_CHECKPOINT"); }

/// The code of the dsv41rt::Error `fn` throws (kOk when it throws none).
inline StatusCode code_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.kind();
  }
  return StatusCode::kOk;
}

}  // namespace dsv41rt::testing

#define NEED_CHECKPOINT()                     \
  if (!::dsv41rt::testing::tiny_checkpoint()) \
  GTEST_SKIP() << "set DSV41RT_TEST_CHECKPOINT to a tiny-v41 checkpoint"
