// bench/allreduce_gpu.cpp: tensor-parallel all-reduce latency at decode sizes across the GPUs of one
// host (one thread per GPU, as the engine runs them): rows 1..64 x hidden 7168 (spec §11: the
// all-reduce after every o_proj / down-proj), for
//   nccl_native       ncclAllReduce, bf16 [rows, 7168] (NCCL's order; not the exact contract)
//   nccl_rank_order   NcclComm rank_order: p2p reduce-scatter + rank_sum + all-gather, bf16
//   custom_one_shot   comm/custom_allreduce.h one-shot, bf16
//   custom_two_stage  the custom reduce-scatter + all-gather kernel, bf16
//   custom_fused      the fused step: f32 partial [rows, 7168] -> sum -> bf16 -> prefix add ->
//                     AttnRes Mix over 8 bank rows + prefix -> RMSNorm (one kernel)
//   custom_unfused    the same step unfused: custom one-shot of the f32 partial, then to_activation,
//                     add, attn_res_mix, rmsnorm (the kernel registry's CUDA ops)
//   nccl_unfused      the same step with NCCL rank_order for the f32 partial (today's model path)
// Each rank captures `calls` back-to-back calls into one CUDA graph (no launch overhead in the
// numbers) and replays it; per call = replay time / calls on rank 0, median (p10, p90) over the
// replays. NVLink multicast stays off (main sets NCCL_NVLS_ENABLE=0, as every launcher does).
//
//   k3bench_allreduce_gpu [--out FILE] [--gpus N] [--rows 1,2,4,8,16,32,64] [--calls 20] [--replays 50]
// Prints a table and writes a JSON result bundle (bench/bundle.h). Exit 0 ok, 1 error, 2 fewer than
// 2 GPUs or no peer access.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "backends/cuda/check.h"
#include "backends/cuda/context.h"
#include "backends/cuda/device.h"
#include "backends/cuda/stream.h"
#include "bench/bundle.h"
#include "comm/custom_allreduce.h"
#include "comm/nccl_comm.h"
#include "evidence/environment.h"
#include "kernels/registry.h"

namespace k3 {
namespace {

namespace cu = backends::cuda;
using core::DType;
using core::Shape;
using core::TensorView;

constexpr int64_t kHidden = 7168;
constexpr int kBankRows = 8;  // K3's AttnRes bank (spec §3)
const char* const kVariants[] = {"nccl_native",  "nccl_rank_order", "custom_one_shot", "custom_two_stage",
                                 "custom_fused", "custom_unfused",  "nccl_unfused"};

struct Options {
  std::string out = "allreduce_gpu.json";
  int gpus = 0;  // 0: every visible GPU, at most 8
  std::vector<int64_t> rows = {1, 2, 4, 8, 16, 32, 64};
  int calls = 20;
  int replays = 50;
};

Options parse_options(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto value = [&]() -> std::string {
      K3_CHECK(i + 1 < argc, a + " needs a value");
      return argv[++i];
    };
    if (a == "--out") o.out = value();
    else if (a == "--gpus") o.gpus = std::stoi(value());
    else if (a == "--rows") o.rows = k3::bench::parse_int_list(value(), a);
    else if (a == "--calls") o.calls = std::stoi(value());
    else if (a == "--replays") o.replays = std::stoi(value());
    else if (a == "--help" || a == "-h") {
      std::cout
          << "k3bench_allreduce_gpu [--out FILE] [--gpus N] [--rows 1,2,4,8,16,32,64] [--calls 20] [--replays 50]\n";
      std::exit(0);
    } else {
      throw core::Error("unknown option " + a + " (try --help)");
    }
  }
  K3_CHECK(!o.rows.empty(), "--rows is empty");
  for (int64_t r : o.rows) K3_CHECK(r >= 1 && r <= 64, "--rows: every row count must be in [1, 64]");
  K3_CHECK(o.calls >= 1 && o.replays >= 5, "--calls must be >= 1 and --replays >= 5");
  return o;
}

// Device memory on the current device, filled with small bf16/f32 values or zeros.
struct Buf {
  void* ptr = nullptr;
  Buf(size_t bytes, DType dtype, float scale) {
    K3_CUDA_CHECK(cudaMalloc(&ptr, bytes));
    const size_t count = bytes / core::dtype_size(dtype);
    std::vector<uint16_t> b16(dtype == DType::bf16 ? count : 0);
    std::vector<float> f32(dtype == DType::f32 ? count : 0);
    uint64_t s = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < count; ++i) {  // a cheap LCG: values only matter for not being NaN
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      const float v = scale * (static_cast<float>(s >> 40) / 16777216.0f - 0.5f);
      if (dtype == DType::bf16) b16[i] = core::f32_to_bf16_bits(v);
      else f32[i] = v;
    }
    const void* src = dtype == DType::bf16 ? static_cast<const void*>(b16.data()) : f32.data();
    K3_CUDA_CHECK(cudaMemcpy(ptr, src, bytes, cudaMemcpyHostToDevice));
  }
  ~Buf() { (void)cudaFree(ptr); }
  TensorView view(DType dtype, Shape shape) const {
    return TensorView::contiguous(ptr, dtype, shape, core::Device::cuda);
  }
};

