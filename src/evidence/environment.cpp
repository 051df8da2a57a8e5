// evidence/environment.cpp: see environment.h.
#include "evidence/environment.h"

#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#ifndef K3_BUILD_TYPE
#define K3_BUILD_TYPE "unknown"
#endif
#ifndef K3_CXX_FLAGS
#define K3_CXX_FLAGS ""
#endif
#ifndef K3_CUDA_BUILD
#define K3_CUDA_BUILD 0
#endif
#ifndef K3_SOURCE_DIR
#define K3_SOURCE_DIR "."
#endif

namespace k3::evidence {

using Json = nlohmann::json;

namespace {

std::string command_output(const std::string& cmd) {
  std::string out;
  if (FILE* p = ::popen(cmd.c_str(), "r")) {
    std::array<char, 512> buf{};
    while (size_t n = std::fread(buf.data(), 1, buf.size(), p)) out.append(buf.data(), n);
    ::pclose(p);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown";
}

std::string trim(std::string s) {
  while (!s.empty() && s.front() == ' ') s.erase(0, 1);
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

}  // namespace

Json gpu_info() {
  const std::string csv = command_output(
      "nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,clocks.max.sm,clocks.max.mem,memory.total "
      "--format=csv,noheader 2>/dev/null");
  if (csv.empty()) return "none";
  Json gpus = Json::array();
  std::istringstream lines(csv);
  for (std::string line; std::getline(lines, line);) {
    std::vector<std::string> f;
    std::istringstream cells(line);
    for (std::string c; std::getline(cells, c, ',');) f.push_back(trim(c));
    if (f.size() < 7) continue;
    gpus.push_back({{"name", f[0]},
                    {"driver", f[1]},
                    {"clock_sm", f[2]},
                    {"clock_mem", f[3]},
                    {"clock_max_sm", f[4]},
                    {"clock_max_mem", f[5]},
                    {"memory", f[6]}});
  }
  return gpus.empty() ? Json("none") : gpus;
}

Json environment() {
  // The source tree the binary came from, when it is still there; else wherever we run.
  const std::string git = std::filesystem::exists(std::filesystem::path(K3_SOURCE_DIR) / ".git")
                              ? std::string("git -C '") + K3_SOURCE_DIR + "' "
                              : std::string("git ");
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  return {{"git_sha", command_output(git + "rev-parse HEAD 2>/dev/null")},
          {"git_dirty", !command_output(git + "status --porcelain 2>/dev/null").empty()},  // untracked files too
          {"build_type", K3_BUILD_TYPE},
          {"cxx_flags", trim(K3_CXX_FLAGS)},
          {"cuda_build", static_cast<bool>(K3_CUDA_BUILD)},
          {"compiler", __VERSION__},
          {"cpu", cpu_model()},
          {"cpu_threads", std::thread::hardware_concurrency()},
          {"host", host},
          {"gpu", gpu_info()}};
}

}  // namespace k3::evidence
