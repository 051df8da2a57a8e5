// loadgen/bench_run.cpp: run_benchmark and the terminal summary.
#include "loadgen/bench_run.h"

#include <chrono>
#include <cstdio>
#include <filesystem>

#include "core/error.h"
#include "evidence/environment.h"
#include "loadgen/bundle.h"

namespace k3::loadgen {

using Json = nlohmann::json;

Json run_benchmark(BenchConfig c) {
  c.workload.validate();
  c.run.validate();
  Json models;
  {
    ApiClient probe(c.endpoint);
    const std::string body = probe.get("/v1/models");
    models = Json::parse(body, nullptr, false);
    K3_CHECK(!models.is_discarded() && models.contains("data") && models["data"].is_array() && !models["data"].empty(),
             "GET " + c.endpoint.url() + "/v1/models did not list a model: " + body.substr(0, 300));
    if (c.endpoint.model.empty()) c.endpoint.model = models["data"][0].value("id", std::string());
  }
  Json model = {{"name", c.endpoint.model}, {"models_reply", models}};
  if (!c.model_dir.empty()) {
    model["model_dir"] = c.model_dir;
    model["config_hash"] = file_hash(std::filesystem::path(c.model_dir) / "config.json");
    model["config_hash_of"] = "config.json";
  } else {
    model["config_hash"] = text_hash(models.dump());
    model["config_hash_of"] = "/v1/models";
  }

  const std::vector<Session> sessions = build_workload(c.workload);
  const auto wall_start = std::chrono::system_clock::now();
  const RunResult r = run_load(c.endpoint, sessions, c.run);
  const ServingSummary summary = summarize_run(r.samples, r.duration_s, c.slos);

  Json samples = Json::array();
  for (const RequestSample& s : r.samples) samples.push_back(s.to_json());
  const auto deltas = metric_deltas(r.metrics_before, r.metrics_after);
  Json server_metrics = {{"before", r.metrics_before},
                         {"after", r.metrics_after},
                         {"deltas", deltas},
                         {"rates", server_side_rates(deltas)},
                         {"error", r.metrics_error}};
  Json summary_json = summary.to_json();
  summary_json["planned_requests"] = count_requests(sessions);
  summary_json["hit_time_limit"] = r.hit_time_limit;
  summary_json["warmup_failed"] = r.warmup_failed;
  summary_json["server_prefix_cache_hit_rate"] = server_metrics["rates"]["prefix_cache_hit_rate"];
  summary_json["spec_decode_acceptance_rate"] = server_metrics["rates"]["spec_decode_acceptance_rate"];
  return {{"schema", kBundleSchema},
          {"label", c.label},
          {"series", c.series},
          {"created_unix", std::chrono::duration_cast<std::chrono::seconds>(wall_start.time_since_epoch()).count()},
          {"environment", evidence::environment()},
          {"server", {{"url", c.endpoint.url()}, {"model", model}}},
          {"engine_config", c.engine_config},
          {"workload", c.workload.to_json()},
          {"run", c.run.to_json()},
          {"slos", c.slos.to_json()},
          {"server_metrics", server_metrics},
          {"summary", summary_json},
          {"samples", samples}};
}

std::string format_summary(const Json& b) {
  const Json& s = b.at("summary");
  std::string out;
  char line[160];
  auto row = [&](const char* name, const std::string& value) {
    std::snprintf(line, sizeof(line), "%-44s %s\n", name, value.c_str());
    out += line;
  };
  auto num = [](const Json& v, const char* f = "%.2f") {
    if (!v.is_number()) return std::string("n/a");
    char buf[64];
    std::snprintf(buf, sizeof(buf), f, v.get<double>());
    return std::string(buf);
  };
  out += "============ Serving Benchmark Result ============\n";
  row("Workload:", b.at("workload").value("kind", std::string("?")) + " (seed " +
                       std::to_string(b.at("workload").value("seed", uint64_t{0})) + ")");
  row("Successful requests:", num(s["completed"], "%.0f"));
  row("Failed requests:", num(s["failed"], "%.0f"));
  row("Benchmark duration (s):", num(s["duration_s"]));
  row("Total input tokens:", num(s["total_input_tokens"], "%.0f"));
  row("Total generated tokens:", num(s["total_output_tokens"], "%.0f"));
  row("Request throughput (req/s):", num(s["request_throughput"]));
  if (!b.at("slos").empty()) row("Request goodput (req/s):", num(s["request_goodput"]));
  row("Output token throughput (tok/s):", num(s["output_throughput"]));
  row("Total token throughput (tok/s):", num(s["total_token_throughput"]));
  row("Prefill throughput (tok/s, prefill-busy time):", num(s["prefill_throughput"]));
  row("Decode throughput (tok/s, decode-busy time):", num(s["decode_throughput"]));
  row("Prefix cache hit rate (server /metrics):", num(s["server_prefix_cache_hit_rate"], "%.4f"));
  row("Prefix cache hit rate (usage.cached_tokens):", num(s["client_prefix_hit_rate"], "%.4f"));
  row("Spec decode acceptance rate:", num(s["spec_decode_acceptance_rate"], "%.4f"));
  for (const auto& [key, title] : std::vector<std::pair<const char*, const char*>>{
           {"ttft_ms", "Time to First Token (ms)"},
           {"tpot_ms", "Time per Output Token, excl. 1st (ms)"},
           {"itl_ms", "Inter-token Latency (ms)"},
           {"e2e_ms", "End-to-end Latency (ms)"},
           {"interactivity_tpot_tok_s", "Interactivity, 1000/TPOT (tok/s/user)"},
           {"interactivity_itl_tok_s", "Interactivity, 1/ITL (tok/s/user)"}}) {
    out += std::string("---------- ") + title + " ----------\n";
    for (const char* st : {"mean", "p50", "p90", "p99"}) row((std::string(st) + ":").c_str(), num(s[key][st]));
  }
  out += "==================================================\n";
  return out;
}

}  // namespace k3::loadgen
