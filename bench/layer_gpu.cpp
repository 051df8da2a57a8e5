// bench/layer_gpu.cpp: one decoder layer's decode step on the GPU at the k3-layer-tp8 shapes (spec
// §14.2): Layer A = 0-based layer 85 (KDA+MoE) and Layer B = 87 (MLA+MoE), one TP8 rank's shapes
// (12 KDA / 12 MLA heads, 896 MXFP4 experts of [384, 3584] / [3584, 384], shared [768, 7168] x2 +
// [7168, 768], router and latent projections replicated), hidden 7168, an AttnRes bank of 8 rows,
// an 8K-token context per sequence in an fp8 latent cache, batch 1, 8, 32, 64.
//
// Two decode paths side by side on the same layer, inputs and state: auto =
// model::layer_forward (the model's own standard path: Mix, norm, attention, add, Mix, norm, MoE,
// add); latency_specialized = one layer of fastpath/'s FusedDecodePath::run_step
// (bench/layer_gpu_fused.h: merge of a stand-in previous FFN output + Mix + norm, fused attention,
// merge, fused MoE), whose AttnRes bank write (once per block of 12 layers) is timed as its own
// graph and reported per row as that time / attn_res_block_size beside the layer time.
// Each step runs inside one CUDA graph after an eager warm-up. To keep L2 from flattering, the graph
// holds R copies of the step, each with its own input prefix and bank, KDA slots and cache pages;
// time per layer = graph time / R, median (and p10/p90) over many replays timed with CUDA events.
// Per row: microseconds, kernels launched per layer (graph kernel nodes / R), the op calls of one
// eager step (kernels::OpRecorder: which implementations ran), bytes per layer by spec §12's
// counting rules (from the actual shapes; the same for both paths: they compute the same
// function), achieved GB/s, the floor = bytes / the device-to-device copy bandwidth measured in the
// same run, and the ratio. Collectives are stubbed: single GPU, so the TP all-reduces (after
// o_proj; of the latent + shared partials) are not run. Weights are random (fast PRNG fills); the
// experts are random MXFP4 codes with E8M0 scales near 2^-7 (timing only, not a quantized matrix).
//
//   k3bench_layer_gpu [--out FILE] [--batches 1,8,32,64] [--layers kda,mla] [--replays N]
//                     [--copies R] [--ctx TOKENS] [--paths auto,latency_specialized] [--check] [--seed S]
// --check: per row, eager outputs finite, eager deterministic (bit for bit on a second run from the
// same state) and one graph replay from the same state equal to the eager outputs bit for bit; and
// across paths, from the same KDA state: the standard step's new prefix vs the fused step's
// P + f (bf16 roundings differ: cosine >= 0.999 and finite, not bitwise).
// Prints a table last and writes a JSON result bundle (bench/bundle.h). Exit 0 ok, 1 error, 2 no
// GPU, 3 a --check failed.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "backends/cuda/check.h"
#include "backends/cuda/context.h"
#include "backends/cuda/cuda_memory.h"
#include "backends/cuda/device.h"
#include "backends/cuda/device_tensor.h"
#include "backends/cuda/graph.h"
#include "backends/cuda/stream.h"
#include "bench/bundle.h"
#include "bench/layer_gpu_fused.h"
#include "bench/layer_gpu_options.h"
#include "bench/layer_gpu_weights.h"
#include "config/k3_config.h"
#include "config/shard.h"
#include "core/bf16.h"
#include "core/rng.h"
#include "evidence/environment.h"
#include "fastpath/fused_decode.h"
#include "fastpath/fused_layers.h"
#include "kernels/registry.h"
#include "model/kv_storage.h"
#include "model/layers/context.h"
#include "model/step_batches.h"

using namespace k3;
using core::DType;
using core::Tensor;
namespace cu = k3::backends::cuda;
using bench::Fill;
using bench::Filler;
using bench::LayerBytes;
using bench::Options;
using bench::parse_options;

