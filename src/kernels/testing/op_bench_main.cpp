// kernels/testing/op_bench_main.cpp: k3bench_ops_gpu: per-op CUDA timings of every family at the K3
// TP8 per-GPU shapes (spec §11, §14.2), decode batches 1, 8 and 64 (op_bench.h says how rows are
// timed and counted).
//
//   k3bench_ops_gpu [--out FILE] [--iters N] [--batches 1,8,64] [--only FAMILY,...]
// Prints a table and writes a JSON result bundle: the environment, the config and every row.
#include <algorithm>
#include <cstdio>
#include <exception>
#include <fstream>
#include <iostream>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "evidence/environment.h"
#include "kernels/testing/op_bench.h"

namespace {

using k3::kernels::kOpBenchFamilies;

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> out;
  size_t begin = 0;
  while (begin <= text.size()) {
    const size_t comma = std::min(text.find(',', begin), text.size());
    out.push_back(text.substr(begin, comma - begin));
    begin = comma + 1;
  }
  return out;
}

std::string family_names() {
  std::string names;
  for (const auto& f : kOpBenchFamilies) names += (names.empty() ? "" : ",") + std::string(f.name);
  return names;
}

std::vector<int64_t> parse_batches(const std::string& text) {
  std::vector<int64_t> out;
  for (const std::string& item : split(text)) {
    size_t used = 0;
    int64_t v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    K3_CHECK(used == item.size() && !item.empty() && v >= 1,
             "--batches must be positive integers separated by commas, got '" + text + "'");
    out.push_back(v);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::string out = "ops_gpu.json", batches_arg = "1,8,64", only = family_names();
    int iters = 30;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      const auto value = [&](const char* flag) -> std::string {
        K3_CHECK(i + 1 < argc, std::string(flag) + " needs a value");
        return argv[++i];
      };
      if (a == "--out") out = value("--out");
      else if (a == "--iters") {
        const std::string v = value("--iters");
        K3_CHECK(v.find_first_not_of("0123456789") == std::string::npos && !v.empty() && std::stoi(v) >= 1,
                 "--iters must be a positive integer, got '" + v + "'");
        iters = std::stoi(v);
      } else if (a == "--batches") batches_arg = value("--batches");
      else if (a == "--only") only = value("--only");
      else if (a == "--help" || a == "-h") {
        std::cout << "k3bench_ops_gpu [--out FILE] [--iters N] [--batches 1,8,64] [--only FAMILY,...]\n"
                  << "families: " << family_names() << "\n";
        return 0;
      } else {
        throw k3::core::Error("unknown option " + a + " (try --help)");
      }
    }
    const std::vector<int64_t> batches = parse_batches(batches_arg);
    std::set<std::string> wanted;
    for (const std::string& name : split(only)) {
      bool known = false;
      for (const auto& f : kOpBenchFamilies) known = known || name == f.name;
      K3_CHECK(known, "--only: unknown family '" + name + "' (families: " + family_names() + ")");
      wanted.insert(name);
    }
    k3::kernels::OpBench b(iters, batches);
    const auto& info = b.ctx()->info();
    std::printf("k3bench_ops_gpu on %s (%d SMs, L2 %zu MiB): device copy %.0f GB/s (read + write); floor 4300 GB/s\n",
                info.name.c_str(), info.sm_count, info.l2_bytes >> 20, b.copy_bytes_per_second() / 1e9);
    std::printf("%-11s %-24s %-30s %5s %10s %12s %9s %8s %8s\n", "family", "op", "shape", "batch", "median_us",
                "MB moved", "GB/s", "x4.3TB/s", "xcopy");
    for (const auto& f : kOpBenchFamilies)
      if (wanted.count(f.name)) f.run(b);
    nlohmann::json env = k3::evidence::environment();
    env["gpu"] = {{"name", info.name},
                  {"sm_count", info.sm_count},
                  {"l2_bytes", info.l2_bytes},
                  {"global_bytes", info.global_bytes},
                  {"cc", std::to_string(info.cc_major) + "." + std::to_string(info.cc_minor)},
                  {"driver_version", info.driver_version},
                  {"runtime_version", info.runtime_version}};
    const nlohmann::json bundle = {
        {"benchmark", "ops_gpu"},
        {"environment", env},
        {"config",
         {{"iters", iters},
          {"batches", batches},
          {"only", only},
          {"timing", "median of iters, L2 flushed before each, CUDA events"},
          {"bytes",
           "spec §12: weights read + state read/written + cache read + activations in/out; experts: distinct touched"}}},
        {"copy_GBps", b.copy_bytes_per_second() / 1e9},
        {"floor_GBps", k3::kernels::kOpBenchFloorBytesPerSecond / 1e9},
        {"rows", b.rows()}};
    std::ofstream(out) << bundle.dump(2) << "\n";
    std::cout << "wrote " << out << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  }
}
