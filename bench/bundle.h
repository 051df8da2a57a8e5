// bench/bundle.h: the environment part of a benchmark result bundle (git sha, dirty flag,
// build flags, CPU, host), shared by every benchmark program.
#pragma once
#include <nlohmann/json.hpp>
#include <vector>

namespace k3::bench {

nlohmann::json environment();
// median of samples (copy sorted); 0 for none
double median(std::vector<double> samples);

}  // namespace k3::bench
