// engine/engine.cpp: Engine.
#include "engine/engine.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <limits>

#include "backends/cpu/thread_pool.h"
#include "core/error.h"
#include "core/log.h"
#include "runner/device_sampler.h"

namespace k3::engine {

namespace {
using Seconds = std::chrono::duration<double>;

const EngineConfig& validated(const EngineConfig& c, const Executor* ex) {
  K3_CHECK(ex != nullptr, "Engine: no executor");
  c.scheduler.validate(c.cache);
  K3_CHECK(c.eos_token_id >= -1 && c.eos_token_id < ex->vocab_size(),
           "Engine: eos_token_id " + std::to_string(c.eos_token_id) + " is outside the vocabulary");
  c.speculative.validate();
  K3_CHECK(c.shadow_validate_rate >= 0 && c.shadow_validate_rate <= 1,
           "Engine: shadow_validate_rate must be in [0, 1], got " + std::to_string(c.shadow_validate_rate));
  K3_CHECK(c.shadow_validate_rate == 0 || ex->scope().fused_selected,
           "Engine: shadow validation checks the fused decode path against the standard one, and this executor runs "
           "the standard path only (use decode_backend latency_specialized)");
  return c;
}
}  // namespace

Engine::Engine(const EngineConfig& config, std::unique_ptr<Executor> executor, std::unique_ptr<spec::Drafter> drafter)
    : config_(validated(config, executor.get())),
      executor_(std::move(executor)),
      scheduler_(config_.scheduler, config_.cache),
      vocab_(executor_->vocab_size()),
      drafter_(std::move(drafter)) {
  set_up_speculation();
  // Every step is routed by what the executor runs, asked once the drafter's taps are set.
  scheduler::ExecutionScope scope = executor_->scope();
  scope.shadow_validate_rate = config_.shadow_validate_rate;
  if (config_.shadow_validate_rate > 0 && !scope.fused_problem.empty())
    log::warn("shadow validation: the fused path serves no step here (" + scope.fused_problem +
              "), so no step is validated");
  scheduler_.set_execution_scope(std::move(scope));
}

void Engine::set_up_speculation() {
  const spec::SpeculativeConfig& sc = config_.speculative;
  if (!sc.enabled()) {
    K3_CHECK(!drafter_, "Engine: a drafter was given but speculative.method is none (or num_speculative_tokens 0)");
    return;
  }
  if (!drafter_) drafter_ = spec::make_drafter(sc);
  K3_CHECK(executor_->supports_verify(), "Engine: speculative method " + std::string(spec::to_string(sc.method)) +
                                             " needs an executor that runs verify steps");
  if (const spec::HiddenTapRequest tap = drafter_->hidden_tap(); !tap.empty()) {
    executor_->set_hidden_tap(tap.layers);
    taps_on_ = true;
  }
  if (drafter_->synthetic())
    synthetic_al_ = sc.synthetic_acceptance_length > 0 ? sc.synthetic_acceptance_length : sc.num_speculative_tokens + 1;
  draft_length_ = std::make_unique<spec::DraftLengthController>(sc.num_speculative_tokens, sc.adaptive);
  if (sc.adaptive) gate_ = std::make_unique<spec::SpeculationGate>();
  spec_counters_.accepted_per_pos.assign(static_cast<size_t>(sc.num_speculative_tokens), 0);
}

Engine::~Engine() {
  stop();
  // Abort whatever is left so that no client waits forever on a stream.
  std::lock_guard step_lock(step_mu_);
  drain_inbox();
  std::vector<RequestId> ids;
  for (const auto& [id, ctx] : contexts_) ids.push_back(id);
  events_.clear();
  for (RequestId id : ids) scheduler_.abort(id, events_);
  for (const auto& e : events_) deliver(e, nullptr, "");
}

void Engine::validate(const GenerateRequest& r) const {
  K3_CHECK(!r.prompt.empty(), "request: prompt is empty");
  for (size_t i = 0; i < r.prompt.size(); ++i)
    K3_CHECK(r.prompt[i] >= 0 && r.prompt[i] < vocab_,
             "request: prompt token " + std::to_string(i) + " (id " + std::to_string(r.prompt[i]) +
                 ") is outside the vocabulary [0, " + std::to_string(vocab_) + ")");
  K3_CHECK(r.max_tokens >= 1, "request: max_tokens must be >= 1, got " + std::to_string(r.max_tokens));
  const int64_t limit = config_.scheduler.max_model_len;
  K3_CHECK(static_cast<int64_t>(r.prompt.size()) < limit, "request: prompt has " + std::to_string(r.prompt.size()) +
                                                              " tokens; max_model_len is " + std::to_string(limit));
  K3_CHECK(static_cast<int64_t>(r.prompt.size()) + r.max_tokens <= limit,
           "request: prompt (" + std::to_string(r.prompt.size()) + " tokens) + max_tokens (" +
               std::to_string(r.max_tokens) + ") exceeds max_model_len (" + std::to_string(limit) + ")");
  for (int32_t id : r.stop_token_ids)
    K3_CHECK(id >= 0 && id < vocab_, "request: stop_token_ids has id " + std::to_string(id) +
                                         " outside the vocabulary [0, " + std::to_string(vocab_) + ")");
  runner::validate(r.sampling, vocab_);
  K3_CHECK(!r.prompt_logits || r.on_logits, "request: prompt_logits needs an on_logits sink");
  K3_CHECK(static_cast<int64_t>(r.forced_output.size()) <= r.max_tokens,
           "request: forced_output has " + std::to_string(r.forced_output.size()) + " tokens, more than max_tokens (" +
               std::to_string(r.max_tokens) + ")");
  for (size_t i = 0; i < r.forced_output.size(); ++i)
    K3_CHECK(r.forced_output[i] >= 0 && r.forced_output[i] < vocab_,
             "request: forced_output token " + std::to_string(i) + " (id " + std::to_string(r.forced_output[i]) +
                 ") is outside the vocabulary [0, " + std::to_string(vocab_) + ")");
  K3_CHECK(r.forced_output.empty() || (!r.sampling.logprob && r.sampling.logprobs == 0),
           "request: forced_output tokens are not sampled, so they have no logprobs to return");
  if (r.grammar) {
    K3_CHECK(r.grammar->vocabulary().size() == vocab_, "request: the grammar was compiled for a vocabulary of " +
                                                           std::to_string(r.grammar->vocabulary().size()) +
                                                           " tokens, the model has " + std::to_string(vocab_));
    K3_CHECK(!r.ignore_eos,
             "request: ignore_eos cannot be combined with a constrained output (the grammar decides "
             "where the output ends)");
    K3_CHECK(r.forced_output.empty(), "request: forced_output cannot be combined with a constrained output");
  }
}

Engine::Submission Engine::submit(GenerateRequest r) {
  validate(r);
  Context ctx;
  ctx.sampler = std::make_unique<runner::Sampler>(r.sampling, vocab_);
  ctx.stream = std::make_shared<TokenStream>();
  ctx.on_event = std::move(r.on_event);
  ctx.on_logits = std::move(r.on_logits);
  ctx.forced_output = std::move(r.forced_output);
  if (r.grammar)  // rollback depth: a verify step's drafts
    ctx.matcher = std::make_unique<structured::Matcher>(std::move(r.grammar),
                                                        std::max(16, config_.speculative.num_speculative_tokens + 1));
  scheduler::RequestSpec spec;
  spec.logits_out = r.prompt_logits ? scheduler::LogitsOut::every_row
                    : ctx.scoring() ? scheduler::LogitsOut::sampled
                                    : scheduler::LogitsOut::none;
  spec.prompt = std::move(r.prompt);
  spec.max_tokens = r.max_tokens;
  spec.stop_token_ids = std::move(r.stop_token_ids);
  spec.eos_token_id = config_.eos_token_id;
  spec.ignore_eos = r.ignore_eos;
  spec.constrained = ctx.matcher != nullptr;
  Submission s;
  s.stream = ctx.stream;
  {
    std::lock_guard lock(inbox_mu_);
    s.id = next_id_++;
    new_.push_back({s.id, std::move(spec), scheduler::Clock::now()});
    new_contexts_.emplace_back(s.id, std::move(ctx));
    live_.insert(s.id);
    ++submitted_;
  }
  inbox_cv_.notify_all();
  return s;
}

bool Engine::abort(RequestId id) {
  {
    std::lock_guard lock(inbox_mu_);
    if (!live_.contains(id)) return false;
    aborts_.push_back(id);
  }
  inbox_cv_.notify_all();
  return true;
}

void Engine::drain_inbox() {
  std::vector<Pending> adds;
  std::vector<std::pair<RequestId, Context>> ctxs;
  std::vector<RequestId> aborts;
  {
    std::lock_guard lock(inbox_mu_);
    adds.swap(new_);
    ctxs.swap(new_contexts_);
    aborts.swap(aborts_);
  }
  for (auto& [id, ctx] : ctxs) contexts_.emplace(id, std::move(ctx));
  for (Pending& p : adds) {
    progress_.begin(p.id, static_cast<int64_t>(p.spec.prompt.size()));
    scheduler_.add(p.id, std::move(p.spec), p.arrival);  // validated at submit
  }
  events_.clear();
  for (RequestId id : aborts) scheduler_.abort(id, events_);  // false: it finished meanwhile
  if (!events_.empty()) deliver_events(0, 0, "");
}

void Engine::deliver_events(double host_s, double exec_s, const std::string& error) {
  for (const auto& e : events_) {
    if (e.token >= 0) ++generated_;
    if (e.finished && e.reason == FinishReason::error) ++failed_;
    if (e.finished && e.reason == FinishReason::abort) ++aborted_;
  }
  {  // a model step ran: its host time goes into the histogram (idle polls do not)
    const auto us = static_cast<uint64_t>(std::ceil(std::max(host_s, 0.0) * 1e6));
    const auto b = us <= 1 ? size_t{0} : static_cast<size_t>(std::bit_width(us - 1));
    ++step_host_us_log2_[std::min(b, EngineStats::kStepHostBuckets - 1)];
    step_host_seconds_ += host_s;
  }
  publish_stats(host_s, exec_s);
  const auto t0 = scheduler::Clock::now();
  // Events name the sample they carry (a verify sequence has one per kept token).
  for (const auto& e : events_) {
    runner::SampleResult* sample = nullptr;
    if (error.empty() && e.sample_index >= 0) {
      K3_CHECK(e.sample_index < static_cast<int32_t>(samples_.size()), "Engine: an event names a missing sample");
      sample = &samples_[static_cast<size_t>(e.sample_index)];
    }
    deliver(e, sample, error);
  }
  events_.clear();
  host_seconds_ += Seconds(scheduler::Clock::now() - t0).count();  // published with the next step
}

void Engine::deliver(const scheduler::RequestEvent& e, runner::SampleResult* sample, const std::string& error) {
  const auto it = contexts_.find(e.id);
  if (it == contexts_.end()) return;
  TokenEvent t;
  t.id = e.id;
  t.token = e.token;
  if (sample) {
    t.logprob = sample->logprob;
    t.top_logprobs = std::move(sample->top_logprobs);
  }
  t.finished = e.finished;
  t.reason = e.reason;
  t.stats = e.stats;  // the first token's event: what is known by then (prefix-cache hit)
  if (e.finished) {
    progress_.end(e.id);
    const spec::SpecCounters& sc = it->second.spec;
    t.stats.spec_verify_steps = static_cast<int32_t>(sc.num_drafts);
    t.stats.spec_draft_tokens = sc.num_draft_tokens;
    t.stats.spec_accepted_tokens = sc.num_accepted_tokens;
    if (e.reason == FinishReason::error) t.error = error;
  }
  Context& ctx = it->second;
  if (ctx.on_event) {
    ctx.on_event(t);
    if (t.finished) ctx.stream->push(std::move(t));  // so a client can still wait for the end
  } else {
    ctx.stream->push(std::move(t));
  }
  if (e.finished) {
    executor_->release(e.id);
    forget(e.id);
    contexts_.erase(it);
    std::lock_guard lock(inbox_mu_);
    live_.erase(e.id);
  }
}

bool Engine::step() {
  std::lock_guard step_lock(step_mu_);
  const auto t0 = scheduler::Clock::now();
  drain_inbox();
  if (!scheduler_.has_work()) {
    has_work_ = false;
    publish_stats(Seconds(scheduler::Clock::now() - t0).count(), 0);
    return false;
  }
  if (drafter_) propose_drafts();
  scheduler_.schedule(out_);
  for (RequestId id : out_.preempted) forget(id);  // it restarts from scratch
  if (out_.empty()) {                              // everything it tried was preempted
    for (RequestId id : out_.preempted) executor_->release(id);
    has_work_ = scheduler_.has_work();
    publish_stats(Seconds(scheduler::Clock::now() - t0).count(), 0);
    return true;
  }
  const StepPlan& plan = out_;  // read-only from here on
  sampled_.clear();
  samples_.clear();
  accepted_.clear();
  verify_rows_.clear();
  events_.clear();
  double exec_s = 0;
  std::string error;
  try {
    const auto e0 = scheduler::Clock::now();
    // Sampling is chosen once per step from the plan: plain steps sample on the device where the
    // executor can (tokens and logprobs come back, not logits); verify steps, steps whose logits
    // are handed out and steps with hidden-state taps sample on the host. A constrained row samples
    // on the device too: its grammar mask is computed here and applied there (token_mask).
    const core::LogitsAt at = executor_->device_sampler() && plan.num_verifies == 0 && !plan.host_logits && !taps_on_
                                  ? core::LogitsAt::device
                                  : core::LogitsAt::host;
    // The constrained rows' grammar masks are walked on the host while the forward runs.
    masks_.start(plan, (vocab_ + 31) / 32,
                 [&](const scheduler::ScheduledSequence& q) { return contexts_.at(q.id).matcher.get(); });
    const core::Tensor logits = executor_->execute(plan, at);
    exec_s = Seconds(scheduler::Clock::now() - e0).count();
    masks_.wait();
    count_route(plan.route);
    if (plan.route.shadow) {
      const ShadowReport* report = executor_->last_shadow();
      K3_CHECK(report != nullptr, "Engine: the executor ran a shadowed step without its report");
      count_shadow(*report);
    }
    K3_CHECK(logits.dtype() == core::DType::f32 && logits.shape().rank() == 2 && logits.dim(0) == plan.num_logit_rows &&
                 logits.dim(1) == vocab_,
             "executor returned logits of the wrong shape");
    seq_accepted_.assign(plan.seqs.size(), -1);
    K3_CHECK((logits.view().device != core::Device::cpu) == (at == core::LogitsAt::device),
             "Engine: the executor left the logits elsewhere than asked");
    if (at == core::LogitsAt::device) {
      // Device logits (runner/device_sampler.h): a plain step, row i = sequence i; only tokens,
      // logprobs and the rows that need host processing come back.
      // A constrained row's mask (filled on the host during the forward) is applied on the device.
      sample_rows_.clear();
      row_matchers_.clear();
      for (size_t i = 0; i < plan.seqs.size(); ++i) {
        const scheduler::ScheduledSequence& q = plan.seqs[i];
        if (!q.sample) continue;
        const scheduler::Request* r = scheduler_.find(q.id);
        Context& ctx = contexts_.at(q.id);
        const std::span<const uint32_t> allowed = q.mask_row >= 0 ? masks_.row(q.mask_row)
                                                                  : std::span<const uint32_t>{};
        sample_rows_.push_back({ctx.sampler.get(), static_cast<int64_t>(i), r->prompt(), r->output(), allowed});
        row_matchers_.push_back(ctx.matcher.get());
      }
      samples_ = runner::sample_rows(logits.view(), sample_rows_, executor_->device_sampler());
      for (size_t k = 0; k < samples_.size(); ++k) {
        sampled_.push_back(samples_[k].token);
        accepted_.push_back(0);
        if (row_matchers_[k]) accept_constrained(*row_matchers_[k], samples_[k].token);
      }
    } else {
      // Row offsets: logit_rows() per sequence (num_drafts + 1 for a verify sequence).
      const float* rows = logits.data<const float>();
      for (size_t i = 0; i < plan.seqs.size(); ++i) {
        hand_out_logits(plan, i, rows);
        if (plan.seqs[i].sample) sample_sequence(plan, i, rows);
        rows += static_cast<int64_t>(plan.seqs[i].logit_rows()) * vocab_;
      }
    }
    if (!verify_rows_.empty()) {
      const auto c0 = scheduler::Clock::now();
      executor_->commit_verified(verify_rows_);  // KDA replay of the accepted rows, MLA truncation
      exec_s += Seconds(scheduler::Clock::now() - c0).count();
    }
    if (drafter_) notify_drafter(plan);
  } catch (const std::exception& ex) {
    error = ex.what();
  }
  if (!error.empty()) {
    try {  // the step failed: its mask fill must end before its matchers are dropped or reused
      masks_.wait();
    } catch (const std::exception&) {  // the step's error is already the one reported
    }
  }
  // A pure decode step's whole time (drafting, forward, sampling, commit) teaches the gate.
  if (gate_ && error.empty() && plan.num_prefills == 0)
    gate_->record(static_cast<int64_t>(plan.seqs.size()), plan.num_tokens,
                  Seconds(scheduler::Clock::now() - t0).count());
  if (!error.empty()) scheduler_.fail_step(out_, events_);
  else scheduler_.update(out_, sampled_, accepted_, events_);
  if (error.empty()) progress_.step(out_);
  has_work_ = scheduler_.has_work();
  deliver_events(Seconds(scheduler::Clock::now() - t0).count() - exec_s, exec_s,
                 error.empty() ? "" : "step failed: " + error);
  return true;
}

void Engine::count_route(const core::StepRoute& route) {
  if (!decode_paths_.count(route)) return;
  log::info(route.path == core::DecodePath::fused
                ? "decode path: latency_specialized (fused) serves a step"
                : "decode path: standard for a step the fused path does not cover (" + route.fallback + ")");
}

void Engine::count_shadow(const ShadowReport& r) {
  if (shadow_.steps == 0)
    log::info("shadow validation: the standard path runs beside " + std::to_string(config_.shadow_validate_rate) +
              " of the fused steps");
  shadow_.add(r);
  if (!r.diverged()) return;
  log::warn("shadow validation: the fused path diverged from the standard one in " + std::to_string(r.divergent_rows) +
            " of " + std::to_string(r.rows) + " rows (" + r.shapes + "; min cosine " + std::to_string(r.min_cosine) +
            ", max |diff| " + std::to_string(r.max_abs) + " = " + std::to_string(r.max_abs_rel) +
            " of the largest logit, " + std::to_string(r.top1_disagreements) +
            " top-1 disagreements); fused kernels: " + r.kernels);
}

void Engine::propose_drafts() {
  scheduler_.decoding_requests(decoding_);
  queries_.clear();
  for (const scheduler::Request* r : decoding_) {
    if (contexts_.at(r->id()).scoring()) continue;  // its logits and tokens are the request's own
    // Synthetic acceptance forces drafts the grammar may refuse: constrained requests decode plainly.
    if (synthetic_al_ > 0 && contexts_.at(r->id()).matcher) continue;
    const int32_t budget = draft_length_->take_step(r->id());
    if (budget > 0) queries_.push_back({r->id(), r->tokens(), r->prompt_len(), budget});  // 0: paused
  }
  if (queries_.empty()) return;
  if (gate_) {  // does drafting pay at this batch, with these requests' acceptance?
    int64_t drafts = 0;
    double expected = static_cast<double>(decoding_.size());
    for (const spec::DraftQuery& q : queries_) {
      drafts += q.max_drafts;
      expected += draft_length_->rate(q.id) * q.max_drafts;
    }
    if (!gate_->should_draft(static_cast<int64_t>(decoding_.size()), drafts, expected)) {
      queries_.clear();
      return;
    }
  }
  drafts_.resize(queries_.size());
  for (spec::Draft& d : drafts_) d.clear();
  drafter_->propose(queries_, std::span<spec::Draft>(drafts_.data(), queries_.size()));
  for (size_t i = 0; i < queries_.size(); ++i) {
    std::vector<int32_t>& d = drafts_[i].tokens;
    if (d.size() > static_cast<size_t>(queries_[i].max_drafts)) d.resize(static_cast<size_t>(queries_[i].max_drafts));
    // A draft outside the vocabulary ends the proposal there (a drafter bug must not reach the model).
    const auto bad = std::find_if(d.begin(), d.end(), [&](int32_t t) { return t < 0 || t >= vocab_; });
    d.erase(bad, d.end());
    if (!d.empty()) scheduler_.set_drafts(queries_[i].id, d);
  }
}

void Engine::hand_out_logits(const StepPlan& plan, size_t i, const float* rows) {
  const scheduler::ScheduledSequence& q = plan.seqs[i];
  if (q.logits_out == scheduler::LogitsOut::none || (q.logits_out == scheduler::LogitsOut::sampled && !q.sample))
    return;
  Context& ctx = contexts_.at(q.id);
  const int64_t n = q.logit_rows(), first = q.start + q.num_tokens - n;
  for (int64_t j = 0; j < n; ++j) {
    if (first + j < ctx.logits_next) continue;  // recomputed after a preemption: handed out before
    ctx.on_logits(first + j, std::span(rows + j * vocab_, static_cast<size_t>(vocab_)));
    ctx.logits_next = first + j + 1;
  }
}

void Engine::accept_constrained(structured::Matcher& m, int32_t token) {
  K3_CHECK(m.accept(token), "Engine: the sampler chose token " + std::to_string(token) + ", which the grammar refuses");
}

std::span<const float> Engine::mask_verify_rows(const scheduler::ScheduledSequence& q, std::span<const float> rows) {
  // Row j follows drafts d_1..d_j: its mask is the grammar's after them (StepMasks). A draft the
  // grammar refuses has logit -inf in its row, so acceptance stops there.
  masked_rows_.assign(rows.begin(), rows.end());
  for (int32_t j = 0; j < q.mask_rows(); ++j) {
    const std::span<const uint32_t> mask = masks_.row(q.mask_row + j);
    float* row = masked_rows_.data() + static_cast<size_t>(j) * static_cast<size_t>(vocab_);
    for (int32_t t = 0; t < vocab_; ++t)
      if (!(mask[static_cast<size_t>(t) >> 5] >> (t & 31) & 1)) row[t] = -std::numeric_limits<float>::infinity();
  }
  return masked_rows_;
}

void Engine::sample_sequence(const StepPlan& plan, size_t i, const float* rows) {
  const scheduler::ScheduledSequence& q = plan.seqs[i];
  const scheduler::Request* r = scheduler_.find(q.id);
  Context& ctx = contexts_.at(q.id);
  if (const auto k = static_cast<size_t>(r->num_output()); k < ctx.forced_output.size()) {
    runner::SampleResult forced;  // teacher forcing: the request's token, not a sample
    forced.token = ctx.forced_output[k];
    forced.logprob = std::numeric_limits<float>::quiet_NaN();
    samples_.push_back(forced);
    sampled_.push_back(forced.token);
    accepted_.push_back(0);
    return;
  }
  if (q.num_drafts == 0) {
    rows += static_cast<int64_t>(q.logit_rows() - 1) * vocab_;  // the last token's row
    const std::span<const uint32_t> allowed = q.mask_row >= 0 ? masks_.row(q.mask_row) : std::span<const uint32_t>{};
    samples_.push_back(
        ctx.sampler->sample(std::span(rows, static_cast<size_t>(vocab_)), r->prompt(), r->output(), allowed));
    sampled_.push_back(samples_.back().token);
    accepted_.push_back(0);
    if (ctx.matcher) accept_constrained(*ctx.matcher, samples_.back().token);
    return;
  }
  // A verify sequence: its tokens are [last, d_1..d_k] and its k+1 rows follow each other.
  std::span<const float> all(rows, static_cast<size_t>(q.num_drafts + 1) * static_cast<size_t>(vocab_));
  const std::span<const int32_t> drafts = plan.tokens_of(q).subspan(1);
  if (q.mask_row >= 0) all = mask_verify_rows(q, all);
  if (synthetic_al_ > 0)
    spec::accept_synthetic(*ctx.sampler, all, vocab_, r->prompt(), r->output(), drafts, synthetic_al_, verified_,
                           scratch_);
  else spec::accept_point_mass(*ctx.sampler, all, vocab_, r->prompt(), r->output(), drafts, verified_, scratch_);
  for (runner::SampleResult& s : verified_.tokens) {
    sampled_.push_back(s.token);
    // Tokens after an accepted end token are cut by the scheduler (the request ended on eos).
    if (ctx.matcher && !ctx.matcher->terminated()) accept_constrained(*ctx.matcher, s.token);
    samples_.push_back(std::move(s));
  }
  const int32_t a = verified_.num_accepted;
  accepted_.push_back(a);
  verify_rows_.push_back(a + 1);
  seq_accepted_[i] = a;
  spec_counters_.record(q.num_drafts, a);
  ctx.spec.record(q.num_drafts, a);
  draft_length_->record(q.id, q.num_drafts, a);
}

void Engine::notify_drafter(const StepPlan& plan) {
  const core::Tensor* taps = taps_on_ ? executor_->hidden_taps() : nullptr;
  K3_CHECK(!taps_on_ || (taps && taps->dim(0) == plan.num_tokens),
           "Engine: the executor returned no hidden-state taps for the step");
  int64_t row = 0;
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const scheduler::ScheduledSequence& q = plan.seqs[i];
    const std::span<const int32_t> tokens = plan.tokens_of(q);
    const auto n = static_cast<int64_t>(tokens.size());
    // Committed rows: all of a prefill chunk or plain decode, last + accepted drafts of a verify.
    const int64_t kept = q.num_drafts > 0 ? seq_accepted_[i] + 1 : n;
    if (taps) {
      const int64_t width = taps->dim(1);
      spec::HiddenTapRows r;
      r.hidden = core::TensorView::contiguous(const_cast<float*>(taps->data<const float>()) + row * width,
                                              core::DType::f32, {kept, width});
      r.position = q.start;
      r.tokens = tokens.first(static_cast<size_t>(kept));
      drafter_->observe(q.id, r);
    }
    if (q.num_drafts > 0) drafter_->on_accepted(q.id, q.num_drafts, seq_accepted_[i]);
    row += n;
  }
}