namespace {

constexpr int kLayerKda = 85, kLayerMla = 87;   // spec §14.2 Layer A and Layer B (0-based)
constexpr int32_t kBlockSize = 16;              // tokens per MLA page
constexpr double kSpecBytesPerSecond = 4.3e12;  // spec §12

// One rank's share of K3 at tensor parallelism tp (spec §11, config::shard_config): heads split tp
// ways, experts TP-sharded (intermediate 3072 / tp), shared experts 6144 / tp, dense 33792 / tp,
// vocab 163840 / tp; router and latent projections stay whole (replicated). tp 8 is k3-layer-tp8
// (spec §14.2: 12 KDA / 12 MLA heads, experts [384, 3584]); tp 16 has 6 heads and experts [192, 3584].
config::K3Config rank_config(int tp) {
  config::K3Config c = config::shard_config(config::builtin_config("k3"), tp);
  c.bos_token_id = c.eos_token_id = c.pad_token_id = -1;  // K3's ids lie outside one rank's vocabulary
  c.mxfp4.enabled = true;
  config::validate(c, "k3-layer-tp" + std::to_string(tp) + " rank config");
  return c;
}

// ------------------------------------------------------------------ the benchmark

struct Copy {  // one of the R copies of the step in the graph
  std::vector<model::Segment> segments;
  std::unique_ptr<model::StepTables> tables;
  Tensor prefix;
  std::vector<Tensor> bank;
};

struct Bench {
  Options opt;
  config::K3Config config;
  std::shared_ptr<cu::Context> ctx;
  std::shared_ptr<core::DeviceMemory> memory;
  kernels::Registry registry;
  model::ModelOptions model_options;  // the standard path's
  model::ModelOptions fused_options;  // the same with decode_backend = latency_specialized
  std::unique_ptr<model::KvStorage> kv;
  std::vector<model::SequenceState> seqs;  // copies x max batch
  std::vector<int32_t> pages;              // the shuffled page ids their block tables view
  double copy_bytes_per_second = 0;
  nlohmann::json rows = nlohmann::json::array();
  int check_failures = 0;
  std::unique_ptr<Filler> filler;  // random device tensors (one host staging buffer for the run)

  cudaStream_t stream() const { return ctx->stream(); }
};

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[static_cast<size_t>(std::lround(p * static_cast<double>(v.size() - 1)))];
}

// Device-to-device copy bandwidth (read + write) of a 2 GiB cudaMemcpy, median of 20 (as
// k3bench_ops_gpu measures it: kernels/testing/op_bench.cpp).
double measure_copy_bandwidth(Bench& b) {
  const int64_t bytes = int64_t{1} << 31;
  Tensor src = b.memory->empty(DType::u8, {bytes}), dst = b.memory->empty(DType::u8, {bytes});
  K3_CUDA_CHECK(cudaMemsetAsync(src.view().data, 1, static_cast<size_t>(bytes), b.stream()));
  cu::Event start, stop;
  std::vector<double> us;
  for (int i = 0; i < 22; ++i) {
    start.record(b.stream());
    K3_CUDA_CHECK(cudaMemcpyAsync(dst.view().data, src.view().data, static_cast<size_t>(bytes),
                                  cudaMemcpyDeviceToDevice, b.stream()));
    stop.record(b.stream());
    stop.synchronize();
    if (i >= 2) us.push_back(1e3 * stop.elapsed_ms_since(start));
  }
  return 2.0 * static_cast<double>(bytes) / (bench::median(us) * 1e-6);
}

// Bit-for-bit comparison of two device tensors: "" when equal, else what differs.
std::string compare_bits(const Tensor& a, const Tensor& b, cudaStream_t s) {
  const Tensor ha = cu::download(a.view(), s), hb = cu::download(b.view(), s);
  if (ha.nbytes() != hb.nbytes()) return "sizes differ";
  if (std::memcmp(ha.data<void>(), hb.data<void>(), static_cast<size_t>(ha.nbytes())) == 0) return "";
  const Tensor fa = cu::download_f32(a.view(), s), fb = cu::download_f32(b.view(), s);
  int64_t diff = 0;
  double max_abs = 0;
  for (int64_t i = 0; i < fa.numel(); ++i) {
    const float x = fa.data<float>()[i], y = fb.data<float>()[i];
    if (std::memcmp(&x, &y, 4) != 0) ++diff, max_abs = std::max(max_abs, static_cast<double>(std::fabs(x - y)));
  }
  return std::to_string(diff) + " of " + std::to_string(fa.numel()) + " values differ, max |diff| " +
         std::to_string(max_abs);
}

int64_t count_nonfinite(const Tensor& t, cudaStream_t s) {
  const Tensor h = cu::download_f32(t.view(), s);
  int64_t bad = 0;
  for (int64_t i = 0; i < h.numel(); ++i) bad += !std::isfinite(h.data<float>()[i]);
  return bad;
}

// Per-layer microseconds of `replays` timed replays of `graph` (R steps each), after 3 warm ones.
std::vector<double> time_replays(Bench& b, cu::Graph& graph, int R) {
  for (int i = 0; i < 3; ++i) graph.replay();
  std::vector<cu::Event> ev;
  ev.reserve(static_cast<size_t>(b.opt.replays) + 1);
  for (int i = 0; i <= b.opt.replays; ++i) ev.emplace_back(true);
  ev[0].record(b.stream());
  for (int i = 0; i < b.opt.replays; ++i) {
    graph.replay();
    ev[static_cast<size_t>(i) + 1].record(b.stream());
  }
  ev.back().synchronize();
  std::vector<double> us;
  for (int i = 0; i < b.opt.replays; ++i) us.push_back(1e3 * ev[i + 1].elapsed_ms_since(ev[i]) / R);
  return us;
}

