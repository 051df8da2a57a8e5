// tests/ops/mla_ops_test.cpp: MLA attention, naive (prefill) and absorbed (decode, with several
// verify rows), on every device backend against the CPU reference, over bf16 / f32 / fp8 e4m3
// latent caches, at odd dims and at the TP8 shapes (12 heads, nope 128, rope 64, v 128, kv_lora 512,
// 8K context for decode).
#include <cmath>

#include "tests/ops/op_harness.h"

namespace k3::ops_test {
namespace {

struct MlaDims {
  int heads, nope, rope, v, kv_lora;
};

// cache: "bf16" (CPU: f32 holding bf16 values, device: real bf16), "f32" or "fp8".
void check_mla(Device* dev, Mode mode, bool absorbed, MlaDims d, int64_t S, int64_t T, const std::string& cache,
               float k_scale, uint64_t seed) {
  core::Rng rng(seed);
  const int64_t H = d.heads, L = d.kv_lora, E = d.kv_lora + d.rope;
  const Tensor q = random_act(rng, {T, H * (d.nope + d.rope)}, mode);
  const Tensor c_n = random_act(rng, {S, L}, Mode::bf16), k_pe = random_act(rng, {S, d.rope}, Mode::bf16);
  kernels::LinearWeight kv_b;
  kv_b.weight = random_bf16_weight(rng, H * (d.nope + d.v), L);
  // The cache, written by the CPU reference (bf16 values into f32, or fp8 codes).
  const bool fp8 = cache == "fp8";
  Tensor cpu_cache = Tensor::zeros(fp8 ? DType::f8_e4m3 : DType::f32, {S, E});
  cpu_registry().mla_cache_write.run({c_n.view(), k_pe.view(), cpu_cache.view(), k_scale}, core::Device::cpu);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d.nope + d.rope));
  const Precision p = precision(mode);
  auto& cpu_table = absorbed ? cpu_registry().mla_absorbed : cpu_registry().mla_naive;
  Tensor want = nan_tensor({T, H * d.v});
  cpu_table.run({q.view(), cpu_cache.view(), k_scale, &kv_b, want.view(), d.heads, d.nope, d.rope, d.v, d.kv_lora,
                 scale, p},
                core::Device::cpu);

  const DType dev_cache_dtype = fp8 ? DType::f8_e4m3 : cache == "bf16" ? DType::bf16 : DType::f32;
  Tensor dq = dev->act(q, mode), dcache = dev->upload(cpu_cache, dev_cache_dtype);
  const kernels::LinearWeight dkv_b = dev->upload(kv_b);
  Tensor out = dev->poisoned(act_dtype(mode), {T, H * d.v});
  const kernels::MlaAttentionArgs args{dq.view(), dcache.view(), k_scale, &dkv_b, out.view(), d.heads, d.nope,
                                       d.rope,    d.v,           d.kv_lora, scale, p};
  auto& table = absorbed ? dev->registry().mla_absorbed : dev->registry().mla_naive;
  expect_device_impl(table, args, dev);
  table.run(args, dev->kind());
  expect_close(absorbed ? "mla_absorbed" : "mla_naive", shape_str({S, T, H, d.nope, d.rope, d.v, L}), mode,
               "cache_" + cache, dev->to_host_f32(out.view()), want, tol_attention(mode));
}

const MlaDims kOdd{3, 17, 9, 13, 54};
const MlaDims kTp8{12, 128, 64, 128, 512};

TEST(OpsOdd, MlaNaive) {
  K3_REQUIRE_CUDA(dev);
  for (Mode m : kModes)
    for (int64_t T : {1, 17, 54, 97}) {
      const std::string dense = m == Mode::bf16 ? "bf16" : "f32";
      check_mla(dev, m, false, kOdd, T, T, dense, 1.0f, 8000 + T);           // a whole prefill
      check_mla(dev, m, false, kOdd, T + 40, T, "fp8", 0.5f, 8100 + T);     // a continuation
    }
}
TEST(OpsTp8, MlaNaive) {
  K3_REQUIRE_CUDA(dev);
  for (Mode m : kModes) {
    check_mla(dev, m, false, kTp8, 256, 256, m == Mode::bf16 ? "bf16" : "f32", 1.0f, 8200);
    check_mla(dev, m, false, kTp8, 300, 97, "fp8", 1.0f, 8300);
  }
}
TEST(OpsOdd, MlaAbsorbed) {
  K3_REQUIRE_CUDA(dev);
  for (Mode m : kModes)
    for (int64_t S : {1, 17, 54, 97})
      for (int64_t T : {int64_t{1}, std::min<int64_t>(S, 3)}) {  // decode and verify rows
        check_mla(dev, m, true, kOdd, S, T, m == Mode::bf16 ? "bf16" : "f32", 1.0f, 8400 + S * 10 + T);
        check_mla(dev, m, true, kOdd, S, T, "fp8", 0.25f, 8500 + S * 10 + T);
      }
}
TEST(OpsTp8, MlaAbsorbed8kContext) {
  K3_REQUIRE_CUDA(dev);
  for (Mode m : kModes)
    for (int64_t T : {1, 4}) {
      check_mla(dev, m, true, kTp8, 8192, T, "fp8", 1.0f, 8600 + T);
      check_mla(dev, m, true, kTp8, 8192, T, m == Mode::bf16 ? "bf16" : "f32", 1.0f, 8700 + T);
    }
}

}  // namespace
}  // namespace k3::ops_test
