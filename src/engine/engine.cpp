// engine/engine.cpp: Engine.
#include "engine/engine.h"

#include <chrono>

#include "core/error.h"

namespace k3::engine {

namespace {
using Seconds = std::chrono::duration<double>;

const EngineConfig& validated(const EngineConfig& c, const Executor* ex) {
  K3_CHECK(ex != nullptr, "Engine: no executor");
  c.scheduler.validate(c.cache);
  K3_CHECK(c.eos_token_id >= -1 && c.eos_token_id < ex->vocab_size(),
           "Engine: eos_token_id " + std::to_string(c.eos_token_id) + " is outside the vocabulary");
  return c;
}
}  // namespace

Engine::Engine(const EngineConfig& config, std::unique_ptr<Executor> executor)
    : config_(validated(config, executor.get())),
      executor_(std::move(executor)),
      scheduler_(config_.scheduler, config_.cache),
      vocab_(executor_->vocab_size()) {}

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
    K3_CHECK(r.prompt[i] >= 0 && r.prompt[i] < vocab_, "request: prompt token " + std::to_string(i) + " (id " +
                                                           std::to_string(r.prompt[i]) + ") is outside the vocabulary [0, " +
                                                           std::to_string(vocab_) + ")");
  K3_CHECK(r.max_tokens >= 1, "request: max_tokens must be >= 1, got " + std::to_string(r.max_tokens));
  const int64_t limit = config_.scheduler.max_model_len;
  K3_CHECK(static_cast<int64_t>(r.prompt.size()) < limit,
           "request: prompt has " + std::to_string(r.prompt.size()) + " tokens; max_model_len is " + std::to_string(limit));
  K3_CHECK(static_cast<int64_t>(r.prompt.size()) + r.max_tokens <= limit,
           "request: prompt (" + std::to_string(r.prompt.size()) + " tokens) + max_tokens (" + std::to_string(r.max_tokens) +
               ") exceeds max_model_len (" + std::to_string(limit) + ")");
  for (int32_t id : r.stop_token_ids)
    K3_CHECK(id >= 0 && id < vocab_, "request: stop_token_ids has id " + std::to_string(id) +
                                         " outside the vocabulary [0, " + std::to_string(vocab_) + ")");
  runner::validate(r.sampling, vocab_);
}

Engine::Submission Engine::submit(GenerateRequest r) {
  validate(r);
  Context ctx;
  ctx.sampler = std::make_unique<runner::Sampler>(r.sampling, vocab_);
  ctx.stream = std::make_shared<TokenStream>();
  ctx.on_event = std::move(r.on_event);
  scheduler::RequestSpec spec;
  spec.prompt = std::move(r.prompt);
  spec.max_tokens = r.max_tokens;
  spec.stop_token_ids = std::move(r.stop_token_ids);
  spec.eos_token_id = config_.eos_token_id;
  spec.ignore_eos = r.ignore_eos;
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
  for (Pending& p : adds) scheduler_.add(p.id, std::move(p.spec), p.arrival);  // validated at submit
  events_.clear();
  for (RequestId id : aborts) scheduler_.abort(id, events_);  // false: it finished meanwhile
  for (const auto& e : events_) deliver(e, nullptr, "");
  events_.clear();
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
  if (e.token >= 0) ++generated_;
  t.finished = e.finished;
  t.reason = e.reason;
  if (e.finished) {
    t.stats = e.stats;
    if (e.reason == FinishReason::error) {
      t.error = error;
      ++failed_;
    }
    if (e.reason == FinishReason::abort) ++aborted_;
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
  scheduler_.schedule(out_);
  if (out_.empty()) {  // everything it tried was preempted
    for (RequestId id : out_.preempted) executor_->release(id);
    has_work_ = scheduler_.has_work();
    publish_stats(Seconds(scheduler::Clock::now() - t0).count(), 0);
    return true;
  }
  const BatchPlan plan = make_plan(out_);
  sampled_.clear();
  samples_.clear();
  events_.clear();
  double exec_s = 0;
  std::string error;
  try {
    const auto e0 = scheduler::Clock::now();
    const core::Tensor logits = executor_->execute(plan);
    exec_s = Seconds(scheduler::Clock::now() - e0).count();
    K3_CHECK(logits.dtype() == core::DType::f32 && logits.shape().rank() == 2 &&
                 logits.dim(0) == static_cast<int64_t>(plan.seqs.size()) && logits.dim(1) == vocab_,
             "executor returned logits of the wrong shape");
    const float* rows = logits.data<const float>();
    for (size_t i = 0; i < plan.seqs.size(); ++i) {
      if (!plan.seqs[i].sample) continue;
      const scheduler::Request* r = scheduler_.find(plan.seqs[i].id);
      const std::span<const float> row(rows + static_cast<int64_t>(i) * vocab_, static_cast<size_t>(vocab_));
      samples_.push_back(contexts_.at(plan.seqs[i].id).sampler->sample(row, r->prompt(), r->output()));
      sampled_.push_back(samples_.back().token);
    }
  } catch (const std::exception& ex) {
    error = ex.what();
  }
  if (!error.empty()) {
    scheduler_.fail_step(out_, events_);
    for (const auto& e : events_) deliver(e, nullptr, "step failed: " + error);
  } else {
    scheduler_.update(out_, sampled_, events_);
    // update() emits exactly one event per sampling sequence, in order.
    K3_CHECK(events_.size() == samples_.size(), "Engine: events do not match samples");
    for (size_t i = 0; i < events_.size(); ++i) deliver(events_[i], &samples_[i], "");
  }
  events_.clear();
  has_work_ = scheduler_.has_work();
  publish_stats(Seconds(scheduler::Clock::now() - t0).count() - exec_s, exec_s);
  return true;
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
