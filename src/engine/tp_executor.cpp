// engine/tp_executor.cpp: TpExecutor.
#include "engine/tp_executor.h"

#include "runner/tp_runner.h"

namespace k3::engine {

TpExecutor::TpExecutor(const runner::TpRunner& runner, const cache::CacheConfig& cache, model::KvCacheDtype kv_dtype,
                       int64_t graph_max_model_len)
    : runner_(runner), ranks_(static_cast<size_t>(runner.tp())) {
  K3_CHECK(runner.kv_cache() == kv_dtype, "TpExecutor: the runner's ranks were opened for another KV cache dtype");
  runner_.run([&](int r, const model::Model& m, comm::Communicator&) {
    ranks_[static_cast<size_t>(r)] = std::make_unique<ModelExecutor>(m, cache, kv_dtype, graph_max_model_len);
  });
}

int32_t TpExecutor::vocab_size() const { return runner_.config().vocab_size; }

TpExecutor::~TpExecutor() {
  // Each rank's storage and graphs are freed on its own device.
  try {
    runner_.run([&](int r, const model::Model&, comm::Communicator&) { ranks_[static_cast<size_t>(r)].reset(); });
  } catch (...) {  // a destructor must not throw; the memory goes with the process
  }
}

core::Tensor TpExecutor::execute(const StepPlan& plan, core::LogitsAt at) {
  K3_CHECK(at == core::LogitsAt::host, "TpExecutor: the logits of a tensor-parallel step come to the host");
  core::Tensor logits;
  runner_.run([&](int r, const model::Model&, comm::Communicator&) {
    core::Tensor mine = ranks_[static_cast<size_t>(r)]->execute(plan, at);
    if (r == 0) logits = std::move(mine);
  });
  return logits;
}

void TpExecutor::release(scheduler::RequestId id) {
  for (auto& e : ranks_) e->release(id);  // host-side state only
}

void TpExecutor::commit_verified(std::span<const int32_t> accepted_rows) {
  runner_.run([&](int r, const model::Model&, comm::Communicator&) {
    ranks_[static_cast<size_t>(r)]->commit_verified(accepted_rows);
  });
}

void TpExecutor::set_hidden_tap(std::span<const int32_t> layers) {
  for (auto& e : ranks_) e->set_hidden_tap(layers);
}

}  // namespace k3::engine
