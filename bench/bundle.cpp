// bench/bundle.cpp: environment facts for result bundles.
#include "bundle.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <string>
#include <thread>

namespace k3::bench {

namespace {
std::string command_output(const char* cmd) {
  std::string out;
  if (FILE* p = ::popen(cmd, "r")) {
    std::array<char, 512> buf{};
    while (size_t n = std::fread(buf.data(), 1, buf.size(), p)) out.append(buf.data(), n);
    ::pclose(p);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown";
}
}  // namespace

nlohmann::json environment() {
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  return {
      {"git_sha", command_output("git rev-parse HEAD 2>/dev/null")},
      {"git_dirty", !command_output("git status --porcelain 2>/dev/null").empty()},
      {"build_type", K3_BUILD_TYPE},
      {"compiler", __VERSION__},
      {"cpu", cpu_model()},
      {"cpu_threads", std::thread::hardware_concurrency()},
      {"host", host},
  };
}

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
      throw std::invalid_argument(flag + ": '" + item + "' in '" + text + "' is not an integer (want a list like 1,8,64)");
    v.push_back(x);
    pos = comma + 1;
  }
  return v;
}

}  // namespace k3::bench
