// kernels/registry.h: every op of the model, each with its implementations per backend.
//
// Each op has an Args struct (its numeric contract, in kernels/<op>/<op>.h), a check
// (shape/dtype validation, done once in the wrapper), a shape measure its tuning rules are keyed
// by, and implementations registered as {name, device, supports(args) -> Status with a reason,
// run(args)}; supports() answers only "is it correct for these arguments", and which capable one
// runs is the tuning table's (kernels/tuning.h). Model code
// calls registry.<op>.run(args, device); nothing branches on backends elsewhere. The
// registry is an explicit object built by register_*() functions: no globals, no static
// initialisers.
#pragma once
#include <functional>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/device_memory.h"
#include "core/error.h"
#include "kernels/attn_res/mix.h"
#include "kernels/attn_res_fused/attn_res_fused.h"
#include "kernels/elementwise/elementwise.h"
#include "kernels/embedding/embedding.h"
#include "kernels/kda/kda.h"
#include "kernels/kda_decode/kda_decode.h"
#include "kernels/linear/linear.h"
#include "kernels/mla/mla.h"
#include "kernels/mla/mla_cp.h"
#include "kernels/mla_decode/mla_decode.h"
#include "kernels/mla_prep/mla_prep.h"
#include "kernels/moe/experts.h"
#include "kernels/moe/router.h"
#include "kernels/moe_tail/moe_tail.h"
#include "kernels/multi_linear/multi_linear.h"
#include "kernels/norm/rmsnorm.h"
#include "kernels/sampling/sampling.h"
#include "kernels/situ/situ_glu.h"
#include "kernels/tuning.h"

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

template <class Args>
struct OpImpl {
  std::string name;      // strategy name, e.g. "reference", "decode_splitkv"
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
          K3_CHECK(known, table->source() + ": ops." + op_ + " lists '" + name + "', which is not an implementation on " +
                              std::string(core::device_name(device)));
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
      log_("kernel " + op_ + " -> " + key + " (first at " + measure_.name + " " + std::to_string(size) + ": " + why + ")");
  }
  std::string op_;
  CheckFn check_;
  OpMeasure<Args> measure_;
  std::vector<OpImpl<Args>> impls_;
  Tuning tuning_[2];  // per core::Device (cpu, cuda)
  LogFn log_;
  OpRecorder* recorder_ = nullptr;
  OpTuner* tuner_ = nullptr;
  mutable std::mutex mu_;
  mutable std::set<std::string> logged_;
};