void Engine::forget(RequestId id) {
  if (!drafter_) return;
  drafter_->release(id);
  draft_length_->release(id);
}

void Engine::run_until_idle() {
  while (step()) {
  }
}

void Engine::publish_stats(double host_s, double exec_s) {
  host_seconds_ += host_s;
  executor_seconds_ += exec_s;
  const scheduler::SchedulerCounters& c = scheduler_.counters();
  EngineStats s;
  s.running = scheduler_.num_running();
  s.waiting = scheduler_.num_waiting();
  s.steps = c.steps;
  s.finished = c.finished;
  s.aborted = aborted_;
  s.failed = failed_;
  s.prompt_tokens = c.admitted_prompt_tokens;
  s.prefix_hit_tokens = c.prefix_hit_tokens;
  s.prefill_tokens = c.prefill_tokens;
  s.decode_tokens = c.decode_tokens;
  s.generated_tokens = generated_;
  s.preemptions = c.preemptions;
  s.cache = scheduler_.cache().usage();
  s.host_seconds = host_seconds_;
  s.executor_seconds = executor_seconds_;
  s.decode_paths = decode_paths_;
  s.shadow = shadow_;
  // The step just run, if any (an idle or all-preempted step computed nothing): its tokens are
  // what the scheduler's counters grew by since the last publish.
  const int64_t computed = c.prefill_tokens + c.decode_tokens;
  if (const int64_t step_tokens = computed - step_tokens_counted_; step_tokens > 0) {
    const auto b = static_cast<size_t>(std::bit_width(static_cast<uint64_t>(step_tokens - 1)));
    ++step_tokens_log2_[std::min(b, EngineStats::kStepTokenBuckets - 1)];
    step_tokens_counted_ = computed;
  }
  s.step_tokens_log2 = step_tokens_log2_;
  s.step_host_us_log2 = step_host_us_log2_;
  s.step_host_seconds = step_host_seconds_;
  if (drafter_) {
    s.spec_method = drafter_->name();
    s.spec_synthetic = drafter_->synthetic();
    s.spec_num_drafts = spec_counters_.num_drafts;
    s.spec_num_draft_tokens = spec_counters_.num_draft_tokens;
    s.spec_num_accepted_tokens = spec_counters_.num_accepted_tokens;
    s.spec_accepted_per_pos = spec_counters_.accepted_per_pos;
    s.spec_gated_steps = gate_ ? gate_->skipped_steps() : 0;
  }
  std::lock_guard lock(stats_mu_);
  stats_ = s;
}

EngineStats Engine::stats() const {
  EngineStats s;
  {
    std::lock_guard lock(stats_mu_);
    s = stats_;
  }
  std::lock_guard lock(inbox_mu_);
  s.submitted = submitted_;
  return s;
}

void Engine::loop() {
  for (;;) {
    {
      std::unique_lock lock(inbox_mu_);
      inbox_cv_.wait(lock, [&] { return stop_ || !new_.empty() || !aborts_.empty() || has_work_.load(); });
      if (stop_) return;
    }
    step();
  }
}

void Engine::start() {
  std::lock_guard lock(inbox_mu_);
  K3_CHECK(!thread_.joinable(), "Engine::start: the loop is already running");
  stop_ = false;
  thread_ = std::thread([this] { loop(); });
}

void Engine::stop() {
  {
    std::lock_guard lock(inbox_mu_);
    stop_ = true;
  }
  inbox_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

}  // namespace k3::engine
