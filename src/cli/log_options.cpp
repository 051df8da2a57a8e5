// cli/log_options.cpp: --log-level / --log-format onto core/log.h.
#include "cli/log_options.h"

#include "core/log.h"

namespace k3::cli {

std::vector<OptionSpec> log_option_specs() {
  return {
      {"log-level", "L", "log lines at this level and above: trace, debug, info, warning, error, off", "info"},
      {"log-format", "F", "text (time, level, message) or json (one object per line, for log collectors)", "text"},
  };
}

void configure_log(const Args& args) {
  log::configure(log::parse_level(args.get("log-level")), log::parse_format(args.get("log-format")));
}

}  // namespace k3::cli
