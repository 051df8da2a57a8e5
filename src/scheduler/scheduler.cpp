// scheduler/scheduler.cpp: Scheduler.
#include "scheduler/scheduler.h"

#include <algorithm>
#include <unordered_set>

#include "core/error.h"

namespace k3::scheduler {

namespace {
const SchedulerConfig& validated(const SchedulerConfig& s, const cache::CacheConfig& c) {
  s.validate(c);
  return s;
}

// Running -> another running state, keeping the cache ids and progress.
template <class To>
To carry(Running&& r) {
  To t;
  static_cast<Running&>(t) = std::move(r);
  return t;
}
}  // namespace

Scheduler::Scheduler(const SchedulerConfig& config, const cache::CacheConfig& cache)
    : config_(validated(config, cache)), cache_(cache) {
  running_.reserve(static_cast<size_t>(config_.max_num_seqs));
  scheduled_.reserve(static_cast<size_t>(config_.max_num_seqs));
}

void Scheduler::add(RequestId id, RequestSpec spec, Clock::time_point arrival) {
  const auto n = static_cast<int64_t>(spec.prompt.size());
  K3_CHECK(n > 0, "request " + std::to_string(id) + ": the prompt is empty");
  K3_CHECK(spec.max_tokens >= 1,
           "request " + std::to_string(id) + ": max_tokens must be >= 1, got " + std::to_string(spec.max_tokens));
  K3_CHECK(n + spec.max_tokens <= config_.max_model_len,
           "request " + std::to_string(id) + ": prompt (" + std::to_string(n) + " tokens) + max_tokens (" +
               std::to_string(spec.max_tokens) + ") exceeds max_model_len (" + std::to_string(config_.max_model_len) +
               ")");
  K3_CHECK(!requests_.contains(id), "request " + std::to_string(id) + ": id already in use");
  auto req = std::make_unique<Request>(id, std::move(spec), cache_.config().block_size, arrival);
  waiting_.push_back(req.get());
  requests_.emplace(id, std::move(req));
}

const Request* Scheduler::find(RequestId id) const {
  const auto it = requests_.find(id);
  return it == requests_.end() ? nullptr : it->second.get();
}

// ---- schedule ----

bool Scheduler::is_long(const Request& r, int64_t start) const {
  return r.num_tokens() - start > config_.long_prefill_token_threshold;
}

int32_t Scheduler::chunk_limit(const Request& r, int64_t start, const PrefillRoom& room) const {
  if (room.prefills >= config_.max_partial_prefills || room.budget <= 0) return 0;
  if (!is_long(r, start)) return room.budget;
  if (room.long_prefills >= config_.max_long_partial_prefills) return 0;
  return room.contended ? std::min(room.budget, config_.long_prefill_token_threshold) : room.budget;
}

void Scheduler::take(PrefillRoom& room, const Request& r, int64_t start, int64_t end) const {
  room.budget -= static_cast<int32_t>(end - start);
  ++room.prefills;
  if (is_long(r, start)) ++room.long_prefills;
}

int64_t Scheduler::chunk_end(const Request& r, int64_t start, int32_t limit) const {
  const int64_t total = r.num_tokens();
  const int64_t align = config_.chunk_align(cache_.config());
  int64_t end = start + std::min<int64_t>(total - start, limit);
  if (end < total) end = end / align * align;  // an unfinished chunk ends on an alignment boundary
  if (cache_.config().enable_prefix_cache) {
    // ... and at the last checkpoint boundary it reaches, where its checkpoint is taken (the state
    // is copied after the step). Boundaries it passes on the way keep no checkpoint: prefix hits
    // find the deepest one (KvCacheManager::find_prefix), and cutting every chunk at the first
    // boundary would make a long prompt take one step per interval (64 tokens for K3). A chunk
    // that finishes the known tokens stops at the last boundary BELOW their end: a hit must leave
    // a token to compute, so a checkpoint at the very end would not serve the same prompt sent
    // again (and a prompt alone in its steps may finish in one chunk).
    const int64_t every = cache_.config().checkpoint_interval_tokens();
    const int64_t boundary = std::min(end, total - 1) / every * every;
    if (boundary > start) end = boundary;
  }
  return std::max(end, start);
}

void Scheduler::preempt(Request& r, StepPlan& out) {
  auto to_preempted = [&](auto&& s) {
    cache_.close(s.cache);
    return Preempted{};
  };
  if (r.is<Prefilling>()) r.transition<Prefilling>(to_preempted);
  else r.transition<Decoding>(to_preempted);
  running_.erase(std::find(running_.begin(), running_.end(), &r));
  waiting_.push_front(&r);
  out.preempted.push_back(r.id());
  ++r.stats.preemptions;
  ++counters_.preemptions;
}

bool Scheduler::reserve_or_preempt(Request& r, int64_t num_tokens, StepPlan& out) {
  Running& run = *r.running();
  while (!cache_.reserve(run.cache, num_tokens)) {
    Request* victim = nullptr;  // the latest admitted request this step has not scheduled
    for (auto it = running_.rbegin(); it != running_.rend() && !victim; ++it)
      if (*it != &r && (*it)->last_scheduled_step != step_) victim = *it;
    if (!victim) {
      preempt(r, out);
      return false;
    }
    preempt(*victim, out);
  }
  return true;
}

void Scheduler::emit(Request& r, int64_t start, int64_t end, SlotInit init, int32_t restore, StepPlan& out,
                     std::span<const int32_t> drafts) {
  Running& run = *r.running();
  const auto k = static_cast<int64_t>(drafts.size());
  // (drafts_that_fit keeps a verify step's end off checkpoint boundaries)
  if (cache_.config().enable_prefix_cache && (end + k) % cache_.config().checkpoint_interval_tokens() == 0)
    cache_.take_checkpoint(run.cache);  // may find none free: then this boundary is not saved
  ScheduledSequence s;
  s.id = r.id();
  s.start = start;
  s.num_tokens = static_cast<int32_t>(end - start + k);
  s.num_drafts = static_cast<int32_t>(k);
  s.token_offset = static_cast<int32_t>(out.tokens.size());
  const auto tokens = r.tokens();
  out.tokens.insert(out.tokens.end(), tokens.begin() + start, tokens.begin() + end);
  out.tokens.insert(out.tokens.end(), drafts.begin(), drafts.end());
  s.block_offset = static_cast<int32_t>(out.blocks.size());
  out.blocks.insert(out.blocks.end(), run.cache.blocks.begin(), run.cache.blocks.end());  // the whole table
  s.num_blocks = static_cast<int32_t>(run.cache.blocks.size());
  s.kda_slot = run.cache.slot;
  s.kind = start >= r.prompt_len() && end - start == 1 ? StepKind::decode : StepKind::prefill;
  s.slot_init = init;
  s.restore_checkpoint = restore;
  s.save_checkpoint = run.cache.pending_checkpoint;
  s.sample = end == r.num_tokens();
  s.logits_out = r.spec().logits_out;
  if (s.sample && r.spec().constrained) {
    s.mask_row = out.num_mask_rows;
    out.num_mask_rows += s.mask_rows();
  }
  r.last_scheduled_step = step_;
  scheduled_.push_back(&r);
  out.seqs.push_back(s);
  out.num_tokens += s.num_tokens;
  out.num_samples += s.sample ? 1 : 0;
  out.num_logit_rows += s.logit_rows();
  out.host_logits |= s.logits_out != LogitsOut::none;
  if (s.kind == StepKind::decode) {
    ++out.num_decodes;
    counters_.decode_tokens += s.num_tokens;
    if (k > 0) {
      ++out.num_verifies;
      out.num_draft_tokens += k;
    }
  } else {
    ++out.num_prefills;
    counters_.prefill_tokens += s.num_tokens;
  }
}

void Scheduler::admit(StepPlan& out, PrefillRoom& room) {
  // Shorter prompts pass waiting long ones, but the queue is looked into only so far: each look
  // is a prefix lookup over the prompt's pages, and a step's host time must not grow with the
  // queue.
  int32_t passed = 0;
  for (size_t i = 0; i < waiting_.size() && num_running() < config_.max_num_seqs &&
                     room.prefills < config_.max_partial_prefills && room.budget > 0;) {
    Request& r = *waiting_[i];
    const cache::PrefixHit hit = cache_.find_prefix(r.tokens(), r.block_hashes());
    const int64_t start = hit.num_tokens;
    const int32_t limit = chunk_limit(r, start, room);
    if (limit <= 0) {  // long, and the long places are taken
      if (++passed >= config_.max_partial_prefills) break;
      ++i;
      continue;
    }
    const int64_t end = chunk_end(r, start, limit);
    if (end <= start) break;
    auto seq = cache_.open(hit);
    if (!seq) break;
    // Keep one page per decoding request in hand, so admitting does not force a preemption
    // on the next decode step.
    if (cache_.blocks_needed(*seq, end) + out.num_decodes > cache_.num_available_blocks()) {
      cache_.close(*seq);
      break;
    }
    K3_CHECK(cache_.reserve(*seq, end), "scheduler: reserve failed after the availability check");
    waiting_.erase(waiting_.begin() + static_cast<std::ptrdiff_t>(i));
    running_.push_back(&r);
    auto to_prefilling = [&](auto&&) {
      Prefilling p;
      p.cache = std::move(*seq);
      p.num_computed = start;
      return p;
    };
    if (r.is<Waiting>()) {
      r.transition<Waiting>(to_prefilling);
      r.stats.first_scheduled = Clock::now();
      r.stats.cached_prompt_tokens = start;
      counters_.admitted_prompt_tokens += r.prompt_len();
      counters_.prefix_hit_tokens += start;
    } else {
      r.transition<Preempted>(to_prefilling);
    }
    emit(r, start, end, hit.num_tokens > 0 ? SlotInit::restore : SlotInit::reset, hit.checkpoint, out);
    take(room, r, start, end);
  }
}

void Scheduler::decoding_requests(std::vector<const Request*>& out) const {
  out.clear();
  for (const Request* r : running_)
    if (r->is<Decoding>()) out.push_back(r);
}

void Scheduler::set_drafts(RequestId id, std::span<const int32_t> drafts) {
  const auto it = requests_.find(id);
  if (it == requests_.end() || !it->second->is<Decoding>()) return;
  it->second->drafts.assign(drafts.begin(), drafts.end());
}

int32_t Scheduler::drafts_that_fit(const Request& r, int32_t budget) const {
  int64_t k = static_cast<int64_t>(r.drafts.size());
  k = std::min<int64_t>(k, budget - 1);                                  // K+1 rows of the token budget
  k = std::min<int64_t>(k, r.spec().max_tokens - r.num_output() - 1);    // n+1 new tokens <= what is left
  k = std::min<int64_t>(k, config_.max_model_len - r.num_tokens() - 1);  // ... and within max_model_len
  if (cache_.config().enable_prefix_cache) {
    // The rows [start, start + k] must end before the next checkpoint boundary: the slot holds
    // committed state only after the replay, so a verify step saves no checkpoint; the token that
    // reaches a boundary is decoded plainly (k = 0) and saved as usual.
    const int64_t every = cache_.config().checkpoint_interval_tokens();
    const int64_t start = r.running()->num_computed, boundary = (start / every + 1) * every;
    k = std::min<int64_t>(k, boundary - start - 2);
  }
  return static_cast<int32_t>(std::max<int64_t>(k, 0));
}

void Scheduler::schedule(StepPlan& out) {
  K3_CHECK(!in_flight_, "Scheduler::schedule: the previous step was neither updated nor failed");
  out.clear();
  out.step = ++step_;
  ++counters_.steps;
  scheduled_.clear();
  int32_t budget = config_.max_num_batched_tokens;

  // 1. Decodes. (Candidates are copied: preemption reorders running_.)
  std::vector<Request*>& candidates = candidates_;
  candidates.clear();
  for (Request* r : running_)
    if (r->is<Decoding>()) candidates.push_back(r);
  for (size_t c = 0; c < candidates.size(); ++c) {
    Request* r = candidates[c];
    if (!r->is<Decoding>() || budget < 1) {  // preempted by an earlier one
      r->drafts.clear();
      continue;
    }
    const int64_t start = r->running()->num_computed;
    const size_t before = r->running()->cache.blocks.size();
    // Drafts never take the row a later decode needs (decodes never wait for budget).
    const auto later = static_cast<int32_t>(candidates.size() - c - 1);
    int32_t k = drafts_that_fit(*r, budget - later);
    // Pages for all K+1 rows; those past the accepted length stay in the request's table and are
    // reused by its next steps (or freed with it). Drafts never preempt anyone: without free
    // pages for them the request decodes plainly.
    if (k > 0 && !cache_.reserve(r->running()->cache, start + 1 + k)) k = 0;
    const bool ok = reserve_or_preempt(*r, start + 1 + k, out);
    if (ok) {
      emit(*r, start, start + 1, SlotInit::keep, -1, out,
           std::span<const int32_t>(r->drafts).first(static_cast<size_t>(k)));
      budget -= 1 + k;
    }
    r->drafts.clear();
  }
  for (Request* r : running_) r->drafts.clear();  // drafts never outlive the step they were made for

  // 2. Running prefills, admission order.
  candidates.clear();
  for (Request* r : running_)
    if (r->is<Prefilling>()) candidates.push_back(r);
  PrefillRoom room;
  room.budget = budget;
  const size_t admissible = num_running() < config_.max_num_seqs ? waiting_.size() : 0;
  room.contended = out.num_decodes > 0 || candidates.size() + admissible > 1;
  for (Request* r : candidates) {
    if (!r->is<Prefilling>()) continue;  // preempted by an earlier one
    const int64_t start = r->running()->num_computed;
    const int32_t limit = chunk_limit(*r, start, room);
    if (limit <= 0) continue;
    const int64_t end = chunk_end(*r, start, limit);
    if (end <= start) continue;
    if (!reserve_or_preempt(*r, end, out)) continue;
    emit(*r, start, end, SlotInit::keep, -1, out);
    take(room, *r, start, end);
  }

  // 3. Admission.
  admit(out, room);
  in_flight_ = !out.empty();
  out.route = route_step(out, scope_);
}

// ---- update ----

void Scheduler::finish(Request& r, FinishReason reason, int32_t token, std::vector<RequestEvent>& events) {
  auto close = [&](auto&& s) {
    if constexpr (std::is_base_of_v<Running, std::decay_t<decltype(s)>>) cache_.close(s.cache);
    return Finished{reason};
  };
  switch (r.state().index()) {
    case 0: r.transition<Waiting>(close); break;
    case 1: r.transition<Prefilling>(close); break;
    case 2: r.transition<Decoding>(close); break;
    case 3: r.transition<Preempted>(close); break;
    default: throw core::Error("request " + std::to_string(r.id()) + " finished twice");
  }
  r.stats.finished = Clock::now();
  r.stats.output_tokens = r.num_output();
  ++counters_.finished;
  RequestEvent e;
  e.id = r.id();
  e.token = token;
  e.finished = true;
  e.reason = reason;
  e.stats = r.stats;
  events.push_back(std::move(e));
  done_.push_back(&r);
}

void Scheduler::update(const StepPlan& out, std::span<const int32_t> sampled, std::vector<RequestEvent>& events) {
  update(out, sampled, {}, events);
}

void Scheduler::update(const StepPlan& out, std::span<const int32_t> sampled, std::span<const int32_t> accepted,
                       std::vector<RequestEvent>& events) {
  K3_CHECK(in_flight_ && out.step == step_ && out.seqs.size() == scheduled_.size(),
           "Scheduler::update: not the output of the step in flight");
  K3_CHECK(accepted.empty() || accepted.size() == static_cast<size_t>(out.num_samples),
           "Scheduler::update: " + std::to_string(accepted.size()) + " accepted counts for " +
               std::to_string(out.num_samples) + " sampling sequences");
  size_t expected = 0, j = 0;
  for (const ScheduledSequence& s : out.seqs) {
    if (!s.sample) continue;
    const int32_t a = accepted.empty() ? 0 : accepted[j++];
    K3_CHECK(a >= 0 && a <= s.num_drafts, "Scheduler::update: request " + std::to_string(s.id) + " accepts " +
                                              std::to_string(a) + " of " + std::to_string(s.num_drafts) + " drafts");
    expected += static_cast<size_t>(a) + 1;
  }
  K3_CHECK(sampled.size() == expected, "Scheduler::update: " + std::to_string(sampled.size()) +
                                           " sampled tokens, the sampling sequences and accepted counts need " +
                                           std::to_string(expected));
  size_t next_sample = 0, next_seq = 0;
  for (size_t i = 0; i < out.seqs.size(); ++i) {
    const ScheduledSequence& s = out.seqs[i];
    Request& r = *scheduled_[i];
    Running& run = *r.running();
    K3_CHECK(run.num_computed == s.start,
             "Scheduler::update: request " + std::to_string(r.id()) + " moved since scheduling");
    const int32_t a = s.sample && !accepted.empty() ? accepted[next_seq] : 0;
    if (s.sample) ++next_seq;
    // A verify step computed its K+1 rows, but only the last token and the accepted drafts stay.
    const int64_t computed = s.verify() ? int64_t{a} + 1 : s.num_tokens;
    run.num_computed += computed;
    r.stats.computed_tokens += computed;
    // A verify step's accepted drafts join tokens() below, so it commits once they are there.
    if (!s.verify()) cache_.commit(run.cache, r.tokens(), r.block_hashes(), run.num_computed);
    if (!s.sample) continue;
    const size_t first = next_sample;
    next_sample += static_cast<size_t>(a) + 1;
    for (size_t t = first; t < next_sample; ++t) {
      const int32_t token = sampled[t];
      r.append_output(token);
      if (r.num_output() == 1) r.stats.first_token = Clock::now();
      const RequestSpec& spec = r.spec();
      const bool stop = (!spec.ignore_eos && token == spec.eos_token_id && token >= 0) ||
                        std::find(spec.stop_token_ids.begin(), spec.stop_token_ids.end(), token) !=
                            spec.stop_token_ids.end();
      if (stop || r.num_output() >= spec.max_tokens || r.num_tokens() >= config_.max_model_len) {
        if (s.verify())  // register what was computed of the tokens kept, as a plain step does
          cache_.commit(run.cache, r.tokens(), r.block_hashes(), std::min(run.num_computed, r.num_tokens()));
        finish(r, stop ? FinishReason::stop : FinishReason::length, token, events);
        events.back().sample_index = static_cast<int32_t>(t);
        break;  // tokens after a finishing one are dropped
      }
      if (r.is<Prefilling>()) r.transition<Prefilling>([](Prefilling&& p) { return carry<Decoding>(std::move(p)); });
      RequestEvent e;
      e.id = r.id();
      e.token = token;
      e.sample_index = static_cast<int32_t>(t);
      // The first token's event carries the stats known by then (the prefix-cache hit), so a
      // front end can report cached prompt tokens before the request ends.
      if (r.num_output() == 1) e.stats = r.stats;
      events.push_back(e);
    }
    if (s.verify() && !r.is<Finished>()) cache_.commit(run.cache, r.tokens(), r.block_hashes(), run.num_computed);
  }
  in_flight_ = false;
  if (!done_.empty()) {
    std::erase_if(running_, [](Request* r) { return r->is<Finished>(); });
    for (Request* r : done_) requests_.erase(r->id());
    done_.clear();
  }
}

void Scheduler::fail_step(const StepPlan& out, std::vector<RequestEvent>& events) {
  K3_CHECK(in_flight_ && out.step == step_, "Scheduler::fail_step: not the output of the step in flight");
  for (Request* r : scheduled_) finish(*r, FinishReason::error, -1, events);
  in_flight_ = false;
  std::erase_if(running_, [](Request* r) { return r->is<Finished>(); });
  for (Request* r : done_) requests_.erase(r->id());
  done_.clear();
}

bool Scheduler::abort(RequestId id, std::vector<RequestEvent>& events) {
  K3_CHECK(!in_flight_, "Scheduler::abort: a step is in flight");
  const auto it = requests_.find(id);
  if (it == requests_.end()) return false;
  Request& r = *it->second;
  if (r.running()) running_.erase(std::find(running_.begin(), running_.end(), &r));
  else waiting_.erase(std::find(waiting_.begin(), waiting_.end(), &r));
  finish(r, FinishReason::abort, -1, events);
  done_.clear();
  requests_.erase(it);
  return true;
}

std::string Scheduler::check() const {
  std::unordered_set<const Request*> seen;
  std::vector<const cache::SequenceCache*> live;
  const int64_t bs = cache_.config().block_size;
  for (const Request* r : running_) {
    if (!seen.insert(r).second) return "request " + std::to_string(r->id()) + " is running twice";
    const Running* run = r->running();
    if (!run) return "request " + std::to_string(r->id()) + " is in the running list but " + state_name(r->state());
    if (static_cast<int64_t>(run->cache.blocks.size()) * bs < run->num_computed)
      return "request " + std::to_string(r->id()) + " has computed tokens beyond its pages";
    if (run->num_computed >= r->num_tokens())
      return "request " + std::to_string(r->id()) + " has nothing left to compute";
    if (!in_flight_ && r->is<Decoding>() && run->num_computed != r->num_tokens() - 1)
      return "decoding request " + std::to_string(r->id()) + " is more than one token behind";
    if (!in_flight_ && run->cache.pending_checkpoint >= 0)
      return "request " + std::to_string(r->id()) + " holds a pending checkpoint between steps";
    live.push_back(&run->cache);
  }
  for (const Request* r : waiting_) {
    if (!seen.insert(r).second) return "request " + std::to_string(r->id()) + " is queued twice or running";
    if (!r->is<Waiting>() && !r->is<Preempted>())
      return "request " + std::to_string(r->id()) + " is queued but " + state_name(r->state());
  }
  if (seen.size() != requests_.size()) return "requests known but neither queued nor running (or finished but kept)";
  if (num_running() > config_.max_num_seqs) return "more running requests than max_num_seqs";
  if (auto e = cache_.check(live); !e.empty()) return "cache: " + e;
  return "";
}

}  // namespace k3::scheduler
