#include "runtime/model/decode_graphs.h"

namespace dsv41rt::model {

void DecodeGraphs::run(DecodeBucket bucket, const ForwardPlan& padded, ModelRunner& runner,
                       Backend& be, DequantWorkspaces& workspaces) {
  Graph& g = graphs_[bucket];
  if (valid(g, runner, workspaces, be)) {
    be.replay(*g.exec, runner.main());
    DequantCounters n = workspaces.counters();
    n.dequant_calls += g.delta.dequant_calls;
    n.reuse_hits += g.delta.reuse_hits;
    n.rows_dequantised += g.delta.rows_dequantised;
    workspaces.set_counters(n);
    ++replays_;
    return;
  }
  // The eager run sizes every buffer, so nothing moves while capturing.
  runner.run(padded);
  ++eager_;
  capture(g, padded, runner, be, workspaces);
}

// Records run(padded) as a graph. Nothing executes during capture, so the workspace counters the
// acquires moved are taken back and kept as the per-replay delta.
void DecodeGraphs::capture(Graph& g, const ForwardPlan& padded, ModelRunner& runner, Backend& be,
                           DequantWorkspaces& workspaces) {
  const DequantCounters before = workspaces.counters();
  const uint64_t generation = runner.generation();
  const uint64_t ws_generation = workspaces.storage_generation();
  const uint64_t backend_generation = be.workspace_generation();
  const uint8_t* meta_base = runner.meta_base();
  workspaces.begin_forward();
  runner.reset_forward_state();
  try {
    g.exec = be.capture(
        runner.main(), [&] { runner.run(padded); }, std::move(g.exec));
  } catch (...) {
    workspaces.set_counters(before);
    g.exec.reset();
    throw;
  }
  const DequantCounters after = workspaces.counters();
  workspaces.set_counters(before);
  g.delta = {after.dequant_calls - before.dequant_calls, after.reuse_hits - before.reuse_hits,
             after.rows_dequantised - before.rows_dequantised, 0};
  g.generation = generation;
  g.ws_generation = ws_generation;
  g.backend_generation = backend_generation;
  g.meta_base = meta_base;
  // A buffer that moved during capture (it cannot: the eager run before sized them) would leave
  // the graph pointing at freed memory; keep it only when nothing moved.
  if (!valid(g, runner, workspaces, be)) {
    g.exec.reset();
    return;
  }
  ++captures_;
}

}  // namespace dsv41rt::model
