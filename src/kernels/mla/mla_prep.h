// kernels/mla/mla_prep.h: mla_prep, the gated-MLA front between the q_a/kv_a projections and
// q_b (spec §6.1, §6.3, §2 rounding), in ONE fused op (fastpath/ fused op): the q_a RMSNorm, the kv_a
// RMSNorm and the latent cache write.
//
// Contract: with the rounded projection outputs q_a = round(W_qa x) and kv = round(W_kva x), computes
// exactly what the standard path's op sequence in model::attention (model/layers/mla.cpp) computes:
//   q_a_out = rmsnorm(q_a, q_a_norm; eps, style)                        [T, q_lora]  (rmsnorm_reference)
//   c_n     = rmsnorm(kv[:, 0:kv_lora], kv_a_norm; eps, style)           [T, kv_lora] (rmsnorm_reference)
//   k_pe    = kv[:, kv_lora:kv_lora + rope]                               [T, rope]    (column_copy)
//   pages[cache_rows[t]] = [c_n[t] ; k_pe[t]]  for every t with cache_rows[t] >= 0 (mla_cache_write_reference)
// rmsnorm as rmsnorm_reference: inv_rms = 1 / sqrt(sum(x^2) / D + eps) in fp32, then moonshot:
// round(w * round(x * inv_rms)), fused: round(w * (x * inv_rms)); round = round_act (bf16 in
// Precision::bf16, nothing in Precision::fp32). eps = 1e-6 (config::MlaConfig::kLatentNormEps) and the
// style (ModelOptions::rmsnorm_style) are passed by the caller. The cache entry stores c_n as the
// standard path stores it: f32 pages the (rounded) value, bf16 pages (CUDA) round to bf16, f8_e4m3 pages
// fp8(v / k_scale) saturating at +-448. c_n and k_pe are not exposed (the standard path traces neither).
// The CPU reference calls rmsnorm_reference twice and mla_cache_write_reference on f32 temporaries, so
// on the CPU it equals the standard op sequence BIT FOR BIT in both precisions. CUDA sums the squares
// in another (fixed, block-tree) order than the CPU's sequential one: rmsnorm's tolerance applies; it
// is the CUDA rmsnorm's own order, so on the device it equals the standard CUDA ops wherever both
// take the same vector width.
//
// Shapes and dtypes (T rows = sequences x tokens per sequence; decode 1..64, any T works):
//   q_a        f32 [T, q_lora] (bf16 on CUDA), unit inner stride, any row stride; read only.
//   q_a_norm   bf16 or f32 [q_lora] contiguous (q_a_layernorm).
//   q_a_out    f32 [T, q_lora] (bf16 on CUDA), unit inner stride, any row stride; written completely,
//              nothing else; must not overlap q_a or kv.
//   kv         f32 [T, kv_lora + rope] (bf16 on CUDA), unit inner stride, any row stride; read only.
//   kv_a_norm  bf16 or f32 [kv_lora] contiguous (kv_a_layernorm); its length says where c ends.
//   pages      f32 / f8_e4m3 (bf16 on CUDA) [num_blocks, block_size, kv_lora + rope] with dense rows.
//   cache_rows i32 [T] dense on the op's device: page * block_size + offset, or -1 = no write (padding,
//              or another rank's token under decode context parallelism). Values are checked for CPU
//              tables only (in range, no row twice); CUDA skips rows outside [0, capacity).
// On CUDA the three activations of one call share one dtype: bf16 (Precision::bf16) or f32.
//
// Why it exists: launches, not bytes. Bytes per call at one TP8 rank (spec §11: q_lora 1536, kv_lora
// 512, rope 64, bf16 activations and norm weights, fp8 cache): per row q_a 3,072 + q_a_out 3,072 + kv
// 1,152 + cache entry 576 + cache row 4 = 7,876 B, plus the norm weights 4,096 B (from L2 after the
// first CTAs) -> 11,972 B at T = 1 (a floor of 2.8 ns of HBM time at 4.3 TB/s) and 508,160 B at T = 64 (bf16
// cache: +576 B per row). The fused MLA sublayer at batch 1 (fastpath/fused_layers.cpp, bf16) ran
//   multi_linear [q_a, kv_a, g] 1, rmsnorm(q_a) 1, q_b cuBLASLt 1 (+1 split-K reduce when chosen),
//   2 column copies (memcpy nodes), rmsnorm(c) 1, mla_cache_write 1, mla_decode 4, o_proj cuBLASLt 1 (+1)
//   = 10..12 kernels + 2 copies;
// with this op it runs
//   multi_linear [q_a, kv_a, g] 1, mla_prep 1, multi_linear [q_b] 1, mla_decode 4, multi_linear [o_proj] 1
//   = 8 kernels, no copies (above 16 rows multi_linear takes one cuBLASLt GEMM per weight, as before).
//
// CUDA design (cuda.cu), one launch "cuda_rowwise": grid (T, 2), 256 threads (the CUDA
// rmsnorm's block); CTA (t, 0) normalises q_a[t] into q_a_out[t]; CTA (t, 1) reads cache_rows[t],
// leaves at once for -1, else normalises kv[t, 0:kv_lora] and writes the entry [c_n ; k_pe] into its
// page row. 16-byte loads (8 activations; 8 fp8 / 8 bf16 / 8 f32 cache values per store) when every row,
// the norm weights and the page rows are aligned for them and q_lora, kv_lora, rope are multiples of 8;
// the scalar form otherwise. Sums of squares: per-thread fp32 chains, then cuda_common's block_sum
// (fixed order: deterministic). Programmatic dependent launch (cuda_common.cuh): the kernel triggers
// its dependents at once and waits (pdl_wait) before reading any activation or table or writing
// anything; it is launched with launch_dependent, so it may start while multi_linear still runs.
// Grid and block come from T only (host integer): a captured graph replays for any cache rows.
#pragma once
#include "core/error.h"
#include "kernels/common.h"
#include "kernels/norm/rmsnorm.h"

