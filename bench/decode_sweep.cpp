// bench/decode_sweep.cpp: the decode sweep of k3bench_decode_gpu (bench/decode_gpu.cpp has the
// command line): one checkpoint opened once with runner::ModelRunner (or runner::TpRunner), decode
// steps timed for every ctx x batch x decode backend x mode.
//
// Backends: the runner's model is built with the first --decode-backend; every other backend gets a
// sibling model::Model over the SAME weights, registry, device memory and communicator (a Model
// only references its weights; it owns a copy of the small router biases), with the fused path
// attached as the runners attach it (fastpath::attach). So the weights are loaded once, and each
// backend keeps its own decode-path counters and its own model::DecodeGraphs.
//
// Context, per ctx: built synthetically, not prefilled (8K tokens x 64 sequences through the model
// would take minutes): one model::KvStorage on the model's memory, sized for the largest ctx x the
// largest batch, whose MLA pages are all refilled with random fp8 latents (magnitudes 0.25..3.75,
// never NaN) and whose KDA state / conv slots get small random values, saved to KDA checkpoint i =
// slot i; each sequence gets a shuffled block table covering ctx + one row's steps. The seeds do not
// depend on ctx, the backend or the mode. Every row (ctx, batch, backend, mode) starts from that
// context: num_tokens = ctx, the KDA slots restored from their checkpoints, the same first tokens.
// A row's steps only write MLA rows at positions >= ctx, each before any step reads it, so rows that
// differ only in the backend compare like for like.
//
// Steps: Model::forward(kv, batch, LogitRows::last) of StepKind::decode, one token per sequence,
// each fed the argmax of its previous logits: "eager" (every kernel launched per step) and "graph"
// (model::DecodeGraphs of this ctx's table width: the step captured once per batch size and
// replayed, as the engine serves pure-decode steps); "verify": speculative verify steps with
// SYNTHETIC acceptance (each sequence runs its last token + K drafts with KDA in no-commit mode,
// then Model::commit_verified keeps AL rows; eager) and "verify-graph" (the same steps through
// model::DecodeGraphs, which captures a verify step per (batch, K + 1) and the KDA commit per
// accepted-count vector, as the engine serves them; a step of more than DecodeGraphs::kMaxRows rows runs
// eagerly, as in the engine, and its row shows no kernel count). A step's time is the wall time of the call,
// logits download included; tokens/s = batch * tokens per step per sequence / median step time.
// A row's decode_path is the change of its model's counters over the row (warm-up included): the
// steps each path ran and every fallback with its reason, so a row that fell back shows it.
//
// Bytes per step follow spec §12's counting from the actual config: every non-expert weight once
// (lm_head included; the embedding only its B rows), the expected distinct routed experts per MoE
// layer 896(1 - (1 - 16/896)^B) x the per-expert MXFP4 bytes, KDA state + conv state read and
// written, the fp8 latent cache read (ctx + 1 tokens) and written, AttnRes 2 x (bank rows + 1) x
// hidden bf16 per token per layer. GB/s = bytes / step time; the floor is bytes / the device copy
// bandwidth measured in the same run.
#include "bench/decode_sweep.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <string>
#include <thread>

#include "bench/bundle.h"
#include "bench/decode_sweep_internal.h"
#include "bench/op_tuner.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/param_inventory.h"
#include "checkpoint/safetensors.h"
#include "config/k3_config.h"
#include "core/bf16.h"
#include "core/rng.h"
#include "engine/model_executor.h"
#include "fastpath/fused_decode.h"
#include "model/decode_graphs.h"
#include "model/kv_storage.h"
#include "runner/model_runner.h"
#include "runner/tp_runner.h"
#ifdef K3_HAVE_NCCL
#include "comm/nccl_comm.h"
#endif

