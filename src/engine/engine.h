// engine/engine.h: the serving engine's facade and its step loop.
//
//   submit(request) -> {id, stream}   validated at once (core::Error naming the parameter)
//   abort(id)                         takes effect at the next step, in any state
//   stats()                           a snapshot, published after every step
//
// Each step: admit (drain submissions and aborts) -> [speculative: propose drafts for every
// decoding request (spec::Drafter), which the scheduler verifies as K+1-row decodes]
// -> schedule (Scheduler: data-only output)
// (the step's one plan, scheduler/step_plan.h) -> run (Executor: prepare slots, forward, save
// checkpoints) -> sample
// (one runner::Sampler per request) -> update (Scheduler: advance, register prefix blocks,
// finish) -> deliver events. With speculation a verify sequence's rows are accepted
// (spec/acceptance.h: greedy, or rejection sampling with the request's own Rng; lossless), the
// executor commits the accepted rows (KDA replay, MLA truncation), and the request gets one event
// per new token (several per step). The loop runs on its own thread (start/stop) or is stepped
// synchronously (step, run_until_idle) by tests and benchmarks; never both at once.
#pragma once
#include <array>
#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "engine/executor.h"
#include "engine/prefill_progress.h"
#include "engine/shadow_validation.h"
#include "engine/step_masks.h"
#include "engine/token_stream.h"
#include "runner/sampler.h"
#include "scheduler/scheduler.h"
#include "spec/acceptance.h"
#include "spec/draft_length.h"
#include "spec/spec_config.h"
#include "spec/speculation_gate.h"
#include "structured/matcher.h"

namespace k3::runner {
struct SampleRow;  // runner/device_sampler.h
}
namespace k3::backends::cpu {
class ThreadPool;
}

namespace k3::engine {

struct GenerateRequest {
  std::vector<int32_t> prompt;  // token ids in [0, vocab)
  runner::SamplingParams sampling;
  int64_t max_tokens = 16;              // >= 1; prompt + max_tokens <= max_model_len
  std::vector<int32_t> stop_token_ids;  // ids in [0, vocab)
  bool ignore_eos = false;
  // When set, the request's events go here, called on the step thread (keep it short; it
  // must not call into the engine); the stream then gets only the last event.
  std::function<void(const TokenEvent&)> on_event;