struct Sample {
  double median_us = 0, p10_us = 0, p90_us = 0;
};

double percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1))];
}

// One rank's part of one (variant, rows) measurement: captures `calls` calls into a graph on the
// context's stream, warms up, times `replays` replays. Returns per-call microseconds per replay.
std::vector<double> run_rank(const Options& o, const std::string& variant, int64_t rows, comm::NcclComm& nccl,
                             comm::CustomAllReduce& custom, cu::Context& ctx, const kernels::Registry& reg) {
  const cudaStream_t s = ctx.stream();
  const Shape td{rows, kHidden};
  const size_t act_bytes = static_cast<size_t>(rows * kHidden) * 2, f32_bytes = act_bytes * 2;
  Buf x(act_bytes, DType::bf16, 0.0f), partial(f32_bytes, DType::f32, 0.02f), sum(f32_bytes, DType::f32, 0.0f);
  Buf prefix(act_bytes, DType::bf16, 2.0f), a(act_bytes, DType::bf16, 0), p(act_bytes, DType::bf16, 0);
  Buf h(act_bytes, DType::bf16, 0), out(act_bytes, DType::bf16, 0);
  Buf query(kHidden * 2, DType::bf16, 0.1f), mix_norm(kHidden * 2, DType::bf16, 2.0f),
      norm_w(kHidden * 2, DType::bf16, 2.0f);
  std::vector<std::unique_ptr<Buf>> bank;
  std::vector<TensorView> bank_views;
  for (int j = 0; j < kBankRows; ++j) {
    bank.push_back(std::make_unique<Buf>(act_bytes, DType::bf16, 1.0f + j));
    bank_views.push_back(bank.back()->view(DType::bf16, td));
  }
  nccl.set_stream(s);
  nccl.set_sum_mode(variant == "nccl_native" ? comm::NcclSumMode::native : comm::NcclSumMode::rank_order);
  nccl.reserve_scratch(comm::NcclComm::scratch_bytes_for(rows * kHidden, DType::f32, nccl.size()));
  const core::Device dev = core::Device::cuda;
  const auto unfused_tail = [&](const TensorView& reduced) {  // model/layers/context.cpp's sequence
    reg.to_activation.run({reduced, a.view(DType::bf16, td), kernels::Precision::bf16}, dev);
    reg.add.run({prefix.view(DType::bf16, td), a.view(DType::bf16, td), p.view(DType::bf16, td),
                 kernels::Precision::bf16},
                dev);
    std::vector<TensorView> sources = bank_views;
    sources.push_back(p.view(DType::bf16, td));
    reg.attn_res_mix.run({sources, query.view(DType::bf16, {kHidden}), mix_norm.view(DType::bf16, {kHidden}),
                          h.view(DType::bf16, td), 1e-5f, kernels::Precision::bf16},
                         dev);
    reg.rmsnorm.run({h.view(DType::bf16, td), norm_w.view(DType::bf16, {kHidden}), out.view(DType::bf16, td), 1e-5f,
                     kernels::RmsNormStyle::moonshot, kernels::Precision::bf16},
                    dev);
  };
  comm::FusedResidualMixNormArgs fa;
  fa.partial = partial.view(DType::f32, td);
  fa.prefix = prefix.view(DType::bf16, td);
  fa.bank = bank_views;
  fa.query = query.view(DType::bf16, {kHidden});
  fa.mix_norm = mix_norm.view(DType::bf16, {kHidden});
  fa.norm_weight = norm_w.view(DType::bf16, {kHidden});
  fa.prefix_out = p.view(DType::bf16, td);
  fa.x_out = out.view(DType::bf16, td);
  const auto one_call = [&] {
    if (variant == "nccl_native" || variant == "nccl_rank_order") {
      nccl.all_reduce_sum(x.view(DType::bf16, td));  // zeros: in-place repeats stay finite
    } else if (variant == "custom_one_shot") {
      custom.all_reduce_one_shot(x.view(DType::bf16, td), s);
    } else if (variant == "custom_two_stage") {
      custom.all_reduce_two_stage(x.view(DType::bf16, td), s);
    } else if (variant == "custom_fused") {
      custom.fused_residual_mix_norm(fa, s);
    } else {  // custom_unfused / nccl_unfused: reduce a copy of the partial, then the four ops
      K3_CUDA_CHECK(cudaMemcpyAsync(sum.ptr, partial.ptr, f32_bytes, cudaMemcpyDeviceToDevice, s));
      if (variant == "custom_unfused") custom.all_reduce_one_shot(sum.view(DType::f32, td), s);
      else nccl.all_reduce_sum(sum.view(DType::f32, td));
      unfused_tail(sum.view(DType::f32, td));
    }
  };
  one_call();  // eager once: op selection, lazily created state, occupancy queries
  K3_CUDA_CHECK(cudaStreamSynchronize(s));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  K3_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
  for (int c = 0; c < o.calls; ++c) one_call();
  K3_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
  K3_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int w = 0; w < 3; ++w) K3_CUDA_CHECK(cudaGraphLaunch(exec, s));
  std::vector<cu::Event> marks;
  for (int i = 0; i <= o.replays; ++i) marks.emplace_back(true);
  marks[0].record(s);
  for (int i = 0; i < o.replays; ++i) {
    K3_CUDA_CHECK(cudaGraphLaunch(exec, s));
    marks[static_cast<size_t>(i) + 1].record(s);
  }
  K3_CUDA_CHECK(cudaStreamSynchronize(s));
  std::vector<double> per_call;
  for (int i = 0; i < o.replays; ++i)
    per_call.push_back(1000.0 * marks[static_cast<size_t>(i) + 1].elapsed_ms_since(marks[static_cast<size_t>(i)]) /
                       o.calls);
  K3_CUDA_CHECK(cudaGraphExecDestroy(exec));
  K3_CUDA_CHECK(cudaGraphDestroy(graph));
  return per_call;
}

}  // namespace
}  // namespace k3