namespace k3::bench {

namespace fs = std::filesystem;
using clock_type = std::chrono::steady_clock;

using namespace sweep_detail;

namespace {

constexpr int32_t kBlockSize = 16;              // tokens per MLA page
constexpr double kSpecBytesPerSecond = 4.3e12;  // spec §12

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[static_cast<size_t>(std::lround(p * static_cast<double>(v.size() - 1)))];
}

std::string backend_name(model::DecodeBackend b) { return std::string(model::decode_backend_name(b)); }

nlohmann::json path_json(const core::DecodePathCounters& p) {
  nlohmann::json fallbacks = nlohmann::json::object();
  for (const auto& [reason, n] : p.fallbacks) fallbacks[reason] = n;
  return {{"fused_steps", p.fused_steps}, {"standard_steps", p.standard_steps}, {"fallbacks", fallbacks}};
}

void add_counts(core::DecodePathCounters& total, const core::DecodePathCounters& more) {
  total.fused_steps += more.fused_steps;
  total.standard_steps += more.standard_steps;
  for (const auto& [reason, n] : more.fallbacks) {
    auto it = std::find_if(total.fallbacks.begin(), total.fallbacks.end(),
                           [&](const auto& f) { return f.first == reason; });
    if (it == total.fallbacks.end()) total.fallbacks.emplace_back(reason, n);
    else it->second += n;
  }
}

// ------------------------------------------------------------------ one row

struct Row {
  int64_t ctx = 0, batch = 0;
  model::DecodeBackend backend = model::DecodeBackend::standard;
  std::string mode;
  std::vector<double> ms;  // timed steps (warm-up left out)
  size_t kernels = 0;
  bool finite = true;
  int64_t tokens_per_seq = 1;         // tokens a step yields per sequence (verify: the synthetic AL)
  core::DecodePathCounters path;      // this row's steps (warm-up included) per path, fallbacks by reason
  std::vector<int32_t> final_tokens;  // each sequence's last argmax: rows that differ only in mode agree
  std::vector<int32_t> trajectory;    // every step's argmax, [steps][B] (eager and graph modes)
  StepBytes bytes;
  nlohmann::json profile;  // --profile, eager rows: profile_step()'s result
};

// Runs one row's warm-up + timed steps from the context's start: sequences 0..B-1 at num_tokens =
// ctx with their KDA slots restored, the same first tokens. Every rank of a TP group calls it alike.
Row run_row(const DecodeSweepOptions& o, const model::Model& model, model::DecodeGraphs* graphs, model::KvStorage& kv,
            std::vector<model::SequenceState>& seqs, int64_t ctx, int64_t B, const std::string& mode, int32_t vocab) {
  core::DeviceMemory& memory = *model.memory();
  Row row;
  row.ctx = ctx;
  row.batch = B;
  row.backend = model.options().decode_backend;
  row.mode = mode;
  std::vector<int32_t> ids(static_cast<size_t>(B));
  for (int64_t i = 0; i < B; ++i) {
    seqs[i].num_tokens = ctx;
    kv.restore_checkpoint(static_cast<int32_t>(i), seqs[i].kda_slot);
    ids[i] = static_cast<int32_t>((i * 7919 + 1) % vocab);
  }
  memory.synchronize();
  const int steps_per_run = o.warmup + o.steps;
  std::vector<model::SequenceInput> batch(static_cast<size_t>(B));
  const bool verify = mode == "verify" || mode == "verify-graph";
  if (verify) {
    // Speculative verify with synthetic acceptance: every sequence runs [last, K drafts] through
    // the decode path (KDA no-commit), then AL rows are kept (KDA replay, MLA truncation). A step =
    // forward + commit_verified; it yields AL tokens per sequence.
    const int64_t R = o.spec_k + 1;
    std::vector<int32_t> rows_ids(static_cast<size_t>(B * R));
    const std::vector<int32_t> keep(static_cast<size_t>(B), o.spec_al);
    model::VerifyCapture capture;
    for (int step = 0; step < steps_per_run; ++step) {
      for (int64_t i = 0; i < B; ++i) {
        rows_ids[i * R] = ids[i];
        for (int64_t j = 1; j < R; ++j) rows_ids[i * R + j] = static_cast<int32_t>((ids[i] + 31 * j) % vocab);
        batch[i] = {std::span<const int32_t>(&rows_ids[i * R], static_cast<size_t>(R)), &seqs[i],
                    model::StepKind::decode,
                    /*verify=*/true};
      }
      // A verify step DecodeGraphs does not take (more than kMaxRows rows) runs eagerly, as the
      // engine would run it; the row then reports no kernel count. Routing is host work the
      // engine does while planning: outside the timed step.
      const core::StepRoute route = engine::route_batch(model, mode == "verify-graph" ? graphs : nullptr, batch);
      row.path.count(route);
      const auto ts = clock_type::now();
      const bool replay = route.graph.captured();
      const core::Tensor logits = replay ? graphs->forward(batch, route, model::LogitsAt::host, &capture)
                                         : model.forward(kv, batch, model::LogitRows::requested, nullptr, &capture,
                                                         nullptr, model::LogitsAt::host, route.path);
      if (replay) graphs->commit_verified(capture, keep);
      else model.commit_verified(kv, capture, keep);
      memory.synchronize();
      const double ms = 1e3 * seconds_since(ts);
      if (step >= o.warmup) row.ms.push_back(ms);
      const int64_t V = logits.dim(1);
      for (int64_t i = 0; i < B; ++i) {  // the next "last token": argmax of the last kept row
        const float* r = logits.data<const float>() + (i * R + o.spec_al - 1) * V;
        row.finite &= std::isfinite(r[0]);
        ids[i] = static_cast<int32_t>(std::max_element(r, r + V) - r);
      }
    }
    row.tokens_per_seq = o.spec_al;
  }
  for (int step = 0; !verify && step < steps_per_run; ++step) {
    for (int64_t i = 0; i < B; ++i)
      batch[i] = {std::span<const int32_t>(&ids[i], 1), &seqs[i], model::StepKind::decode};
    const core::StepRoute route = engine::route_batch(model, mode == "graph" ? graphs : nullptr, batch);
    row.path.count(route);
    const auto ts = clock_type::now();
    const core::Tensor logits = route.graph.captured()
                                    ? graphs->forward(batch, route)
                                    : model.forward(kv, batch, model::LogitRows::last, nullptr, nullptr, nullptr,
                                                    model::LogitsAt::host, route.path);
    const double ms = 1e3 * seconds_since(ts);
    if (step >= o.warmup) row.ms.push_back(ms);
    const int64_t V = logits.dim(1);
    for (int64_t i = 0; i < B; ++i) {  // greedy: feed each sequence its argmax (the same on every rank)
      const float* r = logits.data<const float>() + i * V;
      int64_t best = 0;
      for (int64_t v = 0; v < V; ++v) {
        row.finite &= std::isfinite(r[v]);
        if (r[v] > r[best]) best = v;
      }
      ids[i] = static_cast<int32_t>(best);
    }
    row.trajectory.insert(row.trajectory.end(), ids.begin(), ids.end());
  }
  if (mode == "graph") row.kernels = graphs->kernels_per_step(static_cast<int>(B));
  if (mode == "verify-graph")
    row.kernels = graphs->kernels_per_step(static_cast<int>(B), static_cast<int>(o.spec_k + 1));
  row.final_tokens = ids;
  return row;
}

// One more eager decode step of the row's B sequences (their last greedy tokens).
void eager_decode_step(const model::Model& model, model::KvStorage& kv, std::vector<model::SequenceState>& seqs,
                       const std::vector<int32_t>& last) {
  const auto B = static_cast<int64_t>(last.size());
  std::vector<model::SequenceInput> batch(static_cast<size_t>(B));
  for (int64_t i = 0; i < B; ++i) batch[i] = {std::span<const int32_t>(&last[i], 1), &seqs[i], model::StepKind::decode};
  model.forward(kv, batch, model::LogitRows::last, nullptr, nullptr, nullptr, model::LogitsAt::host,
                engine::route_batch(model, nullptr, batch).path);
}

// eager_decode_step with every op call timed: `recorder` (installed on the model's registry by the
// caller) marks the device stream before and after each call, so a call's time is from when the
// stream reached its start to when it finished the call's work, launch gaps included. Calls inside
// another op (depth > 0) are shown apart and not added to the totals. Under --tp this is rank 0's
// step while the other ranks run theirs: the collectives are not ops, so their time is in the step
// but outside the top-level ops. Prints the table; returns it as JSON.
nlohmann::json profile_step(const model::Model& model, model::KvStorage& kv, std::vector<model::SequenceState>& seqs,
                            const std::vector<int32_t>& last, kernels::OpRecorder& recorder, int num_layers) {
  core::DeviceMemory& memory = *model.memory();
  memory.synchronize();
  memory.take_marks_ms();  // drop stale marks
  recorder.set_clock(&memory);
  recorder.start();
  eager_decode_step(model, kv, seqs, last);
  const std::vector<kernels::OpRecorder::Call> calls = recorder.stop();
  recorder.set_clock(nullptr);
  const std::vector<double> marks = memory.take_marks_ms();
  K3_CHECK(!marks.empty(), "--profile: the device returned no timing marks");
  struct Entry {
    std::string op, impl;
    int depth;
    int64_t calls = 0;
    double ms = 0;
  };
  std::vector<Entry> entries;  // in order of first call
  double top_ms = 0;
  for (const auto& c : calls) {
    if (c.begin_mark < 0 || c.end_mark < 0) continue;  // a note, not a call
    const double ms = marks.at(static_cast<size_t>(c.end_mark)) - marks.at(static_cast<size_t>(c.begin_mark));
    auto it = std::find_if(entries.begin(), entries.end(), [&](const Entry& e) {
      return e.op == c.op && e.impl == c.impl && e.depth == std::min(c.depth, 1);
    });
    if (it == entries.end()) it = entries.insert(entries.end(), Entry{c.op, c.impl, std::min(c.depth, 1)});
    ++it->calls;
    it->ms += ms;
    if (c.depth == 0) top_ms += ms;
  }
  const double step_ms = marks.back() - marks.front();
  std::stable_sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) { return a.ms > b.ms; });
  std::printf(
      "    profile (one eager step, op calls timed on the stream): %.3f ms from the first op's start to the last "
      "op's end, %.3f ms inside top-level ops, %.3f ms between them (launch gaps%s)\n",
      step_ms, top_ms, step_ms - top_ms, model.tp_size() > 1 ? "; collectives" : "");
  std::printf("    %-24s %-30s %6s %10s %12s %7s\n", "op", "implementation", "calls", "total us", "us/layer", "share");
  nlohmann::json ops = nlohmann::json::array();
  for (const Entry& e : entries) {
    const std::string op = (e.depth > 0 ? "  (inside) " : "") + e.op;
    std::printf("    %-24s %-30s %6lld %10.1f %12.2f %6.1f%%\n", op.c_str(), e.impl.c_str(),
                static_cast<long long>(e.calls), e.ms * 1e3, e.ms * 1e3 / num_layers,
                step_ms > 0 ? 100.0 * e.ms / step_ms : 0.0);
    ops.push_back({{"op", e.op},
                   {"impl", e.impl},
                   {"nested", e.depth > 0},
                   {"calls", e.calls},
                   {"total_us", e.ms * 1e3},
                   {"us_per_layer", e.ms * 1e3 / num_layers}});
  }
  std::fflush(stdout);
  return {{"step_ms", step_ms}, {"top_level_ops_ms", top_ms}, {"num_layers", num_layers}, {"ops", ops}};
}

