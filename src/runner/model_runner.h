// runner/model_runner.h: owns a loaded model (checkpoint, op registry, Model) and runs the
// whole-sequence jobs of the CLI: teacher-forced logits and generation.
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "kernels/registry.h"
#include "model/local_cache.h"
#include "model/model.h"
#include "runner/sampler.h"

namespace k3::runner {

// The fused decode path's decision lines (fastpath::attach) as info lines of the log (core/log.h).
kernels::LogFn fastpath_log();

class ModelRunner {
 public:
  // Loads DIR (config.json + safetensors) and builds the model on options.device: the CPU
  // reference ops, or (CUDA builds) the CUDA ops with the weights copied to GPU 0. Each
  // logits()/generate() call runs one sequence in its own model::LocalCache.
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

  // Logits [T, vocab] for every position of `tokens`: the first `decode_from` tokens in one
  // prefill, the rest one at a time through the decode path (decode_from = T: all prefill).
  core::Tensor logits(std::span<const int32_t> tokens, int64_t decode_from) const;

  // Prefills the prompt, then samples up to max_tokens tokens (stopping after eos when the
  // config has one). on_token is called with each new id as soon as it exists.
  struct GenerateStats {
    double prefill_seconds = 0, decode_seconds = 0;
    int64_t prompt_tokens = 0, generated_tokens = 0;
  };
  std::vector<int32_t> generate(std::span<const int32_t> prompt, int64_t max_tokens, const SamplingParams& sampling,
                                const std::function<void(int32_t)>& on_token = nullptr,
                                GenerateStats* stats = nullptr) const;

  // --explain: generate() hands `sink` the plan of its prefill step and of its first decode step
  // (fastpath::explain_step: path and reason, every op with the implementation that ran).
  void set_explain(std::function<void(const std::string&)> sink);
  // Sees every op call from now on (tests that prove which kernels ran); nullptr: none.
  void set_op_recorder(kernels::OpRecorder* recorder) { registry_.set_recorder(recorder); }
  // bench/op_tuner.h: every op call with several capable implementations times them all first.
  void set_op_tuner(kernels::OpTuner* tuner) { registry_.set_tuner(tuner); }

 private:
  void check_ids(std::span<const int32_t> tokens) const;
  model::LocalCache new_cache(int64_t max_tokens) const;
  // The model's forward, explained to explain_ when it is set.
  core::Tensor explained_forward(model::LocalCache& cache, const model::SequenceInput& in,
                                 const std::string& what) const;
  checkpoint::LoadedModel loaded_;
  model::KvCacheDtype kv_cache_;
  kernels::Registry registry_;
  std::shared_ptr<core::DeviceMemory> memory_;
  model::Weights device_weights_;  // loaded_.weights on the model's device (shared on the CPU)
  std::unique_ptr<model::Model> model_;
  std::function<void(const std::string&)> explain_;
  mutable kernels::OpRecorder recorder_;
};

}  // namespace k3::runner
