// server/serving_model.cpp: loading a model folder for serving.
#include "server/serving_model.h"

#include "checkpoint/checkpoint.h"
#include "core/error.h"
#include "draft/dspark_drafter.h"
#include "draft/eagle3_drafter.h"
#include "engine/model_executor.h"
#include "engine/tp_executor.h"

namespace k3::server {

std::unique_ptr<ServingModel> ServingModel::load(const ServingOptions& o) {
  auto s = std::unique_ptr<ServingModel>(new ServingModel());
  if (!std::filesystem::exists(o.model_dir / "config.json"))
    throw core::Error("no model at " + o.model_dir.string() +
                      " (config.json is missing); scripts/setup.sh writes the bundled one, or run "
                      "k3serve make-checkpoint --config k3-tiny --seed 0 --out " +
                      o.model_dir.string());
  if (!std::filesystem::exists(o.model_dir / "tiktoken.model"))
    throw core::Error("model folder " + o.model_dir.string() +
                      " has no tokenizer (tiktoken.model + tokenizer_config.json); serving needs one "
                      "(make-checkpoint writes one for configs with vocab_size >= 512)");
  s->tokenizer_ = std::make_unique<tokenizer::Tokenizer>(tokenizer::Tokenizer::load_k3(o.model_dir));
  K3_CHECK(o.tp >= 1, "--tp must be >= 1, got " + std::to_string(o.tp));
  K3_CHECK(!o.speculative.needs_draft_model() || !o.draft_model_dir.empty(),
           std::string("--speculative-method ") + spec::to_string(o.speculative.method) +
               " needs --speculative-model DIR (a draft checkpoint: k3serve make-checkpoint --draft-for TARGET "
               "[--draft-kind eagle3] writes one)");
  if (o.tp == 1) s->runner_ = runner::ModelRunner::open(o.model_dir, o.model, o.kv_cache, o.load_progress);
  else s->tp_runner_ = runner::TpRunner::open(o.model_dir, o.tp, o.model, o.kv_cache, o.load_progress);
  const config::K3Config& config = s->config();
  // What one rank's storage holds (KDA heads split, MLA latent replicated): the cache is sized per GPU.
  const config::K3Config& rank_config = s->runner_ ? config : s->tp_runner_->rank_config();

  engine::EngineConfig ec;
  ec.scheduler.max_num_seqs = o.max_num_seqs;
  ec.scheduler.max_num_batched_tokens = o.max_num_batched_tokens;
  ec.scheduler.max_partial_prefills = o.max_partial_prefills;
  ec.scheduler.max_long_partial_prefills = o.max_long_partial_prefills;
  ec.scheduler.long_prefill_token_threshold = o.long_prefill_token_threshold;
  ec.scheduler.max_model_len = o.max_model_len;
  cache::CacheConfig base;
  // Decode context parallelism: a scheduler block is o.block_size tokens on each of dcp ranks, so
  // the same bytes hold dcp times the tokens (engine/model_executor.h).
  const int dcp = o.model.dcp;
  base.block_size = o.block_size * dcp;
  base.num_slots = o.max_num_seqs;
  base.enable_prefix_cache = o.enable_prefix_cache;
  // Prefill chunks start on KDA chunk boundaries; checkpoints must fall on them too.
  const int32_t kda_chunk = std::max(config.kda.chunk_size, 1);
  const int32_t align = (kda_chunk + base.block_size - 1) / base.block_size * base.block_size;
  base.checkpoint_interval_blocks = align / base.block_size;
  ec.cache = engine::size_model_cache(rank_config, o.kv_cache, base, o.kv_cache_bytes,
                                      o.enable_prefix_cache ? 0.2 : 0.0, o.max_model_len, dcp);
  // eos: the config's eos_token_id (K3's and k3-tiny's name "<|end_of_msg|>").
  engine::apply_model_defaults(config, ec.scheduler, ec.cache, &ec.eos_token_id);
  ec.speculative = o.speculative;
  ec.shadow_validate_rate = o.shadow_validate_rate;
  std::unique_ptr<engine::Executor> executor;
  if (s->runner_)
    executor = std::make_unique<engine::ModelExecutor>(s->runner_->model(), ec.cache, o.kv_cache,
                                                       ec.scheduler.max_model_len);
  else
    executor = std::make_unique<engine::TpExecutor>(*s->tp_runner_, ec.cache, o.kv_cache, ec.scheduler.max_model_len);
  std::unique_ptr<spec::Drafter> drafter;  // null: made from ec.speculative (ngram, synthetic) or none
  if (o.speculative.needs_draft_model()) {
    // At TP 1 the draft shares the runner's host weights and registry and runs where the target
    // runs (its GPU: weights uploaded once, taps read in place); with --tp the ranks hold shards, so
    // the draft gets the full weights and its own CPU registry, replicated on the host, and reads
    // rank 0's taps.
    const model::Weights* target_weights = nullptr;
    const kernels::Registry* ops = nullptr;
    if (s->runner_) {
      target_weights = &s->runner_->host_weights();
      ops = &s->runner_->registry();
    } else {
      s->draft_target_weights_ = std::make_unique<model::Weights>(checkpoint::load_weights(o.model_dir, config));
      s->draft_ops_ = std::make_unique<kernels::Registry>();
      kernels::register_reference_ops(*s->draft_ops_);
      target_weights = s->draft_target_weights_.get();
      ops = s->draft_ops_.get();
    }
    if (o.speculative.method == spec::SpecMethod::dspark && s->runner_) {
      const model::Model& m = s->runner_->model();
      draft::DraftOptions draft_options;
      draft_options.absorbed_attention = m.memory()->device() != core::Device::cpu;  // the GPU's only form
      drafter = draft::load_dspark_drafter(o.draft_model_dir, config, *target_weights, *ops, draft_options, {},
                                           m.memory(), &m.weights());
    } else if (o.speculative.method == spec::SpecMethod::dspark) {
      drafter = draft::load_dspark_drafter(o.draft_model_dir, config, *target_weights, *ops);
    } else if (s->runner_) {  // EAGLE-3 runs where the target runs (its GPU at --tp 1), taps in place
      const model::Model& m = s->runner_->model();
      drafter = draft::load_eagle3_drafter(o.draft_model_dir, config, *target_weights, *ops, {}, {}, m.memory(),
                                           m.weights().embed);
    } else {
      drafter = draft::load_eagle3_drafter(o.draft_model_dir, config, *target_weights, *ops);
    }
  }
  s->engine_ = std::make_unique<engine::Engine>(ec, std::move(executor), std::move(drafter));

  s->description_ =
      "model: " + o.model_dir.string() + " (vocab " + std::to_string(config.vocab_size) + ", " +
      std::to_string(config.num_hidden_layers) + " layers" +
      (o.tp > 1 ? ", tensor parallel over " + std::to_string(o.tp) + " ranks" : std::string()) +
      (o.model.expert_parallel ? ", expert parallel: each rank holds " + std::to_string(config.moe.num_experts / o.tp) +
                                     " of the " + std::to_string(config.moe.num_experts) + " routed experts, whole"
                               : std::string()) +
      (dcp > 1 ? ", decode context parallel: each rank holds 1/" + std::to_string(dcp) + " of every MLA cache"
               : std::string()) +
      ")\n" + "tokenizer: " + std::to_string(s->tokenizer_->num_ranks()) + " ranks, " +
      std::to_string(s->tokenizer_->specials().size()) + " special tokens, eos id " + std::to_string(ec.eos_token_id) +
      "\n" + "scheduler: " + scheduler::describe(ec.scheduler) + "\n" + "cache: " + cache::describe(ec.cache) + "\n" +
      "speculative: " + spec::describe(ec.speculative) + "\n";
  return s;
}

}  // namespace k3::server
