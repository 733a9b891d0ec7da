// dsv41rt._core.comm: NcclComm on raw device pointers (ints: a torch tensor's data_ptr()) and raw
// cudaStream_t handles (torch.cuda.current_stream().cuda_stream; 0 = the legacy default stream),
// so tests and the Python control plane can drive NCCL without this module knowing torch. Use it
// through dsv41rt.comm, which points the NCCL loader at the pip nvidia-nccl-cu13 package first.
// Present in every build; without NCCL compiled in, everything but the queries raises
// RuntimeError saying so.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <new>
#include <set>
#include <stdexcept>
#include <string>

#include "comm/communicator.h"
#include "core/dtype.h"
#include "core/status.h"
#ifdef DSV41RT_HAVE_NCCL
#include "comm/nccl_comm.h"
#endif

namespace nb = nanobind;

namespace dsv41rt::bindings {
namespace {

using comm::Communicator;
using comm::ReduceOp;

#ifdef DSV41RT_HAVE_NCCL
constexpr bool kBuiltWithNccl = true;
#else
constexpr bool kBuiltWithNccl = false;
[[noreturn]] void no_nccl() {
  throw std::runtime_error(
      "dsv41rt was built without NCCL (nccl.h was not found at build time, or the CUDA backend "
      "is off): pip install nvidia-nccl-cu13 and rebuild, or set NCCL_INCLUDE_DIR");
}
#endif

ReduceOp reduce_op(const std::string& name) {
  if (name == "sum") return ReduceOp::kSum;
  if (name == "max") return ReduceOp::kMax;
  DSV41RT_THROW_CODE(kUnsupported, "unknown reduce op '", name, "' (sum, max)");
}

void* ptr(uintptr_t p) { return reinterpret_cast<void*>(p); }

// Owns one communicator; close() destroys it early (before the interpreter tears objects down in
// an arbitrary order, and before a CUDA graph that used it is kept around by mistake).
// As make_nccl_comm's default: 10 minutes.
constexpr int64_t kDefaultTimeoutMs = 600000;

class PyNcclComm {
 public:
  explicit PyNcclComm(std::unique_ptr<Communicator> c) : c_(std::move(c)) {}

  static void init(PyNcclComm* self, const nb::bytes& unique_id, int rank, int size, int device,
                   int64_t timeout_ms) {
#ifdef DSV41RT_HAVE_NCCL
    const std::string id(unique_id.c_str(), unique_id.size());
    std::unique_ptr<Communicator> c;
    {
      nb::gil_scoped_release release;  // every rank blocks in init until all have joined
      c = comm::make_nccl_comm(id, rank, size, device, timeout(timeout_ms));
    }
    new (self) PyNcclComm(std::move(c));
#else
    (void)self, (void)unique_id, (void)rank, (void)size, (void)device, (void)timeout_ms;
    no_nccl();
#endif
  }

  static PyNcclComm single(int device, int64_t timeout_ms) {
#ifdef DSV41RT_HAVE_NCCL
    const std::chrono::milliseconds t = timeout(timeout_ms);
    nb::gil_scoped_release release;
    return PyNcclComm(comm::make_nccl_comm_single(device, t));
#else
    (void)device, (void)timeout_ms;
    no_nccl();
#endif
  }

  static std::chrono::milliseconds timeout(int64_t ms) {
    DSV41RT_CHECK(ms > 0, "NcclComm: timeout_ms must be positive, got ", ms);
    return std::chrono::milliseconds(ms);
  }

  Communicator& get() const {
    DSV41RT_CHECK(c_ != nullptr, "NcclComm: the communicator is closed");
    return *c_;
  }
  void close() { c_.reset(); }

