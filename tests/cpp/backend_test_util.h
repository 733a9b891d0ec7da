// Shared pieces of the Backend op suites (tests/cpp/test_backend_*.cc, test_cuda_*.cc):
//
//   - the CUDA policy: a "cuda" instance skips when no CUDA device is visible, and FAILS instead
//     when DSV41RT_REQUIRE_CUDA=1 (GPU CI sets it so a missing device cannot pass silently);
//   - BackendTest, the fixture every suite is parameterised with ("cpu", plus "cuda" in CUDA
//     builds): the backend under test, the CPU reference backend, and a per-run random seed that
//     is printed with every failure (replay with DSV41RT_TEST_SEED=<seed>);
//   - typed backend buffers (upload / poison / download) and the comparisons the suites state
//     their bounds with.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/device.h"
#include "runtime/model/backend.h"
#include "runtime/model/device_array.h"

namespace dsv41rt::testing {

using model::Backend;
using model::Stream;

inline bool cuda_required() {
  const char* v = std::getenv("DSV41RT_REQUIRE_CUDA");
  return v != nullptr && std::string(v) == "1";
}

/// In a fixture's SetUp (or a test body): skips the test when no CUDA device is visible, or fails
/// it when DSV41RT_REQUIRE_CUDA=1.
#define DSV41RT_SKIP_WITHOUT_CUDA()                                                           \
  do {                                                                                        \
    if (::dsv41rt::cuda_device_count() == 0) {                                                \
      if (::dsv41rt::testing::cuda_required()) {                                              \
        FAIL() << "DSV41RT_REQUIRE_CUDA=1 but no CUDA device";                                \
      }                                                                                       \
      GTEST_SKIP() << "no CUDA device visible (DSV41RT_REQUIRE_CUDA=1 makes this a failure)"; \
    }                                                                                         \
  } while (0)

/// The backends every suite runs on: the CPU reference, and the CUDA backend in CUDA builds.
inline std::vector<std::string> backend_names() {
#if DSV41RT_WITH_CUDA
  return {"cpu", "cuda"};
#else
  return {"cpu"};
#endif
}

/// Names the instances ".../cpu", ".../cuda" instead of ".../0", ".../1".
struct BackendName {
  std::string operator()(const ::testing::TestParamInfo<std::string>& info) const {
    return info.param;
  }
};

#define DSV41RT_INSTANTIATE_BACKENDS(Suite)                                          \
  INSTANTIATE_TEST_SUITE_P(Backends, Suite,                                          \
                           ::testing::ValuesIn(::dsv41rt::testing::backend_names()), \
                           ::dsv41rt::testing::BackendName())

/// The seed of this run: DSV41RT_TEST_SEED when set (to replay a failure), else fresh.
inline uint64_t test_seed() {
  if (const char* v = std::getenv("DSV41RT_TEST_SEED")) return std::strtoull(v, nullptr, 10);
  std::random_device rd;
  return (uint64_t(rd()) << 32) ^ rd();
}

/// Poison written over every output before an op: 0xFF bytes are a NaN for floats and 255 for
/// bytes. Integer index outputs, where -1 (0xFFFFFFFF) is a legal value, use kIndexPoison.
inline constexpr uint8_t kPoison = 0xFF;
inline constexpr uint8_t kIndexPoison = 0xA5;  // int32 0xA5A5A5A5: negative, never -1
/// A float element that still holds kPoison.
inline float poison_float() { return std::bit_cast<float>(0xFFFFFFFFu); }

/// n elements of T in a backend's memory.
template <class T>
class Buffer {
 public:
  Buffer(Backend& b, int64_t n) : backend_(&b), n_(n), mem_(b.alloc(n * int64_t(sizeof(T)))) {}
  T* get() const { return static_cast<T*>(mem_.get()); }
  int64_t size() const { return n_; }
  void upload(const std::vector<T>& host) {
    EXPECT_EQ(int64_t(host.size()), n_);
    backend_->to_device(get(), host.data(), n_ * int64_t(sizeof(T)), backend_->stream(0));
    backend_->synchronize(backend_->stream(0));
  }
  void poison(uint8_t byte) {
    backend_->fill(get(), byte, n_ * int64_t(sizeof(T)), backend_->stream(0));
    backend_->synchronize(backend_->stream(0));
  }
  /// The contents after every op enqueued on stream 0 so far.
  std::vector<T> download() const {
    std::vector<T> host(static_cast<size_t>(n_));
    backend_->to_host(host.data(), get(), n_ * int64_t(sizeof(T)), backend_->stream(0));
    backend_->synchronize(backend_->stream(0));
    return host;
  }

