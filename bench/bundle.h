// bench/bundle.h: the environment part of a benchmark result bundle (git sha, dirty flag,
// build flags, CPU, host) and small helpers shared by every benchmark program.
#pragma once
#include <nlohmann/json.hpp>
#include <cstdint>
#include <string>
#include <vector>

namespace k3::bench {

nlohmann::json environment();
// median of samples (copy sorted); 0 for none
double median(std::vector<double> samples);
// "1,8,64" -> {1, 8, 64}; throws std::invalid_argument naming `flag` and the bad item.
std::vector<int64_t> parse_int_list(const std::string& text, const std::string& flag);

}  // namespace k3::bench
