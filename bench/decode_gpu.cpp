// bench/decode_gpu.cpp: whole-model decode throughput on one GPU: a k3-proxy-tp8 checkpoint (one TP8
// rank's share of K3, ~52 GB, issue 5 item 7) opened with runner::ModelRunner on CUDA (bf16
// activations, fp8 latent cache), decode steps at batch 1, 8 and 64 with an 8K-token context per
// sequence.
//
// The context is built synthetically, not prefilled (8K tokens x 64 sequences through the model
// would take minutes): a model::KvStorage on the model's memory whose MLA pages hold random fp8
// latents (magnitudes 0.25..3.75, never NaN) and whose KDA state / conv slots hold small random
// values; each sequence starts at num_tokens = ctx with a shuffled block table covering ctx + the
// steps. Then Model::forward(kv, batch, LogitRows::last) runs StepKind::decode steps of one token
// per sequence, each fed the argmax of its previous logits: "eager" (every kernel launched per
// step) and "graph" (model::DecodeGraphs: the step captured once per batch size and replayed, as
// the engine serves pure-decode steps). A step's time is the wall time of the call, logits download
// included; tokens/s = batch / median step time.
//
// Bytes per step follow spec §12's counting from the actual config: every non-expert weight once
// (lm_head included; the embedding only its B rows), the expected distinct routed experts per MoE
// layer 896(1 - (1 - 16/896)^B) x the per-expert MXFP4 bytes, KDA state + conv state read and
// written, the fp8 latent cache read (ctx + 1 tokens) and written, AttnRes 2 x (bank rows + 1) x
// hidden bf16 per token per layer. GB/s = bytes / step time; the floor is bytes / the device copy
// bandwidth measured in the same run.
//
//   k3bench_decode_gpu --model DIR [--make] [--config NAME] [--out FILE] [--batches 1,8,64]
//                      [--ctx TOKENS] [--steps N] [--warmup N] [--modes eager,graph] [--seed S]
//                      [--device cuda|cpu] [--tp N] [--spec-k K] [--spec-al AL]
//                      [--decode-backend auto|latency_specialized]
// --decode-backend latency_specialized: the fused path of fastpath/ serves the decode steps it
// covers; the bundle's decode_path says how many steps each path ran and why any fell back.
// --modes ... verify: speculative verify steps with SYNTHETIC acceptance (issue #8's measure): each
// sequence runs its last token + K drafts (--spec-k, default 7) through the decode path with KDA in
// no-commit mode, then Model::commit_verified keeps AL rows (--spec-al, default 6: KDA replay, MLA
// truncation); step time = both, tokens/s = batch * AL / step time. Verify steps run eagerly (the
// engine does not capture them).
// --tp N: the checkpoint split over GPUs 0..N-1 with runner::TpRunner (one thread per GPU, NCCL
// rank-order collectives on each rank's op stream, captured into the graphs with the rest of the
// step); every rank builds its own synthetic context; times are rank 0's; bytes and the floor are
// per GPU (the rank's shard, spec §11), so x_floor compares directly with the one-GPU rows.
// --make: when DIR holds no checkpoint, first writes one with checkpoint::write_random_checkpoint
// (built-in --config, default k3-proxy-tp8, MXFP4 experts), after checking the disk has room.
// --device cpu runs the same code on the CPU reference ops (small configs only; for testing).
// Prints a table last and writes a JSON result bundle (bench/bundle.h). Exit 0 ok, 1 error, 2 no GPU.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/bundle.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/param_inventory.h"
#include "checkpoint/safetensors.h"
#include "config/k3_config.h"
#include "core/bf16.h"
#include "core/rng.h"
#include "model/decode_graphs.h"
#include "model/kv_storage.h"
#include "runner/model_runner.h"
#include "runner/tp_runner.h"
#ifdef K3_HAVE_NCCL
#include "comm/nccl_comm.h"
#endif
#ifdef K3_HAVE_CUDA
#include "backends/cuda/device.h"
#endif

using namespace k3;
namespace fs = std::filesystem;
using clock_type = std::chrono::steady_clock;