// What one copy's step returns, compared bit for bit (--check).
using Outputs = std::vector<Tensor>;
using StepFn = std::function<Outputs(size_t copy)>;

// One path of one row, measured.
struct PathResult {
  std::vector<double> us;  // per layer, one per timed replay
  cu::GraphNodeCounts nodes;
  std::vector<std::string> problems;  // --check
  std::vector<std::string> ops;       // copy 0's eager step: "op -> device/impl", in call order
  size_t op_calls = 0;                // of those, the ops that ran (not a fused op's "not used" note)
};

// Attaches an OpRecorder to the registry for one scope (detached again if the step throws).
struct RecordOps {
  kernels::Registry& registry;
  kernels::OpRecorder recorder;
  explicit RecordOps(kernels::Registry& r) : registry(r) {
    registry.set_recorder(&recorder);
    recorder.start();
  }
  ~RecordOps() { registry.set_recorder(nullptr); }
  void stop(PathResult& m) {
    for (const auto& c : recorder.stop()) {
      m.ops.push_back(c.op + " -> " + c.device + "/" + c.impl);
      m.op_calls += c.impl.rfind("not used", 0) != 0;
    }
  }
};

// Eager warm-up (copy 0's op calls recorded), --check's eager checks, one graph of the R steps, its
// --check replay, and the timed replays. `restore` puts the KDA state back to where it was saved
// (a no-op without --check); every path starts from it, so the paths see the same state.
PathResult measure_path(Bench& b, int R, const StepFn& step, const std::function<void()>& restore) {
  const cudaStream_t s = b.stream();
  PathResult m;
  std::vector<Outputs> eager(static_cast<size_t>(R)), graph_out(static_cast<size_t>(R));
  restore();
  {
    RecordOps rec(b.registry);
    eager[0] = step(0);  // eager warm-up: plans, device tables, lazy loading
    rec.stop(m);
  }
  for (size_t r = 1; r < eager.size(); ++r) eager[r] = step(r);
  K3_CUDA_CHECK(cudaStreamSynchronize(s));
  if (b.opt.check) {
    for (size_t r = 0; r < eager.size(); ++r)
      for (const Tensor& t : eager[r])
        if (const int64_t bad = count_nonfinite(t, s))
          m.problems.push_back("copy " + std::to_string(r) + ": " + std::to_string(bad) + " non-finite outputs");
    restore();
    for (size_t r = 0; r < eager.size(); ++r) {
      const Outputs again = step(r);
      for (size_t i = 0; i < again.size(); ++i)
        if (const std::string d = compare_bits(again[i], eager[r][i], s); !d.empty())
          m.problems.push_back("eager is not deterministic (copy " + std::to_string(r) + ", output " +
                               std::to_string(i) + "): " + d);
    }
  }
  // Declared after graph_out: destroyed first, then the tensors it wrote return to the pool.
  cu::Graph graph = cu::Graph::capture(*b.ctx, [&] {
    for (size_t r = 0; r < graph_out.size(); ++r) graph_out[r] = step(r);
  });
  if (b.opt.check) {
    restore();
    for (const Outputs& o : graph_out)
      for (const Tensor& t : o) b.memory->fill_bytes(t.view(), 0xff);  // NaN: the replay must write them
    graph.replay();
    for (size_t r = 0; r < graph_out.size(); ++r)
      for (size_t i = 0; i < graph_out[r].size(); ++i)
        if (const std::string d = compare_bits(graph_out[r][i], eager[r][i], s); !d.empty())
          m.problems.push_back("graph replay differs from eager (copy " + std::to_string(r) + ", output " +
                               std::to_string(i) + "): " + d);
  }
  m.us = time_replays(b, graph, R);
  m.nodes = graph.nodes();
  return m;
}

// The fused path's AttnRes bank write at write layer `wl` (the one serving the benched layer), R
// copies in one graph, each on its own stream with the earlier bank rows already written.
struct BankResult {
  std::vector<double> us;
  cu::GraphNodeCounts nodes;
  int write_layer = 0, mixes = 0;
};

BankResult measure_bank_write(Bench& b, int layer, int64_t B, std::vector<Copy>& copies,
                              std::vector<bench::FusedCopy>& fused, const model::Weights& W) {
  const int block = b.config.attn_res_block_size, R = static_cast<int>(copies.size());
  BankResult br;
  br.write_layer = bench::last_bank_write_layer(b.config, layer);
  br.mixes = bench::mixes_of_bank_write(b.config, br.write_layer);
  const size_t row = static_cast<size_t>(br.write_layer / block);
  // Declared before the graph: its write_bank calls read these streams' bank rows and write their
  // acc / stats buffers, and the streams hold references to the fused copies' contexts.
  std::vector<std::unique_ptr<fastpath::AttnResStream>> streams;
  for (int r = 0; r < R; ++r) {
    streams.push_back(std::make_unique<fastpath::AttnResStream>(*fused[static_cast<size_t>(r)].fctx, W, B));
    bench::write_banks(b.config, *streams.back(), copies[static_cast<size_t>(r)].bank, br.write_layer - block);
  }
  // (The fused copies' setup already ran this write eagerly: the op's lazy setup is done.)
  cu::Graph graph = cu::Graph::capture(*b.ctx, [&] {
    for (int r = 0; r < R; ++r)
      streams[static_cast<size_t>(r)]->write_bank(br.write_layer, copies[static_cast<size_t>(r)].bank.at(row));
  });
  br.us = time_replays(b, graph, R);
  br.nodes = graph.nodes();
  return br;
}

