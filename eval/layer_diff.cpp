// eval/layer_diff.cpp: side specs, the per-tensor comparison and the lock-step run of two sides.
#include "eval/layer_diff.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>

#include "core/error.h"
#include "engine/model_executor.h"
#include "model/local_cache.h"

namespace k3::eval {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::string_view precision_name(kernels::Precision p) { return p == kernels::Precision::fp32 ? "fp32" : "bf16"; }

// Worse of two cosines (lower), NaN sticking; and of two errors (higher), NaN sticking.
double worse_low(double a, double b) { return std::isnan(a) || std::isnan(b) ? kNaN : std::min(a, b); }
double worse_high(double a, double b) { return std::isnan(a) || std::isnan(b) ? kNaN : std::max(a, b); }

// The intermediates one side traced during one step, in emission order. Keys are "name@layer";
// a (name, layer) emitted again in the same step becomes "name#2@layer", ...
struct StepTrace {
  struct Entry {
    std::string name;
    int layer = -1;
    std::vector<float> values;
  };
  std::vector<Entry> entries;
  std::map<std::string, size_t> index;  // key -> entries position

  static std::string key(std::string_view name, int layer) { return std::string(name) + "@" + std::to_string(layer); }

  void add(std::string_view name_in, int layer, const core::TensorView& v) {
    K3_CHECK(v.dtype == core::DType::f32 && v.device == core::Device::cpu,
             "layer_diff: trace '" + std::string(name_in) + "' (layer " + std::to_string(layer) +
                 ") is not a CPU f32 view (ForwardContext::emit should download it)");
    std::string name(name_in);
    for (int n = 2; index.count(key(name, layer)); ++n) name = std::string(name_in) + "#" + std::to_string(n);
    Entry e{name, layer, {}};
    e.values.reserve(static_cast<size_t>(v.numel()));
    if (v.rank() == 2) {  // rows may be strided (a row slice of a wider buffer)
      for (int64_t r = 0; r < v.dim(0); ++r) {
        const float* row = v.as<const float>() + r * v.strides[0];
        for (int64_t c = 0; c < v.dim(1); ++c) e.values.push_back(row[c * v.strides[1]]);
      }
    } else {
      K3_CHECK(v.is_contiguous(),
               "layer_diff: trace '" + name + "' is a non-contiguous rank-" + std::to_string(v.rank()) + " view");
      const auto s = v.span<const float>();
      e.values.assign(s.begin(), s.end());
    }
    index[key(name, layer)] = entries.size();
    entries.push_back(std::move(e));
  }
};

// One side's sequence: its own cache (one sequence, room for the whole run) on the model's device.
class SideRun {
 public:
  SideRun(const runner::ModelRunner& runner, const SideSpec& side, int64_t max_tokens)
      : runner_(runner),
        cache_(runner.config(), 1, max_tokens, side.kv_cache, 16, runner.model().memory(),
               runner.model().options().precision),
        state_(cache_.new_sequence()) {}

  // Runs `tokens` as one step and returns the last row's logits [vocab]; traces into `trace`.
  std::vector<float> step(std::span<const int32_t> tokens, model::StepKind kind, StepTrace* trace) {
    model::TraceFn fn;
    if (trace)
      fn = [trace](std::string_view name, int layer, const core::TensorView& v) { trace->add(name, layer, v); };
    const model::SequenceInput in{tokens, &state_, kind};
    last_route_ = engine::route_batch(runner_.model(), nullptr, {&in, 1});  // the engine's route for it
    const core::Tensor logits = runner_.model().forward(cache_.storage(), {&in, 1}, model::LogitRows::last,
                                                        trace ? &fn : nullptr, nullptr, nullptr, model::LogitsAt::host,
                                                        last_route_.path);
    const auto s = logits.view().span<const float>();
    return {s.begin(), s.end()};
  }
  // The decode path that ran the last step: "fused", "standard", or "standard: <fallback reason>".
  std::string last_path() const {
    const core::StepRoute& r = last_route_;
    return r.path == core::DecodePath::fused ? "fused" : r.fallback.empty() ? "standard" : "standard: " + r.fallback;
  }

