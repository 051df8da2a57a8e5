// cli/model_options.cpp: model option parsing.
#include "cli/model_options.h"

#include "core/error.h"

namespace k3::cli {

std::vector<OptionSpec> model_option_specs() {
  return {
      {"model", "DIR", "checkpoint folder (config.json + safetensors)", kDefaultModelDir},
      {"precision", "bf16|fp32", "bf16: engine rounding points; fp32: exact math", "bf16"},
      {"kv-cache", "bf16|fp8", "MLA latent cache dtype", "bf16"},
      {"kda-prefill", "chunked|recurrent", "KDA algorithm for prefill steps", "chunked"},
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
  return o;
}

model::KvCacheDtype parse_kv_cache(const Args& args) {
  const std::string kv = args.get("kv-cache");
  K3_CHECK(kv == "bf16" || kv == "fp8", "--kv-cache must be bf16 or fp8, got '" + kv + "'");
  return kv == "fp8" ? model::KvCacheDtype::fp8_e4m3 : model::KvCacheDtype::bf16;
}

}  // namespace k3::cli
