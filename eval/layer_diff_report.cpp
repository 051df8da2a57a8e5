// eval/layer_diff_report.cpp: LayerDiffReport as a JSON bundle (and back) and as a table.
#include <cmath>
#include <cstdio>
#include <limits>

#include "core/error.h"
#include "eval/layer_diff.h"

namespace k3::eval {

namespace {

using nlohmann::json;

// JSON has no NaN or infinity: those are written as strings so a bundle round-trips exactly.
json num(double x) {
  if (std::isfinite(x)) return x;
  if (std::isnan(x)) return "nan";
  return x > 0 ? "inf" : "-inf";
}

// Field `key` of object `j`, or a core::Error naming it (and where it was looked for).
const json& field(const json& j, const char* key, const std::string& where) {
  K3_CHECK(j.is_object() && j.contains(key), "layer_diff bundle: " + where + " has no field '" + key + "'");
  return j.at(key);
}

double get_num(const json& j, const char* key, const std::string& where) {
  const json& v = field(j, key, where);
  if (v.is_number()) return v.get<double>();
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    if (s == "nan") return std::numeric_limits<double>::quiet_NaN();
    if (s == "inf") return std::numeric_limits<double>::infinity();
    if (s == "-inf") return -std::numeric_limits<double>::infinity();
  }
  throw core::Error("layer_diff bundle: " + where + "." + key + " is not a number: " + v.dump());
}

template <class T>
T get(const json& j, const char* key, const std::string& where) {
  const json& v = field(j, key, where);
  try {
    return v.get<T>();
  } catch (const json::exception& e) {
    throw core::Error("layer_diff bundle: " + where + "." + key + " has the wrong type: " + e.what());
  }
}

json stats_json(const DiffStats& d) {
  return {{"cosine", num(d.cosine)}, {"rel_l2", num(d.rel_l2)}, {"max_abs", num(d.max_abs)}, {"numel", d.numel}};
}

// Reads .cosine/.rel_l2/.max_abs/.numel of a row object.
DiffStats stats_from(const json& j, const std::string& where) {
  return {get_num(j, "cosine", where), get_num(j, "rel_l2", where), get_num(j, "max_abs", where),
          get<int64_t>(j, "numel", where)};
}

std::string fmt(double x, const char* f = "%.6f") {
  char buf[64];
  std::snprintf(buf, sizeof(buf), f, x);
  return buf;
}

}  // namespace

bool LayerDiffReport::operator==(const LayerDiffReport& o) const {
  // Compared as bundles: every field is in the JSON, and NaN there is the string "nan" (equal to itself).
  return to_json(*this) == to_json(o);
}

json to_json(const LayerDiffReport& r) {
  json rows = json::array();
  for (const StepRow& row : r.rows) {
    json j = stats_json(row.stats);
    j["step"] = row.step;
    j["name"] = row.name;
    j["layer"] = row.layer;
    rows.push_back(std::move(j));
  }
  json layers = json::array();
  for (const LayerSummary& s : r.layers)
    layers.push_back({{"name", s.name},
                      {"layer", s.layer},
                      {"steps", s.steps},
                      {"cosine_worst", num(s.cosine_worst)},
                      {"cosine_mean", num(s.cosine_mean)},
                      {"rel_l2_worst", num(s.rel_l2_worst)},
                      {"rel_l2_mean", num(s.rel_l2_mean)},
                      {"max_abs_worst", num(s.max_abs_worst)},
                      {"max_abs_mean", num(s.max_abs_mean)}});
  json steps = json::array();
  for (const StepTokens& t : r.steps)
    steps.push_back({{"step", t.step},
                     {"kind", t.kind},
                     {"token_in", t.token_in},
                     {"greedy_a", t.greedy_a},
                     {"greedy_b", t.greedy_b},
                     {"top1_agree", t.top1_agree},
                     {"path_a", t.path_a},
                     {"path_b", t.path_b}});
  json first_below = nullptr;
  if (r.any_below)
    first_below = {{"name", r.first_below_name}, {"layer", r.first_below_layer}, {"cosine", num(r.first_below_cosine)}};
  return {
      {"tool", "layer_diff"},
      {"mode", r.mode},
      {"environment", r.environment},
      {"model", {{"source", r.model}, {"config_hash", r.config_hash}}},
      {"sides", {{"a", r.side_a}, {"b", r.side_b}}},
      {"config",
       {{"prompt", r.config.prompt},
        {"decode_steps", r.config.decode_steps},
        {"threshold", num(r.config.threshold)},
        {"free_run", r.config.free_run},
        {"trace_prefill", r.config.trace_prefill},
        {"prefill_chunk", r.config.prefill_chunk}}},
      {"summary",
       {{"top1_agreement", num(r.top1_agreement)},
        {"first_disagreeing_step", r.first_disagreeing_step},
        {"min_cosine", num(r.min_cosine)},
        {"any_below_threshold", r.any_below},
        {"first_below_threshold", first_below},
        {"first_divergence", r.first_divergence}}},
      {"layers", layers},
      {"steps", steps},
      {"rows", rows},
      {"only_in_a", r.only_in_a},
      {"only_in_b", r.only_in_b},
      {"tokens_a", r.tokens_a},
      {"tokens_b", r.tokens_b},
  };
}