 private:
  const runner::ModelRunner& runner_;
  model::LocalCache cache_;
  model::SequenceState state_;
  core::StepRoute last_route_;
};

void check_ids(const runner::ModelRunner& r, std::span<const int32_t> ids) {
  K3_CHECK(!ids.empty(), "layer_diff: the prompt is empty (give at least one token id)");
  for (int32_t id : ids)
    K3_CHECK(id >= 0 && id < r.config().vocab_size, "layer_diff: prompt token id " + std::to_string(id) +
                                                        " is outside the vocabulary [0, " +
                                                        std::to_string(r.config().vocab_size) + ")");
}

// A chunked prefill (chunk > 0): runs every chunk of the prompt but the last on each side,
// untraced, and returns the last chunk, the prefill step that is compared. chunk 0: the prompt.
template <class... Runs>
std::span<const int32_t> prefill_head(Runs&... runs, std::span<const int32_t> prompt, int64_t chunk) {
  if (chunk <= 0) return prompt;
  while (static_cast<int64_t>(prompt.size()) > chunk) {
    const auto head = prompt.first(static_cast<size_t>(chunk));
    (runs.step(head, model::StepKind::prefill, nullptr), ...);
    prompt = prompt.subspan(head.size());
  }
  return prompt;
}

// N greedy tokens of one side on its own: prefill the prompt, then N - 1 decode steps.
std::vector<int32_t> free_run(const runner::ModelRunner& r, const SideSpec& side, std::span<const int32_t> prompt,
                              int64_t prefill_chunk, int64_t n) {
  std::vector<int32_t> out;
  if (n == 0) return out;
  SideRun run(r, side, static_cast<int64_t>(prompt.size()) + n);
  out.push_back(
      greedy_token(run.step(prefill_head<SideRun>(run, prompt, prefill_chunk), model::StepKind::prefill, nullptr)));
  while (static_cast<int64_t>(out.size()) < n)
    out.push_back(greedy_token(run.step({&out.back(), 1}, model::StepKind::decode, nullptr)));
  return out;
}

// Accumulates the per-(name, layer) summaries in order of first appearance.
class SummaryBuilder {
 public:
  void add(const StepRow& row) {
    const std::string k = StepTrace::key(row.name, row.layer);
    auto [it, fresh] = index_.emplace(k, layers_.size());
    if (fresh) {
      layers_.push_back({row.name, row.layer, 0, 1, 0, 0, 0, 0, 0});
      sums_.push_back({});
    }
    LayerSummary& s = layers_[it->second];
    Sums& sum = sums_[it->second];
    const DiffStats& d = row.stats;
    s.cosine_worst = s.steps == 0 ? d.cosine : worse_low(s.cosine_worst, d.cosine);
    s.rel_l2_worst = s.steps == 0 ? d.rel_l2 : worse_high(s.rel_l2_worst, d.rel_l2);
    s.max_abs_worst = s.steps == 0 ? d.max_abs : worse_high(s.max_abs_worst, d.max_abs);
    sum.cosine += d.cosine;
    sum.rel_l2 += d.rel_l2;
    sum.max_abs += d.max_abs;
    ++s.steps;
  }
  std::vector<LayerSummary> finish() {
    for (size_t i = 0; i < layers_.size(); ++i) {
      const double n = static_cast<double>(layers_[i].steps);
      layers_[i].cosine_mean = sums_[i].cosine / n;
      layers_[i].rel_l2_mean = sums_[i].rel_l2 / n;
      layers_[i].max_abs_mean = sums_[i].max_abs / n;
    }
    return layers_;
  }

 private:
  struct Sums {
    double cosine = 0, rel_l2 = 0, max_abs = 0;
  };
  std::map<std::string, size_t> index_;
  std::vector<LayerSummary> layers_;
  std::vector<Sums> sums_;
};

void fill_summary(LayerDiffReport& r) {
  int64_t agree = 0;
  for (const StepTokens& s : r.steps) {
    agree += s.top1_agree;
    if (!s.top1_agree && r.first_disagreeing_step < 0) r.first_disagreeing_step = s.step;
  }
  r.top1_agreement = r.steps.empty() ? 1.0 : static_cast<double>(agree) / static_cast<double>(r.steps.size());
  r.min_cosine = 1;
  for (const StepRow& row : r.rows) r.min_cosine = worse_low(r.min_cosine, row.stats.cosine);
  for (const LayerSummary& s : r.layers) {
    if (std::isnan(s.cosine_worst) || s.cosine_worst < r.config.threshold) {
      r.any_below = true;
      r.first_below_name = s.name;
      r.first_below_layer = s.layer;
      r.first_below_cosine = s.cosine_worst;
      break;
    }
  }
}

}  // namespace

std::string SideSpec::text() const {
  return std::string("device=") + (device == core::Device::cuda ? "cuda" : "cpu") +
         ",precision=" + std::string(precision_name(precision)) +
         ",decode_backend=" + std::string(model::decode_backend_name(decode_backend)) +
         ",kv_cache=" + (kv_cache == model::KvCacheDtype::fp8_e4m3 ? "fp8" : "bf16") +
         ",kda_prefill=" + (kda_chunked_prefill ? "chunked" : "recurrent");
}

