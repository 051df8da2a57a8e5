// kernels/mla/cache.cpp: MLA latent cache entries [c_n | k_pe] in pages, write, gather between page
// layouts (decode context parallelism's prefill) and dequantised read (spec §6.3).
//
// One entry per token per MLA layer: kv_lora (512) normalised latent values then rope (64) k_pe
// values. f32 caches hold the values as given; f8_e4m3 caches hold one E4M3 byte per element,
// code = fp8(x / k_scale) saturating at +-448, read back as fp8(code) * k_scale.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "core/fp8.h"
#include "kernels/mla/mla.h"
#include "kernels/mla/mla_internal.h"

namespace k3::kernels {

using mla_detail::describe;

core::Status mla_cache_write_check(const MlaCacheWriteArgs& a) {
  if (!mla_detail::is_rows(a.c_n) || !is_activation_dtype(a.c_n) || a.c_n.dim(1) < 1)
    return core::Status::fail(
        "mla_cache_write: c_n must be f32 (or bf16 on CUDA) [T, kv_lora] with unit inner stride, got " +
        describe(a.c_n));
  const int64_t T = a.c_n.dim(0), kv_lora = a.c_n.dim(1);
  if (!mla_detail::is_rows(a.k_pe) || !is_activation_dtype(a.k_pe) || a.k_pe.dim(0) != T)
    return core::Status::fail("mla_cache_write: k_pe must be f32 (or bf16 on CUDA) [T=" + std::to_string(T) +
                              ", rope] with unit inner stride, got " + describe(a.k_pe));
  const int64_t width = kv_lora + a.k_pe.dim(1);
  // bf16 caches live on CUDA (the CPU stores bf16 values in an f32 cache).
  if (a.dst.dtype != core::DType::f32 && a.dst.dtype != core::DType::f8_e4m3 &&
      !(a.dst.dtype == core::DType::bf16 && a.dst.device == core::Device::cuda))
    return core::Status::fail("mla_cache_write: dst must be f32 or f8_e4m3 (or bf16 on CUDA), got " + describe(a.dst));
  if (!mla_detail::is_pages(a.dst) || a.dst.dim(2) != width || a.dst.dim(0) < 1 || a.dst.dim(1) < 1)
    return core::Status::fail(
        "mla_cache_write: dst must be pages [num_blocks >= 1, block_size >= 1, kv_lora + rope = " +
        std::to_string(width) + "] with dense rows, got " + describe(a.dst));
  const core::TensorView& rows = a.cache_rows;
  if (!rows.defined() || rows.rank() != 1 || rows.dtype != core::DType::i32 || rows.dim(0) != T ||
      (T > 1 && rows.strides[0] != 1))
    return core::Status::fail("mla_cache_write: cache_rows must be a dense i32 [T = " + std::to_string(T) +
                              "] tensor, got " + describe(rows));
  if (!(std::isfinite(a.k_scale) && a.k_scale > 0.0f))
    return core::Status::fail("mla_cache_write: k_scale must be finite and > 0, got " + std::to_string(a.k_scale));
  if (a.k_pe.device != a.c_n.device || a.dst.device != a.c_n.device || (T > 0 && rows.device != a.c_n.device))
    return core::Status::fail("mla_cache_write: c_n, k_pe, dst and cache_rows must be on one device");
  if (a.c_n.device != core::Device::cpu) return core::Status::ok();  // device rows: unchecked (see mla.h)
  // Values (CPU): every row names a cache row of dst (or -1 to skip), no cache row twice.
  const int64_t capacity = a.dst.dim(0) * a.dst.dim(1);
  std::vector<int32_t> seen;
  for (int64_t t = 0; t < T; ++t) {
    const int32_t r = rows.as<const int32_t>()[t];
    if (r < -1 || r >= capacity)
      return core::Status::fail(
          "mla_cache_write: cache_rows[" + std::to_string(t) + "] = " + std::to_string(r) +
          " is not -1 or a cache row in [0, num_blocks * block_size = " + std::to_string(capacity) + ")");
    if (r >= 0) seen.push_back(r);
  }
  std::sort(seen.begin(), seen.end());
  if (const auto dup = std::adjacent_find(seen.begin(), seen.end()); dup != seen.end())
    return core::Status::fail("mla_cache_write: cache_rows names cache row " + std::to_string(*dup) + " twice");
  return core::Status::ok();
}

void mla_cache_write_reference(const MlaCacheWriteArgs& a) {
  const core::Status st = mla_cache_write_check(a);
  K3_CHECK(st.is_ok(), st.reason());
  K3_CHECK(a.dst.device == core::Device::cpu, "mla_cache_write_reference: tensors must be on the CPU");
  const int64_t T = a.c_n.dim(0), kv_lora = a.c_n.dim(1), rope = a.k_pe.dim(1);
  for (int64_t t = 0; t < T; ++t) {
    const int32_t row = a.cache_rows.as<const int32_t>()[t];
    if (row < 0) continue;  // padding row
    const float* c = mla_detail::row_ptr(a.c_n, t);
    const float* pe = mla_detail::row_ptr(a.k_pe, t);
    char* dst = mla_detail::page_row_ptr(a.dst, row);
    if (a.dst.dtype == core::DType::f32) {
      float* d = reinterpret_cast<float*>(dst);
      std::memcpy(d, c, sizeof(float) * kv_lora);
      std::memcpy(d + kv_lora, pe, sizeof(float) * rope);
    } else {
      uint8_t* d = reinterpret_cast<uint8_t*>(dst);
      for (int64_t i = 0; i < kv_lora; ++i) d[i] = core::f32_to_fp8_e4m3(c[i] / a.k_scale);
      for (int64_t i = 0; i < rope; ++i) d[kv_lora + i] = core::f32_to_fp8_e4m3(pe[i] / a.k_scale);
    }
  }
}

namespace {

// The bytes [begin, end) a pages view spans (dense rows, strided pages).
std::pair<const char*, const char*> page_span(const core::TensorView& v) {
  const auto* begin = static_cast<const char*>(v.data);
  if (v.numel() == 0) return {begin, begin};
  const int64_t elems = (v.dim(0) - 1) * v.strides[0] + (v.dim(1) - 1) * v.strides[1] + v.dim(2);
  return {begin, begin + elems * static_cast<int64_t>(core::dtype_size(v.dtype))};
}

}  // namespace

core::Status mla_cache_gather_check(const MlaCacheGatherArgs& a) {
  const auto cache_dtype = [](const core::TensorView& v) {
    return v.dtype == core::DType::f32 || v.dtype == core::DType::bf16 || v.dtype == core::DType::f8_e4m3;
  };
  if (!mla_detail::is_pages(a.src) || !cache_dtype(a.src) || a.src.dim(0) < 1 || a.src.dim(1) < 1 || a.src.dim(2) < 1)
    return core::Status::fail(
        "mla_cache_gather: src must be f32, bf16 or f8_e4m3 pages [num_blocks >= 1, block_size >= 1, "
        "width >= 1] with dense rows, got " +
        describe(a.src));
  if (!mla_detail::is_pages(a.dst) || a.dst.dtype != a.src.dtype || a.dst.dim(2) != a.src.dim(2))
    return core::Status::fail(
        "mla_cache_gather: dst must be pages [num_blocks, block_size, width = " + std::to_string(a.src.dim(2)) +
        "] of src's dtype with dense rows, got " + describe(a.dst) + " (src " + describe(a.src) + ")");
  const int64_t N = a.dst.dim(0) * a.dst.dim(1);
  const core::TensorView& rows = a.src_rows;
  if (!rows.defined() || rows.rank() != 1 || rows.dtype != core::DType::i32 || rows.dim(0) != N ||
      (N > 1 && rows.strides[0] != 1))
    return core::Status::fail("mla_cache_gather: src_rows must be a dense i32 [N = dst num_blocks * block_size = " +
                              std::to_string(N) + "] tensor, got " + describe(rows));
  if (a.dst.device != a.src.device || (N > 0 && rows.device != a.src.device))
    return core::Status::fail("mla_cache_gather: src, src_rows and dst must be on one device");
  const auto [s0, s1] = page_span(a.src);
  const auto [d0, d1] = page_span(a.dst);
  if (d0 < s1 && s0 < d1) return core::Status::fail("mla_cache_gather: dst must not overlap src");
  if (a.src.device != core::Device::cpu) return core::Status::ok();  // device rows: unchecked (see mla.h)
  const int64_t capacity = a.src.dim(0) * a.src.dim(1);
  for (int64_t i = 0; i < N; ++i) {
    const int32_t r = rows.as<const int32_t>()[i];
    if (r < -1 || r >= capacity)
      return core::Status::fail(
          "mla_cache_gather: src_rows[" + std::to_string(i) + "] = " + std::to_string(r) +
          " is not -1 or a cache row of src in [0, num_blocks * block_size = " + std::to_string(capacity) + ")");
  }
  return core::Status::ok();
}

void mla_cache_gather_reference(const MlaCacheGatherArgs& a) {
  const core::Status st = mla_cache_gather_check(a);
  K3_CHECK(st.is_ok(), st.reason());
  K3_CHECK(a.dst.device == core::Device::cpu, "mla_cache_gather_reference: tensors must be on the CPU");
  const int64_t N = a.dst.dim(0) * a.dst.dim(1);
  const auto bytes = static_cast<size_t>(a.src.dim(2)) * core::dtype_size(a.src.dtype);
  for (int64_t i = 0; i < N; ++i) {
    const int32_t r = a.src_rows.as<const int32_t>()[i];
    if (r >= 0) std::memcpy(mla_detail::page_row_ptr(a.dst, i), mla_detail::page_row_ptr(a.src, r), bytes);
  }
}

MlaGatherPlan mla_gather_plan(std::span<const int64_t> tokens, std::span<const std::span<const int32_t>> local_tables,
                              int cp, int rank, int64_t block_size) {
  K3_CHECK(cp >= 1 && 0 <= rank && rank < cp && block_size >= 1 && tokens.size() == local_tables.size(),
           "mla_gather_plan: bad cp " + std::to_string(cp) + ", rank " + std::to_string(rank) + ", block_size " +
               std::to_string(block_size) + " or table count");
  MlaGatherPlan plan;
  std::vector<int64_t> offset, first_block;  // per sequence: its pack rows and temporary pages
  for (const int64_t n : tokens) {
    K3_CHECK(n >= 1, "mla_gather_plan: a sequence has no tokens");
    offset.push_back(plan.slots);
    first_block.push_back(plan.blocks);
    plan.slots += (n + cp - 1) / cp;
    const int64_t pages = (n + block_size - 1) / block_size;
    plan.blocks += pages;
    plan.table_width = std::max(plan.table_width, pages);
  }
  K3_CHECK(cp * plan.slots <= INT32_MAX && plan.blocks * block_size <= INT32_MAX,
           "mla_gather_plan: the gathered rows do not fit i32 cache rows");
  plan.pack_rows.assign(static_cast<size_t>(plan.slots), -1);
  plan.place_rows.assign(static_cast<size_t>(plan.blocks * block_size), -1);
  plan.block_table.assign(tokens.size() * static_cast<size_t>(plan.table_width), -1);
  for (size_t s = 0; s < tokens.size(); ++s) {
    const int64_t n = tokens[s], mine = n > rank ? (n - rank + cp - 1) / cp : 0;  // positions p % cp == rank
    for (int64_t j = 0; j < mine; ++j) {
      const auto page = static_cast<size_t>(j / block_size);
      K3_CHECK(page < local_tables[s].size(), "mla_gather_plan: sequence " + std::to_string(s) +
                                                  "'s block table does not cover local position " + std::to_string(j));
      plan.pack_rows[static_cast<size_t>(offset[s] + j)] = static_cast<int32_t>(local_tables[s][page] * block_size +
                                                                                j % block_size);
    }
    for (int64_t p = 0; p < n; ++p)
      plan.place_rows[static_cast<size_t>(first_block[s] * block_size + p)] = static_cast<int32_t>(
          (p % cp) * plan.slots + offset[s] + p / cp);
    for (int64_t b = 0; b < (n + block_size - 1) / block_size; ++b)
      plan.block_table[s * static_cast<size_t>(plan.table_width) + static_cast<size_t>(b)] = static_cast<int32_t>(
          first_block[s] + b);
  }
  return plan;
}

namespace mla_detail {

namespace {

// The 256 fp8 codes' values, pre-multiplied by k_scale: one table lookup per element.
struct Fp8Table {
  float value[256];
  explicit Fp8Table(float k_scale) {
    for (int code = 0; code < 256; ++code) value[code] = core::fp8_e4m3_to_f32(static_cast<uint8_t>(code)) * k_scale;
  }
};

// One cache entry (f32 values or fp8 codes) into c [kv_lora] and pe [rope].
void read_entry(const char* src, core::DType dtype, const Fp8Table& fp8, int64_t kv_lora, int64_t rope, float* c,
                float* pe) {
  if (dtype == core::DType::f32) {
    const auto* f = reinterpret_cast<const float*>(src);
    std::memcpy(c, f, sizeof(float) * kv_lora);
    std::memcpy(pe, f + kv_lora, sizeof(float) * rope);
  } else {
    const auto* u = reinterpret_cast<const uint8_t*>(src);
    for (int64_t i = 0; i < kv_lora; ++i) c[i] = fp8.value[u[i]];
    for (int64_t i = 0; i < rope; ++i) pe[i] = fp8.value[u[kv_lora + i]];
  }
}

DequantCache empty_cache(int64_t positions, int64_t kv_lora, int64_t rope) {
  DequantCache out;
  out.positions = positions;
  out.kv_lora = kv_lora;
  out.rope = rope;
  out.c_n.resize(static_cast<size_t>(positions * kv_lora));
  out.k_pe.resize(static_cast<size_t>(positions * rope));
  return out;
}

}  // namespace

DequantCache dequantize_cache(const core::TensorView& rows, float k_scale, int64_t kv_lora, int64_t rope) {
  DequantCache out = empty_cache(rows.dim(0), kv_lora, rope);
  const Fp8Table fp8(k_scale);
  const int64_t row_bytes = rows.strides[0] * static_cast<int64_t>(core::dtype_size(rows.dtype));
  for (int64_t j = 0; j < out.positions; ++j)
    read_entry(static_cast<const char*>(rows.data) + j * row_bytes, rows.dtype, fp8, kv_lora, rope,
               out.c_n.data() + j * kv_lora, out.k_pe.data() + j * rope);
  return out;
}

DequantCache dequantize_sequence(const core::TensorView& pages, const int32_t* block_table, int64_t tokens,
                                 float k_scale, int64_t kv_lora, int64_t rope) {
  DequantCache out = empty_cache(tokens, kv_lora, rope);
  const Fp8Table fp8(k_scale);
  const int64_t bs = pages.dim(1);
  for (int64_t j = 0; j < tokens; ++j)
    read_entry(page_row_ptr(pages, block_table[j / bs] * bs + j % bs), pages.dtype, fp8, kv_lora, rope,
               out.c_n.data() + j * kv_lora, out.k_pe.data() + j * rope);
  return out;
}

}  // namespace mla_detail
}  // namespace k3::kernels
