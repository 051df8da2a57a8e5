// cli/model_options.h: the options shared by the commands that run a model.
#pragma once
#include <vector>

#include "checkpoint/checkpoint.h"
#include "cli/args.h"
#include "model/kv_storage.h"
#include "model/layers/context.h"
#include "spec/spec_config.h"

namespace k3::cli {

inline constexpr const char* kDefaultModelDir = "models/k3-code-15m";  // bundled (train/README.md)

// --model, --precision, --kv-cache, --kda-prefill, --device, --decode-backend
std::vector<OptionSpec> model_option_specs();
model::ModelOptions parse_model_options(const Args& args);
model::KvCacheDtype parse_kv_cache(const Args& args);
// --tp N (logits and generate): tensor-parallel ranks as CPU threads (runner/tp_runner.h); 1 = off.
OptionSpec tp_option_spec();
int parse_tp(const Args& args);  // >= 1; throws naming --tp otherwise
// --enable-expert-parallel (vLLM's name; with --tp N > 1): each rank holds whole routed experts,
// E / N of them (config/shard.h), instead of a slice of every expert. parse_expert_parallel sets
// options.expert_parallel and throws naming the flag when it comes with --tp 1.
OptionSpec expert_parallel_option_spec();
void parse_expert_parallel(const Args& args, int tp, model::ModelOptions& options);

// --speculative-method none|ngram|synthetic, --num-speculative-tokens K,
// --synthetic-acceptance-length AL (synthetic: forced acceptance, benchmarks only),
// --ngram-min / --ngram-max, --no-adaptive-draft-length.
std::vector<OptionSpec> speculative_option_specs();
spec::SpeculativeConfig parse_speculative(const Args& args);  // validated; throws naming the flag

// Prints checkpoint::LoadProgressLog lines for loading `what` to stderr ("loading DIR: 45%
// 12.3/27.0 MB 410 MB/s" at most every 0.5 s, then "loaded DIR: ... in T s"). serve always
// shows them; generate and logits only on a terminal (their stderr is often captured with
// their output, whose first line is the result).
checkpoint::LoadProgressFn load_progress_to_stderr(const std::string& what);
checkpoint::LoadProgressFn load_progress_on_terminal(const std::string& what);

}  // namespace k3::cli
