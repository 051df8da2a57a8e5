// loadgen/client.cpp: streamed completions over cpp-httplib, SSE parsing, /metrics parsing.
#include "loadgen/client.h"

#include <httplib.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "core/error.h"

namespace k3::loadgen {

using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {
double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}
}  // namespace

std::vector<std::string> SseParser::feed(const char* data, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (data[i] != '\r') buffer_.push_back(data[i]);
  std::vector<std::string> events;
  size_t pos = 0;
  for (size_t end; (end = buffer_.find("\n\n", pos)) != std::string::npos; pos = end + 2) {
    // An event may have several lines; its data is the "data:" lines joined by "\n".
    std::string event_data;
    bool has_data = false;
    std::istringstream lines(buffer_.substr(pos, end - pos));
    for (std::string line; std::getline(lines, line);) {
      if (line.rfind("data:", 0) != 0) continue;
      std::string v = line.substr(5);
      if (!v.empty() && v[0] == ' ') v.erase(0, 1);
      if (has_data) event_data += "\n";
      event_data += v;
      has_data = true;
    }
    if (has_data) events.push_back(std::move(event_data));
  }
  buffer_.erase(0, pos);
  return events;
}

ApiClient::ApiClient(const Endpoint& endpoint) : endpoint_(endpoint) {
  http_ = std::make_unique<httplib::Client>(endpoint.host, endpoint.port);
  http_->set_keep_alive(true);
  const auto secs = static_cast<time_t>(endpoint.timeout_s);
  http_->set_read_timeout(secs, static_cast<time_t>((endpoint.timeout_s - static_cast<double>(secs)) * 1e6));
  http_->set_connection_timeout(10, 0);
}

ApiClient::~ApiClient() = default;

std::string ApiClient::get(const std::string& path) {
  auto res = http_->Get(path);
  K3_CHECK(res, "GET " + endpoint_.url() + path + " failed: " + httplib::to_string(res.error()));
  K3_CHECK(res->status == 200, "GET " + endpoint_.url() + path + " answered HTTP " + std::to_string(res->status) +
                                   ": " + res->body.substr(0, 300));
  return res->body;
}

RequestSample ApiClient::stream_completion(const std::vector<int32_t>& prompt, int64_t max_tokens,
                                           Clock::time_point run_start) {
  RequestSample s;
  s.input_tokens = static_cast<int64_t>(prompt.size());
  s.expected_output_tokens = max_tokens;
  const Json body = {{"model", endpoint_.model},
                     {"prompt", prompt},
                     {"max_tokens", max_tokens},
                     {"ignore_eos", true},
                     {"temperature", 0.0},
                     {"stream", true},
                     {"stream_options", {{"include_usage", true}}}};
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");

  SseParser parser;
  std::string raw;  // kept for an error reply's message
  int64_t chunks = 0, usage_tokens = -1;
  bool done = false;
  Clock::time_point last{};
  const Clock::time_point sent = Clock::now();
  s.start_s = seconds_between(run_start, sent);
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    const Clock::time_point now = Clock::now();
    if (raw.size() < 4096) raw.append(data, std::min<size_t>(n, 4096 - raw.size()));
    for (const std::string& event : parser.feed(data, n)) {
      if (event == "[DONE]") {
        done = true;
        continue;
      }
      Json j = Json::parse(event, nullptr, false);
      if (j.is_discarded()) {
        s.error = "a stream event is not JSON: " + event.substr(0, 200);
        return false;
      }
      if (j.contains("error")) {
        s.error = "the stream ended with an error: " + j["error"].dump().substr(0, 300);
        return false;
      }
      // As vLLM's bench: every chunk with choices is a token chunk, timed on arrival.
      if (j.contains("choices") && !j["choices"].empty()) {
        if (chunks == 0) s.ttft_s = seconds_between(sent, now);
        else s.itl_s.push_back(seconds_between(last, now));
        last = now;
        ++chunks;
      } else if (j.contains("usage") && j["usage"].is_object()) {
        usage_tokens = j["usage"].value("completion_tokens", int64_t{-1});
        if (j["usage"].contains("prompt_tokens_details") && j["usage"]["prompt_tokens_details"].is_object())
          s.cached_tokens = j["usage"]["prompt_tokens_details"].value("cached_tokens", int64_t{-1});
      }
    }
    return true;
  };
  auto res = http_->send(req);
  s.e2e_s = seconds_between(sent, Clock::now());
  if (!s.error.empty()) return s;
  if (!res) {
    s.error = "transport error: " + httplib::to_string(res.error());
    return s;
  }
  if (res->status != 200) {
    s.error = "HTTP " + std::to_string(res->status) + ": " + raw.substr(0, 300);
    return s;
  }
  if (!done) {
    s.error = "the stream ended without data: [DONE]";
    return s;
  }
  if (chunks == 0) {
    s.error = "the stream carried no token chunk";
    return s;
  }
  s.output_tokens = usage_tokens >= 0 ? usage_tokens : chunks;
  s.ok = true;
  return s;
}

