// An Executor that answers the model / pool / workspace questions from another executor (the
// local rank's) and adds only what changes: the context-parallel drivers (cp_executor.cc,
// cp_remote.cc) build on it.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "runtime/model/executor.h"

namespace dsv41rt::model {

class DelegatingExecutor : public Executor {
 public:
  explicit DelegatingExecutor(Executor* inner) : inner_(inner) {}
  const ModelPlan& plan() const override { return inner_->plan(); }
  const StateLayout& layout() const override { return inner_->layout(); }
  model::KvPool& pool() override { return inner_->pool(); }
  const MemoryPlan& memory_plan() const override { return inner_->memory_plan(); }
  const Decisions& decisions() const override {
    return inner_->decisions();  // under CP: the local rank's query rows only
  }
  DequantWorkspaces& workspaces() override { return inner_->workspaces(); }
  BackendStats backend_stats() const override { return inner_->backend_stats(); }
  void set_switch(Switch which, bool on) override { inner_->set_switch(which, on); }
  std::string device() const override { return inner_->device(); }

 protected:
  Executor* inner_;
};

}  // namespace dsv41rt::model
