// scheduler/request.h: a request as the scheduler sees it, and its lifecycle.
//
// The lifecycle is a std::variant of state structs; a transition is a function from one
// state type to another, and only the pairs listed in kLegalTransition compile:
//
//        Waiting ──admit──▶ Prefilling ──first token──▶ Decoding
//                              │   ▲                       │
//                       preempt│   │resume (recompute)     │preempt
//                              ▼   │                       │
//                           Preempted ◀────────────────────┘
//   any state but Finished ──stop / length / abort / error──▶ Finished
//
// Running states own the sequence's cache ids (cache::SequenceCache), so leaving them is
// the only way to drop those ids, and every transition out of one goes through the
// scheduler, which closes them.
#pragma once
#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "cache/kv_cache_manager.h"
#include "core/error.h"

namespace k3::scheduler {

using RequestId = uint64_t;
using Clock = std::chrono::steady_clock;

enum class FinishReason : uint8_t {
  stop,    // eos or a stop token
  length,  // max_tokens or the model's max context
  abort,   // the client asked
  error,   // the step that ran it failed
};
const char* to_string(FinishReason r);

// What the scheduler needs of a request; sampling lives in the engine.
// Which logits rows of a request's steps come back to the host for the engine to hand out (the
// Engine's on_logits): none (then the sampler may run on the device), the rows it samples from, or
// every row of its prefill chunks too (scoring a prompt: vLLM's prompt_logprobs).
enum class LogitsOut : uint8_t { none, sampled, every_row };

struct RequestSpec {
  std::vector<int32_t> prompt;
  int64_t max_tokens = 0;               // >= 1
  std::vector<int32_t> stop_token_ids;  // finish (reason stop) after sampling one of these
  int32_t eos_token_id = -1;            // the model's eos; -1: none
  bool ignore_eos = false;
  LogitsOut logits_out = LogitsOut::none;
  // A grammar constrains its samples (the engine holds the matcher): each step that samples it
  // gives its sampled rows grammar mask rows (ScheduledSequence::mask_row).
  bool constrained = false;
};

// Per-request statistics, written by the step loop only (no locks) and handed out with the
// request's last event.
struct RequestStats {
  Clock::time_point arrival{}, first_scheduled{}, first_token{}, finished{};
  int64_t prompt_tokens = 0;
  int64_t output_tokens = 0;
  int64_t cached_prompt_tokens = 0;  // prompt tokens reused from the prefix cache at first admission
  int64_t computed_tokens = 0;       // tokens run through the model, recomputation included
  int32_t preemptions = 0;
  // Speculative decoding (filled in by the engine on the last event): verify steps, drafts
  // verified and drafts accepted.
  int32_t spec_verify_steps = 0;
  int64_t spec_draft_tokens = 0, spec_accepted_tokens = 0;

  double queue_seconds() const { return seconds(arrival, first_scheduled); }
  double prefill_seconds() const { return seconds(first_scheduled, first_token); }
  double ttft_seconds() const { return seconds(arrival, first_token); }
  // Tokens after the first over the time after the first (0 when undefined).
  double decode_tokens_per_second() const {
    const double s = seconds(first_token, finished);
    return output_tokens > 1 && s > 0 ? static_cast<double>(output_tokens - 1) / s : 0.0;
  }

 private:
  static double seconds(Clock::time_point a, Clock::time_point b) {
    return a == Clock::time_point{} || b == Clock::time_point{} ? 0.0 : std::chrono::duration<double>(b - a).count();
  }
};

// ---- lifecycle states ----
struct Waiting {};  // queued, never ran
struct Running {
  cache::SequenceCache cache;
  int64_t num_computed = 0;  // tokens folded into the sequence's KV state
};
struct Prefilling : Running {};  // computing known tokens (prompt, or all tokens after a preemption)
struct Decoding : Running {};    // only the last sampled token is not computed yet
struct Preempted {};             // queued again; everything freed; recomputes on resume
struct Finished {
  FinishReason reason;
};
using RequestState = std::variant<Waiting, Prefilling, Decoding, Preempted, Finished>;

template <class From, class To>
inline constexpr bool kLegalTransition = false;
template <>
inline constexpr bool kLegalTransition<Waiting, Prefilling> = true;
template <>
inline constexpr bool kLegalTransition<Preempted, Prefilling> = true;
template <>
inline constexpr bool kLegalTransition<Prefilling, Decoding> = true;
template <>
inline constexpr bool kLegalTransition<Prefilling, Preempted> = true;
template <>
inline constexpr bool kLegalTransition<Decoding, Preempted> = true;
template <>
inline constexpr bool kLegalTransition<Waiting, Finished> = true;
template <>
inline constexpr bool kLegalTransition<Prefilling, Finished> = true;
template <>
inline constexpr bool kLegalTransition<Decoding, Finished> = true;
template <>
inline constexpr bool kLegalTransition<Preempted, Finished> = true;

const char* state_name(const RequestState& s);

class Request {
 public:
  Request(RequestId id, RequestSpec spec, int32_t block_size, Clock::time_point arrival);

  RequestId id() const { return id_; }
  const RequestSpec& spec() const { return spec_; }
  // prompt ++ output tokens so far
  std::span<const int32_t> tokens() const { return tokens_; }
  std::span<const int32_t> prompt() const { return std::span(tokens_).first(spec_.prompt.size()); }
  std::span<const int32_t> output() const { return std::span(tokens_).subspan(spec_.prompt.size()); }
  int64_t num_tokens() const { return static_cast<int64_t>(tokens_.size()); }
  int64_t prompt_len() const { return static_cast<int64_t>(spec_.prompt.size()); }
  int64_t num_output() const { return num_tokens() - prompt_len(); }
  // Hash chain of the full blocks of tokens() (cache/block_hash.h).
  std::span<const uint64_t> block_hashes() const { return hashes_; }
  void append_output(int32_t token);

  const RequestState& state() const { return state_; }
  template <class S>
  bool is() const {
    return std::holds_alternative<S>(state_);
  }
  // The running part of a Prefilling or Decoding request; nullptr otherwise.
  Running* running();
  const Running* running() const;

  // Moves the state from `From` to fn(From&&)'s result. Illegal pairs do not compile; being
  // in another state than `From` at run time throws (a scheduler bug).
  template <class From, class Fn>
  void transition(Fn&& fn) {
    using To = std::invoke_result_t<Fn, From&&>;
    static_assert(kLegalTransition<From, To>, "illegal request state transition");
    From* from = std::get_if<From>(&state_);
    K3_CHECK(from != nullptr, "request " + std::to_string(id_) + ": transition needs state " +
                                  state_name(RequestState{From{}}) + " but it is " + state_name(state_));
    To next = fn(std::move(*from));
    state_ = std::move(next);
  }

  RequestStats stats;
  uint64_t last_scheduled_step = 0;  // the scheduler's step stamp
  // Speculative decoding: draft tokens proposed for the next step (Scheduler::set_drafts); the
  // next schedule() verifies as many as fit and clears them.
  std::vector<int32_t> drafts;

 private:
  RequestId id_;
  RequestSpec spec_;
  int32_t block_size_;
  std::vector<int32_t> tokens_;
  std::vector<uint64_t> hashes_;
  RequestState state_ = Waiting{};
};

}  // namespace k3::scheduler
