// kernels/op_table.h: one op's table of implementations, and what registering them needs.
//
// Each op has an Args struct (its numeric contract, in its family folder kernels/<family>/), a check
// (shape/dtype validation, done once in the wrapper), a shape measure its tuning rules are keyed
// by, and implementations registered as {name, device, supports(args) -> Status with a reason,
// run(args)}; supports() answers only "is it correct for these arguments", and which capable one
// runs is the tuning table's (kernels/tuning.h). Each family folder holds its op tables in one
// struct (kernels/<family>/ops.h) with the registration of its CPU references (CpuOps: the threads
// they run on) and its CUDA implementations (CudaOps: the context they run on); kernels/registry.h
// puts the families together.
#pragma once
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/device_memory.h"
#include "core/error.h"
#include "core/step_route.h"
#include "kernels/common.h"
#include "kernels/tuning.h"

namespace k3::backends::cuda {
class Context;
}

namespace k3::kernels {

using LogFn = std::function<void(const std::string&)>;

// Records which implementation ran for each op call while started: `--explain` prints a step's
// plan from it, and tests use it to prove that a fused kernel (not a fallback) ran. One recorder
// may watch several registries (every rank of a TP group); record() is thread-safe.
class OpRecorder {
 public:
  struct Call {
    std::string op, impl, device;
    int depth = 0;  // > 0: run from inside another recorded op (a composite op's parts)
    // With a clock (set_clock): indexes into the clock's marks at the call's start and end.
    int64_t begin_mark = -1, end_mark = -1;
  };
  // Times every recorded call with `clock`'s stream-ordered marks (core::DeviceMemory::mark; read
  // them with take_marks_ms() after stop()); nullptr: no timing.
  void set_clock(core::DeviceMemory* clock) {
    std::lock_guard lk(mu_);
    clock_ = clock;
  }
  void start() {
    std::lock_guard lk(mu_);
    calls_.clear();
    open_.clear();
    marks_ = 0;
    on_ = true;
  }
  std::vector<Call> stop() {
    std::lock_guard lk(mu_);
    on_ = false;
    return std::move(calls_);
  }
  // A call starts (before the implementation runs).
  void record(const std::string& op, const std::string& impl, core::Device device) {
    std::lock_guard lk(mu_);
    if (!on_) return;
    Call c{op, impl, std::string(core::device_name(device)), static_cast<int>(open_.size())};
    if (clock_) {
      clock_->mark();
      c.begin_mark = marks_++;
    }
    open_.push_back(calls_.size());
    calls_.push_back(std::move(c));
  }
  // An entry that is not a call (an op a caller decided not to use): untimed, never open.
  void note(const std::string& op, const std::string& impl, core::Device device) {
    std::lock_guard lk(mu_);
    if (on_) calls_.push_back({op, impl, std::string(core::device_name(device)), static_cast<int>(open_.size())});
  }
  // The innermost started call has returned (its work is queued).
  void finish() {
    std::lock_guard lk(mu_);
    if (!on_ || open_.empty()) return;
    Call& c = calls_[open_.back()];
    open_.pop_back();
    if (clock_) {
      clock_->mark();
      c.end_mark = marks_++;
    }
  }

 private:
  std::mutex mu_;
  bool on_ = false;
  core::DeviceMemory* clock_ = nullptr;
  int64_t marks_ = 0;
  std::vector<size_t> open_;  // indexes of the calls that have started and not finished
  std::vector<Call> calls_;
};

// The op calls of one run on one registry, in call order (a composite op's parts right after it):
// what model::DecodeGraphs records while it captures a graph (core::StepRoute::kernels). Apart from
// OpRecorder, which --explain and tests may hold at the same time. Calls come from the one thread
// that runs the registry's model, so it takes no lock.
class OpTrace {
 public:
  void start() {
    calls_.clear();
    on_ = true;
  }
  core::KernelList stop() {
    on_ = false;
    return std::move(calls_);
  }
  void add(const std::string& op, const std::string& impl) {
    if (on_) calls_.push_back({op, impl});
  }

