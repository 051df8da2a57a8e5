// kernels/registry.h: every op of the model, each with its implementations per backend.
//
// Each op has an Args struct (its numeric contract, in kernels/<op>/<op>.h), a check
// (shape/dtype validation, done once in the wrapper), and implementations registered as
// {name, device, priority, supports(args) -> Status with a reason, run(args)}. Model code
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
  int priority = 0;      // higher wins among those whose supports() accepts the args
  std::function<core::Status(const Args&)> supports;
  std::function<void(const Args&)> run;
};

template <class Args>
class OpTable {
 public:
  using CheckFn = core::Status (*)(const Args&);
  OpTable(std::string op, CheckFn check) : op_(std::move(op)), check_(check) {}

  const std::string& op() const { return op_; }
  void add(OpImpl<Args> impl) { impls_.push_back(std::move(impl)); }
  const std::vector<OpImpl<Args>>& impls() const { return impls_; }

  // Validates args, then returns the highest-priority implementation on `device` that
  // supports them; throws core::Error listing every candidate's reason otherwise.
  const OpImpl<Args>& select(const Args& a, core::Device device) const {
    if (core::Status s = check_(a); !s) throw core::Error(op_ + ": " + s.reason());
    const OpImpl<Args>* best = nullptr;
    std::string reasons;
    for (const auto& impl : impls_) {
      if (impl.device != device) continue;
      core::Status s = impl.supports ? impl.supports(a) : core::Status::ok();
      if (!s) {
        reasons += " [" + impl.name + ": " + s.reason() + "]";
        continue;
      }
      if (!best || impl.priority > best->priority) best = &impl;
    }
    if (!best)
      throw core::Error(op_ + ": no implementation on " + std::string(core::device_name(device)) +
                        " supports these arguments" + (reasons.empty() ? "" : ":" + reasons));
    note_choice(*best);
    return *best;
  }
  void run(const Args& a, core::Device device) const {
    const OpImpl<Args>& impl = select(a, device);
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

  // A caller that took another route after find() failed says so (--explain shows it).
  void note_skipped(const std::string& why, core::Device device) const {
    if (recorder_) recorder_->note(op_, "not used: " + why, device);
  }

  void set_log(LogFn log) { log_ = std::move(log); }
  void set_recorder(OpRecorder* recorder) { recorder_ = recorder; }

 private:
  void note_choice(const OpImpl<Args>& impl) const {
    if (!log_) return;
    std::lock_guard<std::mutex> lk(mu_);
    std::string key = std::string(core::device_name(impl.device)) + "/" + impl.name;
    if (logged_.insert(key).second) log_("kernel " + op_ + " -> " + key);
  }
  std::string op_;
  CheckFn check_;
  std::vector<OpImpl<Args>> impls_;
  LogFn log_;
  OpRecorder* recorder_ = nullptr;
  mutable std::mutex mu_;
  mutable std::set<std::string> logged_;
};

struct Registry {
  OpTable<EmbeddingArgs> embedding{"embedding", embedding_check};
  OpTable<RmsNormArgs> rmsnorm{"rmsnorm", rmsnorm_check};
  OpTable<LinearArgs> linear{"linear", linear_check};
  OpTable<AttnResMixArgs> attn_res_mix{"attn_res_mix", attn_res_mix_check};
  OpTable<SituGluArgs> situ_glu{"situ_glu", situ_glu_check};
  OpTable<RouterTopkArgs> router_topk{"router_topk", router_topk_check};
  OpTable<MoeExpertsArgs> moe_experts{"moe_experts", moe_experts_check};
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
  OpTable<MultiLinearArgs> multi_linear{"multi_linear", multi_linear_check};
  OpTable<AttnResBankArgs> attn_res_bank{"attn_res_bank", attn_res_bank_check};
  OpTable<AttnResMergeArgs> attn_res_merge{"attn_res_merge", attn_res_merge_check};
  OpTable<KdaDecodeArgs> kda_decode{"kda_decode", kda_decode_check};
  OpTable<MlaDecodeArgs> mla_decode{"mla_decode", mla_decode_check};
  OpTable<MoeTailCombineArgs> moe_tail_combine{"moe_tail_combine", moe_tail_combine_check};
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
};

// Registers the CPU reference implementation of every op (priority 0, supports everything
// its check accepts on CPU f32 activations).
void register_reference_ops(Registry& r);

// Registers the CUDA implementation of every op (priority > 0, Device::cuda) on device 0, all
// running on one stream (kernels/cuda_ops.h has the form taking an explicit context). Without a
// usable GPU they are registered anyway and their supports() says why; in a build without CUDA
// (K3_HAVE_CUDA unset) this registers nothing.
void register_cuda_ops(Registry& r);

}  // namespace k3::kernels
