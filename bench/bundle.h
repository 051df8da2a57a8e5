// bench/bundle.h: small helpers shared by every benchmark program (a bundle's environment is
// evidence/environment.h's).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace k3::bench {

// median of samples (copy sorted); 0 for none
double median(std::vector<double> samples);
// "1,8,64" -> {1, 8, 64}; throws std::invalid_argument naming `flag` and the bad item.
std::vector<int64_t> parse_int_list(const std::string& text, const std::string& flag);

}  // namespace k3::bench