 private:
  bool on_ = false;
  core::KernelList calls_;
};

template <class Args>
struct OpImpl {
  std::string name;  // strategy name, e.g. "reference", "decode_splitkv"
  core::Device device;
  // Whether this implementation is correct for the arguments (never whether it is the fastest:
  // that is the tuning table's, kernels/tuning.h); nullptr: every argument the check accepts.
  std::function<core::Status(const Args&)> supports;
  std::function<void(const Args&)> run;
};

// The shape measure an op's tuning rules are keyed by: "rows" -> x.dim(0), ...; an op without one
// has a single bucket (size 0).
template <class Args>
struct OpMeasure {
  std::string name = "any";
  int64_t (*of)(const Args&) = nullptr;
};

// Times the capable implementations of op calls as the model makes them (bench/op_tuner.h): while
// set on a table, every run() with two or more capable implementations on its device hands them
// all to observe() first. Nested op calls made while observe() runs go straight through.
class OpTuner {
 public:
  struct Candidate {
    std::string name;
    std::function<void()> run;
  };
  virtual ~OpTuner() = default;
  virtual void observe(const std::string& op, const std::string& measure, int64_t size,
                       const std::vector<Candidate>& candidates) = 0;
  bool busy = false;
};

template <class Args>
class OpTable {
 public:
  using CheckFn = core::Status (*)(const Args&);
  OpTable(std::string op, CheckFn check, OpMeasure<Args> measure = {})
      : op_(std::move(op)), check_(check), measure_(std::move(measure)) {}

  const std::string& op() const { return op_; }
  const std::string& measure() const { return measure_.name; }
  int64_t size_of(const Args& a) const { return measure_.of ? measure_.of(a) : 0; }
  void add(OpImpl<Args> impl) { impls_.push_back(std::move(impl)); }
  const std::vector<OpImpl<Args>>& impls() const { return impls_; }

  // Validates args, then returns the first implementation on `device` whose supports() accepts
  // them, in the order the device's tuning rule for (op, size) gives (then the unlisted ones in
  // registration order); throws core::Error listing every candidate's reason when none does.
  const OpImpl<Args>& select(const Args& a, core::Device device) const { return choose(a, device, nullptr); }
  void run(const Args& a, core::Device device) const {
    const OpImpl<Args>& impl = select(a, device);
    if (tuner_ && !tuner_->busy) offer_to_tuner(a, device);
    if (trace_) trace_->add(op_, impl.name);
    if (!recorder_) return impl.run(a);
    recorder_->record(op_, impl.name, device);
    impl.run(a);
    recorder_->finish();
  }
  // The implementation run() would pick, or nullptr with `why` set (the check's or every
  // candidate's reason): lets a caller take another route instead of failing.
  const OpImpl<Args>* find(const Args& a, core::Device device, std::string* why) const {
    try {
      return &select(a, device);
    } catch (const core::Error& e) {
      if (why) *why = e.what();
      return nullptr;
    }
  }
  // Why select() picks what it picks: "tuning/h200.json rows 2..16" or "registration order".
  std::string reason(const Args& a, core::Device device) const {
    std::string why;
    choose(a, device, &why);
    return why;
  }

  // A caller that took another route after find() failed says so (--explain shows it).
  void note_skipped(const std::string& why, core::Device device) const {
    if (recorder_) recorder_->note(op_, "not used: " + why, device);
  }

  void set_log(LogFn log) { log_ = std::move(log); }
  void set_recorder(OpRecorder* recorder) { recorder_ = recorder; }
  void set_trace(OpTrace* trace) { trace_ = trace; }
  void set_tuner(OpTuner* tuner) { tuner_ = tuner; }
  // The tables `device`'s selection reads. Throws core::Error when a table names this op with
  // another measure or lists an implementation that is not registered on the device.
  void set_tuning(core::Device device, const Tuning& tuning) {
    for (const auto* table : {tuning.gpu.get(), tuning.fallback.get()}) {
      if (!table) continue;
      const auto it = table->ops().find(op_);
      if (it == table->ops().end()) continue;
      K3_CHECK(it->second.measure == measure_.name, table->source() + ": ops." + op_ + ".measure is '" +
                                                        it->second.measure + "', the op's is '" + measure_.name + "'");
      for (const TuningRule& rule : it->second.rules)
        for (const std::string& name : rule.order) {
          bool known = false;
          for (const auto& impl : impls_) known = known || (impl.device == device && impl.name == name);
          K3_CHECK(known, table->source() + ": ops." + op_ + " lists '" + name +
                              "', which is not an implementation on " + std::string(core::device_name(device)));
        }
    }
    tuning_[static_cast<size_t>(device)] = tuning;
  }