 private:
  std::unique_ptr<Communicator> c_;
};

}  // namespace

void register_comm(nb::module_& m) {
  nb::module_ c = m.def_submodule(
      "comm", "NCCL collectives on raw CUDA device pointers and streams (see dsv41rt.comm).");
  // A function, not a constant: the committed stubs must not depend on the build's NCCL setting.
  c.def(
      "built_with_nccl", []() { return kBuiltWithNccl; },
      "Whether this build compiled the NCCL communicator (nccl.h found at configure time).");
  c.def(
      "nccl_available",
      []() {
#ifdef DSV41RT_HAVE_NCCL
        return comm::nccl_available();
#else
        return false;
#endif
      },
      "True when NCCL is compiled in and libnccl.so.2 loads.");
  c.def(
      "nccl_library_info",
      []() -> std::string {
#ifdef DSV41RT_HAVE_NCCL
        return comm::nccl_library_info();
#else
        no_nccl();
#endif
      },
      "'NCCL <version> (<path of libnccl.so.2>)'; raises when NCCL is not available.");
  c.def(
      "nccl_unique_id",
      []() -> nb::bytes {  // the same signature (and stubs) with or without NCCL
#ifdef DSV41RT_HAVE_NCCL
        const std::string id = comm::NcclComm::nccl_unique_id();
        return nb::bytes(id.data(), id.size());
#else
        no_nccl();
#endif
      },
      "A fresh 128-byte ncclUniqueId: make it on rank 0 and send it to every rank.");

  using G = nb::call_guard<nb::gil_scoped_release>;
  nb::class_<PyNcclComm>(c, "NcclComm",
                         "One rank of an NCCL group. Buffers are device pointers (ints) on its "
                         "GPU; collectives are enqueued on `stream` (a cudaStream_t as an int) and "
                         "may be captured into a CUDA graph.")
      .def("__init__", &PyNcclComm::init, nb::arg("unique_id"), nb::arg("rank"), nb::arg("size"),
           nb::arg("device"), nb::arg("timeout_ms") = kDefaultTimeoutMs,
           "`timeout_ms` bounds barrier() and every collective's completion (the watchdog "
           "aborts the communicator past it).")
      .def_static("single", &PyNcclComm::single, nb::arg("device"),
                  nb::arg("timeout_ms") = kDefaultTimeoutMs,
                  "A one-rank group on CUDA device `device`.")
      .def(
          "check_healthy", [](const PyNcclComm& s) { s.get().check_healthy(); },
          "Raises the watchdog's reason once it has aborted the communicator.")
      .def(
          "watch_launch",
          [](PyNcclComm& s, const std::string& what, uintptr_t stream) {
            // The watchdog keeps the name's pointer: one static name per call site in C++; here
            // the few names a test uses, interned for the process.
            static std::mutex mu;
            static std::set<std::string> names;
            std::lock_guard<std::mutex> lock(mu);
            s.get().watch_launch(names.insert(what).first->c_str(), ptr(stream));
          },
          nb::arg("what"), nb::arg("stream"),
          "Has the watchdog watch `stream` past work holding this group's collectives that no "
          "call of it enqueued (a replayed CUDA graph that captured them).")
      .def_prop_ro("rank", [](const PyNcclComm& s) { return s.get().rank(); })
      .def_prop_ro("size", [](const PyNcclComm& s) { return s.get().size(); })
      .def(
          "all_gather",
          [](PyNcclComm& s, uintptr_t send, uintptr_t recv, size_t count, const std::string& dtype,
             uintptr_t stream) {
            s.get().all_gather(ptr(send), ptr(recv), count, dtype_from_name(dtype), ptr(stream));
          },
          nb::arg("send_ptr"), nb::arg("recv_ptr"), nb::arg("count"), nb::arg("dtype"),
          nb::arg("stream") = 0, G())
      .def(
          "reduce_scatter",
          [](PyNcclComm& s, uintptr_t send, uintptr_t recv, size_t count, const std::string& dtype,
             const std::string& op, uintptr_t stream) {
            s.get().reduce_scatter(ptr(send), ptr(recv), count, dtype_from_name(dtype),
                                   reduce_op(op), ptr(stream));
          },
          nb::arg("send_ptr"), nb::arg("recv_ptr"), nb::arg("count"), nb::arg("dtype"),
          nb::arg("op") = "sum", nb::arg("stream") = 0, G())
      .def(
          "all_reduce",
          [](PyNcclComm& s, uintptr_t send, uintptr_t recv, size_t count, const std::string& dtype,
             const std::string& op, uintptr_t stream) {
            s.get().all_reduce(ptr(send), ptr(recv), count, dtype_from_name(dtype), reduce_op(op),
                               ptr(stream));
          },
          nb::arg("send_ptr"), nb::arg("recv_ptr"), nb::arg("count"), nb::arg("dtype"),
          nb::arg("op") = "sum", nb::arg("stream") = 0, G())
      .def(
          "all_to_all",
          [](PyNcclComm& s, uintptr_t send, uintptr_t recv, size_t count, const std::string& dtype,
             uintptr_t stream) {
            s.get().all_to_all(ptr(send), ptr(recv), count, dtype_from_name(dtype), ptr(stream));
          },
          nb::arg("send_ptr"), nb::arg("recv_ptr"), nb::arg("count"), nb::arg("dtype"),
          nb::arg("stream") = 0, G())
      .def(
          "broadcast",
          [](PyNcclComm& s, uintptr_t buf, size_t count, const std::string& dtype, int root,
             uintptr_t stream) {
            s.get().broadcast(ptr(buf), count, dtype_from_name(dtype), root, ptr(stream));
          },
          nb::arg("buf_ptr"), nb::arg("count"), nb::arg("dtype"), nb::arg("root") = 0,
          nb::arg("stream") = 0, G())
      .def(
          "barrier", [](PyNcclComm& s) { s.get().barrier(); }, G())
      .def("close", &PyNcclComm::close, G(),
           "Destroys the NCCL communicator now (later calls raise). Destroy CUDA graphs that "
           "replay its collectives first.");
}

}  // namespace dsv41rt::bindings