namespace {

constexpr int32_t kBlockSize = 16;              // tokens per MLA page
constexpr double kSpecBytesPerSecond = 4.3e12;  // spec §12

struct Options {
  fs::path model, out = "decode_gpu.json";
  bool make = false;
  std::string config = "k3-proxy-tp8", modes = "eager,graph";
  std::vector<int64_t> batches = {1, 8, 64};
  int64_t ctx = 8192;
  int steps = 16, warmup = 2;
  uint64_t seed = 1;
  core::Device device = core::Device::cuda;
  int tp = 1;  // > 1: runner::TpRunner, rank r on GPU r, NCCL collectives inside every step
  int spec_k = 7, spec_al = 6;  // mode "verify": K drafts per sequence, AL tokens kept per step
  model::DecodeBackend decode_backend = model::DecodeBackend::standard;
};

double seconds_since(clock_type::time_point t0) { return std::chrono::duration<double>(clock_type::now() - t0).count(); }

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[static_cast<size_t>(std::lround(p * static_cast<double>(v.size() - 1)))];
}

bool has_checkpoint(const fs::path& dir) {
  return fs::exists(dir / "config.json") &&
         (fs::exists(dir / checkpoint::kSingleFileName) || fs::exists(dir / checkpoint::kIndexFileName));
}

int64_t inventory_bytes(const config::K3Config& c) {
  int64_t n = 0;
  for (const checkpoint::ParamSpec& s : checkpoint::expected_params(c))
    n += s.shapes[0].numel() * static_cast<int64_t>(core::dtype_size(s.dtypes[0]));
  return n;
}

// ------------------------------------------------------------------ synthetic context

// Random bytes for a tensor of `dtype`: f32 / bf16 values U(-amp, amp); fp8 e4m3 values of magnitude
// 0.25..3.75 (exponent field 5..8, any mantissa: never NaN). Filled on every hardware thread, each
// with its own stream, and copied to the device in chunks of at most 256 MiB.
void fill_random(core::DeviceMemory& memory, const core::TensorView& dst, float amp, uint64_t seed) {
  K3_CHECK(dst.is_contiguous(), "fill_random: the destination must be contiguous");
  const size_t unit = core::dtype_size(dst.dtype), total = static_cast<size_t>(dst.nbytes());
  const size_t chunk_bytes = std::min(total, (size_t{256} << 20) / unit * unit);
  std::vector<uint8_t> host(chunk_bytes);
  const size_t threads = std::max(1u, std::thread::hardware_concurrency());
  for (size_t off = 0, chunk = 0; off < total; off += chunk_bytes, ++chunk) {
    const size_t bytes = std::min(chunk_bytes, total - off), n = bytes / unit;
    auto work = [&](size_t t) {
      core::Rng rng = core::Rng(seed).fork(chunk * 1024 + t);
      for (size_t i = n * t / threads, end = n * (t + 1) / threads; i < end; ++i) {
        const uint64_t r = rng.next_u64();
        const float u = amp * (static_cast<float>(r >> 40) * 0x1p-23f - 1.0f);  // U(-amp, amp)
        if (dst.dtype == core::DType::f32) {
          std::memcpy(host.data() + 4 * i, &u, 4);
        } else if (dst.dtype == core::DType::bf16) {
          const uint16_t b = core::f32_to_bf16_bits(u);
          std::memcpy(host.data() + 2 * i, &b, 2);
        } else {
          K3_CHECK(dst.dtype == core::DType::f8_e4m3, "fill_random: unexpected dtype");
          host[i] = static_cast<uint8_t>(((r >> 8) & 0x80) | ((5 + ((r >> 3) & 3)) << 3) | (r & 7));
        }
      }
    };
    std::vector<std::thread> pool;
    for (size_t t = 1; t < threads; ++t) pool.emplace_back(work, t);
    work(0);
    for (std::thread& th : pool) th.join();
    const core::Shape shape{static_cast<int64_t>(n)};
    memory.copy_from_host(core::TensorView::contiguous(static_cast<char*>(dst.data) + off, dst.dtype, shape, dst.device),
                          core::TensorView::contiguous(host.data(), dst.dtype, shape));
  }
}

