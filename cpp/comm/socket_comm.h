// SocketComm: ranks in separate processes (or machines) over TCP, host memory. Rank 0 is the
// hub: it listens on `address` ("host:port"), every other rank connects to it. Each collective
// sends every rank's input to the hub, which checks that all ranks made the same call, computes
// each rank's output (rank-ordered reductions: bitwise the same on every rank) and sends it back.
// Not fast: it exists so that the one-process-per-rank context-parallel mode (leader + worker
// processes) runs, and is tested, on machines without GPUs. Timeouts and a closed peer fail the
// collective with an Error naming the rank, never hang.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "comm/communicator.h"

namespace dsv41rt::comm {

/// Rank `rank` of a `size`-rank group whose rank 0 listens on `address` ("host:port"). Returns
/// once every rank has connected (rank 0) or this rank is connected (others), within `timeout`.
DSV41RT_API std::unique_ptr<Communicator> make_socket_comm(
    const std::string& address, int rank, int size,
    std::chrono::milliseconds timeout = std::chrono::seconds(120));

}  // namespace dsv41rt::comm
