#include "runtime/model/cuda_graph_edges.h"

#include <cstring>
#include <map>
#include <vector>

#include "runtime/model/cuda_resources.h"

namespace dsv41rt::model {
namespace {

// Whether a graph node is a kernel of this library (every one starts with kc::pdl_entry()):
// cudaFuncGetName gives the mangled name of a runtime-launched kernel. Anything else (NCCL's
// kernels, copies, memsets) is not.
bool library_kernel(cudaGraphNode_t node) {
  cudaGraphNodeType type{};
  if (cudaGraphNodeGetType(node, &type) != cudaSuccess || type != cudaGraphNodeTypeKernel) {
    return false;
  }
  cudaKernelNodeParams params{};
  const char* name = nullptr;
  const bool ok = cudaGraphKernelNodeGetParams(node, &params) == cudaSuccess && params.func &&
                  cudaFuncGetName(&name, params.func) == cudaSuccess && name;
  cudaGetLastError();  // a node the runtime cannot name is simply not ours
  return ok && (std::strstr(name, "7dsv41rt7kernels4cuda") ||
                std::strstr(name, "dsv41rt::kernels::cuda"));
}

}  // namespace

// Makes the graph's kernel -> kernel edges between this library's kernels programmatic: the
// downstream grid may be scheduled as the upstream's blocks finish (they trigger at their start)
// and waits at its first statement for the upstream's completion and memory, so the results are
// those of plain stream order and only the launch gap shrinks. Returns the edges changed.
int64_t make_kernel_edges_programmatic(cudaGraph_t graph) {
  size_t n = 0;
  DSV41RT_CU(cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &n));
  if (n == 0) return 0;
  std::vector<cudaGraphNode_t> from(n), to(n);
  std::vector<cudaGraphEdgeData> data(n);
  DSV41RT_CU(cudaGraphGetEdges(graph, from.data(), to.data(), data.data(), &n));
  std::map<cudaGraphNode_t, bool> ours;
  auto is_ours = [&ours](cudaGraphNode_t node) {
    auto it = ours.find(node);
    return it != ours.end() ? it->second : (ours[node] = library_kernel(node));
  };
  std::vector<cudaGraphNode_t> f, t;
  for (size_t i = 0; i < n; ++i) {
    if (data[i].type == cudaGraphDependencyTypeDefault && data[i].from_port == 0 &&
        is_ours(from[i]) && is_ours(to[i])) {
      f.push_back(from[i]), t.push_back(to[i]);
    }
  }
  if (f.empty()) return 0;
  std::vector<cudaGraphEdgeData> plain(f.size()), programmatic(f.size());
  for (cudaGraphEdgeData& e : programmatic) {
    e.from_port = cudaGraphKernelNodePortProgrammatic;
    e.type = cudaGraphDependencyTypeProgrammatic;
  }
  DSV41RT_CU(cudaGraphRemoveDependencies(graph, f.data(), t.data(), plain.data(), f.size()));
  DSV41RT_CU(cudaGraphAddDependencies(graph, f.data(), t.data(), programmatic.data(), f.size()));
  return int64_t(f.size());
}

}  // namespace dsv41rt::model
