// LocalComm: N virtual ranks inside one process, one thread per rank, on host memory: the test
// double that lets context-parallel logic run (and be checked against one rank) without several
// GPUs. Each collective is two rendezvous: every rank publishes its buffers, then each computes
// its own output from the others' inputs, then all wait again so no input is overwritten early.
#pragma once

#include <chrono>
#include <memory>
#include <vector>

#include "comm/communicator.h"

namespace dsv41rt::comm {

/// `size` communicators of one group (give one to each rank's thread). A rank that has not
/// arrived at a collective within `timeout` fails it on every rank with an Error naming it.
DSV41RT_API std::vector<std::unique_ptr<Communicator>> make_local_group(
    int size, std::chrono::milliseconds timeout = std::chrono::seconds(60));

}  // namespace dsv41rt::comm