model::ModelOptions SideSpec::model_options() const {
  model::ModelOptions o;
  o.device = device;
  o.precision = precision;
  o.decode_backend = decode_backend;
  o.kda_chunked_prefill = kda_chunked_prefill;
  return o;
}

SideSpec parse_side(std::string_view text) {
  const std::string whole(text);
  auto fail = [&](const std::string& why) { return core::Error("side spec '" + whole + "': " + why); };
  SideSpec s;
  std::set<std::string> seen;
  size_t pos = 0;
  while (pos <= text.size() && !text.empty()) {
    const size_t comma = std::min(text.find(',', pos), text.size());
    const std::string item(text.substr(pos, comma - pos));
    pos = comma + 1;
    const size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0)
      throw fail("'" + item + "' is not key=value (keys: device, precision, decode_backend, kv_cache, kda_prefill)");
    const std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    if (!seen.insert(key).second) throw fail(key + " given twice");
    if (key == "device") {
      if (value != "cpu" && value != "cuda") throw fail("device must be cpu or cuda, got '" + value + "'");
      s.device = value == "cuda" ? core::Device::cuda : core::Device::cpu;
    } else if (key == "precision") {
      if (value != "fp32" && value != "bf16") throw fail("precision must be fp32 or bf16, got '" + value + "'");
      s.precision = value == "fp32" ? kernels::Precision::fp32 : kernels::Precision::bf16;
    } else if (key == "decode_backend") {
      try {
        s.decode_backend = model::parse_decode_backend(value);
      } catch (const core::Error& e) {
        throw fail(e.what());
      }
    } else if (key == "kv_cache") {
      if (value != "bf16" && value != "fp8") throw fail("kv_cache must be bf16 or fp8, got '" + value + "'");
      s.kv_cache = value == "fp8" ? model::KvCacheDtype::fp8_e4m3 : model::KvCacheDtype::bf16;
    } else if (key == "kda_prefill") {
      if (value != "chunked" && value != "recurrent")
        throw fail("kda_prefill must be chunked or recurrent, got '" + value + "'");
      s.kda_chunked_prefill = value == "chunked";
    } else {
      throw fail("unknown key '" + key + "' (keys: device, precision, decode_backend, kv_cache, kda_prefill)");
    }
    if (comma == text.size()) break;
  }
  return s;
}

std::unique_ptr<runner::ModelRunner> open_side(const std::filesystem::path& dir, const SideSpec& side) {
  return runner::ModelRunner::open(dir, side.model_options(), side.kv_cache);
}

DiffStats compare(std::span<const float> a, std::span<const float> b) {
  K3_CHECK(a.size() == b.size(), "layer_diff: compared tensors have " + std::to_string(a.size()) + " and " +
                                     std::to_string(b.size()) + " values");
  DiffStats d;
  d.numel = static_cast<int64_t>(a.size());
  double dot = 0, aa = 0, bb = 0, diff2 = 0, max_abs = 0;
  bool identical = true, finite = true;
  for (size_t i = 0; i < a.size(); ++i) {
    const double x = a[i], y = b[i];
    finite = finite && std::isfinite(x) && std::isfinite(y);
    identical = identical && (x == y);
    dot += x * y;
    aa += x * x;
    bb += y * y;
    const double e = std::fabs(x - y);
    diff2 += e * e;
    max_abs = std::isnan(e) || std::isnan(max_abs) ? kNaN : std::max(max_abs, e);
  }
  if (!finite) return {kNaN, kNaN, kNaN, d.numel};
  if (identical) return {1.0, 0.0, 0.0, d.numel};
  if (aa == 0 || bb == 0) {
    d.cosine = 0;  // one side is all zeros, the other is not
  } else {
    d.cosine = std::clamp(dot / (std::sqrt(aa) * std::sqrt(bb)), -1.0, 1.0);
  }
  d.rel_l2 = aa == 0 ? std::sqrt(diff2) : std::sqrt(diff2) / std::sqrt(aa);
  d.max_abs = max_abs;
  return d;
}

int32_t greedy_token(std::span<const float> logits) {
  int32_t best = -1;
  for (size_t i = 0; i < logits.size(); ++i)
    if (!std::isnan(logits[i]) && (best < 0 || logits[i] > logits[static_cast<size_t>(best)]))
      best = static_cast<int32_t>(i);
  return best;
}

