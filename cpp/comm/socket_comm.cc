#include "comm/socket_comm.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>
#include <vector>

#include "comm/collective_math.h"
#include "core/status.h"

namespace dsv41rt::comm {
namespace {

using detail::Op;
using Clock = std::chrono::steady_clock;

// What a rank sends the hub before its input.
struct Header {
  int32_t op, dtype, reduce, root;
  uint64_t count;
  bool operator==(const Header& o) const {
    return op == o.op && dtype == o.dtype && reduce == o.reduce && root == o.root &&
           count == o.count;
  }
};

std::string errno_text() { return std::strerror(errno); }

class SocketComm final : public Communicator {
 public:
  SocketComm(int rank, int size, std::chrono::milliseconds timeout)
      : rank_(rank), size_(size), timeout_(timeout), peers_(size_t(size), -1) {}
  ~SocketComm() override {
    for (int fd : peers_) {
      if (fd >= 0) ::close(fd);
    }
  }

  void connect_group(const std::string& address) {
    const size_t colon = address.rfind(':');
    DSV41RT_CHECK(colon != std::string::npos, "SocketComm: address '", address,
                  "' is not host:port");
    const std::string host = address.substr(0, colon), port = address.substr(colon + 1);
    addrinfo hints{}, *res = nullptr;
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = rank_ == 0 ? AI_PASSIVE : 0;
    const int rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &res);
    DSV41RT_CHECK(rc == 0, "SocketComm: cannot resolve '", address, "': ", gai_strerror(rc));
    std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> info(res, freeaddrinfo);
    const auto deadline = Clock::now() + timeout_;
    if (rank_ == 0) {
      const int lfd = ::socket(AF_INET, SOCK_STREAM, 0);
      DSV41RT_CHECK(lfd >= 0, "SocketComm: socket: ", errno_text());
      const int one = 1;
      ::setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
      const bool ok = ::bind(lfd, res->ai_addr, res->ai_addrlen) == 0 && ::listen(lfd, size_) == 0;
      const std::string why = ok ? "" : errno_text();
      if (!ok) ::close(lfd);
      DSV41RT_CHECK(ok, "SocketComm rank 0: cannot listen on ", address, ": ", why);
      for (int joined = 1; joined < size_; ++joined) {
        if (!wait_readable(lfd, deadline)) {
          ::close(lfd);
          DSV41RT_THROW("SocketComm rank 0: only ", joined - 1, " of ", size_ - 1,
                        " ranks connected to ", address, " within ", timeout_.count(), " ms");
        }
        const int fd = ::accept(lfd, nullptr, nullptr);
        int32_t r = -1;
        if (fd < 0 || !read_all(fd, &r, sizeof(r), deadline) || r < 1 || r >= size_ ||
            peers_[size_t(r)] >= 0) {
          if (fd >= 0) ::close(fd);
          ::close(lfd);
          DSV41RT_THROW("SocketComm rank 0: a bad or duplicate rank (", r, ") connected");
        }
        tune(fd);
        peers_[size_t(r)] = fd;
      }
      ::close(lfd);
      return;
    }
    for (;;) {  // the hub may not be listening yet
      const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
      DSV41RT_CHECK(fd >= 0, "SocketComm: socket: ", errno_text());
      if (::connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
        tune(fd);
        peers_[0] = fd;
        const int32_t r = rank_;
        DSV41RT_CHECK(write_all(fd, &r, sizeof(r)), "SocketComm rank ", rank_,
                      ": cannot greet rank 0: ", errno_text());
        return;
      }
      ::close(fd);
      DSV41RT_CHECK(Clock::now() < deadline, "SocketComm rank ", rank_, ": cannot connect to ",
                    address, " within ", timeout_.count(), " ms");
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void all_gather(const void* s, void* r, size_t n, DType t, void*) override {
    run(Op::kAllGather, s, r, n, t, ReduceOp::kSum, 0);
  }
  void reduce_scatter(const void* s, void* r, size_t n, DType t, ReduceOp op, void*) override {
    run(Op::kReduceScatter, s, r, n, t, op, 0);
  }
  void all_reduce(const void* s, void* r, size_t n, DType t, ReduceOp op, void*) override {
    run(Op::kAllReduce, s, r, n, t, op, 0);
  }
  void all_to_all(const void* s, void* r, size_t n, DType t, void*) override {
    run(Op::kAllToAll, s, r, n, t, ReduceOp::kSum, 0);
  }
  void broadcast(void* buf, size_t n, DType t, int root, void*) override {
    DSV41RT_CHECK(root >= 0 && root < size_, "SocketComm broadcast: root ", root, " of ", size_);
    run(Op::kBroadcast, buf, buf, n, t, ReduceOp::kSum, root);
  }
  void barrier() override { run(Op::kBarrier, nullptr, nullptr, 0, DType::kU8, ReduceOp::kSum, 0); }
  void abort(const std::string&) override {
    for (int fd : peers_) {
      if (fd >= 0) ::shutdown(fd, SHUT_RDWR);  // peers blocked on us fail at once
    }
  }

 private:
  void run(Op op, const void* send, void* recv, size_t count, DType t, ReduceOp reduce, int root) {
    const char* name = detail::op_name(op);
    const size_t eb = detail::element_bytes(t);
    const size_t in_bytes = detail::input_elements(op, count, size_) * eb;
    const size_t out_bytes = detail::output_elements(op, count, size_) * eb;
    DSV41RT_CHECK(count == 0 || (send && recv), "SocketComm ", name, ": NULL buffer on rank ",
                  rank_);
    const Header mine{int32_t(op), int32_t(t), int32_t(reduce), root, uint64_t(count)};
    const auto deadline = Clock::now() + timeout_;
    if (rank_ != 0) {
      // A rank waits for the hub as long as it takes (a context-parallel worker idles in a
      // broadcast while rank 0 has no work); a hub that dies closes the socket, which ends it.
      const auto forever = Clock::now() + std::chrono::hours(24 * 365 * 100);
      const int fd = peers_[0];
      if (!write_all(fd, &mine, sizeof(mine)) || !write_all(fd, send, in_bytes)) {
        fail(name, "rank 0 is gone");
      }
      int32_t status = 0;
      if (!read_all(fd, &status, sizeof(status), forever)) fail(name, "rank 0 is gone");
      if (status != 0) fail(name, "the ranks called different collectives (rank 0 says)");
      std::vector<uint8_t> out(out_bytes);
      if (!read_all(fd, out.data(), out_bytes, forever)) fail(name, "rank 0 is gone");
      if (out_bytes) std::memcpy(recv, out.data(), out_bytes);
      return;
    }
    std::vector<std::vector<uint8_t>> inputs(static_cast<size_t>(size_));
    bool same = true;
    for (int r = 1; r < size_; ++r) {
      Header h{};
      if (!read_all(peers_[size_t(r)], &h, sizeof(h), deadline)) {
        fail(name, "rank " + std::to_string(r) + " did not arrive or is gone");
      }
      same = same && h == mine;
      inputs[size_t(r)].resize(detail::input_elements(Op(h.op), size_t(h.count), size_) *
                               detail::element_bytes(DType(h.dtype)));
      if (!read_all(peers_[size_t(r)], inputs[size_t(r)].data(), inputs[size_t(r)].size(),
                    deadline)) {
        fail(name, "rank " + std::to_string(r) + " is gone");
      }
    }
    const int32_t status = same ? 0 : 1;
    std::vector<const void*> sends(static_cast<size_t>(size_));
    sends[0] = send;
    for (int r = 1; r < size_; ++r) sends[size_t(r)] = inputs[size_t(r)].data();
    std::vector<std::vector<uint8_t>> outputs(static_cast<size_t>(size_));
    if (same) {
      for (int r = 0; r < size_; ++r) {
        outputs[size_t(r)].resize(out_bytes);
        if (count) {
          detail::collective_output(op, sends, r, count, t, reduce, root,
                                    outputs[size_t(r)].data());
        }
      }
    }
    for (int r = 1; r < size_; ++r) {
      if (!write_all(peers_[size_t(r)], &status, sizeof(status)) ||
          (same && !write_all(peers_[size_t(r)], outputs[size_t(r)].data(), out_bytes))) {
        fail(name, "rank " + std::to_string(r) + " is gone");
      }
    }
    if (!same) fail(name, "the ranks called different collectives");
    if (out_bytes) std::memcpy(recv, outputs[0].data(), out_bytes);
  }

  [[noreturn]] void fail(const char* op, const std::string& why) const {
    DSV41RT_THROW_CODE(kInternal, "SocketComm rank ", rank_, " ", op, ": ", why);
  }
  static void tune(int fd) {
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  }
  static bool wait_readable(int fd, Clock::time_point deadline) {
    for (;;) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) return false;
      pollfd p{fd, POLLIN, 0};
      const int rc = ::poll(&p, 1, int(std::min<int64_t>(left, 1000)));
      if (rc > 0) return true;
      if (rc < 0 && errno != EINTR) return false;
    }
  }
  static bool read_all(int fd, void* buf, size_t n, Clock::time_point deadline) {
    auto* p = static_cast<uint8_t*>(buf);
    while (n > 0) {
      if (!wait_readable(fd, deadline)) return false;
      const ssize_t got = ::recv(fd, p, n, 0);
      if (got == 0) return false;
      if (got < 0) {
        if (errno == EINTR) continue;
        return false;
      }
      p += got, n -= size_t(got);
    }
    return true;
  }
  static bool write_all(int fd, const void* buf, size_t n) {
    const auto* p = static_cast<const uint8_t*>(buf);
    while (n > 0) {
      const ssize_t put = ::send(fd, p, n, MSG_NOSIGNAL);
      if (put < 0) {
        if (errno == EINTR) continue;
        return false;
      }
      p += put, n -= size_t(put);
    }
    return true;
  }

  int rank_, size_;
  std::chrono::milliseconds timeout_;
  std::vector<int> peers_;  // rank 0: one socket per other rank; others: [0] = rank 0
};

}  // namespace

std::unique_ptr<Communicator> make_socket_comm(const std::string& address, int rank, int size,
                                               std::chrono::milliseconds timeout) {
  DSV41RT_CHECK(size >= 1 && rank >= 0 && rank < size, "SocketComm: rank ", rank, " of ", size);
  auto c = std::make_unique<SocketComm>(rank, size, timeout);
  if (size > 1) c->connect_group(address);
  return c;
}

}  // namespace dsv41rt::comm