  // Scoring (the CLI's teacher-forced logits; vLLM's prompt_logprobs). When set, on_logits gets
  // every logits row the request's steps computed and kept, once per position p (the host f32
  // [vocab] logits after token p, which predict token p + 1), in position order, on the step thread:
  // the rows it samples from, and with prompt_logits every prompt position's too. Its steps then
  // bring their logits to the host.
  std::function<void(int64_t position, std::span<const float> logits)> on_logits;
  bool prompt_logits = false;  // needs on_logits
  // Teacher forcing: output token i is forced_output[i] instead of a sample (its event's logprob
  // is NaN; logprobs cannot be asked for). Ids in [0, vocab), at most max_tokens of them. A request
  // with forced tokens or a logits sink is never drafted for under speculative decoding.
  std::vector<int32_t> forced_output;
  // Constrained decoding (structured/): every sampled token is one the grammar allows, and the
  // output ends only where the grammar may (its vocabulary's end tokens). Its vocabulary must be
  // the model's; not with ignore_eos or forced_output.
  std::shared_ptr<const structured::CompiledGrammar> grammar;
};

struct EngineConfig {
  scheduler::SchedulerConfig scheduler;
  cache::CacheConfig cache;   // sized (see engine/model_executor.h size_model_cache)
  int32_t eos_token_id = -1;  // the model's; -1: none
  // Speculative decoding (spec/spec_config.h). With a method other than none the Engine needs a
  // drafter (made from this for ngram and synthetic, or given to the constructor) and an
  // executor that supports verify steps.
  spec::SpeculativeConfig speculative;
  // Shadow validation (engine/shadow_validation.h): this share of the fused steps, in [0, 1], also
  // runs the standard path on the same inputs and compares the logits. Needs an executor whose
  // decode backend is latency_specialized.
  double shadow_validate_rate = 0;
};

struct EngineStats {
  int32_t running = 0, waiting = 0;
  uint64_t steps = 0;
  int64_t submitted = 0, finished = 0, aborted = 0, failed = 0;
  int64_t prompt_tokens = 0, prefix_hit_tokens = 0;  // at first admission
  int64_t prefill_tokens = 0, decode_tokens = 0;     // computed, recomputation included
  int64_t generated_tokens = 0, preemptions = 0;
  cache::CacheUsage cache;
  double host_seconds = 0, executor_seconds = 0;  // summed over steps
  // Speculative decoding (vLLM's spec_decode counters). spec_method "" when off; "synthetic" means
  // acceptance was forced (benchmarks; outputs are not the model's distribution).
  std::string spec_method;
  bool spec_synthetic = false;
  int64_t spec_num_drafts = 0;                 // verify steps of one request with >= 1 draft
  int64_t spec_num_draft_tokens = 0;           // drafts verified
  int64_t spec_num_accepted_tokens = 0;        // drafts accepted
  std::vector<int64_t> spec_accepted_per_pos;  // [K]: draft position i accepted this many times
  // Decode steps the speculation gate ran plainly because drafting was measured not to pay there
  // (spec/speculation_gate.h; adaptive speculation only).
  int64_t spec_gated_steps = 0;
  // Model steps per decode path (decode_backend latency_specialized: fused or standard) and the
  // fused path's fallbacks by reason.
  core::DecodePathCounters decode_paths;
  ShadowCounters shadow;  // shadow validation's results (all zero when off)
  // Tokens per model step (prefill + decode rows, recomputation and verified drafts included),
  // by power of two: [i] counts steps of 2^(i-1) < tokens <= 2^i ([0]: one token), the last
  // entry every larger step. The sum over steps is prefill_tokens + decode_tokens. (vLLM's
  // vllm:iteration_tokens_total bounds are powers of two, so /metrics folds this into them.)
  static constexpr size_t kStepTokenBuckets = 16;  // up to 2^14 = 16384, then the rest
  std::array<int64_t, kStepTokenBuckets> step_tokens_log2{};
  // Host time per model step (the step's time outside the executor: scheduling, sampling, events),
  // by power of two of microseconds: [i] counts steps of 2^(i-1) < us <= 2^i ([0]: up to 1 us),
  // the last entry every longer step; step_host_seconds is their sum (host_seconds also counts idle
  // polls of the inbox).
  static constexpr size_t kStepHostBuckets = 18;  // up to 2^16 us = 65.5 ms, then the rest
  std::array<int64_t, kStepHostBuckets> step_host_us_log2{};
  double step_host_seconds = 0;
};

class Engine {
 public:
  // `drafter`: for speculative decoding with a drafter make_drafter cannot build (dspark) or a
  // test's own; null: made from config.speculative (none: no speculation).
  Engine(const EngineConfig& config, std::unique_ptr<Executor> executor,
         std::unique_ptr<spec::Drafter> drafter = nullptr);
  ~Engine();  // stops the loop and aborts what is left, so no stream waits forever
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  struct Submission {
    RequestId id = 0;
    std::shared_ptr<TokenStream> stream;
  };
  // Thread-safe. Throws core::Error naming the bad parameter.
  Submission submit(GenerateRequest request);
  // Thread-safe. False when the id is unknown or already finished.
  bool abort(RequestId id);
  EngineStats stats() const;

  // One step on the caller's thread; false when there was nothing to do.
  bool step();
  void run_until_idle();
  // The loop on its own thread, sleeping while idle.
  void start();
  void stop();
  // Where long prefills report their progress (engine/prefill_progress.h); none by default. Set
  // before start().
  void set_prefill_log(PrefillProgress::Log log) { progress_ = PrefillProgress(std::move(log)); }

  const EngineConfig& config() const { return config_; }
  Executor& executor() { return *executor_; }
  // For tests stepping synchronously.
  const scheduler::Scheduler& scheduler() const { return scheduler_; }
  // The route of the last step planned (decode path, fallback reason, graph bucket); on the step
  // thread.
  const core::StepRoute& last_route() const { return out_.route; }

