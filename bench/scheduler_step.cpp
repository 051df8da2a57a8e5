// bench/scheduler_step.cpp: host time of one engine step with N running decoding requests,
// model time excluded; prints a table and writes a JSON result bundle.
//
//   k3bench_scheduler_step [--running 1,16,64,256] [--steps 2000] [--prompt 128] [--out FILE]
//
// Two measurements per N, after every request has finished its prompt:
//   scheduler  Scheduler::schedule + Scheduler::update (tokens given, no model):
//              admission, budget, page growth, checkpoint boundaries, prefix registration of
//              each filled page, stop checks, events
//   engine     Engine::step with an executor that returns zero logits at once: the above plus
//              inbox, per-request greedy sampling over --vocab, event delivery to streams
// The prefix cache is on (a checkpoint every 4 pages of 16), so page growth, hashing and
// checkpoint bookkeeping are all in the measured steps.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>

#include "bench/bundle.h"
#include "cli/args.h"
#include "engine/engine.h"
#include "evidence/environment.h"
#include "scheduler/scheduler.h"

using namespace k3;
using Clock = std::chrono::steady_clock;

namespace {

struct Setup {
  cache::CacheConfig cache;
  scheduler::SchedulerConfig sched;
};

// Output tokens a request may make: the timed steps, plus the steps that finish the other
// prompts after its own (every prompt token passes through the 8192-token budget once), so no
// request finishes before the last timed step.
int64_t max_tokens_of(int32_t running, int64_t prompt, int64_t steps) {
  return steps + int64_t{running} * prompt / 8192 + running + 32;
}

Setup make_setup(int32_t running, int64_t prompt, int64_t steps) {
  Setup s;
  const int64_t len = prompt + max_tokens_of(running, prompt, steps) + 32;
  s.cache.block_size = 16;
  s.cache.num_slots = running;
  s.cache.num_blocks = static_cast<int32_t>(running * ((len + 15) / 16 + 1));
  s.cache.num_checkpoints = running * 2;
  s.cache.checkpoint_interval_blocks = 4;
  s.sched.max_num_seqs = running;
  s.sched.max_num_batched_tokens = std::max<int32_t>(running, 8192);
  s.sched.long_prefill_token_threshold = 2048;
  s.sched.max_partial_prefills = running;
  s.sched.max_long_partial_prefills = running;
  s.sched.max_model_len = len;
  return s;
}

std::vector<int32_t> prompt_of(int64_t n, int32_t salt, int32_t vocab = 1000) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) p[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7919 + salt * 104729) % vocab);
  return p;
}

struct Timing {
  std::vector<double> us;
  double median() const { return bench::median(us); }
  double p99() const {
    std::vector<double> s = us;
    std::sort(s.begin(), s.end());
    return s.empty() ? 0 : s[static_cast<size_t>(0.99 * static_cast<double>(s.size() - 1))];
  }
};

Timing time_scheduler(int32_t running, int64_t prompt, int64_t steps) {
  const Setup s = make_setup(running, prompt, steps);
  scheduler::Scheduler sched(s.sched, s.cache);
  for (int32_t i = 0; i < running; ++i) {
    scheduler::RequestSpec r;
    r.prompt = prompt_of(prompt, i);
    r.max_tokens = max_tokens_of(running, prompt, steps);
    sched.add(static_cast<scheduler::RequestId>(i + 1), std::move(r));
  }
  scheduler::StepPlan out;
  std::vector<scheduler::RequestEvent> events;
  std::vector<int32_t> sampled;
  auto one_step = [&](int64_t k) {
    sched.schedule(out);
    sampled.assign(static_cast<size_t>(out.num_samples), static_cast<int32_t>(k % 1000));
    events.clear();
    sched.update(out, sampled, events);
    return out.seqs.size();
  };
  while (sched.counters().decode_tokens == 0 || out.num_prefills > 0) {  // until every prompt is done
    K3_CHECK(sched.has_work(), "bench: no work left before decoding");
    one_step(0);
  }
  Timing t;
  t.us.reserve(static_cast<size_t>(steps));
  for (int64_t k = 0; k < steps; ++k) {
    const auto t0 = Clock::now();
    const size_t n = one_step(k);
    t.us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    if (n != static_cast<size_t>(running))
      throw core::Error("bench: step " + std::to_string(k) + " decoded " + std::to_string(n) + " of " +
                        std::to_string(running) + " requests (" + std::to_string(sched.num_running()) + " running, " +
                        std::to_string(sched.num_waiting()) + " waiting, " + std::to_string(out.preempted.size()) +
                        " preempted, " + std::to_string(out.num_prefills) + " prefills)");
  }
  return t;
}