std::map<std::string, double> parse_prometheus(const std::string& text) {
  std::map<std::string, double> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    const size_t name_end = line.find_first_of("{ ");
    if (name_end == std::string::npos) continue;
    const std::string name = line.substr(0, name_end);
    if (name.size() > 7 && name.compare(name.size() - 7, 7, "_bucket") == 0) continue;
    size_t value_at = name_end;
    if (line[name_end] == '{') {
      const size_t close = line.find('}', name_end);
      if (close == std::string::npos) continue;
      value_at = close + 1;
    }
    std::istringstream v(line.substr(value_at));
    std::string value_text;
    v >> value_text;
    char* end = nullptr;
    const double value = std::strtod(value_text.c_str(), &end);
    if (value_text.empty() || *end != '\0' || !std::isfinite(value)) continue;
    out[name] += value;
  }
  return out;
}

std::map<std::string, double> metric_deltas(const std::map<std::string, double>& before,
                                            const std::map<std::string, double>& after) {
  std::map<std::string, double> d;
  for (const auto& [name, v] : after) {
    const auto it = before.find(name);
    d[name] = v - (it == before.end() ? 0.0 : it->second);
  }
  return d;
}

Json server_side_rates(const std::map<std::string, double>& deltas) {
  // Counters are named with or without Prometheus' _total suffix, depending on the exporter.
  auto find = [&](const std::string& base) -> const double* {
    for (const std::string& n : {base + "_total", base}) {
      const auto it = deltas.find(n);
      if (it != deltas.end()) return &it->second;
    }
    return nullptr;
  };
  Json j;
  const double* queries = find("vllm:prefix_cache_queries");
  const double* hits = find("vllm:prefix_cache_hits");
  j["prefix_cache_queries"] = queries ? Json(*queries) : Json(nullptr);
  j["prefix_cache_hits"] = hits ? Json(*hits) : Json(nullptr);
  j["prefix_cache_hit_rate"] = queries && hits && *queries > 0 ? Json(*hits / *queries) : Json(nullptr);
  const double* drafts = find("vllm:spec_decode_num_drafts");
  const double* draft_tokens = find("vllm:spec_decode_num_draft_tokens");
  const double* accepted = find("vllm:spec_decode_num_accepted_tokens");
  j["spec_decode_num_drafts"] = drafts ? Json(*drafts) : Json(nullptr);
  j["spec_decode_num_draft_tokens"] = draft_tokens ? Json(*draft_tokens) : Json(nullptr);
  j["spec_decode_num_accepted_tokens"] = accepted ? Json(*accepted) : Json(nullptr);
  j["spec_decode_acceptance_rate"] = draft_tokens && accepted && *draft_tokens > 0 ? Json(*accepted / *draft_tokens)
                                                                                   : Json(nullptr);
  j["spec_decode_mean_acceptance_length"] = drafts && accepted && *drafts > 0 ? Json(1.0 + *accepted / *drafts)
                                                                              : Json(nullptr);
  return j;
}

}  // namespace k3::loadgen
