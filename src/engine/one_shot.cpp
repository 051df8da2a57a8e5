// engine/one_shot.cpp: generate and logits as one engine request.
#include "engine/one_shot.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>

#include "core/error.h"
#include "engine/engine.h"
#include "engine/model_executor.h"
#include "engine/tp_executor.h"
#include "fastpath/fused_decode.h"
#include "runner/model_runner.h"
#include "runner/tp_runner.h"

namespace k3::engine {

namespace {
using Clock = std::chrono::steady_clock;
constexpr int32_t kPageTokens = 16;  // per rank
using AroundStep = std::function<void(const Engine&, int, bool)>;

void check_ids(std::span<const int32_t> tokens, int64_t vocab) {
  K3_CHECK(!tokens.empty(), "no token ids given");
  for (int32_t id : tokens)
    K3_CHECK(id >= 0 && id < vocab,
             "token id " + std::to_string(id) + " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
}

// One sequence of up to `len` tokens whose prompt of `prompt_len` tokens prefills in one step.
EngineConfig one_sequence(const config::K3Config& model, int64_t len, int64_t prompt_len, int dcp) {
  EngineConfig ec;
  ec.cache.block_size = kPageTokens * dcp;  // a scheduler block: kPageTokens local positions per rank
  ec.cache.num_blocks = static_cast<int32_t>((len + ec.cache.block_size - 1) / ec.cache.block_size);
  ec.cache.num_slots = 1;
  ec.cache.enable_prefix_cache = false;
  ec.scheduler.max_num_seqs = 1;
  ec.scheduler.max_model_len = len;
  apply_model_defaults(model, ec.scheduler, ec.cache, &ec.eos_token_id);
  const auto whole = static_cast<int32_t>(std::max<int64_t>(prompt_len, ec.scheduler.chunk_align(ec.cache)));
  ec.scheduler.max_num_batched_tokens = whole;  // alone in its steps: the prompt takes all of it
  ec.scheduler.max_partial_prefills = 1;
  ec.scheduler.validate(ec.cache);
  return ec;
}

std::unique_ptr<Executor> executor_for(const runner::ModelRunner& r, const cache::CacheConfig& c) {
  return std::make_unique<ModelExecutor>(r.model(), c, r.kv_cache());
}
std::unique_ptr<Executor> executor_for(const runner::TpRunner& r, const cache::CacheConfig& c) {
  return std::make_unique<TpExecutor>(r, c, r.kv_cache());
}
int dcp_of(const runner::ModelRunner&) { return 1; }  // context parallelism needs several ranks
int dcp_of(const runner::TpRunner& r) { return r.dcp(); }

// Runs `request` (up to `len` tokens in all) alone to its end. `around_step(engine, i, after)` is
// called before step i and after it, if it ran. Returns the routes of the steps that ran.
template <class Runner>
core::DecodePathCounters run_alone(const Runner& runner, int64_t len, GenerateRequest request,
                                   const AroundStep& around_step = nullptr) {
  const EngineConfig ec = one_sequence(runner.config(), len, static_cast<int64_t>(request.prompt.size()),
                                       dcp_of(runner));
  Engine engine(ec, executor_for(runner, ec.cache));
  const Engine::Submission sub = engine.submit(std::move(request));
  for (int i = 0;; ++i) {
    if (around_step) around_step(engine, i, false);
    if (!engine.step()) break;
    if (around_step) around_step(engine, i, true);
  }
  std::optional<TokenEvent> last;
  while (std::optional<TokenEvent> e = sub.stream->try_next()) last = std::move(e);
  K3_CHECK(last && last->finished, "one-shot request: the engine went idle before the request finished");
  if (last->reason == FinishReason::error) throw core::Error(last->error);
  return engine.stats().decode_paths;
}

template <class Runner>
std::vector<int32_t> generate_alone(const Runner& runner, std::span<const int32_t> prompt, int64_t max_tokens,
                                    const runner::SamplingParams& sampling,
                                    const std::function<void(int32_t)>& on_token, GenerateStats* stats,
                                    const AroundStep& around_step) {
  check_ids(prompt, runner.config().vocab_size);
  K3_CHECK(max_tokens >= 0, "max_tokens must be >= 0, got " + std::to_string(max_tokens));
  GenerateStats st;
  st.prompt_tokens = static_cast<int64_t>(prompt.size());
  std::vector<int32_t> out;
  if (max_tokens > 0) {
    GenerateRequest req;
    req.prompt.assign(prompt.begin(), prompt.end());
    req.sampling = sampling;
    req.max_tokens = max_tokens;
    auto t0 = Clock::now(), first = t0;  // t0: the first step starts (the engine and its cache exist)
    req.on_event = [&](const TokenEvent& e) {
      if (e.token < 0) return;
      if (out.empty()) first = Clock::now();
      out.push_back(e.token);
      if (on_token) on_token(e.token);
    };
    const auto timed = [&](const Engine& engine, int i, bool after) {
      if (around_step) around_step(engine, i, after);
      if (i == 0 && !after) t0 = first = Clock::now();
    };
    st.decode_paths = run_alone(runner, st.prompt_tokens + max_tokens, std::move(req), timed);
    st.prefill_seconds = std::chrono::duration<double>(first - t0).count();
    st.decode_seconds = std::chrono::duration<double>(Clock::now() - first).count();
  }
  st.generated_tokens = static_cast<int64_t>(out.size());
  if (stats) *stats = st;
  return out;
}

template <class Runner>
core::Tensor logits_alone(const Runner& runner, std::span<const int32_t> tokens, int64_t decode_from,
                          core::DecodePathCounters* paths) {
  const int64_t V = runner.config().vocab_size;
  check_ids(tokens, V);
  const auto T = static_cast<int64_t>(tokens.size());
  K3_CHECK(decode_from >= 1 && decode_from <= T, "--decode-from must be in [1, " + std::to_string(T) +
                                                     "] (the first token is always a prefill), got " +
                                                     std::to_string(decode_from));
  core::Tensor out = core::Tensor::zeros(core::DType::f32, {T, V});
  // The prompt is the first decode_from tokens, every row kept; output token i is forced to
  // tokens[decode_from + i], and the one sampled after the last forced token (row T - 1's step)
  // ends the request.
  GenerateRequest req;
  req.prompt.assign(tokens.begin(), tokens.begin() + decode_from);
  req.forced_output.assign(tokens.begin() + decode_from, tokens.end());
  req.max_tokens = T - decode_from + 1;
  req.ignore_eos = true;
  req.prompt_logits = true;
  int64_t rows = 0;
  req.on_logits = [&](int64_t position, std::span<const float> row) {
    if (position >= T) return;
    std::memcpy(out.data<float>() + position * V, row.data(), row.size_bytes());
    ++rows;
  };
  const core::DecodePathCounters ran = run_alone(runner, T + 1, std::move(req));
  if (paths) *paths = ran;
  K3_CHECK(rows == T, "logits: the engine returned " + std::to_string(rows) + " of " + std::to_string(T) + " rows");
  return out;
}
}  // namespace

std::vector<int32_t> generate(runner::ModelRunner& runner, std::span<const int32_t> prompt, int64_t max_tokens,
                              const runner::SamplingParams& sampling, const std::function<void(int32_t)>& on_token,
                              GenerateStats* stats, const std::function<void(const std::string&)>& explain) {
  if (!explain) return generate_alone(runner, prompt, max_tokens, sampling, on_token, stats, nullptr);
  // Steps 0 and 1 are the prefill and the first decode (the prompt prefills in one step).
  kernels::OpRecorder recorder;
  runner.set_op_recorder(&recorder);
  const auto around = [&](const Engine& engine, int i, bool after) {
    if (i > 1) return;
    if (!after) {
      recorder.start();
      return;
    }
    const std::vector<kernels::OpRecorder::Call> calls = recorder.stop();
    const std::string what = i == 0 ? "prefill step, " + std::to_string(prompt.size()) + " tokens"
                                    : "first decode step, 1 row";
    explain(what + ": " + fastpath::explain_step(engine.last_route(), calls, runner.config().num_hidden_layers));
  };
  struct Unset {
    runner::ModelRunner& r;
    ~Unset() { r.set_op_recorder(nullptr); }
  } unset{runner};
  return generate_alone(runner, prompt, max_tokens, sampling, on_token, stats, around);
}

std::vector<int32_t> generate(const runner::TpRunner& runner, std::span<const int32_t> prompt, int64_t max_tokens,
                              const runner::SamplingParams& sampling, const std::function<void(int32_t)>& on_token,
                              GenerateStats* stats) {
  return generate_alone(runner, prompt, max_tokens, sampling, on_token, stats, nullptr);
}

core::Tensor logits(const runner::ModelRunner& runner, std::span<const int32_t> tokens, int64_t decode_from,
                    core::DecodePathCounters* paths) {
  return logits_alone(runner, tokens, decode_from, paths);
}
core::Tensor logits(const runner::TpRunner& runner, std::span<const int32_t> tokens, int64_t decode_from,
                    core::DecodePathCounters* paths) {
  return logits_alone(runner, tokens, decode_from, paths);
}

}  // namespace k3::engine