// One JSON row (and its printed line) of one path.
nlohmann::json path_row(Bench& b, const std::string& name, const std::string& path, int layer, int64_t B,
                        const PathResult& m, const LayerBytes& bytes, const nlohmann::json& check) {
  const int R = b.opt.copies;
  const double med = bench::median(m.us), total = bytes.total();
  const double floor_us = total / b.copy_bytes_per_second * 1e6;
  std::printf(
      "  %-14s %-19s batch %3lld: %9.1f us/layer (p10 %.1f, p90 %.1f), %.1f kernels/layer, %zu op calls, "
      "%.1f MB, %.0f GB/s, %.2fx floor%s\n",
      name.c_str(), path.c_str(), static_cast<long long>(B), med, percentile(m.us, 0.1), percentile(m.us, 0.9),
      static_cast<double>(m.nodes.kernels) / R, m.op_calls, total / 1e6, total / (med * 1e-6) / 1e9, med / floor_us,
      b.opt.check ? (check.value("pass", false) ? ", check ok" : ", CHECK FAILED") : "");
  std::fflush(stdout);
  return {{"layer", name},
          {"layer_index", layer},
          {"path", path},
          {"batch", B},
          {"copies", R},
          {"replays", b.opt.replays},
          {"median_us", med},
          {"p10_us", percentile(m.us, 0.1)},
          {"p90_us", percentile(m.us, 0.9)},
          {"samples_us_per_layer", m.us},
          {"kernels_per_layer", static_cast<double>(m.nodes.kernels) / R},
          {"memcpy_nodes_per_layer", static_cast<double>(m.nodes.memcpys) / R},
          {"memset_nodes_per_layer", static_cast<double>(m.nodes.memsets) / R},
          {"other_nodes_per_layer", static_cast<double>(m.nodes.other) / R},
          {"bytes", bytes.json()},
          {"GBps", total / (med * 1e-6) / 1e9},
          {"floor_us_copy", floor_us},
          {"ratio_to_copy_floor", med / floor_us},
          {"floor_us_4p3TBps", total / kSpecBytesPerSecond * 1e6},
          {"ratio_to_4p3TBps_floor", med / (total / kSpecBytesPerSecond * 1e6)},
          {"op_calls", m.op_calls},
          {"ops", m.ops},
          {"check", check}};
}

nlohmann::json check_json(Bench& b, const std::string& path, int layer, int64_t B,
                          const std::vector<std::string>& problems) {
  if (!b.opt.check) return nlohmann::json::object();
  for (const std::string& p : problems)
    std::fprintf(stderr, "CHECK FAILED layer %d batch %lld %s: %s\n", layer, static_cast<long long>(B), path.c_str(),
                 p.c_str());
  b.check_failures += static_cast<int>(problems.size());
  return {{"pass", problems.empty()}, {"problems", problems}};
}

