// bench/bundle.cpp: see bundle.h.
#include "bundle.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace k3::bench {

double median(std::vector<double> s) {
  if (s.empty()) return 0;
  std::sort(s.begin(), s.end());
  const size_t n = s.size();
  return n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
}

std::vector<int64_t> parse_int_list(const std::string& text, const std::string& flag) {
  std::vector<int64_t> v;
  for (size_t pos = 0; pos <= text.size();) {
    const size_t comma = std::min(text.find(',', pos), text.size());
    const std::string item = text.substr(pos, comma - pos);
    size_t used = 0;
    long long x = 0;
    try {
      x = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (item.empty() || used != item.size())
      throw std::invalid_argument(flag + ": '" + item + "' in '" + text +
                                  "' is not an integer (want a list like 1,8,64)");
    v.push_back(x);
    pos = comma + 1;
  }
  return v;
}

}  // namespace k3::bench