 private:
  Backend* backend_;
  int64_t n_;
  std::shared_ptr<void> mem_;
};

template <class T>
Buffer<T> upload(Backend& b, const std::vector<T>& host) {
  Buffer<T> buf(b, int64_t(host.size()));
  buf.upload(host);
  return buf;
}

template <class T>
Buffer<T> poisoned(Backend& b, int64_t n, uint8_t byte = kPoison) {
  Buffer<T> buf(b, n);
  buf.poison(byte);
  return buf;
}

/// Scratch for the ops that take one (MoE, Engram, sampling), in `b`'s memory.
class ScratchArena {
 public:
  explicit ScratchArena(Backend& b) : alloc_([&b](int64_t bytes) { return b.alloc(bytes); }) {}
  model::Scratch get() { return model::Scratch(alloc_, array_, generation_); }

 private:
  model::Allocator alloc_;
  model::DeviceArray<uint8_t> array_;
  uint64_t generation_ = 0;
};

/// Fresh random inputs from this run's seed, which every failure message carries. Start() in a
/// fixture's SetUp, Stop() in its TearDown.
class RandomInputs {
 public:
  void Start() {
    seed_ = test_seed();
    rng_.seed(seed_);
    trace_.emplace(__FILE__, __LINE__,
                   "seed " + std::to_string(seed_) +
                       " (replay: DSV41RT_TEST_SEED=" + std::to_string(seed_) + ")");
  }
  void Stop() { trace_.reset(); }

  std::vector<float> normal(int64_t n, double sigma = 1.0) {
    std::normal_distribution<float> d(0.0f, static_cast<float>(sigma));
    std::vector<float> v(static_cast<size_t>(n), 0.0f);
    for (float& x : v) x = d(rng_);
    return v;
  }
  std::vector<float> uniform(int64_t n, double lo, double hi) {
    std::uniform_real_distribution<float> d(static_cast<float>(lo), static_cast<float>(hi));
    std::vector<float> v(static_cast<size_t>(n), 0.0f);
    for (float& x : v) x = d(rng_);
    return v;
  }
  int64_t randint(int64_t lo, int64_t hi) {  // [lo, hi]
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng_);
  }
  std::vector<uint8_t> random_bytes(int64_t n) {
    std::vector<uint8_t> v(static_cast<size_t>(n), 0);
    for (uint8_t& x : v) x = uint8_t(randint(0, 255));
    return v;
  }
  /// A random permutation of 0..n-1.
  std::vector<int64_t> permutation(int64_t n) {
    std::vector<int64_t> p(static_cast<size_t>(n), 0);
    for (int64_t i = 0; i < n; ++i) p[i] = i;
    std::shuffle(p.begin(), p.end(), rng_);
    return p;
  }

 private:
  uint64_t seed_ = 0;
  std::mt19937_64 rng_;
  std::optional<::testing::ScopedTrace> trace_;
};

/// Every Backend suite: TEST_P(Suite, ...) with Suite derived from this, instantiated with
/// DSV41RT_INSTANTIATE_BACKENDS(Suite).
class BackendTest : public ::testing::TestWithParam<std::string>, protected RandomInputs {
 protected:
  void SetUp() override {
    Start();
    cpu_ = model::make_cpu_backend();
    if (GetParam() == "cuda") {
      DSV41RT_SKIP_WITHOUT_CUDA();
      cuda_ = model::make_cuda_backend("cuda");
    }
  }
  void TearDown() override { Stop(); }

  bool on_cuda() const { return cuda_ != nullptr; }
  /// The backend under test.
  Backend& backend() { return cuda_ ? *cuda_ : *cpu_; }
  /// The CPU backend: the reference the CUDA instance is compared with.
  Backend& cpu() { return *cpu_; }

 private:
  std::unique_ptr<Backend> cpu_, cuda_;
};

/// Suites of CUDA kernels that no Backend op reaches (test_cuda_*.cc): the CUDA backend provides
/// the device memory and the stream.
class CudaKernelTest : public ::testing::Test, protected RandomInputs {
 protected:
  void SetUp() override {
    Start();
    DSV41RT_SKIP_WITHOUT_CUDA();
    cuda_ = model::make_cuda_backend("cuda");
  }
  void TearDown() override { Stop(); }
  Backend& cuda() { return *cuda_; }

 private:
  std::unique_ptr<Backend> cuda_;
};

/// The graph-capture check of the CUDA suites: two sets of outputs from `make_outputs()`, the ops
/// that `enqueue(outputs)` enqueues on stream 0 run eagerly into the first, captured into one graph
/// writing the second, that graph replayed once and stream 0 synchronised. Returns {eager, graph}
/// for the caller to compare (bitwise: no host synchronisation or allocation inside the ops).
template <class MakeOutputs, class Enqueue>
auto eager_and_replayed(Backend& be, MakeOutputs&& make_outputs, Enqueue&& enqueue) {
  auto eager = make_outputs();
  auto graph = make_outputs();
  enqueue(eager);
  std::unique_ptr<model::BackendGraph> g =
      be.capture(be.stream(0), [&] { enqueue(graph); }, nullptr);
  be.replay(*g, be.stream(0));
  be.synchronize(be.stream(0));
  return std::pair(std::move(eager), std::move(graph));
}

