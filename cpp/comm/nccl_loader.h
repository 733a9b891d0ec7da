// NCCL resolved at run time: libdsv41rt never links libnccl, so the package imports (and its CPU
// paths run) on machines without NCCL, and one build works with whichever NCCL 2.x the host has
// (usually the nvidia-nccl-cu13 wheel that torch already pulls in). Only NcclComm uses this.
//
// Where libnccl.so.2 is looked for, first hit wins:
//   1. $DSV41RT_NCCL_LIBRARY, a full path. When set it is the only candidate: a user who names a
//      library must not silently get another one.
//   2. A libnccl.so.2 already loaded in the process (torch's, say): a second copy would cost
//      ~350 MB and two NCCL runtimes in one process.
//   3. Each directory of $DSV41RT_NCCL_SEARCH_PATH (':'-separated; dsv41rt.comm sets it from the
//      nvidia.nccl package), as DIR/libnccl.so.2 or DIR/lib/libnccl.so.2.
//   4. nvidia/nccl/lib beside the dsv41rt package (site-packages of the installed wheel).
//   5. The nvidia/nccl/lib directory the build found nccl.h in.
//   6. Plain dlopen("libnccl.so.2"): LD_LIBRARY_PATH, the system's ldconfig cache.
#pragma once

#include <nccl.h>

#include <string>

namespace dsv41rt::comm {

struct NcclApi {
  decltype(&::ncclGetVersion) get_version;
  decltype(&::ncclGetUniqueId) get_unique_id;
  decltype(&::ncclCommInitRank) comm_init_rank;
  decltype(&::ncclCommInitAll) comm_init_all;
  decltype(&::ncclCommDestroy) comm_destroy;
  decltype(&::ncclCommAbort) comm_abort;
  decltype(&::ncclCommGetAsyncError) comm_get_async_error;
  decltype(&::ncclGetErrorString) get_error_string;
  decltype(&::ncclGetLastError) get_last_error;  // optional (NCCL >= 2.13): may be null
  decltype(&::ncclAllGather) all_gather;
  decltype(&::ncclReduceScatter) reduce_scatter;
  decltype(&::ncclAllReduce) all_reduce;
  decltype(&::ncclBroadcast) broadcast;
  decltype(&::ncclSend) send;
  decltype(&::ncclRecv) recv;
  decltype(&::ncclGroupStart) group_start;
  decltype(&::ncclGroupEnd) group_end;
  int version = 0;   // ncclGetVersion's code, e.g. 22703 for 2.27.3
  std::string path;  // the library that was loaded, for messages
};

/// The NCCL entry points, loading the library on the first successful call (thread-safe). Throws
/// Error(kUnsupported) "NCCL not available: ..." naming every place tried. A failure is not
/// cached, so setting DSV41RT_NCCL_LIBRARY afterwards and retrying works.
const NcclApi& nccl_api();

/// The message of an NCCL failure: "<what>: <ncclGetErrorString> (<ncclGetLastError>)".
std::string nccl_error_text(const NcclApi& api, ncclResult_t result, const char* what);

}  // namespace dsv41rt::comm