 private:
  const OpImpl<Args>& choose(const Args& a, core::Device device, std::string* why_chosen) const {
    if (core::Status s = check_(a); !s) throw core::Error(op_ + ": " + s.reason());
    const int64_t size = size_of(a);
    const std::string* source = nullptr;
    const TuningRule* rule = tuning_[static_cast<size_t>(device)].find(op_, size, &source);
    // Rank: position in the rule's order, then registration order after the listed names.
    const auto rank = [&](size_t i) {
      if (rule)
        for (size_t p = 0; p < rule->order.size(); ++p)
          if (rule->order[p] == impls_[i].name) return p;
      return (rule ? rule->order.size() : 0) + i;
    };
    const OpImpl<Args>* best = nullptr;
    size_t best_rank = 0;
    std::string reasons;
    for (size_t i = 0; i < impls_.size(); ++i) {
      const OpImpl<Args>& impl = impls_[i];
      if (impl.device != device) continue;
      core::Status s = impl.supports ? impl.supports(a) : core::Status::ok();
      if (!s) {
        reasons += " [" + impl.name + ": " + s.reason() + "]";
        continue;
      }
      if (const size_t r = rank(i); !best || r < best_rank) best = &impl, best_rank = r;
    }
    if (!best)
      throw core::Error(op_ + ": no implementation on " + std::string(core::device_name(device)) +
                        " supports these arguments" + (reasons.empty() ? "" : ":" + reasons));
    // The reason is only spelled out for reason() and the log, not on every call.
    if (why_chosen || log_) {
      const std::string why = rule ? *source + " " + describe_sizes(measure_.name, *rule) : "registration order";
      if (why_chosen) *why_chosen = why;
      note_choice(*best, size, why);
    }
    return *best;
  }
  void offer_to_tuner(const Args& a, core::Device device) const {
    std::vector<OpTuner::Candidate> candidates;
    for (const auto& impl : impls_)
      if (impl.device == device && (!impl.supports || impl.supports(a)))
        candidates.push_back({impl.name, [&impl, &a] { impl.run(a); }});
    if (candidates.size() < 2) return;
    tuner_->busy = true;
    try {
      tuner_->observe(op_, measure_.name, size_of(a), candidates);
    } catch (...) {
      tuner_->busy = false;
      throw;
    }
    tuner_->busy = false;
  }
  void note_choice(const OpImpl<Args>& impl, int64_t size, const std::string& why) const {
    if (!log_) return;
    std::lock_guard<std::mutex> lk(mu_);
    std::string key = std::string(core::device_name(impl.device)) + "/" + impl.name;
    if (logged_.insert(key).second)
      log_("kernel " + op_ + " -> " + key + " (first at " + measure_.name + " " + std::to_string(size) + ": " + why +
           ")");
  }
  std::string op_;
  CheckFn check_;
  OpMeasure<Args> measure_;
  std::vector<OpImpl<Args>> impls_;
  Tuning tuning_[2];  // per core::Device (cpu, cuda)
  LogFn log_;
  OpRecorder* recorder_ = nullptr;
  OpTrace* trace_ = nullptr;
  OpTuner* tuner_ = nullptr;
  mutable std::mutex mu_;
  mutable std::set<std::string> logged_;
};

// What every CPU reference captures: the threads it splits its work over (shared by every rank of
// a TP group on the CPU; the owner makes it, there is no process-wide pool).
struct CpuOps {
  std::shared_ptr<backends::cpu::ThreadPool> pool;
};

// What every CUDA op captures: the context it runs on, or (no usable device) why there is none,
// so the implementations are registered either way and supports() explains a missing GPU.
//
// Activation convention on CUDA: the op Args' "f32 [T, D]" activations are bf16 device tensors in
// engine mode (Precision::bf16) or f32 device tensors (either precision; f32 + Precision::fp32 is
// the exact mode the tests compare tightly). Weights stay as in the checkpoint (bf16 / f32 / MXFP4
// packed codes + E8M0 scales, uploaded as they are); router and lm_head logits are f32; the KDA
// recurrent state is f32 V-major; the KDA conv state is bf16 or f32; the MLA cache is bf16, f32 or
// fp8 e4m3. Each implementation's supports() names what it cannot handle.
struct CudaOps {
  std::shared_ptr<backends::cuda::Context> ctx;
  std::string unavailable;  // set when ctx is null
  core::Status usable() const {
    return ctx ? core::Status::ok() : core::Status::fail("no usable CUDA device: " + unavailable);
  }
};

// A family's ops.cpp registers each op's CPU reference with one of these: a reference that splits
// its work takes the pool as its last argument.
template <class Args>
void add_reference(OpTable<Args>& table, const CpuOps&, void (*fn)(const Args&)) {
  table.add(OpImpl<Args>{"reference", core::Device::cpu, nullptr, fn});
}
template <class Args>
void add_reference(OpTable<Args>& table, const CpuOps& cpu, void (*fn)(const Args&, backends::cpu::ThreadPool*)) {
  table.add(OpImpl<Args>{"reference", core::Device::cpu, nullptr,
                         [pool = cpu.pool, fn](const Args& a) { fn(a, pool.get()); }});
}

}  // namespace k3::kernels
