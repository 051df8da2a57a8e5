// bench/decode_gpu.cpp: k3bench_decode_gpu, whole-model decode throughput of one checkpoint loaded
// once: a k3-proxy-tp8 checkpoint (one TP8 rank's share of K3, ~52 GB) opened with
// runner::ModelRunner on CUDA (bf16 activations, fp8 latent cache), decode-only steps swept over
// context length x batch x decode backend x mode. bench/decode_sweep.cpp runs the
// sweep (synthetic context, timing, path counters, spec §12 bytes, the table and the bundle).
//
//   k3bench_decode_gpu --model DIR [--make] [--config NAME|PATH] [--out FILE] [--batches 1,8,64]
//                      [--ctx 8192[,32768...]] [--steps N] [--warmup N] [--modes eager,graph]
//                      [--seed S] [--device cuda|cpu] [--tp N] [--spec-k K] [--spec-al AL]
//                      [--decode-backend auto[,latency_specialized]] [--precision bf16|fp32] [--profile]
// Rows run for each --ctx (in the order given), for each batch (ascending), for each
// --decode-backend (in the order given), for each mode (eager, graph, verify, verify-graph). Every row starts from
// the same synthetic context of its ctx (num_tokens = ctx, the same KDA state), so rows that differ
// only in the backend compare like for like; the table's x_auto column is auto's step time over
// latency_specialized's for those pairs.
// --decode-backend auto,latency_specialized: the runner's model gets the first, every other backend
// a sibling model on the same loaded weights (never loaded twice). latency_specialized: the fused
// path of fastpath/ serves the decode steps it covers; each row's decode_path says how many of its
// steps each path ran and why any fell back, and the bundle's decode_paths the totals per backend.
// --modes ... verify: speculative verify steps with SYNTHETIC acceptance: each
// sequence runs its last token + K drafts (--spec-k, default 7) through the decode path with KDA in
// no-commit mode, then Model::commit_verified keeps AL rows (--spec-al, default 6: KDA replay, MLA
// truncation); step time = both, tokens/s = batch * AL / step time. verify: every kernel launched;
// verify-graph: the verify forward replayed from a CUDA graph per (batch, K + 1) as the engine serves
// speculative steps (model::DecodeGraphs), the commit eager after it.
// --tp N: the checkpoint split over GPUs 0..N-1 with runner::TpRunner (one thread per GPU, NCCL
// rank-order collectives on each rank's op stream, captured into the graphs with the rest of the
// step); every rank builds its own synthetic context and sibling models; times are rank 0's; bytes
// and the floor are per GPU (the rank's shard, spec §11), so x_floor compares directly with the
// one-GPU rows.
// --dcp (with --tp N > 1): decode context parallelism: each rank stores and attends over every N-th
// token of each sequence's latent cache (model::ModelOptions::dcp = N; position p on rank p % N), so
// a long context's cache read per GPU shrinks N-fold; bytes count each rank's 1/N of the cache.
// --ep (with --tp N > 1): expert parallelism: each rank holds E / N whole routed experts instead of
// a slice of every expert (model::ModelOptions::expert_parallel, config/shard.h); bytes count the
// rank's expected 1/N of the touched experts, whole.
// --make: when DIR holds no checkpoint, first writes one with checkpoint::write_random_checkpoint
// (--config: a built-in name, default k3-proxy-tp8, or a config.json or its folder, as
// config::resolve_config reads it; MXFP4 experts), after checking the disk has room. A config file
// makes shapes no built-in has, e.g. K3's full widths in 4 layers to run at --tp 8.
// --device cpu runs the same code on the CPU reference ops (small configs only; the default in a
// build without CUDA, where CI runs it: bench/decode_sweep_test.cpp).
// Prints a table last and writes a JSON result bundle (bench/bundle.h): config (name, tp,
// weight_bytes, ctx_tokens = the first ctx, steps, sweep = the lists), checkpoint_write_seconds,
// load_seconds, copy_GBps, decode_path (the first backend's totals), decode_paths, and rows[] of
// ctx_tokens, batch, decode_backend, mode, median_ms, p10_ms, p90_ms, tokens_per_s,
// kernels_per_step, bytes.total, GBps, floor_ms_copy, ratio_to_copy_floor, logits_finite,
// decode_path, final_tokens and (latency_specialized rows with an auto twin) speedup_vs_auto;
// backend_agreement: for each latency_specialized row with an auto twin (eager, graph), how many of
// their greedy tokens (every step, every sequence) are equal. --precision fp32 (default bf16) runs
// fp32 activations: the backends' tokens must then be identical (bf16 noise may flip a nearly tied
// route of a random model).
// --profile: after each eager row, one more eager step with every op call timed on the stream (the
// per-layer kernel profile): op, implementation, calls, total us, us per layer and
// share of the step, printed under the row and kept in the bundle row's `profile`. With --tp N it
// is rank 0's step, run alongside the other ranks': the collectives are not ops, so their time is
// the step's time outside its top-level ops (printed; step_ms - top_level_ops_ms in the bundle).
// --tune FILE (with --modes eager, one GPU): after each eager row, one more eager step with every
// op call that has two or more capable implementations timed on each; the tuning table they give
// (kernels/tuning.h) is written to FILE: tuning/<gpu>.json is this file (bench/op_tuner.h).
// Exit 0 ok, 1 error, 2 no GPU.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/bundle.h"
#include "bench/decode_sweep.h"
#include "config/k3_config.h"
#include "core/error.h"
#include "evidence/environment.h"
#ifdef K3_HAVE_CUDA
#include "backends/cuda/device.h"
#endif