// A model on `base`'s weights, registry, memory and communicator with decode backend `backend`, the
// fused path attached as runner::ModelRunner / TpRunner attach it. Loads and copies no weights.
std::unique_ptr<model::Model> model_with_backend(const model::Model& base, model::DecodeBackend backend,
                                                 comm::Communicator* comm, int cuda_device) {
  model::ModelOptions mo = base.options();
  mo.decode_backend = backend;
  auto m = std::make_unique<model::Model>(base.config(), base.weights(), base.ops(), mo, base.memory(), comm);
  fastpath::attach(*m, cuda_device);
  return m;
}

}  // namespace

// ------------------------------------------------------------------ public

bool has_checkpoint(const fs::path& dir) {
  return fs::exists(dir / "config.json") &&
         (fs::exists(dir / checkpoint::kSingleFileName) || fs::exists(dir / checkpoint::kIndexFileName));
}

double make_checkpoint_if_needed(const fs::path& dir, const std::string& config, uint64_t seed, bool make,
                                 int32_t vocab_size) {
  if (has_checkpoint(dir)) {
    if (vocab_size > 0) {
      const config::K3Config there = config::resolve_config((dir / "config.json").string());
      K3_CHECK(there.vocab_size == vocab_size, "the checkpoint in " + dir.string() + " has vocab_size " +
                                                   std::to_string(there.vocab_size) + ", not the " +
                                                   std::to_string(vocab_size) + " asked for");
    }
    std::printf("using the checkpoint in %s\n", dir.string().c_str());
    return 0;
  }
  K3_CHECK(make, "no checkpoint in " + dir.string() + " (config.json + model.safetensors); pass --make to write one");
  config::K3Config cfg = config::resolve_config(config);
  if (vocab_size > 0) cfg.vocab_size = vocab_size;
  checkpoint::WriteOptions w;
  w.seed = seed;
  w.mxfp4 = true;
  config::K3Config written = cfg;
  written.mxfp4.enabled = true;
  const int64_t need = inventory_bytes(written);
  fs::create_directories(dir);
  const auto space = fs::space(dir);
  const int64_t margin = int64_t{1} << 30;
  if (static_cast<int64_t>(space.available) < need + margin) {
    char msg[256];
    std::snprintf(msg, sizeof msg, ": %.2f GB free, the checkpoint needs %.2f GB + 1 GB margin",
                  static_cast<double>(space.available) / 1e9, static_cast<double>(need) / 1e9);
    throw core::Error("not enough disk space for the " + config + " checkpoint in " + dir.string() + msg);
  }
  std::printf("writing %s (%.2f GB, MXFP4 experts, seed %llu) to %s on %u threads ...\n", config.c_str(), need / 1e9,
              static_cast<unsigned long long>(seed), dir.string().c_str(), std::thread::hardware_concurrency());
  std::fflush(stdout);
  const auto t0 = clock_type::now();
  checkpoint::write_random_checkpoint(cfg, w, dir);
  const double s = seconds_since(t0);
  std::printf("  wrote %.2f GB in %.1f s (%.2f GB/s)\n", need / 1e9, s, need / 1e9 / s);
  return s;
}