// Device-to-device copy bandwidth (read + write) of a `bytes` DeviceMemory::copy, median of 10
// (wall time around copy + synchronize).
double measure_copy_bandwidth(core::DeviceMemory& memory, int64_t bytes) {
  const core::Shape shape{bytes >> 20, int64_t{1} << 20};
  core::Tensor src = memory.empty(core::DType::u8, shape), dst = memory.empty(core::DType::u8, shape);
  memory.fill_bytes(src.view(), 1);
  std::vector<double> s;
  for (int i = 0; i < 12; ++i) {
    memory.synchronize();
    const auto t0 = clock_type::now();
    memory.copy(dst.view(), src.view());
    memory.synchronize();
    if (i >= 2) s.push_back(seconds_since(t0));
  }
  return 2.0 * static_cast<double>(shape.numel()) / bench::median(s);
}

// ------------------------------------------------------------------ bytes (spec §12 rules)

struct StepBytes {
  double weights = 0, experts = 0, kda_state = 0, mla_kv = 0, attn_res = 0, embedding_rows = 0;
  double expected_experts_per_layer = 0;
  double total() const { return weights + experts + kda_state + mla_kv + attn_res + embedding_rows; }
  nlohmann::json json() const {
    return {{"weights_non_expert_incl_lm_head", weights}, {"routed_experts", experts}, {"kda_state_rw", kda_state},
            {"mla_kv_read_write", mla_kv}, {"attnres_activations", attn_res}, {"embedding_rows", embedding_rows},
            {"expected_distinct_experts_per_layer", expected_experts_per_layer}, {"total", total()}};
  }
};

StepBytes step_bytes(const config::K3Config& c, const model::KvStorage& kv, int64_t batch, int64_t ctx) {
  StepBytes b;
  const double B = static_cast<double>(batch);
  double per_expert = 0;  // one routed expert (w1 + w2 + w3) of one layer, as stored
  int moe_layers = 0;
  for (int l = 0; l < c.num_hidden_layers; ++l) moe_layers += c.ffn_kind(l) == config::FfnKind::moe;
  for (const checkpoint::ParamSpec& s : checkpoint::expected_params(c)) {
    const double n = static_cast<double>(s.shapes[0].numel() * static_cast<int64_t>(core::dtype_size(s.dtypes[0])));
    if (s.role == checkpoint::ParamRole::embedding) {
      b.embedding_rows = B * n / static_cast<double>(s.shapes[0][0]);
    } else if (s.role == checkpoint::ParamRole::expert_weight || s.role == checkpoint::ParamRole::expert_packed ||
               s.role == checkpoint::ParamRole::expert_scale) {
      per_expert += n;
    } else {
      b.weights += n;
    }
  }
  per_expert /= static_cast<double>(moe_layers) * c.moe.num_experts;
  const double E = c.moe.num_experts, k = c.moe.num_experts_per_token;
  b.expected_experts_per_layer = E * (1.0 - std::pow(1.0 - k / E, B));
  b.experts = moe_layers * b.expected_experts_per_layer * per_expert;
  const int32_t slots = kv.storage_config().num_slots;
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    if (c.attn_kind(l) == config::AttnKind::kda) {
      b.kda_state += 2.0 * B * static_cast<double>(kv.kda_states(l).nbytes() + kv.conv_states(l).nbytes()) / slots;
    } else {
      const double row = static_cast<double>(c.mla.cache_dim() * core::dtype_size(kv.mla_pages(l).dtype()));
      b.mla_kv += B * (static_cast<double>(ctx + 1) * row + row);
    }
    // Both Mix sides read bank ++ [prefix]; bank rows before layer l: ceil(l / block).
    const double bank_rows = static_cast<double>((l + c.attn_res_block_size - 1) / c.attn_res_block_size);
    b.attn_res += B * 2.0 * (bank_rows + 1.0) * static_cast<double>(c.hidden_size) * 2.0;
  }
  return b;
}

// ------------------------------------------------------------------ the benchmark