LayerDiffReport run_layer_diff(const runner::ModelRunner& a, const SideSpec& side_a, const runner::ModelRunner& b,
                               const SideSpec& side_b, const LayerDiffConfig& config) {
  K3_CHECK(a.config().hash() == b.config().hash(), "layer_diff: the two sides hold different models (config hash " +
                                                       a.config().hash() + " vs " + b.config().hash() + ")");
  K3_CHECK(a.model().options().device == side_a.device && b.model().options().device == side_b.device &&
               a.model().options().precision == side_a.precision && b.model().options().precision == side_b.precision,
           "layer_diff: a side spec does not match the model it describes (open it with open_side)");
  K3_CHECK(config.prefill_chunk >= 0,
           "layer_diff: the prefill chunk must be >= 0 tokens, got " + std::to_string(config.prefill_chunk));
  K3_CHECK(config.decode_steps >= 0,
           "layer_diff: decode steps must be >= 0, got " + std::to_string(config.decode_steps));
  K3_CHECK(std::isfinite(config.threshold) && config.threshold <= 1,
           "layer_diff: the cosine threshold must be a number <= 1, got " + std::to_string(config.threshold));
  check_ids(a, config.prompt);

  LayerDiffReport r;
  r.side_a = side_a.text();
  r.side_b = side_b.text();
  r.config_hash = a.config().hash();
  r.config = config;
  if (config.free_run) {
    r.mode = "free_run";
    r.tokens_a = free_run(a, side_a, config.prompt, config.prefill_chunk, config.decode_steps);
    r.tokens_b = free_run(b, side_b, config.prompt, config.prefill_chunk, config.decode_steps);
    for (size_t i = 0; i < r.tokens_a.size(); ++i)
      if (r.tokens_a[i] != r.tokens_b[i]) {
        r.first_divergence = static_cast<int64_t>(i);
        break;
      }
    return r;
  }

  r.mode = "teacher_forced";
  const int64_t max_tokens = static_cast<int64_t>(config.prompt.size()) + std::max<int64_t>(config.decode_steps, 1);
  SideRun run_a(a, side_a, max_tokens), run_b(b, side_b, max_tokens);
  SummaryBuilder summary;
  std::set<std::string> only_a, only_b;
  int32_t next = config.prompt.back();
  for (int64_t step = 0; step <= config.decode_steps; ++step) {
    const bool prefill = step == 0;
    const std::span<const int32_t> tokens = prefill ? std::span<const int32_t>(config.prompt) : std::span(&next, 1);
    const model::StepKind kind = prefill ? model::StepKind::prefill : model::StepKind::decode;
    StepTrace trace_a, trace_b;
    const bool traced = !prefill || config.trace_prefill;
    const std::span<const int32_t> last =
        prefill ? prefill_head<SideRun, SideRun>(run_a, run_b, tokens, config.prefill_chunk) : tokens;
    const std::vector<float> logits_a = run_a.step(last, kind, traced ? &trace_a : nullptr);
    const std::vector<float> logits_b = run_b.step(last, kind, traced ? &trace_b : nullptr);
    if (!traced) r.rows.push_back({step, "logits", -1, compare(logits_a, logits_b)});  // summarized below

    for (const auto& ea : trace_a.entries) {
      const auto it = trace_b.index.find(StepTrace::key(ea.name, ea.layer));
      if (it == trace_b.index.end()) {
        only_a.insert(StepTrace::key(ea.name, ea.layer));
        continue;
      }
      const auto& eb = trace_b.entries[it->second];
      K3_CHECK(ea.values.size() == eb.values.size(), "layer_diff: step " + std::to_string(step) + " '" + ea.name +
                                                         "' layer " + std::to_string(ea.layer) + " has " +
                                                         std::to_string(ea.values.size()) + " values on side A and " +
                                                         std::to_string(eb.values.size()) + " on side B");
      r.rows.push_back({step, ea.name, ea.layer, compare(ea.values, eb.values)});
      summary.add(r.rows.back());
    }
    for (const auto& eb : trace_b.entries)
      if (!trace_a.index.count(StepTrace::key(eb.name, eb.layer))) only_b.insert(StepTrace::key(eb.name, eb.layer));
    // An untraced prefill's logits row joins the summaries after the first decode step's rows, so
    // the summaries stay in execution order (logits last).
    if (step == 1 || (step == 0 && config.decode_steps == 0))
      if (!config.trace_prefill) summary.add(r.rows.front());

    StepTokens t;
    t.step = step;
    t.kind = prefill ? "prefill" : "decode";
    t.token_in = tokens.back();
    t.greedy_a = greedy_token(logits_a);
    t.greedy_b = greedy_token(logits_b);
    t.path_a = run_a.last_path();
    t.path_b = run_b.last_path();
    t.top1_agree = t.greedy_a == t.greedy_b && t.greedy_a >= 0;
    r.steps.push_back(t);
    next = t.greedy_a >= 0 ? t.greedy_a : 0;  // an all-NaN side A still feeds a valid id
  }
  r.layers = summary.finish();
  r.only_in_a.assign(only_a.begin(), only_a.end());
  r.only_in_b.assign(only_b.begin(), only_b.end());
  fill_summary(r);
  return r;
}

}  // namespace k3::eval