LayerDiffReport report_from_json(const json& j) {
  LayerDiffReport r;
  K3_CHECK(get<std::string>(j, "tool", "the bundle") == "layer_diff", "layer_diff bundle: 'tool' is not layer_diff");
  r.mode = get<std::string>(j, "mode", "the bundle");
  K3_CHECK(r.mode == "teacher_forced" || r.mode == "free_run",
           "layer_diff bundle: mode must be teacher_forced or free_run, got '" + r.mode + "'");
  r.environment = field(j, "environment", "the bundle");
  const json& model = field(j, "model", "the bundle");
  r.model = get<std::string>(model, "source", "model");
  r.config_hash = get<std::string>(model, "config_hash", "model");
  const json& sides = field(j, "sides", "the bundle");
  r.side_a = get<std::string>(sides, "a", "sides");
  r.side_b = get<std::string>(sides, "b", "sides");
  const json& config = field(j, "config", "the bundle");
  r.config.prompt = get<std::vector<int32_t>>(config, "prompt", "config");
  r.config.decode_steps = get<int64_t>(config, "decode_steps", "config");
  r.config.threshold = get_num(config, "threshold", "config");
  r.config.free_run = get<bool>(config, "free_run", "config");
  r.config.trace_prefill = get<bool>(config, "trace_prefill", "config");
  r.config.prefill_chunk = get<int64_t>(config, "prefill_chunk", "config");
  const json& summary = field(j, "summary", "the bundle");
  r.top1_agreement = get_num(summary, "top1_agreement", "summary");
  r.first_disagreeing_step = get<int64_t>(summary, "first_disagreeing_step", "summary");
  r.min_cosine = get_num(summary, "min_cosine", "summary");
  r.any_below = get<bool>(summary, "any_below_threshold", "summary");
  r.first_divergence = get<int64_t>(summary, "first_divergence", "summary");
  if (r.any_below) {
    const json& fb = field(summary, "first_below_threshold", "summary");
    r.first_below_name = get<std::string>(fb, "name", "summary.first_below_threshold");
    r.first_below_layer = get<int>(fb, "layer", "summary.first_below_threshold");
    r.first_below_cosine = get_num(fb, "cosine", "summary.first_below_threshold");
  }
  for (const json& l : field(j, "layers", "the bundle")) {
    LayerSummary s;
    s.name = get<std::string>(l, "name", "layers[]");
    s.layer = get<int>(l, "layer", "layers[]");
    s.steps = get<int64_t>(l, "steps", "layers[]");
    s.cosine_worst = get_num(l, "cosine_worst", "layers[]");
    s.cosine_mean = get_num(l, "cosine_mean", "layers[]");
    s.rel_l2_worst = get_num(l, "rel_l2_worst", "layers[]");
    s.rel_l2_mean = get_num(l, "rel_l2_mean", "layers[]");
    s.max_abs_worst = get_num(l, "max_abs_worst", "layers[]");
    s.max_abs_mean = get_num(l, "max_abs_mean", "layers[]");
    r.layers.push_back(s);
  }
  for (const json& t : field(j, "steps", "the bundle"))
    r.steps.push_back({get<int64_t>(t, "step", "steps[]"), get<std::string>(t, "kind", "steps[]"),
                       get<int32_t>(t, "token_in", "steps[]"), get<int32_t>(t, "greedy_a", "steps[]"),
                       get<int32_t>(t, "greedy_b", "steps[]"), get<bool>(t, "top1_agree", "steps[]"),
                       get<std::string>(t, "path_a", "steps[]"), get<std::string>(t, "path_b", "steps[]")});
  for (const json& row : field(j, "rows", "the bundle"))
    r.rows.push_back({get<int64_t>(row, "step", "rows[]"), get<std::string>(row, "name", "rows[]"),
                      get<int>(row, "layer", "rows[]"), stats_from(row, "rows[]")});
  r.only_in_a = get<std::vector<std::string>>(j, "only_in_a", "the bundle");
  r.only_in_b = get<std::vector<std::string>>(j, "only_in_b", "the bundle");
  r.tokens_a = get<std::vector<int32_t>>(j, "tokens_a", "the bundle");
  r.tokens_b = get<std::vector<int32_t>>(j, "tokens_b", "the bundle");
  return r;
}

