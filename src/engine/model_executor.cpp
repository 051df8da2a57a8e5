// engine/model_executor.cpp: ModelExecutor.
#include "engine/model_executor.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "engine/shadow_validation.h"
#include "model/decode_graphs.h"
#include "model/kv_storage.h"
#include "model/model.h"
#include "runner/device_sampler.h"

namespace k3::engine {

namespace {
// A scheduler block of block_size tokens is block_size / dcp local positions on each rank under
// decode context parallelism (model/layers/context.h ContextSplit).
int32_t page_tokens(int32_t block_size, int dcp) {
  K3_CHECK(dcp >= 1 && block_size % dcp == 0, "decode context parallelism: the cache block_size " +
                                                  std::to_string(block_size) + " must be a multiple of dcp " +
                                                  std::to_string(dcp) +
                                                  " (each rank holds block_size / dcp of its tokens)");
  return block_size / dcp;
}

model::KvStorageConfig storage_config(const cache::CacheConfig& c, model::KvCacheDtype kv_dtype, int dcp) {
  c.validate();
  model::KvStorageConfig s;
  s.num_blocks = c.num_blocks;
  s.block_size = page_tokens(c.block_size, dcp);
  s.num_slots = c.num_slots;
  s.num_checkpoints = c.enable_prefix_cache ? c.num_checkpoints : 0;
  s.kv_dtype = kv_dtype;
  return s;
}
}  // namespace

scheduler::ExecutionScope execution_scope(const model::Model& model, const model::DecodeGraphs* graphs) {
  scheduler::ExecutionScope sc;
  const model::Model::FusedScope fused = model.fused_scope();
  sc.fused_selected = fused.selected;
  sc.fused_problem = fused.problem;
  sc.fused_max_rows = fused.max_rows;
  if (graphs) {
    sc.graph_max_batch = model::DecodeGraphs::kMaxBatch;
    sc.graph_max_rows = model::DecodeGraphs::kMaxRows;
    sc.graph_max_blocks = graphs->max_blocks_per_seq();
    sc.graph_kernels = graphs->kernels();
  }
  return sc;
}

core::StepRoute route_batch(const model::Model& model, const model::DecodeGraphs* graphs,
                            std::span<const model::SequenceInput> batch) {
  scheduler::StepPlan plan;
  for (const model::SequenceInput& in : batch) {
    scheduler::ScheduledSequence q;
    q.kind = in.kind;
    q.num_tokens = static_cast<int32_t>(in.tokens.size());
    q.num_drafts = in.verify ? q.num_tokens - 1 : 0;
    q.num_blocks = in.state ? static_cast<int32_t>(in.state->block_table.size()) : 0;
    plan.seqs.push_back(q);
    plan.num_tokens += q.num_tokens;
    ++(in.kind == core::StepKind::decode ? plan.num_decodes : plan.num_prefills);
  }
  return scheduler::route_step(plan, execution_scope(model, graphs));
}

cache::CacheConfig size_model_cache(const config::K3Config& config, model::KvCacheDtype kv_dtype,
                                    const cache::CacheConfig& base, int64_t budget_bytes, double checkpoint_fraction,
                                    int64_t max_model_len, int dcp) {
  cache::CacheBudget b;
  b.bytes = budget_bytes;
  b.bytes_per_block = model::KvStorage::bytes_per_block(config, page_tokens(base.block_size, dcp), kv_dtype);
  b.bytes_per_kda_state = model::KvStorage::bytes_per_kda_state(config);
  b.checkpoint_fraction = checkpoint_fraction;
  const auto min_blocks = static_cast<int32_t>((max_model_len + base.block_size - 1) / base.block_size);
  return cache::size_cache(b, base, min_blocks);
}

void apply_model_defaults(const config::K3Config& model, scheduler::SchedulerConfig& sched,
                          const cache::CacheConfig& cache, int32_t* eos_token_id) {
  if (sched.chunk_align_tokens == 0) {
    const int32_t kda = std::max(model.kda.chunk_size, 1);
    sched.chunk_align_tokens = (kda + cache.block_size - 1) / cache.block_size * cache.block_size;
  }
  if (eos_token_id) *eos_token_id = model.eos_token_id;
  sched.validate(cache);
}

struct ModelExecutor::State {
  State(const model::Model& m, const cache::CacheConfig& cache, model::KvCacheDtype kv_dtype)
      : model(m),
        storage(m.config(), storage_config(cache, kv_dtype, m.options().dcp), m.memory(), m.options().precision) {}
  const model::Model& model;
  model::KvStorage storage;
  std::unordered_map<scheduler::RequestId, model::SequenceState> states;  // node-based: stable pointers
  std::vector<model::SequenceInput> batch;
  model::VerifyCapture capture;                 // the last execute()'s verify rows, until commit_verified
  model::HiddenTaps taps;                       // the drafter's tap layers (empty: none) and the last step's values
  core::Tensor taps_host;                       // host f32 [rows, layers * hidden]
  std::unique_ptr<model::DecodeGraphs> graphs;  // null: every step eager
  std::unique_ptr<runner::DeviceSampler> device_sampler;  // null: logits always come back to the host
  // Shadow validation: the standard path's inputs (copies of the step's states, so theirs do not
  // advance) and the last shadowed step's report.
  std::vector<model::SequenceState> shadow_states;
  std::vector<model::SequenceInput> shadow_batch;
  std::optional<ShadowReport> shadow;
};

namespace {
using Seconds = std::chrono::duration<double>;

// The standard path on the step's inputs, before the fused step runs them: every sequence in
// verify mode (its KDA slot keeps its committed state) on a copy of its state (num_tokens does not
// advance). It writes each sequence's new MLA rows, which the fused step then writes again.
core::Tensor run_shadow(const model::Model& model, model::KvStorage& storage,
                        std::span<const model::SequenceInput> batch, std::vector<model::SequenceState>& states,
                        std::vector<model::SequenceInput>& inputs, model::LogitRows rows) {
  states.clear();
  inputs.clear();
  for (const model::SequenceInput& in : batch) states.push_back(*in.state);
  for (size_t i = 0; i < batch.size(); ++i) {
    model::SequenceInput in = batch[i];
    in.state = &states[i];
    in.verify = true;
    inputs.push_back(in);
  }
  model::VerifyCapture discarded;
  return model.forward(storage, inputs, rows, nullptr, &discarded, nullptr, core::LogitsAt::host,
                       core::DecodePath::standard);
}

std::string step_shapes(const StepPlan& plan) {
  int64_t lo = -1, hi = 0;
  for (const scheduler::ScheduledSequence& q : plan.seqs) {
    lo = lo < 0 ? q.start : std::min(lo, q.start);
    hi = std::max(hi, q.start);
  }
  std::string s = "step " + std::to_string(plan.step) + ": " + std::to_string(plan.seqs.size()) + " sequences, " +
                  std::to_string(plan.num_tokens) + " rows (" + std::to_string(plan.num_verifies) +
                  " verifies), contexts " + std::to_string(lo) + ".." + std::to_string(hi);
  if (plan.route.graph.captured())
    s += ", graph " + std::to_string(plan.route.graph.batch) + "x" + std::to_string(plan.route.graph.rows);
  return s;
}
}  // namespace

ModelExecutor::ModelExecutor(const model::Model& model, const cache::CacheConfig& cache, model::KvCacheDtype kv_dtype,
                             int64_t graph_max_model_len)
    : s_(std::make_unique<State>(model, cache, kv_dtype)) {
  // Tensor-parallel ranks capture too: each rank's graph holds its step's collectives.
  if (graph_max_model_len > 0 && model.options().device != core::Device::cpu)
    s_->graphs = std::make_unique<model::DecodeGraphs>(model, s_->storage,
                                                       (graph_max_model_len + cache.block_size - 1) / cache.block_size);
  // Sampling on the device needs the logits on this model's device, which a TP rank's executor
  // does not hand out (engine/tp_executor.h returns rank 0's host logits).
  if (model.options().device != core::Device::cpu && model.tp_size() == 1)
    s_->device_sampler = std::make_unique<runner::DeviceSampler>(model.ops(), model.memory());
}

ModelExecutor::~ModelExecutor() = default;

int32_t ModelExecutor::vocab_size() const { return s_->model.config().vocab_size; }
void ModelExecutor::release(scheduler::RequestId id) { s_->states.erase(id); }
const ShadowReport* ModelExecutor::last_shadow() const { return s_->shadow ? &*s_->shadow : nullptr; }
const core::Tensor* ModelExecutor::hidden_taps() const { return s_->taps.layers.empty() ? nullptr : &s_->taps_host; }
runner::DeviceSampler* ModelExecutor::device_sampler() { return s_->device_sampler.get(); }
scheduler::ExecutionScope ModelExecutor::scope() const { return execution_scope(s_->model, s_->graphs.get()); }
model::KvStorage& ModelExecutor::storage() { return s_->storage; }
size_t ModelExecutor::num_states() const { return s_->states.size(); }
int64_t ModelExecutor::graph_replays() const { return s_->graphs ? s_->graphs->replays() : 0; }

core::Tensor ModelExecutor::execute(const StepPlan& plan, core::LogitsAt at) {
  State& s = *s_;
  K3_CHECK(at == core::LogitsAt::host ||
               (s.device_sampler && plan.num_verifies == 0 && !plan.host_logits && s.taps.layers.empty()),
           "ModelExecutor: device logits asked for a step that needs them on the host");
  for (scheduler::RequestId id : plan.preempted) s.states.erase(id);
  for (const scheduler::ScheduledSequence& q : plan.seqs) {  // every reset and restore before any save
    if (q.slot_init == scheduler::SlotInit::restore) s.storage.restore_checkpoint(q.restore_checkpoint, q.kda_slot);
    else if (q.slot_init == scheduler::SlotInit::reset) s.storage.reset_slot(q.kda_slot);
  }
  s.batch.clear();
  for (const scheduler::ScheduledSequence& q : plan.seqs) {
    model::SequenceState* st = nullptr;
    if (q.fresh()) {
      st = &s.states[q.id];
      st->num_tokens = q.start;
      st->kda_slot = q.kda_slot;
    } else {
      const auto it = s.states.find(q.id);
      K3_CHECK(it != s.states.end(), "ModelExecutor: request " + std::to_string(q.id) + " continues but has no state");
      st = &it->second;
      K3_CHECK(st->num_tokens == q.start && st->kda_slot == q.kda_slot,
               "ModelExecutor: request " + std::to_string(q.id) + " state holds " + std::to_string(st->num_tokens) +
                   " tokens, the plan starts at " + std::to_string(q.start));
    }
    st->block_table = plan.blocks_of(q);  // the cache manager's table, valid through this step
    s.batch.push_back(model::SequenceInput{plan.tokens_of(q), st, q.kind, q.verify(),
                                           q.logits_out == scheduler::LogitsOut::every_row});
  }
  s.capture.clear();  // a failed step may have left one: its requests are gone
  model::HiddenTaps* taps = s.taps.layers.empty() ? nullptr : &s.taps;
  const model::LogitRows rows = plan.num_logit_rows > static_cast<int64_t>(plan.seqs.size())
                                    ? model::LogitRows::requested
                                    : model::LogitRows::last;
  // The plan's route: its decode path, and its graph bucket (pure-decode steps and verify steps of
  // equal draft counts replay captured graphs: DecodeGraphs).
  const core::StepRoute& route = plan.route;
  K3_CHECK(!route.graph.captured() || s.graphs,
           "ModelExecutor: the plan routes a step to a graph this executor does not capture");
  model::VerifyCapture* capture = plan.num_verifies > 0 ? &s.capture : nullptr;
  s.shadow.reset();
  core::Tensor shadow_logits;
  double shadow_s = 0;
  if (route.shadow) {
    K3_CHECK(route.path == core::DecodePath::fused, "ModelExecutor: a shadow is asked for a step off the fused path");
    const auto t0 = std::chrono::steady_clock::now();
    shadow_logits = run_shadow(s.model, s.storage, s.batch, s.shadow_states, s.shadow_batch, rows);
    shadow_s = Seconds(std::chrono::steady_clock::now() - t0).count();
  }
  // An eager shadowed step records its kernels (a captured one's are its graph's: the route's).
  kernels::OpTrace& trace = s.model.ops().trace();
  const bool trace_kernels = route.shadow && !route.graph.captured();
  struct TraceOff {  // a step that throws leaves the trace off
    kernels::OpTrace* trace;
    ~TraceOff() {
      if (trace) trace->stop();
    }
  } trace_off{trace_kernels ? &trace : nullptr};
  if (trace_kernels) trace.start();
  core::Tensor logits = route.graph.captured()
                            ? s.graphs->forward(s.batch, route, at, capture, taps)
                            : s.model.forward(s.storage, s.batch, rows, nullptr, capture, taps, at, route.path);
  if (route.shadow) {
    core::KernelList kernels;
    if (trace_kernels) kernels = trace.stop();
    else if (route.kernels) kernels = *route.kernels;
    else if (auto captured = s.graphs->kernels()->find(route.path, route.graph)) kernels = *captured;  // captured now
    const core::Tensor fused = logits.view().device == core::Device::cpu && logits.dtype() == core::DType::f32
                                   ? logits
                                   : s.model.memory()->download_f32(logits.view());
    ShadowReport report = compare_logits(fused, shadow_logits,
                                         shadow_tolerance(s.model.options().precision == kernels::Precision::fp32));
    report.seconds = shadow_s;
    report.shapes = step_shapes(plan);
    report.kernels = summarize_kernels(kernels);
    s.shadow = std::move(report);
  }
  if (taps) {  // host [rows, layers * hidden], row-major, the layers side by side
    const int64_t H = s.model.config().hidden_size, n = static_cast<int64_t>(s.taps.layers.size());
    s.taps_host = core::Tensor::zeros(core::DType::f32, {plan.num_tokens, n * H});
    for (int64_t i = 0; i < n; ++i) {
      const core::Tensor& v = s.taps.values[static_cast<size_t>(i)];
      const core::Tensor host = v.view().device == core::Device::cpu && v.dtype() == core::DType::f32
                                    ? v
                                    : s.model.memory()->download_f32(v.view());
      K3_CHECK(host.dim(0) == plan.num_tokens && host.dim(1) == H, "ModelExecutor: a tap has the wrong shape");
      for (int64_t r = 0; r < plan.num_tokens; ++r)
        std::copy_n(host.data<const float>() + r * H, H, s.taps_host.data<float>() + (r * n + i) * H);
    }
  }
  for (const scheduler::ScheduledSequence& q : plan.seqs)
    if (q.save_checkpoint >= 0) s.storage.save_checkpoint(q.kda_slot, q.save_checkpoint);
  return logits;
}

void ModelExecutor::commit_verified(std::span<const int32_t> accepted_rows) {
  State& s = *s_;
  // After a verify step replayed from a graph, its commit replays one too (DecodeGraphs tells).
  if (s.graphs) s.graphs->commit_verified(s.capture, accepted_rows);
  else s.model.commit_verified(s.storage, s.capture, accepted_rows);
}

void ModelExecutor::set_hidden_tap(std::span<const int32_t> layers) {
  State& s = *s_;
  for (int32_t l : layers)
    K3_CHECK(l >= 0 && l + 1 < s.model.config().num_hidden_layers,
             "ModelExecutor: tap layer " + std::to_string(l) + " has no next layer (the model has " +
                 std::to_string(s.model.config().num_hidden_layers) + ")");
  s.taps.layers.assign(layers.begin(), layers.end());
}

}  // namespace k3::engine
