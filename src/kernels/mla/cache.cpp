// kernels/mla/cache.cpp: MLA latent cache entries [c_n | k_pe], write and dequantised read (spec §6.3).
//
// One entry per token per MLA layer: kv_lora (512) normalised latent values then rope (64) k_pe
// values. f32 caches hold the values as given; f8_e4m3 caches hold one E4M3 byte per element,
// code = fp8(x / k_scale) saturating at +-448, read back as fp8(code) * k_scale.
#include <cmath>
#include <cstring>
#include <string>

#include "core/fp8.h"
#include "kernels/mla/mla.h"
#include "kernels/mla/mla_internal.h"

namespace k3::kernels {

using mla_detail::describe;

core::Status mla_cache_write_check(const MlaCacheWriteArgs& a) {
  if (!mla_detail::is_rows(a.c_n) || !is_activation_dtype(a.c_n) || a.c_n.dim(1) < 1)
    return core::Status::fail("mla_cache_write: c_n must be f32 (or bf16 on CUDA) [T, kv_lora] with unit inner stride, got " +
                              describe(a.c_n));
  const int64_t T = a.c_n.dim(0), kv_lora = a.c_n.dim(1);
  if (!mla_detail::is_rows(a.k_pe) || !is_activation_dtype(a.k_pe) || a.k_pe.dim(0) != T)
    return core::Status::fail("mla_cache_write: k_pe must be f32 (or bf16 on CUDA) [T=" + std::to_string(T) +
                              ", rope] with unit inner stride, got " + describe(a.k_pe));
  const int64_t width = kv_lora + a.k_pe.dim(1);
  // bf16 caches live on CUDA (the CPU stores bf16 values in an f32 cache).
  if (a.dst.dtype != core::DType::f32 && a.dst.dtype != core::DType::f8_e4m3 &&
      !(a.dst.dtype == core::DType::bf16 && a.dst.device == core::Device::cuda))
    return core::Status::fail("mla_cache_write: dst must be f32 or f8_e4m3 (or bf16 on CUDA), got " +
                              describe(a.dst));
  if (!mla_detail::is_rows(a.dst) || a.dst.dim(0) != T || a.dst.dim(1) != width)
    return core::Status::fail("mla_cache_write: dst must be [T, kv_lora + rope] = [" + std::to_string(T) +
                              ", " + std::to_string(width) + "] with unit inner stride, got " +
                              describe(a.dst));
  if (!(std::isfinite(a.k_scale) && a.k_scale > 0.0f))
    return core::Status::fail("mla_cache_write: k_scale must be finite and > 0, got " +
                              std::to_string(a.k_scale));
  if (a.k_pe.device != a.c_n.device || a.dst.device != a.c_n.device)
    return core::Status::fail("mla_cache_write: c_n, k_pe and dst must be on one device");
  return core::Status::ok();
}

void mla_cache_write_reference(const MlaCacheWriteArgs& a) {
  const core::Status st = mla_cache_write_check(a);
  K3_CHECK(st.is_ok(), st.reason());
  K3_CHECK(a.dst.device == core::Device::cpu, "mla_cache_write_reference: tensors must be on the CPU");
  const int64_t T = a.c_n.dim(0), kv_lora = a.c_n.dim(1), rope = a.k_pe.dim(1);
  for (int64_t t = 0; t < T; ++t) {
    const float* c = mla_detail::row_ptr(a.c_n, t);
    const float* pe = mla_detail::row_ptr(a.k_pe, t);
    if (a.dst.dtype == core::DType::f32) {
      float* d = mla_detail::mutable_row_ptr(a.dst, t);
      std::memcpy(d, c, sizeof(float) * kv_lora);
      std::memcpy(d + kv_lora, pe, sizeof(float) * rope);
    } else {
      uint8_t* d = a.dst.as<uint8_t>() + t * a.dst.strides[0];
      for (int64_t i = 0; i < kv_lora; ++i) d[i] = core::f32_to_fp8_e4m3(c[i] / a.k_scale);
      for (int64_t i = 0; i < rope; ++i) d[kv_lora + i] = core::f32_to_fp8_e4m3(pe[i] / a.k_scale);
    }
  }
}

namespace mla_detail {

DequantCache dequantize_cache(const core::TensorView& cache, float k_scale, int64_t kv_lora,
                              int64_t rope) {
  DequantCache out;
  out.positions = cache.dim(0);
  out.kv_lora = kv_lora;
  out.rope = rope;
  out.c_n.resize(static_cast<size_t>(out.positions * kv_lora));
  out.k_pe.resize(static_cast<size_t>(out.positions * rope));
  // One table lookup per element instead of a decode: all 256 codes, pre-multiplied by k_scale.
  float fp8_value[256];
  for (int code = 0; code < 256; ++code)
    fp8_value[code] = core::fp8_e4m3_to_f32(static_cast<uint8_t>(code)) * k_scale;
  for (int64_t j = 0; j < out.positions; ++j) {
    float* c = out.c_n.data() + j * kv_lora;
    float* pe = out.k_pe.data() + j * rope;
    if (cache.dtype == core::DType::f32) {
      const float* src = cache.as<const float>() + j * cache.strides[0];
      std::memcpy(c, src, sizeof(float) * kv_lora);
      std::memcpy(pe, src + kv_lora, sizeof(float) * rope);
    } else {
      const uint8_t* src = cache.as<const uint8_t>() + j * cache.strides[0];
      for (int64_t i = 0; i < kv_lora; ++i) c[i] = fp8_value[src[i]];
      for (int64_t i = 0; i < rope; ++i) pe[i] = fp8_value[src[kv_lora + i]];
    }
  }
  return out;
}

}  // namespace mla_detail
}  // namespace k3::kernels
