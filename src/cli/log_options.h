// cli/log_options.h: --log-level and --log-format, which the commands that run a model or a
// load (serve, generate, logits, bench-serve) take.
#pragma once
#include <vector>

#include "cli/args.h"

namespace k3::cli {

// --log-level trace|debug|info|warning|error|off (info), --log-format text|json (text).
std::vector<OptionSpec> log_option_specs();
// Sets the process's log (core/log.h) from them; throws core::Error naming a bad value.
void configure_log(const Args& args);

}  // namespace k3::cli