struct Registry {
  OpTable<EmbeddingArgs> embedding{"embedding", embedding_check};
  OpTable<RmsNormArgs> rmsnorm{"rmsnorm", rmsnorm_check};
  OpTable<LinearArgs> linear{"linear", linear_check, {"rows", [](const LinearArgs& a) { return a.x.dim(0); }}};
  OpTable<AttnResMixArgs> attn_res_mix{"attn_res_mix", attn_res_mix_check};
  OpTable<SituGluArgs> situ_glu{"situ_glu", situ_glu_check};
  OpTable<RouterTopkArgs> router_topk{"router_topk", router_topk_check,
                                      {"tokens", [](const RouterTopkArgs& a) { return a.logits.dim(0); }}};
  OpTable<MoeExpertsArgs> moe_experts{"moe_experts", moe_experts_check,
                                      {"tokens", [](const MoeExpertsArgs& a) { return a.z.dim(0); }}};
  OpTable<KdaConvArgs> kda_conv{"kda_conv", kda_conv_check};
  OpTable<KdaAttentionArgs> kda_recurrent{"kda_recurrent", kda_attention_check};
  OpTable<KdaAttentionArgs> kda_chunked{"kda_chunked", kda_attention_check};
  OpTable<KdaOutputGateArgs> kda_output_gate{"kda_output_gate", kda_output_gate_check};
  OpTable<MlaCacheWriteArgs> mla_cache_write{"mla_cache_write", mla_cache_write_check};
  OpTable<MlaAttentionArgs> mla_naive{"mla_naive", mla_attention_check};
  OpTable<MlaAttentionArgs> mla_absorbed{"mla_absorbed", mla_attention_check};
  OpTable<AddArgs> add{"add", add_check};
  OpTable<SigmoidGateArgs> sigmoid_gate{"sigmoid_gate", sigmoid_gate_check};
  OpTable<ToActivationArgs> to_activation{"to_activation", to_activation_check};  // TP: round a reduced sum
  OpTable<SampleArgs> sample{"sample", sample_check};  // tokens from the step's logits (runner/device_sampler.h)
  // MLA under decode context parallelism (kernels/mla/mla_cp.h):
  OpTable<MlaQAbsorbArgs> mla_q_absorb{"mla_q_absorb", mla_q_absorb_check};
  OpTable<MlaPartialAttentionArgs> mla_partial_attention{"mla_partial_attention", mla_partial_attention_check};
  OpTable<MlaLseRescaleArgs> mla_lse_rescale{"mla_lse_rescale", mla_lse_rescale_check};
  OpTable<MlaWUvArgs> mla_w_uv{"mla_w_uv", mla_w_uv_check};
  OpTable<MlaCacheGatherArgs> mla_cache_gather{"mla_cache_gather", mla_cache_gather_check};  // DCP prefill (mla.h)
  // Fused ops of the latency_specialized decode path (fastpath/), one line each:
  OpTable<MultiLinearArgs> multi_linear{"multi_linear", multi_linear_check,
                                        {"rows", [](const MultiLinearArgs& a) { return a.x.dim(0); }}};
  OpTable<AttnResBankArgs> attn_res_bank{"attn_res_bank", attn_res_bank_check};
  OpTable<AttnResMergeArgs> attn_res_merge{"attn_res_merge", attn_res_merge_check,
                                          {"rows", [](const AttnResMergeArgs& a) { return a.prefix.dim(0); }}};
  OpTable<KdaDecodeArgs> kda_decode{"kda_decode", kda_decode_check,
                                    {"head_seqs", [](const KdaDecodeArgs& a) {
                                       return int64_t{a.num_heads} * a.seqs.num_seqs;  // head x sequence pairs
                                     }}};
  OpTable<MlaDecodeArgs> mla_decode{"mla_decode", mla_decode_check};
  OpTable<MoeTailCombineArgs> moe_tail_combine{"moe_tail_combine", moe_tail_combine_check,
                                              {"rows", [](const MoeTailCombineArgs& a) { return a.u.dim(0); }}};
  OpTable<MlaPrepArgs> mla_prep{"mla_prep", mla_prep_check};

  // Calls fn(table) for every op table (tests use it to check coverage).
  template <class Fn>
  void for_each(Fn&& fn) {
    fn(embedding); fn(rmsnorm); fn(linear); fn(attn_res_mix); fn(situ_glu); fn(router_topk);
    fn(moe_experts); fn(kda_conv); fn(kda_recurrent); fn(kda_chunked); fn(kda_output_gate);
    fn(mla_cache_write); fn(mla_naive); fn(mla_absorbed); fn(add); fn(sigmoid_gate); fn(to_activation);
    fn(sample);
    fn(mla_q_absorb); fn(mla_partial_attention); fn(mla_lse_rescale); fn(mla_w_uv); fn(mla_cache_gather);
    // fused ops (fastpath/), one line each:
    fn(multi_linear);
    fn(attn_res_bank); fn(attn_res_merge);
    fn(kda_decode);
    fn(mla_decode);
    fn(moe_tail_combine);
    fn(mla_prep);
  }
  void set_log(const LogFn& log) {
    for_each([&](auto& t) { t.set_log(log); });
  }
  void set_recorder(OpRecorder* recorder) {
    for_each([&](auto& t) { t.set_recorder(recorder); });
  }
  void set_tuner(OpTuner* tuner) {
    for_each([&](auto& t) { t.set_tuner(tuner); });
  }
  // Every table's selection on `device` reads `tuning` (register_cuda_ops sets the device's).
  void set_tuning(core::Device device, const Tuning& tuning) {
    for_each([&](auto& t) { t.set_tuning(device, tuning); });
  }
};

// Registers the CPU reference implementation of every op (it supports everything its check
// accepts on CPU f32 activations).
void register_reference_ops(Registry& r);

// Registers the CUDA implementations of every op (Device::cuda) on device 0, with the tuning tables
// of that GPU (kernels/tuning.h), all running on one stream (kernels/cuda_ops.h has the form taking an explicit context). Without a
// usable GPU they are registered anyway and their supports() says why; in a build without CUDA
// (K3_HAVE_CUDA unset) this registers nothing.
void register_cuda_ops(Registry& r);

}  // namespace k3::kernels
