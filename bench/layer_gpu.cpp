// bench/layer_gpu.cpp: one decoder layer's decode step on the GPU at the k3-layer-tp8 shapes (spec
// §14.2): Layer A = 0-based layer 85 (KDA+MoE) and Layer B = 87 (MLA+MoE), one TP8 rank's shapes
// (12 KDA / 12 MLA heads, 896 MXFP4 experts of [384, 3584] / [3584, 384], shared [768, 7168] x2 +
// [7168, 768], router and latent projections replicated), hidden 7168, an AttnRes bank of 8 rows,
// an 8K-token context per sequence in an fp8 latent cache, batch 1, 8, 32, 64.
//
// Each step runs model::layer_forward (the model's own code, standard CUDA path) inside one CUDA
// graph after an eager warm-up. To keep L2 from flattering, the graph holds R copies of the step,
// each with its own input prefix and bank, KDA slots and cache pages; time per layer = graph time /
// R, median (and p10/p90) over many replays timed with CUDA events. Per row: microseconds, kernels
// launched per layer (graph kernel nodes / R), bytes per layer by spec §12's counting rules (from the
// actual shapes), achieved GB/s, the floor = bytes / the device-to-device copy bandwidth measured in
// the same run, and the ratio. Collectives are stubbed: single GPU, so the TP all-reduces (after
// o_proj; of the latent + shared partials) are not run. Weights are random (fast PRNG fills); the
// experts are random MXFP4 codes with E8M0 scales near 2^-7 (timing only, not a quantized matrix).
//
//   k3bench_layer_gpu [--out FILE] [--batches 1,8,32,64] [--layers kda,mla] [--replays N]
//                     [--copies R] [--ctx TOKENS] [--check] [--seed S]
// --check: per row, eager outputs finite, eager deterministic (bit for bit on a second run from the
// same state) and one graph replay from the same state equal to the eager outputs bit for bit.
// Prints a table last and writes a JSON result bundle (bench/bundle.h). Exit 0 ok, 1 error, 2 no
// GPU, 3 a --check failed.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
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
#include "bench/layer_gpu_weights.h"
#include "config/k3_config.h"
#include "core/bf16.h"
#include "core/rng.h"
#include "kernels/cuda_ops.h"
#include "model/kv_storage.h"
#include "model/layers/context.h"
#include "model/step_batches.h"

using namespace k3;
using core::DType;
using core::Tensor;
namespace cu = k3::backends::cuda;
using bench::Fill;
using bench::Filler;