void run_row(Bench& b, int layer, const model::LayerWeights& lw, const model::Weights& W, const Tensor& router_bias,
             int64_t B) {
  const cudaStream_t s = b.stream();
  const int R = b.opt.copies;
  const int64_t hidden = b.config.hidden_size;
  const size_t bank_rows = static_cast<size_t>((layer + b.config.attn_res_block_size - 1) /
                                               b.config.attn_res_block_size);
  Filler& fl = *b.filler;
  fl.seed = b.opt.seed ^ (static_cast<uint64_t>(layer) << 32) ^ static_cast<uint64_t>(B);
  const bool run_fused = b.opt.run_fused && B <= fastpath::kMaxRows;
  if (b.opt.run_fused && !run_fused)
    std::printf("  batch %lld: latency_specialized not run (more than its %lld rows: the standard path serves it)\n",
                static_cast<long long>(B), static_cast<long long>(fastpath::kMaxRows));
  std::vector<Copy> copies(static_cast<size_t>(R));
  std::vector<bench::FusedCopy> fused(run_fused ? static_cast<size_t>(R) : 0);
  for (int r = 0; r < R; ++r) {
    Copy& c = copies[static_cast<size_t>(r)];
    for (int64_t i = 0; i < B; ++i)
      c.segments.push_back(
          {i, i + 1, &b.seqs[static_cast<size_t>(r * b.opt.batches.back() + i)], model::StepKind::decode});
    c.tables = std::make_unique<model::StepTables>(c.segments, kBlockSize, *b.memory);
    const std::string tag = "copy" + std::to_string(r);
    c.prefix = fl.make(DType::bf16, {B, hidden}, {Fill::bf16, 0.0f, 1.0f}, (tag + ".prefix").c_str());
    for (size_t j = 0; j < bank_rows; ++j)
      c.bank.push_back(
          fl.make(DType::bf16, {B, hidden}, {Fill::bf16, 0.0f, 1.0f}, (tag + ".bank" + std::to_string(j)).c_str()));
    if (!run_fused) continue;
    // The fused copy: its context, its stream holding this copy's bank (written here, eagerly,
    // before any capture), and the previous layer's stand-in FFN output.
    bench::FusedCopy& fc = fused[static_cast<size_t>(r)];
    fc.fctx = std::make_unique<model::ForwardContext>(model::ForwardContext{
        b.config, *b.kv, b.registry, b.fused_options, c.segments, c.tables->batches(), *b.memory, nullptr});
    fc.res = std::make_unique<fastpath::AttnResStream>(*fc.fctx, W, B);
    bench::write_banks(b.config, *fc.res, c.bank, layer);
    fc.f_prev = fl.make(DType::bf16, {B, hidden}, {Fill::bf16, 0.0f, 1.0f}, (tag + ".f_prev").c_str());
  }
  const auto standard_step = [&](Copy& c, const Tensor& prefix) {
    const model::ForwardContext fctx{b.config,  *b.kv,  b.registry, b.model_options, c.segments, c.tables->batches(),
                                     *b.memory, nullptr};
    std::vector<Tensor> bank = c.bank;  // layer_forward appends at bank-write layers (85 and 87 are not)
    return model::layer_forward(fctx, layer, lw, router_bias, bank, prefix);
  };
  const auto fused_step = [&](size_t r) {
    return bench::fused_layer_step(fused[r], layer, lw, router_bias, copies[r].prefix);
  };
  // The KDA state is updated in place every step; --check restores it so runs start equal. (The MLA
  // step rewrites the same cache row with the same value, so it needs nothing.)
  const bool kda = b.config.attn_kind(layer) == config::AttnKind::kda;
  Tensor saved_state, saved_conv;
  if (b.opt.check && kda) {
    saved_state = b.memory->empty(DType::f32, b.kv->kda_states(layer).shape());
    saved_conv = b.memory->empty(b.kv->conv_states(layer).dtype(), b.kv->conv_states(layer).shape());
    b.memory->copy(saved_state.view(), b.kv->kda_states(layer).view());
    b.memory->copy(saved_conv.view(), b.kv->conv_states(layer).view());
  }
  const auto restore = [&] {
    if (!saved_state.defined()) return;
    b.memory->copy(b.kv->kda_states(layer).view(), saved_state.view());
    b.memory->copy(b.kv->conv_states(layer).view(), saved_conv.view());
  };

  const std::string name = std::string(kda ? "A kda+moe" : "B mla+moe") + " L" + std::to_string(layer);
  const LayerBytes bytes = bench::count_bytes(b.config, lw, *b.kv, layer, B, b.opt.ctx_tokens, bank_rows);
  double auto_median = 0;
  if (b.opt.run_auto) {
    const PathResult m = measure_path(
        b, R, [&](size_t r) { return Outputs{standard_step(copies[r], copies[r].prefix)}; }, restore);
    auto_median = bench::median(m.us);
    b.rows.push_back(path_row(b, name, "auto", layer, B, m, bytes, check_json(b, "auto", layer, B, m.problems)));
  }
  if (!run_fused) return;

  PathResult m = measure_path(
      b, R,
      [&](size_t r) {
        const bench::FusedOut o = fused_step(r);
        return Outputs{o.f, o.P};
      },
      restore);
  // Across paths, eagerly from the same KDA state: the fused step's P + f against the standard
  // step's new prefix, the standard step starting from the prefix the fused step's first merge makes
  // (prefix + f_prev), so both compute the same function of the same inputs.
  nlohmann::json cross;
  char cross_line[320] = "";
  if (b.opt.check) {
    std::vector<Tensor> fused_sum, start;
    restore();
    for (size_t r = 0; r < copies.size(); ++r) {
      const bench::FusedOut o = fused_step(r);
      fused_sum.push_back(fused[r].fctx->add(o.P, o.f));
      start.push_back(fused[r].fctx->add(copies[r].prefix, fused[r].f_prev));
    }
    restore();
    bench::Closeness close;
    for (size_t r = 0; r < copies.size(); ++r) close.add(fused_sum[r], standard_step(copies[r], start[r]), s);
    restore();
    cross = close.json();
    std::snprintf(
        cross_line, sizeof cross_line,
        "    cross-path check (fused P + f vs the standard step's prefix): worst row cosine %.6f, %lld of %lld "
        "rows below 0.999, max rel diff %.3g, %lld non-finite%s\n",
        close.min_cosine, static_cast<long long>(close.rows_below), static_cast<long long>(close.rows),
        close.max_rel_diff(), static_cast<long long>(close.nonfinite),
        close.ok() ? "" : " -- FAILED (over 5% and over 2 rows below 0.999, a row below 0.9, or non-finite)");
    if (!close.ok())
      m.problems.push_back("cross-path: fused P + f vs standard prefix: worst row cosine " +
                           std::to_string(close.min_cosine) + ", " + std::to_string(close.rows_below) + " of " +
                           std::to_string(close.rows) + " rows below 0.999, " + std::to_string(close.nonfinite) +
                           " non-finite");
  }
  const BankResult bank = measure_bank_write(b, layer, B, copies, fused, W);
  const double bank_us = bench::median(bank.us), block = b.config.attn_res_block_size;
  const double amortized = bank_us / block, bank_kernels = static_cast<double>(bank.nodes.kernels) / R;
  nlohmann::json check = check_json(b, "latency_specialized", layer, B, m.problems);
  if (b.opt.check) check["cross_path"] = cross;
  nlohmann::json row = path_row(b, name, "latency_specialized", layer, B, m, bytes, check);
  std::fputs(cross_line, stdout);
  std::printf(
      "    attn_res bank write (once per block of %d layers; layer %d, %d Mix operators): %.1f us "
      "(p10 %.1f, p90 %.1f), %.1f kernels -> %.2f us/layer amortized, %.1f us/layer with it\n",
      b.config.attn_res_block_size, bank.write_layer, bank.mixes, bank_us, percentile(bank.us, 0.1),
      percentile(bank.us, 0.9), bank_kernels, amortized, row["median_us"].get<double>() + amortized);
  row["bank_write_us_amortized"] = amortized;
  row["median_us_with_bank"] = row["median_us"].get<double>() + amortized;
  row["kernels_per_layer_with_bank"] = row["kernels_per_layer"].get<double>() + bank_kernels / block;
  row["attn_res_bank_write"] = {{"what", "attn_res bank write (once per block of attn_res_block_size layers)"},
                                {"write_layer", bank.write_layer},
                                {"mix_operators", bank.mixes},
                                {"median_us", bank_us},
                                {"p10_us", percentile(bank.us, 0.1)},
                                {"p90_us", percentile(bank.us, 0.9)},
                                {"samples_us", bank.us},
                                {"kernels", bank_kernels},
                                {"other_nodes", static_cast<double>(bank.nodes.total() - bank.nodes.kernels) / R},
                                {"amortized_over_layers", block}};
  if (b.opt.run_auto) {
    const double med = row["median_us"].get<double>(), with_bank = row["median_us_with_bank"].get<double>();
    row["speedup_vs_auto"] = auto_median / med;
    row["speedup_vs_auto_with_bank"] = auto_median / with_bank;
    std::printf("    speed-up standard/fused %s batch %lld: %.2fx (%.2fx with the bank write amortized)\n",
                name.c_str(), static_cast<long long>(B), auto_median / med, auto_median / with_bank);
  }
  std::fflush(stdout);
  b.rows.push_back(std::move(row));
}

