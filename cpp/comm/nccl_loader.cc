#include "comm/nccl_loader.h"

#include <dlfcn.h>
#include <sys/stat.h>

#include <cstdlib>
#include <mutex>
#include <string_view>
#include <type_traits>
#include <vector>

#include "comm/nccl_comm.h"
#include "core/status.h"

#ifndef DSV41RT_NCCL_BUILD_LIBDIR
#define DSV41RT_NCCL_BUILD_LIBDIR ""
#endif

namespace dsv41rt::comm {
namespace {

constexpr const char* kSoname = "libnccl.so.2";

bool is_file(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string dirname(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

std::string version_string(int code) {
  // NCCL_VERSION(X,Y,Z): X*1000+Y*100+Z up to 2.8, X*10000+Y*100+Z from 2.9 on.
  const bool wide = code >= 10000;
  const int major = wide ? code / 10000 : code / 1000;
  const int minor = wide ? code % 10000 / 100 : code % 1000 / 100;
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(code % 100);
}

// Directory of the shared object this code lives in (the Python extension or libdsv41rt.so): an
// installed wheel's site-packages is its parent, where pip puts the nvidia-nccl-cu13 package.
std::string own_library_dir() {
  Dl_info info;
  if (::dladdr(reinterpret_cast<const void*>(&own_library_dir), &info) == 0 || !info.dli_fname) {
    return "";
  }
  return dirname(info.dli_fname);
}

// The candidate files of steps 3-5 (see nccl_loader.h), in order, existing files only.
std::vector<std::string> candidate_files(std::string* searched) {
  std::vector<std::string> dirs;
  if (const char* env = std::getenv("DSV41RT_NCCL_SEARCH_PATH")) {
    std::string_view rest(env);
    while (!rest.empty()) {
      const size_t colon = rest.find(':');
      const std::string_view dir = rest.substr(0, colon);
      if (!dir.empty()) {
        dirs.emplace_back(dir);
        dirs.emplace_back(std::string(dir) + "/lib");
      }
      rest = colon == std::string_view::npos ? "" : rest.substr(colon + 1);
    }
  }
  const std::string own = own_library_dir();
  if (!own.empty()) dirs.push_back(dirname(own) + "/nvidia/nccl/lib");
  if (*DSV41RT_NCCL_BUILD_LIBDIR) dirs.emplace_back(DSV41RT_NCCL_BUILD_LIBDIR);
  std::vector<std::string> files;
  for (const std::string& dir : dirs) {
    const std::string file = dir + "/" + kSoname;
    if (is_file(file)) files.push_back(file);
    *searched += (searched->empty() ? "" : ", ") + dir;
  }
  return files;
}

// Fills every entry point from `handle`; returns "" or the name of a missing required symbol.
std::string resolve(void* handle, NcclApi* api) {
  std::string missing;
  auto sym = [&](auto& slot, const char* name, bool required = true) {
    slot = reinterpret_cast<std::remove_reference_t<decltype(slot)>>(::dlsym(handle, name));
    if (!slot && required && missing.empty()) missing = name;
  };
  sym(api->get_version, "ncclGetVersion");
  sym(api->get_unique_id, "ncclGetUniqueId");
  sym(api->comm_init_rank, "ncclCommInitRank");
  sym(api->comm_init_all, "ncclCommInitAll");
  sym(api->comm_destroy, "ncclCommDestroy");
  sym(api->comm_abort, "ncclCommAbort");
  sym(api->comm_get_async_error, "ncclCommGetAsyncError");
  sym(api->get_error_string, "ncclGetErrorString");
  sym(api->get_last_error, "ncclGetLastError", /*required=*/false);
  sym(api->all_gather, "ncclAllGather");
  sym(api->broadcast, "ncclBroadcast");
  sym(api->reduce_scatter, "ncclReduceScatter");
  sym(api->all_reduce, "ncclAllReduce");
  sym(api->send, "ncclSend");
  sym(api->recv, "ncclRecv");
  sym(api->group_start, "ncclGroupStart");
  sym(api->group_end, "ncclGroupEnd");
  return missing;
}

// dlopen + resolve one candidate; on failure appends "<name> (<why>)" to `tried`.
bool try_load(const std::string& name, int extra_flags, NcclApi* api, std::string* tried) {
  ::dlerror();
  void* handle = ::dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL | extra_flags);
  std::string why;
  if (!handle) {
    if (extra_flags & RTLD_NOLOAD) return false;  // simply not loaded yet: not worth reporting
    const char* err = ::dlerror();
    why = err ? err : "dlopen failed";
  } else if (const std::string missing = resolve(handle, api); !missing.empty()) {
    why = "no symbol " + missing + ": not an NCCL 2.x library";
  } else if (api->get_version(&api->version) != ncclSuccess || api->version < 2700) {
    why = "NCCL " + version_string(api->version) + " is too old (need >= 2.7 for send/recv)";
  }
  if (why.empty()) {
    // The handle is never closed: NCCL keeps threads and atexit hooks for the process lifetime.
    Dl_info info;
    api->path = ::dladdr(reinterpret_cast<const void*>(api->get_version), &info) && info.dli_fname
                    ? info.dli_fname
                    : name;
    return true;
  }
  if (handle) ::dlclose(handle);
  *tried += (tried->empty() ? "" : "; ") + name + " (" + why + ")";
  return false;
}

NcclApi load_or_throw() {
  NcclApi api{};
  std::string tried;
  if (const char* explicit_path = std::getenv("DSV41RT_NCCL_LIBRARY");
      explicit_path && *explicit_path) {
    if (try_load(explicit_path, 0, &api, &tried)) return api;
    DSV41RT_THROW_CODE(kUnsupported, "NCCL not available: DSV41RT_NCCL_LIBRARY=", explicit_path,
                       " does not load: ", tried,
                       " (pip install nvidia-nccl-cu13 or set DSV41RT_NCCL_LIBRARY)");
  }
  if (try_load(kSoname, RTLD_NOLOAD, &api, &tried)) return api;
  std::string searched;
  for (const std::string& file : candidate_files(&searched)) {
    if (try_load(file, 0, &api, &tried)) return api;
  }
  if (try_load(kSoname, 0, &api, &tried)) return api;
  DSV41RT_THROW_CODE(kUnsupported, "NCCL not available: no loadable ", kSoname, " (searched ",
                     searched.empty() ? "no package directories" : searched,
                     ", then the system library path; tried: ", tried,
                     ") (pip install nvidia-nccl-cu13 or set DSV41RT_NCCL_LIBRARY)");
}

}  // namespace

const NcclApi& nccl_api() {
  static std::mutex mu;
  static NcclApi api;
  static bool loaded = false;
  std::lock_guard<std::mutex> lock(mu);
  if (!loaded) {
    api = load_or_throw();
    loaded = true;
  }
  return api;
}

std::string nccl_error_text(const NcclApi& api, ncclResult_t result, const char* what) {
  std::string text = std::string(what) + ": " + api.get_error_string(result);
  // The last-error text is per thread and names the actual cause ("invalid device pointer ...").
  if (api.get_last_error) {
    const char* last = api.get_last_error(nullptr);
    if (last && *last) text += std::string(" (") + last + ")";
  }
  return text;
}

bool nccl_available() noexcept {
  try {
    nccl_api();
    return true;
  } catch (...) {
    return false;
  }
}

std::string nccl_library_info() {
  const NcclApi& api = nccl_api();
  return "NCCL " + version_string(api.version) + " (" + api.path + ")";
}

}  // namespace dsv41rt::comm