int main(int argc, char** argv) {
  ::setenv("NCCL_NVLS_ENABLE", "0", 1);  // the launcher's environment (comm/nccl_comm.h)
  using namespace k3;
  try {
    const Options o = parse_options(argc, argv);
    std::string why;
    const int visible = cu::device_count(&why);
    const int n = o.gpus > 0 ? o.gpus : std::min(visible, comm::kCustomMaxRanks);
    std::vector<int> devices;
    for (int d = 0; d < n; ++d) devices.push_back(d);
    if (visible < 2 || n < 2 || n > visible) {
      std::fprintf(stderr, "k3bench_allreduce_gpu: needs 2+ CUDA devices, %d visible (%d asked) %s\n", visible, n,
                   why.c_str());
      return 2;
    }
    if (auto st = comm::CustomAllReduceGroup::devices_status(devices); !st) {
      std::fprintf(stderr, "k3bench_allreduce_gpu: %s\n", st.reason().c_str());
      return 2;
    }
    const int64_t max_rows = *std::max_element(o.rows.begin(), o.rows.end());
    auto custom = comm::CustomAllReduceGroup::create(devices, max_rows * kHidden * 4);
    comm::NcclGroup nccl(devices);
    std::vector<std::shared_ptr<cu::Context>> ctxs;
    std::vector<std::unique_ptr<kernels::Registry>> regs;
    for (int d : devices) {
      ctxs.push_back(cu::Context::create(d));
      regs.push_back(std::make_unique<kernels::Registry>());
      kernels::register_cuda_ops(*regs.back(), ctxs.back());
    }
    const cu::DeviceInfo info = cu::device_info(0);
    std::printf("allreduce_gpu: %d x %s, NCCL %s, %d calls per graph, %d replays\n", n, info.name.c_str(),
                comm::nccl_runtime_version().c_str(), o.calls, o.replays);
    nlohmann::json rows = nlohmann::json::array();
    std::map<std::pair<std::string, int64_t>, Sample> table;
    for (int64_t R : o.rows) {
      for (const char* variant : kVariants) {
        std::vector<std::vector<double>> samples(static_cast<size_t>(n));
        std::vector<std::string> errors(static_cast<size_t>(n));
        std::vector<std::thread> threads;
        for (int r = 0; r < n; ++r)
          threads.emplace_back([&, r] {
            try {
              K3_CUDA_CHECK(cudaSetDevice(devices[static_cast<size_t>(r)]));
              samples[static_cast<size_t>(r)] = run_rank(o, variant, R, nccl.rank(r), custom->rank(r),
                                                         *ctxs[static_cast<size_t>(r)], *regs[static_cast<size_t>(r)]);
            } catch (const std::exception& e) {
              errors[static_cast<size_t>(r)] = e.what();
              nccl.abort(std::string("rank failed: ") + e.what());  // the others must not wait forever
            }
          });
        for (auto& t : threads) t.join();
        for (const auto& e : errors)
          K3_CHECK(e.empty(), std::string(variant) + " rows " + std::to_string(R) + ": " + e);
        const auto& v = samples[0];
        Sample smp{percentile(v, 0.5), percentile(v, 0.1), percentile(v, 0.9)};
        table[{variant, R}] = smp;
        const bool fused_like = std::string(variant).find("fused") != std::string::npos;
        const int64_t bytes = R * kHidden * (fused_like ? 4 : 2);
        rows.push_back({{"variant", variant},
                        {"rows", R},
                        {"message_bytes", bytes},
                        {"median_us", smp.median_us},
                        {"p10_us", smp.p10_us},
                        {"p90_us", smp.p90_us}});
        std::fprintf(stderr, "measured %-17s rows %2lld: %8.2f us per call\n", variant, static_cast<long long>(R),
                     smp.median_us);
      }
    }
    std::printf("\nper-call latency, median us (p10-p90 in the JSON); %d GPUs, hidden %lld:\n", n,
                static_cast<long long>(kHidden));
    std::printf("  %-17s", "variant");
    for (int64_t R : o.rows) std::printf(" %8s", ("rows " + std::to_string(R)).c_str());
    std::printf("\n");
    for (const char* variant : kVariants) {
      std::printf("  %-17s", variant);
      for (int64_t R : o.rows) std::printf(" %8.2f", table[{variant, R}].median_us);
      std::printf("\n");
    }
    nlohmann::json env = evidence::environment();
    env["gpu"] = {{"name", info.name},
                  {"count", n},
                  {"sm_count", info.sm_count},
                  {"driver_version", info.driver_version},
                  {"runtime_version", info.runtime_version},
                  {"nccl", comm::nccl_runtime_version()}};
    const nlohmann::json bundle = {
        {"benchmark", "allreduce_gpu"},
        {"environment", env},
        {"config",
         {{"gpus", n},
          {"hidden", kHidden},
          {"rows", o.rows},
          {"calls_per_graph", o.calls},
          {"replays", o.replays},
          {"bank_rows", kBankRows},
          {"nvls", "off"},
          {"dtypes", "all-reduce variants bf16 [rows, 7168]; fused/unfused: f32 partial, bf16 activations"},
          {"timing",
           "CUDA graph of calls_per_graph calls per rank, one event pair per replay on rank 0, "
           "per call = replay time / calls_per_graph"}}},
        {"rows", rows}};
    std::ofstream(o.out) << bundle.dump(2) << "\n";
    std::printf("wrote %s\n", o.out.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "k3bench_allreduce_gpu: error: %s\n", e.what());
    return 1;
  }
}
