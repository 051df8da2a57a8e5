// loadgen/bench_run.h: one bench-serve run end to end: ask the server what it serves, build the
// workload, drive it, summarize, and assemble the result bundle (bundle.h). The CLI command
// (cli/bench_serve.cpp) and the integration test both go through run_benchmark.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

#include "loadgen/client.h"
#include "loadgen/request_metrics.h"
#include "loadgen/runner.h"
#include "loadgen/workload.h"

namespace k3::loadgen {

struct BenchConfig {
  Endpoint endpoint;
  WorkloadSpec workload;
  RunOptions run;
  Slos slos;
  std::string label;      // names the run in compare tables ("" : the file name)
  std::string series;     // groups runs into one curve of the sweep plots ("" : sha + workload)
  std::string model_dir;  // when given, its config.json is hashed into the bundle
  nlohmann::json engine_config = nlohmann::json::object();  // how the server was started (free-form)
};

// Runs the benchmark; the bundle holds everything (schema kBundleSchema). Throws core::Error
// when the server cannot be reached or the config is bad; failed requests are samples, not errors.
nlohmann::json run_benchmark(BenchConfig config);

// vLLM-style text table of a bundle's summary, for the terminal.
std::string format_summary(const nlohmann::json& bundle);

}  // namespace k3::loadgen
