// loadgen/client.h: the load generator's side of the OpenAI API: one streamed /v1/completions
// request with a token-id prompt, timed chunk by chunk; /metrics scrapes; /v1/models.
#pragma once
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "loadgen/request_metrics.h"

namespace httplib {
class Client;
}

namespace k3::loadgen {

struct Endpoint {
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string model;       // the "model" field; empty: the first id of /v1/models
  double timeout_s = 600;  // read timeout of one request
  std::string url() const { return "http://" + host + ":" + std::to_string(port); }
};

// One keep-alive connection (one per worker thread; not shared between threads).
class ApiClient {
 public:
  explicit ApiClient(const Endpoint& endpoint);
  ~ApiClient();
  ApiClient(const ApiClient&) = delete;
  ApiClient& operator=(const ApiClient&) = delete;

  // Streams one completion: `prompt` as token ids, exactly `max_tokens` output tokens
  // (ignore_eos), usage asked for in the last chunk. Times are seconds since `run_start`.
  // Never throws for server or transport errors: the sample says ok = false and why.
  RequestSample stream_completion(const std::vector<int32_t>& prompt, int64_t max_tokens,
                                  std::chrono::steady_clock::time_point run_start);

  // GET path; throws core::Error naming the URL when there is no 200 reply.
  std::string get(const std::string& path);

 private:
  Endpoint endpoint_;
  std::unique_ptr<httplib::Client> http_;
};

// Prometheus text exposition -> value per metric name, summed over label sets (counters and
// gauges; histogram _bucket lines are skipped, their _sum and _count kept).
std::map<std::string, double> parse_prometheus(const std::string& text);

// after - before for every name in after (a name missing before counts from 0).
std::map<std::string, double> metric_deltas(const std::map<std::string, double>& before,
                                            const std::map<std::string, double>& after);

// What the server's counters say about the run: prefix-cache hit rate (vLLM's
// prefix_cache_hits / prefix_cache_queries) and speculative decoding (acceptance rate = accepted /
// draft tokens, mean acceptance length = 1 + accepted / drafts); a quantity whose counters the
// server does not expose is null.
nlohmann::json server_side_rates(const std::map<std::string, double>& deltas);

// Parses one SSE body piece by piece: complete "data: ..." events are returned as they finish.
class SseParser {
 public:
  std::vector<std::string> feed(const char* data, size_t n);

 private:
  std::string buffer_;
};

}  // namespace k3::loadgen
