// model/decode_path_counters.h: how a model's steps were run, for the engine and the server's
// metrics: steps per decode path and the fused path's fallbacks per reason, counted over the
// model's life (graph replays included). A header of its own so that the engine reads the counts
// without seeing the model's layers or kernels.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace k3::model {

struct DecodePathCounters {
  int64_t fused_steps = 0, standard_steps = 0;
  std::vector<std::pair<std::string, int64_t>> fallbacks;  // (reason, steps), first seen first
};

}  // namespace k3::model
