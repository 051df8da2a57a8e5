// eval/layer_diff.h: the layer-by-layer diff of one model run two ways ("sides": device,
// precision, decode backend, KV cache dtype), the evidence behind issue 6 item 4.
//
// Teacher-forced mode: both sides get the same tokens (the prompt as one prefill step, then N
// single-token decode steps fed with side A's greedy choices: decode steps are what the fast path
// serves). Every named intermediate the model emits through model::TraceFn ("embed", "kda.o",
// "attn.out", "ffn.out", "prefix", "logits", ...; see model/layers/context.h) is compared per step:
// cosine, relative L2 error and max-abs difference. The report holds the raw per-step rows, a
// summary per (name, layer) over all steps (worst and mean), per-step greedy tokens of both sides
// and their top-1 agreement, and the first intermediate (in execution order) whose worst cosine
// falls below a threshold.
//
// Free-run mode: each side generates N greedy tokens on its own (no eos stop, so both lists have
// N tokens); the report gives the first index where they differ ("500-token greedy identical").
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/kv_storage.h"
#include "model/layers/context.h"
#include "runner/model_runner.h"

namespace k3::eval {

// How one side runs the model. Written as "key=value,key=value" (every key optional):
//   device=cpu|cuda  precision=fp32|bf16  decode_backend=auto|latency_specialized
//   kv_cache=bf16|fp8  kda_prefill=chunked|recurrent
struct SideSpec {
  core::Device device = core::Device::cpu;
  kernels::Precision precision = kernels::Precision::bf16;
  model::DecodeBackend decode_backend = model::DecodeBackend::standard;
  model::KvCacheDtype kv_cache = model::KvCacheDtype::bf16;
  bool kda_chunked_prefill = true;

  // Canonical text with every key, e.g. "device=cpu,precision=bf16,decode_backend=auto,kv_cache=bf16,kda_prefill=chunked".
  std::string text() const;
  model::ModelOptions model_options() const;
  bool operator==(const SideSpec&) const = default;
};
// Throws core::Error naming the bad item ("side spec 'device=tpu': device must be cpu or cuda").
SideSpec parse_side(std::string_view text);

// Loads DIR on the side's device with the side's options (runner::ModelRunner::open).
std::unique_ptr<runner::ModelRunner> open_side(const std::filesystem::path& dir, const SideSpec& side);

// How far b is from a (a is the reference): both flattened, accumulated in double.
struct DiffStats {
  double cosine = 0;   // dot(a, b) / (|a| |b|); 1 when a == b bitwise; NaN when either is non-finite
  double rel_l2 = 0;   // |a - b| / |a| (|a - b| when |a| = 0)
  double max_abs = 0;  // max |a_i - b_i|
  int64_t numel = 0;
};
// Throws core::Error when the lengths differ.
DiffStats compare(std::span<const float> a, std::span<const float> b);

// One intermediate of one step. A name traced twice in one step for the same layer gets "#2", ...
struct StepRow {
  int64_t step = 0;
  std::string name;
  int layer = -1;  // -1: not a decoder layer ("embed", "logits")
  DiffStats stats;
};

// One (name, layer) over every step it was traced on both sides, in execution order.
struct LayerSummary {
  std::string name;
  int layer = -1;
  int64_t steps = 0;
  double cosine_worst = 1, cosine_mean = 1;
  double rel_l2_worst = 0, rel_l2_mean = 0;
  double max_abs_worst = 0, max_abs_mean = 0;
};

// The tokens of one step. Step 0 is the prompt's prefill (token_in: its last token); step i > 0
// is decode step i, fed token_in (side A's greedy choice of step i - 1).
struct StepTokens {
  int64_t step = 0;
  std::string kind;  // "prefill" | "decode"
  int32_t token_in = -1;
  int32_t greedy_a = -1, greedy_b = -1;  // argmax of each side's logits (first maximum)
  bool top1_agree = false;
  // The decode path each side's step ran: "fused", "standard" or "standard: <fallback reason>"
  // (decode_backend latency_specialized falls back per step: the route the engine gives it).
  std::string path_a, path_b;
};

struct LayerDiffConfig {
  std::vector<int32_t> prompt;  // at least one token
  int64_t decode_steps = 16;    // teacher-forced: decode steps after the prefill; free run: tokens
  double threshold = 0.999;     // cosine below this flags an intermediate
  bool free_run = false;
  // false: the prefill step compares only its returned last-row logits (as "logits"), not every
  // [prompt, width] intermediate (a 32K-token prompt would download gigabytes per side).
  bool trace_prefill = true;
  // > 0: the prompt is prefilled in steps of at most this many tokens, as the engine's chunked
  // prefill runs a long prompt; only the last chunk is traced and compared. 0: one step.
  int64_t prefill_chunk = 0;
};

struct LayerDiffReport {
  std::string mode;            // "teacher_forced" | "free_run"
  std::string side_a, side_b;  // SideSpec::text()
  std::string model;           // where the weights came from (a folder, or "k3-tiny seed 0 (temporary)")
  std::string config_hash;
  nlohmann::json environment = nlohmann::json::object();  // evidence::environment(): git sha, build, host, GPUs
  LayerDiffConfig config;

  // Teacher-forced mode.
  std::vector<StepRow> rows;         // every (step, name, layer), in execution order per step
  std::vector<LayerSummary> layers;  // per (name, layer), in execution order
  std::vector<StepTokens> steps;
  std::vector<std::string> only_in_a, only_in_b;  // "name@layer" traced by one side only (any step)
  double top1_agreement = 1;                      // fraction of steps whose greedy tokens agree
  int64_t first_disagreeing_step = -1;            // -1: none
  double min_cosine = 1;                          // over every row (NaN when any row is NaN)
  bool any_below = false;                         // some (name, layer) has worst cosine < threshold (or NaN)
  std::string first_below_name;                   // the first such in execution order
  int first_below_layer = -1;
  double first_below_cosine = 1;

  // Free-run mode.
  std::vector<int32_t> tokens_a, tokens_b;
  int64_t first_divergence = -1;  // first index where tokens_a and tokens_b differ; -1: identical

  bool operator==(const LayerDiffReport&) const;
};

// Runs the comparison on two loaded sides (they must hold the same model: the config hashes are
// checked). `side_a`/`side_b` give the KV cache dtype and are recorded in the report. The report's
// model/environment fields are left for the caller.
LayerDiffReport run_layer_diff(const runner::ModelRunner& a, const SideSpec& side_a, const runner::ModelRunner& b,
                               const SideSpec& side_b, const LayerDiffConfig& config);

// The JSON bundle (non-finite numbers as the strings "nan", "inf", "-inf") and back.
nlohmann::json to_json(const LayerDiffReport& r);
LayerDiffReport report_from_json(const nlohmann::json& j);  // core::Error naming a missing/bad field

// The human-readable table: one line per (name, layer), the step tokens (every step up to 64
// steps, else only disagreeing ones), and the summary.
std::string format_table(const LayerDiffReport& r);

// Argmax of a logits row, first maximum on ties (NaN never wins); -1 for an all-NaN or empty row.
int32_t greedy_token(std::span<const float> logits);

}  // namespace k3::eval