void print_table(const Bench& b) {
  std::printf(
      "\nk3-layer-tp%d decode, one layer per step (µs = CUDA-graph time / %d copies, median of %d replays); "
      "device copy %.0f GB/s; floor = bytes / copy bandwidth\n",
      b.opt.tp, b.opt.copies, b.opt.replays, b.copy_bytes_per_second / 1e9);
  std::printf("(fused rows: +bank = with the AttnRes bank write amortized over its block; speed-up = auto / fused)\n");
  std::printf("%-16s %-6s %5s %10s %9s %9s %8s %10s %8s %10s %8s %10s %8s %8s\n", "layer", "path", "batch", "us/layer",
              "p10", "p90", "kernels", "MB/layer", "GB/s", "floor_us", "x_floor", "us+bank", "speedup", "spd+bank");
  for (const auto& r : b.rows) {
    const bool fused = r["path"] == "latency_specialized";
    std::printf("%-16s %-6s %5lld %10.1f %9.1f %9.1f %8.1f %10.2f %8.0f %10.1f %8.2f",
                r["layer"].get<std::string>().c_str(), fused ? "fused" : "auto",
                static_cast<long long>(r["batch"].get<int64_t>()), r["median_us"].get<double>(),
                r["p10_us"].get<double>(), r["p90_us"].get<double>(), r["kernels_per_layer"].get<double>(),
                r["bytes"]["total"].get<double>() / 1e6, r["GBps"].get<double>(), r["floor_us_copy"].get<double>(),
                r["ratio_to_copy_floor"].get<double>());
    if (fused) std::printf(" %10.1f", r["median_us_with_bank"].get<double>());
    if (r.contains("speedup_vs_auto"))
      std::printf(" %7.2fx %7.2fx", r["speedup_vs_auto"].get<double>(), r["speedup_vs_auto_with_bank"].get<double>());
    std::printf("\n");
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    Bench b;
    b.opt = parse_options(argc, argv);
    std::string why;
    if (cu::device_count(&why) == 0) {
      std::fprintf(stderr, "k3bench_layer_gpu: no usable CUDA device: %s\n", why.c_str());
      return 2;
    }
    b.config = rank_config(b.opt.tp);
    b.ctx = cu::Context::create(0);
    b.memory = cu::make_device_memory(b.ctx);
    kernels::register_reference_ops(b.registry);
    kernels::register_cuda_ops(b.registry, b.ctx);
    b.model_options.device = core::Device::cuda;
    b.model_options.precision = kernels::Precision::bf16;
    // (The fused sublayers do not read decode_backend: set for the record, as a fused Model has it.)
    b.fused_options = b.model_options;
    b.fused_options.decode_backend = model::DecodeBackend::latency_specialized;
    const auto& info = b.ctx->info();
    if (b.opt.run_fused)
      if (const std::string problem = fastpath::gpu_problem(0); !problem.empty())
        throw core::Error("--paths latency_specialized: " + info.name + " cannot run the fused kernels (" + problem +
                          "; they need compute capability 9.0): run with --paths auto");
    b.copy_bytes_per_second = measure_copy_bandwidth(b);
    std::printf("k3bench_layer_gpu on %s (%d SMs, L2 %zu MiB): device copy %.0f GB/s (read + write)\n",
                info.name.c_str(), info.sm_count, info.l2_bytes >> 20, b.copy_bytes_per_second / 1e9);
    std::printf(
        "  k3-layer-tp%d (spec §11, §14.2): one TP%d rank, hidden %lld, %d KDA / %d MLA heads, %d MXFP4 experts "
        "[%lld, %lld], ctx %d, fp8 latent cache, bf16 activations\n",
        b.opt.tp, b.opt.tp, static_cast<long long>(b.config.hidden_size), b.config.kda.num_heads,
        b.config.mla.num_heads, b.config.moe.num_experts, static_cast<long long>(b.config.moe.moe_intermediate_size),
        static_cast<long long>(b.config.moe.routed_expert_hidden_size), b.opt.ctx_tokens);
    std::printf(
        "  collectives STUBBED: single GPU, the TP all-reduces are not run. Weights random; experts are random "
        "MXFP4 codes with E8M0 scales near 2^-7 (timing only)\n");

    // Storage for copies x largest batch sequences, each with ctx tokens already cached.
    const int64_t nseq = int64_t{b.opt.copies} * b.opt.batches.back();
    const int64_t pages_per_seq = (b.opt.ctx_tokens + 1 + kBlockSize - 1) / kBlockSize;
    model::KvStorageConfig sc;
    sc.num_blocks = static_cast<int32_t>(nseq * pages_per_seq);
    sc.block_size = kBlockSize;
    sc.num_slots = static_cast<int32_t>(nseq);
    sc.kv_dtype = model::KvCacheDtype::fp8_e4m3;
    b.kv = std::make_unique<model::KvStorage>(b.config, sc, b.memory, b.model_options.precision);
    std::vector<int32_t>& pages = b.pages;  // shuffled: pages of a sequence are scattered
    pages.resize(static_cast<size_t>(sc.num_blocks));
    for (size_t i = 0; i < pages.size(); ++i) pages[i] = static_cast<int32_t>(i);
    core::Rng shuffle(b.opt.seed ^ 0x5eedull);
    for (size_t i = pages.size(); i > 1; --i) std::swap(pages[i - 1], pages[shuffle.next_u64() % i]);
    b.seqs.resize(static_cast<size_t>(nseq));
    for (int64_t i = 0; i < nseq; ++i) {
      auto& q = b.seqs[static_cast<size_t>(i)];
      q.num_tokens = b.opt.ctx_tokens;
      q.kda_slot = static_cast<int32_t>(i);
      q.block_table = std::span<const int32_t>(pages).subspan(static_cast<size_t>(i * pages_per_seq),
                                                              static_cast<size_t>(pages_per_seq));
    }

    b.filler = std::make_unique<Filler>(Filler{*b.memory, b.stream(), b.opt.seed, {}});
    Filler& fl = *b.filler;
    const bool want_kda = b.opt.layers.find("kda") != std::string::npos,
               want_mla = b.opt.layers.find("mla") != std::string::npos;
    if (want_kda) {
      fl.fill(b.kv->kda_states(kLayerKda).view(), {Fill::f32, 0.0f, 0.05f}, "kda.state");
      fl.fill(b.kv->conv_states(kLayerKda).view(), {Fill::bf16, 0.0f, 1.0f}, "kda.conv_state");
    }
    if (want_mla) fl.fill(b.kv->mla_pages(kLayerMla).view(), {Fill::fp8}, "mla.pages");  // ctx tokens "written"

    std::printf("per row (as measured):\n");
    for (const int layer : {kLayerKda, kLayerMla}) {
      if (!(layer == kLayerKda ? want_kda : want_mla)) continue;
      K3_CHECK(b.config.attn_kind(layer) == (layer == kLayerKda ? config::AttnKind::kda : config::AttnKind::mla) &&
                   b.config.ffn_kind(layer) == config::FfnKind::moe,
               "layer " + std::to_string(layer) + " of the K3 config is not the kind spec §14.2 names");
      const auto t0 = std::chrono::steady_clock::now();
      fl.seed = b.opt.seed ^ (static_cast<uint64_t>(layer) * 0x100000001b3ull);  // each layer its own weights
      const model::LayerWeights lw = bench::make_layer(fl, b.config, layer);
      std::printf("  layer %d weights: %.2f GB generated and uploaded in %.1f s\n", layer,
                  static_cast<double>(bench::layer_weight_bytes(lw)) / 1e9,
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      // The router bias as the model keeps it (model.cpp): f32, rounded to bf16 values in bf16 mode.
      const auto& moe = std::get<model::MoeWeights>(lw.ffn);
      Tensor bias = cu::download_f32(moe.router_bias.view(), b.stream());
      for (int64_t e = 0; e < bias.numel(); ++e) bias.data<float>()[e] = core::bf16_round(bias.data<float>()[e]);
      const Tensor router_bias = b.memory->upload(bias.view());
      // The fused path's AttnRes stream reads every layer's Mix weights (bench/layer_gpu_fused.h).
      const model::Weights W = b.opt.run_fused ? bench::attn_res_weights(fl, b.config, layer, lw) : model::Weights{};
      for (const int64_t B : b.opt.batches) run_row(b, layer, lw, W, router_bias, B);
    }
    print_table(b);

    nlohmann::json env = evidence::environment();
    env["gpu"] = {{"name", info.name},
                  {"sm_count", info.sm_count},
                  {"l2_bytes", info.l2_bytes},
                  {"global_bytes", info.global_bytes},
                  {"cc", std::to_string(info.cc_major) + "." + std::to_string(info.cc_minor)},
                  {"driver_version", info.driver_version},
                  {"runtime_version", info.runtime_version}};
    const nlohmann::json bundle = {
        {"benchmark", "layer_gpu"},
        {"environment", env},
        {"config",
         {{"name", "k3-layer-tp" + std::to_string(b.opt.tp)},
          {"tp", b.opt.tp},
          {"model", config::to_json(b.config)},
          {"model_hash", b.config.hash()},
          {"batches", b.opt.batches},
          {"paths", b.opt.paths()},
          {"copies", b.opt.copies},
          {"replays", b.opt.replays},
          {"ctx_tokens", b.opt.ctx_tokens},
          {"block_size", kBlockSize},
          {"kv_cache", "fp8_e4m3"},
          {"precision", "bf16"},
          {"check", b.opt.check},
          {"seed", b.opt.seed},
          {"collectives", "stubbed (single GPU): TP all-reduces not run"},
          {"weights", "random; experts random MXFP4 codes, E8M0 scales near 2^-7 (timing only)"},
          {"timing",
           "CUDA graph of `copies` steps (own inputs, KDA slots, cache pages), one event pair per "
           "replay, per layer = replay time / copies"},
          {"fused_step",
           "latency_specialized: one layer of FusedDecodePath::run_step: attn_res_merge of a "
           "random previous-layer FFN output + Mix + norm, fused attention, attn_res_merge, "
           "fused MoE; the bank write (attn_res_bank, once per block) timed as its own graph, "
           "amortized = its time / attn_res_block_size"},
          {"bytes",
           "spec §12: weights read, KDA state+conv r+w, MLA fp8 latent read (ctx+1 tokens) + write, "
           "router/latent/shared weights, 896(1-(1-16/896)^B) distinct experts x per-expert MXFP4 "
           "bytes, AttnRes 2 x (bank+1) rows x 14336 B per token"}}},
        {"copy_GBps", b.copy_bytes_per_second / 1e9},
        {"floor_GBps_spec", kSpecBytesPerSecond / 1e9},
        {"check_failures", b.check_failures},
        {"rows", b.rows}};
    std::ofstream(b.opt.out) << bundle.dump(2) << "\n";
    std::printf("wrote %s%s\n", b.opt.out.c_str(), b.check_failures ? " (CHECK FAILURES: see stderr)" : "");
    return b.check_failures ? 3 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "k3bench_layer_gpu: error: %s\n", e.what());
    return 1;
  }
}
