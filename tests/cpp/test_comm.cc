// LocalComm: every collective against hand-computed results for 1-4 ranks, bitwise-identical
// reductions on every rank, mismatched calls and missing ranks failing on every rank (no hang).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "comm/local_comm.h"
#include "comm/socket_comm.h"
#include "core/status.h"

using dsv41rt::DType;
using dsv41rt::comm::Communicator;
using dsv41rt::comm::make_local_group;
using dsv41rt::comm::make_socket_comm;
using dsv41rt::comm::ReduceOp;

namespace {

// Runs body(comm) on one thread per rank; returns each rank's error message ("" = none).
std::vector<std::string> run_ranks(std::vector<std::unique_ptr<Communicator>>& group,
                                   const std::function<void(Communicator&)>& body) {
  std::vector<std::string> errors(group.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < group.size(); ++r) {
    threads.emplace_back([&, r] {
      try {
        body(*group[r]);
      } catch (const dsv41rt::Error& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

}  // namespace

class LocalCommTest : public ::testing::TestWithParam<int> {};

void check_every_collective(std::vector<std::unique_ptr<Communicator>>& group) {
  const int n = int(group.size());
  const size_t count = 5;
  std::vector<std::vector<float>> gathered(n), scattered(n), reduced(n), maxed(n), exchanged(n);
  const auto errors = run_ranks(group, [&](Communicator& c) {
    const int r = c.rank();
    EXPECT_EQ(c.size(), n);
    std::vector<float> mine(count), big(count * n);
    for (size_t i = 0; i < count; ++i) mine[i] = float(100 * r + i) + 0.25f;
    for (size_t i = 0; i < big.size(); ++i) big[i] = float(1000 * r + i);
    gathered[r].resize(count * n);
    c.all_gather(mine.data(), gathered[r].data(), count, DType::kF32);
    scattered[r].resize(count);
    c.reduce_scatter(big.data(), scattered[r].data(), count, DType::kF32, ReduceOp::kSum);
    reduced[r] = mine;
    c.all_reduce(reduced[r].data(), reduced[r].data(), count, DType::kF32,
                 ReduceOp::kSum);  // in place
    maxed[r].resize(count);
    c.all_reduce(mine.data(), maxed[r].data(), count, DType::kF32, ReduceOp::kMax);
    exchanged[r].resize(count * n);
    c.all_to_all(big.data(), exchanged[r].data(), count, DType::kF32);
    c.barrier();
  });
  for (const std::string& e : errors) EXPECT_EQ(e, "");
  for (int r = 0; r < n; ++r) {
    for (int p = 0; p < n; ++p) {
      for (size_t i = 0; i < count; ++i) {
        EXPECT_EQ(gathered[r][p * count + i], float(100 * p + i) + 0.25f);
        EXPECT_EQ(exchanged[r][p * count + i], float(1000 * p + r * count + i));
      }
    }
    for (size_t i = 0; i < count; ++i) {
      float sum = 0, sum_mine = 0;
      for (int p = 0; p < n; ++p) {
        sum += float(1000 * p + r * count + i);
        sum_mine += float(100 * p + i) + 0.25f;
      }
      EXPECT_EQ(scattered[r][i], sum);
      EXPECT_EQ(reduced[r][i], sum_mine);
      EXPECT_EQ(maxed[r][i], float(100 * (n - 1) + i) + 0.25f);
    }
    EXPECT_EQ(reduced[r], reduced[0]);  // bitwise the same on every rank
  }
}

TEST_P(LocalCommTest, EveryCollectiveMatchesHandComputedResults) {
  auto group = make_local_group(GetParam());
  check_every_collective(group);
}

// n SocketComm ranks as threads of this process, over 127.0.0.1 (a port the OS had free).
std::vector<std::unique_ptr<Communicator>> make_socket_group(int n) {
  const int probe = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  EXPECT_EQ(::bind(probe, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  EXPECT_EQ(::getsockname(probe, reinterpret_cast<sockaddr*>(&a), &len), 0);
  ::close(probe);
  const std::string address = "127.0.0.1:" + std::to_string(ntohs(a.sin_port));
  std::vector<std::unique_ptr<Communicator>> group(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 1; r < n; ++r) {
    threads.emplace_back([&, r] { group[size_t(r)] = make_socket_comm(address, r, n); });
  }
  group[0] = make_socket_comm(address, 0, n);
  for (auto& t : threads) t.join();
  return group;
}

TEST(SocketComm, EveryCollectiveMatchesHandComputedResults) {
  for (int n = 1; n <= 3; ++n) {
    auto group = make_socket_group(n);
    check_every_collective(group);
    std::vector<std::vector<int64_t>> bufs(static_cast<size_t>(n));
    const auto errors = run_ranks(group, [&](Communicator& c) {
      bufs[size_t(c.rank())] = {c.rank() + 1, 7};
      c.broadcast(bufs[size_t(c.rank())].data(), 2, DType::kI64, n - 1);
    });
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(errors[size_t(r)], "");
      EXPECT_EQ(bufs[size_t(r)], (std::vector<int64_t>{n, 7}));
    }
  }
}

TEST(SocketComm, MismatchAndAbortFailEveryRankAtOnce) {
  auto group = make_socket_group(2);
  const auto errors = run_ranks(group, [&](Communicator& c) {
    float v = 1.0f, out[2];
    if (c.rank() == 0) {
      c.all_gather(&v, out, 1, DType::kF32);
    } else {
      c.all_reduce(&v, out, 1, DType::kF32, ReduceOp::kSum);
    }
  });
  EXPECT_NE(errors[0].find("different collectives"), std::string::npos) << errors[0];
  EXPECT_NE(errors[1].find("different collectives"), std::string::npos) << errors[1];
  // Rank 1 waits in a collective; rank 0 aborts instead of joining: rank 1 fails at once.
  const auto t0 = std::chrono::steady_clock::now();
  std::string error;
  std::thread waiter([&] {
    try {
      group[1]->barrier();
    } catch (const dsv41rt::Error& e) {
      error = e.what();
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  group[0]->abort("test");
  waiter.join();
  EXPECT_NE(error.find("rank 0 is gone"), std::string::npos) << error;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
}

TEST_P(LocalCommTest, IntegerAndBf16Types) {
  const int n = GetParam();
  auto group = make_local_group(n);
  std::vector<int64_t> sums(n);
  std::vector<uint16_t> bf(n);
  const auto errors = run_ranks(group, [&](Communicator& c) {
    const int64_t v = int64_t(1) << (40 + c.rank());
    c.all_reduce(&v, &sums[c.rank()], 1, DType::kI64, ReduceOp::kSum);
    const uint16_t one = dsv41rt::f32_to_bf16(1.0f);
    c.all_reduce(&one, &bf[c.rank()], 1, DType::kBF16, ReduceOp::kSum);
  });
  for (const std::string& e : errors) EXPECT_EQ(e, "");
  int64_t want = 0;
  for (int p = 0; p < n; ++p) want += int64_t(1) << (40 + p);
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(sums[r], want);
    EXPECT_EQ(dsv41rt::bf16_to_f32(bf[r]), float(n));
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, LocalCommTest, ::testing::Values(1, 2, 3, 4));

TEST(LocalComm, MismatchedCallsFailOnEveryRank) {
  auto group = make_local_group(3);
  const auto errors = run_ranks(group, [&](Communicator& c) {
    std::vector<float> in(8, 1.0f), out(24);
    c.all_gather(in.data(), out.data(), c.rank() == 2 ? 4 : 8, DType::kF32);
  });
  for (const std::string& e : errors)
    EXPECT_NE(e.find("different collectives: rank 0 all_gather(count 8, f32), rank 1 "
                     "all_gather(count 8, f32), rank 2 all_gather(count 4, f32)"),
              std::string::npos)
        << e;
  // The group still works after a rejected call.
  const auto again = run_ranks(group, [&](Communicator& c) { c.barrier(); });
  for (const std::string& e : again) EXPECT_EQ(e, "");
}

TEST(LocalComm, AMissingRankTimesOutInsteadOfHanging) {
  auto group = make_local_group(2, std::chrono::milliseconds(200));
  std::string error;
  std::thread t([&] {
    try {
      group[0]->barrier();
    } catch (const dsv41rt::Error& e) {
      error = e.what();
    }
  });
  t.join();  // rank 1 never arrives
  EXPECT_NE(error.find("1 of 2 ranks did not arrive within 200 ms"), std::string::npos) << error;
  EXPECT_THROW(group[1]->barrier(), dsv41rt::Error);  // the group is failed for everyone
}

TEST(LocalComm, BroadcastFromEveryRoot) {
  for (int n = 1; n <= 4; ++n) {
    for (int root = 0; root < n; ++root) {
      auto group = make_local_group(n);
      std::vector<std::vector<int64_t>> bufs(static_cast<size_t>(n));
      const auto errors = run_ranks(group, [&](Communicator& c) {
        std::vector<int64_t>& b = bufs[size_t(c.rank())];
        b = {100 * c.rank() + 1, 100 * c.rank() + 2, 100 * c.rank() + 3};
        c.broadcast(b.data(), b.size(), DType::kI64, root);
      });
      for (int r = 0; r < n; ++r) {
        EXPECT_EQ(errors[size_t(r)], "");
        EXPECT_EQ(bufs[size_t(r)],
                  (std::vector<int64_t>{100 * root + 1, 100 * root + 2, 100 * root + 3}))
            << "n " << n << " root " << root << " rank " << r;
      }
    }
  }
  auto group = make_local_group(2);
  const auto errors = run_ranks(group, [&](Communicator& c) {
    int64_t v = 0;
    c.broadcast(&v, 1, DType::kI64, c.rank());  // each rank names itself: a mismatch
  });
  EXPECT_NE(errors[0].find("different collectives"), std::string::npos) << errors[0];
  EXPECT_NE(errors[1].find("different collectives"), std::string::npos) << errors[1];
}

TEST(LocalComm, AbortWakesWaitingRanksAtOnce) {
  // Rank 1 never calls the collective; a driver aborts the group after 50 ms instead: rank 0
  // fails with the reason long before the (60 s) timeout, and the group stays failed.
  auto group = make_local_group(2, std::chrono::seconds(60));
  const auto t0 = std::chrono::steady_clock::now();
  std::thread aborter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    group[1]->abort("rank 1 failed: test");
  });
  float send = 1.0f, recv[2] = {0.0f, 0.0f};
  try {
    group[0]->all_gather(&send, recv, 1, DType::kF32);
    ADD_FAILURE() << "all_gather returned on an aborted group";
  } catch (const dsv41rt::Error& e) {
    EXPECT_NE(std::string(e.what()).find("aborted: rank 1 failed: test"), std::string::npos)
        << e.what();
  }
  aborter.join();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  EXPECT_THROW(group[0]->barrier(), dsv41rt::Error);
}

TEST(LocalComm, BadArguments) {
  EXPECT_THROW(make_local_group(0), dsv41rt::Error);
  auto group = make_local_group(1);
  EXPECT_THROW(group[0]->all_gather(nullptr, nullptr, 4, DType::kF32), dsv41rt::Error);
  uint8_t a = 1, b = 0;
  EXPECT_THROW(group[0]->all_reduce(&a, &b, 1, DType::kU8, ReduceOp::kSum), dsv41rt::Error);
}
