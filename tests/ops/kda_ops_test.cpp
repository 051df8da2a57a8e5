// tests/ops/kda_ops_test.cpp: KDA short conv, recurrent (decode, verify rows) and chunked (prefill)
// attention on every device backend against the CPU reference, outputs and carried state both, at
// odd shapes and at the TP8 shapes (12 heads of 128, conv over 3 x 1536 channels).
#include <cmath>

#include "tests/ops/op_harness.h"

namespace k3::ops_test {
namespace {

// ---------------------------------------------------------------- kda_conv

void check_conv(Device* dev, Mode mode, int64_t T, int64_t C, int64_t K, uint64_t seed) {
  core::Rng rng(seed);
  const Tensor x = random_act(rng, {T, C}, mode);
  const Tensor w = random_uniform_f32(rng, {C, K}, 0.5);
  const Tensor state0 = random_act(rng, {C, K - 1}, Mode::bf16);  // the state holds bf16 values
  const Precision p = precision(mode);
  Tensor want = nan_tensor({T, C}), want_state = copy(state0);
  cpu_registry().kda_conv.run({x.view(), w.view(), want_state.view(), want.view(), p}, core::Device::cpu);
  // Device: the conv state is real bf16 in bf16 mode, f32 in fp32 mode.
  Tensor dx = dev->act(x, mode), dw = dev->upload(w), dstate = dev->upload(state0, act_dtype(mode));
  Tensor out = dev->poisoned(act_dtype(mode), {T, C});
  const kernels::KdaConvArgs args{dx.view(), dw.view(), dstate.view(), out.view(), p};
  expect_device_impl(dev->registry().kda_conv, args, dev);
  dev->registry().kda_conv.run(args, dev->kind());
  const std::string shape = shape_str({T, C, K});
  expect_close("kda_conv", shape, mode, "out", dev->to_host_f32(out.view()), want, tol_elementwise(mode));
  expect_close("kda_conv", shape, mode, "state", dev->to_host_f32(dstate.view()), want_state, Tol{0.0, 1 - 1e-12});
}

TEST(OpsOdd, KdaConv) {
  K3_REQUIRE_CUDA(dev);
  for (Mode m : kModes)
    for (int64_t T : {1, 2, 17, 54, 97}) check_conv(dev, m, T, 97, 4, 7000 + T);
}
TEST(OpsTp8, KdaConv) {
  K3_REQUIRE_CUDA(dev);
  for (Mode m : kModes)
    for (int64_t T : {1, 8, 64}) check_conv(dev, m, T, 3 * 1536, 4, 7100 + T);
}

// ---------------------------------------------------------------- kda_recurrent / kda_chunked

struct KdaInputs {
  Tensor q, k, v, f, b, a_log, dt_bias, state0;
  KdaInputs(core::Rng& rng, Mode mode, int64_t T, int H, int D) {
    const int64_t P = int64_t{H} * D;
    q = random_act(rng, {T, P}, mode), k = random_act(rng, {T, P}, mode), v = random_act(rng, {T, P}, mode);
    f = random_act(rng, {T, P}, mode, -1.0, 2.0);  // decays from strong to near 1
    b = random_act(rng, {T, H}, mode, 0.0, 1.5);
    a_log = random_act(rng, {2 * int64_t{H}}, Mode::fp32, 0.0, 0.5);  // junk beyond H is never read
    dt_bias = random_act(rng, {P}, Mode::fp32);
    state0 = random_act(rng, {H, D, D}, Mode::fp32, 0.0, 0.5);  // non-symmetric: catches a transpose
  }
};

void check_kda(Device* dev, Mode mode, bool chunked, int64_t T, int H, int D, int chunk, uint64_t seed) {
  core::Rng rng(seed);
  const KdaInputs in(rng, mode, T, H, D);
  const int64_t P = int64_t{H} * D;
  const Precision p = precision(mode);
  auto& cpu_table = chunked ? cpu_registry().kda_chunked : cpu_registry().kda_recurrent;
  Tensor want = nan_tensor({T, P}), want_state = copy(in.state0);
  cpu_table.run({in.q.view(), in.k.view(), in.v.view(), in.f.view(), in.b.view(), in.a_log.view(),
                 in.dt_bias.view(), want_state.view(), want.view(), H, D, -5.0f, chunk, p},
                core::Device::cpu);
  Tensor dq = dev->act(in.q, mode), dk = dev->act(in.k, mode), dv = dev->act(in.v, mode), df = dev->act(in.f, mode);
  Tensor db = dev->act(in.b, mode), d_alog = dev->upload(in.a_log), d_dt = dev->upload(in.dt_bias);
  Tensor dstate = dev->upload(in.state0), out = dev->poisoned(act_dtype(mode), {T, P});
  const kernels::KdaAttentionArgs args{dq.view(),     dk.view(), dv.view(), df.view(), db.view(), d_alog.view(),
                                       d_dt.view(),   dstate.view(), out.view(), H, D, -5.0f, chunk, p};
  auto& table = chunked ? dev->registry().kda_chunked : dev->registry().kda_recurrent;
  expect_device_impl(table, args, dev);
  table.run(args, dev->kind());
  const std::string op = chunked ? "kda_chunked" : "kda_recurrent";
  const std::string shape = shape_str({T, H, D}) + (chunked ? "c" + std::to_string(chunk) : "");
  expect_close(op, shape, mode, "out", dev->to_host_f32(out.view()), want, tol_attention(mode));
  expect_close(op, shape, mode, "state", dev->to_host_f32(dstate.view()), want_state, tol_attention(Mode::fp32));
}

TEST(OpsOdd, KdaRecurrent) {
  K3_REQUIRE_CUDA(dev);
  for (Mode m : kModes)
    for (int64_t T : {1, 17, 54, 97}) {
      check_kda(dev, m, false, T, 3, 17, 64, 7200 + T);
      check_kda(dev, m, false, T, 2, 32, 64, 7300 + T);
    }
}
TEST(OpsTp8, KdaRecurrent) {
  K3_REQUIRE_CUDA(dev);
  for (Mode m : kModes)
    for (int64_t T : {1, 4, 8}) check_kda(dev, m, false, T, 12, 128, 64, 7400 + T);  // decode, verify rows
}
TEST(OpsOdd, KdaChunked) {
  K3_REQUIRE_CUDA(dev);
  for (Mode m : kModes)
    for (int64_t T : {1, 17, 54, 97}) {
      check_kda(dev, m, true, T, 3, 17, 16, 7500 + T);
      check_kda(dev, m, true, T, 2, 32, 64, 7600 + T);
    }
}
TEST(OpsTp8, KdaChunked) {
  K3_REQUIRE_CUDA(dev);
  for (Mode m : kModes) check_kda(dev, m, true, 150, 12, 128, 64, 7700);  // 3 chunks, the last partial
}

}  // namespace
}  // namespace k3::ops_test
