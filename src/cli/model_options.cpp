// cli/model_options.cpp: model option parsing.
#include "cli/model_options.h"

#include <unistd.h>

#include <iostream>
#include <memory>

#include "core/error.h"

namespace k3::cli {

std::vector<OptionSpec> model_option_specs() {
  return {
      {"model", "DIR", "checkpoint folder (config.json + safetensors)", kDefaultModelDir},
      {"precision", "bf16|fp32", "bf16: engine rounding points; fp32: exact math", "bf16"},
      {"kv-cache", "bf16|fp8", "MLA latent cache dtype", "bf16"},
      {"kda-prefill", "chunked|recurrent", "KDA algorithm for prefill steps", "chunked"},
      {"device", "cpu|cuda", "where the model runs (cuda: GPU 0, CUDA builds only)", "cpu"},
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
  return o;
}

model::KvCacheDtype parse_kv_cache(const Args& args) {
  const std::string kv = args.get("kv-cache");
  K3_CHECK(kv == "bf16" || kv == "fp8", "--kv-cache must be bf16 or fp8, got '" + kv + "'");
  return kv == "fp8" ? model::KvCacheDtype::fp8_e4m3 : model::KvCacheDtype::bf16;
}

OptionSpec tp_option_spec() {
  return {"tp", "N", "tensor-parallel ranks, one CPU thread each (N must divide the heads, intermediates and vocab)",
          "1"};
}

int parse_tp(const Args& args) {
  const int64_t tp = args.get_int("tp");
  K3_CHECK(tp >= 1 && tp <= 64, "--tp must be in [1, 64], got " + std::to_string(tp));
  return static_cast<int>(tp);
}

checkpoint::LoadProgressFn load_progress_to_stderr(const std::string& what) {
  auto log = std::make_shared<checkpoint::LoadProgressLog>(what);
  return [log](const checkpoint::LoadProgress& p) {
    const std::string line = log->line(p);
    if (!line.empty()) std::cerr << line << std::endl;
  };
}

checkpoint::LoadProgressFn load_progress_on_terminal(const std::string& what) {
  if (!::isatty(STDERR_FILENO)) return nullptr;
  return load_progress_to_stderr(what);
}

}  // namespace k3::cli
