// Header-only C++ RAII wrappers over the dsv41rt C API (dsv41rt.h). Errors become
// dsv41rt::cpp::Error (status + message); the runtime is movable, not copyable.
//
//   dsv41rt::cpp::Runtime rt("/models/tiny-v41");            // device "cpu" by default
//   auto id = rt.submit({0, 671, 6102}, rt.request_params());
//   std::vector<int32_t> out; bool done = false;
//   while (!done) done = rt.wait(id, out);                    // appends new tokens to out
#ifndef DSV41RT_HPP_
#define DSV41RT_HPP_

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "dsv41rt/dsv41rt.h"

namespace dsv41rt::cpp {

class Error : public std::runtime_error {
 public:
  Error(dsv41rt_status status, const std::string& message)
      : std::runtime_error(std::string(dsv41rt_status_name(status)) + ": " + message),
        status_(status) {}
  dsv41rt_status status() const noexcept { return status_; }

 private:
  dsv41rt_status status_;
};

class Runtime {
 public:
  explicit Runtime(const std::string& checkpoint_dir, const std::string& device = "cpu") {
    dsv41rt_runtime_params p;
    dsv41rt_runtime_default_params(&p);
    p.checkpoint_dir = checkpoint_dir.c_str();
    p.device = device.c_str();
    create(p);
  }
  explicit Runtime(const dsv41rt_runtime_params& params) { create(params); }

  Runtime(Runtime&&) noexcept = default;
  Runtime& operator=(Runtime&&) noexcept = default;
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  dsv41rt_runtime* get() const noexcept { return rt_.get(); }

  static dsv41rt_request_params request_params() {
    dsv41rt_request_params p;
    dsv41rt_request_default_params(&p);
    return p;
  }

  int64_t submit(const std::vector<int32_t>& prompt, const dsv41rt_request_params& params) {
    int64_t id = 0;
    check(dsv41rt_submit(get(), prompt.data(), prompt.size(), &params, &id));
    return id;
  }

  /// Appends the tokens generated since the last call; true once the request has finished (the
  /// id is then forgotten). Blocks up to timeout_ms (< 0: forever); false on timeout.
  bool wait(int64_t id, std::vector<int32_t>& out, int32_t timeout_ms = -1) {
    int32_t buf[256];
    size_t n = 0;
    int finished = 0;
    const dsv41rt_status s =
        dsv41rt_wait(get(), id, timeout_ms, buf, sizeof(buf) / sizeof(buf[0]), &n, &finished);
    if (s == DSV41RT_E_TIMEOUT) return false;
    check(s);
    out.insert(out.end(), buf, buf + n);
    return finished != 0;
  }

  void cancel(int64_t id) { check(dsv41rt_cancel(get(), id)); }

  dsv41rt_stats stats() {
    dsv41rt_stats s;
    dsv41rt_stats_init(&s);
    check(dsv41rt_get_stats(get(), &s));
    return s;
  }

 private:
  struct Destroy {
    void operator()(dsv41rt_runtime* rt) const noexcept { dsv41rt_runtime_destroy(rt); }
  };

  void create(const dsv41rt_runtime_params& p) {
    dsv41rt_runtime* raw = nullptr;
    const dsv41rt_status s = dsv41rt_runtime_create(DSV41RT_ABI_VERSION, &p, &raw);
    if (s != DSV41RT_OK) throw Error(s, dsv41rt_last_error(nullptr));
    rt_.reset(raw);
  }
  void check(dsv41rt_status s) const {
    if (s != DSV41RT_OK)
      throw Error(s, dsv41rt_last_error(s == DSV41RT_E_INVALID_HANDLE ? nullptr : get()));
  }

  std::unique_ptr<dsv41rt_runtime, Destroy> rt_;
};

}  // namespace dsv41rt::cpp

#endif  // DSV41RT_HPP_