std::string format_table(const LayerDiffReport& r) {
  std::string out = "layer_diff (" + r.mode + ")\n  A: " + r.side_a + "\n  B: " + r.side_b + "\n  model: " + r.model +
                    " (config hash " + r.config_hash + ")\n";
  if (r.mode == "free_run") {
    out += "greedy tokens: " + std::to_string(r.tokens_a.size()) + " per side\n";
    if (r.first_divergence < 0) {
      out += "summary: identical (" + std::to_string(r.tokens_a.size()) + " of " + std::to_string(r.tokens_a.size()) +
             " tokens)\n";
    } else {
      const auto i = static_cast<size_t>(r.first_divergence);
      out += "summary: first divergence at token " + std::to_string(i) + " (A " + std::to_string(r.tokens_a[i]) +
             ", B " + std::to_string(r.tokens_b[i]) + ")\n";
    }
    return out;
  }
  char line[256];
  std::snprintf(line, sizeof(line), "%-16s %5s %5s %10s %10s %10s %10s %10s %10s\n", "name", "layer", "steps",
                "cos_worst", "cos_mean", "relL2_max", "relL2_mean", "maxabs_max", "maxabs_mean");
  out += line;
  for (const LayerSummary& s : r.layers) {
    const bool below = std::isnan(s.cosine_worst) || s.cosine_worst < r.config.threshold;
    std::snprintf(line, sizeof(line), "%-16s %5d %5lld %10.6f %10.6f %10.3e %10.3e %10.3e %10.3e%s\n", s.name.c_str(),
                  s.layer, static_cast<long long>(s.steps), s.cosine_worst, s.cosine_mean, s.rel_l2_worst,
                  s.rel_l2_mean, s.max_abs_worst, s.max_abs_mean, below ? "  < threshold" : "");
    out += line;
  }
  for (const std::string& k : r.only_in_a) out += "traced only by A: " + k + "\n";
  for (const std::string& k : r.only_in_b) out += "traced only by B: " + k + "\n";
  const bool all_steps = r.steps.size() <= 64;
  out += all_steps ? "steps (token in -> greedy A / B; path A / B):\n" : "steps where the greedy tokens differ:\n";
  for (const StepTokens& t : r.steps) {
    if (!all_steps && t.top1_agree) continue;
    std::snprintf(line, sizeof(line), "  %5lld %-7s %7d -> %7d / %7d  %s / %s%s\n", static_cast<long long>(t.step),
                  t.kind.c_str(), t.token_in, t.greedy_a, t.greedy_b, t.path_a.c_str(), t.path_b.c_str(),
                  t.top1_agree ? "" : "  differ");
    out += line;
  }
  int64_t agree = 0;
  for (const StepTokens& t : r.steps) agree += t.top1_agree;
  out += "summary: top-1 agreement " + fmt(100 * r.top1_agreement, "%.2f") + "% (" + std::to_string(agree) + " of " +
         std::to_string(r.steps.size()) + " steps), min cosine " + fmt(r.min_cosine) + "; ";
  if (r.any_below)
    out += "first below " + fmt(r.config.threshold, "%g") + ": " + r.first_below_name + " layer " +
           std::to_string(r.first_below_layer) + " (cosine " + fmt(r.first_below_cosine) + ")\n";
  else out += "every intermediate at cosine >= " + fmt(r.config.threshold, "%g") + "\n";
  return out;
}

}  // namespace k3::eval
