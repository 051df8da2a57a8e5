// comm/custom_allreduce_test.cpp: the custom peer-access all-reduce (comm/custom_allreduce.h) on
// every visible GPU, one thread per GPU: one-shot and two-stage bit-identical to ThreadComm (the CPU
// oracle) and to NCCL rank_order (when built with NCCL) at decode shapes (1/3/17/64 x 7168) and odd widths, f32 and bf16;
// 1000 back-to-back calls with no host sync across the 32-bit sequence wrap; the fused reduce ->
// residual add -> Mix -> RMSNorm equal bit for bit to the unfused CUDA ops on one GPU (k3-layer-tp8
// hidden 7168 and odd shapes, bf16 and fp32 modes, both norm styles, restart); CUDA-graph capture
// replayed 100 times; clean errors for bad arguments. Needs 2+ GPUs with peer access, else skips.
#include "comm/custom_allreduce.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <string>
#include <thread>

#include "backends/cuda/check.h"
#include "backends/cuda/context.h"
#include "backends/cuda/device.h"
#include "backends/cuda/stream.h"
#include "comm/comm_test_util.h"
#include "comm/thread_comm.h"
#if defined(K3_HAVE_NCCL)
#include "comm/nccl_comm.h"
#endif
#include "kernels/registry.h"