using namespace k3;
namespace fs = std::filesystem;

namespace {

const char* const kUsage =
    "k3bench_decode_gpu --model DIR [--make] [--config NAME|PATH] [--out FILE] [--batches 1,8,64] [--ctx 8192[,32768...]]\n"
    "                   [--steps N] [--warmup N] [--modes eager,graph,verify,verify-graph] [--seed S] [--device cuda|cpu] [--tp N]\n"
    "                   [--dcp] [--ep] [--spec-k K] [--spec-al AL] [--decode-backend auto[,latency_specialized]] [--precision bf16|fp32]\n"
    "                   [--profile] [--tune FILE]\n";
const std::vector<std::string> kModes = {"eager", "graph", "verify", "verify-graph"};  // the order rows run in

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> items;
  for (size_t pos = 0; pos <= text.size();) {
    const size_t comma = std::min(text.find(',', pos), text.size());
    items.push_back(text.substr(pos, comma - pos));
    pos = comma + 1;
  }
  return items;
}

int64_t int_value(const std::string& flag, const std::string& text) {
  const std::vector<int64_t> v = [&] {
    try {
      return bench::parse_int_list(text, flag);
    } catch (const std::invalid_argument& e) {
      throw core::Error(e.what());
    }
  }();
  K3_CHECK(v.size() == 1, flag + " takes one integer, got '" + text + "'");
  return v[0];
}

template <typename T>
void check_distinct(const std::vector<T>& v, const std::string& flag, const std::string& text) {
  for (size_t i = 0; i < v.size(); ++i)
    for (size_t j = i + 1; j < v.size(); ++j) K3_CHECK(!(v[i] == v[j]), flag + ": '" + text + "' names an item twice");
}