namespace {

constexpr int kLayerKda = 85, kLayerMla = 87;  // spec §14.2 Layer A and Layer B (0-based)
constexpr int32_t kBlockSize = 16;             // tokens per MLA page
constexpr double kSpecBytesPerSecond = 4.3e12; // spec §12

struct Options {
  std::string out = "layer_gpu.json", layers = "kda,mla";
  std::vector<int64_t> batches = {1, 8, 32, 64};
  int replays = 200, copies = 3, ctx_tokens = 8192;
  bool check = false;
  uint64_t seed = 1;
};

// One TP8 rank's share of K3 (spec §11): heads split 8 ways, experts TP-sharded (intermediate
// 3072 / 8), shared experts 6144 / 8, dense 33792 / 8, vocab 163840 / 8; router and latent
// projections stay whole (replicated).
config::K3Config rank_config() {
  config::K3Config c = config::builtin_config("k3");
  c.kda.num_heads = 12;
  c.mla.num_heads = 12;
  c.moe.moe_intermediate_size = 384;  // shared: 2 x 384 = 768
  c.intermediate_size = 4224;
  c.vocab_size = 20480;
  c.bos_token_id = c.eos_token_id = c.pad_token_id = -1;  // K3's ids lie outside one rank's vocabulary
  c.mxfp4.enabled = true;
  config::validate(c, "k3-layer-tp8 rank config");
  return c;
}

// ------------------------------------------------------------------ bytes (spec §12 rules)

int64_t bytes_of(const kernels::LinearWeight& w) { return w.weight.nbytes() + (w.scale.defined() ? w.scale.nbytes() : 0); }

int64_t attn_weight_bytes(const model::LayerWeights& lw) {
  int64_t n = 0;
  if (const auto* k = std::get_if<model::KdaWeights>(&lw.attn)) {
    for (const auto* w : {&k->q_proj, &k->k_proj, &k->v_proj, &k->g_proj, &k->o_proj, &k->f_a_proj, &k->f_b_proj, &k->b_proj})
      n += bytes_of(*w);
    for (const Tensor* t : {&k->q_conv, &k->k_conv, &k->v_conv, &k->a_log, &k->dt_bias, &k->o_norm}) n += t->nbytes();
  } else {
    const auto& m = std::get<model::MlaWeights>(lw.attn);
    for (const auto* w : {&m.q_a_proj, &m.q_b_proj, &m.kv_a_proj, &m.kv_b_proj, &m.g_proj, &m.o_proj}) n += bytes_of(*w);
    n += m.q_a_norm.nbytes() + m.kv_a_norm.nbytes();
  }
  return n;
}
int64_t norm_bytes(const model::LayerWeights& lw) {  // layer norms and the two AttnRes query/norm pairs
  return lw.input_norm.nbytes() + lw.post_attn_norm.nbytes() + lw.attn_res.query.nbytes() + lw.attn_res.norm.nbytes() +
         lw.mlp_res.query.nbytes() + lw.mlp_res.norm.nbytes();
}
int64_t moe_front_bytes(const model::MoeWeights& m) {  // router (+ bias), latent down/up (+ routed norm)
  return bytes_of(m.router) + bytes_of(m.latent_down) + bytes_of(m.latent_up) + m.router_bias.nbytes() + m.latent_norm.nbytes();
}
int64_t shared_bytes(const model::MoeWeights& m) {
  return bytes_of(m.shared_gate) + bytes_of(m.shared_up) + bytes_of(m.shared_down);
}
int64_t expert_bytes(const model::MoeWeights& m, size_t e) { return bytes_of(m.w1[e]) + bytes_of(m.w3[e]) + bytes_of(m.w2[e]); }
// Every weight byte of the layer (what make_layer generated and uploaded).
int64_t layer_weight_bytes(const model::LayerWeights& lw) {
  const auto& moe = std::get<model::MoeWeights>(lw.ffn);
  int64_t n = norm_bytes(lw) + attn_weight_bytes(lw) + moe_front_bytes(moe) + shared_bytes(moe);
  for (size_t e = 0; e < moe.w1.size(); ++e) n += expert_bytes(moe, e);
  return n;
}

struct LayerBytes {
  double attn_weights = 0, norms = 0, state = 0, kv = 0, moe_front = 0, shared = 0, routed = 0, attn_res = 0;
  double expected_experts = 0, per_expert = 0;
  double total() const { return attn_weights + norms + state + kv + moe_front + shared + routed + attn_res; }
  nlohmann::json json() const {
    return {{"attn_weights", attn_weights}, {"norms_and_attnres_weights", norms}, {"kda_state_rw", state},
            {"mla_kv_read_write", kv}, {"moe_router_latent", moe_front}, {"shared_experts", shared},
            {"routed_experts", routed}, {"attnres_activations", attn_res}, {"expected_distinct_experts", expected_experts},
            {"bytes_per_touched_expert", per_expert}, {"total", total()}};
  }
};

LayerBytes count_bytes(const config::K3Config& c, const model::LayerWeights& lw, const model::KvStorage& kv, int layer,
                       int64_t batch, int ctx_tokens, size_t bank_rows) {
  LayerBytes b;
  const double B = static_cast<double>(batch);
  const auto& moe = std::get<model::MoeWeights>(lw.ffn);
  b.norms = static_cast<double>(norm_bytes(lw));
  b.attn_weights = static_cast<double>(attn_weight_bytes(lw));
  b.moe_front = static_cast<double>(moe_front_bytes(moe));
  b.shared = static_cast<double>(shared_bytes(moe));
  if (c.attn_kind(layer) == config::AttnKind::kda) {  // state and conv state: read + written once
    const int32_t slots = kv.storage_config().num_slots;
    b.state = 2.0 * B * static_cast<double>(kv.kda_states(layer).nbytes() + kv.conv_states(layer).nbytes()) / slots;
  } else {  // every cached token and the new one read, the new one written
    const double row = static_cast<double>(c.mla.cache_dim() * core::dtype_size(kv.mla_pages(layer).dtype()));
    b.kv = B * (static_cast<double>(ctx_tokens + 1) * row + row);
  }
  const double E = c.moe.num_experts, k = c.moe.num_experts_per_token;
  b.expected_experts = E * (1.0 - std::pow(1.0 - k / E, B));  // uniform independent routing, n = B tokens
  b.per_expert = static_cast<double>(expert_bytes(moe, 0));
  b.routed = b.expected_experts * b.per_expert;
  // Both Mix sides read bank ++ [prefix]: (rows + 1) x 2 sources of [hidden] bf16 per token.
  b.attn_res = B * 2.0 * static_cast<double>(bank_rows + 1) * static_cast<double>(c.hidden_size) * 2.0;
  return b;
}

// ------------------------------------------------------------------ the benchmark

struct Copy {  // one of the R copies of the step in the graph
  std::vector<model::Segment> segments;
  std::unique_ptr<model::StepTables> tables;
  Tensor prefix;
  std::vector<Tensor> bank;
  Tensor eager_out, graph_out;
};

struct Bench {
  Options opt;
  config::K3Config config;
  std::shared_ptr<cu::Context> ctx;
  std::shared_ptr<core::DeviceMemory> memory;
  kernels::Registry registry;
  model::ModelOptions model_options;
  std::unique_ptr<model::KvStorage> kv;
  std::vector<model::SequenceState> seqs;  // copies x max batch
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
// bench/ops_gpu.cpp measures it).
double measure_copy_bandwidth(Bench& b) {
  const int64_t bytes = int64_t{1} << 31;
  Tensor src = b.memory->empty(DType::u8, {bytes}), dst = b.memory->empty(DType::u8, {bytes});
  K3_CUDA_CHECK(cudaMemsetAsync(src.view().data, 1, static_cast<size_t>(bytes), b.stream()));
  cu::Event start, stop;
  std::vector<double> us;
  for (int i = 0; i < 22; ++i) {
    start.record(b.stream());
    K3_CUDA_CHECK(cudaMemcpyAsync(dst.view().data, src.view().data, static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice, b.stream()));
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
  return std::to_string(diff) + " of " + std::to_string(fa.numel()) + " values differ, max |diff| " + std::to_string(max_abs);
}

int64_t count_nonfinite(const Tensor& t, cudaStream_t s) {
  const Tensor h = cu::download_f32(t.view(), s);
  int64_t bad = 0;
  for (int64_t i = 0; i < h.numel(); ++i) bad += !std::isfinite(h.data<float>()[i]);
  return bad;
}

void run_row(Bench& b, int layer, const model::LayerWeights& lw, const Tensor& router_bias, int64_t B) {
  const cudaStream_t s = b.stream();
  const int R = b.opt.copies;
  const int64_t hidden = b.config.hidden_size;
  const size_t bank_rows = static_cast<size_t>((layer + b.config.attn_res_block_size - 1) / b.config.attn_res_block_size);
  Filler& fl = *b.filler;
  fl.seed = b.opt.seed ^ (static_cast<uint64_t>(layer) << 32) ^ static_cast<uint64_t>(B);
  std::vector<Copy> copies(static_cast<size_t>(R));
  for (int r = 0; r < R; ++r) {
    Copy& c = copies[static_cast<size_t>(r)];
    for (int64_t i = 0; i < B; ++i)
      c.segments.push_back({i, i + 1, &b.seqs[static_cast<size_t>(r * b.opt.batches.back() + i)], model::StepKind::decode});
    c.tables = std::make_unique<model::StepTables>(c.segments, kBlockSize, *b.memory);
    const std::string tag = "copy" + std::to_string(r);
    c.prefix = fl.make(DType::bf16, {B, hidden}, {Fill::bf16, 0.0f, 1.0f}, (tag + ".prefix").c_str());
    for (size_t j = 0; j < bank_rows; ++j)
      c.bank.push_back(fl.make(DType::bf16, {B, hidden}, {Fill::bf16, 0.0f, 1.0f}, (tag + ".bank" + std::to_string(j)).c_str()));
  }
  const auto step = [&](Copy& c) {
    const model::ForwardContext fctx{b.config, *b.kv, b.registry, b.model_options, c.segments, c.tables->batches(), *b.memory, nullptr};
    std::vector<Tensor> bank = c.bank;  // layer_forward appends at bank-write layers (85 and 87 are not)
    return model::layer_forward(fctx, layer, lw, router_bias, bank, c.prefix);
  };
  // The KDA state is updated in place every step; --check restores it so runs start equal. (The MLA
  // step rewrites the same cache row with the same value, so it needs nothing.)
  const bool kda = b.config.attn_kind(layer) == config::AttnKind::kda;
  Tensor saved_state, saved_conv;
  const auto save = [&] {
    if (!kda) return;
    saved_state = b.memory->empty(DType::f32, b.kv->kda_states(layer).shape());
    saved_conv = b.memory->empty(b.kv->conv_states(layer).dtype(), b.kv->conv_states(layer).shape());
    b.memory->copy(saved_state.view(), b.kv->kda_states(layer).view());
    b.memory->copy(saved_conv.view(), b.kv->conv_states(layer).view());
  };
  const auto restore = [&] {
    if (!kda) return;
    b.memory->copy(b.kv->kda_states(layer).view(), saved_state.view());
    b.memory->copy(b.kv->conv_states(layer).view(), saved_conv.view());
  };

  nlohmann::json check = nlohmann::json::object();
  if (b.opt.check) save();
  for (Copy& c : copies) c.eager_out = step(c);  // eager warm-up: plans, device tables, lazy loading
  K3_CUDA_CHECK(cudaStreamSynchronize(s));
  std::vector<std::string> problems;
  if (b.opt.check) {
    for (int r = 0; r < R; ++r)
      if (const int64_t bad = count_nonfinite(copies[r].eager_out, s))
        problems.push_back("copy " + std::to_string(r) + ": " + std::to_string(bad) + " non-finite outputs");
    restore();
    for (int r = 0; r < R; ++r) {
      const Tensor again = step(copies[r]);
      if (const std::string d = compare_bits(again, copies[r].eager_out, s); !d.empty())
        problems.push_back("eager is not deterministic (copy " + std::to_string(r) + "): " + d);
    }
  }
  cu::Graph graph = cu::Graph::capture(*b.ctx, [&] {
    for (Copy& c : copies) c.graph_out = step(c);
  });
  if (b.opt.check) {
    restore();
    for (Copy& c : copies) b.memory->fill_bytes(c.graph_out.view(), 0xff);  // NaN: the replay must write them
    graph.replay();
    for (int r = 0; r < R; ++r)
      if (const std::string d = compare_bits(copies[r].graph_out, copies[r].eager_out, s); !d.empty())
        problems.push_back("graph replay differs from eager (copy " + std::to_string(r) + "): " + d);
    check = {{"pass", problems.empty()}, {"problems", problems}};
    for (const std::string& p : problems) std::fprintf(stderr, "CHECK FAILED layer %d batch %lld: %s\n", layer, static_cast<long long>(B), p.c_str());
    b.check_failures += static_cast<int>(problems.size());
  }

  for (int i = 0; i < 3; ++i) graph.replay();  // warm
  std::vector<cu::Event> ev;
  ev.reserve(static_cast<size_t>(b.opt.replays) + 1);
  for (int i = 0; i <= b.opt.replays; ++i) ev.emplace_back(true);
  ev[0].record(s);
  for (int i = 0; i < b.opt.replays; ++i) {
    graph.replay();
    ev[static_cast<size_t>(i) + 1].record(s);
  }
  ev.back().synchronize();
  std::vector<double> us;
  for (int i = 0; i < b.opt.replays; ++i) us.push_back(1e3 * ev[i + 1].elapsed_ms_since(ev[i]) / R);

  const LayerBytes bytes = count_bytes(b.config, lw, *b.kv, layer, B, b.opt.ctx_tokens, bank_rows);
  const double med = bench::median(us), total = bytes.total();
  const double floor_us = total / b.copy_bytes_per_second * 1e6;
  const auto& n = graph.nodes();
  const std::string name = std::string(kda ? "A kda+moe" : "B mla+moe") + " L" + std::to_string(layer);
  std::printf("  %-14s batch %3lld: %9.1f us/layer (p10 %.1f, p90 %.1f), %.1f kernels/layer, %.1f MB, %.0f GB/s, %.2fx floor%s\n",
              name.c_str(), static_cast<long long>(B), med, percentile(us, 0.1), percentile(us, 0.9),
              static_cast<double>(n.kernels) / R, total / 1e6, total / (med * 1e-6) / 1e9, med / floor_us,
              b.opt.check ? (problems.empty() ? ", check ok" : ", CHECK FAILED") : "");
  std::fflush(stdout);
  b.rows.push_back({{"layer", name}, {"layer_index", layer}, {"batch", B}, {"copies", R}, {"replays", b.opt.replays},
                    {"median_us", med}, {"p10_us", percentile(us, 0.1)}, {"p90_us", percentile(us, 0.9)},
                    {"samples_us_per_layer", us}, {"kernels_per_layer", static_cast<double>(n.kernels) / R},
                    {"memcpy_nodes_per_layer", static_cast<double>(n.memcpys) / R},
                    {"memset_nodes_per_layer", static_cast<double>(n.memsets) / R},
                    {"other_nodes_per_layer", static_cast<double>(n.other) / R}, {"bytes", bytes.json()},
                    {"GBps", total / (med * 1e-6) / 1e9}, {"floor_us_copy", floor_us}, {"ratio_to_copy_floor", med / floor_us},
                    {"floor_us_4p3TBps", total / kSpecBytesPerSecond * 1e6},
                    {"ratio_to_4p3TBps_floor", med / (total / kSpecBytesPerSecond * 1e6)}, {"check", check}});
}

void print_table(const Bench& b) {
  std::printf("\nk3-layer-tp8 decode, one layer per step (µs = CUDA-graph time / %d copies, median of %d replays); "
              "device copy %.0f GB/s; floor = bytes / copy bandwidth\n",
              b.opt.copies, b.opt.replays, b.copy_bytes_per_second / 1e9);
  std::printf("%-16s %5s %10s %9s %9s %8s %10s %8s %10s %8s\n", "layer", "batch", "us/layer", "p10", "p90", "kernels",
              "MB/layer", "GB/s", "floor_us", "x_floor");
  for (const auto& r : b.rows)
    std::printf("%-16s %5lld %10.1f %9.1f %9.1f %8.1f %10.2f %8.0f %10.1f %8.2f\n", r["layer"].get<std::string>().c_str(),
                static_cast<long long>(r["batch"].get<int64_t>()), r["median_us"].get<double>(), r["p10_us"].get<double>(),
                r["p90_us"].get<double>(), r["kernels_per_layer"].get<double>(), r["bytes"]["total"].get<double>() / 1e6,
                r["GBps"].get<double>(), r["floor_us_copy"].get<double>(), r["ratio_to_copy_floor"].get<double>());
}

Options parse_options(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto value = [&]() -> std::string {
      K3_CHECK(i + 1 < argc, a + " needs a value");
      return argv[++i];
    };
    if (a == "--out") o.out = value();
    else if (a == "--batches") o.batches = k3::bench::parse_int_list(value(), a);
    else if (a == "--layers") o.layers = value();
    else if (a == "--replays") o.replays = std::stoi(value());
    else if (a == "--copies") o.copies = std::stoi(value());
    else if (a == "--ctx") o.ctx_tokens = std::stoi(value());
    else if (a == "--seed") o.seed = std::stoull(value());
    else if (a == "--check") o.check = true;
    else if (a == "--help" || a == "-h") {
      std::cout << "k3bench_layer_gpu [--out FILE] [--batches 1,8,32,64] [--layers kda,mla] [--replays N] [--copies R]\n"
                   "                  [--ctx TOKENS] [--check] [--seed S]\n";
      std::exit(0);
    } else {
      throw core::Error("unknown option " + a + " (try --help)");
    }
  }
  K3_CHECK(!o.batches.empty(), "--batches is empty");
  for (int64_t B : o.batches) K3_CHECK(B >= 1, "--batches: every batch must be >= 1");
  std::sort(o.batches.begin(), o.batches.end());  // the largest (last) sizes the storage
  K3_CHECK(o.replays >= 5, "--replays must be >= 5");
  K3_CHECK(o.copies >= 1, "--copies must be >= 1");
  K3_CHECK(o.ctx_tokens >= 1, "--ctx must be >= 1");
  K3_CHECK(o.layers.find("kda") != std::string::npos || o.layers.find("mla") != std::string::npos,
           "--layers must name kda and/or mla");
  return o;
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
    b.config = rank_config();
    b.ctx = cu::Context::create(0);
    b.memory = cu::make_device_memory(b.ctx);
    kernels::register_reference_ops(b.registry);
    kernels::register_cuda_ops(b.registry, b.ctx);
    b.model_options.device = core::Device::cuda;
    b.model_options.precision = kernels::Precision::bf16;
    const auto& info = b.ctx->info();
    b.copy_bytes_per_second = measure_copy_bandwidth(b);
    std::printf("k3bench_layer_gpu on %s (%d SMs, L2 %zu MiB): device copy %.0f GB/s (read + write)\n", info.name.c_str(),
                info.sm_count, info.l2_bytes >> 20, b.copy_bytes_per_second / 1e9);
    std::printf("  k3-layer-tp8 (spec §14.2): one TP8 rank, hidden 7168, 12 KDA / 12 MLA heads, 896 MXFP4 experts "
                "[384, 3584], ctx %d, fp8 latent cache, bf16 activations\n", b.opt.ctx_tokens);
    std::printf("  collectives STUBBED: single GPU, the TP all-reduces are not run. Weights random; experts are random "
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
    std::vector<int32_t> pages(static_cast<size_t>(sc.num_blocks));  // shuffled: pages of a sequence are scattered
    for (size_t i = 0; i < pages.size(); ++i) pages[i] = static_cast<int32_t>(i);
    core::Rng shuffle(b.opt.seed ^ 0x5eedull);
    for (size_t i = pages.size(); i > 1; --i) std::swap(pages[i - 1], pages[shuffle.next_u64() % i]);
    b.seqs.resize(static_cast<size_t>(nseq));
    for (int64_t i = 0; i < nseq; ++i) {
      auto& q = b.seqs[static_cast<size_t>(i)];
      q.num_tokens = b.opt.ctx_tokens;
      q.kda_slot = static_cast<int32_t>(i);
      q.block_table.assign(pages.begin() + i * pages_per_seq, pages.begin() + (i + 1) * pages_per_seq);
    }

    b.filler = std::make_unique<Filler>(Filler{*b.memory, b.stream(), b.opt.seed, {}});
    Filler& fl = *b.filler;
    const bool want_kda = b.opt.layers.find("kda") != std::string::npos, want_mla = b.opt.layers.find("mla") != std::string::npos;
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
                  static_cast<double>(layer_weight_bytes(lw)) / 1e9,
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      // The router bias as the model keeps it (model.cpp): f32, rounded to bf16 values in bf16 mode.
      const auto& moe = std::get<model::MoeWeights>(lw.ffn);
      Tensor bias = cu::download_f32(moe.router_bias.view(), b.stream());
      for (int64_t e = 0; e < bias.numel(); ++e) bias.data<float>()[e] = core::bf16_round(bias.data<float>()[e]);
      const Tensor router_bias = b.memory->upload(bias.view());
      for (const int64_t B : b.opt.batches) run_row(b, layer, lw, router_bias, B);
    }
    print_table(b);

    nlohmann::json env = bench::environment();
    env["gpu"] = {{"name", info.name}, {"sm_count", info.sm_count}, {"l2_bytes", info.l2_bytes},
                  {"global_bytes", info.global_bytes}, {"cc", std::to_string(info.cc_major) + "." + std::to_string(info.cc_minor)},
                  {"driver_version", info.driver_version}, {"runtime_version", info.runtime_version}};
    const nlohmann::json bundle = {
        {"benchmark", "layer_gpu"},
        {"environment", env},
        {"config", {{"name", "k3-layer-tp8"}, {"model", config::to_json(b.config)}, {"model_hash", b.config.hash()},
                    {"batches", b.opt.batches}, {"copies", b.opt.copies}, {"replays", b.opt.replays},
                    {"ctx_tokens", b.opt.ctx_tokens}, {"block_size", kBlockSize}, {"kv_cache", "fp8_e4m3"},
                    {"precision", "bf16"}, {"check", b.opt.check}, {"seed", b.opt.seed},
                    {"collectives", "stubbed (single GPU): TP all-reduces not run"},
                    {"weights", "random; experts random MXFP4 codes, E8M0 scales near 2^-7 (timing only)"},
                    {"timing", "CUDA graph of `copies` steps (own inputs, KDA slots, cache pages), one event pair per "
                               "replay, per layer = replay time / copies"},
                    {"bytes", "spec §12: weights read, KDA state+conv r+w, MLA fp8 latent read (ctx+1 tokens) + write, "
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
