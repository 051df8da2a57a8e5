// scheduler/scheduler.h: continuous batching over the request lifecycle (vLLM v1 style).
//
// There are no prefill or decode phases: each running request has num_computed tokens in its
// KV state and a step lets computed tokens catch up with known tokens. One step:
//   1. decodes   every Decoding request gets its one token (scheduled first: never starved)
//   2. prefills  running Prefilling requests get a chunk, in admission order
//   3. admission waiting requests (preempted ones first) take a slot, their prefix hit and a
//                first chunk, while slots, budget, partial-prefill count and pages allow
// A chunk is at most what is left of max_num_batched_tokens; a long prompt (more than
// long_prefill_token_threshold tokens left) takes all of it only when alone in the step (no
// decode rows, no other prompt that could advance), else at most the threshold, and at most
// max_long_partial_prefills long prompts advance per step (shorter ones pass them in the queue,
// looking past at most max_partial_prefills waiting long ones per step).
// When a chunk does not finish the known tokens it ends on a multiple of chunk_align_tokens, and
// with the prefix cache on at the last KDA checkpoint boundary it reaches (when it reaches one),
// where a checkpoint is taken (the state is copied after the step, so the step must end there).
// When pages run out, the latest admitted request not yet scheduled this step is preempted
// (recompute: everything freed, re-queued at the front); if there is none the request itself is.
#pragma once
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cache/kv_cache_manager.h"
#include "scheduler/request.h"
#include "scheduler/scheduler_config.h"
#include "scheduler/step_plan.h"

namespace k3::scheduler {

// Something that happened to a request in a step: a new token, a finish, or both.
struct RequestEvent {
  RequestId id = 0;
  int32_t token = -1;  // the new token; -1 when none (abort, error)
  bool finished = false;
  FinishReason reason = FinishReason::stop;  // when finished
  RequestStats stats;                        // complete when finished; the first token's event has those known then
  int32_t sample_index = -1;                 // update(): the index of `token` in its `sampled` span (-1: none)
};

// Totals since start (the step loop's own counters; the engine publishes them).
struct SchedulerCounters {
  uint64_t steps = 0;
  int64_t decode_tokens = 0, prefill_tokens = 0;
  int64_t preemptions = 0;
  int64_t admitted_prompt_tokens = 0, prefix_hit_tokens = 0;  // first admissions only
  int64_t finished = 0;
};

class Scheduler {
 public:
  Scheduler(const SchedulerConfig& config, const cache::CacheConfig& cache);

  const SchedulerConfig& config() const { return config_; }
  const cache::KvCacheManager& cache() const { return cache_; }
  const SchedulerCounters& counters() const { return counters_; }

  // Queues a request. Throws core::Error for a duplicate id or a spec that can never run
  // (empty prompt, max_tokens < 1, prompt + max_tokens over max_model_len).
  void add(RequestId id, RequestSpec spec, Clock::time_point arrival = Clock::now());
  // Finishes the request with `abort` in whatever state it is, freeing what it holds; false
  // when unknown (or already finished). Not while a step is in flight.
  bool abort(RequestId id, std::vector<RequestEvent>& events);

  // Speculative decoding: the Decoding requests (running, admission order), for the engine to
  // propose drafts for, and the drafts for one of them. schedule() verifies at most as many as
  // fit the token budget (leaving one row for every later decode), max_tokens, max_model_len,
  // the free pages (drafts never cause a preemption) and the next KDA checkpoint boundary (a
  // verify step never ends on one: a checkpoint is only saved from committed state), then clears
  // them. Drafts of a request that is not Decoding are ignored.
  void decoding_requests(std::vector<const Request*>& out) const;
  void set_drafts(RequestId id, std::span<const int32_t> drafts);

  // What the executor runs (its decode path, fused scope and graph shapes): every plan's route is
  // chosen from it (scheduler/step_route.h). The default scope: standard path, no graphs.
  void set_execution_scope(ExecutionScope scope) { scope_ = std::move(scope); }
  // Plans the next step into `out` (cleared first; reuse it across steps), with its route.
  void schedule(StepPlan& out);
  // Applies a step's results: `sampled` has one token per sequence with sample = true, in
  // order. Advances computed tokens, registers full blocks and checkpoints in the prefix
  // cache, appends tokens, finishes requests (stop / length), and appends their events.
  void update(const StepPlan& out, std::span<const int32_t> sampled, std::vector<RequestEvent>& events);
  // The same with verify sequences: `accepted[j]` drafts of the j-th sampling sequence were
  // accepted (0 for plain ones), and `sampled` holds accepted[j] + 1 tokens for it (the accepted
  // drafts, then the target's own token). Its computed tokens advance by accepted[j] + 1; the
  // tokens are appended one by one, each with its event, until one finishes the request (stop
  // token, max_tokens, max_model_len): the rest are dropped.
  void update(const StepPlan& out, std::span<const int32_t> sampled, std::span<const int32_t> accepted,
              std::vector<RequestEvent>& events);
  // The step failed: every request in it finishes with `error` (and frees what it holds).
  void fail_step(const StepPlan& out, std::vector<RequestEvent>& events);

  const Request* find(RequestId id) const;
  int32_t num_waiting() const { return static_cast<int32_t>(waiting_.size()); }
  int32_t num_running() const { return static_cast<int32_t>(running_.size()); }
  bool has_work() const { return !waiting_.empty() || !running_.empty(); }
  bool step_in_flight() const { return in_flight_; }

  // Scheduler and cache invariants ("" when all hold): every request is in the queue that
  // matches its state, every cache id is held by a live running request, ref counts match.
  std::string check() const;

 private:
  // What is left of a step for prompts (phases 2 and 3).
  struct PrefillRoom {
    int32_t budget = 0;         // tokens
    int32_t prefills = 0;       // prompts advancing
    int32_t long_prefills = 0;  // of them, long ones
    bool contended = false;     // decode rows in the step, or another prompt that could advance
  };
  bool is_long(const Request& r, int64_t start) const;
  // The most tokens r's chunk from `start` may take this step (0: it does not advance).
  int32_t chunk_limit(const Request& r, int64_t start, const PrefillRoom& room) const;
  void take(PrefillRoom& room, const Request& r, int64_t start, int64_t end) const;
  int64_t chunk_end(const Request& r, int64_t start, int32_t limit) const;
  bool reserve_or_preempt(Request& r, int64_t num_tokens, StepPlan& out);
  void preempt(Request& r, StepPlan& out);
  void emit(Request& r, int64_t start, int64_t end, SlotInit init, int32_t restore, StepPlan& out,
            std::span<const int32_t> drafts = {});
  int32_t drafts_that_fit(const Request& r, int32_t budget) const;
  void finish(Request& r, FinishReason reason, int32_t token, std::vector<RequestEvent>& events);
  void admit(StepPlan& out, PrefillRoom& room);

  SchedulerConfig config_;
  cache::KvCacheManager cache_;
  std::unordered_map<RequestId, std::unique_ptr<Request>> requests_;
  std::deque<Request*> waiting_;      // Waiting or Preempted, front first
  std::vector<Request*> running_;     // Prefilling or Decoding, in admission order
  std::vector<Request*> scheduled_;   // the in-flight step's requests, parallel to out.seqs
  std::vector<Request*> done_;        // finished during update, erased at its end
  std::vector<Request*> candidates_;  // schedule()'s scratch list
  uint64_t step_ = 0;
  bool in_flight_ = false;
  SchedulerCounters counters_;
  ExecutionScope scope_;
};

}  // namespace k3::scheduler