// argv without argv[0]; `help` set by --help / -h. Throws core::Error naming the flag and what it expected.
bench::DecodeSweepOptions parse_options(std::span<const std::string> args, bool& help) {
  bench::DecodeSweepOptions o;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    const auto value = [&]() -> std::string {
      K3_CHECK(i + 1 < args.size(), a + " needs a value");
      return args[++i];
    };
    const auto int_list = [&](const std::string& text) {
      try {
        return bench::parse_int_list(text, a);
      } catch (const std::invalid_argument& e) {
        throw core::Error(e.what());
      }
    };
    if (a == "--model") o.model = value();
    else if (a == "--make") o.make = true;
    else if (a == "--config") o.config = value();
    else if (a == "--out") o.out = value();
    else if (a == "--batches") {
      const std::string text = value();
      o.batches = int_list(text);
      for (int64_t B : o.batches)
        K3_CHECK(B >= 1 && B <= 4096, "--batches: every batch must be in 1..4096, got " + text);
      check_distinct(o.batches, a, text);
      std::sort(o.batches.begin(), o.batches.end());  // rows run from the smallest
    } else if (a == "--ctx") {
      const std::string text = value();
      o.ctxs = int_list(text);
      for (int64_t t : o.ctxs) K3_CHECK(t >= 1, "--ctx: every context length must be >= 1, got " + text);
      check_distinct(o.ctxs, a, text);
    } else if (a == "--steps") o.steps = static_cast<int>(int_value(a, value()));
    else if (a == "--warmup") o.warmup = static_cast<int>(int_value(a, value()));
    else if (a == "--modes") {
      const std::string text = value();
      const std::vector<std::string> named = split_list(text);
      check_distinct(named, a, text);
      for (const std::string& m : named)
        K3_CHECK(std::find(kModes.begin(), kModes.end(), m) != kModes.end(),
                 "--modes: '" + m + "' in '" + text + "' is not one of eager, graph, verify, verify-graph");
      o.modes.clear();
      for (const std::string& m : kModes)
        if (std::find(named.begin(), named.end(), m) != named.end()) o.modes.push_back(m);
    } else if (a == "--seed") {
      const std::string text = value();
      size_t used = 0;
      try {
        o.seed = std::stoull(text, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      K3_CHECK(!text.empty() && used == text.size() && text[0] != '-',
               "--seed takes an unsigned integer, got '" + text + "'");
    } else if (a == "--tp") o.tp = static_cast<int>(int_value(a, value()));
    else if (a == "--profile") o.profile = true;
    else if (a == "--tune") o.tune = value();
    else if (a == "--dcp") o.dcp = true;
    else if (a == "--ep") o.ep = true;
    else if (a == "--spec-k") o.spec_k = static_cast<int>(int_value(a, value()));
    else if (a == "--spec-al") o.spec_al = static_cast<int>(int_value(a, value()));
    else if (a == "--decode-backend") {
      const std::string text = value();
      o.backends.clear();
      for (const std::string& name : split_list(text)) {
        try {
          o.backends.push_back(model::parse_decode_backend(name));
        } catch (const core::Error& e) {
          throw core::Error("--decode-backend '" + text + "': " + e.what());
        }
      }
      check_distinct(o.backends, a, text);
    } else if (a == "--precision") {
      const std::string text = value();
      K3_CHECK(text == "bf16" || text == "fp32", "--precision must be bf16 or fp32, got '" + text + "'");
      o.precision = text == "fp32" ? kernels::Precision::fp32 : kernels::Precision::bf16;
    } else if (a == "--device") {
      const std::string d = value();
      K3_CHECK(d == "cuda" || d == "cpu", "--device must be cuda or cpu, got '" + d + "'");
      o.device = d == "cuda" ? core::Device::cuda : core::Device::cpu;
    } else if (a == "--help" || a == "-h") {
      help = true;
      return o;
    } else {
      throw core::Error("unknown option " + a + " (try --help)");
    }
  }
  K3_CHECK(!o.model.empty(), "--model DIR is required");
  K3_CHECK(o.tp >= 1 && o.tp <= 64, "--tp must be in [1, 64]");
  K3_CHECK(!o.dcp || o.tp > 1,
           "--dcp splits each sequence's latent cache over the TP ranks: it needs --tp N with N > 1");
  K3_CHECK(!o.ep || o.tp > 1, "--ep splits the routed experts whole over the TP ranks: it needs --tp N with N > 1");
  K3_CHECK(o.steps >= 1 && o.warmup >= 1, "--steps and --warmup must be >= 1");
  K3_CHECK(o.spec_k >= 1 && o.spec_k <= 32, "--spec-k must be in [1, 32]");
  K3_CHECK(o.spec_al >= 1 && o.spec_al <= o.spec_k + 1, "--spec-al must be in [1, spec-k + 1]");
  try {
    (void)config::resolve_config(o.config);  // a bad name or file fails now, not after a long load
  } catch (const core::Error& e) {
    throw core::Error("--config '" + o.config + "': " + e.what());
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  ::setenv("NCCL_NVLS_ENABLE", "0", 1);  // the launcher's environment (comm/nccl_comm.h)
  try {
    bool help = false;
    const std::vector<std::string> args(argv + 1, argv + argc);
    const bench::DecodeSweepOptions o = parse_options(args, help);
    if (help) {
      std::cout << kUsage;
      return 0;
    }
    nlohmann::json env = evidence::environment();
#ifdef K3_HAVE_CUDA
    if (o.device == core::Device::cuda) {
      std::string why;
      if (backends::cuda::device_count(&why) == 0) {
        std::fprintf(stderr, "k3bench_decode_gpu: no usable CUDA device: %s\n", why.c_str());
        return 2;
      }
      const backends::cuda::DeviceInfo info = backends::cuda::device_info(0);
      env["gpu"] = {{"name", info.name},
                    {"sm_count", info.sm_count},
                    {"l2_bytes", info.l2_bytes},
                    {"global_bytes", info.global_bytes},
                    {"cc", std::to_string(info.cc_major) + "." + std::to_string(info.cc_minor)},
                    {"driver_version", info.driver_version},
                    {"runtime_version", info.runtime_version}};
    }
#else
    K3_CHECK(o.device == core::Device::cpu, "this build has no CUDA backend: use --device cpu");
#endif
    const double make_seconds = bench::make_checkpoint_if_needed(o.model, o.config, o.seed, o.make);
    const nlohmann::json bundle = bench::run_decode_sweep(o, env, make_seconds);
    std::ofstream out(o.out);
    out << bundle.dump(2) << "\n";
    out.close();
    K3_CHECK(out.good(), "could not write " + o.out.string());
    std::printf("wrote %s\n", o.out.string().c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "k3bench_decode_gpu: error: %s\n", e.what());
    return 1;
  }
}
