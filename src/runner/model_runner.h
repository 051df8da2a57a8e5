// runner/model_runner.h: owns a loaded model (checkpoint, op registry, Model) on one device. Its
// whole-sequence jobs (generation, teacher-forced logits) run through an engine
// (engine/one_shot.h); serving builds its own (server/serving_model.h).
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "kernels/registry.h"
#include "model/model.h"
#include "runner/sampler.h"

namespace k3::runner {

class ModelRunner {
 public:
  // Loads DIR (config.json + safetensors) and builds the model on options.device: the CPU
  // reference ops, or (CUDA builds) the CUDA ops with the weights copied to GPU 0.
  // `progress` (optional) sees the weights being read in (checkpoint::LoadProgressFn).
  static std::unique_ptr<ModelRunner> open(const std::filesystem::path& dir, const model::ModelOptions& options,
                                           model::KvCacheDtype kv_cache = model::KvCacheDtype::bf16,
                                           const checkpoint::LoadProgressFn& progress = nullptr);
  ModelRunner(checkpoint::LoadedModel loaded, const model::ModelOptions& options, model::KvCacheDtype kv_cache);

  const config::K3Config& config() const { return loaded_.config; }
  // The checkpoint's weights on the host (mmap'd) and the op registry: what a CPU draft model
  // that aliases the target's embedding needs (draft/dspark_drafter.h).
  const model::Weights& host_weights() const { return loaded_.weights; }
  const kernels::Registry& registry() const { return registry_; }
  const model::Model& model() const { return *model_; }
  model::KvCacheDtype kv_cache() const { return kv_cache_; }  // what executors over the model store

  // Sees every op call from now on (tests that prove which kernels ran); nullptr: none.
  void set_op_recorder(kernels::OpRecorder* recorder) { registry_.set_recorder(recorder); }
  // bench/op_tuner.h: every op call with several capable implementations times them all first.
  void set_op_tuner(kernels::OpTuner* tuner) { registry_.set_tuner(tuner); }

 private:
  checkpoint::LoadedModel loaded_;
  model::KvCacheDtype kv_cache_;
  kernels::Registry registry_;
  std::shared_ptr<core::DeviceMemory> memory_;
  model::Weights device_weights_;  // loaded_.weights on the model's device (shared on the CPU)
  std::unique_ptr<model::Model> model_;
};

}  // namespace k3::runner
