// cli/model_options.cpp: model option parsing.
#include "cli/model_options.h"

#include <unistd.h>

#include <memory>

#include "config/shard.h"
#include "core/error.h"
#include "core/log.h"

namespace k3::cli {

std::vector<OptionSpec> model_option_specs() {
  return {
      {"model", "DIR", "checkpoint folder (config.json + safetensors)", kDefaultModelDir},
      {"precision", "bf16|fp32", "bf16: engine rounding points; fp32: exact math", "bf16"},
      {"kv-cache", "bf16|fp8", "MLA latent cache dtype", "bf16"},
      {"kda-prefill", "chunked|recurrent", "KDA algorithm for prefill steps", "chunked"},
      {"device", "cpu|cuda", "where the model runs (cuda: GPU 0, CUDA builds only)", "cpu"},
      {"decode-backend", "auto|latency_specialized",
       "auto: the standard path; latency_specialized: fused kernels for pure-decode steps of 1..64 rows "
       "(other steps fall back to the standard path, counted by reason)",
       "auto"},
  };
}

model::ModelOptions parse_model_options(const Args& args) {
  model::ModelOptions o;
  const std::string precision = args.get("precision");
  K3_CHECK(precision == "bf16" || precision == "fp32", "--precision must be bf16 or fp32, got '" + precision + "'");
  o.precision = precision == "bf16" ? kernels::Precision::bf16 : kernels::Precision::fp32;
  const std::string kda = args.get("kda-prefill");
  K3_CHECK(kda == "chunked" || kda == "recurrent", "--kda-prefill must be chunked or recurrent, got '" + kda + "'");
  o.kda_chunked_prefill = kda == "chunked";
  const std::string device = args.get("device");
  K3_CHECK(device == "cpu" || device == "cuda", "--device must be cpu or cuda, got '" + device + "'");
  o.device = device == "cuda" ? core::Device::cuda : core::Device::cpu;
  try {
    o.decode_backend = model::parse_decode_backend(args.get("decode-backend"));
  } catch (const core::Error& e) {
    throw core::Error(std::string("--decode-backend: ") + e.what());
  }
  return o;
}

model::KvCacheDtype parse_kv_cache(const Args& args) {
  const std::string kv = args.get("kv-cache");
  K3_CHECK(kv == "bf16" || kv == "fp8", "--kv-cache must be bf16 or fp8, got '" + kv + "'");
  return kv == "fp8" ? model::KvCacheDtype::fp8_e4m3 : model::KvCacheDtype::bf16;
}

OptionSpec tp_option_spec() {
  return {
      "tp", "N",
      "tensor-parallel ranks: CPU threads, or GPUs 0..N-1 with --device cuda (N must divide the heads, intermediates and vocab)",
      "1"};
}

int parse_tp(const Args& args) {
  const int64_t tp = args.get_int("tp");
  K3_CHECK(tp >= 1 && tp <= 64, "--tp must be in [1, 64], got " + std::to_string(tp));
  return static_cast<int>(tp);
}

OptionSpec expert_parallel_option_spec() {
  return {"enable-expert-parallel", "",
          "with --tp N > 1: each rank holds whole routed experts (E / N of them, N must divide E) instead of a "
          "slice of every expert; their partial sums share the MoE all-reduce",
          ""};
}

void parse_expert_parallel(const Args& args, int tp, model::ModelOptions& options) {
  options.expert_parallel = args.flag("enable-expert-parallel");
  config::check_expert_parallel(options.expert_parallel, tp);  // "... needs --tp > 1, got --tp 1"
}

checkpoint::LoadProgressFn load_progress_to_stderr(const std::string& what) {
  auto log = std::make_shared<checkpoint::LoadProgressLog>(what);
  return [log](const checkpoint::LoadProgress& p) {
    const std::string line = log->line(p);
    if (!line.empty()) log::info(line);
  };
}

checkpoint::LoadProgressFn load_progress_on_terminal(const std::string& what) {
  if (!::isatty(STDERR_FILENO)) return nullptr;
  return load_progress_to_stderr(what);
}

std::vector<OptionSpec> speculative_option_specs() {
  return {
      {"speculative-model", "DIR", "the draft checkpoint for --speculative-method dspark or eagle3", ""},
      {"speculative-method", "M",
       "speculative decoding: none, ngram (prompt lookup), dspark or eagle3 (draft models, --speculative-model) or synthetic (benchmarks: forced acceptance)",
       "none"},
      {"num-speculative-tokens", "K", "drafts verified per request per step (with a method)", "4"},
      {"synthetic-acceptance-length", "AL",
       "synthetic: tokens per verify step, 1..K+1 (0: K+1); outputs are NOT the "
       "model's distribution",
       "0"},
      {"ngram-min", "N", "ngram: shortest n-gram matched", "1"},
      {"ngram-max", "N", "ngram: longest n-gram matched", "4"},
      {"no-adaptive-draft-length", "", "always propose K drafts (default: adapt per request to its acceptance)", ""},
  };
}

spec::SpeculativeConfig parse_speculative(const Args& args) {
  spec::SpeculativeConfig c;
  c.method = spec::parse_spec_method(args.get("speculative-method"));
  c.num_speculative_tokens = static_cast<int32_t>(args.get_int("num-speculative-tokens"));
  c.synthetic_acceptance_length = static_cast<int32_t>(args.get_int("synthetic-acceptance-length"));
  c.ngram_min = static_cast<int32_t>(args.get_int("ngram-min"));
  c.ngram_max = static_cast<int32_t>(args.get_int("ngram-max"));
  c.adaptive = !args.flag("no-adaptive-draft-length");
  try {
    c.validate();
  } catch (const core::Error& e) {
    throw core::Error(std::string("--speculative-method / --num-speculative-tokens / --synthetic-acceptance-length / "
                                  "--ngram-*: ") +
                      e.what());
  }
  return c;
}

}  // namespace k3::cli