namespace k3::kernels {

struct MlaPrepArgs {
  core::TensorView q_a;         // f32 [T, q_lora] (bf16 on CUDA): q_a_proj output, rounded
  core::TensorView q_a_norm;    // bf16 / f32 [q_lora]: q_a_layernorm weight
  core::TensorView q_a_out;     // f32 [T, q_lora] (bf16 on CUDA): rmsnorm(q_a), q_b's input
  core::TensorView kv;          // f32 [T, kv_lora + rope] (bf16 on CUDA): kv_a_proj output, rounded
  core::TensorView kv_a_norm;   // bf16 / f32 [kv_lora]: kv_a_layernorm weight
  core::TensorView pages;       // f32 / f8_e4m3 (bf16 on CUDA) [num_blocks, block_size, kv_lora + rope]
  core::TensorView cache_rows;  // i32 [T]: page * block_size + offset, or -1 to skip row t's entry
  float k_scale = 1.0f;         // fp8 pages store fp8(v / k_scale)
  float eps = 1e-6f;            // both norms (spec §6.1: 1e-6)
  RmsNormStyle style = RmsNormStyle::moonshot;
  Precision precision = Precision::bf16;
};

// Fails naming the argument (q_a, q_a_norm, q_a_out, kv, kv_a_norm, pages, cache_rows, k_scale, eps)
// with the expected vs actual shape / dtype: widths that disagree, rows that disagree, kv no wider than
// kv_a_norm (no rope part), q_a_out overlapping q_a or kv, tensors on different devices, and for CPU
// tables cache rows out of range or named twice.
core::Status mla_prep_check(const MlaPrepArgs& a);
// rmsnorm_reference (q_a), rmsnorm_reference (kv's first kv_lora columns) into an f32 temporary, then
// mla_cache_write_reference with k_pe = kv's last rope columns: bit for bit the standard op sequence.
void mla_prep_reference(const MlaPrepArgs& a, backends::cpu::ThreadPool* pool = nullptr);

}  // namespace k3::kernels
