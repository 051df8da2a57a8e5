// loadgen/request_metrics.cpp: per-request samples and the run summary (definitions in the header).
#include "loadgen/request_metrics.h"

#include <algorithm>
#include <cstdlib>

#include "core/error.h"

namespace k3::loadgen {

nlohmann::json RequestSample::to_json() const {
  return {{"session", session},
          {"turn", turn},
          {"input_tokens", input_tokens},
          {"output_tokens", output_tokens},
          {"cached_tokens", cached_tokens},
          {"expected_output_tokens", expected_output_tokens},
          {"start_s", start_s},
          {"ttft_s", ttft_s},
          {"e2e_s", e2e_s},
          {"itl_s", itl_s},
          {"ok", ok},
          {"error", error}};
}

RequestSample RequestSample::from_json(const nlohmann::json& j) {
  RequestSample s;
  s.session = j.at("session").get<int64_t>();
  s.turn = j.at("turn").get<int64_t>();
  s.input_tokens = j.at("input_tokens").get<int64_t>();
  s.output_tokens = j.at("output_tokens").get<int64_t>();
  s.cached_tokens = j.at("cached_tokens").get<int64_t>();
  s.expected_output_tokens = j.at("expected_output_tokens").get<int64_t>();
  s.start_s = j.at("start_s").get<double>();
  s.ttft_s = j.at("ttft_s").get<double>();
  s.e2e_s = j.at("e2e_s").get<double>();
  s.itl_s = j.at("itl_s").get<std::vector<double>>();
  s.ok = j.at("ok").get<bool>();
  s.error = j.at("error").get<std::string>();
  return s;
}

nlohmann::json Slos::to_json() const {
  nlohmann::json j = nlohmann::json::object();
  if (ttft_ms) j["ttft"] = *ttft_ms;
  if (tpot_ms) j["tpot"] = *tpot_ms;
  if (e2e_ms) j["e2e"] = *e2e_ms;
  return j;
}

Slos Slos::from_json(const nlohmann::json& j) {
  Slos s;
  if (j.contains("ttft")) s.ttft_ms = j["ttft"].get<double>();
  if (j.contains("tpot")) s.tpot_ms = j["tpot"].get<double>();
  if (j.contains("e2e")) s.e2e_ms = j["e2e"].get<double>();
  return s;
}

Slos parse_slos(const std::vector<std::string>& items) {
  Slos s;
  for (const std::string& item : items) {
    const size_t colon = item.find(':');
    K3_CHECK(colon != std::string::npos, "--goodput: '" + item + "' is not KEY:MILLISECONDS (keys ttft, tpot, e2e)");
    const std::string key = item.substr(0, colon), value = item.substr(colon + 1);
    char* end = nullptr;
    const double ms = std::strtod(value.c_str(), &end);
    K3_CHECK(!value.empty() && end && *end == '\0' && ms > 0,
             "--goodput: '" + item + "': the value must be a positive number of milliseconds");
    if (key == "ttft") s.ttft_ms = ms;
    else if (key == "tpot") s.tpot_ms = ms;
    else if (key == "e2e" || key == "e2el") s.e2e_ms = ms;
    else throw core::Error("--goodput: unknown SLO '" + key + "' in '" + item + "' (keys: ttft, tpot, e2e)");
  }
  return s;
}

std::optional<double> request_tpot(const RequestSample& s) {
  if (!s.ok || s.output_tokens <= 1) return std::nullopt;
  return (s.e2e_s - s.ttft_s) / static_cast<double>(s.output_tokens - 1);
}

bool meets_slos(const RequestSample& s, const Slos& slos) {
  if (!s.ok) return false;
  const double tpot_ms = request_tpot(s).value_or(0.0) * 1000;  // vLLM: a 1-token reply has TPOT 0
  if (slos.ttft_ms && s.ttft_s * 1000 > *slos.ttft_ms) return false;
  if (slos.tpot_ms && tpot_ms > *slos.tpot_ms) return false;
  if (slos.e2e_ms && s.e2e_s * 1000 > *slos.e2e_ms) return false;
  return true;
}

double union_length(std::vector<std::pair<double, double>> iv) {
  std::sort(iv.begin(), iv.end());
  double total = 0, cur_begin = 0, cur_end = 0;
  bool open = false;
  for (const auto& [b, e] : iv) {
    if (e <= b) continue;
    if (!open || b > cur_end) {
      if (open) total += cur_end - cur_begin;
      cur_begin = b;
      cur_end = e;
      open = true;
    } else {
      cur_end = std::max(cur_end, e);
    }
  }
  if (open) total += cur_end - cur_begin;
  return total;
}

ServingSummary summarize_run(const std::vector<RequestSample>& samples, double duration_s, const Slos& slos) {
  ServingSummary r;
  r.duration_s = duration_s;
  std::vector<double> ttft, tpot, itl, e2e, inter_tpot, inter_itl;
  std::vector<std::pair<double, double>> prefill_iv, decode_iv;
  int64_t decode_tokens = 0, reported_input = 0;
  for (const RequestSample& s : samples) {
    if (!s.ok) {
      ++r.failed;
      continue;
    }
    ++r.completed;
    r.total_input_tokens += s.input_tokens;
    r.total_output_tokens += s.output_tokens;
    if (s.cached_tokens >= 0) {
      r.total_cached_tokens += s.cached_tokens;
      reported_input += s.input_tokens;
    }
    ttft.push_back(s.ttft_s * 1000);
    e2e.push_back(s.e2e_s * 1000);
    if (const auto t = request_tpot(s)) {
      tpot.push_back(*t * 1000);
      if (*t > 0) inter_tpot.push_back(1.0 / *t);
    }
    for (double g : s.itl_s) {
      itl.push_back(g * 1000);
      if (g > 0) inter_itl.push_back(1.0 / g);
    }
    prefill_iv.emplace_back(s.start_s, s.start_s + s.ttft_s);
    decode_iv.emplace_back(s.start_s + s.ttft_s, s.start_s + s.e2e_s);
    decode_tokens += std::max<int64_t>(0, s.output_tokens - 1);
    if (meets_slos(s, slos)) ++r.good_requests;
  }
  if (duration_s > 0) {
    r.request_throughput = static_cast<double>(r.completed) / duration_s;
    r.output_throughput = static_cast<double>(r.total_output_tokens) / duration_s;
    r.total_token_throughput = static_cast<double>(r.total_input_tokens + r.total_output_tokens) / duration_s;
    r.request_goodput = static_cast<double>(r.good_requests) / duration_s;
  }
  r.prefill_busy_s = union_length(prefill_iv);
  r.decode_busy_s = union_length(decode_iv);
  // The first token of each reply comes out of the prefill step, so prefill throughput counts
  // the prompt tokens and decode throughput the tokens after the first.
  if (r.prefill_busy_s > 0) r.prefill_throughput = static_cast<double>(r.total_input_tokens) / r.prefill_busy_s;
  if (r.decode_busy_s > 0) r.decode_throughput = static_cast<double>(decode_tokens) / r.decode_busy_s;
  if (reported_input > 0) r.client_prefix_hit_rate = static_cast<double>(r.total_cached_tokens) / reported_input;
  r.ttft_ms = summarize(ttft);
  r.tpot_ms = summarize(tpot);
  r.itl_ms = summarize(itl);
  r.e2e_ms = summarize(e2e);
  r.interactivity_tpot = summarize(inter_tpot);
  r.interactivity_itl = summarize(inter_itl);
  return r;
}

nlohmann::json ServingSummary::to_json() const {
  return {{"completed", completed},
          {"failed", failed},
          {"duration_s", duration_s},
          {"total_input_tokens", total_input_tokens},
          {"total_output_tokens", total_output_tokens},
          {"total_cached_tokens", total_cached_tokens},
          {"request_throughput", request_throughput},
          {"output_throughput", output_throughput},
          {"total_token_throughput", total_token_throughput},
          {"request_goodput", request_goodput},
          {"good_requests", good_requests},
          {"prefill_throughput", prefill_throughput},
          {"decode_throughput", decode_throughput},
          {"prefill_busy_s", prefill_busy_s},
          {"decode_busy_s", decode_busy_s},
          {"client_prefix_hit_rate", client_prefix_hit_rate},
          {"ttft_ms", ttft_ms.to_json()},
          {"tpot_ms", tpot_ms.to_json()},
          {"itl_ms", itl_ms.to_json()},
          {"e2e_ms", e2e_ms.to_json()},
          {"interactivity_tpot_tok_s", interactivity_tpot.to_json()},
          {"interactivity_itl_tok_s", interactivity_itl.to_json()}};
}

}  // namespace k3::loadgen