Options parse_options(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto value = [&]() -> std::string {
      K3_CHECK(i + 1 < argc, a + " needs a value");
      return argv[++i];
    };
    if (a == "--model") o.model = value();
    else if (a == "--make") o.make = true;
    else if (a == "--config") o.config = value();
    else if (a == "--out") o.out = value();
    else if (a == "--batches") o.batches = k3::bench::parse_int_list(value(), a);
    else if (a == "--ctx") o.ctx = std::stoll(value());
    else if (a == "--steps") o.steps = std::stoi(value());
    else if (a == "--warmup") o.warmup = std::stoi(value());
    else if (a == "--modes") o.modes = value();
    else if (a == "--seed") o.seed = std::stoull(value());
    else if (a == "--tp") o.tp = std::stoi(value());
    else if (a == "--spec-k") o.spec_k = std::stoi(value());
    else if (a == "--spec-al") o.spec_al = std::stoi(value());
    else if (a == "--decode-backend") o.decode_backend = model::parse_decode_backend(value());
    else if (a == "--device") {
      const std::string d = value();
      K3_CHECK(d == "cuda" || d == "cpu", "--device must be cuda or cpu, got '" + d + "'");
      o.device = d == "cuda" ? core::Device::cuda : core::Device::cpu;
    } else if (a == "--help" || a == "-h") {
      std::cout << "k3bench_decode_gpu --model DIR [--make] [--config NAME] [--out FILE] [--batches 1,8,64] [--ctx TOKENS]\n"
                   "                   [--steps N] [--warmup N] [--modes eager,graph,verify] [--seed S] [--device cuda|cpu] [--tp N]\n"
                   "                   [--spec-k K] [--spec-al AL] [--decode-backend auto|latency_specialized]\n";
      std::exit(0);
    } else {
      throw core::Error("unknown option " + a + " (try --help)");
    }
  }
  K3_CHECK(!o.model.empty(), "--model DIR is required");
  K3_CHECK(!o.batches.empty(), "--batches is empty");
  for (int64_t B : o.batches) K3_CHECK(B >= 1 && B <= 4096, "--batches: every batch must be in 1..4096");
  std::sort(o.batches.begin(), o.batches.end());  // the largest (last) sizes the storage
  K3_CHECK(o.ctx >= 1, "--ctx must be >= 1");
  K3_CHECK(o.tp >= 1 && o.tp <= 64, "--tp must be in [1, 64]");
  K3_CHECK(o.steps >= 1 && o.warmup >= 1, "--steps and --warmup must be >= 1");
  K3_CHECK(o.modes.find("eager") != std::string::npos || o.modes.find("graph") != std::string::npos ||
               o.modes.find("verify") != std::string::npos,
           "--modes must name eager, graph and/or verify");
  K3_CHECK(o.spec_k >= 1 && o.spec_k <= 32, "--spec-k must be in [1, 32]");
  K3_CHECK(o.spec_al >= 1 && o.spec_al <= o.spec_k + 1, "--spec-al must be in [1, spec-k + 1]");
  return o;
}

// Writes the checkpoint when --make asks and DIR has none: returns the seconds it took (0: reused).
double make_checkpoint_if_needed(const Options& o) {
  if (has_checkpoint(o.model)) {
    std::printf("using the checkpoint in %s\n", o.model.string().c_str());
    return 0;
  }
  K3_CHECK(o.make, "no checkpoint in " + o.model.string() + " (config.json + model.safetensors); pass --make to write one");
  const config::K3Config cfg = config::builtin_config(o.config);
  checkpoint::WriteOptions w;
  w.seed = o.seed;
  w.mxfp4 = true;
  config::K3Config written = cfg;
  written.mxfp4.enabled = true;
  const int64_t need = inventory_bytes(written);
  fs::create_directories(o.model);
  const auto space = fs::space(o.model);
  const int64_t margin = int64_t{1} << 30;
  if (static_cast<int64_t>(space.available) < need + margin) {
    char msg[256];
    std::snprintf(msg, sizeof msg, ": %.2f GB free, the checkpoint needs %.2f GB + 1 GB margin",
                  static_cast<double>(space.available) / 1e9, static_cast<double>(need) / 1e9);
    throw core::Error("not enough disk space for the " + o.config + " checkpoint in " + o.model.string() + msg);
  }
  std::printf("writing %s (%.2f GB, MXFP4 experts, seed %llu) to %s on %u threads ...\n", o.config.c_str(), need / 1e9,
              static_cast<unsigned long long>(o.seed), o.model.string().c_str(), std::thread::hardware_concurrency());
  std::fflush(stdout);
  const auto t0 = clock_type::now();
  checkpoint::write_random_checkpoint(cfg, w, o.model);
  const double s = seconds_since(t0);
  std::printf("  wrote %.2f GB in %.1f s (%.2f GB/s)\n", need / 1e9, s, need / 1e9 / s);
  return s;
}