// ---- numerics --------------------------------------------------------------------------------

/// FP32 unit roundoff.
inline constexpr double kU = 0x1p-24;
/// γ_n = n·u / (1 − n·u): the classic bound on the relative error of an n-term FP32 sum or dot
/// product evaluated in ANY order (|fl(Σ a_i) − Σ a_i| <= γ_{n-1} Σ |a_i|, Higham Thm 3.1).
inline double gamma_n(int64_t n) { return double(n) * kU / (1.0 - double(n) * kU); }

inline uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

/// BF16 round-to-nearest-even of a finite float, written out here (not the library's codec).
inline float round_bf16(float f) {
  const uint32_t u = bits_of(f);
  const uint32_t r = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
  float out;
  std::memcpy(&out, &r, 4);
  return out;
}
inline uint16_t bf16_bits(float bf16_exact) { return uint16_t(bits_of(bf16_exact) >> 16); }

template <class T>
std::string show(T v) {
  std::ostringstream os;
  if constexpr (std::is_same_v<T, float>) {
    os << v << " (0x" << std::hex << bits_of(v) << ")";
  } else if constexpr (sizeof(T) == 1) {
    os << int(v);
  } else {
    os << v;
  }
  return os.str();
}

/// Element-for-element identity (floats compared as bit patterns, so -0 != +0 and NaN == the
/// same NaN); reports how many differ and the first one.
template <class T>
::testing::AssertionResult bitwise_equal(const std::vector<T>& got, const std::vector<T>& want) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure() << "size " << got.size() << " != " << want.size();
  }
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0) {
      if (bad++ == 0) first = int64_t(i);
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << got.size() << " elements differ, first at " << first << ": got "
         << show(got[first]) << ", want " << show(want[first]);
}

/// The same NaN positions, every other element bitwise equal (NaN payloads may differ).
inline ::testing::AssertionResult nan_aware_equal(const std::vector<float>& got,
                                                  const std::vector<float>& want) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure() << "size " << got.size() << " != " << want.size();
  }
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < got.size(); ++i) {
    const bool same = std::isnan(got[i])
                          ? std::isnan(want[i])
                          : !std::isnan(want[i]) && bits_of(got[i]) == bits_of(want[i]);
    if (!same && bad++ == 0) first = int64_t(i);
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << got.size() << " elements differ, first at " << first << ": got "
         << show(got[first]) << ", want " << show(want[first]);
}

/// No element still holds the poison pattern `byte` repeated (the op wrote every element).
template <class T>
::testing::AssertionResult all_written(const std::vector<T>& got, uint8_t byte = kPoison) {
  T poison;
  std::memset(&poison, byte, sizeof(T));
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &poison, sizeof(T)) == 0) {
      return ::testing::AssertionFailure()
             << "element " << i << " of " << got.size() << " was not written (still poison)";
    }
  }
  return ::testing::AssertionSuccess();
}

/// |got[i] − want[i]| <= tol[i] for every i (NaN fails); reports the worst ratio.
inline ::testing::AssertionResult within(const std::vector<float>& got,
                                         const std::vector<double>& want,
                                         const std::vector<double>& tol) {
  if (got.size() != want.size() || got.size() != tol.size()) {
    return ::testing::AssertionFailure()
           << "sizes " << got.size() << ", " << want.size() << ", " << tol.size();
  }
  int64_t bad = 0, worst = -1;
  double worst_ratio = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(double(got[i]) - want[i]);
    const double ratio = err / std::max(tol[i], 1e-300);
    if (!(err <= tol[i])) ++bad;
    if (!(ratio <= worst_ratio)) worst_ratio = ratio, worst = int64_t(i);
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << got.size() << " elements outside their bound; worst at " << worst
         << ": got " << got[worst] << ", want " << want[worst] << ", |error| "
         << std::abs(double(got[worst]) - want[worst]) << " > bound " << tol[worst];
}

/// max |got − want| / max |want| (in double): the relative measure the CUDA-vs-CPU bounds use.
inline double rel_error(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
    const double d = std::abs(double(got[i]) - double(want[i]));
    num = std::isnan(d) ? INFINITY : std::max(num, d);
    den = std::max(den, std::abs(double(want[i])));
  }
  return num / std::max(den, 1e-300);
}

}  // namespace dsv41rt::testing
