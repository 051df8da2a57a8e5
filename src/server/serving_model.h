// server/serving_model.h: what `k3serve serve` runs: a model folder (config.json +
// safetensors + tiktoken.model / tokenizer_config.json) loaded as a ModelRunner, its tokenizer,
// and an Engine over a ModelExecutor with caches sized from a byte budget. Tests build the
// same thing over the bundled tiny model.
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "engine/engine.h"
#include "kernels/registry.h"
#include "model/kv_storage.h"
#include "model/layers/context.h"
#include "model/weights.h"
#include "runner/model_runner.h"
#include "runner/tp_runner.h"
#include "scheduler/scheduler_config.h"
#include "tokenizer/tokenizer.h"

namespace k3::server {

struct ServingOptions {
  std::filesystem::path model_dir;
  model::ModelOptions model;
  model::KvCacheDtype kv_cache = model::KvCacheDtype::bf16;
  int64_t max_model_len = 65536;  // prompt + completion tokens of one request
  int32_t max_num_seqs = 64;      // requests running at once (= KDA state slots)
  int32_t max_num_batched_tokens = 2048;
  // Chunked prefill (scheduler/scheduler_config.h says what each does).
  int32_t max_partial_prefills = scheduler::SchedulerConfig{}.max_partial_prefills;
  int32_t max_long_partial_prefills = scheduler::SchedulerConfig{}.max_long_partial_prefills;
  int32_t long_prefill_token_threshold = scheduler::SchedulerConfig{}.long_prefill_token_threshold;
  int32_t block_size = 16;               // tokens per MLA page (a scheduler block: block_size * model.dcp tokens)
  int64_t kv_cache_bytes = 256ll << 20;  // MLA pages + KDA slots + prefix checkpoints
  bool enable_prefix_cache = true;
  int tp = 1;  // tensor-parallel ranks (runner::TpRunner; with model.device cuda: GPUs 0..tp-1)
  spec::SpeculativeConfig speculative;
  double shadow_validate_rate = 0;           // engine::EngineConfig::shadow_validate_rate
  std::filesystem::path draft_model_dir;     // speculative.method dspark: the draft checkpoint folder
  checkpoint::LoadProgressFn load_progress;  // optional: sees the weights being read in
};

class ServingModel {
 public:
  // Loads everything and starts nothing. Throws core::Error naming what is missing or wrong
  // (no tokenizer files, a budget too small for one max_model_len request, ...).
  static std::unique_ptr<ServingModel> load(const ServingOptions& options);

  engine::Engine& engine() { return *engine_; }
  const tokenizer::Tokenizer& tokenizer() const { return *tokenizer_; }
  const config::K3Config& config() const { return runner_ ? runner_->config() : tp_runner_->config(); }
  // The resolved settings, one per line, printed at start-up.
  const std::string& description() const { return description_; }

 private:
  std::unique_ptr<runner::ModelRunner> runner_;  // tp == 1
  std::unique_ptr<runner::TpRunner> tp_runner_;  // tp > 1
  std::unique_ptr<tokenizer::Tokenizer> tokenizer_;
  // tp > 1 with a DSpark drafter: the whole target's weights mapped from the checkpoint (the draft
  // aliases their embedding and lm_head; only those pages are read) and the CPU ops it runs on.
  // Declared before engine_, which holds the drafter: they outlive it.
  std::unique_ptr<model::Weights> draft_target_weights_;
  std::unique_ptr<kernels::Registry> draft_ops_;
  std::unique_ptr<engine::Engine> engine_;
  std::string description_;
};

}  // namespace k3::server