struct Row {
  int64_t batch = 0;
  std::string mode;
  std::vector<double> ms;
  size_t kernels = 0;
  bool finite = true;
  int64_t tokens_per_seq = 1;  // tokens a step yields per sequence (verify: the synthetic AL)
};

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options o = parse_options(argc, argv);
    nlohmann::json env = bench::environment();
#ifdef K3_HAVE_CUDA
    if (o.device == core::Device::cuda) {
      std::string why;
      if (backends::cuda::device_count(&why) == 0) {
        std::fprintf(stderr, "k3bench_decode_gpu: no usable CUDA device: %s\n", why.c_str());
        return 2;
      }
      const backends::cuda::DeviceInfo info = backends::cuda::device_info(0);
      env["gpu"] = {{"name", info.name}, {"sm_count", info.sm_count}, {"l2_bytes", info.l2_bytes},
                    {"global_bytes", info.global_bytes}, {"cc", std::to_string(info.cc_major) + "." + std::to_string(info.cc_minor)},
                    {"driver_version", info.driver_version}, {"runtime_version", info.runtime_version}};
    }
#else
    K3_CHECK(o.device == core::Device::cpu, "this build has no CUDA backend: use --device cpu");
#endif
    const std::string device_name = env.contains("gpu") ? env["gpu"]["name"].get<std::string>() : "CPU (reference ops)";
    const double make_seconds = make_checkpoint_if_needed(o);

    // Open: map and check the checkpoint, upload every tensor (lazily mapped pages are read as the
    // upload touches them: no separate read-in pass). With --tp each rank's slices go to its GPU.
    model::ModelOptions mo;
    mo.device = o.device;
    mo.precision = kernels::Precision::bf16;
    mo.decode_backend = o.decode_backend;
    std::printf("opening %s on %s (tp %d) ...\n", o.model.string().c_str(), device_name.c_str(), o.tp);
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
    // The name shown: --config when the checkpoint holds that built-in config (MXFP4 experts), else the folder's.
    config::K3Config named = config::builtin_config(o.config);
    named.mxfp4.enabled = true;
    named.mxfp4.group_size = 32;
    const fs::path folder = o.model.filename().empty() ? o.model.parent_path() : o.model;
    const std::string label = named.hash() == full.hash() ? o.config : folder.filename().string();
    std::printf("opened %s on %s in %.1f s (%.2f GB of weights; read + upload %.2f GB/s)\n", o.model.string().c_str(),
                device_name.c_str(), load_seconds, weight_bytes / 1e9, weight_bytes / 1e9 / load_seconds);

    // Storage for the largest batch: ctx tokens already "cached" plus room for one mode's steps.
    const int64_t maxB = o.batches.back();
    const int64_t steps_per_run = o.warmup + o.steps;
    // A verify step writes K+1 rows and keeps AL: room for the last step's K+1 past the kept ones.
    const int64_t tokens_per_run = o.modes.find("verify") != std::string::npos
                                       ? steps_per_run * o.spec_al + o.spec_k + 1 : steps_per_run;
    const int64_t pages_per_seq = (o.ctx + tokens_per_run + kBlockSize - 1) / kBlockSize;
    model::KvStorageConfig sc;
    sc.num_blocks = static_cast<int32_t>(maxB * pages_per_seq);
    sc.block_size = kBlockSize;
    sc.num_slots = static_cast<int32_t>(maxB);
    sc.kv_dtype = model::KvCacheDtype::fp8_e4m3;

    // One rank's whole measurement (every rank runs it in lock step; rank 0 records). Returns the
    // rows, the copy bandwidth and the per-GPU bytes of a step at each batch.
    std::vector<Row> rows;
    double copy_bw = 0;
    std::vector<StepBytes> bytes_of;  // per row
    const auto measure = [&](int rank, const model::Model& model, comm::Communicator* comm) {
      core::DeviceMemory& memory = *model.memory();
      const bool record = rank == 0;
      const double bw = measure_copy_bandwidth(memory, o.device == core::Device::cuda ? int64_t{2} << 30 : int64_t{256} << 20);
      if (record) {
        copy_bw = bw;
        std::printf("device copy %.0f GB/s (read + write)\n", copy_bw / 1e9);
      }
#ifdef K3_HAVE_NCCL
      // A captured collective must never allocate: size the scratch for the largest one up front
      // (the packed [latent | hidden] f32 all-reduce of a MoE layer, or the logits all-gather).
      if (auto* nccl = dynamic_cast<comm::NcclComm*>(comm)) {
        const int64_t widest = std::max<int64_t>(c.moe.routed_expert_hidden_size + c.hidden_size, int64_t{c.vocab_size} * o.tp);
        nccl->reserve_scratch(comm::NcclComm::scratch_bytes_for(maxB * widest, core::DType::f32, o.tp));
      }
#else
      (void)comm;
#endif
      const auto tf = clock_type::now();
      model::KvStorage kv(c, sc, model.memory(), mo.precision);
      for (int l = 0; l < c.num_hidden_layers; ++l) {
        const uint64_t s = o.seed ^ (static_cast<uint64_t>(l + 1) * 0x100000001b3ull) ^ (static_cast<uint64_t>(rank) << 56);
        if (c.attn_kind(l) == config::AttnKind::mla) {
          fill_random(memory, kv.mla_pages(l).view(), 0.0f, s);
        } else {
          fill_random(memory, kv.kda_states(l).view(), 0.05f, s);
          fill_random(memory, kv.conv_states(l).view(), 1.0f, s ^ 0xc0);
        }
      }
      memory.synchronize();
      std::vector<int32_t> pages(static_cast<size_t>(sc.num_blocks));  // shuffled: a sequence's pages are scattered
      for (size_t i = 0; i < pages.size(); ++i) pages[i] = static_cast<int32_t>(i);
      core::Rng shuffle(o.seed ^ 0x5eedull);
      for (size_t i = pages.size(); i > 1; --i) std::swap(pages[i - 1], pages[shuffle.next_u64() % i]);
      std::vector<model::SequenceState> seqs(static_cast<size_t>(maxB));
      for (int64_t i = 0; i < maxB; ++i) {
        seqs[i].kda_slot = static_cast<int32_t>(i);
        seqs[i].block_table.assign(pages.begin() + i * pages_per_seq, pages.begin() + (i + 1) * pages_per_seq);
      }
      if (record) {
        std::printf("synthetic context: %lld sequences x %lld tokens (fp8 latent pages %.2f GB, KDA state + conv %.2f GB per GPU) in %.1f s\n",
                    static_cast<long long>(maxB), static_cast<long long>(o.ctx),
                    [&] { double n = 0; for (int l = 0; l < c.num_hidden_layers; ++l) if (c.attn_kind(l) == config::AttnKind::mla) n += kv.mla_pages(l).nbytes(); return n / 1e9; }(),
                    [&] { double n = 0; for (int l = 0; l < c.num_hidden_layers; ++l) if (c.attn_kind(l) == config::AttnKind::kda) n += kv.kda_states(l).nbytes() + kv.conv_states(l).nbytes(); return n / 1e9; }(),
                    seconds_since(tf));
        std::printf("per run (as measured):\n");
        std::fflush(stdout);
      }

      model::DecodeGraphs graphs(model, kv, pages_per_seq);
      for (const int64_t B : o.batches) {
        for (const std::string mode : {"eager", "graph", "verify"}) {
          if (o.modes.find(mode) == std::string::npos) continue;
          Row row{B, mode, {}, 0, true};
          std::vector<int32_t> ids(static_cast<size_t>(B));
          for (int64_t i = 0; i < B; ++i) {
            seqs[i].num_tokens = o.ctx;  // every run starts at the same context length
            ids[i] = static_cast<int32_t>((i * 7919 + 1) % full.vocab_size);
          }
          std::vector<model::SequenceInput> batch(static_cast<size_t>(B));
          if (mode == "verify") {
            // Speculative verify with synthetic acceptance: every sequence runs [last, K drafts]
            // through the decode path (KDA no-commit), then AL rows are kept (KDA replay, MLA
            // truncation). A step = forward + commit_verified; it yields AL tokens per sequence.
            const int64_t R = o.spec_k + 1;
            std::vector<int32_t> rows_ids(static_cast<size_t>(B * R));
            const std::vector<int32_t> keep(static_cast<size_t>(B), o.spec_al);
            model::VerifyCapture capture;
            for (int step = 0; step < steps_per_run; ++step) {
              for (int64_t i = 0; i < B; ++i) {
                rows_ids[i * R] = ids[i];
                for (int64_t j = 1; j < R; ++j) rows_ids[i * R + j] = static_cast<int32_t>((ids[i] + 31 * j) % full.vocab_size);
                batch[i] = {std::span<const int32_t>(&rows_ids[i * R], static_cast<size_t>(R)), &seqs[i],
                            model::StepKind::decode, /*verify=*/true};
              }
              const auto ts = clock_type::now();
              const core::Tensor logits = model.forward(kv, batch, model::LogitRows::verify, nullptr, &capture);
              model.commit_verified(kv, capture, keep);
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
          }
          for (int step = 0; mode != "verify" && step < steps_per_run; ++step) {
            for (int64_t i = 0; i < B; ++i) batch[i] = {std::span<const int32_t>(&ids[i], 1), &seqs[i], model::StepKind::decode};
            const auto ts = clock_type::now();
            const core::Tensor logits = mode == "graph" ? graphs.forward(batch) : model.forward(kv, batch, model::LogitRows::last);
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
          }
          if (!record) continue;
          if (mode == "graph") row.kernels = graphs.kernels_per_step(static_cast<int>(B));
          const double med = bench::median(row.ms);
          row.tokens_per_seq = mode == "verify" ? o.spec_al : 1;
          std::printf("  batch %3lld %-6s: %8.2f ms/step (p10 %.2f, p90 %.2f), %8.1f tok/s%s%s\n", static_cast<long long>(B),
                      mode.c_str(), med, percentile(row.ms, 0.1), percentile(row.ms, 0.9), 1e3 * B * row.tokens_per_seq / med,
                      row.kernels ? (", " + std::to_string(row.kernels) + " kernels/step").c_str() : "",
                      row.finite ? "" : ", NON-FINITE LOGITS");
          std::fflush(stdout);
          // A verify step moves what B * (K+1) decode rows move (every row reads its context).
          bytes_of.push_back(step_bytes(c, kv, mode == "verify" ? B * (o.spec_k + 1) : B, o.ctx));
          rows.push_back(std::move(row));
        }
      }
    };
    if (single) measure(0, single->model(), nullptr);
    else ranks->run([&](int rank, const model::Model& m, comm::Communicator& comm) { measure(rank, m, &comm); });
    // Which path ran the steps (latency_specialized falls back per step, with a reason).
    const model::DecodePathCounters paths = single ? single->model().decode_path_counters() : ranks->model(0).decode_path_counters();
    nlohmann::json fallbacks = nlohmann::json::object();
    for (const auto& [reason, n] : paths.fallbacks) fallbacks[reason] = n;
    std::printf("decode_backend %s: %lld steps fused, %lld standard%s%s\n",
                std::string(model::decode_backend_name(o.decode_backend)).c_str(), static_cast<long long>(paths.fused_steps),
                static_cast<long long>(paths.standard_steps), fallbacks.empty() ? "" : "; fallbacks ", fallbacks.empty() ? "" : fallbacks.dump().c_str());

    // Table and bundle.
    nlohmann::json jrows = nlohmann::json::array();
    std::printf("\n%s decode on %s%s: %d layers, ctx %lld tokens/sequence, fp8 latent cache, bf16 activations; median of %d steps "
                "after %d warm-up; device copy %.0f GB/s, floor = bytes per GPU / copy bandwidth\n",
                label.c_str(), device_name.c_str(), o.tp > 1 ? (" x" + std::to_string(o.tp) + " (TP, NCCL)").c_str() : "",
                c.num_hidden_layers, static_cast<long long>(o.ctx), o.steps, o.warmup, copy_bw / 1e9);
    std::printf("%5s %-6s %10s %9s %9s %10s %8s %9s %8s %9s %8s\n", "batch", "mode", "ms/step", "p10", "p90", "tok/s", "kernels",
                "GB/step", "GB/s", "floor_ms", "x_floor");
    for (size_t ri = 0; ri < rows.size(); ++ri) {
      const Row& r = rows[ri];
      const StepBytes& bytes = bytes_of[ri];
      const double med = bench::median(r.ms), total = bytes.total();
      const double floor_ms = total / copy_bw * 1e3;
      std::printf("%5lld %-6s %10.2f %9.2f %9.2f %10.1f %8zu %9.2f %8.0f %9.2f %8.2f%s\n", static_cast<long long>(r.batch),
                  r.mode.c_str(), med, percentile(r.ms, 0.1), percentile(r.ms, 0.9), 1e3 * r.batch * r.tokens_per_seq / med, r.kernels, total / 1e9,
                  total / (med * 1e-3) / 1e9, floor_ms, med / floor_ms, r.finite ? "" : "  NON-FINITE");
      jrows.push_back({{"batch", r.batch}, {"mode", r.mode}, {"median_ms", med}, {"p10_ms", percentile(r.ms, 0.1)},
                       {"p90_ms", percentile(r.ms, 0.9)}, {"samples_ms", r.ms}, {"tokens_per_s", 1e3 * r.batch * r.tokens_per_seq / med},
                       {"tokens_per_step_per_seq", r.tokens_per_seq},
                       {"kernels_per_step", r.kernels}, {"bytes", bytes.json()}, {"GBps", total / (med * 1e-3) / 1e9},
                       {"floor_ms_copy", floor_ms}, {"ratio_to_copy_floor", med / floor_ms},
                       {"floor_ms_4p3TBps", total / kSpecBytesPerSecond * 1e3},
                       {"ratio_to_4p3TBps_floor", med / (total / kSpecBytesPerSecond * 1e3)}, {"logits_finite", r.finite}});
    }
    const nlohmann::json bundle = {
        {"benchmark", "decode_gpu"},
        {"environment", env},
        {"config", {{"name", label}, {"model_dir", o.model.string()}, {"model", config::to_json(full)}, {"model_hash", full.hash()},
                    {"weight_bytes", weight_bytes}, {"tp", o.tp},
                    {"rank_model", config::to_json(c)}, {"batches", o.batches},
                    {"verify", {{"spec_k", o.spec_k}, {"synthetic_acceptance_length", o.spec_al},
                                {"what", "mode verify: SYNTHETIC acceptance; each step runs K+1 rows per sequence (KDA no-commit) "
                                         "and keeps AL (KDA replay + MLA truncation); tokens/s = B * AL / step time"}}}, {"ctx_tokens", o.ctx}, {"steps", o.steps},
                    {"warmup", o.warmup}, {"block_size", kBlockSize}, {"kv_cache", "fp8_e4m3"}, {"precision", "bf16"},
                    {"device", o.device == core::Device::cuda ? "cuda" : "cpu"}, {"seed", o.seed},
                    {"context", "synthetic: random fp8 latent pages, random KDA state/conv slots, num_tokens = ctx"},
                    {"feed", "argmax of the previous step's logits"},
                    {"timing", "wall time of Model::forward (eager) or DecodeGraphs::forward (graph), logits download included; "
                               "with tp > 1 rank 0's, every TP collective inside the step"},
                    {"bytes", "spec §12: non-expert weights incl. lm_head once, 896(1-(1-16/896)^B) distinct experts per MoE "
                              "layer x per-expert MXFP4 bytes, KDA state+conv r+w, fp8 latent read (ctx+1) + write, AttnRes "
                              "2 x (bank+1) rows x hidden bf16 per token per layer, embedding rows"}}},
        {"decode_path", {{"decode_backend", std::string(model::decode_backend_name(o.decode_backend))},
                         {"fused_steps", paths.fused_steps}, {"standard_steps", paths.standard_steps}, {"fallbacks", fallbacks}}},
        {"checkpoint_write_seconds", make_seconds},
        {"load_seconds", load_seconds},
        {"copy_GBps", copy_bw / 1e9},
        {"floor_GBps_spec", kSpecBytesPerSecond / 1e9},
        {"rows", jrows}};
    std::ofstream(o.out) << bundle.dump(2) << "\n";
    std::printf("wrote %s\n", o.out.string().c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "k3bench_decode_gpu: error: %s\n", e.what());
    return 1;
  }
}