 private:
  struct Pending {
    RequestId id;
    scheduler::RequestSpec spec;
    scheduler::Clock::time_point arrival;
  };
  struct Context {
    std::unique_ptr<runner::Sampler> sampler;
    std::shared_ptr<TokenStream> stream;
    std::function<void(const TokenEvent&)> on_event;
    spec::SpecCounters spec;  // this request's verify steps (reported on its last event)
    std::function<void(int64_t, std::span<const float>)> on_logits;
    int64_t logits_next = 0;  // positions below it went to on_logits already (recomputation repeats them)
    std::vector<int32_t> forced_output;
    std::unique_ptr<structured::Matcher> matcher;  // constrained requests
    bool scoring() const { return on_logits || !forced_output.empty(); }
  };
  void validate(const GenerateRequest& r) const;
  void drain_inbox();
  // Counts events_ into the stats, publishes them, then hands every event to its client: a
  // client that has its last token already finds it in stats() (and /metrics).
  void deliver_events(double host_s, double exec_s, const std::string& error);
  void deliver(const scheduler::RequestEvent& e, runner::SampleResult* sample, const std::string& error);
  void publish_stats(double host_s, double exec_s);
  void set_up_speculation();
  // Counts a step that ran on `route` (stats().decode_paths), logging the first of each kind.
  void count_route(const core::StepRoute& route);
  // Counts a shadow-validated step's report, logging it when it diverged.
  void count_shadow(const ShadowReport& report);
  void propose_drafts();
  // Samples plan row(s) of sequence i into samples_/sampled_/accepted_ (verify: acceptance).
  void sample_sequence(const StepPlan& plan, size_t i, const float* rows);
  void accept_constrained(structured::Matcher& m, int32_t token);
  // A constrained verify sequence's rows with each row's grammar mask (masks_) applied (masked_rows_).
  std::span<const float> mask_verify_rows(const scheduler::ScheduledSequence& q, std::span<const float> rows);
  // Hands sequence i's logits rows (its plan.seqs[i].logit_rows(), from `rows`) to its on_logits.
  void hand_out_logits(const StepPlan& plan, size_t i, const float* rows);
  void forget(RequestId id);  // drafter and draft-length state of a request that left or was preempted
  // After a step: the drafter sees each sequence's committed tap rows, then its verify results.
  void notify_drafter(const StepPlan& plan);
  void loop();

  EngineConfig config_;
  std::unique_ptr<Executor> executor_;
  scheduler::Scheduler scheduler_;
  PrefillProgress progress_;  // step thread only
  int32_t vocab_;

  // Shared with submitters (inbox_mu_).
  mutable std::mutex inbox_mu_;
  std::condition_variable inbox_cv_;
  std::vector<Pending> new_;
  std::vector<std::pair<RequestId, Context>> new_contexts_;
  std::vector<RequestId> aborts_;
  std::unordered_set<RequestId> live_;
  RequestId next_id_ = 1;
  bool stop_ = false;
  int64_t submitted_ = 0;

  // Step-loop state (step_mu_: one step at a time).
  std::mutex step_mu_;
  std::unordered_map<RequestId, Context> contexts_;
  scheduler::StepPlan out_;
  std::vector<scheduler::RequestEvent> events_;
  std::vector<int32_t> sampled_;
  std::vector<runner::SampleResult> samples_;
  std::vector<runner::SampleRow> sample_rows_;  // device logits: the rows to sample
  std::atomic<bool> has_work_{false};
  // Speculative decoding (null drafter_: off).
  std::unique_ptr<spec::Drafter> drafter_;
  std::unique_ptr<spec::DraftLengthController> draft_length_;
  std::unique_ptr<spec::SpeculationGate> gate_;  // null: speculation not adaptive (always drafts)
  int32_t synthetic_al_ = 0;                     // > 0: synthetic acceptance of AL - 1 drafts
  spec::SpecCounters spec_counters_;
  std::vector<const scheduler::Request*> decoding_;
  std::vector<spec::DraftQuery> queries_;
  std::vector<spec::Draft> drafts_;
  std::vector<int32_t> accepted_, verify_rows_, scratch_;
  std::vector<int32_t> seq_accepted_;               // per plan sequence: accepted drafts (-1: not a verify)
  std::vector<structured::Matcher*> row_matchers_;  // device sampling: each sampled row's (or null)
  // The step's grammar masks (the plan's mask rows), filled while the executor runs the step.
  StepMasks masks_;
  std::vector<float> masked_rows_;         // a constrained verify sequence's rows, masked
  bool taps_on_ = false;                   // the drafter observes the target's hidden states
  core::DecodePathCounters decode_paths_;  // the routes of the steps that ran
  ShadowCounters shadow_;
  spec::Verified verified_;
  int64_t aborted_ = 0, failed_ = 0, generated_ = 0;
  double host_seconds_ = 0, executor_seconds_ = 0;
  std::array<int64_t, EngineStats::kStepTokenBuckets> step_tokens_log2_{};
  std::array<int64_t, EngineStats::kStepHostBuckets> step_host_us_log2_{};
  double step_host_seconds_ = 0;
  int64_t step_tokens_counted_ = 0;  // prefill + decode tokens already in step_tokens_log2_

  mutable std::mutex stats_mu_;
  EngineStats stats_;
  std::thread thread_;
};

}  // namespace k3::engine
