// bench/layer_gpu_options.h: k3bench_layer_gpu's command line (bench/layer_gpu.cpp): what to run and
// how, parsed with errors that name the option.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "bench/bundle.h"
#include "core/error.h"

namespace k3::bench {

struct Options {
  std::string out = "layer_gpu.json", layers = "kda,mla";
  std::vector<int64_t> batches = {1, 8, 32, 64};
  int replays = 200, copies = 3, ctx_tokens = 8192;
  int tp = 8;  // the rank shapes: one rank of K3 at this tensor parallelism
  bool check = false;
  uint64_t seed = 1;
  bool run_auto = true, run_fused = true;  // --paths: the standard path, the latency_specialized one
  std::vector<std::string> paths() const {
    std::vector<std::string> p;
    if (run_auto) p.push_back("auto");
    if (run_fused) p.push_back("latency_specialized");
    return p;
  }
};

inline Options parse_options(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto value = [&]() -> std::string {
      K3_CHECK(i + 1 < argc, a + " needs a value");
      return argv[++i];
    };
    if (a == "--out") o.out = value();
    else if (a == "--batches") o.batches = parse_int_list(value(), a);
    else if (a == "--layers") o.layers = value();
    else if (a == "--replays") o.replays = std::stoi(value());
    else if (a == "--copies") o.copies = std::stoi(value());
    else if (a == "--ctx") o.ctx_tokens = std::stoi(value());
    else if (a == "--tp") o.tp = std::stoi(value());
    else if (a == "--seed") o.seed = std::stoull(value());
    else if (a == "--check") o.check = true;
    else if (a == "--paths") {
      o.run_auto = o.run_fused = false;
      const std::string list = value();
      for (size_t begin = 0; begin <= list.size();) {
        const size_t end = std::min(list.find(',', begin), list.size());
        const std::string p = list.substr(begin, end - begin);
        if (p == "auto") o.run_auto = true;
        else if (p == "latency_specialized") o.run_fused = true;
        else throw core::Error("--paths: unknown path '" + p + "' (auto, latency_specialized)");
        begin = end + 1;
      }
    } else if (a == "--help" || a == "-h") {
      std::cout
          << "k3bench_layer_gpu [--out FILE] [--batches 1,8,32,64] [--layers kda,mla] [--replays N] [--copies R]\n"
             "                  [--ctx TOKENS] [--paths auto,latency_specialized] [--check] [--seed S] [--tp 8|16]\n";
      std::exit(0);
    } else {
      throw core::Error("unknown option " + a + " (try --help)");
    }
  }
  K3_CHECK(!o.batches.empty(), "--batches is empty");
  for (int64_t B : o.batches) K3_CHECK(B >= 1, "--batches: every batch must be >= 1");
  std::sort(o.batches.begin(), o.batches.end());  // the largest (last) sizes the storage
  K3_CHECK(o.replays >= 5, "--replays must be >= 5");
  K3_CHECK(o.copies >= 1, "--copies must be >= 1");
  K3_CHECK(o.ctx_tokens >= 1, "--ctx must be >= 1");
  K3_CHECK(o.tp >= 1, "--tp must be >= 1");
  K3_CHECK(o.layers.find("kda") != std::string::npos || o.layers.find("mla") != std::string::npos,
           "--layers must name kda and/or mla");
  return o;
}

}  // namespace k3::bench
