// kernels/mla/cuda_mla_common.cuh: internal to kernels/mla: what the CUDA naive and absorbed MLA
// forms share: the sequence tables and page addressing as kernels see them, reading a cache element
// (f32, bf16, or fp8 e4m3 times k_scale), and supports().
//
// The tables stay in device memory and are read inside the kernels; launch grids and scratch sizes
// come only from the host integers (num_seqs, max_rows, max_tokens, heads), so a captured CUDA
// graph replays for any positions and block tables. A CTA whose (sequence, row) has no work exits
// at once (before any barrier, so the whole block leaves together).
#pragma once
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "kernels/cuda_common.cuh"
#include "kernels/mla/mla.h"

namespace k3::kernels::cuda_detail {

// A SeqBatch as the kernels see it (device pointers and its host integers).
struct SeqTables {
  const int32_t* row_begin = nullptr;    // [S]
  const int32_t* num_rows = nullptr;     // [S]
  const int32_t* position = nullptr;     // [S]
  const int32_t* block_table = nullptr;  // [S, bt_ld]
  int64_t bt_ld = 0;
  int num_seqs = 0, max_rows = 0;
  int64_t max_tokens = 0;
};
inline SeqTables seq_tables(const SeqBatch& b) {
  SeqTables t;
  t.row_begin = b.row_begin.as<const int32_t>();
  t.num_rows = b.num_rows.as<const int32_t>();
  t.position = b.position.as<const int32_t>();
  t.block_table = b.block_table.as<const int32_t>();
  t.bt_ld = b.block_table.strides[0];
  t.num_seqs = b.num_seqs;
  t.max_rows = b.max_rows;
  t.max_tokens = b.max_tokens;
  return t;
}

// Page addressing of pages [num_blocks, block_size, width]: cache row page * block_size + offset
// starts at element page * page_ld + offset * row_ld.
struct PagesRef {
  int64_t page_ld = 0, row_ld = 0;
  int block_size = 1;
};
inline PagesRef pages_ref(const core::TensorView& pages) {
  PagesRef p;
  p.page_ld = pages.strides[0];
  p.row_ld = pages.strides[1];
  p.block_size = static_cast<int>(pages.dim(1));
  return p;
}
// Element offset of token position j of a sequence whose block table row is `table`.
__device__ __forceinline__ int64_t position_offset(const PagesRef& p, const int32_t* table, int64_t j) {
  const int64_t page = table[j / p.block_size];
  return page * p.page_ld + (j % p.block_size) * p.row_ld;
}

// Cache element at element offset idx as f32.
__device__ __forceinline__ float cache_elem(const float* c, int64_t idx, float) { return c[idx]; }
__device__ __forceinline__ float cache_elem(const bf16* c, int64_t idx, float) { return __bfloat162float(c[idx]); }
__device__ __forceinline__ float cache_elem(const uint8_t* c, int64_t idx, float k_scale) {
  const __half h = __nv_cvt_fp8_to_halfraw(c[idx], __NV_E4M3);
  return __half2float(h) * k_scale;  // fp8(code) * k_scale, as the reference's table
}
// Element i of row j of a dense [rows, ld] block of cache elements (a staged tile) as f32.
template <class CacheT>
__device__ __forceinline__ float cache_value(const CacheT* c, int64_t ld, int64_t j, int64_t i, float k_scale) {
  return cache_elem(c, j * ld + i, k_scale);
}

// Calls fn(const CacheT*) with the pages' element type.
template <class Fn>
void with_cache(const core::TensorView& pages, Fn&& fn) {
  if (pages.dtype == core::DType::f8_e4m3) fn(pages.as<const uint8_t>());
  else if (pages.dtype == core::DType::bf16) fn(pages.as<const bf16>());
  else fn(pages.as<const float>());
}

// Dynamic shared vectors are padded to whole 16-byte groups (zeros past the end): the compiler may
// read an unrolled loop's tail with one vector load (seen as out-of-bounds reads by memcheck).
__host__ __device__ constexpr int padded_floats(int n) { return (n + 3) / 4 * 4; }

constexpr int kMlaMaxLatent = 512;     // kv_lora limit of the absorbed kernels (K3: 512)
constexpr int kMlaMaxV = 256;          // v_head_dim limit of the naive kernel (K3: 128)
constexpr int64_t kMaxGridYZ = 65535;  // CUDA limit of gridDim.y and gridDim.z

// A batch's four step tables (row_begin, num_rows, position, block_table) are on the device (none when
// the batch has no sequences).
inline core::Status seq_tables_on_cuda(const SeqBatch& b) {
  if (b.num_seqs == 0) return core::Status::ok();
  return on_cuda({{"seqs.row_begin", &b.row_begin},
                  {"seqs.num_rows", &b.num_rows},
                  {"seqs.position", &b.position},
                  {"seqs.block_table", &b.block_table}});
}

inline core::Status mla_supports(const CudaOps& ops, const MlaAttentionArgs& a) {
  if (auto s = ops.usable(); !s) return s;
  if (auto s = on_cuda({{"q", &a.q}, {"pages", &a.pages}, {"out", &a.out}}); !s) return s;
  if (auto s = seq_tables_on_cuda(a.seqs); !s) return s;
  if (auto s = weight_on_cuda(*a.kv_b, "kv_b"); !s) return s;
  if (auto s = same_act({{"q", &a.q}, {"out", &a.out}}, a.precision); !s) return s;
  if (overlaps(a.out, a.q)) return core::Status::fail("out must not alias q on CUDA");
  return core::Status::ok();
}

}  // namespace k3::kernels::cuda_detail
