// cli/model_options.h: the options shared by the commands that run a model.
#pragma once
#include <vector>

#include "cli/args.h"
#include "model/kv_storage.h"
#include "model/layers/context.h"

namespace k3::cli {

inline constexpr const char* kDefaultModelDir = "models/k3-tiny";  // written by scripts/setup.sh

// --model, --precision, --kv-cache, --kda-prefill
std::vector<OptionSpec> model_option_specs();
model::ModelOptions parse_model_options(const Args& args);
model::KvCacheDtype parse_kv_cache(const Args& args);

}  // namespace k3::cli