int64_t inventory_bytes(const config::K3Config& c) {
  int64_t n = 0;
  for (const checkpoint::ParamSpec& s : checkpoint::expected_params(c))
    n += s.shapes[0].numel() * static_cast<int64_t>(core::dtype_size(s.dtypes[0]));
  return n;
}

nlohmann::json run_decode_sweep(const DecodeSweepOptions& o, nlohmann::json env, double make_seconds) {
  K3_CHECK(!o.batches.empty() && !o.ctxs.empty() && !o.backends.empty() && !o.modes.empty(),
           "decode sweep: the batches, ctx, decode backends and modes must each name at least one");
  const std::string device_name = env.contains("gpu") && env["gpu"].is_object() ? env["gpu"]["name"].get<std::string>()
                                                                                : "CPU (reference ops)";

  // Open: map and check the checkpoint, upload every tensor (lazily mapped pages are read as the
  // upload touches them: no separate read-in pass). With --tp each rank's slices go to its GPU. The
  // runner's model gets the first backend; the others are siblings on its weights (file comment).
  model::ModelOptions mo;
  mo.device = o.device;
  mo.precision = o.precision;
  mo.decode_backend = o.backends.front();
  mo.dcp = o.dcp ? o.tp : 1;
  mo.expert_parallel = o.ep;
  std::printf("opening %s on %s (tp %d%s%s) ...\n", o.model.string().c_str(), device_name.c_str(), o.tp,
              o.dcp ? ", decode context parallel" : "", o.ep ? ", expert parallel" : "");
  std::fflush(stdout);
  const auto t0 = clock_type::now();
  std::unique_ptr<runner::ModelRunner> single;
  std::unique_ptr<runner::TpRunner> ranks;
  if (o.tp == 1) single = runner::ModelRunner::open(o.model, mo, model::KvCacheDtype::fp8_e4m3);
  else ranks = runner::TpRunner::open(o.model, o.tp, mo, model::KvCacheDtype::fp8_e4m3);
  const double load_seconds = seconds_since(t0);
  const config::K3Config& full = single ? single->config() : ranks->config();
  const config::K3Config& c = single ? single->config() : ranks->rank_config();  // what one GPU holds
  const int64_t weight_bytes = inventory_bytes(full);
  // The name shown: --config when the checkpoint holds that config (MXFP4 experts), else the folder's.
  config::K3Config named = config::resolve_config(o.config);
  named.mxfp4.enabled = true;
  named.mxfp4.group_size = 32;
  const fs::path folder = o.model.filename().empty() ? o.model.parent_path() : o.model;
  const std::string label = named.hash() == full.hash() ? o.config : folder.filename().string();
  std::printf("opened %s on %s in %.1f s (%.2f GB of weights; read + upload %.2f GB/s)\n", o.model.string().c_str(),
              device_name.c_str(), load_seconds, weight_bytes / 1e9, weight_bytes / 1e9 / load_seconds);

  // Storage for the largest batch at the largest ctx plus room for one row's steps; one KDA
  // checkpoint per slot holds the context's state that every row starts from.
  const int64_t maxB = *std::max_element(o.batches.begin(), o.batches.end());
  const int64_t max_ctx = *std::max_element(o.ctxs.begin(), o.ctxs.end());
  const auto has_mode = [&](const char* m) { return std::find(o.modes.begin(), o.modes.end(), m) != o.modes.end(); };
  const int64_t steps_per_run = o.warmup + o.steps;
  // A verify step writes K+1 rows and keeps AL: room for the last step's K+1 past the kept ones.
  const int64_t tokens_per_run = has_mode("verify") || has_mode("verify-graph")
                                     ? steps_per_run * o.spec_al + o.spec_k + 1
                                     : steps_per_run;
  // Pages per sequence on one rank: under DCP a rank stores ceil(tokens / dcp) of them (block
  // tables count local positions).
  const auto pages_for = [&](int64_t ctx) {
    const int64_t local = (ctx + tokens_per_run + mo.dcp - 1) / mo.dcp;
    return (local + kBlockSize - 1) / kBlockSize;
  };
  model::KvStorageConfig sc;
  K3_CHECK(maxB * pages_for(max_ctx) <= std::numeric_limits<int32_t>::max(), "--ctx x --batches: too many MLA pages");
  sc.num_blocks = static_cast<int32_t>(maxB * pages_for(max_ctx));
  sc.block_size = kBlockSize;
  sc.num_slots = static_cast<int32_t>(maxB);
  sc.num_checkpoints = static_cast<int32_t>(maxB);
  sc.kv_dtype = model::KvCacheDtype::fp8_e4m3;

  // One rank's whole measurement (every rank runs it in lock step; rank 0 records): the rows, the
  // copy bandwidth, and each backend's counters over the whole run.
  kernels::OpRecorder profile_recorder;
  std::unique_ptr<OpTuningRecorder> tuner;
  core::Tensor l2_flush;
  if (!o.tune.empty()) {
    K3_CHECK(single && o.modes == std::vector<std::string>{"eager"}, "--tune needs --modes eager and --tp 1");
    core::DeviceMemory* clock = single->model().memory().get();
    // Filled before every timed run: 256 MiB, more than any GPU's L2, so each run reads from HBM as
    // the model's decode step does.
    l2_flush = clock->empty(core::DType::u8, {int64_t{256} << 20});
    const core::TensorView flush = l2_flush.view();
    tuner = std::make_unique<OpTuningRecorder>(
        [clock, flush](const std::function<void()>& run) { return time_us_on(*clock, &flush, run); }, o.tune_runs);
  }
  std::vector<Row> rows;
  double copy_bw = 0;
  std::vector<core::DecodePathCounters> totals(o.backends.size());
  const auto measure = [&](int rank, const model::Model& base, comm::Communicator* comm) {
    core::DeviceMemory& memory = *base.memory();
    const bool record = rank == 0;
    const double bw = measure_copy_bandwidth(memory,
                                             o.device == core::Device::cuda ? int64_t{2} << 30 : int64_t{64} << 20);
    if (record) {
      copy_bw = bw;
      std::printf("device copy %.0f GB/s (read + write)\n", copy_bw / 1e9);
    }
#ifdef K3_HAVE_NCCL
    // A captured collective must never allocate: size the scratch for the largest one up front
    // (the packed [latent | hidden] f32 all-reduce of a MoE layer, or the logits all-gather).
    if (auto* nccl = dynamic_cast<comm::NcclComm*>(comm)) {
      const int64_t widest = std::max<int64_t>(c.moe.routed_expert_hidden_size + c.hidden_size,
                                               int64_t{c.vocab_size} * o.tp);
      nccl->reserve_scratch(comm::NcclComm::scratch_bytes_for(maxB * widest, core::DType::f32, o.tp));
    }
#endif
    std::vector<std::unique_ptr<model::Model>> siblings;
    std::vector<const model::Model*> models;  // per backend, in --decode-backend order
    for (const model::DecodeBackend b : o.backends) {
      if (b == base.options().decode_backend) {
        models.push_back(&base);
      } else {
        siblings.push_back(model_with_backend(base, b, comm, rank));
        models.push_back(siblings.back().get());
      }
    }
    model::KvStorage kv(c, sc, base.memory(), mo.precision);
    std::vector<model::SequenceState> seqs(static_cast<size_t>(maxB));
    std::vector<int32_t> pages;  // the block tables of seqs view it
    for (const int64_t ctx : o.ctxs) {
      const auto tf = clock_type::now();
      build_context(memory, kv, c, o.seed, rank, pages_for(ctx), seqs, pages);
      if (record) {
        double mla = 0, kda = 0;
        for (int l = 0; l < c.num_hidden_layers; ++l) {
          if (c.attn_kind(l) == config::AttnKind::mla) mla += static_cast<double>(kv.mla_pages(l).nbytes());
          else kda += static_cast<double>(kv.kda_states(l).nbytes() + kv.conv_states(l).nbytes());
        }
        std::printf(
            "synthetic context: %lld sequences x %lld tokens (storage for %lld: fp8 latent pages %.2f GB, KDA state + "
            "conv %.2f GB per GPU, as much again in checkpoints) in %.1f s\nper row (as measured):\n",
            static_cast<long long>(maxB), static_cast<long long>(ctx), static_cast<long long>(max_ctx), mla / 1e9,
            kda / 1e9, seconds_since(tf));
        std::fflush(stdout);
      }
      // Graphs per backend (a model's own) at this ctx's table width, dropped with the ctx.
      std::vector<std::unique_ptr<model::DecodeGraphs>> graphs(models.size());
      if (has_mode("graph") || has_mode("verify-graph"))
        for (size_t k = 0; k < models.size(); ++k)
          graphs[k] = std::make_unique<model::DecodeGraphs>(*models[k], kv, pages_for(ctx));
      for (const int64_t B : o.batches) {
        for (size_t k = 0; k < models.size(); ++k) {
          for (const std::string& mode : o.modes) {
            Row row = run_row(o, *models[k], graphs[k].get(), kv, seqs, ctx, B, mode, full.vocab_size);
            if (record) add_counts(totals[k], row.path);
            const bool profile = o.profile && mode == "eager";
            if (!record) {
              if (profile) eager_decode_step(*models[k], kv, seqs, row.final_tokens);  // joins rank 0's collectives
              continue;
            }
            const double med = median(row.ms);
            std::printf(
                "  ctx %6lld batch %3lld %-19s %-6s: %8.2f ms/step (p10 %.2f, p90 %.2f), %8.1f tok/s, %lld fused / %lld "
                "standard steps%s%s\n",
                static_cast<long long>(ctx), static_cast<long long>(B), backend_name(row.backend).c_str(), mode.c_str(),
                med, percentile(row.ms, 0.1), percentile(row.ms, 0.9), 1e3 * B * row.tokens_per_seq / med,
                static_cast<long long>(row.path.fused_steps), static_cast<long long>(row.path.standard_steps),
                row.kernels ? (", " + std::to_string(row.kernels) + " kernels/step").c_str() : "",
                row.finite ? "" : ", NON-FINITE LOGITS");
            std::fflush(stdout);
            if (profile) {  // rank 0's registry only: its stream is the clock
              if (single) single->set_op_recorder(&profile_recorder);
              else ranks->set_op_recorder(&profile_recorder, 0);
              row.profile = profile_step(*models[k], kv, seqs, row.final_tokens, profile_recorder, c.num_hidden_layers);
              if (single) single->set_op_recorder(nullptr);
              else ranks->set_op_recorder(nullptr, 0);
            }
            if (tuner) {
              single->set_op_tuner(tuner.get());
              eager_decode_step(*models[k], kv, seqs, row.final_tokens);
              single->set_op_tuner(nullptr);
            }
            // A verify step moves what B * (K+1) decode rows move (every row reads its context).
            row.bytes = step_bytes(c, kv, mode == "verify" || mode == "verify-graph" ? B * (o.spec_k + 1) : B, ctx,
                                   mo.dcp);
            rows.push_back(std::move(row));
          }
        }
      }
    }
  };
  if (single) measure(0, single->model(), nullptr);
  else ranks->run([&](int rank, const model::Model& m, comm::Communicator& comm) { measure(rank, m, &comm); });
  // Which path ran the steps, per backend over the whole run (latency_specialized falls back per
  // step, with a reason). gpu_check.sh greps these lines.
  nlohmann::json decode_paths = nlohmann::json::array();
  for (size_t k = 0; k < o.backends.size(); ++k) {
    nlohmann::json p = path_json(totals[k]);
    std::printf("decode_backend %s: %lld steps fused, %lld standard%s%s\n", backend_name(o.backends[k]).c_str(),
                static_cast<long long>(totals[k].fused_steps), static_cast<long long>(totals[k].standard_steps),
                p["fallbacks"].empty() ? "" : "; fallbacks ",
                p["fallbacks"].empty() ? "" : p["fallbacks"].dump().c_str());
    p["decode_backend"] = backend_name(o.backends[k]);
    decode_paths.push_back(std::move(p));
  }

  // Speed-up of the fused path: for each latency_specialized row, the auto row of the same ctx,
  // batch and mode: its median step time / this row's (NaN: no such row).
  std::vector<double> speedup(rows.size(), std::nan(""));
  for (size_t i = 0; i < rows.size(); ++i)
    for (const Row& s : rows)
      if (rows[i].backend == model::DecodeBackend::latency_specialized && s.backend == model::DecodeBackend::standard &&
          s.ctx == rows[i].ctx && s.batch == rows[i].batch && s.mode == rows[i].mode)
        speedup[i] = median(s.ms) / median(rows[i].ms);

  // Table and bundle.
  nlohmann::json jrows = nlohmann::json::array();
  std::printf(
      "\n%s decode on %s%s: %d layers, fp8 latent cache, %s activations; median of %d steps after %d warm-up; "
      "device copy %.0f GB/s, floor = bytes per GPU / copy bandwidth; steps = fused/standard steps of the row "
      "(warm-up included); x_auto = auto ms / latency_specialized ms\n",
      label.c_str(), device_name.c_str(), o.tp > 1 ? (" x" + std::to_string(o.tp) + " (TP, NCCL)").c_str() : "",
      c.num_hidden_layers, o.precision == kernels::Precision::fp32 ? "fp32" : "bf16", o.steps, o.warmup, copy_bw / 1e9);
  std::printf("%6s %5s %-19s %-6s %10s %9s %9s %10s %8s %9s %8s %9s %8s %9s %7s\n", "ctx", "batch", "decode_backend",
              "mode", "ms/step", "p10", "p90", "tok/s", "kernels", "GB/step", "GB/s", "floor_ms", "x_floor", "steps",
              "x_auto");
  for (size_t ri = 0; ri < rows.size(); ++ri) {
    const Row& r = rows[ri];
    const double med = median(r.ms), total = r.bytes.total();
    const double floor_ms = total / copy_bw * 1e3;
    const std::string steps = std::to_string(r.path.fused_steps) + "/" + std::to_string(r.path.standard_steps);
    const std::string x_auto = std::isnan(speedup[ri]) ? "-" : [&] {
      char s[32];
      std::snprintf(s, sizeof s, "%.2f", speedup[ri]);
      return std::string(s);
    }();
    std::printf("%6lld %5lld %-19s %-6s %10.2f %9.2f %9.2f %10.1f %8zu %9.2f %8.0f %9.2f %8.2f %9s %7s%s\n",
                static_cast<long long>(r.ctx), static_cast<long long>(r.batch), backend_name(r.backend).c_str(),
                r.mode.c_str(), med, percentile(r.ms, 0.1), percentile(r.ms, 0.9),
                1e3 * r.batch * r.tokens_per_seq / med, r.kernels, total / 1e9, total / (med * 1e-3) / 1e9, floor_ms,
                med / floor_ms, steps.c_str(), x_auto.c_str(), r.finite ? "" : "  NON-FINITE");
    nlohmann::json j = {{"ctx_tokens", r.ctx},
                        {"batch", r.batch},
                        {"decode_backend", backend_name(r.backend)},
                        {"mode", r.mode},
                        {"median_ms", med},
                        {"p10_ms", percentile(r.ms, 0.1)},
                        {"p90_ms", percentile(r.ms, 0.9)},
                        {"samples_ms", r.ms},
                        {"tokens_per_s", 1e3 * r.batch * r.tokens_per_seq / med},
                        {"tokens_per_step_per_seq", r.tokens_per_seq},
                        {"kernels_per_step", r.kernels},
                        {"bytes", r.bytes.json()},
                        {"GBps", total / (med * 1e-3) / 1e9},
                        {"floor_ms_copy", floor_ms},
                        {"ratio_to_copy_floor", med / floor_ms},
                        {"floor_ms_4p3TBps", total / kSpecBytesPerSecond * 1e3},
                        {"ratio_to_4p3TBps_floor", med / (total / kSpecBytesPerSecond * 1e3)},
                        {"logits_finite", r.finite},
                        {"decode_path", path_json(r.path)},
                        {"final_tokens", r.final_tokens}};
    if (!std::isnan(speedup[ri])) j["speedup_vs_auto"] = speedup[ri];
    if (!r.profile.is_null()) j["profile"] = r.profile;
    jrows.push_back(std::move(j));
  }
  for (const Row& r : rows)  // a row that fell back says so, with the reasons
    if (!r.path.fallbacks.empty())
      std::printf("  fallbacks at ctx %lld batch %lld %s %s: %s\n", static_cast<long long>(r.ctx),
                  static_cast<long long>(r.batch), backend_name(r.backend).c_str(), r.mode.c_str(),
                  path_json(r.path)["fallbacks"].dump().c_str());

  // The backends compute one function: rows that differ only in the backend start from the same
  // context and tokens, so their greedy trajectories agree token for token in fp32 (in bf16, the
  // rounding noise of different summation orders may flip a nearly tied route of a random model).
  nlohmann::json agreement = nlohmann::json::array();
  for (const Row& f : rows)
    for (const Row& s : rows)
      if (f.backend == model::DecodeBackend::latency_specialized && s.backend == model::DecodeBackend::standard &&
          s.ctx == f.ctx && s.batch == f.batch && s.mode == f.mode && !f.trajectory.empty() &&
          f.trajectory.size() == s.trajectory.size()) {
        int64_t same = 0, first = -1;
        for (size_t i = 0; i < f.trajectory.size(); ++i) {
          same += f.trajectory[i] == s.trajectory[i];
          if (first < 0 && f.trajectory[i] != s.trajectory[i]) first = static_cast<int64_t>(i) / f.batch;
        }
        const auto n = static_cast<int64_t>(f.trajectory.size());
        std::printf(
            "  tokens latency_specialized vs auto at ctx %lld batch %lld %s: %lld of %lld greedy tokens equal%s\n",
            static_cast<long long>(f.ctx), static_cast<long long>(f.batch), f.mode.c_str(),
            static_cast<long long>(same), static_cast<long long>(n),
            first < 0 ? " (identical)" : (", first difference at step " + std::to_string(first)).c_str());
        agreement.push_back({{"ctx_tokens", f.ctx},
                             {"batch", f.batch},
                             {"mode", f.mode},
                             {"tokens", n},
                             {"equal", same},
                             {"identical", same == n},
                             {"first_different_step", first}});
      }

  if (tuner) {
    const std::string gpu = env.contains("gpu") && env["gpu"].is_object() ? env["gpu"].value("name", "")
                                                                          : std::string("cpu");
    // A rule leaves the stated order (tuning/default.json) only for a win above this share of the
    // summed time: below it two sweeps on one H200 disagreed (docs/perf/tuning.md).
    constexpr double kMargin = 0.03;
    nlohmann::json table = tuner->table(gpu, *kernels::builtin_tuning("").fallback, kMargin);
    table["written_by"] = "k3bench_decode_gpu --tune (bench/op_tuner.h): config " + label + ", batches " +
                          nlohmann::json(o.batches).dump() + ", ctx " + std::to_string(o.ctxs.front()) + ", " +
                          std::to_string(o.tune_runs) +
                          " interleaved timed runs per implementation per call after an L2 flush, margin 3% over "
                          "tuning/default.json";
    table["git_sha"] = env.value("git_sha", "");
    (void)kernels::TuningTable::parse(table.dump(), o.tune.string());  // what is written must read back
    std::ofstream out(o.tune);
    out << table.dump(2) << "\n";
    K3_CHECK(out.good(), "--tune: could not write " + o.tune.string());
    std::printf("wrote the tuning table %s (%zu ops)\n", o.tune.string().c_str(), table["ops"].size());
  }

  nlohmann::json backends = nlohmann::json::array();
  for (const model::DecodeBackend b : o.backends) backends.push_back(backend_name(b));
  return {{"benchmark", "decode_gpu"},
          {"environment", env},
          {"config",
           {{"name", label},
            {"model_dir", o.model.string()},
            {"model", config::to_json(full)},
            {"model_hash", full.hash()},
            {"weight_bytes", weight_bytes},
            {"tp", o.tp},
            {"dcp", mo.dcp},
            {"expert_parallel", o.ep},
            {"rank_model", config::to_json(c)},
            {"batches", o.batches},
            {"verify",
             {{"spec_k", o.spec_k},
              {"synthetic_acceptance_length", o.spec_al},
              {"what",
               "mode verify: SYNTHETIC acceptance; each step runs K+1 rows per sequence (KDA no-commit) "
               "and keeps AL (KDA replay + MLA truncation); tokens/s = B * AL / step time"}}},
            {"ctx_tokens", o.ctxs.front()},
            {"steps", o.steps},
            {"sweep",
             {{"ctx_tokens", o.ctxs},
              {"batches", o.batches},
              {"decode_backends", backends},
              {"modes", o.modes},
              {"order", "for each ctx, for each batch, for each decode_backend, each mode"},
              {"models",
               "one checkpoint loaded once; a sibling model::Model on the same weights per extra "
               "decode_backend, each with its own DecodeGraphs and path counters"}}},
            {"warmup", o.warmup},
            {"block_size", kBlockSize},
            {"kv_cache", "fp8_e4m3"},
            {"precision", o.precision == kernels::Precision::fp32 ? "fp32" : "bf16"},
            {"device", o.device == core::Device::cuda ? "cuda" : "cpu"},
            {"seed", o.seed},
            {"context",
             "synthetic, rebuilt per ctx with the same seeds: random fp8 latent pages, random KDA "
             "state/conv slots; every row starts at num_tokens = ctx with its KDA slots restored"},
            {"feed", "argmax of the previous step's logits"},
            {"timing",
             "wall time of Model::forward (eager) or DecodeGraphs::forward (graph), logits download included; "
             "with tp > 1 rank 0's, every TP collective inside the step"},
            {"bytes",
             "spec §12: non-expert weights incl. lm_head once, 896(1-(1-16/896)^B) distinct experts per MoE "
             "layer x per-expert MXFP4 bytes, KDA state+conv r+w, fp8 latent read (ctx+1) + write, AttnRes "
             "2 x (bank+1) rows x hidden bf16 per token per layer, embedding rows"}}},
          // The first backend's whole-run counters (the field from before the sweep); decode_paths: all.
          {"decode_path", decode_paths.front()},
          {"decode_paths", decode_paths},
          {"checkpoint_write_seconds", make_seconds},
          {"load_seconds", load_seconds},
          {"copy_GBps", copy_bw / 1e9},
          {"floor_GBps_spec", kSpecBytesPerSecond / 1e9},
          {"backend_agreement", agreement},
          {"rows", jrows}};
}

}  // namespace k3::bench