namespace k3::comm {
namespace {

using core::DType;
using core::Shape;
using core::TensorView;
using kernels::Precision;
using kernels::RmsNormStyle;
using namespace k3::comm::testing;

constexpr int64_t kMaxBytes = 64 * 7168 * 4;  // 64 rows x 7168 f32: the largest decode partial

// The devices of the largest group this machine allows (all visible GPUs, at most 8), or a skip.
#define K3_REQUIRE_PEER_GPUS()                                                             \
  std::string why_;                                                                        \
  const int gpus_ = backends::cuda::device_count(&why_);                                   \
  if (gpus_ < 2) GTEST_SKIP() << "needs 2 CUDA devices, " << gpus_ << " visible " << why_; \
  std::vector<int> all_devices_;                                                           \
  for (int d = 0; d < std::min(gpus_, kCustomMaxRanks); ++d) all_devices_.push_back(d);    \
  if (auto s_ = CustomAllReduceGroup::devices_status(all_devices_); !s_)                   \
    GTEST_SKIP() << "custom all-reduce unavailable: " << s_.reason();

// Group sizes to run: 2, 3 (uneven chunks) and all visible GPUs, as far as they go.
std::vector<int> group_sizes(int visible) {
  std::vector<int> sizes;
  for (int n : {2, 3, std::min(visible, kCustomMaxRanks)})
    if (n <= visible && (sizes.empty() || n > sizes.back())) sizes.push_back(n);
  return sizes;
}

std::vector<int> first_devices(int n) {
  std::vector<int> d;
  for (int i = 0; i < n; ++i) d.push_back(i);
  return d;
}

// Device memory on the current device holding raw element bits.
struct DevBuf {
  DevBuf() = default;
  explicit DevBuf(size_t bytes_) : bytes(bytes_) {
    K3_CUDA_CHECK(cudaMalloc(&ptr, bytes + 16));
    K3_CUDA_CHECK(cudaMemset(ptr, 0xff, bytes + 16));  // NaN poison (f32 and bf16)
  }
  template <class T>
  explicit DevBuf(const std::vector<T>& host) : DevBuf(host.size() * sizeof(T)) {
    upload(host);
  }
  DevBuf(DevBuf&& o) noexcept : ptr(o.ptr), bytes(o.bytes) { o.ptr = nullptr; }
  ~DevBuf() {
    if (ptr) (void)cudaFree(ptr);
  }
  template <class T>
  void upload(const std::vector<T>& host) {
    K3_CUDA_CHECK(cudaMemcpy(ptr, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
    K3_CUDA_CHECK(cudaDeviceSynchronize());  // the collectives run on non-blocking streams
  }
  template <class T>
  std::vector<T> download() const {
    std::vector<T> host(bytes / sizeof(T));
    K3_CUDA_CHECK(cudaDeviceSynchronize());
    K3_CUDA_CHECK(cudaMemcpy(host.data(), ptr, bytes, cudaMemcpyDeviceToHost));
    return host;
  }
  TensorView view(DType dtype, Shape shape) const {
    return TensorView::contiguous(ptr, dtype, shape, core::Device::cuda);
  }
  void* ptr = nullptr;
  size_t bytes = 0;
};

// fn(rank handle, rank's own stream) on one thread per rank; then the stream is synchronised.
// Rethrows the first error; a hang (a rank that never arrives) aborts via the guard.
void run_custom(CustomAllReduceGroup& group, const std::function<void(CustomAllReduce&, cudaStream_t)>& fn) {
  with_hang_guard(std::chrono::seconds(180), [&] {
    std::vector<std::thread> threads;
    std::vector<std::exception_ptr> errors(static_cast<size_t>(group.size()));
    for (int r = 0; r < group.size(); ++r)
      threads.emplace_back([&, r] {
        try {
          CustomAllReduce& c = group.rank(r);
          K3_CUDA_CHECK(cudaSetDevice(c.device()));
          backends::cuda::Stream stream;
          fn(c, stream.get());
          stream.synchronize();
        } catch (...) {
          errors[static_cast<size_t>(r)] = std::current_exception();
        }
      });
    for (auto& t : threads) t.join();
    for (auto& e : errors)
      if (e) std::rethrow_exception(e);
  });
}

std::vector<float> random_values(uint64_t seed, int64_t count, double scale, bool bf16) {
  core::Rng rng(seed);
  std::vector<float> v(static_cast<size_t>(count));
  for (auto& x : v) x = static_cast<float>(rng.normal() * scale);
  return bf16 ? bf16_to_f32(to_bf16(v)) : v;
}

// ---- CPU-only checks (run everywhere) ------------------------------------------------------------

TEST(CustomAllReduce, RejectsBadDeviceListsBeforeTouchingMemory) {
  EXPECT_FALSE(CustomAllReduceGroup::devices_status({}));
  EXPECT_FALSE(CustomAllReduceGroup::devices_status({0}));
  EXPECT_FALSE(CustomAllReduceGroup::devices_status({0, 0}));
  EXPECT_FALSE(CustomAllReduceGroup::devices_status({0, 1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_FALSE(CustomAllReduceGroup::devices_status({-1, 0}));
  EXPECT_THROW(CustomAllReduceGroup::create({0, 0}, kMaxBytes), core::Error);
  EXPECT_THROW(CustomAllReduceGroup::create({}, kMaxBytes), core::Error);
}

// ---- plain all-reduce ---------------------------------------------------------------------------

TEST(CustomAllReduce, OneShotAndTwoStageAreBitIdenticalToThreadCommAndNcclRankOrder) {
  K3_REQUIRE_PEER_GPUS();
  const Shape shapes[] = {{1, 7168}, {3, 7168}, {17, 7168}, {64, 7168}, {1, 97}, {17, 97}, {54, 97}, {1, 1}};
  for (int n : group_sizes(gpus_)) {
    auto group = CustomAllReduceGroup::create(first_devices(n), kMaxBytes);
#if defined(K3_HAVE_NCCL)
    launch_with_nvls_off();
    NcclGroup nccl(first_devices(n));
#endif
    for (const Shape& shape : shapes) {
      for (DType dtype : {DType::f32, DType::bf16}) {
        const bool bf16 = dtype == DType::bf16;
        const int64_t count = shape.numel();
        SCOPED_TRACE(std::to_string(n) + " ranks, " + shape.str() + " " + std::string(core::dtype_name(dtype)));
        std::vector<std::vector<float>> inputs;
        for (int r = 0; r < n; ++r) {
          inputs.push_back(order_sensitive_values(9000 * n + 31 * r + count, count));
          if (bf16) inputs.back() = bf16_to_f32(to_bf16(inputs.back()));
        }
        // The oracle: ThreadComm on the CPU, as raw element bits.
        std::vector<std::vector<float>> cpu_f32(inputs);
        std::vector<std::vector<uint16_t>> cpu_bf16;
        for (const auto& v : inputs) cpu_bf16.push_back(to_bf16(v));
        run_ranks(n, [&](Communicator& c) {
          const size_t r = static_cast<size_t>(c.rank());
          void* data = bf16 ? static_cast<void*>(cpu_bf16[r].data()) : static_cast<void*>(cpu_f32[r].data());
          c.all_reduce_sum(TensorView::contiguous(data, dtype, shape));
        });
        const std::vector<float> expected = bf16 ? bf16_to_f32(cpu_bf16[0]) : cpu_f32[0];
        ASSERT_EQ(first_bit_mismatch(expected,
                                     bf16 ? bf16_to_f32(to_bf16(rank_order_sum(inputs))) : rank_order_sum(inputs)),
                  -1);

        // Custom one-shot, custom two-stage and NCCL rank_order, each from the same inputs.
        std::vector<std::vector<float>> got[3];
        for (auto& g : got) g.resize(static_cast<size_t>(n));
        auto fetch = [&](const DevBuf& b) { return bf16 ? bf16_to_f32(b.download<uint16_t>()) : b.download<float>(); };
        auto device_input = [&](size_t r) { return bf16 ? DevBuf(to_bf16(inputs[r])) : DevBuf(inputs[r]); };
        run_custom(*group, [&](CustomAllReduce& c, cudaStream_t s) {
          const size_t r = static_cast<size_t>(c.rank());
          DevBuf a = device_input(r), b = device_input(r);
          c.all_reduce_one_shot(a.view(dtype, shape), s);
          c.all_reduce_two_stage(b.view(dtype, shape), s);
          K3_CUDA_CHECK(cudaStreamSynchronize(s));
          got[0][r] = fetch(a);
          got[1][r] = fetch(b);
        });
        int variants = 2;
#if defined(K3_HAVE_NCCL)
        std::vector<std::thread> threads;
        for (int r = 0; r < n; ++r)
          threads.emplace_back([&, r] {
            NcclComm& c = nccl.rank(r);
            K3_CUDA_CHECK(cudaSetDevice(c.device_index()));
            DevBuf x = device_input(static_cast<size_t>(r));
            c.all_reduce_sum(x.view(dtype, shape));
            K3_CUDA_CHECK(cudaStreamSynchronize(c.stream()));
            got[2][static_cast<size_t>(r)] = fetch(x);
          });
        for (auto& t : threads) t.join();
        variants = 3;
#endif
        const char* names[] = {"custom one-shot", "custom two-stage", "NCCL rank_order"};
        for (int v = 0; v < variants; ++v)
          for (int r = 0; r < n; ++r)
            EXPECT_EQ(first_bit_mismatch(got[v][static_cast<size_t>(r)], expected), -1) << names[v] << ", rank " << r;
      }
    }
  }
}

TEST(CustomAllReduce, ThousandBackToBackCallsAcrossTheSequenceWrap) {
  K3_REQUIRE_PEER_GPUS();
  const int n = static_cast<int>(all_devices_.size());
  auto group = CustomAllReduceGroup::create(all_devices_, kMaxBytes);
  enum class Form { one_shot, two_stage, automatic };
  struct Kind {
    Shape shape;
    DType dtype;
    Form form;
  };
  const Kind kinds[] = {{{1, 7168}, DType::bf16, Form::one_shot},
                        {{3, 97}, DType::f32, Form::two_stage},
                        {{2, 1000}, DType::f32, Form::automatic},
                        {{4, 2048}, DType::bf16, Form::two_stage}};
  constexpr int kCalls = 1000;
  constexpr uint32_t kStart = 0xffffffffu - 300;  // call 300 has seq 0xffffffff, call 301 seq 1
  // Inputs differ per call, so a stale line from an earlier call would show.
  std::vector<std::vector<std::vector<float>>> inputs(kCalls);  // [call][rank]
  std::vector<std::vector<float>> expected(kCalls);
  for (int i = 0; i < kCalls; ++i) {
    const Kind& k = kinds[i % 4];
    for (int r = 0; r < n; ++r)
      inputs[i].push_back(random_values(100000 * r + i, k.shape.numel(), 1.0 + i % 7, k.dtype == DType::bf16));
    expected[i] = rank_order_sum(inputs[i]);
    if (k.dtype == DType::bf16) expected[i] = bf16_to_f32(to_bf16(expected[i]));
  }
  std::vector<std::vector<std::vector<float>>> got(kCalls, std::vector<std::vector<float>>(static_cast<size_t>(n)));
  std::vector<uint32_t> final_seq(static_cast<size_t>(n));
  run_custom(*group, [&](CustomAllReduce& c, cudaStream_t s) {
    const size_t r = static_cast<size_t>(c.rank());
    c.set_sequence_for_testing(kStart);
    std::vector<DevBuf> bufs;
    for (int i = 0; i < kCalls; ++i) {
      const Kind& k = kinds[i % 4];
      bufs.push_back(k.dtype == DType::bf16 ? DevBuf(to_bf16(inputs[i][r])) : DevBuf(inputs[i][r]));
    }
    for (int i = 0; i < kCalls; ++i) {  // enqueued back to back: no host sync in between
      const Kind& k = kinds[i % 4];
      const TensorView x = bufs[static_cast<size_t>(i)].view(k.dtype, k.shape);
      if (k.form == Form::two_stage) c.all_reduce_two_stage(x, s);
      else if (k.form == Form::one_shot) c.all_reduce_one_shot(x, s);
      else c.all_reduce_sum(x, s);  // below the threshold: one-shot
    }
    K3_CUDA_CHECK(cudaStreamSynchronize(s));
    for (int i = 0; i < kCalls; ++i)
      got[i][r] = kinds[i % 4].dtype == DType::bf16 ? bf16_to_f32(bufs[static_cast<size_t>(i)].download<uint16_t>())
                                                    : bufs[static_cast<size_t>(i)].download<float>();
    final_seq[r] = c.sequence();
  });
  int bad_calls = 0;
  for (int i = 0; i < kCalls; ++i)
    for (int r = 0; r < n; ++r)
      if (first_bit_mismatch(got[i][static_cast<size_t>(r)], expected[i]) != -1 && ++bad_calls <= 5)
        ADD_FAILURE() << "call " << i << " rank " << r << ": element "
                      << first_bit_mismatch(got[i][static_cast<size_t>(r)], expected[i]) << " differs";
  EXPECT_EQ(bad_calls, 0);
  for (int r = 0; r < n; ++r) EXPECT_EQ(final_seq[static_cast<size_t>(r)], 700u) << "rank " << r << " (0 skipped)";
}

TEST(CustomAllReduce, RejectsBadArgumentsWithTheirNames) {
  K3_REQUIRE_PEER_GPUS();
  auto group = CustomAllReduceGroup::create({0, 1}, 4096);
  CustomAllReduce& c = group->rank(0);
  K3_CUDA_CHECK(cudaSetDevice(0));
  DevBuf big(8192), ints(64);
  auto reason = [](const core::Status& s) { return s ? std::string("ok") : s.reason(); };
  EXPECT_NE(reason(c.all_reduce_check(big.view(DType::f32, {2048}))).find("max_bytes"), std::string::npos);
  EXPECT_NE(reason(c.all_reduce_check(ints.view(DType::i32, {16}))).find("dtype"), std::string::npos);
  TensorView strided = big.view(DType::f32, {4, 8});
  strided.strides[0] = 16;
  EXPECT_NE(reason(c.all_reduce_check(strided)).find("contiguous"), std::string::npos);
  TensorView host = TensorView::contiguous(big.ptr, DType::f32, {4}, core::Device::cpu);
  EXPECT_NE(reason(c.all_reduce_check(host)).find("cuda"), std::string::npos);
  EXPECT_THROW(c.all_reduce_sum(big.view(DType::f32, {2048}), nullptr), core::Error);
  // Fused: a width the Mix's cluster form cannot take, and a partial that is not f32.
  DevBuf w(2 * 9000);
  FusedResidualMixNormArgs a;
  a.partial = big.view(DType::f32, {1, 1025});
  a.prefix_out = big.view(DType::f32, {1, 1025});
  a.x_out = big.view(DType::f32, {1, 1025});
  a.query = a.mix_norm = a.norm_weight = w.view(DType::bf16, {1025});
  EXPECT_NE(reason(c.fused_check(a)).find("D not a multiple of 8"), std::string::npos) << reason(c.fused_check(a));
  a.partial = big.view(DType::bf16, {1, 1025});
  EXPECT_NE(reason(c.fused_check(a)).find("partial must be an f32"), std::string::npos);
}

// ---- the fused step -----------------------------------------------------------------------------

struct FusedCase {
  int64_t T, D;
  int nb;     // bank rows
  DType act;  // activation storage
  Precision precision;
  RmsNormStyle style;
  bool restart;  // no prefix: prefix_out = the reduced sum
};

std::string describe(const FusedCase& f) {
  return "T " + std::to_string(f.T) + " D " + std::to_string(f.D) + " bank " + std::to_string(f.nb) + " " +
         std::string(core::dtype_name(f.act)) + (f.precision == Precision::bf16 ? " bf16-mode" : " fp32-mode") +
         (f.style == RmsNormStyle::moonshot ? " moonshot" : " fused-norm") + (f.restart ? " restart" : "");
}

// Host inputs of one fused case (activations as f32 values, bf16-representable when act is bf16).
struct FusedInputs {
  std::vector<std::vector<float>> partials;         // [rank] f32 [T, D]
  std::vector<float> prefix;                        // [T, D]
  std::vector<std::vector<float>> bank;             // [nb] [T, D]
  std::vector<float> query, mix_norm, norm_weight;  // [D] (bf16 values)
};

FusedInputs make_inputs(const FusedCase& f, int n, uint64_t seed) {
  const bool b = f.act == DType::bf16 || f.precision == Precision::bf16;  // stored activations are rounded
  FusedInputs in;
  for (int r = 0; r < n; ++r) {
    std::vector<float> p = order_sensitive_values(seed + 17 * r, f.T * f.D);
    for (auto& x : p) x *= 0.01f;
    in.partials.push_back(p);
  }
  in.prefix = random_values(seed + 1000, f.T * f.D, 2.0, b);
  for (int j = 0; j < f.nb; ++j) in.bank.push_back(random_values(seed + 2000 + j, f.T * f.D, 1.0 + j, b));
  in.query = random_values(seed + 3000, f.D, 0.05, true);
  in.mix_norm = random_values(seed + 3001, f.D, 0.2, true);
  in.norm_weight = random_values(seed + 3002, f.D, 0.3, true);
  for (auto& x : in.mix_norm) x = core::bf16_round(1.0f + x);
  for (auto& x : in.norm_weight) x = core::bf16_round(1.0f + x);
  return in;
}

DevBuf act_buf(const std::vector<float>& v, DType act) { return act == DType::bf16 ? DevBuf(to_bf16(v)) : DevBuf(v); }

std::vector<float> act_download(const DevBuf& b, DType act) {
  return act == DType::bf16 ? bf16_to_f32(b.download<uint16_t>()) : b.download<float>();
}

// The unfused CUDA ops on GPU 0: to_activation(rank-order sum) -> add -> attn_res_mix -> rmsnorm.
// Returns {prefix_out, x} as f32 values of the stored activations.
std::pair<std::vector<float>, std::vector<float>> unfused_reference(const FusedCase& f, const FusedInputs& in) {
  K3_CUDA_CHECK(cudaSetDevice(0));
  auto ctx = backends::cuda::Context::create(0);
  kernels::Registry reg;
  kernels::register_cuda_ops(reg, ctx);
  const Shape td{f.T, f.D};
  DevBuf sum(rank_order_sum(in.partials)), a(f.T * f.D * core::dtype_size(f.act));
  DevBuf prefix = act_buf(in.prefix, f.act), p(f.T * f.D * core::dtype_size(f.act));
  DevBuf h(f.T * f.D * core::dtype_size(f.act)), x(f.T * f.D * core::dtype_size(f.act));
  DevBuf q(to_bf16(in.query)), mn(to_bf16(in.mix_norm)), nw(to_bf16(in.norm_weight));
  std::vector<DevBuf> bank;
  for (const auto& rows : in.bank) bank.push_back(act_buf(rows, f.act));
  const core::Device cuda = core::Device::cuda;
  reg.to_activation.run({sum.view(DType::f32, td), a.view(f.act, td), f.precision}, cuda);
  const DevBuf& p_used = f.restart ? a : p;
  if (!f.restart) reg.add.run({prefix.view(f.act, td), a.view(f.act, td), p.view(f.act, td), f.precision}, cuda);
  std::vector<TensorView> sources;
  for (const auto& b : bank) sources.push_back(b.view(f.act, td));
  sources.push_back(p_used.view(f.act, td));
  reg.attn_res_mix.run(
      {sources, q.view(DType::bf16, {f.D}), mn.view(DType::bf16, {f.D}), h.view(f.act, td), 1e-5f, f.precision}, cuda);
  reg.rmsnorm.run({h.view(f.act, td), nw.view(DType::bf16, {f.D}), x.view(f.act, td), 1e-5f, f.style, f.precision},
                  cuda);
  K3_CUDA_CHECK(cudaStreamSynchronize(ctx->stream()));
  return {act_download(p_used, f.act), act_download(x, f.act)};
}

// One rank's device copies of a case's inputs and outputs, and the args naming them.
struct RankFused {
  DevBuf partial, prefix, query, mix_norm, norm_weight, prefix_out, x_out;
  std::vector<DevBuf> bank;
  std::vector<TensorView> bank_views;
  RankFused(const FusedCase& f, const FusedInputs& in, int r)
      : partial(in.partials[static_cast<size_t>(r)]),
        prefix(act_buf(in.prefix, f.act)),
        query(to_bf16(in.query)),
        mix_norm(to_bf16(in.mix_norm)),
        norm_weight(to_bf16(in.norm_weight)),
        prefix_out(f.T * f.D * core::dtype_size(f.act)),
        x_out(f.T * f.D * core::dtype_size(f.act)) {
    for (const auto& rows : in.bank) bank.push_back(act_buf(rows, f.act));
    for (const auto& b : bank) bank_views.push_back(b.view(f.act, {f.T, f.D}));
  }
  void reload(const FusedCase& f, const FusedInputs& in, int r) {  // new inputs, same buffers
    const auto upload_act = [&](DevBuf& b, const std::vector<float>& v) {
      if (f.act == DType::bf16) b.upload(to_bf16(v));
      else b.upload(v);
    };
    partial.upload(in.partials[static_cast<size_t>(r)]);
    upload_act(prefix, in.prefix);
    for (size_t j = 0; j < bank.size(); ++j) upload_act(bank[j], in.bank[j]);
    query.upload(to_bf16(in.query));
    mix_norm.upload(to_bf16(in.mix_norm));
    norm_weight.upload(to_bf16(in.norm_weight));
  }
  FusedResidualMixNormArgs args(const FusedCase& f) const {
    FusedResidualMixNormArgs a;
    const Shape td{f.T, f.D};
    a.partial = partial.view(DType::f32, td);
    if (!f.restart) a.prefix = prefix.view(f.act, td);
    a.bank = bank_views;
    a.query = query.view(DType::bf16, {1, f.D});
    a.mix_norm = mix_norm.view(DType::bf16, {f.D});
    a.norm_weight = norm_weight.view(DType::bf16, {f.D});
    a.prefix_out = prefix_out.view(f.act, td);
    a.x_out = x_out.view(f.act, td);
    a.style = f.style;
    a.precision = f.precision;
    return a;
  }
};

const FusedCase kFusedCases[] = {
    {1, 7168, 8, DType::bf16, Precision::bf16, RmsNormStyle::moonshot, false},  // k3-layer-tp8, batch 1
    {17, 7168, 8, DType::bf16, Precision::bf16, RmsNormStyle::fused, false},
    {64, 7168, 8, DType::f32, Precision::fp32, RmsNormStyle::moonshot, false},  // exact mode, batch 64
    {3, 7168, 1, DType::f32, Precision::bf16, RmsNormStyle::moonshot, true},    // f32 storage, rounded
    {3, 97, 3, DType::f32, Precision::fp32, RmsNormStyle::moonshot, false},     // odd width: scalar form
    {54, 97, 2, DType::bf16, Precision::bf16, RmsNormStyle::moonshot, false},
    {2, 1000, 0, DType::bf16, Precision::bf16, RmsNormStyle::fused, false},    // bank empty, 1 chunk part-full
    {5, 3000, 4, DType::bf16, Precision::bf16, RmsNormStyle::moonshot, true},  // 3 chunks, last part-full
};

TEST(CustomAllReduce, FusedStepIsBitIdenticalToTheUnfusedOps) {
  K3_REQUIRE_PEER_GPUS();
  for (int n : group_sizes(gpus_)) {
    if (n == 3 && gpus_ > 3) continue;  // keep the runtime down: 2 and all GPUs
    auto group = CustomAllReduceGroup::create(first_devices(n), kMaxBytes);
    for (const FusedCase& f : kFusedCases) {
      SCOPED_TRACE(std::to_string(n) + " ranks, " + describe(f));
      const FusedInputs in = make_inputs(f, n, 777 + f.T * 13 + f.D);
      const auto [want_prefix, want_x] = unfused_reference(f, in);
      std::vector<std::vector<float>> got_prefix(static_cast<size_t>(n)), got_x(static_cast<size_t>(n));
      run_custom(*group, [&](CustomAllReduce& c, cudaStream_t s) {
        const size_t r = static_cast<size_t>(c.rank());
        RankFused bufs(f, in, c.rank());
        c.fused_residual_mix_norm(bufs.args(f), s);
        K3_CUDA_CHECK(cudaStreamSynchronize(s));
        got_prefix[r] = act_download(bufs.prefix_out, f.act);
        got_x[r] = act_download(bufs.x_out, f.act);
      });
      for (int r = 0; r < n; ++r) {
        EXPECT_EQ(first_bit_mismatch(got_prefix[static_cast<size_t>(r)], want_prefix), -1) << "prefix_out, rank " << r;
        EXPECT_EQ(first_bit_mismatch(got_x[static_cast<size_t>(r)], want_x), -1) << "x_out, rank " << r;
      }
    }
  }
}

TEST(CustomAllReduce, CapturedInACudaGraphAndReplayed100Times) {
  K3_REQUIRE_PEER_GPUS();
  const int n = static_cast<int>(all_devices_.size());
  auto group = CustomAllReduceGroup::create(all_devices_, kMaxBytes);
  const FusedCase f{8, 7168, 8, DType::bf16, Precision::bf16, RmsNormStyle::moonshot, false};
  const Shape ar_shape{3, 7168};
  constexpr int kReplays = 100;
  const int checks[] = {0, 49, 99};  // new inputs before these replays, results checked after them
  std::vector<FusedInputs> inputs;
  std::vector<std::pair<std::vector<float>, std::vector<float>>> want;
  std::vector<std::vector<std::vector<float>>> ar_in;  // [check][rank]
  for (int i = 0; i < 3; ++i) {
    inputs.push_back(make_inputs(f, n, 4242 + i));
    want.push_back(unfused_reference(f, inputs.back()));
    ar_in.emplace_back();
    for (int r = 0; r < n; ++r) ar_in.back().push_back(random_values(5151 + 10 * i + r, ar_shape.numel(), 3.0, true));
  }
  std::vector<std::vector<bool>> ok(3, std::vector<bool>(static_cast<size_t>(n), false));
  run_custom(*group, [&](CustomAllReduce& c, cudaStream_t s) {
    const int r = c.rank();
    RankFused bufs(f, inputs[0], r);
    DevBuf ar_src(to_bf16(ar_in[0][static_cast<size_t>(r)])), ar(ar_src.bytes), ar2(ar_src.bytes);
    // The graph: two copies of the input all-reduced one-shot and two-stage, then the fused step.
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    K3_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    K3_CUDA_CHECK(cudaMemcpyAsync(ar.ptr, ar_src.ptr, ar_src.bytes, cudaMemcpyDeviceToDevice, s));
    K3_CUDA_CHECK(cudaMemcpyAsync(ar2.ptr, ar_src.ptr, ar_src.bytes, cudaMemcpyDeviceToDevice, s));
    c.all_reduce_one_shot(ar.view(DType::bf16, ar_shape), s);
    c.all_reduce_two_stage(ar2.view(DType::bf16, ar_shape), s);
    c.fused_residual_mix_norm(bufs.args(f), s);
    K3_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
    K3_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    int check = 0;
    for (int i = 0; i < kReplays; ++i) {
      if (i == checks[check] && check > 0) {  // new inputs (stream-ordered before this replay)
        K3_CUDA_CHECK(cudaStreamSynchronize(s));
        bufs.reload(f, inputs[static_cast<size_t>(check)], r);
        ar_src.upload(to_bf16(ar_in[static_cast<size_t>(check)][static_cast<size_t>(r)]));
      }
      K3_CUDA_CHECK(cudaGraphLaunch(exec, s));
      if (i == checks[check]) {
        K3_CUDA_CHECK(cudaStreamSynchronize(s));
        std::vector<float> ar_want = bf16_to_f32(to_bf16(rank_order_sum(ar_in[static_cast<size_t>(check)])));
        const auto& [wp, wx] = want[static_cast<size_t>(check)];
        ok[static_cast<size_t>(check)][static_cast<size_t>(r)] =
            first_bit_mismatch(bf16_to_f32(ar.download<uint16_t>()), ar_want) == -1 &&
            first_bit_mismatch(bf16_to_f32(ar2.download<uint16_t>()), ar_want) == -1 &&
            first_bit_mismatch(act_download(bufs.prefix_out, f.act), wp) == -1 &&
            first_bit_mismatch(act_download(bufs.x_out, f.act), wx) == -1;
        check = std::min(check + 1, 2);
      }
    }
    K3_CUDA_CHECK(cudaStreamSynchronize(s));
    K3_CUDA_CHECK(cudaGraphExecDestroy(exec));
    K3_CUDA_CHECK(cudaGraphDestroy(graph));
  });
  for (int i = 0; i < 3; ++i)
    for (int r = 0; r < n; ++r)
      EXPECT_TRUE(ok[static_cast<size_t>(i)][static_cast<size_t>(r)]) << "replay " << checks[i] << ", rank " << r;
}

}  // namespace
}  // namespace k3::comm