class ZeroLogitsExecutor final : public engine::Executor {
 public:
  explicit ZeroLogitsExecutor(int32_t vocab) : vocab_(vocab) {}
  int32_t vocab_size() const override { return vocab_; }
  void release(scheduler::RequestId) override {}
  core::Tensor execute(const scheduler::StepPlan& plan, core::LogitsAt) override {
    const int64_t rows = plan.num_logit_rows;
    if (logits_.dim(0) != rows || logits_.dim(1) != vocab_)
      logits_ = core::Tensor::zeros(core::DType::f32, {rows, vocab_});
    return logits_;
  }

 private:
  int32_t vocab_;
  core::Tensor logits_ = core::Tensor::zeros(core::DType::f32, {1, 1});
};

Timing time_engine(int32_t running, int64_t prompt, int64_t steps, int32_t vocab) {
  const Setup s = make_setup(running, prompt, steps);
  engine::EngineConfig ec;
  ec.cache = s.cache;
  ec.scheduler = s.sched;
  engine::Engine eng(ec, std::make_unique<ZeroLogitsExecutor>(vocab));
  std::vector<std::shared_ptr<engine::TokenStream>> streams;
  for (int32_t i = 0; i < running; ++i) {
    engine::GenerateRequest r;
    r.prompt = prompt_of(prompt, i, vocab);
    r.max_tokens = max_tokens_of(running, prompt, steps);
    streams.push_back(eng.submit(std::move(r)).stream);
  }
  auto drain = [&] {
    for (auto& st : streams)
      while (st->try_next()) {
      }
  };
  while (eng.stats().decode_tokens < running) {
    K3_CHECK(eng.step() && eng.stats().failed == 0, "bench: the engine stopped before every request decoded");
    drain();
  }
  Timing t;
  for (int64_t k = 0; k < steps; ++k) {
    const auto t0 = Clock::now();
    eng.step();
    t.us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    drain();  // the client side, outside the timed step
  }
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    cli::Args args("k3bench_scheduler_step",
                   {{"running", "N,N,...", "running (decoding) requests per measurement", "1,16,64,256"},
                    {"steps", "N", "timed steps per measurement", "2000"},
                    {"prompt", "N", "prompt tokens per request", "128"},
                    {"vocab", "N", "vocabulary of the engine measurement (greedy sampling cost)", "1024"},
                    {"out", "FILE", "JSON bundle path", "scheduler_step.json"}},
                   {argv + 1, static_cast<size_t>(argc - 1)});
    if (args.help_requested()) {
      std::cout << args.usage();
      return 0;
    }
    const std::vector<int32_t> running = args.get_ids("running");
    const int64_t steps = args.get_int("steps"), prompt = args.get_int("prompt");
    const auto vocab = static_cast<int32_t>(args.get_int("vocab"));
    K3_CHECK(steps >= 1 && prompt >= 1 && vocab >= 2, "--steps, --prompt must be >= 1 and --vocab >= 2");
    std::printf("%-8s %16s %14s %16s %14s\n", "running", "scheduler µs/step", "p99 µs", "engine µs/step", "p99 µs");
    nlohmann::json rows = nlohmann::json::array();
    for (int32_t n : running) {
      K3_CHECK(n >= 1, "--running values must be >= 1");
      const Timing sch = time_scheduler(n, prompt, steps);
      const Timing eng = time_engine(n, prompt, steps, vocab);
      std::printf("%-8d %16.2f %14.2f %16.2f %14.2f\n", n, sch.median(), sch.p99(), eng.median(), eng.p99());
      rows.push_back({{"running", n},
                      {"scheduler_us_median", sch.median()},
                      {"scheduler_us_p99", sch.p99()},
                      {"engine_us_median", eng.median()},
                      {"engine_us_p99", eng.p99()},
                      {"scheduler_us", sch.us},
                      {"engine_us", eng.us}});
    }
    nlohmann::json bundle = {
        {"benchmark", "scheduler_step"},
        {"environment", evidence::environment()},
        {"config",
         {{"steps", steps},
          {"prompt_tokens", prompt},
          {"vocab", vocab},
          {"block_size", 16},
          {"checkpoint_interval_blocks", 4},
          {"prefix_cache", true}}},
        {"results", rows},
    };
    std::ofstream(args.get("out")) << bundle.dump(1) << "\n";
    std::cout << "wrote " << args.get("out") << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  }
}
